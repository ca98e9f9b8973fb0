"""#16: the acker agent's batch forms leave its table exactly as the per-record calls do."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from substreams.acker.agent import BLOCK_MIN, TrackingAgent
from substreams.acker.protocol import AckBlock, AckReport
from substreams.acker.table import SOURCE, SegmentTable, Violation
from substreams.control.messages import OffsetRange
from substreams.streams.records import SentRecord

CONFIG: Any = SimpleNamespace(acker=SimpleNamespace(acks_topic="acks", acks_partitions=4))

batches = st.lists(
    st.tuples(
        st.integers(0, 3),  # partition
        st.integers(0, 4),  # time (runs of equal times and repeats after other times)
        st.integers(-(2**63), 2**63 - 1),  # tracking id
        st.integers(0, 10_000),  # offset
    ),
    max_size=40,
)


def _records(batch: list[tuple[int, int, int, int]]) -> list[SentRecord]:
    return [SentRecord("s", p, 0, tid, {"ep": t, "other": -t}) for p, t, tid, _ in batch]


def _table(agent: TrackingAgent) -> dict[Any, Any]:
    return {
        key: (agg.xor, agg.records, agg.reports, dict(agg.ranges))
        for key, agg in agent._table.items()
    }


@given(batches)
def test_report_sent_equals_report_per_record(batch: list[tuple[int, int, int, int]]) -> None:
    one, many = TrackingAgent(CONFIG, "src", "i"), TrackingAgent(CONFIG, "src", "i")
    records = _records(batch)
    for r in records:
        one.report("ep", r.times["ep"], r.tracking_id)
    many.report_sent("ep", records)
    assert _table(many) == _table(one)


entry_sets = st.lists(
    st.tuples(
        st.sampled_from(["ep", "win"]),
        st.one_of(st.integers(0, 30), st.tuples(st.integers(0, 3), st.integers(0, 3))),
        st.integers(-(2**63), 2**63 - 1),  # xor
        st.integers(0, 3),  # partition of a delivered record (or none)
        st.booleans(),  # delivered (a range) or only sent (an xor)
    ),
    min_size=1,
    max_size=60,
)


@given(entry_sets)
def test_blocks_carry_exactly_the_entries_of_a_commit(
    items: list[tuple[str, Any, int, int, bool]],
) -> None:
    """A commit's int-time entries of a substream with many of them travel as an AckBlock;
    blocks and entries together stand for exactly the per-time aggregates, and a block
    respects its own invariants (the acker refuses it otherwise)."""
    agent = TrackingAgent(CONFIG, "src", "i")
    for n, (sub, t, x, p, delivered) in enumerate(items):
        agent.report(sub, t, x)
        if delivered:  # the RCV of a delivered record carries its offset
            agent._agg(sub, t).records += 1
            agent._agg(sub, t).add_offsets(("s", p), n, n + 1)
    want = {
        (sub, t): (agg.xor, agg.records, agg.reports,
                   sorted((s, q, lo, hi) for (s, q), (lo, hi) in agg.ranges.items()))
        for (sub, t), agg in agent._table.items()
    }
    # one report per acks partition (the segments' partitions: "Sharded ackers")
    reports = [m.body for _, m in agent.take()]
    assert all(isinstance(r, AckReport) for r in reports)
    all_entries = [e for r in reports if isinstance(r, AckReport) for e in r.all_entries()]
    got = {
        (e.substream, e.time): (e.xor, e.records, e.reports,
                                sorted((r.stream, r.partition, r.start, r.end) for r in e.ranges))
        for e in all_entries
    }
    assert got == want
    assert len(all_entries) == len(want)  # no time twice
    for block in (b for r in reports if isinstance(r, AckReport) for b in r.columns):
        assert block.problem() is None
        assert len(block.times) >= BLOCK_MIN
        assert all(type(t) is int for t in block.times)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(-5, 5), st.integers(0, 2),
                          st.integers(0, 2)), max_size=50), st.integers(-1, 20))
def test_a_block_applies_like_its_entries_one_by_one(
    rows: list[tuple[int, int, int, int]], terminated_upto: int,
) -> None:
    """SegmentTable.report_block == report() per entry: same open times, same XORs,
    counts and ranges, the same times refused (already terminated) and the rest applied."""
    def table() -> SegmentTable:
        tab = SegmentTable("ep")
        tab.register("src", SOURCE)
        if terminated_upto >= 0:
            tab.seal("src", terminated_upto, 1, 1)
            tab.terminations()
        return tab

    ranges = [OffsetRange(("s", "u")[p % 2], p, t, t + 1 + n) for t, _, p, n in rows]
    one, many = table(), table()
    new_one, refused_one = [], []
    for (t, x, _, n), r in zip(rows, ranges, strict=True):
        try:
            if one.report(t, x, n, 2, (r,), 7):
                new_one.append(t)
        except Violation as v:
            refused_one.append(v.reason)
    columns = AckBlock.pack(
        "ep", [t for t, *_ in rows], [x for _, x, _, _ in rows], [n for *_, n in rows],
        [2] * len(rows), [1] * len(rows), ranges,
    ).unpack()
    assert not isinstance(columns, str), columns
    new_many, refused_many = many.report_block(*columns, 7)
    assert new_many == new_one
    assert [v.reason for v in refused_many] == refused_one
    assert {t: (e.xor, e.records, e.reports, e.ranges) for t, e in many.open.items()} == {
        t: (e.xor, e.records, e.reports, e.ranges) for t, e in one.open.items()
    }
