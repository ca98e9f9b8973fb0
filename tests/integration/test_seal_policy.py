"""Seal policies on a real broker: windows, sessions and punctuations sealed without a
``seal()`` call; late records raised or dead-lettered by rule; an idle source that does not
hold windows back.  Event times arrive out of order here, so the streams' order key is an
ingest sequence (``seq``), not the event-time field."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from substreams import metrics
from substreams.app import Application
from substreams.config import Config, SealPolicy
from substreams.control.notes import EpochNote
from substreams.errors import SealedTimeError
from substreams.frontier import Keyed
from substreams.punctuation.service import PunctuationAligner
from substreams.streams.deadletter import REASON_LATE
from substreams.streams.listener import Listener
from tests.conftest import ConfigFactory, read_dead_letters
from tests.integration.test_acker import FAST, acker

SCHEMA = {
    "type": "record", "name": "Event", "namespace": "substreams.test",
    "fields": [{"name": "user", "type": "string"}, {"name": "ts", "type": "long"},
               {"name": "seq", "type": "long"}],
}


def configure(
    make_config: ConfigFactory, tmp_path: Path, substream: dict[str, Any], partitions: int = 2
) -> tuple[Config, str, str]:
    (tmp_path / "event.avsc").write_text(json.dumps(SCHEMA))
    config = make_config(
        [{"name": "events", "partitions": partitions, "schema": "event.avsc",
          "order_key": "seq"}],
        [{"name": "w", "stream": "events", **substream}],
        acker=FAST,
    )
    return config, config.streams[0].name, config.substreams[0].name


class Events:
    """Events with an increasing ingest sequence and the event times given."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, ts: int, user: str = "u") -> dict[str, Any]:
        self.seq += 1
        return {"user": user, "ts": ts, "seq": self.seq}


def collect(config: Config, sub: str, count: int, timeout: float = 20) -> list[EpochNote]:
    got: list[EpochNote] = []
    with Application(config).notifications(
        sub, from_="beginning", records=True, idle_timeout=timeout
    ) as notes:
        for note in notes:
            got.append(note)
            if len(got) == count:
                break
    return got


def by_time(notes: list[EpochNote]) -> dict[object, list[int]]:
    return {n.time: sorted(e.payload["ts"] for e in n.entries) for n in notes}


