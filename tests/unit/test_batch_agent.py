"""#16: the acker agent's batch forms leave its table exactly as the per-record calls do."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from substreams.acker.agent import TrackingAgent
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


@given(batches)
def test_sent_and_delivered_many_equals_per_record(batch: list[tuple[int, int, int, int]]) -> None:
    one, many = TrackingAgent(CONFIG, "src", "i"), TrackingAgent(CONFIG, "src", "i")
    records = _records(batch)
    offsets = [o for *_, o in batch]
    for r, o in zip(records, offsets, strict=True):
        one.sent_and_delivered("ep", r.times["ep"], r.stream, r.partition, o)
    many.sent_and_delivered_many("ep", records, offsets)
    assert _table(many) == _table(one)
    assert [m.body for _, m in many.take()] == [m.body for _, m in one.take()]
