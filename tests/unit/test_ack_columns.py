"""AckBlock's packed columns: the round trip, the equivalence with entries, the shape checks.

A block must decode to what was packed and apply exactly like its entries one by one; a
block whose columns break the invariants must be refused with a reason (the acker
dead-letters it), never raise and never half-apply.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import replace
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.core import apply_block
from substreams.acker.protocol import (
    AckBlock,
    AckEntry,
    AckMessage,
    AckReport,
    Columns,
    SealEntry,
    decode_ack,
    encode_ack,
)
from substreams.acker.table import SOURCE, SegmentTable, Violation
from substreams.control.messages import OffsetRange
from substreams.control.progress import ProgressTracker
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec

ranges = st.builds(
    OffsetRange, st.sampled_from(["s", "t", "u"]), st.integers(0, 3), st.integers(0, 50),
    st.integers(50, 90),
)


@st.composite
def entry_lists(draw: st.DrawFn) -> list[AckEntry]:
    """One substream's entries at int times, as a block holds them (xors all 0 or not)."""
    n = draw(st.integers(1, 10))
    ts = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    xs = draw(st.one_of(st.just([0] * n), st.lists(st.sampled_from([0, 0, 1, -5, 2**62]),
                                                   min_size=n, max_size=n)))
    rs = [tuple(draw(st.lists(ranges, max_size=3))) for _ in range(n)]
    recs = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    reps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    return [AckEntry("x", t, x, rec, rep, r)
            for t, x, rec, rep, r in zip(ts, xs, recs, reps, rs, strict=True)]


def packed(entries: list[AckEntry]) -> AckBlock:
    xors = [e.xor for e in entries]
    return AckBlock.pack(
        "x", [cast(int, e.time) for e in entries], xors if any(xors) else [],
        [e.records for e in entries], [e.reports for e in entries],
        [len(e.ranges) for e in entries], [r for e in entries for r in e.ranges],
    )


def applied(columns: Columns, seal: int) -> tuple[Any, ...]:
    """What applying ``columns`` then a seal does to a fresh table: refused entries, newly
    active times, the state, and the terminations (with their offset ranges)."""
    table, tracker = SegmentTable("x"), ProgressTracker("x", 3)
    table.register("src", SOURCE)
    table.seal("src", 2, 1, 1)
    table.terminations()  # times <= 2 terminated: a block may hit them (refused)
    refused = [v.reason for v in apply_block(table, tracker, columns, 7)]
    table.seal("src", seal, 3, 8)
    state = json.loads(json.dumps(table.to_state()))
    active = sorted(json.dumps(t, sort_keys=True) for t in tracker.to_state()["active"])
    return refused, active, state, table.terminations()


@given(entry_lists())
def test_columns_round_trip_through_the_wire(entries: list[AckEntry]) -> None:
    """A block packed from entries decodes to the same block and expands to those entries."""
    block = packed(entries)
    msg = AckMessage("src", 1, 0, AckReport((), (SealEntry("x", 3, 3),), (block,)), "inc")
    fp = protocol_codec("ack").fingerprint_hex
    assert decode_ack(encode_ack(msg), [(HEADER_FINGERPRINT, fp)]) == msg
    assert list(block.entries()) == entries


@settings(max_examples=100, deadline=None)
@given(entry_lists(), st.integers(0, 12))
def test_a_block_applies_like_its_entries_one_by_one(
    entries: list[AckEntry], seal: int,
) -> None:
    """The columns path (``apply_block``) leaves the table as the entries applied one at a
    time would (same refusals, state and terminations)."""
    cols = packed(entries).unpack()
    assert not isinstance(cols, str)
    table, tracker = SegmentTable("x"), ProgressTracker("x", 3)
    table.register("src", SOURCE)
    table.seal("src", 2, 1, 1)
    table.terminations()
    refused = []
    for e in entries:
        try:
            if table.report(e.time, e.xor, e.records, e.reports, e.ranges, 7):
                tracker.activate(e.time)
        except Violation as v:
            refused.append(v.reason)
    table.seal("src", seal, 3, 8)
    state = json.loads(json.dumps(table.to_state()))
    active = sorted(json.dumps(t, sort_keys=True) for t in tracker.to_state()["active"])
    assert applied(cols, seal) == (refused, active, state, table.terminations())


def pack(typecode: str, values: list[int]) -> bytes:
    return array(typecode, values).tobytes()  # little-endian machines (x86, arm)


GOOD = AckBlock.pack("x", [1, 2], [], [1, 1], [2, 2], [1, 1],
                     [OffsetRange("s", 0, 0, 1), OffsetRange("s", 0, 1, 2)])
MALFORMED = [
    (replace(GOOD, times=GOOD.times[:-1]), "not a whole number"),
    (replace(GOOD, records=pack("i", [1])), "2 times but 1 records"),
    (replace(GOOD, xors=pack("q", [5])), "2 times but 1 xors"),
    (replace(GOOD, range_counts=pack("i", [2, 1])), "range counts sum to 3"),
    (replace(GOOD, range_counts=pack("i", [-1, 3])), "negative range count"),
    (replace(GOOD, ends=pack("q", [1])), "1 ends"),
    (replace(GOOD, stream_index=pack("i", [0, 1])), "stream index outside"),
    (replace(GOOD, stream_index=pack("i", [0, -1])), "stream index outside"),
    (replace(GOOD, streams=()), "stream index outside"),
    (replace(GOOD, partitions=pack("i", [0, -2])), "negative partition"),
    (replace(GOOD, ends=pack("q", [1, 0])), "start is after its end"),
]


def test_malformed_columns_are_refused_with_a_reason() -> None:
    assert not isinstance(GOOD.unpack(), str)
    for block, reason in MALFORMED:
        problem = block.unpack()
        assert isinstance(problem, str) and reason in problem, (block, problem)
        assert problem.startswith("block of substream 'x'")
        assert block.problem() == problem


@given(st.lists(st.tuples(st.integers(0, 10), st.binary(max_size=24)), max_size=4),
       st.lists(st.text(max_size=2), max_size=3))
def test_unpack_never_raises_and_what_it_accepts_holds_the_invariants(
    cuts: list[tuple[int, bytes]], streams: list[str],
) -> None:
    """Random column bytes: :meth:`AckBlock.unpack` says what is wrong or returns columns
    that the table can apply without an IndexError (the invariants hold)."""
    block = replace(GOOD, streams=tuple(streams) or GOOD.streams)
    names = ["times", "xors", "records", "reports", "range_counts", "stream_index",
             "partitions", "starts", "ends"]
    for which, data in cuts:
        if which < len(names):
            block = replace(block, **{names[which]: data})
    cols = block.unpack()
    if isinstance(cols, str):
        return
    n, m = len(cols.times), sum(cols.range_counts)
    assert len(cols.records) == len(cols.reports) == len(cols.range_counts) == n
    assert len(cols.xors) in (0, n)
    assert len(cols.stream_index) == len(cols.partitions) == len(cols.starts) == m
    assert all(0 <= i < len(cols.streams) for i in cols.stream_index)
    assert all(lo <= hi for lo, hi in zip(cols.starts, cols.ends, strict=True))
    list(block.entries())  # well-formed: expands without error
