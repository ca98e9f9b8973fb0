"""Which sources are silent, judged only on what the acker could read.  Pure: the acker's
clock and the broker's answers are passed in, decisions come out; the service does the I/O.

Why this is subtle: a ``read_committed`` reader of an acks partition reads up to its *last
stable offset* (LSO), the first offset of the oldest transaction still open there.  A writer
that dies inside a transaction holds the LSO until its transaction is aborted -- by a fence (a
producer with its transactional id) or by its coordinator after ``transaction.timeout.ms``.
Everything the other sources commit behind it is invisible until then: judged on the clock
alone they look silent, and are not.

Rules:

1. *Heard.*  A source is heard when the acker applies a message of its current incarnation
   (a report, a registration, a seal, a heartbeat); ``last_seen_ms`` is the acker's clock then.
2. *Read horizon.*  Each acks partition is probed every :func:`probe_interval_ms`: its high
   watermark as a ``read_uncommitted`` reader sees it (every write, committed or not).  The
   partition's *read horizon* is the time of the latest probe whose high watermark the acker's
   position has reached: whatever a source committed before it has been read.  A source's
   *proven silence* is ``horizon - last_seen_ms`` (no horizon yet: nothing is proven).
3. *Silent.*  A source whose proven silence exceeds ``source_timeout_ms`` is silent: evicted
   (its writer fenced first), or, if its Register asked never to be (a Spark query's driver),
   warned of.  While an open transaction holds the LSO the horizon stands still, so no source
   whose messages wait behind it is ever judged silent.
4. *Blocked.*  A partition whose LSO is below its high watermark while the acker has read up
   to the LSO is *blocked* by the transaction that begins at the LSO.  Its first message, read
   ``read_uncommitted``, names its source and incarnation (a Register also its writer).
5. *A silent blocker.*  A transaction that holds the same LSO for ``source_timeout_ms`` has a
   silent writer (a live publisher commits every batch and every seal).  If it is the current
   incarnation of a source of that partition, evictable for silence, it is evicted: the fence
   aborts its transaction and frees the LSO.  If it is a newer incarnation than the session's
   (it died inside its first transaction, its Register unread), its ``init_transactions``
   fenced the session's incarnation, which can commit nothing more -- though its process, an
   idle zombie, may heartbeat it alive forever: that session is evicted (the fence aborts the
   newer one's transaction too).  A writer the acker can name but holds no session of is
   fenced.  A blocker the
   acker cannot name (another program's transaction, an undecodable message) or may not evict
   (a never-evicted source) is reported, in the log and in the checkpoint that ``acker
   sources`` and the dashboard show, and waited out (its coordinator aborts it after
   ``transaction.timeout.ms``): never a reason to evict anyone else.
6. *No committed report dropped.*  An eviction takes effect only once the acker has read the
   partition up to the high watermark (``read_uncommitted``) taken *after* the fence: every
   message the incarnation committed before it was fenced is applied first, none is refused
   as stale.
7. *The acker's own stall* (no step for over two heartbeats: a broker outage, a long pause)
   is nobody's silence: every ``last_seen_ms`` moves on by it, and every hold's start (rule
   8).

A live source can hold windows back as surely as a silent one: it heartbeats but never
seals (a bug, a policy-less publisher left open, an idle one without ``idle_ms``).  Rules 1-7
never evict it, so:

8. *Holds.*  A registered SOURCE of a segment *holds* the segment's oldest open time it has
   not sealed (:meth:`~substreams.acker.table.SegmentTable.oldest_unsealed`), *since* that
   time was first seen -- or, if later, since this acker began watching the source there (a
   restarted acker, a source that registered after the time opened: neither counts what came
   before).  A hold of the same time keeps its start; a new oldest time starts afresh from
   its own first sighting (a source that seals but lags keeps its windows' ages).  A hold is
   reported whether or not anything is done about it: ``acker sources``, the dashboard and
   ``substreams_source_oldest_unsealed_age_seconds`` show it.
9. *Unsealed.*  With ``acker.unsealed_timeout_ms`` set (default: off), a hold is *overdue*
   when its proven length -- the read horizon of the segment's acks partition minus its
   start (rule 2: a seal committed before the horizon has been applied, so one waiting behind
   an open transaction or in the acker's backlog never counts against its source) -- exceeds
   the timeout.  Its source is then evicted as a silent one is (fenced first, rule 6), with
   the reason ``unsealed``; one registered as never evicted for silence (a Spark query's
   driver) is not, for the same reason (its output times hold its tasks' committed parts
   until it seals them): it is warned of, once per hold.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import pairwise

from substreams.acker.state import Blocker, Hold, SessionKey, SourceSession
from substreams.acker.table import SegmentTable

MAX_PROBES = 4096
"""Probes kept per partition while its horizon stands still (blocked for a long time): past
it the newest is overwritten, which only moves the horizon later (conservative)."""


def probe_interval_ms(source_timeout_ms: int) -> int:
    """A tenth of the timeout (silence is then judged at most ~10 % late), 100 ms to 1 s."""
    return max(100, min(1000, source_timeout_ms // 10))


@dataclass(frozen=True)
class Silent:
    """Rule 3: ``key``'s proven silence exceeded the timeout."""

    key: SessionKey
    silence_ms: int
    evict: bool
    """False: it registered as never evicted for silence (warn only)."""


