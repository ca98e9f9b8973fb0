"""The operator's grouping and ordering, and the in-memory harness (no Spark, no Kafka):
the same functions an executor task runs (operator.groups / apply_operator / summaries) and
the driver's notifications()."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.errors import SubstreamsError
from substreams.frontier import Keyed, Time
from substreams.spark.epochs import epoch_struct, struct_time
from substreams.spark.operator import (
    EpochNote,
    EpochOperator,
    Row,
    as_operator,
    groups,
    row_order,
)
from substreams.spark.testing import run_operator, run_rows, source_rows

users = st.sampled_from(["ada", "bob", "cy", "dee"])
epoch_records = st.lists(
    st.lists(st.fixed_dictionaries({"user": users, "n": st.integers(0, 9)}), max_size=8),
    max_size=6,
)


class Counts(EpochOperator):
    """Records per user, per epoch; remembers the notifications it got (driver side)."""

    key_field = "user"

    def __init__(self) -> None:
        self.notes: list[EpochNote] = []
        self.calls: list[tuple[Time, int]] = []

    def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
        self.calls.append((epoch, len(rows)))
        counts = Counter(str(r["user"]) for r in rows)
        return [{"user": u, "count": n, "window": epoch} for u, n in sorted(counts.items())]

    def on_notification(self, note: EpochNote) -> None:
        self.notes.append(note)


class PerUser(Counts):
    group_by = "user"


@pytest.mark.parametrize("t", [0, 7, (1, 2), (), Keyed("u@1", 5), Keyed("k", (3, 4))])
def test_epoch_struct_round_trips(t: Time) -> None:
    key, coords, kind = epoch_struct(t)
    assert struct_time((key, coords, kind)) == t
    assert struct_time({"key": key, "coords": coords, "kind": kind}) == t


@given(epoch_records, st.integers(1, 4), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_every_epoch_once_in_order_with_exactly_its_records(
    epochs: list[list[dict[str, Any]]], units: int, rnd: random.Random
) -> None:
    rows = source_rows(list(enumerate(epochs)))
    rnd.shuffle(rows)  # the order rows reach the tasks in does not matter
    op = Counts()
    out = run_rows(op, rows, units=units, output_substreams=["o"])
    assert [n.time for n in op.notes] == list(range(len(epochs)))  # every epoch, in order
    assert [n.records for n in op.notes] == [len(e) for e in epochs]
    assert sorted(op.calls) == [(i, len(e)) for i, e in enumerate(epochs)]  # once each
    for i, e in enumerate(epochs):
        want = Counter(str(r["user"]) for r in e)
        assert {r["user"]: r["count"] for r in out.results[i]} == dict(want)
    assert out.seals == [{"o": i} for i in range(len(epochs))]


@given(epoch_records, st.integers(1, 4), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_per_key_operator_sees_each_key_of_each_epoch_once(
    epochs: list[list[dict[str, Any]]], units: int, rnd: random.Random
) -> None:
    rows = source_rows(list(enumerate(epochs)))
    rnd.shuffle(rows)
    op = PerUser()
    out = run_rows(op, rows, units=units)
    want_calls = sorted(
        (i, n) for i, e in enumerate(epochs) for n in Counter(str(r["user"]) for r in e).values()
    )
    assert sorted(op.calls) == want_calls  # one call per (epoch, key), never an empty one
    assert [n.time for n in op.notes] == list(range(len(epochs)))  # one note per epoch
    assert [n.results for n in op.notes] == [len({r["user"] for r in e}) for e in epochs]
    for i, e in enumerate(epochs):
        assert sorted((r["user"], r["count"]) for r in out.results[i]) == sorted(
            Counter(str(r["user"]) for r in e).items()
        )


@given(epoch_records, st.randoms(use_true_random=False))
@settings(max_examples=40, deadline=None)
def test_records_reach_the_operator_in_read_order(
    epochs: list[list[dict[str, Any]]], rnd: random.Random
) -> None:
    seen: dict[Time, list[int]] = {}

    def record(epoch: Time, rows: list[Row]) -> list[Row]:
        seen[epoch] = [int(r["n"]) for r in rows]
        return []

    rows = source_rows(list(enumerate(epochs)))
    rnd.shuffle(rows)
    grouped = [g.info for g in groups(sorted(rows, key=row_order(None)))]
    assert [e.time for e in grouped] == list(range(len(epochs)))
    for e, records in zip(grouped, epochs, strict=True):
        assert [r["n"] for r in e.rows] == [r["n"] for r in records]
    run_rows(as_operator(record), rows, units=3)
    assert seen == {i: [int(r["n"]) for r in e] for i, e in enumerate(epochs)}


def test_a_plain_function_is_an_operator_and_empty_epochs_are_delivered() -> None:
    out = run_operator(lambda epoch, rows: [{"epoch": epoch, "n": len(rows)}],
                       {0: [{"u": 1}], 1: [], 2: [{"u": 2}, {"u": 3}]})
    assert out.results == {0: [{"epoch": 0, "n": 1}], 1: [{"epoch": 1, "n": 0}],
                           2: [{"epoch": 2, "n": 2}]}
    assert [(n.time, n.records, n.results) for n in out.notes] == [(0, 1, 1), (1, 0, 1),
                                                                   (2, 2, 1)]


def test_groups_refuse_unsorted_rows() -> None:
    rows = sorted(source_rows({0: [{"u": 1}], 1: [{"u": 2}]}), key=row_order(None))
    with pytest.raises(SubstreamsError, match="out of order"):
        list(groups(list(reversed(rows))))
