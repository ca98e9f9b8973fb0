"""The deterministic simulator: one seed, one schedule of sources
and an acker over the in-memory log on a simulated clock, then the firm bound's checks.

Why: every rule that carries the guarantees is in pure code (:class:`AckerCore`, the
source's :class:`Tracker`, :class:`MemoryLog`), so thousands of crash schedules can run in the
time one kill test takes, and a failing one replays exactly from its seed.

What runs (all randomness from ``random.Random(seed)``, all time from a :class:`SimClock`):

* *Sources* (2-4), each incarnation a generator stepped by the scheduler that drives a
  real :class:`Publisher` (:class:`SourceRun`) over the log through
  :class:`MemoryProducers`, with the real :class:`Tracker` as its acker mechanism: its
  constructor takes the transactional id (fencing its predecessor) and commits the
  Register; it publishes 1-3 records per epoch to random data partitions, seals each epoch
  (``seal``/``seal_keys`` with ``commit=False``) to commit with its records on the next
  ``flush()`` or later, heartbeats through a non-transactional writer when idle, and
  closes (the Unregister in ``close()``'s commit).  Faults, at every step that can fail:
  its producer's call hook crashes the process before or after a produce, before a commit
  (dying inside the transaction: it holds the last stable offset until fenced or timed
  out), after a commit reached the log but before ``flush()`` returned; between calls, a
  crash, a long pause (silent: evicted), or a *zombie* (frozen while a new incarnation
  takes over, then heartbeating and trying to commit: the publisher must raise
  :class:`PublisherFencedError` and write nothing).  A restart is a new incarnation that resumes
  after the highest epoch its source committed (as ``tests/integration/procs.py`` does)
  and re-seals it.
* *Keyed times* (a third of the schedules; their draws from a second generator, so the
  others are the schedules they were): the sources and the stage also track a keyed
  substream, ``k`` (a record's time ``Keyed(key, epoch)``) or the session substream ``w``
  (``Keyed(key, event ms)``, sessions cut by the acker with a gap of 0-25 ms).  Each
  source writes some of the keys; an epoch ends with a keyed seal (every key up to it,
  also the keys it never wrote) or with a seal of each key it wrote, right after the
  key's last record of the epoch (``Keyed(key, t)``: one key only).  A restart re-seals
  every key up to the epoch before its first.
* *The acker* (in half the two-partition schedules two shards, one partition each): what
  :meth:`AckerService.step` does, over the log: read the acks topic ``read_committed``,
  :meth:`AckerCore.apply` per message, probe both ends every ``probe_interval_ms`` and
  name blockers with ``record_at``, :meth:`AckerCore.tick`,
  carry out fences and evictions (off the loop, as the service does: the fence takes
  simulated time while the acker and the sources run on), then commit the notifications with
  the checkpoint records of its changelog (``StateLog.records()``: a delta, and snapshot
  chunks over several commits; tiny records and frequent snapshots, so that a crash falls
  anywhere in a snapshot) atomically.  It crashes at random and restarts from what its
  committed changelog restores.

* *A stage* (half the schedules; ``acker/stage.py``): reads the data topic
  ``read_committed`` from its group's committed positions and writes 0-2 outputs per input
  to ``OUT`` (terminal: the sources then only send, the stage receives and delivers), with
  the real :class:`Tracker` in role STAGE; outputs, RCV of the inputs and the input positions
  (``send_offsets``) go in one transaction.  It crashes, pauses and freezes as a zombie at
  every step like a source, and always restarts.
* *A Spark query* (40%; ``spark/executor.py`` and ``spark/sink.py``): per batch one task
  per unit, each attempt its own writer and STAGE tracker (Register, its marker = the unit
  group's offset on the commit topic, skip when at or past the batch, else its rows and the
  marker in one transaction; a failed attempt is retried while its driver lives); the
  driver, a SOURCE registered never evicted for silence, seals the batch with its marker on
  the commit topic once every unit reported, and after a crash (its tasks die with it or run
  on) restarts within :data:`DRIVER_RESTART_MS` from the last marker it committed.

Checks (:func:`check`): notifications in order and once per substream; each holds
exactly the committed records of its time (count, and every one inside its offset
ranges: the data topic's, the stage's outputs', or the query's rows'); none before its
records' commit; every time with a committed record terminates; no source record committed
twice (a restart resumes after what its source committed); stage outputs exactly once (an
input below the group's position has exactly its outputs, one past it none); each unit's
part of a batch committed by one attempt; no live incarnation evicted; a zombie's calls fail.
The keyed substream (:func:`_check_keyed`): per key in order and once (a key's times
terminate on their own: ``table.py`` rule 3 with keys incomparable; a key's sessions in
start order); each time (session) with exactly the committed records of that key and time
(of its times, a session of them: consecutive ones at most the gap apart, and the gap apart
from the key's previous session), inside its ranges, none before their commit; every
committed record's time, and every time sealed for one key, terminated.  Excused by
design: the records an incarnation wrote at a keyed time that was final (terminated, or at
or below the keyed floor) when the acker first held its session -- refused as late, and in
no notification.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import random
import re
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import substreams.acker.agent as agent_module
from substreams.acker.changelog import StateLog, base_of, is_first_chunk, restore
from substreams.acker.core import AckerCore, Evict
from substreams.acker.protocol import (
    STAGE,
    decode_ack,
    encode_ack,
    segment_partition,
)
from substreams.acker.state import AckerState, Blocker
from substreams.acker.table import SOURCE
from substreams.acker.tracker import Tracker
from substreams.config import Config
from substreams.config.loader import load_config_text
from substreams.control.messages import completions
from substreams.errors import BrokerError, PublisherFencedError
from substreams.frontier import Keyed, Time, less_equal
from substreams.frontier.sessions import run_members
from substreams.kafka.clock import SimClock
from substreams.kafka.log import Committed, FencedError, Record
from substreams.kafka.memory import MemoryLog, MemoryReader, MemoryTransactionalWriter
from substreams.kafka.memproducer import MemoryProducers
from substreams.streams.deadletter import REASON_TERMINATED
from substreams.streams.publisher import Ending, Publisher, Write, transactional_id
from substreams.streams.records import SentRecord
from substreams.streams.schemas import Codec, envelope_schema

DATA = "clicks"
ACKS = "acks"
SUBS = ("s", "o")
"""Two epoch substreams: on acks partitions 1 and 0 of a two-partition acks topic."""
KEYED = "k"
"""A keyed substream (a sixth of the schedules): a record's time is ``Keyed(key, epoch)``;
each key's times terminate on their own, in order (acks partition 1 of two)."""
SESSION = "w"
"""A session substream (a sixth of the schedules): a record's time is ``Keyed(key, event
ms)``, cut into sessions by the acker with the schedule's gap (acks partition 0 of two)."""
KEYS = ("a", "b", "c")
EVENT_MS = 10
"""Epoch ``e``'s event times are ``EVENT_MS * e ..  EVENT_MS * e + EVENT_MS - 1``."""
GAPS = (0, 5, 10, 25)
DATA_PARTITIONS = 3
OUT = "out"
"""A stage's output stream (in the staged schedules: the terminal stream of both segments)."""
OUT_PARTITIONS = 2
STAGE_ID = "stage.st"
STAGE_GROUP = "substreams.stage.st"
"""The stage's consumer group: its input positions, committed in its output transaction."""
RES = "results"
"""A Spark query's output stream (in the Spark schedules), tracked in substream ``Q``."""
RES_PARTITIONS = 2
COMMITS = "_substreams.commits.results"
"""Its commit topic: the driver's batch markers; the units' markers are group offsets on it."""
Q = "q"
DRIVER = "spark.q"
DRIVER_RESTART_MS = 3000
"""A crashed driver comes back within this (often after the acker's 1 s timeout: it must not be
evicted for its silence)."""
TIMEOUT_MS = 1000
"""The acker's ``source_timeout_ms``."""
ACKER_HEARTBEAT_MS = 200
SOURCE_HEARTBEAT_MS = 200
TXN_TIMEOUT_MS = 4000
"""Sources' ``transaction.timeout.ms``: longer than the timeout, so that a publisher dying
inside a transaction is found by the acker (blocker rule) before its coordinator aborts it."""
DRAIN_MS = TXN_TIMEOUT_MS + 6 * TIMEOUT_MS
"""How long the acker runs on, at most, for every time to end: after the sources ended and
after the last commit that returned, whichever is later (a stage, always restarted and
faulted like a source, may still be working through its input when the sources end)."""
DRAIN_CAP_MS = 10 * DRAIN_MS
"""The simulator's own bound: writers still committing this long after the sources ended
is a violation (every writer's work is finite), not a schedule that runs forever."""
SNAPSHOT_EVERY = 100
IDLE_POLL_MS = 50
"""The acker's and the stage's poll timeout: a poll that read nothing waits that long for
the next."""

Gen = Generator[int, None, None]
"""An actor: yields how many simulated ms until its next step."""

SOURCE_FAULTS: Mapping[tuple[str, str], float] = {
    ("produce", "before"): 0.004, ("produce", "after"): 0.004,
    ("commit", "before"): 0.01, ("commit", "after"): 0.01,
}
"""Where a source's producer dies inside a publisher call (the probability at each such
call): before or after a produce (a record's or a hook's, inside the transaction), before
the commit reaches the log, and after it did but before the publisher's caller saw it
return."""


@functools.cache
def source_config(acks_partitions: int, staged: bool, keyed: str | None, gap: int) -> Config:
    """The configuration the sources' publishers are built from: the data stream (its
    records: :file:`record.avsc`), the tracked substreams and, staged, the stage that reads
    it (so that the tracker finds the data stream terminal or not as the acker does)."""
    lines = [
        "streams:",
        f"  - {{name: {DATA}, schema: record.avsc, order_key: e, "
        f"partitions: {DATA_PARTITIONS}}}",
        f"  - {{name: {OUT}, schema: record.avsc, order_key: e, partitions: {OUT_PARTITIONS}}}",
        "substreams:",
        *(f"  - {{name: {sub}, stream: {DATA}, kind: epoch, field: e}}" for sub in SUBS),
    ]
    if keyed == KEYED:
        lines.append(f"  - {{name: {KEYED}, stream: {DATA}, kind: per_key, key: key}}")
    elif keyed == SESSION:
        # the gap is the acker's (its core cuts the sessions); a publisher does not read it
        lines.append(f"  - {{name: {SESSION}, stream: {DATA}, kind: session, key: key, "
                     f"field: ts, gap_ms: {max(gap, 1)}}}")
    if staged:
        lines += ["stages:", f"  - {{name: st, input: {DATA}, output: {OUT}}}"]
    lines += ["acker:", f"  acks_topic: {ACKS}", f"  acks_partitions: {acks_partitions}"]
    return load_config_text("\n".join(lines) + "\n", Path(__file__).with_name("sim.yaml"))


