"""Listeners: scan a stream from an index or an order key, behind or caught up (Sherlock's).

Why partition EOF and not high watermarks decides "caught up": publishers write in
transactions, and a ``read_committed`` reader stops at the last stable offset, below the high
watermark while a transaction is open; end-of-partition is reported exactly there.  A listener
is *caught up* once every partition it reads has reported end-of-partition since its last
record, and *behind* otherwise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaException, Message, TopicPartition

from substreams.config import Config
from substreams.errors import DecodeError, ProtocolError, SchemaMismatchError, SubstreamsError
from substreams.kafka import client
from substreams.kafka.clock import Deadline
from substreams.kafka.read import Reader
from substreams.streams.badrecords import BadRecords
from substreams.streams.records import Entry, times_from_wire
from substreams.streams.schemas import Codec, envelope_schema, is_punctuation, protocol_codec

log = logging.getLogger(__name__)

ListenerState = Literal["behind", "caught_up"]


@dataclass(frozen=True, slots=True)
class PunctuationEntry:
    """An in-band punctuation read from a data partition."""

    stream: str
    partition: int
    index: int
    fields: Mapping[str, Any]


class StreamDecoder:
    """Turns data-topic messages of one stream into entries (or punctuations)."""

    def __init__(self, config: Config, stream: str, bootstrap: str | None = None) -> None:
        self.stream = stream
        sc = config.stream(stream)
        self.codec = Codec(
            envelope_schema(sc.schema),
            label=f"stream '{stream}'",
            writers=lambda fp: _registered_writer(config, stream, fp, bootstrap),
        )
        self.punct = protocol_codec("punctuation")

    def decode(self, msg: Message) -> Entry | PunctuationEntry:
        """The entry in ``msg`` (single-object encoded: a punctuation is one whose writer
        fingerprint is the punctuation schema's).  For any bytes that are not one:
        :class:`SchemaMismatchError` for a data record (a missing prefix or an unknown
        fingerprint included), :class:`ProtocolError` for a punctuation (both
        ``DecodeError``)."""
        value = msg.value() or b""
        if is_punctuation(value):
            try:
                fields = self.punct.decode_single(value)
            except SubstreamsError as exc:
                raise ProtocolError(f"stream '{self.stream}': punctuation: {exc}") from exc
            return PunctuationEntry(self.stream, msg.partition(), msg.offset(), fields)
        rec = self.codec.decode_single(value)
        try:
            times = times_from_wire(rec["times"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SchemaMismatchError(f"stream '{self.stream}': malformed times: {exc}") from exc
        return Entry(
            stream=self.stream,
            partition=msg.partition(),
            index=msg.offset(),
            order_key=rec["order_key"],
            tracking_id=rec["tracking_id"],
            source=rec["source"],
            times=times,
            payload=rec["payload"],
        )


def _registered_writer(
    config: Config, stream: str, fingerprint_hex: bytes, bootstrap: str | None
) -> dict[str, Any] | None:
    """An earlier writer schema of ``stream`` from the schema topic (asked only for a
    fingerprint that is not the reader's own), as a full envelope schema."""
    from substreams.streams.evolution import registry

    try:
        found = registry(config, bootstrap).writer(
            stream, fingerprint_hex.decode(errors="replace")
        )
    except (KafkaException, SubstreamsError) as exc:
        # Unknown stays unknown: the record is refused as undecodable (dead-lettered with the
        # reason), never an exception of another kind out of a decoder.
        log.warning("stream '%s': schema registry not readable (%s)", stream, exc)
        return None
    return None if found is None else envelope_schema(found)


class Listener:
    """Reads one stream in index order per partition.

    Start: ``from_index`` (one offset for all partitions, or a mapping partition -> offset)
    or ``from_order_key`` (the first entry whose order key is >= it, found per partition by
    binary search; exact when order keys are non-decreasing within a partition, i.e. one
    publisher per partition or publishers advancing together; entries below the key that a
    search skips over are filtered out as well).  End: after ``max_entries`` entries, or once
    every partition has passed ``until_order_key`` (entries with a larger order key are not
    yielded), or never.  A record it cannot decode follows its stream's ``on_bad_record``
    (:class:`~substreams.streams.badrecords.BadRecords`, named ``reader``): dead-lettered
    and passed over (:attr:`dead_lettered` counts them), or a
    :class:`~substreams.errors.BadRecordError`.
    """

    def __init__(
        self,
        config: Config,
        stream: str,
        *,
        from_index: int | Mapping[int, int] | None = None,
        from_order_key: int | None = None,
        partitions: Sequence[int] | None = None,
        max_entries: int | None = None,
        until_order_key: int | None = None,
        include_punctuations: bool = False,
        bootstrap: str | None = None,
        reader: str = "listener",
    ) -> None:
        if from_index is not None and from_order_key is not None:
            raise SubstreamsError("give from_index or from_order_key, not both")
        self.config = config
        self.stream = stream
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.decoder = StreamDecoder(config, stream, self.bootstrap)
        self.partitions = list(partitions or range(config.stream(stream).partitions))
        self.max_entries = max_entries
        self.until_order_key = until_order_key
        self.min_order_key = from_order_key
        self.include_punctuations = include_punctuations
        self.count = 0
        self.bad = BadRecords(config, f"{reader}:{stream}", bootstrap=self.bootstrap)
        self._reader = Reader(self.bootstrap, config, name=f"stream '{stream}'")
        if from_order_key is not None:
            starts = {p: self._search(p, from_order_key) for p in self.partitions}
        elif isinstance(from_index, Mapping):
            starts = {p: int(from_index.get(p, 0)) for p in self.partitions}
        else:
            starts = {p: int(from_index or 0) for p in self.partitions}
        self._done: set[int] = set()
        self._reader.assign([TopicPartition(stream, p, o) for p, o in starts.items()])

    @property
    def positions(self) -> dict[int, int]:
        """Next offset per partition."""
        return self._reader.offsets(self.stream)

    # -- order-key search ----------------------------------------------------------------

    def _probe(self, probe: Reader, partition: int, offset: int) -> tuple[int, int] | None:
        """(offset, order key) of the first data entry at or after ``offset``, or None."""
        probe.assign([TopicPartition(self.stream, partition, offset)])
        for msg in probe.iter_to_end(10.0):
            try:
                entry = self.decoder.decode(msg)
            except DecodeError:  # the read itself dead-letters it (or fails) when it gets there
                continue
            if isinstance(entry, Entry):
                return entry.index, entry.order_key
        return None

    def _search(self, partition: int, key: int) -> int:
        with Reader(self.bootstrap, self.config, name=f"stream '{self.stream}'") as probe:
            low, high = probe.watermarks(self.stream, partition)
            lo, hi = low, high  # invariant: every entry before lo has order key < key
            while lo < hi:
                mid = (lo + hi) // 2
                found = self._probe(probe, partition, mid)
                if found is None or found[1] >= key:
                    hi = mid
                else:
                    lo = found[0] + 1
            return int(lo)

    # -- reading -------------------------------------------------------------------------

    @property
    def dead_lettered(self) -> int:
        """Records this listener could not decode and dead-lettered."""
        return self.bad.dead_lettered

    @property
    def state(self) -> ListenerState:
        ended = self._reader.ended(self.stream)
        return "caught_up" if ended >= set(self.partitions) - self._done else "behind"

    @property
    def finished(self) -> bool:
        if self.max_entries is not None and self.count >= self.max_entries:
            return True
        return bool(self.partitions) and self._done >= set(self.partitions)

    def poll(self, timeout: float = 1.0) -> Entry | PunctuationEntry | None:
        """The next entry, or None after ``timeout`` seconds without one.  The deadline is
        checked after each fetch, not before: ``poll(0)`` returns an entry that is already
        buffered, as confluent-kafka's ``poll(0)`` does."""
        deadline = Deadline(timeout)
        while not self.finished:
            for msg in self._reader.poll(deadline.left(cap=0.5), 1):
                entry = self._accept(msg)
                if entry is not None:
                    return entry
            if deadline.passed:
                return None
        return None

    def _accept(self, msg: Message) -> Entry | PunctuationEntry | None:
        """The entry of ``msg`` if this listener yields it (None: skipped, counted as read;
        an undecodable record dead-lettered or, under ``on_bad_record: fail``, raised)."""
        try:
            entry = self.decoder.decode(msg)
        except DecodeError as exc:
            self.bad.message(msg, exc)
            return None
        self.bad.good()
        if isinstance(entry, PunctuationEntry):
            return entry if self.include_punctuations else None
        if self.min_order_key is not None and entry.order_key < self.min_order_key:
            return None
        if self.until_order_key is not None and entry.order_key > self.until_order_key:
            self._done.add(entry.partition)
            self._reader.consumer.pause([TopicPartition(self.stream, entry.partition)])
            return None
        self.count += 1
        return entry

    def __iter__(self) -> Iterator[Entry | PunctuationEntry]:
        while not self.finished:
            entry = self.poll(1.0)
            if entry is not None:
                yield entry

    def entries(self, idle_timeout: float | None = None) -> Iterator[Entry | PunctuationEntry]:
        """Iterate; with ``idle_timeout`` stop once caught up and idle that long."""
        idle_since: float | None = None
        while not self.finished:
            entry = self.poll(0.2)
            if entry is not None:
                idle_since = None
                yield entry
            elif idle_timeout is not None and self.state == "caught_up":
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= idle_timeout:
                    return

    def close(self) -> None:
        try:
            self.bad.close()  # its letters delivered
        finally:
            self._reader.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
