"""What the dashboard shows, built by following the control topics in a background thread.

Why the control topics (and not questions to the acker): everything an operator needs is
already on them — each substream's control topic carries its frontier changes and
notifications (whatever wrote them: the acker or a punctuation aligner), and the acker's own
checkpoint topic carries, every ``heartbeat_ms``, its whole state (open times with their XOR,
the sources that have not sealed, every source's liveness): what ``acker sources`` reads and
``acker status``/``acker epochs`` answer over the command protocol.  With ``acker.shards: N``
every shard has its own checkpoint topic and owns some substreams: the model follows all N
and takes each substream's open times and upper frontier from the shard that tracks it.
Following the topics costs the acker nothing, works while it restarts or fails over, and
sees punctuation substreams too.

:class:`DashboardModel` keeps a JSON-able snapshot and a version number; waiters (the
server-sent-events handlers) block on :meth:`DashboardModel.wait` until the version moves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from substreams.acker.changelog import ChangelogView, is_changelog
from substreams.acker.commands import format_time, format_times
from substreams.acker.service import changelog_start
from substreams.acker.state import AckerState, source_liveness
from substreams.config import Config
from substreams.control.follower import LOG, ControlFollower
from substreams.control.io import ResumeLookup
from substreams.control.messages import (
    Checkpoint,
    ControlRecord,
    FrontierSnapshot,
    FrontierUpdate,
    SourceEvicted,
    completions,
)
from substreams.control.subscriber import find_latest_snapshot
from substreams.control.subscription import SubscriptionFrontiers
from substreams.errors import ProtocolError, SubstreamsError
from substreams.frontier import Time, UpperAntichain, sort_key
from substreams.kafka import client
from substreams.kafka.read import Reader

log = logging.getLogger(__name__)

CHECKPOINT_LOOKBACK = 50
"""Records of the checkpoint topic read back at start: the latest checkpoint is among them
while the acker runs (one per transaction, at least one per heartbeat)."""


@dataclass
class _Shard:
    """What the model knows of one acker shard (the acker itself when unsharded)."""

    name: str
    topic: str
    loaded: AckerState | None = None
    checkpoint_ms: int = 0
    seen_ms: int = 0
    view: ChangelogView | None = None
    """The acker's changelog as followed (built into a state when one is asked for)."""
    offsets: dict[int, int] | None = None
    """The acks offsets of the latest delta not built into ``loaded`` yet."""
    snapshot_every: int = 100

    @property
    def state(self) -> AckerState | None:
        if self.offsets is not None and self.view is not None and self.view.ready():
            self.loaded, self.offsets = self.view.state(self.offsets), None
        return self.loaded


@dataclass
class _Substream:
    name: str
    stream: str
    mechanism: str
    topic: str
    frontiers: SubscriptionFrontiers = field(default_factory=SubscriptionFrontiers)
    upper: UpperAntichain = field(default_factory=UpperAntichain)
    notifications: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=20))
    evictions: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=5))
    completed: int = 0


