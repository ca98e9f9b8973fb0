"""The tracking agent: local XOR aggregation of SND/RCV reports, flushed to the acks topic.

Why aggregate locally (the trAcker's point): one message per (substream, time) per flush
instead of one per record keeps service traffic at O(K·|Π|).  Why one acks partition per
source (crc32(source) % partitions): the acker must see a source's Register, reports and
seals in the order they were made; Kafka only orders within a partition.  Why "held"
reports: a writer's delivery callbacks run *inside* its transaction commit, before the
records are visible; RCVs of terminal records (and their offset ranges) are held until the
caller knows the transaction committed (:meth:`TrackingAgent.release_held`), so a
notification never names records a reader cannot see yet.

Thread-safe: delivery callbacks, the flush timer and the caller share one lock.  A flush
happens every ``flush_ms`` while reports are pending, at once after ``flush_reports``
reports, and always on a seal (seals ride on the report, applied after its entries).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message

from substreams.acker.table import SOURCE
from substreams.config import Config
from substreams.control.messages import OffsetRange
from substreams.control.traffic import ACK_REPORTS, ACK_SENT, TRAFFIC
from substreams.errors import ProtocolError, SubstreamsError
from substreams.frontier import Time, time_from_wire, time_to_wire
from substreams.kafka import client
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec

NS = "substreams."

# -- the acks-topic protocol as types ---------------------------------------------------------

# Service messages go out at once: latency matters more than batching here.
_NO_LINGER: dict[str, Any] = {"linger.ms": 0}


@dataclass(frozen=True, slots=True)
class Register:
    substreams: tuple[str, ...]
    role: str = SOURCE


@dataclass(frozen=True, slots=True)
class Unregister:
    substreams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AckEntry:
    substream: str
    time: Time
    xor: int
    records: int
    reports: int
    ranges: tuple[OffsetRange, ...]


@dataclass(frozen=True, slots=True)
class SealEntry:
    substream: str
    time: Time
    sealed_at_ms: int


@dataclass(frozen=True, slots=True)
class AckReport:
    entries: tuple[AckEntry, ...]
    seals: tuple[SealEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceHeartbeat:
    pass


AckBody = Register | Unregister | AckReport | SourceHeartbeat


@dataclass(frozen=True, slots=True)
class AckMessage:
    source: str
    seq: int
    sent_at_ms: int
    body: AckBody

    def substreams(self) -> set[str]:
        """The substreams this message concerns (for traffic accounting)."""
        b = self.body
        if isinstance(b, Register | Unregister):
            return set(b.substreams)
        if isinstance(b, AckReport):
            return {e.substream for e in b.entries} | {s.substream for s in b.seals}
        return set()


def _body_to_wire(body: AckBody) -> tuple[str, dict[str, Any]]:
    if isinstance(body, Register):
        return NS + "Register", {"substreams": list(body.substreams), "role": body.role}
    if isinstance(body, Unregister):
        return NS + "Unregister", {"substreams": list(body.substreams)}
    if isinstance(body, AckReport):
        return NS + "AckReport", {
            "entries": [
                {
                    "substream": e.substream,
                    "time": time_to_wire(e.time),
                    "xor": e.xor,
                    "records": e.records,
                    "reports": e.reports,
                    "ranges": [r.to_wire() for r in e.ranges],
                }
                for e in body.entries
            ],
            "seals": [
                {
                    "substream": s.substream,
                    "time": time_to_wire(s.time),
                    "sealed_at_ms": s.sealed_at_ms,
                }
                for s in body.seals
            ],
        }
    return NS + "SourceHeartbeat", {}


def _body_from_wire(name: str, d: Mapping[str, Any]) -> AckBody:
    short = name.removeprefix(NS)
    if short == "Register":
        return Register(tuple(d["substreams"]), str(d["role"]))
    if short == "Unregister":
        return Unregister(tuple(d["substreams"]))
    if short == "AckReport":
        return AckReport(
            tuple(
                AckEntry(
                    e["substream"],
                    time_from_wire(e["time"]),
                    int(e["xor"]),
                    int(e["records"]),
                    int(e["reports"]),
                    tuple(OffsetRange.from_wire(r) for r in e["ranges"]),
                )
                for e in d["entries"]
            ),
            tuple(
                SealEntry(s["substream"], time_from_wire(s["time"]), int(s["sealed_at_ms"]))
                for s in d.get("seals", ())
            ),
        )
    if short == "SourceHeartbeat":
        return SourceHeartbeat()
    raise ValueError(f"unknown ack body type {name!r}")


def encode_ack(msg: AckMessage) -> bytes:
    return protocol_codec("ack").encode(
        {
            "source": msg.source,
            "seq": msg.seq,
            "sent_at_ms": msg.sent_at_ms,
            "body": _body_to_wire(msg.body),
        }
    )


def ack_headers() -> list[tuple[str, bytes]]:
    return protocol_codec("ack").headers()


def decode_ack(value: bytes, headers: Iterable[tuple[str, bytes]] | None) -> AckMessage:
    """Decode one acks-topic value; :class:`ProtocolError` if it is not an AckMessage
    written with our schema (missing/wrong fingerprint, garbage)."""
    fp = dict(headers or ()).get(HEADER_FINGERPRINT)
    if fp is None:
        raise ProtocolError("ack message without a schema fingerprint header")
    try:
        d = protocol_codec("ack").decode(value, fp)
        name, body = d["body"]
        return AckMessage(
            str(d["source"]), int(d["seq"]), int(d["sent_at_ms"]), _body_from_wire(name, body)
        )
    except SubstreamsError as exc:
        raise ProtocolError(str(exc)) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"ack message is malformed: {exc}") from exc


def acks_partition(source: str, partitions: int) -> int:
    return zlib.crc32(source.encode()) % partitions


def now_ms() -> int:
    return int(time.time() * 1000)


# -- the agent --------------------------------------------------------------------------------


class _Agg:
    """Aggregated reports of one (substream, time) since the last flush."""

    __slots__ = ("ranges", "records", "reports", "xor")

    def __init__(self) -> None:
        self.xor = 0
        self.records = 0
        self.reports = 0
        self.ranges: dict[tuple[str, int], list[int]] = {}

    def merge(self, other: _Agg) -> None:
        self.xor ^= other.xor
        self.records += other.records
        self.reports += other.reports
        for key, (lo, hi) in other.ranges.items():
            self.add_offsets(key, lo, hi)

    def add_offsets(self, key: tuple[str, int], lo: int, hi: int) -> None:
        hull = self.ranges.get(key)
        if hull is None:
            self.ranges[key] = [lo, hi]
        else:
            if lo < hull[0]:
                hull[0] = lo
            if hi > hull[1]:
                hull[1] = hi


class TrackingAgent:
    """Aggregates one process's reports and sends them as ``source`` to the acks topic."""

    def __init__(self, config: Config, source: str, *, bootstrap: str | None = None) -> None:
        self.config = config
        self.source = source
        self.topic = config.acker.acks_topic
        self.partition = acks_partition(source, config.acker.acks_partitions)
        self.flush_s = config.acker.flush_ms / 1000.0
        self.flush_reports = config.acker.flush_reports
        self._producer = client.producer(
            client.resolve_bootstrap(config, bootstrap), config, **_NO_LINGER
        )
        self._headers = ack_headers()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._table: dict[tuple[str, Time], _Agg] = {}
        self._held: dict[tuple[str, Time], _Agg] = {}
        self._seals: list[SealEntry] = []
        self._seals_on_release: list[SealEntry] = []
        self._reports = 0
        self._first_pending = 0.0
        self._seq = 0
        self._error: str | None = None
        self._stopped = False
        self._timer = threading.Thread(
            target=self._run_timer, name=f"ack-agent-{source}", daemon=True
        )
        self._timer.start()

    # -- reporting -----------------------------------------------------------------------

    def _agg(self, table: dict[tuple[str, Time], _Agg], substream: str, t: Time) -> _Agg:
        key = (substream, t)
        agg = table.get(key)
        if agg is None:
            agg = table[key] = _Agg()
        return agg

    def _touched(self, n: int) -> None:
        """Caller holds the lock: ``n`` more reports are pending."""
        if self._reports == 0 and not self._seals:
            self._first_pending = time.monotonic()
            self._cond.notify()
        self._reports += n
        if self._reports >= self.flush_reports:
            self._flush_locked()

    def report(self, substream: str, t: Time, tracking_id: int) -> None:
        """One SND or RCV of the record ``tracking_id`` at time ``t``."""
        with self._lock:
            agg = self._agg(self._table, substream, t)
            agg.xor ^= tracking_id
            agg.reports += 1
            self._touched(1)

    def report_many(self, items: Iterable[tuple[str, Time, int]], held: bool = False) -> None:
        """Several reports that must travel together (a stage's RCV(input) XOR
        SND(outputs): flushed in one message, so the XOR cannot reach zero early).  ``held``:
        keep them with the held reports until :meth:`release_held` (a transactional writer's
        records are invisible until its commit)."""
        with self._lock:
            table = self._held if held else self._table
            n = 0
            for substream, t, tracking_id in items:
                agg = self._agg(table, substream, t)
                agg.xor ^= tracking_id
                agg.reports += 1
                n += 1
            if n and not held:
                self._touched(n)

    def delivered(
        self, substream: str, t: Time, tracking_id: int, stream: str, partition: int, offset: int
    ) -> None:
        """RCV of a record delivered to a terminal stream, with its offset; held until
        :meth:`release_held` (the writer's transaction committed)."""
        self._hold_delivery(substream, t, tracking_id, 1, stream, partition, offset)

    def sent_and_delivered(
        self, substream: str, t: Time, stream: str, partition: int, offset: int
    ) -> None:
        """SND and RCV at once of a record its writer delivered to a terminal stream: the
        two reports of one id cancel in the XOR, so only the counts and the offset are
        kept (a publisher's hot path: no id to carry, one lock per record).  Held until
        :meth:`release_held`, like :meth:`delivered`."""
        self._hold_delivery(substream, t, 0, 2, stream, partition, offset)

    def _hold_delivery(
        self,
        substream: str,
        t: Time,
        xor: int,
        reports: int,
        stream: str,
        partition: int,
        offset: int,
    ) -> None:
        """One delivered record: its share of the XOR and of the reports, its offset."""
        with self._lock:
            agg = self._agg(self._held, substream, t)
            agg.xor ^= xor
            agg.reports += reports
            agg.records += 1
            agg.add_offsets((stream, partition), offset, offset + 1)

    def release_held(self) -> None:
        """The writer's transaction committed: held reports may go out, and the seals made
        before the commit go out with them at once, in one message."""
        with self._lock:
            n = 0
            for key, held in self._held.items():
                agg = self._table.get(key)
                if agg is None:
                    self._table[key] = held
                else:
                    agg.merge(held)
                n += held.reports
            self._held = {}
            if self._seals_on_release:
                self._seals.extend(self._seals_on_release)
                self._seals_on_release = []
                self._flush_locked()
            elif n:
                self._touched(n)

    def discard_held(self) -> None:
        """The writer's transaction was aborted: its held reports and seals never happened."""
        with self._lock:
            self._held = {}
            self._seals_on_release = []

    def seal_on_release(self, substream: str, t: Time) -> None:
        """Seal ``t`` with the next :meth:`release_held` (the commit of the records written
        before the seal)."""
        with self._lock:
            self._seals_on_release.append(SealEntry(substream, t, now_ms()))

    def seal(self, substream: str, t: Time) -> None:
        """No more records at times <= ``t`` from this source: released held reports and
        the seal go out at once, in one message."""
        with self._lock:
            for key, held in self._held.items():
                self._agg(self._table, *key).merge(held)
            self._held = {}
            self._seals.append(SealEntry(substream, t, now_ms()))
            self._flush_locked()

    # -- membership ----------------------------------------------------------------------

    def register(
        self, substreams: Iterable[str], role: str = SOURCE, timeout: float = 10.0
    ) -> None:
        """Join and wait until the Register is in the acks topic: a source counts from the
        moment the acker reads it, so a registration still in flight could let another
        source's seal terminate a time this one is about to write."""
        with self._lock:
            self._send_locked(Register(tuple(substreams), role))
        if self._producer.flush(timeout) or self._error is not None:
            raise SubstreamsError(
                f"tracking agent '{self.source}': could not register with the acker on "
                f"'{self.topic}' within {timeout} s{': ' + self._error if self._error else ''}"
            )

    def unregister(self, substreams: Iterable[str]) -> None:
        with self._lock:
            self._flush_locked()
            self._send_locked(Unregister(tuple(substreams)))

    # -- sending -------------------------------------------------------------------------

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None and self._error is None:
            self._error = str(err)

    def _send_locked(self, body: AckBody) -> None:
        if self._error is not None:
            raise SubstreamsError(
                f"tracking agent '{self.source}': acks topic '{self.topic}': {self._error}"
            )
        msg = AckMessage(self.source, self._seq, now_ms(), body)
        self._seq += 1
        value = encode_ack(msg)
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value=value,
                    partition=self.partition,
                    headers=self._headers,
                    on_delivery=self._on_delivery,
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)
        for sub in msg.substreams():
            TRAFFIC.add(ACK_SENT, sub)

    def _flush_locked(self) -> None:
        if not self._table and not self._seals:
            return
        entries = []
        for (sub, t), agg in self._table.items():
            entries.append(
                AckEntry(
                    sub,
                    t,
                    agg.xor,
                    agg.records,
                    agg.reports,
                    tuple(OffsetRange(s, p, lo, hi) for (s, p), (lo, hi) in agg.ranges.items()),
                )
            )
            TRAFFIC.add(ACK_REPORTS, sub, agg.reports)
        seals = tuple(self._seals)
        self._table = {}
        self._seals = []
        self._reports = 0
        self._send_locked(AckReport(tuple(entries), seals))

    def flush(self) -> None:
        """Send everything pending (not held) now."""
        with self._lock:
            self._flush_locked()

    def _run_timer(self) -> None:
        with self._cond:
            while not self._stopped:
                if not self._table and not self._seals:
                    self._cond.wait()
                    continue
                remaining = self._first_pending + self.flush_s - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                try:
                    self._flush_locked()
                except SubstreamsError:
                    self._table = {}
                    self._seals = []
                    self._reports = 0

    def close(self, timeout: float = 10.0) -> None:
        """Flush and wait until the acks topic has everything."""
        with self._cond:
            self._flush_locked()
            self._stopped = True
            self._cond.notify_all()
        self._timer.join(1.0)
        left = self._producer.flush(timeout)
        if left or self._error is not None:
            raise SubstreamsError(
                f"tracking agent '{self.source}': {left} ack messages not delivered to "
                f"'{self.topic}'{': ' + self._error if self._error else ''}"
            )
