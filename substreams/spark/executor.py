"""What runs in the executors: operators over a task's groups, and exactly-once writes.

A *unit* is one task of the write stage of a micro-batch, named by its partition id ``p``
(deterministic, so a replayed batch gives unit ``p`` the same rows: either the source's read
task ``p``, whose split into tasks is logged with the batch's offsets -- an operator without
``group_by`` -- or hash partition ``p`` of the notification's identity and key).  Unit
``p`` of query ``q`` writes with its own transactional publisher, source id
``spark.<q>.w<p>`` (:func:`unit_source`), so:

* ``init_transactions`` of a new attempt fences every earlier attempt of the same unit (a
  Spark task retry, a zombie task of a killed driver): a zombie commits nothing after it;
* the unit's results and its *marker* -- the consumer-group offset ``batch_id + 1`` of group
  ``substreams.spark.<q>.w<p>`` on the stream's commit topic, committed with
  ``send_offsets_to_transaction`` -- are one transaction: visible together or not at all;
* a new attempt reads the marker after fencing: at or past its batch, the results are
  already committed and the unit writes nothing (and does not run the operator again).

The unit's publisher registers with the acker as a STAGE of the stream's acker substreams
(records counted with their offsets; it never seals, and the acker does not wait for it):
the query's driver is the SOURCE that seals each output time once every unit committed.
Unit source ids share the driver's acks partition (:func:`unit_source`), so the acker,
reading that partition in order, applies every unit's reports before the driver's seal.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition

from substreams.acker.protocol import acks_partition
from substreams.app import Application
from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.kafka.read import Reader
from substreams.spark.operator import (
    ArrowEpochOperator,
    EpochOperator,
    Group,
    GroupResult,
    Row,
    Summary,
    apply_operator,
    groups,
    summaries,
)

log = logging.getLogger(__name__)

UNLIMITED = 1 << 62

DIRECT_UNITS = 0
"""``UnitPlan.units`` of a batch whose units are the source's read tasks (no shuffle: an
operator without ``group_by``); their split is in Spark's offset log."""

def _ms(since: float) -> float:
    import time

    return (time.perf_counter() - since) * 1000.0


def commit_topic(stream: str) -> str:
    return f"_substreams.commits.{stream}"


def unit_source(driver_source: str, unit: int, config: Config) -> str:
    """Unit ``unit``'s source id: ``<driver>.w<unit>``, with a suffix when needed so that
    it falls in the driver's acks partition (the acker orders only within a partition)."""
    parts = config.acker.acks_partitions
    want = acks_partition(driver_source, parts)
    base = f"{driver_source}.w{unit}"
    if acks_partition(base, parts) == want:
        return base
    n = 0
    while acks_partition(f"{base}~{n}", parts) != want:
        n += 1
    return f"{base}~{n}"


def unit_group(driver_source: str, unit: int) -> str:
    return f"substreams.{driver_source}.w{unit}"


def check_output(config: Config, stream: str) -> None:
    """Refuse an output stream whose substreams executors cannot keep firm: punctuations
    need every producer's punctuation in every partition, and units come and go."""
    bad = [s.name for s in config.substreams_of(stream) if s.mechanism != "acker"]
    if bad:
        raise SubstreamsError(
            f"stream '{stream}': substreams {', '.join(bad)} use punctuations; a Spark job "
            "writes its output from many executor tasks, which only the acker can track "
            "(use mechanism: acker for the output's substreams)"
        )


