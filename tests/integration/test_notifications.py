"""The public notification API on a real broker and a real acker: typed notes, in order,
with counts, ranges, seal times and (asked for) exactly the time's records."""

from __future__ import annotations

from typing import Any

from substreams.app import Application
from substreams.control.notes import EpochNote
from tests.conftest import ConfigFactory
from tests.integration.test_acker import FAST, acker


def click(ts: int, user: str = "u") -> dict[str, Any]:
    return {"user": user, "url": f"/p{ts}", "ts": ts}


def test_notes_carry_count_ranges_seal_time_and_the_records(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "field": "ts", "size_ms": 100}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    app = Application(config)
    sent = {0: [5, 50, 99], 1: [], 2: [230, 231]}  # window 1 sealed without a record
    with acker(config), app.publisher(stream, "web") as pub:
        for window in sent:
            for ts in sent[window]:
                pub.publish(click(ts), key=f"k{ts}")
            pub.seal(sub, window)
        with app.notifications(sub, from_="beginning", records=True, idle_timeout=15) as notes:
            got: list[EpochNote] = []
            for note in notes:
                got.append(note)
                if len(got) == 3:
                    break
        assert [n.time for n in got] == [0, 1, 2]
        for note in got:
            assert note.substream == sub
            assert note.label == str(note.time)
            assert note.records == len(sent[int(note.time)])  # type: ignore[call-overload]
            assert sorted(e.payload["ts"] for e in note.entries) == sent[note.time]  # type: ignore[index]
            assert all(e.times[sub] == note.time for e in note.entries)
            assert sum(r.end - r.start for r in note.ranges) >= note.records
            assert note.sealed_at_ms > 0 and note.notified_at_ms >= note.sealed_at_ms
            assert note.latency_ms == note.notified_at_ms - note.sealed_at_ms
        assert [n.ident for n in got] == sorted(n.ident for n in got)

        # From the end: only what completes from now on; without records: counts only.
        with app.notifications(sub, from_="end", idle_timeout=15) as later:
            pub.publish(click(310))
            pub.seal(sub, 3)
            (note,) = later.poll(10) or later.poll(10)
        assert (note.time, note.records, note.entries) == (3, 1, ())

        # Resuming after a handled note: the notes that follow it, none before.
        with app.notifications(sub, from_=got[0]) as resumed:
            times = []
            while len(times) < 3:
                polled = resumed.poll(10)
                assert polled, times
                times += [n.time for n in polled]
        assert times == [1, 2, 3]


def test_the_spark_driver_callback_gets_the_same_note_type() -> None:
    from substreams.spark import EpochNote as SparkNote

    assert SparkNote is EpochNote