class DashboardModel:
    """Follows the control topics of ``config`` and keeps the dashboard's snapshot."""

    def __init__(self, config: Config, bootstrap: str | None = None, keep: int = 20) -> None:
        self.config = config
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        acker = config.acker
        names = [acker.shard_name(i) for i in range(acker.shards)]
        self.shards = {
            acker.checkpoint_topic(n): _Shard(n, acker.checkpoint_topic(n)) for n in names
        }
        self.subs = {
            s.name: _Substream(s.name, s.stream, s.mechanism, config.acker.control_topic(s.name))
            for s in config.substreams
        }
        for sub in self.subs.values():
            sub.notifications = deque(maxlen=keep)
        self._by_topic = {s.topic: s for s in self.subs.values()}
        self._cond = threading.Condition()
        self.version = 0
        self._snapshot: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._follower: ControlFollower | None = None

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Position on every topic (latest snapshot / latest checkpoint), then follow them
        from a daemon thread."""
        # A bad record is logged and counted, never a stop: the page keeps serving.
        follower = ControlFollower(
            self.bootstrap, self.config, name="dashboard", on_bad=LOG,
            resume=ResumeLookup(self.bootstrap, self.config),
        )
        self._follower = follower
        starts = {
            t: self._position_checkpoints(follower.reader, t, shard.name)
            for t, shard in self.shards.items()
        }
        for sub in self.subs.values():
            found = find_latest_snapshot(self.bootstrap, sub.topic, self.config)
            starts[sub.topic] = 0
            if found is not None and follower.anchor(sub.topic, *found):
                offset, rec = found
                assert isinstance(rec.body, FrontierSnapshot)
                sub.frontiers.start(sub.topic, rec.body.lower, ())
                sub.upper = rec.body.upper.copy()
                starts[sub.topic] = offset + 1
            else:
                sub.frontiers.start(sub.topic, (), ())
        follower.assign(starts)
        self._publish()
        self._thread = threading.Thread(
            target=self._follow, args=(follower,), name="dashboard-model", daemon=True
        )
        self._thread.start()

    def _position_checkpoints(self, reader: Reader, topic: str, name: str) -> int:
        """Where to follow an acker's checkpoint topic from: the first chunk of the snapshot
        its latest changelog record names, else (a version-3 checkpoint) a few records
        back from the end."""
        try:
            low, high = reader.watermarks(topic, 0, timeout=5)
        except (SubstreamsError, KafkaException):  # no acker ran yet: no topic either
            return 0
        start = changelog_start(self.bootstrap, self.config, name)
        return int(max(low, high - CHECKPOINT_LOOKBACK)) if start is None else start

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._cond:
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # -- following -----------------------------------------------------------------------

    def _follow(self, follower: ControlFollower) -> None:
        try:
            while not self._stop.is_set():
                changed = False
                for f in follower.poll(0.2, 500):
                    changed = self._apply(f.topic, f.record) or changed
                if changed or time.time() * 1000 - self._snapshot.get("generated_ms", 0) > 1000:
                    self._publish()
        except Exception as exc:  # shown on the page; the server keeps serving
            log.exception("dashboard: following the control topics failed")
            self.error = str(exc)
            self._publish()
        finally:
            follower.close()

    def _apply(self, topic: str, rec: ControlRecord) -> bool:
        body = rec.body
        shard = self.shards.get(topic)
        if shard is not None:
            if rec.writer != shard.name:
                return False
            shard.seen_ms = rec.written_at_ms
            if isinstance(body, Checkpoint):
                self._load_checkpoint(shard, body, rec.written_at_ms)
            return True
        sub = self._by_topic.get(topic)
        if sub is None:
            return False
        notes = completions(body)
        if notes:
            sub.frontiers.complete_many(topic, [n.time for n in notes], notes[-1].lower_updates)
            self._grow_upper(sub, [*notes[-1].lower_updates, *((n.time, 1) for n in notes)])
            for note in notes:
                sub.completed += 1
                latency = rec.written_at_ms - note.sealed_at_ms if note.sealed_at_ms > 0 else None
                sub.notifications.appendleft({
                    "time": format_time(note.time),
                    "records": note.records,
                    "sealed_at_ms": note.sealed_at_ms,
                    "written_at_ms": rec.written_at_ms,
                    "latency_ms": latency,
                })
        elif isinstance(body, FrontierUpdate):
            sub.frontiers.apply(topic, body.updates)
            self._grow_upper(sub, body.updates)
        elif isinstance(body, SourceEvicted):
            sub.evictions.appendleft({"source": body.source, "reason": body.reason,
                                      "written_at_ms": rec.written_at_ms})
        else:
            return False
        return True

    @staticmethod
    def _grow_upper(sub: _Substream, updates: Iterable[tuple[Time, int]]) -> None:
        """The upper frontier: the maximal times seen (an activation is a +1 delta)."""
        for t, delta in updates:
            if delta > 0:
                sub.upper.insert(t)

    def _load_checkpoint(self, shard: _Shard, body: Checkpoint, written_ms: int) -> None:
        every = self.config.acker.snapshot_every
        try:
            if is_changelog(body.state):
                if shard.view is None:
                    shard.view = ChangelogView(every)
                header = shard.view.feed(body.state)
                if header.kind == "delta" and header.last and shard.view.ready():
                    shard.offsets, shard.checkpoint_ms = dict(body.acks_offsets), written_ms
                return
            state = AckerState.loads(body.state, dict(body.acks_offsets), every)
        except ProtocolError as exc:
            self.error = f"acker '{shard.name}' checkpoint: {exc}"
            return
        shard.loaded, shard.checkpoint_ms = state, written_ms

    def _tracking(self, substream: str) -> AckerState | None:
        """The checkpointed state of the shard that tracks ``substream`` (None: none yet)."""
        for shard in self.shards.values():
            if shard.state is not None and substream in shard.state.tables:
                return shard.state
        return None

    # -- the snapshot --------------------------------------------------------------------

    def _build(self) -> dict[str, Any]:
        now = int(time.time() * 1000)
        acker = self.config.acker
        views = list(self.shards.values())
        alive = [bool(v.seen_ms) and now - v.seen_ms < acker.standby_timeout_ms for v in views]
        shards = [
            {"name": v.name, "checkpoint_ms": v.checkpoint_ms, "last_heard_ms": v.seen_ms,
             "alive": a}
            for v, a in zip(views, alive, strict=True)
        ]
        return {
            "generated_ms": now,
            "version": self.version + 1,
            "acker": {
                "name": acker.name,
                # The oldest shard's checkpoint: everything shown is at least this fresh.
                "checkpoint_ms": min(v.checkpoint_ms for v in views),
                "last_heard_ms": min(v.seen_ms for v in views),
                "alive": all(alive),
                "shards": shards,
            },
            "substreams": [self._substream_view(sub) for sub in self.subs.values()],
            "sources": self._sources_view(),
            "blockers": self._blockers_view(),
            "error": self.error,
            # Records refused for their writer (not the acker; docs/design.md, "Threat model
            # and writer identity"): each is logged with its topic and offset.
            "refused_records": self._follower.foreign if self._follower is not None else 0,
        }

    def _substream_view(self, sub: _Substream) -> dict[str, Any]:
        """One substream's frontiers, open times (when its acker checkpointed), recent
        notifications and evictions."""
        state = self._tracking(sub.name)
        table = state.tables.get(sub.name) if state is not None else None
        open_times = None
        if table is not None:
            open_times = [
                {
                    "time": format_time(t),
                    "xor": f"{e.xor:016x}",
                    "records": e.records,
                    "unsealed": table.unsealed_sources(t),
                    "first_seen_ms": e.first_seen_ms,
                }
                for t, e in sorted(table.open.items(), key=lambda te: sort_key(te[0]))
            ]
        return {
            "name": sub.name,
            "stream": sub.stream,
            "mechanism": sub.mechanism,
            "lower": format_times(list(sub.frontiers.lower)),
            "upper": format_times(self._upper(sub).elements()),
            "completed_seen": sub.completed,
            "open": open_times,
            "notifications": list(sub.notifications),
            "evictions": list(sub.evictions),
        }

    def _sources_view(self) -> list[dict[str, Any]]:
        """Every checkpointed shard's sources with their liveness and the time they hold."""
        timeout_ms = self.config.acker.source_timeout_ms
        return [
            {
                "shard": shard.name,
                "source": s.source,
                "incarnation": s.incarnation,
                "roles": s.roles,
                "substreams": s.substreams,
                "last_seen_ms": s.last_seen_ms,
                "status": s.status,
                "holds": None if s.held is None else {
                    "substream": s.held.substream,
                    "time": format_time(s.held.time),
                    "since_ms": s.held.since_ms,
                },
            }
            for shard in self.shards.values() if shard.state is not None
            for s in source_liveness(shard.state, shard.checkpoint_ms, timeout_ms)
        ]

    def _blockers_view(self) -> list[dict[str, Any]]:
        """Every checkpointed shard's blocked acks partitions and who holds them."""
        return [
            {
                "shard": shard.name,
                "partition": b.partition,
                "offset": b.offset,
                "since_ms": b.since_ms,
                "holder": b.holder(),
                "verdict": b.verdict,
            }
            for shard in self.shards.values() if shard.state is not None
            for b in shard.state.blockers
        ]

    def _upper(self, sub: _Substream) -> UpperAntichain:
        """The upper frontier: the acker's own (checkpointed) when it tracks ``sub``; else
        what the control topic shows (snapshots and completed times: activations travel
        only when they move the lower frontier)."""
        state = self._tracking(sub.name)
        tracker = state.trackers.get(sub.name) if state is not None else None
        return tracker.upper if tracker is not None else sub.upper

    def _publish(self) -> None:
        snap = self._build()
        with self._cond:
            self._snapshot = snap
            self.version = snap["version"]
            self._cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return self._snapshot

    def wait(self, after: int, timeout: float) -> tuple[int, dict[str, Any]] | None:
        """The snapshot once its version is past ``after`` (None after ``timeout``)."""
        with self._cond:
            self._cond.wait_for(lambda: self.version > after or self._stop.is_set(), timeout)
            if self.version > after:
                return self.version, self._snapshot
        return None