def test_windows_are_sealed_by_the_policy_and_late_records_dead_lettered(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    policy = {"lateness_ms": 100, "late": "dead_letter"}
    config, stream, sub = configure(
        make_config, tmp_path, {"kind": "tumbling", "field": "ts", "size_ms": 100, "seal": policy}
    )
    writer = f"publisher:{stream}/web"
    before = metrics.counter_value(metrics.DEAD_LETTERS, writer=writer, reason=REASON_LATE)
    ev = Events()
    with acker(config), Application(config).publisher(stream, "web") as pub:
        for ts in (10, 120, 60, 250):  # 60 is out of order but not late; 250 seals window 0
            pub.publish(ev(ts))
        late = pub.publish(ev(40))  # window 0 is sealed: dead-lettered, not written
        assert late.dead_lettered
        batch = pub.publish_many([ev(190), ev(95), ev(310)])  # 95 is late, the others go on
        assert [r.dead_lettered for r in batch] == [False, True, False]
        pub.publish(ev(420))  # event time 420 - 100 seals windows up to 2
        got = collect(config, sub, 3)
    assert by_time(got) == {0: [10, 60], 1: [120, 190], 2: [250]}
    assert all(n.records == len(n.entries) and n.sealed_at_ms > 0 for n in got)
    letters = [d for d in read_dead_letters(config) if d.reason == REASON_LATE]
    assert sorted(json.loads(d.raw)["ts"] for d in letters) == [40, 95]
    assert all(d.topic == stream and d.source == "web" and d.offset == -1 for d in letters)
    assert all(f"substream '{sub}': a record at window 0 after this source sealed 0" in d.detail
               for d in letters)
    after = metrics.counter_value(metrics.DEAD_LETTERS, writer=writer, reason=REASON_LATE)
    assert after - before == 2
    with Listener(config, stream) as listener:  # the stream itself never saw them
        kept = sorted(e.payload["ts"] for e in listener.entries(idle_timeout=0.5))  # type: ignore[union-attr]
    assert kept == [10, 60, 120, 190, 250, 310, 420]


def test_a_publisher_overrides_the_policy_and_raise_writes_nothing(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config, stream, sub = configure(
        make_config, tmp_path,
        {"kind": "tumbling", "field": "ts", "size_ms": 100, "seal": {"late": "dead_letter"}},
    )
    ev = Events()
    strict = {sub: SealPolicy(lateness_ms=0, late="raise")}
    with Application(config).publisher(stream, "web", seal_policies=strict) as pub:
        pub.publish(ev(10))
        pub.publish(ev(150))  # seals window 0
        with pytest.raises(SealedTimeError, match="window 0"):
            pub.publish(ev(99))
        with pytest.raises(SealedTimeError):
            pub.publish_many([ev(160), ev(50)])  # the whole batch refused
        pub.publish(ev(170))
    with Listener(config, stream) as listener:
        kept = sorted(e.payload["ts"] for e in listener.entries(idle_timeout=0.5))  # type: ignore[union-attr]
    assert kept == [10, 150, 170]
    assert not [d for d in read_dead_letters(config) if d.reason == REASON_LATE]


def test_an_idle_source_seals_to_its_clock_and_holds_no_window_back(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    policy = {"lateness_ms": 0, "idle_ms": 300}
    config, stream, sub = configure(
        make_config, tmp_path, {"kind": "tumbling", "field": "ts", "size_ms": 200, "seal": policy}
    )
    app = Application(config)
    with acker(config), app.publisher(stream, "busy") as busy, app.publisher(stream, "quiet"):
        now = int(time.time() * 1000)
        busy.publish({"user": "u", "ts": now, "seq": 1})  # then nothing, from either source
        busy.flush()
        started = time.monotonic()
        got: list[EpochNote] = []
        with app.notifications(sub, from_="beginning", idle_timeout=10) as notes:
            for note in notes:  # the quiet source's idle seals may announce empty windows
                got.append(note)
                if note.time == now // 200:
                    break
        waited = time.monotonic() - started
        assert got[-1].time == now // 200 and got[-1].records == 1
        assert all(n.records == 0 for n in got[:-1])
        assert waited < 5
        with pytest.raises(SealedTimeError):  # the idle seal is a promise: older is late
            busy.publish({"user": "u", "ts": now, "seq": 2})


def test_sessions_close_by_the_policys_keyed_seal(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config, stream, sub = configure(
        make_config, tmp_path,
        {"kind": "session", "key": "user", "field": "ts", "gap_ms": 50,
         "seal": {"lateness_ms": 10}},
    )
    ev = Events()
    with acker(config), Application(config).publisher(stream, "web") as pub:
        for ts, user in ((0, "a"), (20, "a"), (30, "b"), (200, "c")):
            pub.publish(ev(ts, user), key=user)
        got = collect(config, sub, 2)
    assert {(n.time, n.until, n.records) for n in got} == {
        (Keyed("a", 0), Keyed("a", 20), 2), (Keyed("b", 30), Keyed("b", 30), 1)
    }


def test_punctuations_follow_the_policy(make_config: ConfigFactory, tmp_path: Path) -> None:
    config, stream, sub = configure(
        make_config, tmp_path,
        {"kind": "tumbling", "field": "ts", "size_ms": 100, "mechanism": "punctuations",
         "seal": {"lateness_ms": 0}},
    )
    ev = Events()
    with Application(config).publisher(stream, "web") as pub:
        for ts in (5, 50, 130, 210):
            pub.publish(ev(ts))
        pub.flush()
        with PunctuationAligner(config, sub) as service:
            deadline = time.monotonic() + 20
            while service.tracker.completed < 2:
                assert time.monotonic() < deadline
                service.step()
    assert by_time(collect(config, sub, 2)) == {0: [5, 50], 1: [130]}


def test_late_is_per_substream_a_record_late_for_sessions_stays_in_its_window(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    """Issue 43's orders: a 1 s revenue window and per-user sessions of one stream.  A
    record late only for the sessions (their keyed seal follows event time; the window
    seals at its end) is counted in its window, kept out of the sessions only, and
    dead-lettered once naming the sessions; one late for both is in neither."""
    (tmp_path / "event.avsc").write_text(json.dumps(SCHEMA))
    late = {"lateness_ms": 0, "late": "dead_letter"}
    config = make_config(
        [{"name": "events", "partitions": 2, "schema": "event.avsc", "order_key": "seq"}],
        [{"name": "w", "stream": "events", "kind": "tumbling", "field": "ts",
          "size_ms": 1000, "seal": late},
         {"name": "s", "stream": "events", "kind": "session", "field": "ts", "key": "user",
          "gap_ms": 100, "seal": late}],
        acker=FAST,
    )
    stream = config.streams[0].name
    window, session = config.substreams[0].name, config.substreams[1].name
    ev = Events()
    with acker(config):
        with Application(config).publisher(stream, "web") as pub:
            pub.publish(ev(100, "a"))
            pub.publish(ev(300, "b"))  # sessions sealed up to 299, window 0 still open
            kept = pub.publish(ev(200, "a"))  # late for the sessions only
            assert not kept.dead_lettered and set(kept.times) == {window}
            pub.publish(ev(1500, "a"))  # seals window 0
            [both] = pub.publish_many([ev(50, "c")])  # late for the window and the sessions
            assert both.dead_lettered
        windows = collect(config, window, 2)
        sessions = collect(config, session, 3)
    assert by_time(windows) == {0: [100, 200, 300], 1: [1500]}
    assert all(n.records == len(n.entries) for n in windows + sessions)
    assert by_time(sessions) == {Keyed("a", 100): [100], Keyed("a", 1500): [1500],
                                 Keyed("b", 300): [300]}
    letters = {json.loads(d.raw)["ts"]: d for d in read_dead_letters(config)
               if d.reason == REASON_LATE}
    assert sorted(letters) == [50, 200]
    assert letters[200].substreams == (session,)
    assert f"substream '{session}'" in letters[200].detail and "kept out of" in letters[200].detail
    assert set(letters[50].substreams) == {window, session}
    with Listener(config, stream) as listener:  # the stream holds the record late for one
        ts = sorted(e.payload["ts"] for e in listener.entries(idle_timeout=0.5))  # type: ignore[union-attr]
    assert ts == [100, 200, 300, 1500]
