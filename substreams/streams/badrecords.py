"""What every reader of a data topic does with a record it cannot decode.

Why one place: a data topic is open to any producer, so one foreign record (JSON from a
plain client, a truncated write, a record of a schema never registered) must not stop a
listener, a tail, a firm read, a stage or a Spark query for good -- and must not vanish
either.  Every reader hands such a record to :class:`BadRecords`, which follows the
stream's ``on_bad_record``:

* ``dead_letter`` (the default): the record goes to the dead-letter topic with its topic,
  partition, offset, the reason (:data:`~substreams.streams.deadletter.REASON_FOREIGN`,
  :data:`~substreams.streams.deadletter.REASON_UNKNOWN_SCHEMA`,
  :data:`~substreams.streams.deadletter.REASON_UNDECODABLE`), the decoder's message and
  the raw bytes; it is counted in ``substreams_dead_letters_total{writer, reason}``; the
  reader goes on.  One reader dead-letters a position once (a firm reader whose ranges
  overlap reads it again); a run of consecutive bad records is logged once (a WARNING at
  its first record, an INFO line with the count when it ends), not once per record.
* ``fail``: :class:`~substreams.errors.BadRecordError`, naming topic, partition, offset and
  reason.

A reader that is not transactional writes its letters at least once: a restarted reader
(or a retried Spark task) dead-letters the same record again, with the same topic,
partition and offset, so a consumer of the dead-letter topic de-duplicates on them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import Message

from substreams.config import Config
from substreams.errors import (
    BadRecordError,
    ConfigError,
    DecodeError,
    ForeignRecordError,
    UnknownSchemaError,
)
from substreams.streams.deadletter import (
    REASON_FOREIGN,
    REASON_UNDECODABLE,
    REASON_UNKNOWN_SCHEMA,
    DeadLetter,
    DeadLetterWriter,
)

log = logging.getLogger(__name__)

Position = tuple[str, int, int]
"""(topic, partition, offset)"""

REMEMBERED = 100_000
"""Positions of bad records a reader keeps (to dead-letter each once, and to count those in
a notification's ranges); the oldest are forgotten beyond it."""


def reason_of(exc: DecodeError) -> str:
    """The dead-letter reason of a decoder's error."""
    if isinstance(exc, ForeignRecordError):
        return REASON_FOREIGN
    if isinstance(exc, UnknownSchemaError):
        return REASON_UNKNOWN_SCHEMA
    return REASON_UNDECODABLE


@dataclass
class _Run:
    first: Position
    last: Position
    count: int = 1
    reasons: dict[str, int] = field(default_factory=dict)


class BadRecords:
    """One reader's handling of undecodable records (module doc).  ``reader`` names it in
    the letters (``service``), the metric (``writer``) and the log; ``writer``: a
    dead-letter writer of the reader's own (a transactional one: a stage's), else one is
    made, with its producer created on the first letter; ``write``: writes each letter in
    place of ``writer.write(letter, quiet=True)``, for a reader that keeps account of its
    letters (the punctuation aligner: it skips one a run before it wrote, and checkpoints
    past the delivered ones), and must not log each one."""

    def __init__(
        self,
        config: Config,
        reader: str,
        *,
        bootstrap: str | None = None,
        writer: DeadLetterWriter | None = None,
        write: Callable[[DeadLetter], None] | None = None,
    ) -> None:
        self.config = config
        self.reader = reader
        self.writer = writer or DeadLetterWriter(config, reader, bootstrap=bootstrap)
        self._own = writer is None
        self._write = write
        self._seen: dict[Position, str] = {}
        """Positions dead-lettered, oldest first, with their reasons."""
        self.dead_lettered = 0
        self._run: _Run | None = None

    def rule(self, topic: str) -> str:
        try:
            return self.config.stream(topic).on_bad_record
        except ConfigError:  # not a configured stream: the default
            return "dead_letter"

    def message(self, msg: Message, exc: DecodeError) -> None:
        """The record ``msg`` did not decode (``exc``): dead-letter it, or raise."""
        self.bad(msg.topic() or "", msg.partition() or 0, msg.offset() or 0,
                 msg.value() or b"", exc)

    def bad(self, topic: str, partition: int, offset: int, raw: bytes, exc: DecodeError | str,
            reason: str | None = None) -> None:
        """The record at ``topic[partition]@offset`` (bytes ``raw``) did not decode: ``exc``
        (or its message, with ``reason``, from a decoder that is not Python's)."""
        why = reason if reason is not None else (
            reason_of(exc) if isinstance(exc, DecodeError) else REASON_UNDECODABLE)
        if self.rule(topic) == "fail":
            self.good()
            raise BadRecordError(topic, partition, offset, why, str(exc))
        pos = (topic, partition, offset)
        if pos in self._seen:
            return
        self._seen[pos] = why
        if len(self._seen) > REMEMBERED:
            del self._seen[next(iter(self._seen))]
        letter = DeadLetter(self.writer.service, why, topic, partition, offset, raw, str(exc))
        if self._write is not None:
            self._write(letter)
        else:
            self.writer.write(letter, quiet=True)
        self.dead_lettered += 1
        run = self._run
        if run is None:
            log.warning(
                "%s: undecodable record at %s[%d]@%d (%s: %s): dead-lettered to '%s', reading "
                "on (a run of them is logged once)", self.reader, topic, partition, offset, why,
                exc, self.writer.topic,
            )
            self._run = _Run(pos, pos, 1, {why: 1})
        else:
            run.last = pos
            run.count += 1
            run.reasons[why] = run.reasons.get(why, 0) + 1

    def good(self) -> None:
        """A record decoded: a run of bad ones before it is over."""
        run = self._run
        if run is None:
            return
        self._run = None
        if run.count > 1:
            log.info("%s: run of %d undecodable records dead-lettered (%s), %s[%d]@%d .. "
                     "%s[%d]@%d", self.reader, run.count,
                     ", ".join(f"{r}: {n}" for r, n in sorted(run.reasons.items())),
                     *run.first, *run.last)

    def within(self, ranges: Iterable[tuple[str, int, int, int]]) -> int:
        """How many bad records this reader met inside ``ranges`` ((topic, partition,
        start, end), end exclusive): a notification's unreadable records."""
        wanted = list(ranges)
        return sum(
            1 for (t, p, o) in self._seen
            if any(t == rt and p == rp and rs <= o < end for rt, rp, rs, end in wanted)
        )

    @property
    def positions(self) -> dict[Position, str]:
        """The bad records met (oldest first), with their reasons."""
        return dict(self._seen)

    def flush(self) -> None:
        """Make the letters written so far durable (before a position past them is
        committed, or a Spark task returns)."""
        self.writer.flush()

    def close(self) -> None:
        self.good()
        if self._own:
            try:
                self.writer.flush()
            finally:
                self.writer.close()


__all__ = ["BadRecords", "reason_of"]
