"""#16 session 10: the agent's flat-columns path and its coalesced seals.

``sent_and_delivered_columns`` must write the acks of per-record aggregation (the same
per-time entries; at one record per time the very same block bytes), and dropping
seals in ``take`` must leave the acker's state exactly as the seals one by one would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker import agent as agent_module
from substreams.acker.agent import TrackingAgent
from substreams.acker.protocol import AckMessage, AckReport, SealEntry, decode_ack, encode_ack
from substreams.acker.table import SOURCE, SegmentTable, Violation
from substreams.frontier import Time

CONFIG: Any = SimpleNamespace(acker=SimpleNamespace(acks_topic="acks", acks_partitions=4))
SUBS = ("ep", "win", "third")


@st.composite
def _times(draw: st.DrawFn, n: int) -> list[Time]:
    """A batch's times: strictly increasing (granularity 1: the packed path), runs and
    repeats, or an odd tuple time among ints (aggregated per time)."""
    kind = draw(st.sampled_from(["g1", "g1", "runs", "random", "tuple"]))
    if kind == "g1":
        start = draw(st.integers(0, 50))
        steps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        out, t = [], start
        for s in steps:
            out.append(t)
            t += s
        return list(out)
    if kind == "runs":
        g = draw(st.integers(1, 4))
        start = draw(st.integers(0, 50))
        return [start + i // g for i in range(n)]
    times: list[Time] = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n))
    if kind == "tuple" and n:
        times[draw(st.integers(0, n - 1))] = (1, 2)
    return times


@st.composite
def _op(draw: st.DrawFn) -> tuple[Any, ...]:
    sub = draw(st.sampled_from(SUBS))
    if draw(st.integers(0, 3)) == 0:
        return ("seal", sub, draw(st.integers(0, 80)), draw(st.integers(0, 2)))
    n = draw(st.integers(0, 24))
    stream = draw(st.sampled_from(["s", "s", "s", "u"]))
    times = draw(_times(n))
    parts = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    offsets = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    return ("batch", sub, stream, times, parts, offsets)


ops = st.lists(_op(), max_size=12)


@contextmanager
def _clock(stamps: list[int]) -> Iterator[None]:
    """``now_ms`` in the agent returns ``stamps`` in turn (seals' ``sealed_at_ms``)."""
    it = iter(stamps)
    with mock.patch.object(agent_module, "now_ms", lambda: next(it, 10_000)):
        yield


def _run(ops: list[tuple[Any, ...]], columns: bool) -> list[tuple[int, AckMessage]]:
    """The ops through one agent (columns, or each record added to its time's aggregate:
    two reports whose ids cancel, one record, its offset), round-tripped through the wire
    as the acker reads them."""
    agent = TrackingAgent(CONFIG, "src", "i")
    stamps = [ms for op in ops if op[0] == "seal" for ms in [op[3]]]
    stamps = [sum(stamps[: i + 1]) for i in range(len(stamps))]  # non-decreasing, repeats
    with _clock(stamps):
        for op in ops:
            if op[0] == "seal":
                agent.seal(op[1], op[2])
                continue
            _, sub, stream, times, parts, offsets = op
            if columns:
                agent.sent_and_delivered_columns(sub, stream, times, parts, offsets)
            else:
                for t, p, o in zip(times, parts, offsets, strict=True):
                    agg = agent._agg(sub, t)
                    agg.reports += 2
                    agg.records += 1
                    agg.add_offsets((stream, p), o, o + 1)
        taken = agent.take()
    return [(p, decode_ack(encode_ack(m), agent.headers)) for p, m in taken]


def _entries(msgs: list[tuple[int, AckMessage]]) -> dict[Any, Any]:
    """Per (acks partition, substream, time): xor, records, reports and ranges in order."""
    out = {}
    for p, m in msgs:
        assert isinstance(m.body, AckReport)
        for e in m.body.all_entries():
            key = (p, e.substream, e.time)
            assert key not in out  # no time twice in a commit
            out[key] = (e.xor, e.records, e.reports,
                        [(r.stream, r.partition, r.start, r.end) for r in e.ranges])
    return out


@settings(max_examples=300)
@given(ops)
def test_columns_write_the_acks_of_the_records_path(ops: list[tuple[Any, ...]]) -> None:
    old, new = _run(ops, columns=False), _run(ops, columns=True)
    assert [(p, m.seq) for p, m in new] == [(p, m.seq) for p, m in old]
    assert _entries(new) == _entries(old)
    for (_, a), (_, b) in zip(old, new, strict=True):
        assert isinstance(a.body, AckReport) and isinstance(b.body, AckReport)
        assert a.body.seals == b.body.seals
        # where both pack a substream's block it is the same bytes
        by_sub = {k.substream: k for k in a.body.columns}
        for block in b.body.columns:
            assert block.problem() is None
            assert block == by_sub[block.substream]
        assert {k.substream for k in a.body.columns} == {k.substream for k in b.body.columns}


def test_granularity_1_packs_without_an_object_per_time() -> None:
    """The point of the columns: a commit of one record per time builds no ``_Agg``."""
    agent = TrackingAgent(CONFIG, "src", "i")
    times = list(range(100, 1100))
    agent.sent_and_delivered_columns("ep", "s", times, [t % 4 for t in times],
                                     [t // 4 for t in times])
    with mock.patch.object(agent_module, "_Agg", side_effect=AssertionError("an _Agg")):
        ((_, msg),) = agent.take()
    assert isinstance(msg.body, AckReport)
    (block,) = msg.body.columns
    entries = list(block.entries())
    assert [e.time for e in entries] == times
    assert {(e.xor, e.records, e.reports) for e in entries} == {(0, 1, 2)}
    assert [e.ranges[0].start for e in entries] == [t // 4 for t in times]
    assert [e.ranges[0].end for e in entries] == [t // 4 + 1 for t in times]


def test_a_seal_per_record_travels_as_one() -> None:
    """``publish`` at granularity 1 seals every record: within one millisecond the commit
    carries only the highest seal (each lower time has its record in the commit)."""
    agent = TrackingAgent(CONFIG, "src", "i")
    times = list(range(50))
    with _clock([7] * 50):
        for t in times:
            agent.sent_and_delivered_columns("ep", "s", [t], [0], [t])
            agent.seal("ep", t)
        ((_, msg),) = agent.take()
    assert isinstance(msg.body, AckReport)
    assert msg.body.seals == (SealEntry("ep", 49, 7),)


def test_seals_of_times_without_data_are_kept() -> None:
    """A seal of a time with no record opens that time at the acker (its notification):
    it is never dropped for a later one; a lower seal after a higher one is."""
    agent = TrackingAgent(CONFIG, "src", "i")
    with _clock([5, 5, 5, 5]):
        agent.sent_and_delivered_columns("ep", "s", [1], [0], [0])
        for t in (1, 2, 3, 2):
            agent.seal("ep", t)
        ((_, msg),) = agent.take()
    assert isinstance(msg.body, AckReport)
    assert msg.body.seals == (SealEntry("ep", 2, 5), SealEntry("ep", 3, 5))


# -- the acker's view: coalesced seals leave its state as the seals one by one --------------


def _apply(tables: dict[str, SegmentTable], report: AckReport, seals: tuple[SealEntry, ...],
           now: int) -> list[str]:
    """What the acker's ``_apply_report`` does, on pure tables (problems returned)."""
    problems = []
    for e in report.entries:
        try:
            tables[e.substream].report(e.time, e.xor, e.records, e.reports, e.ranges, now)
        except Violation as v:
            problems.append(v.reason)
    for block in report.columns:
        cols = block.unpack()
        assert not isinstance(cols, str)
        _, refused = tables[block.substream].report_block(*cols, now)
        problems += [v.reason for v in refused]
    for s in seals:
        tables[s.substream].seal("src", s.time, s.sealed_at_ms, now)
    return problems


def _tables(presealed: int) -> dict[str, SegmentTable]:
    tables = {}
    for sub in SUBS:
        tab = SegmentTable(sub)
        tab.register("src", SOURCE)
        if presealed >= 0:
            tab.seal("src", presealed, 1, 1)
            tab.terminations()
        tables[sub] = tab
    return tables


@settings(max_examples=300)
@given(ops, st.integers(-1, 10))
def test_coalesced_seals_leave_the_acker_as_the_seals_one_by_one(
    ops: list[tuple[Any, ...]], presealed: int,
) -> None:
    msgs = _run(ops, columns=True)
    stamps = [op[3] for op in ops if op[0] == "seal"]
    stamps = [sum(stamps[: i + 1]) for i in range(len(stamps))]
    every = tuple(SealEntry(op[1], op[2], ms)
                  for op, ms in zip([o for o in ops if o[0] == "seal"], stamps, strict=True))
    one, many = _tables(presealed), _tables(presealed)
    probs_one, probs_many = [], []
    for _, m in msgs:
        assert isinstance(m.body, AckReport)
        mine = {s.substream for s in m.body.seals} | {e.substream for e in m.body.all_entries()}
        probs_many += _apply(many, m.body, m.body.seals, 3)
        probs_one += _apply(one, m.body, tuple(s for s in every if s.substream in mine), 3)
    # seals of substreams with no report in any message: one acks partition each
    reported = {s.substream for _, m in msgs if isinstance(m.body, AckReport)
                for s in m.body.seals}
    assert {s.substream for s in every} <= reported
    assert probs_many == probs_one
    for sub in SUBS:
        assert many[sub].to_state() == one[sub].to_state()
        assert many[sub].terminations() == one[sub].terminations()
        assert many[sub].to_state() == one[sub].to_state()