@dataclass(frozen=True)
class SilentBlocker:
    """Rule 5: what to do about ``blocker``: evict the session ``key`` (its current
    incarnation), fence ``writer`` (no session), or nothing but report it."""

    blocker: Blocker
    key: SessionKey | None = None
    writer: str | None = None


Decision = Silent | SilentBlocker


class Liveness:
    """Read horizons and blockers of the acks partitions one acker reads (rules 2-5).

    Invariants: ``_probes[p]`` holds (probe time, high watermark) pairs in time order whose
    high watermark the position of ``p`` had not reached at the last :meth:`advance`, high
    watermarks non-decreasing; ``horizon[p]`` is the time of the latest probe it had reached;
    ``blockers[p]`` is the transaction found holding ``p``'s LSO at the last probe."""

    def __init__(self, source_timeout_ms: int) -> None:
        self.timeout_ms = source_timeout_ms
        self._probes: dict[int, deque[tuple[int, int]]] = {}
        self.horizon: dict[int, int] = {}
        self.blockers: dict[int, Blocker] = {}
        self._read: dict[int, int] = {}
        """The position of the last :meth:`advance` per partition (for the invariants)."""

    def advance(self, partition: int, position: int) -> None:
        """The acker has read ``partition`` up to ``position``: the horizon follows."""
        self._read[partition] = position
        probes = self._probes.get(partition)
        while probes and probes[0][1] <= position:
            self.horizon[partition] = probes.popleft()[0]

    def probed(self, partition: int, now: int, position: int, lso: int, high: int) -> None:
        """One probe's answer: the partition's LSO and high watermark, the acker's position."""
        probes = self._probes.setdefault(partition, deque())
        if probes and (probes[-1][1] == high or len(probes) >= MAX_PROBES):
            probes[-1] = (now, max(high, probes[-1][1]))
        else:
            probes.append((now, high))
        self.advance(partition, position)
        if not (position >= lso and lso < high):
            self.blockers.pop(partition, None)
            return
        held = self.blockers.get(partition)
        if held is None or held.offset != lso:
            self.blockers[partition] = Blocker(partition, lso, now)

    def check_invariants(self) -> None:
        """Raise :class:`AssertionError` naming the first broken invariant of the class doc
        (probes in order and unreached, the horizon behind them, blockers where they hold).
        Pure and O(state): for the simulator and tests, never on the acker's own path."""
        for p, probes in self._probes.items():
            if len(probes) > MAX_PROBES:
                raise AssertionError(f"liveness: partition {p} keeps {len(probes)} probes, "
                                     f"over {MAX_PROBES}")
            pairs = list(probes)
            for (t0, h0), (t1, h1) in pairwise(pairs):
                if t1 < t0 or h1 < h0:
                    raise AssertionError(
                        f"liveness: partition {p}'s probes out of order: ({t0} ms, high {h0}) "
                        f"before ({t1} ms, high {h1})")
            read = self._read.get(p)
            if pairs and read is not None and pairs[0][1] <= read:
                raise AssertionError(
                    f"liveness: partition {p}'s probe at {pairs[0][0]} ms (high {pairs[0][1]}) "
                    f"was reached by position {read}, yet not taken into the horizon")
            horizon = self.horizon.get(p)
            if pairs and horizon is not None and horizon > pairs[0][0]:
                raise AssertionError(
                    f"liveness: partition {p}'s horizon {horizon} ms is past its unreached "
                    f"probe at {pairs[0][0]} ms (rule 2: nothing after it is proven read)")
        for p, blocker in self.blockers.items():
            if blocker.partition != p:
                raise AssertionError(f"liveness: the blocker of partition {p} is "
                                     f"{blocker.describe()}")
            if blocker.verdict not in ("waiting", "evicted", "fenced", "reported"):
                raise AssertionError(f"liveness: blocker of partition {p} has verdict "
                                     f"{blocker.verdict!r}")
            if blocker.verdict != "waiting" and not blocker.looked:
                raise AssertionError(f"liveness: {blocker.describe()} was judged "
                                     f"({blocker.verdict}) before its first message was read")

    def to_name(self, now: int) -> list[Blocker]:
        """Blockers held for a third of the timeout whose first message was not read yet.
        Why not at once: on a busy partition the LSO rests on a live writer's open
        transaction at most probes, and each look is a read; only one that stays is worth it
        (and must be named before rule 5 can judge it)."""
        return [
            b for b in self.blockers.values()
            if not b.looked and now - b.since_ms >= self.timeout_ms // 3
        ]

    def named(self, blocker: Blocker, source: str | None, incarnation: str | None,
              writer: str | None) -> Blocker:
        """What the message at the blocker's offset said of its writer (all None: nothing
        of ours could be read there)."""
        named = replace(blocker, source=source, incarnation=incarnation, writer=writer,
                        looked=True)
        if self.blockers.get(blocker.partition) == blocker:
            self.blockers[blocker.partition] = named
        return named

    def silence(self, partition: int, last_seen_ms: int) -> int | None:
        """Rule 2: the proven silence of a source last heard at ``last_seen_ms``."""
        horizon = self.horizon.get(partition)
        return None if horizon is None else horizon - last_seen_ms

    def decide(
        self, sessions: Mapping[SessionKey, SourceSession], now: int,
        evicting: frozenset[SessionKey] | set[SessionKey] = frozenset(),
    ) -> list[Decision]:
        """Rules 3 and 5, for every session not evicted or being evicted, and every blocker
        held for longer than the timeout that nothing was decided about yet."""
        out: list[Decision] = []
        for key, session in sessions.items():
            if session.evicted or key in evicting:
                continue
            silence = self.silence(key[1], session.last_seen_ms)
            if silence is not None and silence > self.timeout_ms:
                out.append(Silent(key, silence, session.evict_when_silent))
        for p, blocker in list(self.blockers.items()):
            if (
                blocker.verdict != "waiting" or not blocker.looked
                or now - blocker.since_ms <= self.timeout_ms
            ):
                continue
            held: SessionKey | None = None if blocker.source is None else (blocker.source, p)
            current = None if held is None else sessions.get(held)
            out_decision: SilentBlocker | None
            if held is not None and current is not None and (
                current.incarnation == blocker.incarnation
            ):
                if current.evicted or held in evicting:
                    verdict = "evicted"  # fenced already: its abort is on its way
                    out_decision = None
                elif current.evict_when_silent:
                    verdict, out_decision = "evicted", SilentBlocker(blocker, key=held)
                else:
                    verdict, out_decision = "reported", SilentBlocker(blocker)
            elif (
                held is not None and current is not None and blocker.writer
                and not current.evicted and held not in evicting and current.evict_when_silent
            ):
                # A newer incarnation, dead in its first transaction: its init fenced the
                # current one, which can commit nothing more (an idle zombie may still
                # heartbeat it alive).  Evict the session; the fence aborts both.
                verdict, out_decision = "evicted", SilentBlocker(
                    blocker, key=held, writer=blocker.writer
                )
            elif blocker.writer:
                verdict, out_decision = "fenced", SilentBlocker(blocker, writer=blocker.writer)
            else:
                verdict, out_decision = "reported", SilentBlocker(blocker)
            decided = replace(blocker, verdict=verdict)
            self.blockers[p] = decided
            if out_decision is not None:
                out.append(replace(out_decision, blocker=decided))
        return out


