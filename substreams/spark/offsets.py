"""Source offsets and the driver-side scanners that compute them.

Why offsets are explicit JSON (the control-topic position, plus the data-partition positions
in soft mode): Spark writes them to its checkpoint's offset log before a batch runs, so a
batch replayed after a crash covers exactly the same control records and data offsets, and
therefore exactly the same rows.  Positions are "next offset to read": a batch (start, end]
covers control offsets ``start.control <= o < end.control``.

Why scan by consuming instead of asking for high watermarks: control topics are written in
transactions, so the high watermark counts commit markers and records of transactions still
open, which a ``read_committed`` reader must not pass; a position is only trusted once the
reader actually reached it (a record read, or end of partition at the last stable offset).
"""

from __future__ import annotations

import time as _time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition

from substreams.config import Config
from substreams.control.chain import TrustingVerifier
from substreams.control.follower import RAISE, ControlFollower, Followed
from substreams.control.io import ResumeLookup
from substreams.control.messages import EpochComplete, OffsetRange, completions, merge_ranges
from substreams.control.panes import PaneWindows, lookback_enough
from substreams.control.traffic import CONTROL_READ, TRAFFIC
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.kafka.read import Reader


@dataclass(frozen=True)
class SourceOffset:
    """Where a batch starts or ends; ``data`` (partition -> position) in soft mode only."""

    control: int
    data: Mapping[int, int] | None = None
    tasks: int | None = None
    """Firm mode: the read tasks (``maxTasks``) the batch ending here is split into.  In
    the offset Spark logs before the batch runs, so a replay is cut into the same tasks
    whatever the restarted query's options: each task is an exactly-once write unit of
    :func:`substreams.spark.run` (None in offsets written before it was recorded)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"control": self.control}
        if self.data is not None:
            out["data"] = {str(p): o for p, o in sorted(self.data.items())}
        if self.tasks is not None:
            out["tasks"] = self.tasks
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SourceOffset:
        try:
            data, tasks = d.get("data"), d.get("tasks")
            return SourceOffset(
                int(d["control"]),
                None if data is None else {int(p): int(o) for p, o in data.items()},
                None if tasks is None else int(tasks),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SubstreamsError(f"not a substreams source offset: {d!r}") from exc


@dataclass(frozen=True)
class Notification:
    """One EpochComplete as plain, picklable data (what a read task needs)."""

    control_offset: int
    time: Time
    ranges: tuple[OffsetRange, ...]
    records: int
    sealed_at_ms: int
    until: Time | None = None
    """A session's last time (its records span ``time`` to ``until``)."""
    index: int = 0
    """Which notification of the control record at ``control_offset`` this is: a
    notification is identified by ``(control_offset, index)``, the order everywhere."""

    @property
    def ident(self) -> tuple[int, int]:
        return self.control_offset, self.index


def _notification(offset: int, index: int, body: EpochComplete) -> Notification:
    return Notification(
        offset, body.time, body.ranges, body.records, body.sealed_at_ms, body.until, index
    )


def window_note(
    window: int, panes: int, trigger: Notification, index: int, members: list[Notification]
) -> Notification:
    """The notification of hopping window ``window`` (``panes`` panes from it), completed
    by the pane notification ``trigger``: its records are those of its notified panes
    ``members`` (the hull of their ranges, filtered by time by every reader: ``time`` ..
    ``until`` is the window's pane span); it takes ``trigger``'s control offset and seal
    time, and ``index`` numbers it among the windows of that control record."""
    return Notification(
        trigger.control_offset, window,
        merge_ranges([r for m in members for r in m.ranges]),
        sum(m.records for m in members), trigger.sealed_at_ms, window + panes - 1, index,
    )


