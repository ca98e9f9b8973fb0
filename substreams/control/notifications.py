"""Notifications of one substream for plain Python: typed notes, in order, optionally with
the records of each completed time.

Why a layer over :class:`~substreams.control.subscriber.Subscriber`: a consumer of window
results wants one thing per completed time -- which time, how many records, where they
are, when the last source sealed it and how long the announcement took -- not frontier
events.  The note is the same :class:`~substreams.control.notes.EpochNote` a Spark job's
``on_notification`` gets.  With ``records=True`` each note carries the time's records,
read from exactly the ranges the notification names (the firm read: every record of the
time and no other, whatever was written since); a record there that does not decode is
dead-lettered and counted in ``note.unreadable`` (``on_bad_record: dead_letter``), or stops
the reader with a :class:`~substreams.errors.BadRecordError` naming it (``fail``).
"""

from __future__ import annotations

from collections.abc import Iterator

from substreams.config import Config
from substreams.control.notes import EpochNote
from substreams.control.subscriber import Data, Start, Subscriber
from substreams.errors import SubstreamsError
from substreams.kafka.clock import Deadline, until_idle


class Notifications:
    """The completed times of ``substream``, one :class:`EpochNote` each, in notification
    order.  Iterate (``for note in notes``; ``idle_timeout`` ends the loop after that long
    without one) or :meth:`poll`.  ``from_``: ``"latest_snapshot"`` (default: from the
    writer's latest snapshot on), ``"beginning"``, ``"end"`` (only what completes from now
    on), a control offset (the notes of that record and after), or the last note a
    consumer handled (resume: every note after it, none before -- one control record may
    hold several notes, so an offset alone cannot say where inside it to go on)."""

    def __init__(
        self,
        config: Config,
        substream: str,
        *,
        from_: Start | EpochNote = "latest_snapshot",
        records: bool = False,
        bootstrap: str | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        sub = config.substream(substream)
        self.substream = substream
        self.records = records
        self.idle_timeout = idle_timeout
        self._after: tuple[int, int] | None = None
        start: Start
        if isinstance(from_, EpochNote):
            start, self._after = from_.control_offset, from_.ident
        else:
            start = from_
        self._subscriber = Subscriber(
            config, [sub.name], bootstrap=bootstrap, start=start, mode="firm",
            read_records=records, reader=f"notifications:{sub.name}",
        )

    def poll(self, timeout: float = 1.0) -> list[EpochNote]:
        """The notes that arrived within ``timeout`` seconds (possibly none)."""
        deadline = Deadline(timeout)
        while True:
            events = self._subscriber.poll(deadline.left())
            notes = [self._note(e) for e in events if isinstance(e, Data)]
            if self._after is not None:
                after = self._after
                notes = [n for n in notes if n.ident > after]
            if notes or deadline.passed:
                return notes

    def _note(self, event: Data) -> EpochNote:
        note = event.note
        if note is None:  # pragma: no cover - firm mode always sets it
            raise SubstreamsError(f"substream '{self.substream}': a data event without a note")
        if not self.records:
            return note
        return EpochNote(
            note.time, note.control_offset, note.control_index, note.records,
            note.sealed_at_ms, note.notified_at_ms, substream=note.substream,
            ranges=note.ranges, until=note.until, entries=tuple(event.records),
            unreadable=note.unreadable,
        )

    def __iter__(self) -> Iterator[EpochNote]:
        return until_idle(lambda: self.poll(0.2), self.idle_timeout)

    def close(self) -> None:
        self._subscriber.close()

    def __enter__(self) -> Notifications:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["EpochNote", "Notifications"]
