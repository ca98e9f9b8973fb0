"""Reading and writing control topics.

Why one transactional producer per writer: the acker puts notifications and the checkpoint
that explains them into one transaction (exactly-once across restarts), and a zombie writer
with the same name is fenced by Kafka.  Why chain heads are recovered by reading the topic:
the control topic *is* the writer's durable state; nothing else is trusted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import KafkaException, Message, TopicPartition

from substreams.config import Config
from substreams.control.chain import ChainHead, resumes
from substreams.control.messages import ChainResume, ControlBody, ControlRecord, record_from_wire
from substreams.errors import ProtocolError, PublisherFencedError, SubstreamsError
from substreams.kafka import client, write
from substreams.kafka.read import Reader
from substreams.kafka.write import fenced_as, produce
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec


def now_ms() -> int:
    return int(time.time() * 1000)


def decode_control(msg: Message) -> ControlRecord:
    """The control record in ``msg``; :class:`ProtocolError` (and nothing else) for any bytes
    that are not one."""
    headers = dict(msg.headers() or ())
    codec = protocol_codec("control")
    try:
        return record_from_wire(codec.decode(msg.value() or b"", headers.get(HEADER_FINGERPRINT)))
    except ProtocolError:
        raise
    except (SubstreamsError, ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"control record is malformed: {exc}") from exc


def read_control(
    bootstrap: str, topic: str, config: Config | None = None, timeout: float = 10.0,
    start: int = 0,
) -> list[tuple[int, ControlRecord]]:
    """All records of a control topic, from offset ``start`` (an undecodable one is a
    ProtocolError naming its offset: a start-up that replays the topic must not pass over a
    record)."""
    out: list[tuple[int, ControlRecord]] = []
    with Reader(bootstrap, config, [TopicPartition(topic, 0, start)],
                name=f"control topic '{topic}'") as reader:
        for msg in reader.iter_to_end(timeout):
            try:
                out.append((msg.offset(), decode_control(msg)))
            except ProtocolError as exc:
                where = f"control topic '{topic}' offset {msg.offset()}"
                raise ProtocolError(f"{where}: {exc}") from exc
    return out


def _scan_last(
    reader: Reader,
    topic: str,
    start: int,
    end: int | None,
    match: Callable[[ControlRecord], bool],
    timeout: float,
) -> tuple[int, ControlRecord] | None:
    r"""The last record in [start, end) of ``topic`` that ``match``\ es (end None: up to the
    end of the partition).  Undecodable records are passed over: they are judged (and
    reported) by the chain check of whoever reads them for real."""
    reader.assign([TopicPartition(topic, 0, start)])
    found: tuple[int, ControlRecord] | None = None
    for msg in reader.iter_to_end(timeout):
        if end is not None and msg.offset() >= end:
            return found
        try:
            rec = decode_control(msg)
        except ProtocolError:
            continue
        if match(rec):
            found = (msg.offset(), rec)
        if end is not None and msg.offset() >= end - 1:
            return found
    return found


def find_last(
    bootstrap: str,
    topic: str,
    match: Callable[[ControlRecord], bool],
    config: Config | None = None,
    *,
    timeout: float = 30.0,
    window: int = 256,
) -> tuple[int, ControlRecord] | None:
    r"""The last record of ``topic`` that ``match``\ es, and its offset, or None.

    Why backwards: what start-up needs (a chain head, the latest checkpoint or snapshot) is
    near the end, and a control topic only grows; reading it from offset 0 makes every start
    slower than the last.  Windows grow fourfold from the high watermark, each read forwards
    to where the previous began, down to the log start (past 0 once retention deleted the
    oldest segments).  Offsets count transaction markers too, so a window may hold fewer
    records than its size; it never misses one."""
    with Reader(bootstrap, config, name=f"control topic '{topic}'") as reader:
        low, high = reader.watermarks(topic, 0)
        low = max(0, low)
        end: int | None = None
        start = max(low, high - window)
        while True:
            found = _scan_last(reader, topic, start, end, match, timeout)
            if found is not None or start <= low:
                return found
            end, window = start, window * 4
            start = max(low, start - window)


def find_resume(
    bootstrap: str, topic: str, offset: int, record: ControlRecord, config: Config | None = None
) -> tuple[int, ChainResume] | None:
    """The operator's :class:`ChainResume` that accepts ``record`` at ``offset`` of ``topic``
    and its own offset: it can only have been written after the break, so it is looked for
    from ``offset + 1`` to the end (read only when a chain breaks)."""
    with Reader(bootstrap, config, [TopicPartition(topic, 0, offset + 1)],
                name=f"control topic '{topic}'") as reader:
        for msg in reader.iter_to_end(30.0):
            with contextlib.suppress(ProtocolError):  # judged by whoever reads it for real
                body = decode_control(msg).body
                if isinstance(body, ChainResume) and resumes(body, offset, record):
                    return msg.offset(), body
    return None


class ResumeLookup:
    """:data:`~substreams.control.chain.ResumeLookup` on a broker.  Picklable (Spark ships
    readers): the config itself travels with it (a Config pickles), never its path."""

    def __init__(self, bootstrap: str, config: Config | None = None) -> None:
        self.bootstrap = bootstrap
        self.config = config

    def __call__(self, topic: str, offset: int, record: ControlRecord) -> ChainResume | None:
        found = find_resume(self.bootstrap, topic, offset, record, self.config)
        return None if found is None else found[1]


class ControlWriter:
    """The single writer ``writer`` of one or more control topics, transactionally."""

    def __init__(
        self,
        bootstrap: str,
        writer: str,
        topics: Iterable[str],
        config: Config | None = None,
        transactional_id: str | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.writer = writer
        self.config = config
        self.topics = list(topics)
        self.heads: dict[str, ChainHead] = {t: ChainHead() for t in self.topics}
        self.codec = protocol_codec("control")
        self.last_sizes: list[int] = []
        """The encoded sizes of the last :meth:`write`'s records (the benchmarks' record
        bound)."""
        self.last_timing: tuple[float, float, float] = (0.0, 0.0, 0.0)
        """The last :meth:`write`'s phases, in seconds: begin_transaction, encoding and
        producing its records, the commit (flush, EndTxn round trip); for the acker's phase
        log (``SUBSTREAMS_ACKER_PHASES``)."""
        self._producer = client.producer(
            bootstrap,
            config,
            transactional_id=transactional_id or f"substreams.control.{writer}",
            **{"linger.ms": 0},
        )
        with self._fencing():
            self._producer.init_transactions(30)

    def _fencing(self) -> contextlib.AbstractContextManager[None]:
        return fenced_as(
            lambda: PublisherFencedError(
                f"control writer '{self.writer}' was fenced: another instance took over"
            )
        )

    def recover(self) -> dict[str, list[tuple[int, ControlRecord]]]:
        """Read every topic from offset 0 to its end and continue each chain where this
        writer left it.  Returns the records read, by topic (for a caller that rebuilds its
        state from all of them; one that needs only the heads uses :meth:`recover_heads`)."""
        seen: dict[str, list[tuple[int, ControlRecord]]] = {}
        for topic in self.topics:
            records = read_control(self.bootstrap, topic, self.config)
            seen[topic] = records
            head = ChainHead()
            for _, rec in records:
                if rec.writer == self.writer:
                    head = ChainHead(rec.seq + 1, rec.digest)
            self.heads[topic] = head
        return seen

    def recover_heads(self) -> dict[str, tuple[int, ControlRecord] | None]:
        """Continue each chain from this writer's last record, found by reading each topic
        backwards from its end (:func:`find_last`): a start-up that costs the same after a
        year as after a minute.  Returns that record and its offset per topic (None: the
        writer never wrote there, its chain starts at genesis)."""
        found: dict[str, tuple[int, ControlRecord] | None] = {}
        for topic in self.topics:
            last = find_last(
                self.bootstrap, topic, lambda rec: rec.writer == self.writer, self.config
            )
            found[topic] = last
            self.heads[topic] = (
                ChainHead() if last is None else ChainHead(last[1].seq + 1, last[1].digest)
            )
        return found

    def write(self, items: Sequence[tuple[str, ControlBody]]) -> list[ControlRecord]:
        """Append ``items`` (topic, body) in one transaction; all or nothing."""
        if not items:
            return []
        heads = {t: h.copy() for t, h in self.heads.items()}
        stamp = now_ms()
        out: list[ControlRecord] = []
        t0 = time.perf_counter()
        with self._fencing():
            self._producer.begin_transaction()
        t1 = time.perf_counter()
        try:
            # Encoded (and signed) before the first produce: librdkafka registers the
            # transaction's partitions (AddPartitionsToTxn) from a timer started by the
            # first produce, one request at a time; produces spread over a long encoding (a
            # backlog's hundreds of records, the checkpoint last) would register the last
            # partition in a second round trip before the commit can flush.
            values: list[tuple[str, bytes]] = []
            for topic, body in items:
                rec, value = heads[topic].append_encoded(self.writer, body, stamp)
                out.append(rec)
                values.append((topic, value))
            self.last_sizes = [len(v) for _, v in values]
            headers = self.codec.headers()
            for topic, value in values:
                produce(self._producer, topic, value, partition=0, headers=headers)
            t2 = time.perf_counter()
            with self._fencing():
                client.commit_transaction(
                    self._producer,
                    f"control writer '{self.writer}'",
                    call_timeout=client.commit_timeout(self.config),
                )
        except BaseException:
            with contextlib.suppress(KafkaException):
                self._producer.abort_transaction(10)
            raise
        self.last_timing = (t1 - t0, t2 - t1, time.perf_counter() - t2)
        self.heads = heads
        return out

    def close(self) -> None:
        """Deliver what is queued; a fence found doing so is this writer's fenced error (the
        acker's recovery learns of a takeover there)."""
        with self._fencing():
            write.flush(self._producer, 10)
