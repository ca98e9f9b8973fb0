"""Direct progress: a publisher's own seals become EpochComplete records (no acker).

Why this exists: with a single source per stream, the source itself knows when a time is
complete (it sealed it) and which offsets hold its records (delivery reports), so it can
write the real control-topic protocol (ProgressTracker + ControlWriter, hash chain included)
without a tracking service.  Tests and the demo use it where the acker is not running
(``Application(config, mechanisms=DIRECT)``); it is not a substitute for the acker with
several sources or stages.
"""

from __future__ import annotations

from collections.abc import Sequence

from substreams.control.io import ControlWriter, now_ms
from substreams.control.messages import ControlBody, OffsetRange
from substreams.control.progress import ProgressTracker
from substreams.control.traffic import CONTROL_WRITTEN, TRAFFIC
from substreams.frontier import Keyed, Time, less_equal, sort_key
from substreams.frontier.sessions import by_key, closed_runs
from substreams.streams.publisher import Publisher, PublishHook
from substreams.streams.records import SentRecord


class DirectProgress(PublishHook):
    """A :class:`~substreams.streams.publisher.PublishHook` writing control records itself."""

    wants_delivery = True

    def __init__(self, publisher: Publisher, substreams: Sequence[str]) -> None:
        config = publisher.config
        self.substreams = list(substreams)
        self.topics = {s: config.acker.control_topic(s) for s in self.substreams}
        self.trackers = {
            s: ProgressTracker(s, config.acker.snapshot_every) for s in self.substreams
        }
        self.writer = ControlWriter(
            publisher.bootstrap,
            f"direct.{publisher.stream}.{publisher.source_id}",
            self.topics.values(),
            config,
        )
        self.writer.recover()
        self.sent: dict[str, dict[Time, int]] = {s: {} for s in self.substreams}
        self.spans: dict[str, dict[Time, dict[int, tuple[int, int]]]] = {
            s: {} for s in self.substreams
        }
        self.gaps = {s: config.substream(s).gap_ms for s in self.substreams}
        self._sealed: list[tuple[str, Time, bool]] = []

    def on_send(self, record: SentRecord) -> None:
        for s in self.substreams:
            t = record.times[s]
            self.sent[s][t] = self.sent[s].get(t, 0) + 1

    def on_delivered(self, record: SentRecord, offset: int) -> None:
        for s in self.substreams:
            spans = self.spans[s].setdefault(record.times[s], {})
            lo, hi = spans.get(record.partition, (offset, offset + 1))
            spans[record.partition] = (min(lo, offset), max(hi, offset + 1))

    def seal(self, publisher: Publisher, substream: str, time: Time) -> None:
        """Complete every time <= ``time`` this source wrote, and ``time`` itself, once the
        records written before the seal are committed (:meth:`on_commit`)."""
        self._sealed.append((substream, time, False))

    def seal_keys(self, publisher: Publisher, substream: str, upto: int) -> None:
        """Complete the sessions the keyed seal closes (session substreams; this source is
        the only one, so its own times are all there is) or every key up to ``upto``."""
        self._sealed.append((substream, upto, True))

    def before_commit(self, publisher: Publisher) -> None:
        """Nothing to add to the transaction."""

    def on_commit(self, publisher: Publisher) -> None:
        sealed, self._sealed = self._sealed, []
        for substream, time, all_keys in sealed:
            if all_keys:
                assert type(time) is int
                self._announce_keys(publisher, substream, time)
            else:
                self._announce(publisher, substream, time)

    def _ranges(self, publisher: Publisher, substream: str, t: Time) -> list[OffsetRange]:
        spans = self.spans[substream].pop(t, {})
        return [OffsetRange(publisher.stream, p, lo, hi) for p, (lo, hi) in sorted(spans.items())]

    def _announce(self, publisher: Publisher, substream: str, time: Time) -> None:
        sent = self.sent[substream]
        due = sorted({t for t in sent if less_equal(t, time)} | {time}, key=sort_key)
        tracker = self.trackers[substream]
        bodies: list[ControlBody] = []
        for t in due:
            ranges = self._ranges(publisher, substream, t)
            bodies += tracker.complete(t, ranges, sent.pop(t, 0), now_ms())
        self._write(substream, bodies)

    def _announce_keys(self, publisher: Publisher, substream: str, upto: int) -> None:
        sent = self.sent[substream]
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
            ranges = [r for m in members for r in self._ranges(publisher, substream, m)]
            records = sum(sent.pop(m) for m in members)
            until = last if gap is not None else None
            bodies += tracker.complete(
                first, ranges, records, now_ms(), until=until, members=members
            )
        self._write(substream, bodies)

    def _write(self, substream: str, bodies: list[ControlBody]) -> None:
        self.writer.write([(self.topics[substream], b) for b in bodies])
        TRAFFIC.add(CONTROL_WRITTEN, substream, len(bodies))

    def close(self, publisher: Publisher) -> None:
        self.writer.close()

    def abort(self, publisher: Publisher) -> None:
        self.writer.close()
