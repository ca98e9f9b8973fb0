"""Direct progress: a publisher's own seals become EpochComplete records (no acker).

Why this exists: with a single source per stream, the source itself knows when a time is
complete (it sealed it) and which offsets hold its records (delivery reports), so it can
write the real control-topic protocol (ProgressTracker + ControlWriter, hash chain included)
without a tracking service.  Tests and the demo use it where the acker is not running
(``Application(config, mechanisms=DIRECT)``); it is not a substitute for the acker with
several sources or stages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from substreams.control.io import ControlWriter, now_ms
from substreams.control.messages import ControlBody, OffsetRange
from substreams.control.progress import ProgressTracker
from substreams.control.traffic import CONTROL_WRITTEN, TRAFFIC
from substreams.frontier import Keyed, Time, less_equal, sort_key
from substreams.frontier.sessions import by_key, closed_runs
from substreams.streams.publisher import Ending, Publisher, PublishHook, Write
from substreams.streams.records import SentRecord


class DirectProgress(PublishHook):
    """A :class:`~substreams.streams.publisher.PublishHook` writing control records itself."""

    wants_send = True
    wants_delivery = True

    def __init__(self, publisher: Publisher, substreams: Sequence[str]) -> None:
        config = publisher.config
        self.stream = publisher.stream
        self.substreams = list(substreams)
        self.topics = {s: config.acker.control_topic(s) for s in self.substreams}
        self.trackers = {
            s: ProgressTracker(s, config.acker.snapshot_every,
                               keyed_floor=config.substream(s).gap_ms is not None)
            for s in self.substreams
        }
        self.writer = ControlWriter(
            publisher.bootstrap,
            f"direct.{publisher.stream}.{publisher.source_id}",
            self.topics.values(),
            config,
        )
        self.writer.recover()
        self.counts: dict[str, dict[Time, int]] = {s: {} for s in self.substreams}
        self.spans: dict[str, dict[Time, dict[int, tuple[int, int]]]] = {
            s: {} for s in self.substreams
        }
        self.gaps = {s: config.substream(s).gap_ms for s in self.substreams}
        self._sealed: list[tuple[str, Time, bool]] = []

    def sent(self, records: Sequence[SentRecord]) -> None:
        for s in self.substreams:
            sent = self.counts[s]
            for record in records:
                t = record.times.get(s)
                if t is not None:  # None: late for s, kept out of it
                    sent[t] = sent.get(t, 0) + 1

    def delivered(
        self,
        records: Sequence[SentRecord],
        partitions: Sequence[int],
        offsets: Sequence[int],
        times: Mapping[str, Sequence[Time]],
    ) -> None:
        for s in self.substreams:
            by_time = self.spans[s]
            for record, offset in zip(records, offsets, strict=True):
                t = record.times.get(s)
                if t is None:  # late for s, kept out of it
                    continue
                spans = by_time.setdefault(t, {})
                lo, hi = spans.get(record.partition, (offset, offset + 1))
                spans[record.partition] = (min(lo, offset), max(hi, offset + 1))

    def seal(self, substream: str, time: Time, every_key: bool) -> Sequence[Write]:
        """Complete every time <= ``time`` this source wrote, and ``time`` itself, once the
        records written before the seal are committed (:meth:`ended`); ``every_key``: the
        sessions the keyed seal closes (session substreams; this source is the only one, so
        its own times are all there is) or every key up to ``time``."""
        self._sealed.append((substream, time, every_key))
        return ()

    def before_commit(self, last: bool) -> Sequence[Write]:
        """Nothing to add to the transaction: the announcements follow its commit."""
        return ()

    def ended(self, how: Ending) -> None:
        """Announce what the commit sealed; let go of the control writer at the end."""
        if how != "aborted":
            sealed, self._sealed = self._sealed, []
            for substream, time, all_keys in sealed:
                if all_keys:
                    assert type(time) is int
                    self._announce_keys(substream, time)
                else:
                    self._announce(substream, time)
        if how != "committed":
            self.writer.close()

    def _ranges(self, substream: str, t: Time) -> list[OffsetRange]:
        spans = self.spans[substream].pop(t, {})
        return [OffsetRange(self.stream, p, lo, hi) for p, (lo, hi) in sorted(spans.items())]

    def _announce(self, substream: str, time: Time) -> None:
        sent = self.counts[substream]
        due = sorted({t for t in sent if less_equal(t, time)} | {time}, key=sort_key)
        tracker = self.trackers[substream]
        bodies: list[ControlBody] = []
        for t in due:
            ranges = self._ranges(substream, t)
            bodies += tracker.complete(t, ranges, sent.pop(t, 0), now_ms())
        self._write(substream, bodies)

    def _announce_keys(self, substream: str, upto: int) -> None:
        sent = self.counts[substream]
        gap = self.gaps[substream]
        tracker = self.trackers[substream]
        bodies: list[ControlBody] = []
        keyed = by_key(sent)
        if gap is None:  # per_key: every key this source wrote, up to ``upto``
            runs = {k: [[t] for t in ts if t <= upto] for k, ts in keyed.items()}
        else:
            runs = {k: closed_runs(ts, gap, upto) for k, ts in keyed.items()}
        closed = sorted(
            ([Keyed(k, t) for t in run] for k, rs in runs.items() for run in rs),
            key=lambda members: sort_key(members[0]),
        )
        for members in closed:
            first, last = members[0], members[-1]
            ranges = [r for m in members for r in self._ranges(substream, m)]
            records = sum(sent.pop(m) for m in members)
            until = last if gap is not None else None
            bodies += tracker.complete(
                first, ranges, records, now_ms(), until=until, members=members
            )
        self._write(substream, bodies)

    def _write(self, substream: str, bodies: list[ControlBody]) -> None:
        self.writer.write([(self.topics[substream], b) for b in bodies])
        TRAFFIC.add(CONTROL_WRITTEN, substream, len(bodies))