class UnitWriter:
    """One unit's exactly-once writer (module doc)."""

    def __init__(
        self, config: Config, stream: str, driver_source: str, unit: int, bootstrap: str
    ) -> None:
        self.config = config
        self.stream = stream
        self.unit = unit
        self.source_id = unit_source(driver_source, unit, config)
        self.group = unit_group(driver_source, unit)
        self.marker_tp = TopicPartition(commit_topic(stream), 0)
        # Fences every earlier attempt of this unit before the marker is trusted.
        self.publisher, _ = Application(config, bootstrap).stage_writer(
            stream, self.source_id, [s.name for s in config.substreams_of(stream)],
            batch_size=UNLIMITED,
        )
        self.reader: Reader | None = None
        try:
            self.reader = Reader(
                bootstrap, config, name=f"spark unit '{self.source_id}'",
                **{"group.id": self.group},
            )
        except BaseException:
            self.abort()
            raise

    def committed(self) -> tuple[int, dict[str, Any]]:
        """The last batch id this unit committed (-1: none) and its marker's metadata."""
        assert self.reader is not None
        [tp] = self.reader.committed([self.marker_tp])
        if tp.offset < 0:
            return -1, {}
        meta = json.loads(tp.metadata) if tp.metadata else {}
        return tp.offset - 1, meta

    def write(
        self, results: Iterable[Row], key_field: str | None, check_order: bool = True
    ) -> int:
        """Publish ``results`` in the open transaction.  ``check_order=False`` for rows of
        a user's DataFrame, whose order keys follow no single clock."""
        n = 0
        for row in results:
            key = None if key_field is None else str(row[key_field])
            self.publisher.publish(row, key=key, check_order=check_order)
            n += 1
        return n

    def commit(self, batch_id: int, meta: dict[str, Any]) -> None:
        """The results written so far and the marker ``batch_id``: one transaction."""
        assert self.reader is not None
        marker = TopicPartition(
            self.marker_tp.topic, 0, batch_id + 1, metadata=json.dumps(meta, sort_keys=True)
        )
        self.publisher.send_offsets([marker], self.reader.consumer.consumer_group_metadata())
        self.publisher.flush()

    def close(self) -> None:
        try:
            self.publisher.close()
        finally:
            if self.reader is not None:
                self.reader.close()

    def abort(self) -> None:
        self.publisher.abort()
        if self.reader is not None:
            self.reader.close()


@dataclass(frozen=True)
class UnitPlan:
    """Everything a task needs (pickled with the task; plain values and the operator)."""

    operator: EpochOperator
    batch_id: int
    units: int
    """The write stage's partition count (recorded in each marker: a replay must match);
    :data:`DIRECT_UNITS` when the units are the source's read tasks."""
    config: Config | None = None
    output_stream: str | None = None
    driver_source: str = ""
    bootstrap: str = ""
    sealed: bool = False
    """The driver committed this batch's seals before: everything of it is durable."""
    verify: bool = False
    """Fail an epoch whose records differ in number from its notification's count before
    anything of it is written (the JVM path, whose read is not the source's: the Python
    read task checks this itself).  Per-epoch operators only: with ``group_by`` a task holds
    one key of an epoch."""


def run_unit(plan: UnitPlan, unit: int, rows: Iterable[Row]) -> list[Summary]:
    """One task: its rows (sorted by :func:`~substreams.spark.operator.sort_columns`)
    -> the operator's results written exactly once -> one summary per notification."""
    return run_groups(plan, unit, groups(rows, plan.operator.group_by))


def columnar(op: EpochOperator) -> bool:
    """Whether a direct unit hands ``op`` its epochs as Arrow tables
    (:func:`~substreams.spark.columnar.arrow_groups`) rather than rows."""
    return isinstance(op, ArrowEpochOperator) and op.group_by is None


def run_unit_batches(plan: UnitPlan, unit: int, batches: Iterable[Any]) -> list[Summary]:
    """:func:`run_unit` for a direct unit of an :class:`ArrowEpochOperator`: the source's
    Arrow batches grouped columnar, no rows built."""
    from substreams.spark.columnar import arrow_groups

    return run_groups(plan, unit, arrow_groups(batches))


def _verified(grouped: Iterator[Group]) -> Iterator[Group]:
    """``grouped`` with each whole epoch's record count checked against its notification."""
    for g in grouped:
        info = g.info
        if g.marker is not None:
            seen = info.table.num_rows if info.table is not None else len(info.rows)
            if seen != info.records:
                raise SubstreamsError(
                    f"epoch at control offset {info.control_offset} "
                    f"(index {info.control_index}): its EpochComplete announces "
                    f"{info.records} records but its ranges hold {seen}"
                )
        yield g


def run_groups(plan: UnitPlan, unit: int, grouped: Iterator[Group]) -> list[Summary]:
    """The unit's epochs (or keys of them) in order -> results written exactly once."""
    import time

    op = plan.operator
    if plan.verify and op.group_by is None:
        grouped = _verified(grouped)
    t0 = time.perf_counter()
    if plan.output_stream is None or plan.config is None:
        out = _consume(apply_operator(op, grouped), unit, written=False, plan=plan)
        log.debug("unit %d: batch %d: %d epochs, rows+operator %.0f ms (no output)",
                  unit, plan.batch_id, len(out), _ms(t0))
        return out
    if plan.sealed:
        return _skip(grouped, unit)
    first = next(grouped, None)
    if first is None:
        return []
    return _write_unit(plan, unit, _chain(first, grouped), _ms(t0))


