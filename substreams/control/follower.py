"""Following control topics, in one place: decode, verify the hash chain, keep the position,
and one rule for a record that cannot be used.

Why one follower: the subscriber, the Spark driver's scanner, the dashboard and the command
handler each had a decode/verify/position loop of their own, and each its own rule for a bad
record -- one raised, others passed it over without a word (even on a ``KeyError`` from a
malformed record).  A record a reader cannot use is either a stop (:data:`RAISE`: a
:class:`~substreams.errors.ProtocolError` naming topic, partition and offset) or, for a
service that must keep serving, a logged and counted skip (:data:`LOG`:
``substreams_control_bad_records_total``); never a silent one.  The caller chooses, by name.

A record by a writer the config does not trust on its topic
(:class:`~substreams.control.writers.WriterCheck`) is refused whatever the rule: logged,
counted (kind ``foreign_writer``) and passed over, never obeyed -- a stop would let anyone who
can write the topic halt every reader.  It does not enter any chain either.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import Message, TopicPartition

from substreams import metrics
from substreams.config import Config
from substreams.control.chain import ChainHead, TrustingVerifier
from substreams.control.io import ResumeLookup, decode_control
from substreams.control.messages import ControlRecord
from substreams.control.writers import FOREIGN_WRITER, WriterCheck
from substreams.errors import ProtocolError
from substreams.kafka.read import Reader

__all__ = ["LOG", "RAISE", "BadRecordRule", "ControlFollower", "Followed"]

log = logging.getLogger(__name__)

BadRecordRule = Literal["raise", "log"]
RAISE: BadRecordRule = "raise"
"""An unusable record stops the reader (a query, a subscriber: a forged timeline must not
be fed on)."""
LOG: BadRecordRule = "log"
"""An unusable record is logged (topic, partition, offset, reason), counted and passed over:
a dashboard or a command handler keeps serving everything else."""

UNDECODABLE = "undecodable"
BROKEN_CHAIN = "broken_chain"


@dataclass(frozen=True)
class Followed:
    """A decoded, verified control record and where it was read."""

    topic: str
    partition: int
    offset: int
    record: ControlRecord


class ControlFollower:
    """Follows partition 0 of control topics from offsets the caller chooses.

    ``on_bad`` is the rule for a record that is not a control record or breaks its writer's
    chain (see the module).  ``verify=False`` reads without the chain check (a reader of
    records it does not act on for correctness, e.g. checkpoint topics read from their tail).
    Chains are per topic; a topic followed ``strict`` must start at genesis (read from offset
    0 with no retention), otherwise each writer's chain is anchored at the first record seen
    of it (:class:`~substreams.control.chain.TrustingVerifier`).  ``positions[topic]`` is the
    offset after the last record handled, a skipped one included."""

    def __init__(
        self,
        bootstrap: str,
        config: Config | None = None,
        *,
        name: str,
        on_bad: BadRecordRule,
        verify: bool = True,
        resume: ResumeLookup | None = None,
        writers: WriterCheck | None = None,
    ) -> None:
        """``writers``: whom to obey (default: the trusted writers of ``config``; none
        checked without a config)."""
        if on_bad not in (RAISE, LOG):
            raise ValueError(f"on_bad must be {RAISE!r} or {LOG!r}, not {on_bad!r}")
        self.name = name
        self.on_bad: BadRecordRule = on_bad
        self.verify = verify
        self.resume = resume
        self.reader = Reader(bootstrap, config, name=name)
        self.verifiers: dict[str, TrustingVerifier] = {}
        self.positions: dict[str, int] = {}
        self.writers = writers or (WriterCheck.of(config) if config is not None else None)
        self.bad = 0
        """Records passed over under :data:`LOG`."""
        self.foreign = 0
        """Records refused for their writer (:meth:`admits`)."""
        self._reanchor: set[tuple[str, str]] = set()
        """(topic, writer) whose chain broke under :data:`LOG`."""

    def assign(self, starts: Mapping[str, int], strict: Iterable[str] = ()) -> None:
        """Read each topic of ``starts`` from its offset (replaces any earlier assignment;
        the chains of topics already followed are kept)."""
        strict = set(strict)
        for topic, offset in starts.items():
            self.positions[topic] = offset
            if topic not in self.verifiers or topic in strict:
                self.verifiers[topic] = TrustingVerifier(topic in strict, self.resume)
        self.reader.assign([TopicPartition(t, 0, o) for t, o in starts.items()])

    def anchor(self, topic: str, offset: int, record: ControlRecord) -> bool:
        """Check ``record`` (read elsewhere, e.g. the snapshot a reader starts after) as the
        topic's record at ``offset`` of partition 0: the chain continues from it.  False:
        :data:`LOG` passed it over (the caller must not use it either)."""
        return self._check(topic, 0, offset, record)

    def _verifier(self, topic: str) -> TrustingVerifier:
        found = self.verifiers.get(topic)
        if found is None:
            found = self.verifiers[topic] = TrustingVerifier(False, self.resume)
        return found

    def poll(self, timeout: float = 0.1, max_records: int = 500) -> list[Followed]:
        """The usable records that arrived within ``timeout`` (see :meth:`Reader.poll`)."""
        return self.take(self.reader.poll(timeout, max_records))

    def poll_batch(self, timeout: float = 0.1, max_records: int = 500) -> list[Followed]:
        """What is buffered, else the first record within ``timeout``
        (:meth:`Reader.poll_batch`)."""
        return self.take(self.reader.poll_batch(timeout, max_records))

    def take(self, msgs: Iterable[Message]) -> list[Followed]:
        """Decode and verify ``msgs`` (read by :attr:`reader`), in order."""
        out: list[Followed] = []
        for msg in msgs:
            followed = self.take_one(msg)
            if followed is not None:
                out.append(followed)
        return out

    def take_one(self, msg: Message) -> Followed | None:
        """``msg`` decoded and verified, or None when :data:`LOG` passed it over."""
        topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        self.positions[topic] = offset + 1
        try:
            rec = decode_control(msg)
        except ProtocolError as exc:
            self._bad(topic, partition, offset, UNDECODABLE, str(exc), exc)
            return None
        if not self._check(topic, partition, offset, rec):
            return None
        return Followed(topic, partition, offset, rec)

    def admits(self, topic: str, partition: int, offset: int, rec: ControlRecord) -> bool:
        """Whether ``rec``'s writer may write ``topic``; a refusal is logged and counted."""
        if self.writers is None or self.writers.admits(topic, rec):
            return True
        self.foreign += 1
        metrics.CONTROL_BAD_RECORDS.labels(self.name, topic, FOREIGN_WRITER).inc()
        log.warning(
            "%s: control topic '%s' offset %d (partition %d): record of writer '%s' (%s) "
            "refused: only %s may write this topic", self.name, topic, offset, partition,
            rec.writer, type(rec.body).__name__, self.writers.trusted(topic),
        )
        return False

    def _check(self, topic: str, partition: int, offset: int, rec: ControlRecord) -> bool:
        if not self.admits(topic, partition, offset, rec):
            return False
        if not self.verify:
            return True
        verifier = self._verifier(topic)
        if (topic, rec.writer) in self._reanchor:
            # The writer's chain is anchored again at its first record after a break (whose
            # own digest is still checked): a break is reported once, not at every later
            # record.  An undecodable record of the writer shows too, as the gap it leaves.
            self._reanchor.discard((topic, rec.writer))
            verifier.verifier.heads[rec.writer] = ChainHead(rec.seq, rec.prev_digest)
        try:
            verifier.check(topic, offset, rec)
        except ProtocolError as exc:
            if self.on_bad == RAISE:
                raise
            self._reanchor.add((topic, rec.writer))
            self._bad(topic, partition, offset, BROKEN_CHAIN, str(exc), exc)
            return False
        return True

    def _bad(
        self, topic: str, partition: int, offset: int, kind: str, reason: str,
        exc: ProtocolError,
    ) -> None:
        # The readers' usual prefix (a chain break's too), then the partition.
        where = f"control topic '{topic}' offset {offset} (partition {partition})"
        if self.on_bad == RAISE:
            raise ProtocolError(f"{where}: {kind.replace('_', ' ')} record: {reason}") from exc
        self.bad += 1
        metrics.CONTROL_BAD_RECORDS.labels(self.name, topic, kind).inc()
        log.warning("%s: %s: %s record passed over: %s", self.name, where,
                    kind.replace("_", " "), reason)
        return None

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> ControlFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