def excuse_stall(
    sessions: Mapping[SessionKey, SourceSession], last_step_ms: int, now: int,
    heartbeat_ms: int,
) -> int:
    """Rule 7: a gap between two steps longer than two heartbeats moves every source's
    ``last_seen_ms`` on by the excess; returns the excess (0: no stall)."""
    stall = now - last_step_ms - 2 * heartbeat_ms
    if not last_step_ms or stall <= 0:
        return 0
    for session in sessions.values():
        session.last_seen_ms += stall
    return stall


def holds_every_ms(unsealed_timeout_ms: int | None) -> int:
    """How often holds are recomputed (a walk of the open times that are not ints): a tenth
    of the unsealed timeout, 100 ms to 1 s (1 s when it is off: they are only shown)."""
    if unsealed_timeout_ms is None:
        return 1000
    return max(100, min(1000, unsealed_timeout_ms // 10))


HoldKey = tuple[str, str]
"""(substream, source)."""


class Holds:
    """Rules 8 and 9: which source holds which oldest unsealed time, since when, and which
    holds are overdue.

    Invariants: ``watched[k]`` is when this acker first found source ``k[1]`` registered in
    segment ``k[0]`` (it leaves the map when the source is no longer registered there);
    ``held`` holds the holds of the last :meth:`update`, each ``since_ms >= watched``."""

    def __init__(self, unsealed_timeout_ms: int | None) -> None:
        self.timeout_ms = unsealed_timeout_ms
        self.watched: dict[HoldKey, int] = {}
        self.held: dict[HoldKey, Hold] = {}

    def update(self, tables: Mapping[str, SegmentTable], now: int) -> list[Hold]:
        """Rule 8 over every segment's table at ``now``; the holds, oldest first."""
        watched: dict[HoldKey, int] = {}
        held: dict[HoldKey, Hold] = {}
        for sub, table in tables.items():
            oldest = table.oldest_unsealed()
            for source in table.sources:
                if not table.is_active_source(source):
                    continue
                key = (sub, source)
                start = watched[key] = self.watched.get(key, now)
                found = oldest.get(source)
                if found is None:
                    continue
                t, first_seen = found
                before = self.held.get(key)
                if before is not None and before.time == t:
                    held[key] = before
                else:
                    held[key] = Hold(sub, source, t, max(first_seen, start))
        self.watched, self.held = watched, held
        return sorted(held.values(), key=lambda h: (h.since_ms, h.substream, h.source))

    def check_invariants(self, tables: Mapping[str, SegmentTable] | None = None) -> None:
        """Raise :class:`AssertionError` naming the first broken invariant of the class doc
        (a hold starts no earlier than its watch; with ``tables``, only registered sources
        are watched).  Pure and O(state): never on the acker's own path."""
        for key, hold in self.held.items():
            start = self.watched.get(key)
            if start is None:
                raise AssertionError(f"holds: {key!r} holds {hold.time!r}, yet is not watched")
            if hold.since_ms < start:
                raise AssertionError(f"holds: {key!r} holds {hold.time!r} since "
                                     f"{hold.since_ms} ms, before it was watched at {start} ms")
            if (hold.substream, hold.source) != key:
                raise AssertionError(f"holds: the hold under {key!r} is of "
                                     f"{(hold.substream, hold.source)!r}")
        if tables is not None:
            for sub, source in self.watched:
                table = tables.get(sub)
                if table is None or source not in table.sources:
                    raise AssertionError(f"holds: source '{source}' is watched in '{sub}', "
                                         "where it never registered")

    def excuse(self, stall_ms: int) -> None:
        """Rule 7: the acker's own stall moves every hold's start (and watch) on."""
        if stall_ms <= 0:
            return
        self.watched = {k: v + stall_ms for k, v in self.watched.items()}
        self.held = {k: replace(h, since_ms=h.since_ms + stall_ms) for k, h in self.held.items()}

    def overdue(
        self, horizon: Mapping[int, int], home: Mapping[str, int]
    ) -> list[tuple[Hold, int]]:
        """Rule 9: the holds proven longer than the timeout (each with its proven length),
        judged on the read horizon of the segment's acks partition (``home``).  None when
        the timeout is off."""
        if self.timeout_ms is None:
            return []
        out: list[tuple[Hold, int]] = []
        for hold in self.held.values():
            seen = horizon.get(home[hold.substream])
            if seen is not None and seen - hold.since_ms > self.timeout_ms:
                out.append((hold, seen - hold.since_ms))
        return out