def _write_unit(
    plan: UnitPlan, unit: int, grouped: Iterator[Group], t_rows: float
) -> list[Summary]:
    """A unit with records to write: its writer fences earlier attempts, then either finds
    the batch committed (a replay: skipped) or writes and commits it.  ``t_rows``: ms
    until the first group (timing log)."""
    import time

    assert plan.config is not None and plan.output_stream is not None
    t1 = time.perf_counter()
    writer = UnitWriter(plan.config, plan.output_stream, plan.driver_source, unit,
                        plan.bootstrap)
    try:
        t_init = _ms(t1)
        t1 = time.perf_counter()
        done, meta = writer.committed()
        t_marker = _ms(t1)
        fresh = done < plan.batch_id
        if fresh:
            sums, t_op, t_commit = _publish_and_commit(writer, plan, unit, grouped)
        t1 = time.perf_counter()
        writer.close()
    except BaseException:
        writer.abort()
        raise
    if not fresh:
        return _replayed(plan, unit, done, meta, writer.source_id, grouped)
    log.debug(
        "unit %d: batch %d timings: first rows %.0f ms, writer init %.0f ms, marker "
        "lookup %.0f ms, operator+publish %.0f ms, commit %.0f ms, close %.0f ms",
        unit, plan.batch_id, t_rows, t_init, t_marker, t_op, t_commit, _ms(t1),
    )
    return sums


def _replayed(
    plan: UnitPlan, unit: int, done: int, meta: dict[str, Any], source_id: str,
    grouped: Iterator[Group],
) -> list[Summary]:
    """A batch this unit already committed (marker ``done``): its summaries, unwritten,
    after checking the replay is cut as the committed batch was."""
    if done == plan.batch_id and meta.get("units") != plan.units:
        raise SubstreamsError(
            f"unit {unit} of batch {plan.batch_id} was committed with "
            f"{meta.get('units')} units, the replay has {plan.units}: the partitioning "
            "changed, so exactly-once cannot be kept (keep "
            "spark.sql.shuffle.partitions across restarts of a query)"
        )
    log.warning("unit %s: batch %d already committed (marker %d): skipped",
                source_id, plan.batch_id, done)
    skipped = _skip(grouped, unit)
    if done == plan.batch_id and "span" in meta and meta["span"] != _span(skipped):
        raise SubstreamsError(
            f"unit {unit} of batch {plan.batch_id} committed the notifications "
            f"{meta['span']}, the replay holds {_span(skipped)}: the batch was cut "
            "differently, so exactly-once cannot be kept"
        )
    return skipped


def _publish_and_commit(
    writer: UnitWriter, plan: UnitPlan, unit: int, grouped: Iterator[Group]
) -> tuple[list[Summary], float, float]:
    """Run the operator over ``grouped``, publish its results and commit them with the
    unit's marker in one transaction: the summaries, and the operator and commit ms."""
    import time

    op = plan.operator

    def written() -> Iterator[GroupResult]:
        for result in apply_operator(op, grouped):
            writer.write(result.results, op.key_field)
            result.group.info.rows = []  # the records are done with: free them
            result.group.info.table = None
            yield result

    t1 = time.perf_counter()
    sums = summaries(written(), unit, written=True)
    t_op = _ms(t1)
    t1 = time.perf_counter()
    writer.commit(
        plan.batch_id, {"units": plan.units, "batch": plan.batch_id, "span": _span(sums)}
    )
    t_commit = _ms(t1)
    log.info("unit %s: batch %d committed (%d results)", writer.source_id, plan.batch_id,
             sum(s.results for s in sums))
    return sums, t_op, t_commit


def _span(sums: Sequence[Summary]) -> list[list[int]]:
    """The first and last notification a unit holds (in its marker: a replay that finds
    the marker checks it holds the same ones, not only the same unit count)."""
    idents = sorted((s.control_offset, s.control_index) for s in sums)
    return [list(idents[0]), list(idents[-1])] if idents else []


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _consume(results: Iterable[GroupResult], unit: int, written: bool, plan: UnitPlan
             ) -> list[Summary]:
    return summaries(results, unit, written)


def _skip(grouped: Iterable[Any], unit: int) -> list[Summary]:
    """Summaries without running the operator (a replay of committed work)."""
    return summaries(
        (GroupResult(g, []) for g in grouped), unit, written=False
    )


SUMMARY_FIELDS: Sequence[tuple[str, str]] = (
    ("control_offset", "long"),
    ("control_index", "int"),
    ("epoch_label", "string"),
    ("is_notification", "boolean"),
    ("records", "long"),
    ("sealed_at_ms", "long"),
    ("results", "long"),
    ("unit", "int"),
    ("written", "boolean"),
)
"""The one small row per (task, notification) the driver collects (DDL types)."""

