"""Read limits of the firm source: ``maxEpochsPerTrigger`` / ``maxRecordsPerTrigger``.

Why limits are counted in whole epochs: a firm micro-batch is a range of the control topic
and holds every record of the epochs notified in it and nothing else, so the only place a
batch may end is after a notification.  A limit therefore picks how many notifications a
batch takes, never how many records of one epoch: the batch stops after the N-th epoch
(``maxEpochsPerTrigger``), or before the epoch whose records would take it past
``maxRecordsPerTrigger``; but it always takes at least one control record, so an epoch
larger than the record limit still makes progress (alone in its batch).

Why the cut is at control records, not at notifications: source offsets are control-topic
positions, and a batch (start, end] covers whole control records. One record may carry
several notifications (the acker's batched completions, ``EpochsComplete``, identified by
``(control_offset, index)``); the notifications of one record travel together: they are
grouped by ``control_offset`` below and a group is never split, even when it alone exceeds a
limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from substreams.spark.offsets import Notification


@dataclass(frozen=True)
class ReadLimits:
    """At most ``max_epochs`` epochs / ``max_records`` records per batch (None: no limit)."""

    max_epochs: int | None = None
    max_records: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.max_epochs is None and self.max_records is None


def _groups(notes: Sequence[Notification]) -> list[list[Notification]]:
    """Consecutive notifications of the same control record (one each, today)."""
    out: list[list[Notification]] = []
    for n in notes:
        if out and out[-1][0].control_offset == n.control_offset:
            out[-1].append(n)
        else:
            out.append([n])
    return out


def cut(notes: Sequence[Notification], limits: ReadLimits) -> int:
    """How many of ``notes`` (those after the batch's start, in control-offset order) the
    next batch takes under ``limits``: whole control records only, at least the first
    one when there is any."""
    if limits.unlimited:
        return len(notes)
    taken = epochs = records = 0
    for group in _groups(notes):
        size = sum(max(n.records, 0) for n in group)
        if taken and (
            (limits.max_epochs is not None and epochs + len(group) > limits.max_epochs)
            or (limits.max_records is not None and records + size > limits.max_records)
        ):
            break
        taken += len(group)
        epochs += len(group)
        records += size
    return taken


def batch_end(start: int, latest: int, notes: Sequence[Notification], limits: ReadLimits) -> int:
    """The end position (next control offset to read) of a batch from ``start`` when
    ``latest`` is what is readable and ``notes`` are the notifications in [start, latest)."""
    n = cut(notes, limits)
    if n == len(notes):
        return latest
    return notes[n - 1].control_offset + 1


__all__ = ["ReadLimits", "batch_end", "cut"]
