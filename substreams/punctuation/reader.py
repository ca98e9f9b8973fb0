"""A consumer task of a punctuation substream: data partitions in, aligned events out.

Why ``assign()`` and no consumer group: alignment needs to know exactly which partitions a
task reads -- a task knows only what its own partitions told it -- and a rebalance would move
partitions (and their half-aligned punctuations) between tasks behind its back.
Several tasks may split the partitions between them; each aligns on its subset (the cost of
punctuations grows with every task, which the ``PUNCTUATION_READ`` counter makes visible).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from substreams.config import Config
from substreams.control.traffic import PUNCTUATION_READ, TRAFFIC
from substreams.errors import DecodeError, SubstreamsError
from substreams.kafka import client
from substreams.kafka.clock import until_idle
from substreams.kafka.read import Reader
from substreams.punctuation.aligner import Aligner, Bound, Event, Punctuation
from substreams.streams.badrecords import BadRecords
from substreams.streams.listener import PunctuationEntry, StreamDecoder
from substreams.streams.records import Entry

log = logging.getLogger(__name__)


class PunctuatedReader:
    """Reads the data topic of ``substream`` (all partitions or ``partitions``) and yields
    :mod:`~substreams.punctuation.aligner` events under the substream's bound and order.

    A message that is neither a record of the stream nor a punctuation goes to ``bad``
    (:class:`~substreams.streams.badrecords.BadRecords`, the stream's ``on_bad_record``:
    dead-lettered and read on, or :class:`~substreams.errors.BadRecordError`), as in every
    reader; without one the reader makes its own (``punctuations:<substream>``)."""

    def __init__(
        self,
        config: Config,
        substream: str,
        *,
        bootstrap: str | None = None,
        partitions: Sequence[int] | None = None,
        from_offsets: Mapping[int, int] | None = None,
        bound: Bound | None = None,
        ordered: bool | None = None,
        bad: BadRecords | None = None,
    ) -> None:
        sub = config.substream(substream)
        if sub.mechanism != "punctuations":
            raise SubstreamsError(
                f"substream '{substream}' is tracked by the {sub.mechanism}, not by punctuations"
            )
        self.config = config
        self.substream = substream
        self.stream = sub.stream
        total = config.stream(self.stream).partitions
        self.partitions = sorted(set(range(total) if partitions is None else partitions))
        outside = [p for p in self.partitions if not 0 <= p < total]
        if outside or not self.partitions:
            raise SubstreamsError(
                f"stream '{self.stream}' has partitions 0..{total - 1}; cannot read "
                f"{outside or 'none'}"
            )
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.decoder = StreamDecoder(config, self.stream)
        self.aligner = Aligner(
            substream,
            self.stream,
            self.partitions,
            bound=bound or sub.bound,
            ordered=sub.ordered if ordered is None else ordered,
        )
        self.punctuations_read = 0
        self.bad = bad if bad is not None else BadRecords(
            config, f"punctuations:{substream}", bootstrap=self.bootstrap)
        self._own_bad = bad is None
        self._reader = Reader(self.bootstrap, config, name=f"stream '{self.stream}'")
        starts = {p: (from_offsets or {}).get(p, OFFSET_BEGINNING) for p in self.partitions}
        self._reader.assign([TopicPartition(self.stream, p, o) for p, o in starts.items()])

    def restore(self, aligner: Aligner, positions: Mapping[int, int]) -> None:
        """Continue from a checkpoint: ``aligner`` has applied every message before
        ``positions`` (a partition missing there is read from its start).  Before the
        first :meth:`poll` only.  Refused when retention deleted records past a position
        (they would be skipped: their times could never be announced whole)."""
        if aligner.partitions != tuple(self.partitions):
            raise SubstreamsError(
                f"aligner checkpoint of '{self.substream}' covers partitions "
                f"{list(aligner.partitions)} of stream '{self.stream}', this reader "
                f"{self.partitions} (did the stream's partitions change?)"
            )
        gone = {
            p: (o, low) for p, o in positions.items()
            if o < (low := self._reader.log_start(self.stream, p))
        }
        if gone:
            raise SubstreamsError(
                f"aligner of '{self.substream}': stream '{self.stream}' starts past the "
                f"checkpoint's positions (partition: (position, log start)) {gone}: records "
                "were deleted by retention before the aligner read them"
            )
        aligner.track_new_times = self.aligner.track_new_times
        self.aligner = aligner
        self._reader.assign([
            TopicPartition(self.stream, p, positions.get(p, OFFSET_BEGINNING))
            for p in self.partitions
        ])

    @property
    def positions(self) -> dict[int, int]:
        """Next offset per partition read so far."""
        return self._reader.offsets(self.stream)

    def lag(self) -> dict[tuple[str, int], int]:
        return self._reader.lag()

    @property
    def caught_up(self) -> bool:
        """Every partition reported its end since its last message (not high watermarks:
        ``read_committed`` stops at the last stable offset, below them while a transaction
        is open)."""
        return self._reader.ended(self.stream) >= set(self.partitions)

    def poll(self, timeout: float = 0.2, max_messages: int = 1000) -> list[Event]:
        """The events that the messages read within ``timeout`` produce (maybe none)."""
        out: list[Event] = []
        for msg in self._reader.poll(timeout, max_messages):
            try:
                entry = self.decoder.decode(msg)
                p = (
                    Punctuation.from_wire(entry.fields, entry.partition, entry.index)
                    if isinstance(entry, PunctuationEntry)
                    else None
                )
            except DecodeError as exc:
                self.bad.message(msg, exc)  # dead-lettered (logged once a run), or raises
                continue
            self.bad.good()
            if isinstance(entry, Entry):
                out.extend(self.aligner.on_record(entry))
            elif p is not None and p.substream == self.substream:
                self.punctuations_read += 1
                TRAFFIC.add(PUNCTUATION_READ, self.substream)
                out.extend(self.aligner.on_punctuation(p))
        return out

    def events(self, idle_timeout: float | None = None) -> Iterator[Event]:
        """Iterate events; with ``idle_timeout`` stop once caught up and idle that long."""
        return until_idle(self.poll, idle_timeout, lambda: self.caught_up)

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            if self._own_bad:
                self.bad.close()
            else:
                self.bad.good()  # a run of bad records still open is logged

    def __enter__(self) -> PunctuatedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