@functools.cache
def _data_codec() -> Codec:
    config = source_config(1, False, None, 0)
    return Codec(envelope_schema(config.stream(DATA).schema), label="simulated records")


def data_value(r: Record) -> tuple[str, int, int, int, str, int]:
    """A data record's (incarnation, epoch, number in the epoch, tracking id, key, event
    time), from the envelope its publisher wrote."""
    doc = _data_codec().decode_single(r.value or b"")
    p = doc["payload"]
    return p["inc"], p["e"], p["k"], doc["tracking_id"], p["key"], p["ts"]


def _no_schema_registry(config: Config, stream: str, bootstrap: str | None) -> None:
    """The schemas are the configuration's (no schema topic in the simulation)."""

BUGS = ("old_unregister", "old_heartbeat", "seq_not_reset", "clock_silence", "evict_at_lso",
        "stage_offsets_apart", "evicted_driver", "flush_returned_crash", "zombie_seal",
        "key_seal_every_key")
"""The bug switches of :attr:`AckerCore.reintroduced` (the core's, and the simulated
processes': ``evict_at_lso`` in the acker shell, ``stage_offsets_apart`` -- the stage commits
its input positions in a transaction of their own, after its outputs' -- in the stage,
``flush_returned_crash`` -- a restarted source resumes after the last commit its caller saw
return, not after what the log holds -- and ``zombie_seal`` -- a fenced zombie's commit of
its seals takes the transactional id back and returns normally, its new tracker's sequence
numbers restarting under the same incarnation -- in the sources)."""

UNREACHABLE = {
    "old_unregister": "an old incarnation's transactional messages all precede its successor's "
    "Register (the successor's init_transactions fenced it first); rule 4 is defence in depth",
}
"""Switches no schedule can reach, with why (``--bug all`` reports them without running them;
``test_old_unregister_is_unreachable_while_fencing_holds`` checks the claim)."""

KNOWN_ISSUE = (
    "a fenced zombie that stays idle heartbeats for its incarnation forever; if the "
    "incarnation that fenced it dies before its Register is committed (and no other comes), "
    "the acker's session stays the zombie's, live, and the source's times never terminate "
    "(its heartbeat writer is not transactional, so nothing tells it or the acker of the "
    "fence).  With one acks partition the acker evicts the superseded session once the "
    "successor's first transaction has held the partition for the timeout; with several, the "
    "shard that fences it first frees the others' partitions too.  The default schedules "
    "keep a zombie's successor fault-free until its first "
    "commit returned; idle_zombies=True (--idle-zombies) lifts that and finds it."
)
"""A liveness issue of the current code the simulator found (seed 5229 with idle zombies:
src0.2 dies before its Register's first write, src0.1 thaws and idles; 1444 before the
sources became real publishers, 905 before the stage and Spark joined the schedules)."""


@contextmanager
def reintroduced(bugs: frozenset[str]) -> Iterator[None]:
    """Switch bugs on in :class:`AckerCore` (a class attribute: test-only) for a block."""
    unknown = bugs - set(BUGS)
    if unknown:
        raise ValueError(f"unknown bug switch(es) {sorted(unknown)}; known: {', '.join(BUGS)}")
    before = AckerCore.reintroduced
    AckerCore.reintroduced = bugs
    try:
        yield
    finally:
        AckerCore.reintroduced = before


class _NoTraffic:
    """The agent's traffic counters (Prometheus) are the process's, not the schedule's."""

    def add(self, *_: Any) -> None:
        pass


@contextmanager
def agent_clock(clock: SimClock) -> Iterator[None]:
    """The agent stamps messages with the wall clock (``sent``, ``sealed_at_ms``): the
    simulated one instead, so that a schedule's messages are the same bytes every run.
    Its traffic counters are off meanwhile (a tenth of the run time, and no guarantee)."""
    before, traffic = agent_module.now_ms, getattr(agent_module, "TRAFFIC")  # noqa: B009
    agent_module.now_ms = clock.now_ms
    setattr(agent_module, "TRAFFIC", _NoTraffic())  # noqa: B010
    try:
        yield
    finally:
        agent_module.now_ms = before
        setattr(agent_module, "TRAFFIC", traffic)  # noqa: B010


@dataclass
class Note:
    """One committed notification."""

    sub: str
    time: Any
    """An int, or a ``Keyed`` time in the keyed substream."""
    records: int
    ranges: list[tuple[str, int, int, int]]
    """(stream, partition, start, end)."""
    at_ms: int
    until: Any = None
    """A session's last time (``time`` is its first)."""


@dataclass
class Source:
    """One source id across its incarnations."""

    name: str
    txid: str
    epochs: int
    incarnations: int = 0
    current: str = ""
    finished: bool = False
    """Closed, or dead for good: nothing more comes from this source."""
    guarded: bool = False
    """A zombie of it froze and no later incarnation committed since: see
    :meth:`Sim.incarnation`."""
    unlive: set[str] = field(default_factory=set)
    """Incarnations that crashed, paused for longer than the timeout, froze as zombies or
    were fenced: the acker may evict these, never the others."""
    keys: tuple[str, ...] = ()
    """The keys it writes (with a keyed substream)."""
    keyed_seals: float = 1.0
    """How often an epoch ends with a keyed seal (every key up to it) rather than a seal of
    each key written, each right after the key's last record of the epoch."""


@dataclass
class Result:
    seed: int
    violations: list[str]
    faults: int
    events: list[tuple[int, str]]
    stats: dict[str, int]


_LATE_KEYED = re.compile(
    r"substream '(\w+)': report for time Keyed\('(\w+)', (-?\d+)\), which already terminated")
"""A keyed report the core refused as late (:meth:`SegmentTable._late`'s reason)."""


class Crash(Exception):
    """An incarnation's process dies here (the generator ends)."""


