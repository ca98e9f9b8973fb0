"""The dead-letter reading rules (no broker): filters, ids, record identity, replay
decisions."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from substreams.config import Config, load_config
from substreams.errors import SubstreamsError
from substreams.streams.deadletter import DeadLetter, late_letter
from substreams.streams.letters import (
    LetterFilter,
    StoredLetter,
    decide,
    parse_id,
    parse_stored,
    record_identity,
    replay_marker,
    replayed_identities,
)
from tests.conftest import CLICK_SCHEMA


@pytest.fixture
def config(tmp_path: Path) -> Config:
    (tmp_path / "click.avsc").write_text(json.dumps(CLICK_SCHEMA))
    doc = {
        "kafka": {"bootstrap": "127.0.0.1:1"},
        "streams": [{"name": "clicks", "schema": "click.avsc", "order_key": "ts",
                     "partitions": 2}],
        "substreams": [
            {"name": "w", "stream": "clicks", "kind": "tumbling", "field": "ts",
             "size_ms": 10},
            {"name": "s", "stream": "clicks", "kind": "session", "field": "ts", "key": "user",
             "gap_ms": 5},
        ],
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_config(path)


def stored(offset: int, letter: DeadLetter, ts: int = 0) -> StoredLetter:
    return parse_stored(0, offset, ts, None, letter.to_json())


def test_ids_parse_and_bad_ones_say_what_is_expected() -> None:
    assert parse_id("3:17") == (3, 17) and parse_id("17") == (0, 17)
    with pytest.raises(SubstreamsError, match="PARTITION:OFFSET"):
        parse_id("x:1")


def test_an_unreadable_message_is_kept_with_why() -> None:
    bad = parse_stored(0, 4, 0, None, b"not json")
    assert bad.letter is None and bad.error and bad.id == "0:4"
    assert LetterFilter().matches(bad) and not LetterFilter(frozenset({"x"})).matches(bad)


def test_filters_by_reason_stream_substream_and_time() -> None:
    late = stored(0, late_letter("p", "clicks", 1, -1, "web", {"ts": 1},
                                 "substream 'w': a record at window 0 ..."), ts=1000)
    bad = stored(1, DeadLetter("r", "malformed", "orders", 0, 9, b"x"), ts=2000)
    assert LetterFilter(reasons=frozenset({"late_record"})).matches(late)
    assert not LetterFilter(reasons=frozenset({"late_record"})).matches(bad)
    assert LetterFilter(streams=frozenset({"orders"})).matches(bad)
    assert LetterFilter(substreams=frozenset({"w"})).matches(late)
    assert not LetterFilter(substreams=frozenset({"w"})).matches(bad)
    since, until = LetterFilter(since_ms=1500), LetterFilter(until_ms=1500)
    assert since.matches(bad) and not since.matches(late)
    assert until.matches(late) and not until.matches(bad)


def test_a_record_with_an_offset_is_one_record_whoever_dead_lettered_it() -> None:
    a = stored(0, DeadLetter("tail", "malformed", "clicks", 1, 9, b"x"))
    b = stored(5, DeadLetter("spark", "malformed", "clicks", 1, 9, b"x"))
    late = stored(6, late_letter("p", "clicks", 1, -1, "web", {"ts": 1}, ""))
    assert record_identity(a) == record_identity(b) == "clicks[1]@9"
    assert record_identity(late) == "letter 0:6"
    marker = parse_stored(0, 7, 0, None, replay_marker(a, record_identity(a), 1))
    assert marker.is_marker and not LetterFilter().matches(marker)
    assert marker.letter is not None and marker.letter.is_replay_marker
    assert not DeadLetter.from_json(a.letter.to_json()).is_replay_marker  # type: ignore[union-attr]
    assert replayed_identities([a, marker]) == {"clicks[1]@9": "0:7"}


def test_decide_refuses_notified_times_and_names_them(config: Config) -> None:
    letter = stored(0, late_letter("p", "clicks", 1, -1, "web", {}, ""))
    payload = {"user": "ada", "url": "/", "ts": 25}

    def closed(sub: str, t: object) -> bool:
        return sub == "w" and t == 2

    d = decide(config, letter, payload, "", {}, set(), closed)
    assert d.outcome == "notified" and "substream 'w' time 2 already notified" in d.message
    open_ = decide(config, letter, payload, "", {}, set(), lambda s, t: False)
    assert open_.outcome == "replay" and open_.partition == 1
    foreign = stored(1, DeadLetter("a", "malformed", "_acks", 0, 3, b"x"))
    assert decide(config, foreign, None, "", {}, set(), closed).outcome == "not_a_record"
    undecodable = stored(2, DeadLetter("a", "malformed", "clicks", 0, 3, b"x"))
    no = decide(config, undecodable, None, "no prefix", {}, set(), closed)
    assert no.outcome == "no_payload" and "'clicks'[0]@3: no prefix" in no.message


def test_a_record_late_for_some_substreams_is_replayed_for_those_only(config: Config) -> None:
    """A letter naming 'w' (late for it, written on time to 's'): replayed into 'w' only,
    and only 'w's time decides whether it is too late -- 's' already has it."""
    payload = {"user": "ada", "url": "/", "ts": 25}
    late_w = stored(0, late_letter("p", "clicks", 1, -1, "web", payload, "", ("w",)))

    def s_closed(sub: str, t: object) -> bool:
        return sub == "s"

    d = decide(config, late_w, payload, "", {}, set(), s_closed)
    assert d.outcome == "replay" and d.substreams == ("w",)
    assert "for substream(s) 'w' only" in d.message
    w_closed = decide(config, late_w, payload, "", {}, set(), lambda sub, t: sub == "w")
    assert w_closed.outcome == "notified" and "substream 'w' time 2" in w_closed.message
    assert "'s'" not in w_closed.message
    both = stored(1, late_letter("p", "clicks", 1, -1, "web", payload, "", ("s", "w")))
    whole = decide(config, both, payload, "", {}, set(), lambda sub, t: False)
    assert whole.outcome == "replay" and whole.substreams is None
    assert decide(config, both, payload, "", {}, set(), s_closed).outcome == "notified"
    gone = stored(2, late_letter("p", "clicks", 1, -1, "web", payload, "", ("old",)))
    refused = decide(config, gone, payload, "", {}, set(), lambda sub, t: False)
    assert refused.outcome == "unknown_substream" and "'old'" in refused.message


def test_a_letter_with_no_substreams_field_names_those_its_detail_does() -> None:
    from substreams.streams.letters import named_substreams

    acker = stored(0, DeadLetter("acker", "terminated_time", "_acks", 0, 3, b"x",
                                 "substream 'w': time 4 was notified"))
    assert named_substreams(acker) == ("w",)
    assert LetterFilter(substreams=frozenset({"w"})).matches(acker)


@given(st.integers(1, 4), st.lists(st.integers(0, 40), unique=True, max_size=12),
       st.lists(st.integers(0, 4500), min_size=1, max_size=20))
def test_a_hopping_record_is_closed_iff_its_pane_is_notified_or_below_one(
    panes: int, notified: list[int], event_times: list[int]
) -> None:
    """Hopping windows of ``panes`` 100 ms panes: the acker notifies panes (in order, some
    empty ones never), the firm reader derives windows from them (control/panes.py).  The
    replay check says a record is closed exactly when the acker would refuse its report
    (some notified pane at or above its pane), hence whenever a window holding it was
    announced; and decide() refuses it naming the pane and its windows."""
    from substreams.control.panes import windows_completed
    from substreams.streams.letters import Notified

    cfg = _hopping_config(panes)
    sub = cfg.substreams[0]
    closed = Notified()
    windows: set[int] = set()
    prev = None
    for pane in sorted(notified):
        closed.add(sub.name, pane)
        windows.update(windows_completed(prev, pane, panes))
        prev = pane
    for ts in event_times:
        pane = ts // 100
        refused = any(p >= pane for p in notified)
        assert closed(sub.name, pane) == refused
        if any(w <= pane <= w + panes - 1 for w in windows):  # a window holding it announced
            assert closed(sub.name, pane)
        letter = stored(0, late_letter("p", "clicks", 0, -1, "web", {}, ""))
        d = decide(cfg, letter, {"user": "u", "url": "/", "ts": ts}, "", {}, set(), closed)
        assert d.outcome == ("notified" if refused else "replay")
        if refused:
            assert f"pane {pane} (windows {pane - panes + 1}..{pane})" in d.message


@functools.cache
def _hopping_config(panes: int) -> Config:
    import tempfile

    folder = Path(tempfile.mkdtemp())
    (folder / "click.avsc").write_text(json.dumps(CLICK_SCHEMA))
    doc = {"kafka": {"bootstrap": "127.0.0.1:1"},
           "streams": [{"name": "clicks", "schema": "click.avsc", "order_key": "ts",
                        "partitions": 1}],
           "substreams": [{"name": "h", "stream": "clicks", "kind": "hopping", "field": "ts",
                           "size_ms": 100 * panes, "slide_ms": 100}]}
    (folder / "c.yaml").write_text(yaml.safe_dump(doc))
    return load_config(folder / "c.yaml")


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(-1, 4)), max_size=30),
       st.sets(st.integers(0, 29)))
def test_a_replay_plans_each_record_at_most_once(
    places: list[tuple[int, int]], done: set[int]
) -> None:
    """Whatever letters repeat records and whatever earlier runs replayed: no identity is
    planned twice, and none already replayed is planned."""
    cfg = _config_once()
    letters = [stored(i, DeadLetter("r", "malformed", "clicks", p, o, b"x"))
               for i, (p, o) in enumerate(places)]
    replayed = {record_identity(s): "m" for i, s in enumerate(letters) if i in done}
    planned: set[str] = set()
    chosen = [decide(cfg, s, {"user": "u", "url": "/", "ts": 1}, "", replayed, planned,
                     lambda sub, t: False) for s in letters]
    ids = [d.identity for d in chosen if d.outcome == "replay"]
    assert len(ids) == len(set(ids)) and not set(ids) & set(replayed)
    assert set(ids) | set(replayed) >= {record_identity(s) for s in letters}


_CONFIG: list[Config] = []


def _config_once() -> Config:
    if not _CONFIG:
        import tempfile

        folder = Path(tempfile.mkdtemp())
        (folder / "click.avsc").write_text(json.dumps(CLICK_SCHEMA))
        doc = {"kafka": {"bootstrap": "127.0.0.1:1"},
               "streams": [{"name": "clicks", "schema": "click.avsc", "order_key": "ts",
                            "partitions": 2}]}
        (folder / "c.yaml").write_text(yaml.safe_dump(doc))
        _CONFIG.append(load_config(folder / "c.yaml"))
    return _CONFIG[0]
