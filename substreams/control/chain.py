"""The rolling digest of shortbus (the relay network): every control record hashes its predecessor.

digest(n) = SHA-256(digest(n-1) || Avro encoding of record n with its digest field empty),
with digest(-1) = 32 zero bytes; ``seq`` counts the writer's records from 0.  One chain per
(control topic, writer).  A reader that recomputes the chain proves it saw an unbroken,
untampered timeline: a dropped, reordered, duplicated or modified record breaks it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from substreams.control.framing import encode_unsigned
from substreams.control.messages import (
    ChainResume,
    ControlBody,
    ControlRecord,
    record_to_wire,
)
from substreams.errors import ProtocolError
from substreams.streams.framing import avro_string, zigzag_long
from substreams.streams.schemas import protocol_codec

GENESIS = bytes(32)

log = logging.getLogger(__name__)


def _unsigned(record: ControlRecord) -> tuple[bytes, bytes]:
    """The record's encoding with an empty digest, and its digest.  Notifications
    (``EpochComplete``/``EpochsComplete``, the acker's hot path) are framed by hand,
    byte-identical to fastavro (see :mod:`substreams.control.framing`)."""
    encoded = encode_unsigned(record)
    if encoded is None:
        encoded = protocol_codec("control").encode(record_to_wire(replace(record, digest=b"")))
    return encoded, hashlib.sha256(record.prev_digest + encoded).digest()


def compute_digest(record: ControlRecord) -> bytes:
    return _unsigned(record)[1]


def sign(record: ControlRecord) -> tuple[ControlRecord, bytes]:
    """``record`` with its digest, and its Avro encoding (what a writer produces).

    Why not ``compute_digest`` and then encode: that encodes every record twice, and the
    acker writes one or more records per terminated time.  The fields before ``digest``
    (writer, seq, prev_digest) encode to a known length, and Avro ``bytes`` is a length
    then the bytes, so the signed encoding is the unsigned one with the empty digest
    (one zero byte) replaced by the real one."""
    encoded, digest = _unsigned(record)
    at = (
        len(avro_string(record.writer))
        + len(zigzag_long(record.seq))
        + len(zigzag_long(len(record.prev_digest)))
        + len(record.prev_digest)
    )
    signed = encoded[:at] + zigzag_long(len(digest)) + digest + encoded[at + 1 :]
    return replace(record, digest=digest), signed


@dataclass
class ChainHead:
    """Where a writer's chain stands: the next seq and the last digest."""

    next_seq: int = 0
    digest: bytes = GENESIS

    def append(self, writer: str, body: ControlBody, now_ms: int) -> ControlRecord:
        """The next record of the chain; advances this head."""
        return self.append_encoded(writer, body, now_ms)[0]

    def append_encoded(
        self, writer: str, body: ControlBody, now_ms: int
    ) -> tuple[ControlRecord, bytes]:
        """:meth:`append`, with the record's Avro encoding (see :func:`sign`)."""
        rec, encoded = sign(ControlRecord(writer, self.next_seq, self.digest, b"", now_ms, body))
        self.next_seq += 1
        self.digest = rec.digest
        return rec, encoded

    def copy(self) -> ChainHead:
        return ChainHead(self.next_seq, self.digest)


@dataclass(frozen=True)
class ChainBreak:
    offset: int
    writer: str
    reason: str


class ChainVerifier:
    """Feeds records in topic order; remembers the first break per writer."""

    def __init__(self) -> None:
        self.heads: dict[str, ChainHead] = {}
        self.records = 0

    def check(self, offset: int, record: ControlRecord) -> ChainBreak | None:
        self.records += 1
        head = self.heads.setdefault(record.writer, ChainHead())
        if record.seq != head.next_seq:
            return ChainBreak(
                offset,
                record.writer,
                f"seq {record.seq} where {head.next_seq} was expected "
                f"({'a gap' if record.seq > head.next_seq else 'a replay or duplicate'})",
            )
        if record.prev_digest != head.digest:
            return ChainBreak(
                offset,
                record.writer,
                f"prev_digest {record.prev_digest.hex()[:16]}… does not match the "
                f"previous record's digest {head.digest.hex()[:16]}…",
            )
        expected = compute_digest(record)
        if record.digest != expected:
            return ChainBreak(
                offset,
                record.writer,
                f"digest {record.digest.hex()[:16]}… is not the hash of the record's "
                f"content ({expected.hex()[:16]}…): the record was modified",
            )
        head.next_seq += 1
        head.digest = record.digest
        return None


ResumeLookup = Callable[[str, int, ControlRecord], ChainResume | None]
"""Finds the operator's :class:`ChainResume` for the record at (topic, offset), if any."""


def resumes(body: ChainResume, offset: int, record: ControlRecord) -> bool:
    """Whether ``body`` accepts exactly ``record`` at ``offset`` (writer, seq and digest
    pinned: a different record at that offset is not covered by the decision)."""
    return (
        body.offset == offset
        and body.writer == record.writer
        and body.seq == record.seq
        and body.digest == record.digest
    )


class TrustingVerifier:
    """A :class:`ChainVerifier` for one topic that, when started mid-topic (not ``strict``),
    trusts each writer's chain from the first record it sees of that writer (that record's
    own digest is still checked); from offset 0 every chain must start at genesis.  A reader
    whose topic lost its head to retention (log start > 0) cannot be strict: nothing before
    the log start can be checked any more, so the chain is proven from there on.

    A break raises :class:`ProtocolError` naming the topic, offset and writer -- unless
    ``resume`` finds an operator's :class:`ChainResume` for exactly that record (``substreams
    control resume``): then the record is accepted as is, the writer's chain continues from
    it, and the decision is logged and kept in ``resumed``."""

    def __init__(self, strict: bool, resume: ResumeLookup | None = None) -> None:
        self.strict = strict
        self.verifier = ChainVerifier()
        self.resume = resume
        self.resumed: list[tuple[int, ChainResume]] = []

    def check(self, topic: str, offset: int, record: ControlRecord) -> None:
        heads = self.verifier.heads
        if not self.strict and record.writer not in heads:
            heads[record.writer] = ChainHead(record.seq, record.prev_digest)
        brk = self.verifier.check(offset, record)
        if brk is None:
            return
        decision = None if self.resume is None else self.resume(topic, offset, record)
        if decision is None:
            raise ProtocolError(
                f"control topic '{topic}' offset {brk.offset}: broken hash chain of writer "
                f"'{brk.writer}': {brk.reason}; once the record is judged acceptable, "
                f"`substreams control resume --topic {topic} --offset {brk.offset} --reason "
                "...` records that decision and readers continue past it"
            )
        heads[record.writer] = ChainHead(record.seq + 1, record.digest)
        self.resumed.append((offset, decision))
        log.warning(
            "control topic '%s' offset %d: broken hash chain of writer '%s' (%s) accepted: "
            "resumed by operator '%s' (%s)", topic, offset, record.writer, brk.reason,
            decision.operator, decision.reason,
        )
