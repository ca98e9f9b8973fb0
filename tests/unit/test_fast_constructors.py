"""The acker's hot-loop constructors build exactly what the dataclasses' own ``__init__``s
build (issue #16 session 9: they skip the generated ``__init__`` for speed, so a field added
to a class without them would silently be left unset)."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from substreams.acker.table import OpenEntry, new_entry
from substreams.control.messages import Completion, OffsetRange, completion, offset_range
from substreams.frontier import Keyed
from substreams.streams.records import SentRecord, sent_record, sent_records

offsets = st.integers(0, 2**40)
ranges = st.builds(offset_range, st.text(max_size=5), st.integers(0, 9), offsets, offsets)
times = st.one_of(st.integers(0, 100), st.builds(Keyed, st.text(max_size=3), st.integers(0, 9)))


@given(st.text(max_size=8), st.integers(0, 64), offsets, offsets)
def test_offset_range_is_the_dataclass(stream: str, partition: int, lo: int, hi: int) -> None:
    fast, slow = offset_range(stream, partition, lo, hi), OffsetRange(stream, partition, lo, hi)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert not (fast < slow) and not (slow < fast)  # order=True compares the same fields


@given(times, st.lists(ranges, max_size=3).map(tuple), st.integers(0, 10**6),
       st.integers(0, 2**41), st.one_of(st.none(), times))
def test_completion_is_the_dataclass(
    t: int | Keyed, rs: tuple[OffsetRange, ...], records: int, sealed: int,
    until: int | Keyed | None,
) -> None:
    fast = completion(t, rs, records, sealed, until)
    slow = Completion(t, rs, records, sealed, until)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert completion(t, rs, records, sealed) == Completion(t, rs, records, sealed)


@given(st.integers(0, 2**41))
def test_new_entry_is_the_dataclass(now: int) -> None:
    fast, slow = new_entry(now), OpenEntry(first_seen_ms=now)
    assert fast == slow
    fast.ranges[("s", 0)] = [1, 2]  # its own dict, not a shared default
    assert new_entry(now).ranges == {}


def test_the_fast_constructors_set_every_field() -> None:
    """A field added to one of these classes must be added to its fast constructor."""
    assert [f.name for f in dataclasses.fields(OffsetRange)] == [
        "stream", "partition", "start", "end"]
    assert [f.name for f in dataclasses.fields(Completion)] == [
        "time", "ranges", "records", "sealed_at_ms", "until"]
    entry = new_entry(5)
    for f in dataclasses.fields(OpenEntry):
        getattr(entry, f.name)  # AttributeError if the fast constructor left a slot unset


@given(st.text(max_size=5),
       st.lists(st.tuples(st.integers(0, 64), st.integers(-(2**63), 2**63 - 1),
                          st.integers(-(2**63), 2**63 - 1),
                          st.dictionaries(st.text(max_size=3), times, max_size=2)), max_size=20))
def test_sent_records_are_the_dataclass(
    stream: str, rows: list[tuple[int, int, int, dict[str, int | Keyed]]]
) -> None:
    """The publisher's constructors (a batch's, one record's): the same records, field by
    field."""
    fast = sent_records(stream, [r[0] for r in rows], [r[1] for r in rows],
                        [r[2] for r in rows], [r[3] for r in rows])
    slow = [SentRecord(stream, *r) for r in rows]
    assert fast == slow and [repr(r) for r in fast] == [repr(r) for r in slow]
    one = [sent_record(stream, *r) for r in rows]
    assert one == slow and [repr(r) for r in one] == [repr(r) for r in slow]
    fast += one
    for record in fast:
        for f in dataclasses.fields(SentRecord):
            getattr(record, f.name)  # AttributeError if a slot was left unset
        assert record.dead_lettered is False