class Sim:
    """One schedule.  ``fault_limit``: inject at most that many faults (the later ones are
    drawn but not carried out, so the rest of the schedule stays as alike as it can): what
    the minimal trace search varies."""

    def __init__(self, seed: int, fault_limit: int | None = None, *,
                 idle_zombies: bool = False) -> None:
        self.seed = seed
        self.idle_zombies = idle_zombies
        self.rng = random.Random(seed)
        rng = self.rng
        self.clock = SimClock()
        self.log = MemoryLog(self.clock, marker_delay_ms=rng.choice((0, 0, 5)))
        self.acks_partitions = rng.choice((1, 2))
        self.staged = rng.random() < 0.5
        """Half the schedules run a stage DATA -> OUT: both segments are {DATA, OUT}, OUT
        terminal (the sources only send, the stage receives and delivers)."""
        self.config: Any = SimpleNamespace(
            acker=SimpleNamespace(acks_topic=ACKS, acks_partitions=self.acks_partitions),
            # unstaged: every substream's segment is the data topic alone, terminal
            stages=(SimpleNamespace(name="st", input=DATA, output=OUT),) if self.staged else (),
            substream=lambda name: SimpleNamespace(stream=DATA),
        )
        self.log.create_topics({DATA: DATA_PARTITIONS, ACKS: self.acks_partitions,
                                OUT: OUT_PARTITIONS})
        self.spark = rng.random() < 0.4
        self.krng = random.Random(f"keyed/{seed}")
        """Every draw about keyed times (so a schedule without them is the one it was
        before they joined, draw for draw)."""
        krng = self.krng
        self.keyed: str | None = krng.choice((None, None, None, None, KEYED, SESSION))
        """The schedule's keyed substream, tracked by the sources and the stage, if any."""
        self.gap = krng.choice(GAPS) if self.keyed == SESSION else 0
        self.tracked: tuple[str, ...] = (*SUBS, self.keyed) if self.keyed else SUBS
        """The substreams the sources and the stage track."""
        """A Spark query writes RES (substream Q): units (STAGE) and a driver (SOURCE, never
        evicted for silence) that seals a batch once every unit committed its part."""
        self.subs: tuple[str, ...] = (*self.tracked, Q) if self.spark else self.tracked
        """Every substream of the schedule (the sources and the stage write ``tracked``)."""
        if self.spark:
            self.config.substream = lambda name: SimpleNamespace(stream=RES if name == Q else DATA)
            self.log.create_topics({RES: RES_PARTITIONS, COMMITS: 1})
        self.driver = Source(DRIVER, f"txn.{DRIVER}", rng.randint(2, 4))
        """The query's driver (``epochs``: its batches)."""
        self.units = rng.randint(2, 3)
        self.res_commit_at: dict[tuple[int, int], int] = {}
        self.stage = Source(STAGE_ID, f"txn.{STAGE_ID}", 0)
        """The stage's incarnations (its own transactional id; it never finishes)."""
        self.out_commit_at: dict[tuple[int, int], int] = {}
        """The stage's output records (partition, offset) whose commit returned, and when."""
        self.fault_limit = fault_limit
        self.faults = 0
        self.events: list[tuple[int, str]] = []
        self.violations: list[str] = []
        self._queue: list[tuple[int, int, Gen]] = []
        self._seq = 0
        self.t0 = self.clock.now_ms()
        self.last_commit_at = self.t0
        """When the last commit of any writer returned (the drain counts from it)."""
        # ground truth
        self.commit_at: dict[tuple[int, int], int] = {}
        """Data records (partition, offset) whose transaction's commit returned, and when."""
        self.committed_max: dict[str, int] = {}
        """Per source, the highest epoch of a record it committed (what a restart resumes
        after, found in the data topic by procs.py; known exactly here)."""
        self.seen_max: dict[str, int] = {}
        """Per source, the highest epoch of a commit whose return its caller saw (not the
        same after a crash right after a commit returned: what a restart must not trust)."""
        self.pending: dict[str, set[int]] = {s: set() for s in self.subs}
        """Per substream, times with a committed record not yet notified."""
        self.notes: dict[str, list[Note]] = {s: [] for s in self.subs}
        self.key_last: dict[str, int] = {}
        """Per key, its last notified time in the keyed substream (a session's end)."""
        self.key_sealed: set[tuple[str, Keyed]] = set()
        """(incarnation, time) of the keyed substream's times a source sealed one key at
        (``seal(KEYED, Keyed(k, e))``) in a commit that returned: each opens its time, which
        must terminate (unless final when the incarnation joined: it opens nothing)."""
        self.key_times: dict[tuple[int, int], Keyed] = {}
        """The keyed substream's time of each committed data record (filled by the check)."""
        self.key_refused: set[tuple[str, Keyed]] = set()
        """(incarnation, time) of the keyed substream's reports refused as for a terminated
        time, in acker steps that committed."""
        self.key_joined: dict[str, list[tuple[tuple[Time, ...], int | None]]] = {}
        """Per incarnation, the keyed substream's terminated times and keyed floor (or the
        floor it forgot terminated times at, if higher) each time an acker first held its
        session: its records at times covered there are refused by design (a source counts
        from its Register on), those only."""
        self.terminated_refused: set[str] = set()
        """Incarnations a report of which was refused as for a terminated time."""
        self.joined: dict[tuple[str, int], dict[str, int]] = {}
        """(incarnation, acks partition) -> its substreams' last terminated times when the acker
        first held a session of the incarnation: a source counts from its Register on, so
        its records at times up to there are refused (``terminated_time``; docs/design.md,
        "A record after its own source's seal") and in no notification, by design."""
        self.stats = {"commits": 0, "crashes": 0, "restarts": 0, "zombies": 0,
                      "pauses": 0, "acker_crashes": 0, "evictions": 0, "fences": 0,
                      "notifications": 0, "excused": 0, "steps": 0, "staged": int(self.staged),
                      "stage_commits": 0, "stage_outputs": 0, "spark": int(self.spark),
                      "driver_crashes": 0, "spark_rows": 0,
                      "keyed": int(self.keyed == KEYED), "sessions": int(self.keyed == SESSION),
                      "key_notes": 0, "key_seals": 0, "key_excused": 0}
        self.unit_attempts = 0
        self.sources = [
            Source(f"src{i}", transactional_id(DATA, f"src{i}"), rng.randint(3, 6))
            for i in range(rng.randint(2, 4))
        ]
        self.source_config = source_config(self.acks_partitions, self.staged, self.keyed,
                                           self.gap)
        self.runs: list[SourceRun] = []
        """Every source incarnation (the publishers still held are let go at the end)."""
        if self.keyed:  # each source writes some keys, and seals per key or every key
            for src in self.sources:
                src.keys = tuple(sorted(krng.sample(KEYS, krng.randint(1, len(KEYS)))))
                src.keyed_seals = krng.choice((0.2, 0.6, 1.0))
        self.finished = 0
        self.home = {sub: segment_partition(sub, self.acks_partitions) for sub in self.subs}
        """Each substream's acks partition (``s`` and ``q`` on 1, ``o`` on 0 of two)."""
        shards = 2 if self.acks_partitions == 2 and seed % 2 else 1
        """Half the two-partition schedules run two acker shards, one partition each."""
        self.ackers = [
            AckerShell(self, tuple(p for p in range(self.acks_partitions) if p % shards == i),
                       f"sim.shard{i}of{shards}")
            for i in range(shards)
        ]

    # -- the scheduler -------------------------------------------------------------------

    def now(self) -> int:
        return self.clock.now_ms()

    def event(self, text: str) -> None:
        self.events.append((self.now() - self.t0, text))

    def spawn(self, actor: Gen, delay_ms: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now() + delay_ms, self._seq, actor))

    def fault(self, p: float) -> bool:
        """A fault with probability ``p`` (drawn always; carried out within the limit)."""
        if self.rng.random() >= p:
            return False
        self.faults += 1
        return self.fault_limit is None or self.faults <= self.fault_limit

    def run(self) -> Result:
        with agent_clock(self.clock):
            for i, src in enumerate(self.sources):
                self.spawn(self.incarnation(src), self.rng.randrange(50) + i)
            for acker in self.ackers:
                self.spawn(acker.run())
            if self.staged:
                self.spawn(self.stage_incarnation(self.stage), self.rng.randrange(50))
            if self.spark:
                self.spawn(self.driver_incarnation(self.driver), self.rng.randrange(50))
            ended_at: int | None = None
            queue, clock, pop, push = self._queue, self.clock, heapq.heappop, heapq.heappush
            writers = len(self.sources) + self.spark
            while queue:
                at, _, actor = pop(queue)
                now = clock.now_ms()
                if at > now:
                    clock.advance_ms(at - now)
                try:
                    delay = next(actor)
                except StopIteration:
                    continue
                self._seq += 1
                push(queue, (at + delay, self._seq, actor))
                if ended_at is None:
                    if self.finished == writers:
                        ended_at = self.now()
                elif (not any(self.pending.values())
                      and all(a.caught_up() for a in self.ackers)) or (
                    self.now() - max(ended_at, self.last_commit_at) > DRAIN_MS
                ):
                    break
                elif self.now() - ended_at > DRAIN_CAP_MS:
                    self.violations.append(
                        f"drain: writers still committing {DRAIN_CAP_MS} ms after the "
                        "sources ended")
                    break
            for run in self.runs:
                run.die()
            check(self)
        return Result(self.seed, self.violations, self.faults, self.events, self.stats)

    # -- sources -------------------------------------------------------------------------

    def finish(self, src: Source) -> None:
        if not src.finished:
            src.finished = True
            self.finished += 1

    def incarnation(self, src: Source) -> Gen:
        """One incarnation of ``src``, a real :class:`Publisher` over the log, from taking
        its transactional id (its constructor: fencing the predecessor, committing the
        Register) to its close (or its crash; then maybe a restart).  While ``src.guarded``
        (a zombie of it froze and no later incarnation committed yet), no fault hits it
        before its first commit returned and it is not gone for good (see
        :data:`KNOWN_ISSUE`)."""
        rng = self.rng
        src.incarnations += 1
        inc = f"{src.name}.{src.incarnations}"
        previous, src.current = src.current, inc
        if previous:
            src.unlive.add(previous)
        done = self.committed_max.get(src.name, -1)
        if "flush_returned_crash" in AckerCore.reintroduced:  # BUG SWITCH (source restart)
            done = self.seen_max.get(src.name, -1)  # what the caller saw, not the log
        # a client that came back after an eviction starts past what terminated meanwhile
        frontier = min(self.notes[s][-1].time if self.notes[s] else -1 for s in SUBS)
        start = max(done, frontier) + 1
        self.event(f"{inc} starts at epoch {start} (took {src.txid}; committed up to {done})")
        me = SourceRun(self, src, inc, lambda: self.incarnation(src))
        self.runs.append(me)
        try:
            me.start()  # init_transactions, the Register committed
            self.spawn(me.heartbeats(), SOURCE_HEARTBEAT_MS)
            if start > 0:
                for sub in SUBS:
                    me.seal(sub, start - 1)
                if self.keyed:
                    me.seal_keys(start - 1)
                yield from me.flush()
            krng = self.krng
            for e in range(start, src.epochs):
                n = rng.randint(1, 3)
                keys = sorted(krng.choice(src.keys) for _ in range(n)) if self.keyed else []
                per_key = bool(keys) and krng.random() >= src.keyed_seals
                for k in range(n):
                    yield from me.point("before produce")
                    me.publish(e, k, keys[k] if keys else "")
                    yield rng.randrange(40)
                    if per_key and (k + 1 == n or keys[k + 1] != keys[k]):
                        me.seal_key(keys[k], e)  # the key is done at this epoch
                    if rng.random() < 0.3:
                        yield from me.flush()
                for sub in SUBS:
                    me.seal(sub, e)
                if keys and not per_key:
                    me.seal_keys(e)
                if rng.random() < 0.7:
                    yield from me.flush()
                yield rng.randrange(60)
            yield from me.flush()
            yield from me.close()  # the Unregister
            me.alive = False
            self.finish(src)
            self.event(f"{inc} closed")
        except Crash:
            me.die()
            src.unlive.add(inc)
            if src.current != inc:
                return  # a newer incarnation runs already (we were a zombie)
            if self.fault(0.25) and not src.guarded:
                self.finish(src)
                self.event(f"{inc} is gone for good")
            else:
                self.stats["restarts"] += 1
                self.spawn(self.incarnation(src), 20 + rng.randrange(400))

    def key_time(self, key: str, e: int, ts: int) -> Keyed | None:
        """A record's time in the keyed substream (None: the schedule has none)."""
        if self.keyed == KEYED:
            return Keyed(key, e)
        if self.keyed == SESSION:
            return Keyed(key, ts)
        return None

    # -- a Spark query -------------------------------------------------------------------

    def driver_incarnation(self, drv: Source) -> Gen:
        """One incarnation of the query's driver (``spark/sink.py``): take its transactional
        id, read the last batch it sealed from the commit topic, then per later batch:
        launch a task per unit, wait until every unit reported its part committed (or
        committed before), and seal the batch with its marker in one transaction.  It
        registers as never evicted for silence: a crashed driver holds its batches back
        until it is restarted.  A crash kills its running tasks or leaves them running on
        (zombie tasks); it always restarts (within :data:`DRIVER_RESTART_MS`)."""
        rng = self.rng
        drv.incarnations += 1
        inc = f"{drv.name}.{drv.incarnations}"
        previous, drv.current = drv.current, inc
        if previous:
            drv.unlive.add(previous)
        writer = self.log.transactional_writer(drv.txid, timeout_ms=TXN_TIMEOUT_MS)
        tracker = Tracker(self.config, RES, drv.name, inc, [Q], SOURCE, writer=drv.txid,
                          evict_when_silent=False)
        me = SparkDriver(self, drv, inc, writer, tracker, lambda: self.driver_incarnation(drv))
        self.spawn(me.heartbeats(), SOURCE_HEARTBEAT_MS)
        sealed = max((int(r.value or b"-1") for r in _read_all(self, COMMITS, 1)), default=-1)
        self.event(f"{inc} starts after batch {sealed} (took {drv.txid})")
        try:
            yield from me.commit()  # the Register
            for b in range(sealed + 1, drv.epochs):
                me.done = set()
                for u in range(self.units):
                    self.spawn(self.unit_attempt(me, u, b), rng.randrange(30))
                while len(me.done) < self.units:
                    yield 20
                    if self.fault(0.03):
                        self.stats["crashes"] += 1
                        self.event(f"{inc} crashes while its tasks of batch {b} run")
                        raise Crash()
                yield from me.point("before its seal")
                me.tracker.seal(Q, b, False)
                me.begin()
                me.call("produce", lambda b=b: writer.produce(COMMITS, 0, str(b).encode()))
                yield from me.commit()
                self.event(f"{inc} sealed batch {b}")
            yield from me.commit(last=True)  # the Unregister
            me.alive = False
            self.finish(drv)
            self.event(f"{inc} closed")
        except Crash:
            me.alive = False
            drv.unlive.add(inc)
            if drv.current != inc:
                return
            me.kill_tasks = rng.random() < 0.5
            self.stats["driver_crashes"] += 1
            self.event(f"{inc} died" + (" with its tasks" if me.kill_tasks else
                                        "; its tasks run on"))
            self.spawn(self.driver_incarnation(drv), 20 + rng.randrange(DRIVER_RESTART_MS))

    def unit_attempt(self, driver: SparkDriver, u: int, b: int) -> Gen:
        """One attempt of unit ``u``'s task of batch ``b`` (``spark/executor.py``
        ``UnitWriter``): take the unit's transactional id (fencing earlier attempts),
        Register, read its marker (the group offset on the commit topic): at or past ``b``,
        skip; else its rows and the marker ``b + 1`` in one transaction.  A failed attempt
        is retried while its driver lives; a dead driver's task dies with it or runs on."""
        rng, name = self.rng, f"{DRIVER}.w{u}"
        self.unit_attempts += 1
        inc = f"{name}.b{b}.{self.unit_attempts}"
        writer = self.log.transactional_writer(f"txn.{name}", timeout_ms=TXN_TIMEOUT_MS)
        tracker = Tracker(self.config, RES, name, inc, [Q], STAGE)
        unit = Source(name, f"txn.{name}", 0)
        unit.current = inc
        me = SparkUnit(self, unit, inc, writer, tracker, lambda: self.unit_attempt(driver, u, b))
        me.batch, me.driver = b, driver
        try:
            yield from me.commit()  # the Register, before any report
            group, tp = f"substreams.{name}", (COMMITS, 0)
            while True:
                try:
                    got = self.log.committed_offsets(group, [tp])
                    break
                except BrokerError:
                    yield 50
            done = got[tp].offset - 1 if tp in got else -1
            if done < b:
                for j in range(rng.randint(1, 3)):
                    yield from me.point("before produce")
                    me.row(b, u, j)
                me.begin()
                me.call("send offsets", lambda: writer.send_offsets(group, {tp: Committed(b + 1)}))
                yield from me.commit()
                self.event(f"{inc} committed its part of batch {b}")
            driver.done.add(u)
        except Crash:
            me.alive = False
            if driver.alive and not me.zombie and not me.src.unlive:  # else: a successor runs
                self.spawn(self.unit_attempt(driver, u, b), 10 + rng.randrange(100))

    # -- the stage -----------------------------------------------------------------------

    def stage_incarnation(self, st: Source) -> Gen:
        """One incarnation of the stage (``acker/stage.py``): take its transactional id
        (fencing its predecessor, aborting what it left open), Register, resume from its
        group's committed input positions, then per batch: the outputs (0-2 per input,
        fixed by the input), RCV of the inputs, the input positions, one commit.  It
        crashes, pauses and freezes as a zombie like a source, and always restarts (no
        time of its segments terminates without it)."""
        rng = self.rng
        st.incarnations += 1
        inc = f"{st.name}.{st.incarnations}"
        previous, st.current = st.current, inc
        if previous:
            st.unlive.add(previous)
        writer = self.log.transactional_writer(st.txid, timeout_ms=TXN_TIMEOUT_MS)
        tracker = Tracker(self.config, OUT, st.name, inc, self.tracked, STAGE,
                          inherited_times=True)
        me = StageRun(self, st, inc, writer, tracker, lambda: self.stage_incarnation(st))
        tps = [(DATA, p) for p in range(DATA_PARTITIONS)]
        try:
            yield from me.commit()  # the Register, before any report
            while True:
                try:
                    got = self.log.committed_offsets(STAGE_GROUP, tps)
                    break
                except BrokerError:  # an open transaction's offsets: wait for its end
                    yield 50
            reader = self.log.reader(committed=True, name=inc)
            starts = {tp: got[tp].offset if tp in got else 0 for tp in tps}
            reader.assign(starts)
            self.event(f"{inc} starts: input from {[starts[tp] for tp in tps]}")
            while True:
                yield 5 + rng.randrange(40)
                batch = reader.poll(0, rng.randint(1, 4))
                if not batch:  # an idle stage waits in its poll (no fault is drawn)
                    yield IDLE_POLL_MS
                    continue
                yield from me.point("after a poll")
                positions: dict[tuple[str, int], Committed] = {}
                for r in batch:
                    positions[(DATA, r.partition)] = Committed(r.offset + 1)
                    _, e, _, tid, key, ts = data_value(r)
                    kt = self.key_time(key, int(e), int(ts))
                    for j in range(int(tid) % 3):
                        yield from me.point("before produce")
                        me.emit(r, j, int(e), kt)
                    tracker.received((s, int(e), int(tid)) for s in SUBS)
                    if kt is not None:
                        tracker.received([(self.tracked[-1], kt, int(tid))])
                if "stage_offsets_apart" in AckerCore.reintroduced:  # BUG SWITCH (stage)
                    yield from me.commit()  # the outputs and reports alone, then the offsets
                me.begin()
                me.call("send offsets", lambda p=positions: writer.send_offsets(STAGE_GROUP, p))
                yield from me.commit()
        except Crash:
            me.alive = False
            st.unlive.add(inc)
            if st.current != inc:
                return  # a newer incarnation runs already (we were a zombie)
            self.stats["restarts"] += 1
            self.spawn(self.stage_incarnation(st), 20 + rng.randrange(400))