class ControlScanner:
    """Follows a substream's control topic on the driver and remembers its notifications.

    A hopping substream's control topic announces panes; the scanner hands out windows
    instead (:mod:`substreams.control.panes`): each pane notification becomes the windows
    it completes, numbered ``(control_offset, index)`` in order, and a scan that starts
    mid-topic first re-reads the panes before its position that its next windows hold.

    Every record is checked against its writer's hash chain (shortbus's rolling digest): a
    gap, a replayed or a modified record stops the query with a :class:`ProtocolError`
    instead of feeding it a forged timeline.  Reading from the middle of the topic (a
    restart), the first record of each writer is taken as the chain's anchor.  The Kafka
    consumer is created lazily and never pickled: Spark may ship the reader (with its
    config, never a path).
    """

    def __init__(self, bootstrap: str, topic: str, substream: str, config: Config) -> None:
        self.bootstrap = bootstrap
        self.config = config
        self.topic = topic
        self.substream = substream
        self.base = 0
        self.scanned_to = 0
        self.notes: dict[tuple[int, int], Notification] = {}
        """By ``(control_offset, index)``: a batched record (``EpochsComplete``) holds
        several notifications."""
        self._tail: ControlFollower | None = None
        sub = next((s for s in config.substreams if s.name == substream), None)
        self.panes = sub.panes_per_window if sub is not None and sub.kind == "hopping" else 0
        """Panes per window of a hopping substream; 0: notifications are handed out as
        they come."""
        self._windows: PaneWindows[Notification] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tail"] = None
        return state

    @property
    def verifier(self) -> TrustingVerifier | None:
        """The hash-chain check of the current scan (None before the first)."""
        return None if self._tail is None else self._tail.verifiers.get(self.topic)

    def _follower(self, start: int) -> ControlFollower:
        tail = ControlFollower(
            self.bootstrap, self.config, name=f"control topic '{self.topic}'", on_bad=RAISE,
            resume=ResumeLookup(self.bootstrap, self.config),
        )
        tail.assign({self.topic: start})
        return tail

    def _reset(self, start: int) -> None:
        self.close()
        self.base = self.scanned_to = start
        self.notes = {}
        if self.panes:
            self._windows = self._panes_before(start)
        self._tail = self._follower(start)
        # Asked once fetching has begun: the planner's scan waits at most ``max_wait``.
        if start == 0 and self._tail.reader.log_start(self.topic) == 0:
            self._tail.verifiers[self.topic].strict = True
        elif start > 0:
            self._check_reachable(start)

    def _check_reachable(self, start: int) -> None:
        """Refuse a position past the topic's end.  A checkpoint's offsets are positions
        this topic once reached, and its end never moves back; one past the end belongs to
        another topic (a checkpoint directory reused for another substream or config, or
        the topic deleted and made again), and following from there would wait forever
        for records that will never come."""
        assert self._tail is not None
        end = self._tail.reader.watermarks(self.topic)[1]
        if start > end:
            self.close()
            raise SubstreamsError(
                f"control topic '{self.topic}': asked to read from offset {start}, past the "
                f"topic's end ({end}): the query's checkpoint was written against another "
                "control topic (a checkpoint directory reused for another substream or "
                "config, or the topic deleted and created again); give the query a new "
                "checkpoint directory"
            )

    def _panes_before(self, start: int, timeout: float = 30.0) -> PaneWindows[Notification]:
        """The pane state a scan from ``start`` needs: the panes notified before it, re-read
        from further back each time until they reach a pane no later window holds (or the
        topic's start)."""
        back = 16
        while True:
            windows: PaneWindows[Notification] = PaneWindows(self.panes)
            lo = max(0, start - back)
            first_pane: int | None = None
            if start > 0:
                tail = self._follower(lo)
                try:
                    at_start = lo <= tail.reader.log_start(self.topic)
                    deadline = _time.monotonic() + timeout
                    while tail.reader.positions.get((self.topic, 0), lo) < start:
                        if _time.monotonic() > deadline:
                            raise SubstreamsError(
                                f"control topic '{self.topic}': offsets {lo}..{start} not "
                                f"readable within {timeout} s"
                            )
                        for followed in tail.poll(0.1):
                            if followed.offset >= start:
                                break
                            for n in self._pane_notes(followed):
                                pane = self._pane(n)
                                first_pane = pane if first_pane is None else first_pane
                                windows.add(pane, n)
                finally:
                    tail.close()
            else:
                at_start = True
            if lookback_enough(first_pane, windows.last, self.panes, at_start):
                return windows
            back *= 4

    def _pane(self, note: Notification) -> int:
        if type(note.time) is not int:
            raise SubstreamsError(
                f"hopping substream '{self.substream}': pane {note.time!r} is not an int"
            )
        return note.time

    def _pane_notes(self, followed: Followed) -> list[Notification]:
        notes = [n for n in completions(followed.record.body) if n.substream == self.substream]
        return [_notification(followed.offset, i, body) for i, body in enumerate(notes)]

    def _take(self, followed: Followed) -> None:
        """A decoded record whose chain checked out (the follower raised otherwise)."""
        offset = followed.offset
        self.scanned_to = offset + 1
        notes = self._pane_notes(followed)
        if self._windows is not None:
            notes = self._as_windows(notes, self._windows)
        for n in notes:  # a batched record: (offset, index) each
            self.notes[n.ident] = n
        if notes:
            TRAFFIC.add(CONTROL_READ, self.substream, 1)

    def _as_windows(
        self, panes: list[Notification], windows: PaneWindows[Notification]
    ) -> list[Notification]:
        """The window notifications of one control record's pane notifications."""
        out: list[Notification] = []
        for pane in panes:
            for w, members in windows.add(self._pane(pane), pane):
                out.append(window_note(w, self.panes, pane, len(out), members))
        return out

    def scan(self, start: int, max_wait: float = 2.0, until: int | None = None) -> None:
        """Read what is readable now (bounded by ``max_wait`` seconds) from ``start`` on;
        with ``until``, stop as soon as the records before it are read (a caller that
        knows its end need not wait to see the topic's)."""
        if self._tail is None or not self.base <= start <= self.scanned_to:
            self._reset(start)
        assert self._tail is not None
        # ``at_end`` stays set while nothing new arrives (the tail clears it on a record),
        # so an idle topic answers at once instead of waiting for ``max_wait``.
        # poll_batch returns with what came: a new record costs no wait-out of the timeout
        # (``poll`` waited its 50 ms for 500 records twice per trigger: +100 ms per batch).
        deadline = _time.monotonic() + max_wait
        while _time.monotonic() < deadline:
            batch = self._tail.poll_batch(0.05)
            for followed in batch:
                self._take(followed)
            if until is not None and self.scanned_to >= until:
                break
            if self._tail.reader.caught_up and not batch:
                break

    def latest(self, start: int) -> int:
        """The position after the last EpochComplete readable now (``start`` if none)."""
        self.scan(start)
        return max([start] + [o + 1 for o, _ in self.notes if o >= start])

    def between(self, start: int, end: int, timeout: float = 30.0) -> list[Notification]:
        """The notifications at control offsets [start, end), in order (re-read if needed)."""
        if end <= start:
            return []
        if not (self.base <= start and self.scanned_to >= end):
            self._reset(start)
            assert self._tail is not None
            deadline = _time.monotonic() + timeout
            while self.scanned_to < end:
                if _time.monotonic() > deadline:
                    raise SubstreamsError(
                        f"control topic '{self.topic}': offsets {start}..{end} not readable "
                        f"within {timeout} s (was the topic recreated?)"
                    )
                for followed in self._tail.poll(0.1):
                    self._take(followed)
        return [self.notes[k] for k in sorted(self.notes) if start <= k[0] < end]

    def forget_before(self, position: int) -> None:
        """Drop notifications Spark has committed (it never asks for them again)."""
        for k in [k for k in self.notes if k[0] < position]:
            del self.notes[k]
        self.base = max(self.base, min(position, self.scanned_to))

    def close(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None


class DataScanner:
    """Finds, by reading, the position after the last committed record of each partition."""

    def __init__(self, bootstrap: str, stream: str, partitions: int, config: Config) -> None:
        self.bootstrap = bootstrap
        self.config = config
        self.stream = stream
        self.partitions = partitions
        self.positions: dict[int, int] = {}
        self._reader: Reader | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_reader"] = None
        return state

    def _reset(self, start: Mapping[int, int]) -> Reader:
        self.close()
        self.positions = {p: int(start.get(p, 0)) for p in range(self.partitions)}
        reader = Reader(
            self.bootstrap, self.config,
            [TopicPartition(self.stream, p, o) for p, o in self.positions.items()],
            name=f"stream '{self.stream}'",
        )
        self._reader = reader
        return reader

    def ends(self, start: Mapping[int, int], max_wait: float = 2.0) -> dict[int, int]:
        """Per partition: the position after the last record readable now (>= ``start``)."""
        reader = self._reader
        if reader is None or any(start.get(p, 0) > o for p, o in self.positions.items()):
            reader = self._reset(start)
        deadline = _time.monotonic() + max_wait
        while _time.monotonic() < deadline:
            msgs = reader.poll(0.05, 1000)
            for msg in msgs:
                self.positions[msg.partition()] = msg.offset() + 1
            if not msgs and reader.caught_up:
                break
        return {p: max(o, int(start.get(p, 0))) for p, o in self.positions.items()}

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
