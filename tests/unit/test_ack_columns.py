"""AckBlock's packed columns (ack schema v3): the upgrade from v2 blocks and the shape checks.

A block written with the previous schema (``ack.v2.avsc``: arrays of longs and one
``OffsetRange`` record per range) must still decode and apply exactly like the same block
written as columns; a block whose columns break the invariants must be refused with a
reason (the acker dead-letters it), never raise and never half-apply.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.agent import (
    AckBlock,
    AckBlockV2,
    AckMessage,
    AckReport,
    Columns,
    SealEntry,
    decode_ack,
    encode_ack,
)
from substreams.acker.core import apply_block
from substreams.acker.table import SOURCE, SegmentTable
from substreams.control.messages import OffsetRange
from substreams.control.progress import ProgressTracker
from substreams.streams.schemas import HEADER_FINGERPRINT, Codec, protocol_codec, raw_schema

ranges = st.builds(
    OffsetRange, st.sampled_from(["s", "t", "u"]), st.integers(0, 3), st.integers(0, 50),
    st.integers(50, 90),
)


@st.composite
def v2_blocks(draw: st.DrawFn) -> AckBlockV2:
    n = draw(st.integers(1, 10))
    ts = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    xs = draw(st.one_of(st.just([]), st.lists(st.sampled_from([0, 0, 1, -5, 2**62]),
                                              min_size=n, max_size=n)))
    counts = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    rs = draw(st.lists(ranges, min_size=sum(counts), max_size=sum(counts)))
    recs = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    reps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    return AckBlockV2("x", tuple(ts), tuple(xs), tuple(recs), tuple(reps), tuple(counts),
                      tuple(rs))


def as_columns(b: AckBlockV2) -> AckBlock:
    return AckBlock.pack(b.substream, b.times, b.xors, b.records, b.reports, b.range_counts,
                         b.ranges)


def written_with_v2(block: AckBlockV2, seal: int) -> bytes:
    """An AckReport with ``block`` as the previous schema (v2) wrote it."""
    old = Codec(raw_schema("ack.v2"), union_names=True)
    datum = protocol_codec("ack").decode(encode_ack(AckMessage(
        "src", 1, 0, AckReport((), (SealEntry("x", seal, 3),), (), (block,)), "inc"
    )))
    name, report = datum["body"]
    assert report.pop("columns") == []
    return old.encode(datum | {"body": (name, report)})


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


@settings(max_examples=150, deadline=None)
@given(v2_blocks(), st.integers(0, 12))
def test_a_block_written_with_the_v2_schema_applies_like_the_columnar_one(
    block: AckBlockV2, seal: int,
) -> None:
    """Upgrade: acks an old publisher wrote (v2 fingerprint) decode with the v2 block in
    ``AckReport.blocks``, and unpack and apply exactly like the same block as columns."""
    v2 = written_with_v2(block, seal)
    old_fp = Codec(raw_schema("ack.v2")).fingerprint_hex
    assert old_fp != protocol_codec("ack").fingerprint_hex
    got = decode_ack(v2, [(HEADER_FINGERPRINT, old_fp)])
    body = got.body
    assert isinstance(body, AckReport) and body.columns == ()
    assert body.blocks == (block,)
    old_cols, new_cols = block.unpack(), as_columns(block).unpack()
    assert not isinstance(old_cols, str) and not isinstance(new_cols, str)
    assert list(block.entries()) == list(as_columns(block).entries())
    assert applied(old_cols, seal) == applied(new_cols, seal)


@given(v2_blocks())
def test_columns_round_trip_through_the_wire(block: AckBlockV2) -> None:
    new = as_columns(block)
    msg = AckMessage("src", 1, 0, AckReport((), (), (new,)), "inc")
    fp = protocol_codec("ack").fingerprint_hex
    assert decode_ack(encode_ack(msg), [(HEADER_FINGERPRINT, fp)]) == msg
    assert list(new.entries()) == list(block.entries())


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


def test_a_v2_block_is_held_to_the_same_rules() -> None:
    """What v3 refuses, a v2 block (an old publisher's) must not get through either."""
    r = OffsetRange("s", 0, 0, 1)
    cases = [
        (AckBlockV2("x", (1, 2), (), (1,), (1, 1), (1, 1), (r, r)), "2 times but 1 records"),
        (AckBlockV2("x", (1,), (3, 4), (1,), (1,), (1,), (r,)), "1 times but 2 xors"),
        (AckBlockV2("x", (1,), (), (1,), (1,), (2,), (r,)), "range counts sum to 2"),
        (AckBlockV2("x", (1,), (), (1,), (1,), (1,), (replace(r, partition=-1),)),
         "negative partition"),
        (AckBlockV2("x", (1,), (), (1,), (1,), (1,), (replace(r, start=2),)),
         "start is after its end"),
    ]
    for block, reason in cases:
        problem = block.unpack()
        assert isinstance(problem, str) and reason in problem, (block, problem)