class Process:
    """A writer's process in the simulation: its faults (:meth:`point`), its liveness
    (paused, a zombie) and its heartbeats."""

    agent: Any
    """Its tracker's agent (what its heartbeats say)."""
    in_txn: bool

    def __init__(self, sim: Sim, src: Source, inc: str, respawn: Callable[[], Gen]) -> None:
        self.sim = sim
        self.respawn = respawn
        """A new incarnation of the same id (a zombie's successor)."""
        self.src = src
        self.inc = inc
        self.in_txn = False
        self.alive = True
        self.paused = False
        self.zombie = False
        self.last_commit = sim.now()

    def point(self, where: str) -> Gen:
        """A step that can fail: a crash, a long pause, or a freeze as a zombie."""
        sim, rng = self.sim, self.sim.rng
        if self.src.guarded:
            return
        if sim.fault(0.02):
            sim.stats["crashes"] += 1
            sim.event(f"{self.inc} crashes {where}" + (" inside its transaction"
                                                       if self.in_txn else ""))
            raise Crash()
        if sim.fault(0.02):
            sim.stats["pauses"] += 1
            pause = TIMEOUT_MS + 100 + rng.randrange(TIMEOUT_MS // 2)
            self.src.unlive.add(self.inc)
            sim.event(f"{self.inc} pauses {pause} ms {where}")
            self.paused = True
            yield pause
            self.paused = False
            sim.event(f"{self.inc} resumes")
        if sim.fault(0.006):
            sim.stats["zombies"] += 1
            self.src.unlive.add(self.inc)
            sim.event(f"{self.inc} freezes {where}; a new incarnation takes over")
            self.paused = True
            takeover = 10 + rng.randrange(200)  # its successor takes the id (fences it) then
            self.src.guarded = not sim.idle_zombies
            sim.spawn(self.respawn(), takeover)
            yield takeover + 1 + rng.randrange(2 * TIMEOUT_MS)
            self.paused = False
            self.zombie = True
            sim.event(f"{self.inc} thaws (a zombie)")
            if rng.random() < 0.5:
                while True:  # idle for good: only its heartbeats speak
                    yield 10 * TIMEOUT_MS
            yield rng.randrange(2 * TIMEOUT_MS)

    def heartbeats(self) -> Gen:
        """The heartbeat thread: alive and idle for a heartbeat interval -> one per
        registered acks partition, outside any transaction."""
        out = self.sim.log.writer()
        while self.alive:
            now = self.sim.now()
            if not self.paused and now - self.last_commit >= SOURCE_HEARTBEAT_MS:
                value = encode_ack(self.agent.heartbeat_message())
                for p in sorted(self.agent.partitions):
                    out.produce(ACKS, p, value, headers=self.agent.headers)
                self.last_commit = now
            # the thread looks every quarter interval: wake at the first look that is due
            due = self.last_commit + SOURCE_HEARTBEAT_MS - now
            quarter = SOURCE_HEARTBEAT_MS // 4
            yield max(quarter, -(-due // quarter) * quarter)



class Incarnation(Process):
    """A hand-written writer's process (a stage, a Spark driver or unit task): its
    transactional writer and tracker driven directly, as their code does."""

    def __init__(self, sim: Sim, src: Source, inc: str, writer: MemoryTransactionalWriter,
                 tracker: Tracker, respawn: Callable[[], Gen]) -> None:
        super().__init__(sim, src, inc, respawn)
        self.writer = writer
        self.tracker = tracker
        self.agent = tracker.agent
        self.epochs: list[int] = []
        """Epochs of the records produced in the open transaction."""
        self.tids: list[int] = []
        """Their tracking ids."""
        self.ktimes: list[Keyed] = []
        """Their times in the keyed substream (with one)."""

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        """A transactional call: a fence ends this incarnation (a zombie's must fail)."""
        try:
            out = fn()
        except FencedError:
            self.sim.event(f"{self.inc}: {what} fenced")
            raise Crash() from None
        if self.zombie and what in ("produce", "produce acks", "send offsets", "commit"):
            self.sim.violations.append(
                f"zombie: fenced incarnation {self.inc}'s {what} returned normally"
            )
        return out

    def begin(self) -> None:
        if not self.in_txn:
            self.call("begin", self.writer.begin)
            self.in_txn = True

    def times(self, e: int, kt: Keyed | None) -> dict[str, Time]:
        """A record's times: epoch ``e`` in SUBS, ``kt`` in the keyed substream."""
        out: dict[str, Time] = dict.fromkeys(SUBS, e)
        if kt is not None:
            out[self.sim.tracked[-1]] = kt
        return out

    def _times_column(self) -> list[Keyed | None]:
        return list(self.ktimes) if self.ktimes else [None] * len(self.epochs)

    def report(self, delivered: list[Record]) -> None:
        """The delivery reports of the transaction's records."""

    def truth(self, delivered: list[Record], now: int) -> None:
        """The ground truth of a commit that returned."""

    def commit(self, last: bool = False) -> Gen:
        """Report what was delivered, write the tracker's messages, commit (``last``: the
        publisher's final commit, with the Unregister)."""
        sim, rng = self.sim, self.sim.rng
        yield from self.point("before commit")
        self.begin()
        delivered = self.call("flush", self.writer.flush)
        if delivered:
            self.report(delivered)
        for w in self.tracker.before_commit(last):
            self.call("produce acks", lambda w=w: self.writer.produce(
                w.topic, w.partition, w.value, headers=w.headers))
        yield rng.randrange(30)  # the transaction is open: it holds the LSO meanwhile
        yield from self.point("after produce, before commit")
        self.call("commit", self.writer.commit)
        self.in_txn = False
        self.src.guarded = False
        now = sim.now()
        self.last_commit = sim.last_commit_at = now
        sim.stats["commits"] += 1
        self.truth(delivered, now)
        sim.event(f"{self.inc} committed epochs {sorted(set(self.epochs))}")
        epochs, self.epochs, self.tids = self.epochs, [], []
        self.ktimes = []
        if sim.fault(0.01):
            sim.stats["crashes"] += 1
            sim.event(f"{self.inc} crashes right after its commit returned")
            raise Crash()
        if epochs and max(epochs) > sim.seen_max.get(self.src.name, -1):
            sim.seen_max[self.src.name] = max(epochs)


class SourceRun(Process):
    """A source incarnation's process: a real :class:`Publisher` over the log (through
    :class:`MemoryProducers`), tracked by the real :class:`Tracker` -- what it writes in which
    transaction, its seals, flush, close and fencing are the publisher's own.  The simulation
    only adds the faults (its producer's call hook raises :class:`Crash` where the process
    dies) and watches its commits as a hook of the publisher (the ground truth)."""

    wants_send = False
    wants_delivery = True
    """As a publisher hook: the transaction's records with their offsets (the truth)."""

    def __init__(self, sim: Sim, src: Source, inc: str, respawn: Callable[[], Gen]) -> None:
        super().__init__(sim, src, inc, respawn)
        self.pub: Publisher | None = None
        self.dead = False
        """Crashed: every later producer call of this process raises :class:`Crash`."""
        self.recovering = False
        self.records: list[tuple[int, int, Mapping[str, Time]]] = []
        """The open transaction's records: (partition, offset, times)."""
        self.seals: list[tuple[str, Time, bool]] = []
        """Seals for the next commit: (substream, time, every key)."""
        self.returned: list[int] = []
        """The epochs of the last commit (the caller sees them once its call returns)."""

    # -- the publisher --------------------------------------------------------------------

    def start(self) -> None:
        """Build the publisher (as :meth:`Application.publisher` does, with the simulation's
        log, clock and a tracker of this incarnation; heartbeats are :meth:`heartbeats`)."""
        sim = self.sim
        pub = Publisher(
            sim.source_config, DATA, self.src.name, bootstrap=f"sim/{self.inc}",
            batch_size=1 << 30, mechanisms={"acker": self._tracker},
            producers=MemoryProducers(sim.log, self.on_call), schemas=_no_schema_registry,
            clock=sim.clock, rng=random.Random(f"{sim.seed}/{self.inc}"),
            producer_overrides={"transaction.timeout.ms": TXN_TIMEOUT_MS},
        )
        pub.add_hook(self)
        self.pub = pub

    def _tracker(self, pub: Publisher, names: list[str]) -> Tracker:
        tracker = Tracker(pub.config, pub.stream, pub.source_id, self.inc, names, SOURCE,
                          writer=transactional_id(pub.stream, pub.source_id))
        self.agent = tracker.agent
        return tracker

    def on_call(self, what: str, when: str) -> None:
        """The producer's call hook: a dead process calls nothing; a commit that reached the
        log is the ground truth; the faults at :data:`SOURCE_FAULTS`."""
        sim = self.sim
        if self.dead:
            raise Crash()
        if when == "after" and self.zombie and not self.recovering and what in (
                "produce", "commit", "send_offsets"):
            sim.violations.append(
                f"zombie: fenced incarnation {self.inc}'s {what} returned normally")
        if (what, when) == ("commit", "after"):
            self.committed()
        p = SOURCE_FAULTS.get((what, when))
        if p is not None and not self.src.guarded and sim.fault(p):
            sim.stats["crashes"] += 1
            returned = " (returned to the log, not to its caller)" if what == "commit" and \
                when == "after" else ""
            sim.event(f"{self.inc} crashes {when} {what}{returned}"
                      + (" inside its transaction" if self.in_txn else ""))
            self.dead = True
            raise Crash()

    def die(self) -> None:
        """The process is gone: nothing more of it reaches the log, and what it held in
        this (simulated) process goes with it."""
        self.alive = False
        self.dead = True
        if self.pub is not None:
            with contextlib.suppress(Crash):
                self.pub.abort()  # refused by the call hook; releases the source id here

    def call(self, fn: Callable[[], Any]) -> Any:
        """A publisher call: fenced -> this incarnation ends (a zombie's must be)."""
        try:
            return fn()
        except PublisherFencedError:
            self.sim.event(f"{self.inc}: fenced")
            if self.zombie and self.seals and "zombie_seal" in AckerCore.reintroduced:
                return self._recover()  # BUG SWITCH (publisher)
            raise Crash() from None

    def _recover(self) -> None:
        """The re-introduced bug: a fenced seal "recovers" -- a new publisher of the same
        incarnation takes the transactional id again (fencing its successor) and commits
        the seals with a new tracker (sequence numbers from 1 again) -- and returns
        normally."""
        assert self.pub is not None
        seals, self.seals = self.seals, []
        self.pub.abort()
        self.records = []
        self.recovering = True
        self.start()
        for sub, t, every_key in seals:
            if every_key:
                assert type(t) is int
                self.seal_upto(sub, t)
            else:
                self._seal(sub, t)
        self.pub.flush()
        self.recovering = False
        self.sim.event(f"{self.inc}: its seal recovered from the fence and returned normally")

    def publish(self, e: int, k: int, key: str) -> None:
        """Record ``k`` of epoch ``e`` (of key ``key`` in the keyed substream, at an event
        time of the epoch), to a random data partition."""
        sim = self.sim
        p = sim.rng.randrange(DATA_PARTITIONS)
        ts = EVENT_MS * e + sim.krng.randrange(EVENT_MS) if sim.keyed == SESSION else 0
        times: dict[str, Time] = dict.fromkeys(SUBS, e)
        kt = sim.key_time(key, e, ts)
        if kt is not None:
            times[sim.tracked[-1]] = kt
        payload = {"inc": self.inc, "e": e, "k": k, "key": key, "ts": ts}
        assert self.pub is not None
        pub = self.pub
        self.call(lambda: pub.publish(payload, partition=p, times=times))
        self.in_txn = True

    def _seal(self, sub: str, t: Time) -> None:
        assert self.pub is not None
        pub = self.pub
        self.call(lambda: pub.seal(sub, t, commit=False))
        self.seals.append((sub, t, False))
        self.in_txn = True

    def seal_upto(self, sub: str, upto: int) -> None:
        assert self.pub is not None
        pub = self.pub
        self.call(lambda: pub.seal_keys(sub, upto, commit=False))
        self.seals.append((sub, upto, True))
        self.in_txn = True

    def seal(self, sub: str, e: int) -> None:
        self._seal(sub, e)

    def seal_key(self, key: str, e: int) -> None:
        """Key ``key`` is done at epoch ``e`` (its times in the keyed substream up to it)."""
        sim = self.sim
        assert sim.keyed is not None
        sim.stats["key_seals"] += 1
        self._seal(sim.keyed, Keyed(key, e if sim.keyed == KEYED else EVENT_MS * e + EVENT_MS - 1))

    def seal_keys(self, e: int) -> None:
        """Every key is done up to epoch ``e`` (the keyed seal: the source's watermark)."""
        sim = self.sim
        assert sim.keyed is not None
        self.seal_upto(sim.keyed, e if sim.keyed == KEYED else EVENT_MS * e + EVENT_MS - 1)

    def flush(self) -> Gen:
        """``Publisher.flush()``; once it returned, the caller knows its epochs committed."""
        yield from self.point("before commit")
        assert self.pub is not None
        self.call(self.pub.flush)
        self.saw()

    def close(self) -> Gen:
        """``Publisher.close()``: the last commit, with the Unregister."""
        yield from self.point("before commit")
        assert self.pub is not None
        self.call(self.pub.close)
        self.saw()

    def saw(self) -> None:
        sim, epochs = self.sim, self.returned
        self.returned = []
        if epochs and max(epochs) > sim.seen_max.get(self.src.name, -1):
            sim.seen_max[self.src.name] = max(epochs)

    # -- the ground truth: a hook of the publisher ----------------------------------------

    def sent(self, records: Sequence[SentRecord]) -> None:
        pass

    def delivered(self, records: Sequence[SentRecord], partitions: Sequence[int],
                  offsets: Sequence[int], times: Mapping[str, Sequence[Time]]) -> None:
        self.records.extend(
            (p, o, r.times) for r, p, o in zip(records, partitions, offsets, strict=True))

    def before_commit(self, last: bool) -> Sequence[Write]:
        return ()

    def ended(self, how: Ending) -> None:
        if how == "aborted":
            self.records, self.seals = [], []

    def committed(self) -> None:
        """A commit of this publisher reached the log (its caller may yet not see it)."""
        sim = self.sim
        now = sim.now()
        self.in_txn = False
        self.src.guarded = False
        self.last_commit = sim.last_commit_at = now
        sim.stats["commits"] += 1
        records, self.records = self.records, []
        seals, self.seals = self.seals, []
        epochs = [times[SUBS[0]] for _, _, times in records]
        for (p, o, _), t in zip(records, epochs, strict=True):
            assert type(t) is int
            sim.commit_at[(p, o)] = now
            for sub in SUBS:
                notes = sim.notes[sub]
                if not notes or t > notes[-1].time:  # else: refused, in no notification
                    sim.pending[sub].add(t)
            if t > sim.committed_max.get(self.src.name, -1):
                sim.committed_max[self.src.name] = t
        if sim.keyed:
            pending, last = sim.pending[sim.keyed], sim.key_last
            for _, _, times in records:
                kt = times[sim.keyed]
                assert type(kt) is Keyed and type(kt.time) is int
                if kt.time > last.get(kt.key, -1):  # else: refused, in no notification
                    pending.add(kt)
            if sim.keyed == KEYED:  # a seal of one key's time opens it
                for sub, st, every_key in seals:
                    if sub == KEYED and not every_key and isinstance(st, Keyed):
                        assert type(st.time) is int
                        sim.key_sealed.add((self.inc, st))
                        if st.time > last.get(st.key, -1):
                            pending.add(st)
        sim.event(f"{self.inc} committed epochs {sorted(set(epochs))}")
        self.returned = [int(t) for t in epochs]

class SparkDriver(Incarnation):
    """The driver's process: no records of its own (its seals, and markers on the commit
    topic)."""

    done: set[int]
    """The units whose task of the current batch reported its part committed."""
    kill_tasks = False
    """Its crash took its running tasks with it."""

    def report(self, delivered: list[Record]) -> None:
        pass

    def truth(self, delivered: list[Record], now: int) -> None:
        pass


class SparkUnit(Incarnation):
    """A unit task attempt's process: rows of RES at the batch's time, delivered (RES is
    terminal), no seals."""

    batch = -1
    driver: SparkDriver

    def point(self, where: str) -> Gen:
        """A task of a dead driver that took its tasks with it dies at its next step."""
        if not self.driver.alive and self.driver.kill_tasks:
            raise Crash()
        yield from super().point(where)

    def row(self, b: int, u: int, j: int) -> None:
        self.begin()
        tid = self.sim.rng.getrandbits(63) | 1
        p = self.sim.rng.randrange(RES_PARTITIONS)
        value = f"{self.inc}/{b}/{u}/{j}".encode()
        self.call("produce", lambda: self.writer.produce(RES, p, value))
        self.epochs.append(b)
        self.tids.append(tid)

    def report(self, delivered: list[Record]) -> None:
        records = [SentRecord(RES, r.partition, 0, tid, {Q: t})
                   for t, tid, r in zip(self.epochs, self.tids, delivered, strict=True)]
        self.tracker.delivered(
            records, [r.partition for r in delivered], [r.offset for r in delivered], {},
        )

    def truth(self, delivered: list[Record], now: int) -> None:
        sim = self.sim
        for r in delivered:
            sim.res_commit_at[(r.partition, r.offset)] = now
        if delivered:
            sim.pending[Q].add(self.batch)


class StageRun(Incarnation):
    """A stage incarnation's process: outputs to OUT with the input's times, delivered
    (OUT is terminal), no seals, no heartbeats (the acker waits for no stage)."""

    def emit(self, r: Record, j: int, e: int, kt: Keyed | None) -> None:
        """Output ``j`` of input ``r`` (value: input partition:offset/j/epoch/tracking id),
        at the input's times."""
        self.begin()
        tid = self.sim.rng.getrandbits(63) | 1
        p = r.partition % OUT_PARTITIONS
        value = f"{r.partition}:{r.offset}/{j}/{e}/{tid}".encode()
        self.call("produce", lambda: self.writer.produce(OUT, p, value))
        self.epochs.append(e)
        self.tids.append(tid)
        if kt is not None:
            self.ktimes.append(kt)

    def report(self, delivered: list[Record]) -> None:
        records = [SentRecord(OUT, r.partition, 0, tid, self.times(t, kt))
                   for t, tid, kt, r in zip(self.epochs, self.tids, self._times_column(),
                                            delivered, strict=True)]
        self.tracker.delivered(
            records, [r.partition for r in delivered], [r.offset for r in delivered], {},
        )

    def truth(self, delivered: list[Record], now: int) -> None:
        sim = self.sim
        sim.stats["stage_commits"] += 1
        for r in delivered:
            sim.out_commit_at[(r.partition, r.offset)] = now


class AckerShell:
    """What :class:`AckerService` does around the core, over the in-memory log."""

    def __init__(self, sim: Sim, parts: tuple[int, ...], name: str) -> None:
        self.sim = sim
        self.name = name
        self.parts = parts
        self.home = sim.home
        self.subs = [s for s in sim.subs if self.home[s] in parts]
        self.changelog: list[bytes] = []
        """The state bytes of every checkpoint record committed (the checkpoint topic)."""
        self.offsets: dict[int, int] = {}
        """The acks offsets of the last commit (its checkpoint records carry them)."""
        self.statelog: StateLog | None = None
        self.alive = False
        self.invariant_broken = False
        self.core = self._core()
        self.reader: MemoryReader = sim.log.reader()

    def _core(self) -> AckerCore:
        base: int | None = None
        if not self.changelog:
            state = AckerState()
        else:  # what the service's recovery does: from the base's first chunk on
            base = base_of(self.changelog[-1])
            assert base is not None
            first = max(i for i, r in enumerate(self.changelog) if is_first_chunk(r, base))
            state, base = restore(self.changelog[first:], dict(self.offsets), SNAPSHOT_EVERY)
        self.statelog = StateLog.adopt(state, base)
        self.statelog.record_bytes = 3_000
        self.statelog.snapshot_min_bytes = 4_000
        self.statelog.small_entries = 0
        for sub in self.subs:
            state.ensure(sub, SNAPSHOT_EVERY, self.sim.gap if sub == SESSION else None)
        return AckerCore(
            self.name, self.parts, self.home, {s: f"_control.{s}" for s in self.subs},
            acks_partitions=self.sim.acks_partitions, source_timeout_ms=TIMEOUT_MS,
            heartbeat_ms=ACKER_HEARTBEAT_MS, state=state,
        )

    def start(self) -> None:
        """Start (or restart) from the last checkpoint: a new core, the acks read from
        the checkpointed offsets."""
        self.core = self._core()
        self.core.started(self.sim.now())
        self.reader = self.sim.log.reader(committed=True, name="acker")
        self.reader.assign({(ACKS, p): self.core.state.acks_offsets.get(p, 0)
                            for p in self.parts})
        self.evictions: list[tuple[Evict, list[int | None]]] = []
        """Evictions whose fence runs (a restart drops them: the new core starts afresh)."""
        self.refused: list[tuple[str, Keyed]] = []
        """Keyed reports refused as late since the last commit (lost with a crash)."""
        self.held: set[tuple[str, int]] = set()
        """(incarnation, partition) of the sessions this core held."""
        self.alive = True

    def run(self) -> Gen:
        sim, rng = self.sim, self.sim.rng
        self.start()
        while True:
            busy = True
            try:
                busy = self.step()
            except Crash:
                self.alive = False
                sim.stats["acker_crashes"] += 1
                sim.event(f"{self.name} crashes")
                yield 20 + rng.randrange(300)
                self.start()
                sim.event(f"{self.name} restarts from its last checkpoint")
            # the service's poll waits up to 50 ms for a message: an idle acker steps then
            yield 10 + rng.randrange(50) if busy else IDLE_POLL_MS

    def _last_terminated(self, p: int) -> dict[str, int]:
        """Per substream on acks partition ``p``, its last time terminated (in the core,
        committed or not)."""
        out: dict[str, int] = {}
        for sub in self.sim.subs:
            if self.home[sub] == p and sub != self.sim.keyed:
                last = self.core.state.last_notification.get(sub)
                t = -1 if last is None else last[0]
                assert isinstance(t, int)  # epoch substreams
                out[sub] = t
        return out

    def caught_up(self) -> bool:
        """Running, and every message written to its partitions read (once the open
        transactions ended: what a dead writer holds is aborted by a fence or a timeout)."""
        if not self.alive:
            return False
        high = self.sim.log.end_offsets(ACKS, self.parts, committed=False)
        return all(self._position(p) >= high[p] for p in self.parts)

    def _position(self, p: int) -> int:
        return self.reader.positions.get((ACKS, p), self.core.state.acks_offsets.get(p, 0))

    def step(self) -> bool:
        """:meth:`AckerService.step`: poll, apply, collect the fences that finished,
        liveness, tick, carry out (fences start off the loop), commit."""
        sim, core, log = self.sim, self.core, self.sim.log
        sim.stats["steps"] += 1
        now = sim.now()
        joined, sessions = sim.joined, core.state.sessions
        polled = self.reader.poll(0, 200)
        keyed = sim.keyed if sim.keyed in self.subs else None
        for rec in polled:
            refusals = core.apply(rec.partition, rec.offset, rec.value or b"", rec.headers, now)
            for r in refusals:
                if r.reason == REASON_TERMINATED or (keyed and "already terminated" in r.detail):
                    ack = decode_ack(rec.value or b"", rec.headers)
                    if r.reason == REASON_TERMINATED:
                        sim.terminated_refused.add(ack.incarnation)
                    for sub, key, t in _LATE_KEYED.findall(r.detail):
                        if sub == keyed:
                            self.refused.append((ack.incarnation, Keyed(key, int(t))))
            # a new session: when it joined (per message: a later Register in the same poll
            # may replace it)
            for (_, p), session in sessions.items():
                if (session.incarnation, p) not in joined:
                    joined[(session.incarnation, p)] = self._last_terminated(p)
                if keyed and (session.incarnation, p) not in self.held:
                    self.held.add((session.incarnation, p))
                    if p == sim.home[keyed]:
                        table = core.state.tables[keyed]
                        floor = max((f for f in (table.keyed_floor(), table.forgotten)
                                     if f is not None), default=None)
                        sim.key_joined.setdefault(session.incarnation, []).append(
                            (tuple(table.terminated.elements()), floor))
        self._collect()
        positions = {p: self._position(p) for p in self.parts}
        if core.probe_due(now):
            stable = log.end_offsets(ACKS, self.parts, committed=True)
            high = log.end_offsets(ACKS, self.parts, committed=False)
            for p in self.parts:
                core.probed(p, now, positions[p], stable[p], high[p])
            for blocker in core.to_name(now):
                self._name(blocker)
        effects = core.tick(now, positions)
        self._check_invariants()
        for f in effects.fence:
            sim.stats["fences"] += 1
            sim.spawn(self._fence_io(f.writer, f.why, None, [None]))
        for e in effects.evict:
            slot: list[int | None] = [None]
            self.evictions.append((e, slot))
            sim.spawn(self._fence_io(e.writer, e.reason, e.key[1], slot))
        evicted = [(key, core.state.sessions[key].incarnation) for key, *_ in effects.evicted]
        items = list(effects.records)
        heartbeat = core.heartbeat_due(now)
        if not items and not heartbeat:
            return bool(polled)
        if heartbeat:
            items.extend(core.heartbeat_records())
        core.state.checkpoints += 1
        assert self.statelog is not None and self.statelog.state is core.state
        records = self.statelog.records()  # the changelog moved on (a snapshot chunk, ...)
        if sim.fault(0.004):
            raise Crash()  # before the commit: the step's work is lost, replayed
        self.changelog.extend(records)
        self.statelog.committed()
        self.offsets = dict(core.state.acks_offsets)
        core.committed(now)
        if self.refused:
            sim.key_refused.update(self.refused)
            self.refused = []
        for _, body in items:
            for c in completions(body):
                self._notified(c.substream, c.time, c.until, c.records, c.ranges, now)
        for key, inc in evicted:
            self._evicted(key, inc)
        if sim.fault(0.004):
            raise Crash()
        return True

    def _check_invariants(self) -> None:
        """Every stated invariant of the core's state after every step (the core's, its
        tables', the liveness'): a broken one is a violation (the first, once per acker),
        and the schedule runs on so that the checker can judge what it led to."""
        try:
            self.core.check_invariants()
        except AssertionError as exc:
            if not self.invariant_broken:
                self.invariant_broken = True
                self.sim.violations.append(f"invariant: {self.name} at {self.sim.now()} ms: {exc}")

    def _fence_io(self, writer: str, why: str, partition: int | None,
                  slot: list[int | None]) -> Gen:
        """A fence off the loop (``AckerService._fence_for``): it takes simulated time,
        the acker and the sources run on meanwhile; for an eviction, then the partition's
        high watermark, into ``slot`` for :meth:`_collect`."""
        sim = self.sim
        yield 10 + sim.rng.randrange(300)
        if writer:
            sim.log.fence(writer)
        if partition is None:
            sim.event(f"{self.name} fenced {writer} ({why})")
            return
        committed = "evict_at_lso" in AckerCore.reintroduced  # BUG SWITCH (rule 6)
        slot[0] = sim.log.end_offsets(ACKS, [partition], committed=committed)[partition]
        sim.event(f"{self.name} evicting on acks partition {partition} ({why}): fenced "
                  f"{writer}, reads to {slot[0]}")

    def _collect(self) -> None:
        """``AckerService._collect``: hand the core the evictions whose fence finished."""
        pending = []
        for e, slot in self.evictions:
            if slot[0] is None:
                pending.append((e, slot))
            else:
                self.core.fenced(e.key, slot[0])
        self.evictions = pending

    def _name(self, blocker: Blocker) -> None:
        rec = self.sim.log.record_at(ACKS, blocker.partition, blocker.offset)
        if rec is None:
            self.core.named_record(blocker, None, None)
        else:
            self.core.named_record(blocker, rec.value or b"", rec.headers)

    def _notified(self, sub: str, time: Any, until: Any, records: int, ranges: Any,
                  now: int) -> None:
        sim = self.sim
        sim.notes[sub].append(
            Note(sub, time, records, [(r.stream, r.partition, r.start, r.end) for r in ranges],
                 now, until)
        )
        sim.stats["notifications"] += 1
        if sub == sim.keyed:
            sim.stats["key_notes"] += 1
            end = until if until is not None else time
            assert isinstance(time, Keyed) and isinstance(end, Keyed)
            assert type(time.time) is int and type(end.time) is int
            if end.time > sim.key_last.get(end.key, -1):
                sim.key_last[end.key] = end.time
            pending = sim.pending[sub]  # every time of the key up to it: notified or late
            for t in [t for t in pending if t.key == end.key and t.time <= end.time]:
                pending.discard(t)
            span = f"{time}..{end.time}" if until is not None else f"{time}"
            sim.event(f"{self.name} notifies {sub}@{span}: {records} records")
            return
        assert isinstance(time, int)
        sim.pending[sub].discard(time)
        sim.event(f"{self.name} notifies {sub}@{time}: {records} records")

    def _evicted(self, key: tuple[str, int], inc: str) -> None:
        sim = self.sim
        sim.stats["evictions"] += 1
        sim.event(f"{self.name} evicted {inc} on acks partition {key[1]}")
        src = next(s for s in [*sim.sources, sim.stage, sim.driver] if s.name == key[0])
        if inc not in src.unlive:
            sim.violations.append(
                f"live source evicted: {inc} (never crashed, paused or fenced) evicted on "
                f"acks partition {key[1]}"
            )


# -- checks ----------------------------------------------------------------------------------


def _read_all(sim: Sim, topic: str, partitions: int) -> list[Record]:
    reader = sim.log.reader(committed=True, name="check")
    reader.assign({(topic, p): 0 for p in range(partitions)})
    out: list[Record] = []
    while True:
        got = reader.poll(0, 10_000)
        if not got:
            return out
        out.extend(got)


def _committed(sim: Sim) -> dict[tuple[int, int], tuple[str, int, int]]:
    """Every committed data record, read ``read_committed`` once every transaction ended:
    (partition, offset) -> (incarnation, epoch, tracking id)."""
    sim.clock.advance_ms(TXN_TIMEOUT_MS + 1)  # the coordinator aborts what is still open
    out: dict[tuple[int, int], tuple[str, int, int]] = {}
    once: dict[tuple[str, str, str], str] = {}
    for r in _read_all(sim, DATA, DATA_PARTITIONS):
        inc, e, k, tid, key, ts = data_value(r)
        out[(r.partition, r.offset)] = (inc, int(e), int(tid))
        kt = sim.key_time(key, int(e), int(ts))
        if kt is not None:
            sim.key_times[(r.partition, r.offset)] = kt
        key = (inc.rsplit(".", 1)[0], e, k)
        if key in once:  # a restart must resume after what its source committed
            sim.violations.append(f"doubled: {key[0]} epoch {e} record {k} committed by "
                                  f"{once[key]} and {inc}")
        once[key] = inc
    return out


def _check_stage(sim: Sim, committed: dict[tuple[int, int], tuple[str, int, int]]
                 ) -> dict[tuple[int, int], tuple[int, int]]:
    """Stage outputs exactly once: an input below the group's committed position has
    exactly its outputs (``tid % 3``, each once), one at or past it none; no output of an
    input that is not committed; every output committed by a commit that returned.
    Returns the committed outputs: (partition, offset) -> the input's (partition, offset)."""
    v = sim.violations
    tps = [(DATA, p) for p in range(DATA_PARTITIONS)]
    group = sim.log.committed_offsets(STAGE_GROUP, tps)
    outs: dict[tuple[int, int], tuple[int, int]] = {}
    per_input: dict[tuple[int, int], list[int]] = {}
    for r in _read_all(sim, OUT, OUT_PARTITIONS):
        src, j, _, _ = (r.value or b"").decode().split("/")
        ip, io = src.split(":")
        where = (int(ip), int(io))
        outs[(r.partition, r.offset)] = where
        per_input.setdefault(where, []).append(int(j))
        if (r.partition, r.offset) not in sim.out_commit_at:
            v.append(f"commit: stage output {(r.partition, r.offset)} committed by no commit "
                     "that returned")
        if where not in committed:
            v.append(f"stage: output {(r.partition, r.offset)} of input {where}, which is "
                     "not committed")
    sim.stats["stage_outputs"] += len(outs)
    for where, (_, _, tid) in committed.items():
        done = where[1] < (group[(DATA, where[0])].offset if (DATA, where[0]) in group else 0)
        want = list(range(tid % 3)) if done else []
        got = sorted(per_input.get(where, []))
        if got != want:
            v.append(f"stage: input {where} ({'before' if done else 'at or past'} the group's "
                     f"position) has outputs {got}, not {want}")
    return outs


def check(sim: Sim) -> None:
    """The firm bound's guarantees over the finished schedule (appended to violations)."""
    v = sim.violations
    committed = _committed(sim)
    for where, (inc, _, _) in committed.items():
        if where not in sim.commit_at:
            v.append(f"commit: record {where} of {inc} committed by no commit that returned")
    outs = _check_stage(sim, committed) if sim.staged else {}
    stream, commit_at = (OUT, sim.out_commit_at) if sim.staged else (DATA, sim.commit_at)
    for sub in SUBS:
        by_time: dict[int, list[tuple[int, int]]] = {}
        due: set[int] = set()
        """Times with a committed record not excused: each must terminate."""
        for where, (inc, e, _) in committed.items():
            joined = sim.joined.get((inc, sim.home[sub]), {}).get(sub, -1)
            if inc in sim.terminated_refused and e <= joined:
                sim.stats["excused"] += 1  # joined after its time terminated: refused
            else:
                due.add(e)
                if not sim.staged:
                    by_time.setdefault(e, []).append(where)
        for out, where in outs.items():  # staged: the records are the stage's outputs
            inc, e, _ = committed.get(where, ("", -1, 0))
            joined = sim.joined.get((inc, sim.home[sub]), {}).get(sub, -1)
            if not (inc in sim.terminated_refused and e <= joined):
                by_time.setdefault(e, []).append(out)
        _check_notes(sim, sub, by_time, due, stream, commit_at)
    if sim.keyed:
        _check_keyed(sim, committed, outs)
    if sim.spark:
        _check_spark(sim)


def _check_records(sim: Sim, sub: str, n: Note, want: list[tuple[int, int]], at: str,
                   stream: str, commit_at: dict[tuple[int, int], int]) -> None:
    """Notification ``n`` holds exactly the committed records ``want`` (count, and each
    inside its offset ranges), and none of them committed after it."""
    v = sim.violations
    if n.records != len(want):
        v.append(f"exact: {sub}@{n.time} notified with {n.records} records; "
                 f"{len(want)} committed at {at}")
    for p, o in want:
        if not any(rs == stream and rp == p and lo <= o < hi for rs, rp, lo, hi in n.ranges):
            v.append(f"exact: {sub}@{n.time}: committed record {stream}{(p, o)} outside "
                     f"its ranges {n.ranges}")
            break
    late = [w for w in want if commit_at.get(w, 0) > n.at_ms]
    if late:
        v.append(f"early: {sub}@{n.time} notified at {n.at_ms - sim.t0} ms, before "
                 f"the commit of {stream}{late[0]} at {commit_at[late[0]] - sim.t0} ms")


def _check_notes(sim: Sim, sub: str, by_time: dict[int, list[tuple[int, int]]], due: set[int],
                 stream: str, commit_at: dict[tuple[int, int], int]) -> None:
    """``sub``'s notifications: in order and once; each with exactly the committed records
    of its time (``by_time``, of ``stream``), none before their commit; every time of
    ``due`` notified."""
    v = sim.violations
    notes = sim.notes[sub]
    times = [n.time for n in notes]
    for a, b in pairwise(times):
        if b <= a:
            v.append(f"order: {sub}@{b} notified after {sub}@{a}"
                     + (" (a duplicate)" if a == b else ""))
    for n in notes:
        _check_records(sim, sub, n, by_time.get(n.time, []), "that time", stream, commit_at)
    missing = sorted(due - set(times))
    if missing:
        v.append(f"terminates: {sub}@{missing} committed records but never terminated")


def _excused(sim: Sim, inc: str, t: Keyed) -> bool:
    """A keyed record refused by design: refused as late, at a time final when an acker
    first held its incarnation's session."""
    return (inc, t) in sim.key_refused and _final_at_join(sim, inc, t)


def _final_at_join(sim: Sim, inc: str, t: Keyed) -> bool:
    """``t`` had terminated (or was at or below the keyed floor) when an acker first held
    ``inc``'s session: a report there is late, a seal opens nothing."""
    assert type(t.time) is int
    return any(any(less_equal(t, u) for u in done) or (floor is not None and t.time <= floor)
               for done, floor in sim.key_joined.get(inc, ()))


def _check_keyed(sim: Sim, committed: dict[tuple[int, int], tuple[str, int, int]],
                 outs: dict[tuple[int, int], tuple[int, int]]) -> None:
    """The keyed substream's notifications (docs/design.md, "Keyed substreams with many
    sources"; the termination rule, :mod:`substreams.acker.table`): per key in order and
    once (keys are incomparable: each key's times terminate on their own, in order; a key's
    sessions in start order); each with exactly the committed records of its time (its
    session: the key's records from its first time to its last, consecutive ones at most
    the gap apart), inside its ranges, none before their commit; every committed record's
    time, and every time a source sealed one key at, terminated (every source ended: it
    unregistered or was evicted)."""
    v, sub = sim.violations, sim.keyed
    assert sub is not None
    for acker in sim.ackers:  # a running acker's refusals stand (nothing crashes it now)
        if acker.alive:
            sim.key_refused.update(acker.refused)
    stream, commit_at = (OUT, sim.out_commit_at) if sim.staged else (DATA, sim.commit_at)
    inputs: dict[Keyed, list[str]] = {}
    """Per keyed time, the incarnations of its data records not excused (staged: a time
    whose inputs have no output is still a time, notified with no records)."""
    records: dict[Keyed, list[tuple[int, int]]] = {}
    """Per keyed time, its records in ``stream`` (staged: the outputs of its inputs)."""
    excused: set[tuple[int, int]] = set()
    for where, (inc, _, _) in committed.items():
        t = sim.key_times[where]
        if _excused(sim, inc, t):
            sim.stats["key_excused"] += 1
            excused.add(where)
            continue
        inputs.setdefault(t, []).append(inc)
        if not sim.staged:
            records.setdefault(t, []).append(where)
    for out, where in outs.items():  # staged: the records are the stage's outputs
        if where in committed and where not in excused:
            records.setdefault(sim.key_times[where], []).append(out)
    due = set(inputs)
    by_key: dict[str, list[Note]] = {}
    for n in sim.notes[sub]:
        by_key.setdefault(n.time.key, []).append(n)
    for notes in by_key.values():
        for a, b in pairwise(notes):
            if b.time.time <= (a.until or a.time).time:
                v.append(f"order: {sub}@{b.time} notified after {sub}@{a.time}"
                         + (" (a duplicate)" if a.time == b.time else ""))
    for n in sim.notes[sub]:
        if sub == SESSION:
            want = _session_records(sim, n, inputs, records, by_key[n.time.key])
        else:
            want = records.get(n.time, [])
        _check_records(sim, sub, n, want, "its times" if n.until else "that time", stream,
                       commit_at)
    spans = {key: [(n.time.time, (n.until or n.time).time) for n in notes]
             for key, notes in by_key.items()}
    missing = sorted((t for t in due if not any(
        s <= t.time <= e for s, e in spans.get(t.key, ()))), key=repr)
    if missing:
        v.append(f"terminates: {sub}@{missing[:5]} committed records but never terminated")
    unsealed = sorted((t for inc, t in sim.key_sealed if t.time > sim.key_last.get(t.key, -1)
                       and not _final_at_join(sim, inc, t)), key=repr)
    if unsealed:
        v.append(f"terminates: {sub}@{unsealed[:5]} sealed for its key but never terminated")


def _session_records(sim: Sim, n: Note, inputs: dict[Keyed, list[str]],
                     records: dict[Keyed, list[tuple[int, int]]],
                     notes: list[Note]) -> list[tuple[int, int]]:
    """The records of session ``n`` (appends a violation if it is not a session of them:
    its first and last times not records', a gap wider than the schedule's inside it, or
    not the gap apart from the key's previous session unless every record that would have
    joined that session came from an incarnation that joined after it terminated)."""
    key, start, end = n.time.key, n.time.time, (n.until or n.time).time
    times = sorted(t.time for t in inputs if t.key == key and start <= t.time <= end)
    want = [w for t in times for w in records.get(Keyed(key, t), ())]
    if not times or [times[0], times[-1]] != [start, end] or len(
            run_members(times, sim.gap)) != 1:
        sim.violations.append(f"session: {sim.keyed}@{n.time}..{end} is not a session of its "
                              f"committed times {times} (gap {sim.gap})")
    i = notes.index(n)
    if i:
        before = notes[i - 1].until
        near = [inc for t in times if t - before.time <= sim.gap
                for inc in inputs[Keyed(key, t)]]
        if any(not _final_at_join(sim, inc, before) for inc in near):
            sim.violations.append(
                f"session: {sim.keyed}@{n.time}..{end} starts within the gap {sim.gap} of the "
                f"key's previous session, which ended at {before.time}")
    return want


def _check_spark(sim: Sim) -> None:
    """The query's output: each unit's part of a batch committed by one attempt (and, once
    the driver closed, by some attempt); substream Q's notifications exact (nothing is
    excused: a unit is never too late, its driver seals after it)."""
    v = sim.violations
    by_unit: dict[tuple[int, int], set[str]] = {}
    by_time: dict[int, list[tuple[int, int]]] = {}
    for r in _read_all(sim, RES, RES_PARTITIONS):
        inc, b, u, _ = (r.value or b"").decode().split("/")
        where = (r.partition, r.offset)
        if where not in sim.res_commit_at:
            v.append(f"commit: Spark row {where} of {inc} committed by no commit that returned")
        by_unit.setdefault((int(b), int(u)), set()).add(inc)
        by_time.setdefault(int(b), []).append(where)
    sim.stats["spark_rows"] += sum(map(len, by_time.values()))
    for (b, u), incs in sorted(by_unit.items()):
        if len(incs) > 1:
            v.append(f"spark: unit {u}'s part of batch {b} committed by {sorted(incs)}")
    if sim.driver.finished:
        for b in range(sim.driver.epochs):
            for u in range(sim.units):
                if (b, u) not in by_unit:
                    v.append(f"spark: unit {u}'s part of batch {b} never committed")
    _check_notes(sim, Q, by_time, set(by_time), RES, sim.res_commit_at)


def run_schedule(seed: int, bugs: frozenset[str] = frozenset(),
                 fault_limit: int | None = None, idle_zombies: bool = False) -> Result:
    """One schedule (``bugs`` switched on in the core for it)."""
    with reintroduced(bugs):
        return Sim(seed, fault_limit, idle_zombies=idle_zombies).run()


def first_check(violation: str) -> str:
    return violation.split(":", 1)[0]


def minimal(seed: int, bugs: frozenset[str], result: Result,
            idle_zombies: bool = False) -> Result:
    """The failing run with the fewest faults carried out that still fails the same check
    (the faults of a schedule are its prefix of events that matter)."""
    check_name = first_check(result.violations[0])
    for limit in range(result.faults + 1):
        shorter = run_schedule(seed, bugs, limit, idle_zombies)
        if any(first_check(x) == check_name for x in shorter.violations):
            shorter.stats["fault_limit"] = limit
            return shorter
    result.stats["fault_limit"] = result.faults
    return result


def trace(result: Result, limit: int = 80) -> list[str]:
    """The schedule's events, shortened to ``limit`` lines (the start and the end)."""
    lines = [f"{ms:>7} ms  {text}" for ms, text in result.events]
    if len(lines) > limit:
        head = limit // 4
        lines = [*lines[:head], f"    ... {len(lines) - limit} events ...",
                 *lines[-(limit - head):]]
    return lines
