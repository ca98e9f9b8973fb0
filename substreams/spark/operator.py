"""The operator API: user code that sees each completed epoch once, in notification order.

A firm-bound batch holds whole epochs; grouping its rows by the EpochComplete that closed
them (``control_offset``) gives one ``on_epoch`` call per epoch with every record of that
epoch and none of any other.  Results are plain dicts shaped like the output stream's schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from substreams.frontier import Time
from substreams.spark.epochs import META_COLUMNS, parse_time

Row = dict[str, Any]


@dataclass
class EpochInfo:
    """One completed epoch of a batch."""

    time: Time
    control_offset: int
    sealed_at_ms: int
    records: int
    rows: list[Row] = field(default_factory=list)
    notified_at_ms: int = 0
    """When ``on_epoch`` was called (wall clock): notification latency = this - sealed_at_ms."""


class EpochOperator:
    """Subclass and override :meth:`on_epoch` (and optionally the other hooks).

    ``on_epoch`` may be called again for an epoch whose batch is replayed after a crash;
    the runner then drops the repeated results, so it must be a function of its rows."""

    key_field: str | None = None
    """Result field used as the Kafka key (partitioning) of published results."""

    def on_record(self, row: Row) -> Iterable[Row] | None:
        """Called for each record, in order, before its epoch's ``on_epoch``."""
        return None

    def on_epoch(self, epoch: Time, rows: list[Row]) -> Iterable[Row]:
        """All records of ``epoch``; returns the results to publish."""
        raise NotImplementedError

    def output_times(self, epoch: Time, output_substreams: Sequence[str]) -> Mapping[str, Time]:
        """Which time to seal in each output substream once ``epoch``'s results are
        written (default: the same time, for jobs that keep the input's time domain)."""
        return {name: epoch for name in output_substreams}

    def after_commit(self, info: EpochInfo, results: list[Row]) -> None:
        """Called once the epoch's results are durable and sealed (e.g. to print progress)."""


def _order(row: Row) -> tuple[int, bool, int, int, int]:
    return (
        int(row["control_offset"]),
        bool(row["is_notification"]),
        int(row["order_key"] or 0),
        int(row["partition"] or 0),
        int(row["offset"] or 0),
    )


def group_epochs(rows: Iterable[Row]) -> list[EpochInfo]:
    """Rows of a firm batch (with notification markers) -> epochs in notification order,
    each with its records in read order and without the source's metadata columns
    except ``order_key``, ``partition`` and ``offset``."""
    keep = {"order_key", "partition", "offset", "epoch"}
    drop = [n for n in META_COLUMNS if n not in keep]
    epochs: dict[int, EpochInfo] = {}
    for row in sorted(rows, key=_order):
        offset = int(row["control_offset"])
        info = epochs.get(offset)
        if info is None:
            info = epochs[offset] = EpochInfo(
                parse_time(str(row["epoch"])), offset, int(row["sealed_at_ms"] or 0), 0
            )
        if row["is_notification"]:
            info.records = int(row["records"] or 0)
            continue
        info.rows.append({k: v for k, v in row.items() if k not in drop})
    return [epochs[o] for o in sorted(epochs)]
