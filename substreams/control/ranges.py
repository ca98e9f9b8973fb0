"""Reading exactly the records of one time from the offset ranges an EpochComplete names.

Why ranges and not "read until the notification": records of later times interleave with
the epoch's records, and a reader that replays (a restarted Spark batch) must get the same
records again.  Offsets make the read deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from confluent_kafka import TopicPartition

from substreams.config import Config
from substreams.control.messages import OffsetRange, epoch_covers
from substreams.errors import DecodeError, SubstreamsError
from substreams.frontier import Keyed, Time
from substreams.kafka.clock import Deadline
from substreams.kafka.read import Reader
from substreams.streams.badrecords import BadRecords
from substreams.streams.listener import StreamDecoder
from substreams.streams.records import Entry

N = TypeVar("N")


class EpochIndex(Generic[N]):
    """Which announced epochs hold a record at a given time: single times by hash, sessions
    (a span of one key's times, ``until`` set) by key, hopping windows (an int span: its
    panes) by each of their panes -- a record is in every window that holds its pane.
    What every firm reader asks of each record it reads, so that one rule
    (:func:`epoch_covers`) decides membership."""

    def __init__(self) -> None:
        self._exact: dict[Time, list[N]] = {}
        self._spans: dict[str, list[tuple[Time, Time, N]]] = {}

    def add(self, time: Time, until: Time | None, item: N) -> None:
        if type(time) is int and type(until) is int:  # a hopping window: its panes
            for pane in range(time, until + 1):
                self._exact.setdefault(pane, []).append(item)
        elif until is None or type(time) is not Keyed:
            self._exact.setdefault(time, []).append(item)
        else:
            self._spans.setdefault(time.key, []).append((time, until, item))

    def get(self, t: Time) -> list[N]:
        found = self._exact.get(t, [])
        if type(t) is Keyed and t.key in self._spans:
            found = found + [
                item for lo, hi, item in self._spans[t.key] if epoch_covers(lo, hi, t)
            ]
        return found


def read_ranges(
    bootstrap: str,
    config: Config,
    ranges: Iterable[OffsetRange],
    substream: str | None = None,
    time: Time | None = None,
    timeout: float = 30.0,
    until: Time | None = None,
    bad: BadRecords | None = None,
) -> list[Entry]:
    """Every data entry inside ``ranges`` (per partition in offset order), keeping only those
    whose time in ``substream`` belongs to the epoch ``time`` (a session: up to ``until``)
    when both are given.

    A record that does not decode goes to ``bad`` (the caller's, which remembers where
    its bad records were; else one of this read's, whose letters are delivered before it
    returns): dead-lettered and passed over, or a
    :class:`~substreams.errors.BadRecordError` under ``on_bad_record: fail``.

    ``timeout`` bounds a *stall*, not the read: it fails only when ``timeout`` seconds pass
    without a record of a wanted range arriving (an epoch of 500 000 records on a slow
    cluster takes as long as it takes; a range that cannot be read fails fast)."""
    wanted = [r for r in ranges if r.end > r.start]
    if not wanted:
        return []
    decoders: dict[str, StreamDecoder] = {}
    out: list[Entry] = []
    own = bad is None
    letters = bad if bad is not None else BadRecords(config, "read_ranges", bootstrap=bootstrap)
    try:
        _read(bootstrap, config, wanted, substream, time, timeout, until, letters, decoders, out)
    finally:
        if own:
            letters.close()
    return out


def _read(
    bootstrap: str, config: Config, wanted: list[OffsetRange], substream: str | None,
    time: Time | None, timeout: float, until: Time | None, bad: BadRecords,
    decoders: dict[str, StreamDecoder], out: list[Entry],
) -> None:
    """:func:`read_ranges`' read, into ``out``."""
    with Reader(bootstrap, config, name="read_ranges") as reader:
        remaining = {(r.stream, r.partition): r for r in wanted}
        reader.assign([TopicPartition(r.stream, r.partition, r.start) for r in wanted])
        deadline = Deadline(timeout)
        while remaining:
            # poll_batch: returns with what arrived (consume(n, t) would wait out t for n).
            batch = reader.poll_batch(0.2, 1000)
            if batch:
                deadline.restart()
            for msg in batch:
                key = (msg.topic(), msg.partition())
                rng = remaining.get(key)
                if rng is None:
                    continue
                if msg.offset() >= rng.end:
                    _finish(reader, remaining, key)
                    continue
                decoder = decoders.get(rng.stream) or decoders.setdefault(
                    rng.stream, StreamDecoder(config, rng.stream)
                )
                try:
                    entry = decoder.decode(msg)
                except DecodeError as exc:
                    bad.message(msg, exc)
                else:
                    bad.good()
                    if isinstance(entry, Entry) and _in_epoch(entry, substream, time, until):
                        out.append(entry)
                if msg.offset() >= rng.end - 1:
                    _finish(reader, remaining, key)
            # A range ending in transaction markers: its end of partition is past its end.
            for key in [k for k, r in remaining.items()
                        if k in reader.at_end and reader.positions[k] >= r.end]:
                del remaining[key]
            # Checked after a fetch, not before: a zero timeout still reads what is there.
            if remaining and not batch and deadline.passed:
                raise _stalled(reader, remaining, timeout)


def _in_epoch(entry: Entry, substream: str | None, time: Time | None, until: Time | None) -> bool:
    """Whether ``entry``'s time in ``substream`` belongs to the epoch ``time`` (up to
    ``until``); every entry does when either is not given."""
    if substream is None or time is None:
        return True
    t = entry.times.get(substream)
    return t is not None and epoch_covers(time, until, t)


def _finish(
    reader: Reader, remaining: dict[tuple[str, int], OffsetRange], key: tuple[str, int]
) -> None:
    """The range of ``key`` is read: forget it and stop fetching its partition."""
    del remaining[key]
    reader.consumer.pause([TopicPartition(*key)])


def _stalled(
    reader: Reader, remaining: dict[tuple[str, int], OffsetRange], timeout: float
) -> SubstreamsError:
    missing = ", ".join(
        f"{s}[{p}]<{r.end} (at {reader.positions.get((s, p), r.start)})"
        for (s, p), r in remaining.items()
    )
    return SubstreamsError(f"ranges not readable: no progress for {timeout} s: {missing}")
