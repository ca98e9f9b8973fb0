"""What the acker's command side knows, and the reducible history that rebuilds it.

Why a reducible history (Materialize's ``ComputeCommandHistory``): the command topic is the
durable record of everything controllers asked for, and a restarted acker must end up where the
old one was (configured substreams, compaction frontiers, peeks still owed an answer, and the
session/seq table that makes re-delivered commands duplicates).  Replaying the whole topic works
but grows without bound; :meth:`CommandHistory.reduce` keeps the minimal list of commands whose
replay yields the same :class:`CommandState`: the last ConfigureSubstreams, the latest effective
AllowCompaction per substream, unanswered and uncanceled peeks, the Hello/CreateInstance/
InitializationComplete they depend on, the Hellos of each controller's last replaced sessions
(so that their re-delivered commands stay stale), and per live session one command that carries
its highest seq (rewritten to a side-effect-free Status).

:class:`CommandState` is pure and deterministic (no I/O, no clock), which is what lets the
reduction be tested by replay (``tests/unit/test_command_history.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from substreams.acker.commands import (
    AllowCompaction,
    CancelPeek,
    Command,
    ConfigureSubstreams,
    CreateInstance,
    Hello,
    InitializationComplete,
    Peek,
    SessionPhase,
    StatusRequest,
)
from substreams.frontier import Antichain, Time, sort_key

RETIRED_NONCES = 16
"""How many older session nonces per controller are remembered (to refuse their Hellos)."""


class OutcomeKind(enum.Enum):
    APPLIED = "applied"
    """The command took effect (and is answered, where it asks for an answer)."""
    IGNORED = "ignored"
    """Valid but nothing to do, e.g. CancelPeek of a peek already answered."""
    DUPLICATE = "duplicate"
    """Its (controller, nonce, seq) was seen: a re-delivery."""
    STALE = "stale"
    """Its controller has no session, or a newer Hello replaced the command's nonce."""
    REJECTED = "rejected"
    """Out of stage or naming an unknown substream: answered with the reason, no effect."""


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    reason: str = ""
    canceled: str | None = None
    """The uuid of the peek a CancelPeek canceled (so the handler can answer it)."""


@dataclass(slots=True)
class Session:
    """One controller's current session and the log positions it rests on."""

    controller: str
    nonce: str
    stage: SessionPhase
    last_seq: int
    hello_pos: int
    create_pos: int | None = None
    init_pos: int | None = None
    last_pos: int = 0
    retired: tuple[tuple[str, int], ...] = ()
    """(nonce, Hello position) of this controller's older sessions, newest last: a re-delivered
    command of one of them, Hello included, is stale."""

    def support(self) -> frozenset[int]:
        """Positions a command of this session needs replayed before it to apply again."""
        return frozenset(
            p for p in (self.hello_pos, self.create_pos, self.init_pos) if p is not None
        )


@dataclass(frozen=True, slots=True)
class Kept:
    """A command that shapes the state, its log position and the positions it depends on."""

    pos: int
    command: Command
    support: frozenset[int]


@dataclass
class CommandState:
    """The acker's command-side state; ``apply`` is a pure transition function."""

    known_substreams: frozenset[str]
    sessions: dict[str, Session] = field(default_factory=dict)
    owned: frozenset[str] | None = None
    """The substreams this acker answers peeks of (None: every known one).  A shard of a
    sharded acker knows the whole deployment's substreams (a controller configures and
    compacts any of them) but owns a part: a peek of another shard's substream is that
    shard's to answer, so here it is ignored, neither answered nor kept as owed."""
    configured: Kept | None = None
    since: dict[str, Kept] = field(default_factory=dict)
    peeks: dict[str, Kept] = field(default_factory=dict)
    """Pending peeks by uuid, in arrival order."""

    # -- queries -------------------------------------------------------------------------

    def configured_substreams(self) -> tuple[str, ...]:
        if self.configured is None:
            return ()
        body = self.configured.command.body
        assert isinstance(body, ConfigureSubstreams)
        return body.substreams

    def configured_by(self) -> str | None:
        return None if self.configured is None else self.configured.command.controller

    def since_of(self, substream: str) -> Antichain | None:
        kept = self.since.get(substream)
        if kept is None:
            return None
        body = kept.command.body
        assert isinstance(body, AllowCompaction)
        return Antichain(body.frontier)

    def is_compacted(self, substream: str, t: Time) -> bool:
        """True when ``t`` is not beyond the substream's compaction frontier."""
        since = self.since_of(substream)
        return since is not None and not since.less_equal(t)

    def session_of(self, cmd: Command) -> Session | None:
        s = self.sessions.get(cmd.controller)
        return s if s is not None and s.nonce == cmd.nonce else None

    def snapshot(self) -> tuple[Any, ...]:
        """Everything that matters, as plain comparable values (log positions excluded)."""
        sessions = sorted(
            (c, s.nonce, s.stage.value, s.last_seq, tuple(n for n, _ in s.retired))
            for c, s in self.sessions.items()
        )
        since = sorted(
            (sub, tuple(sorted(b.frontier, key=sort_key)))
            for sub, k in self.since.items()
            if isinstance(b := k.command.body, AllowCompaction)
        )
        peeks = [
            (u, k.command.controller, k.command.nonce, k.command.body)
            for u, k in self.peeks.items()
        ]
        return (
            tuple(sessions),
            self.configured_substreams(),
            self.configured_by(),
            tuple(since),
            tuple(peeks),
        )

    # -- transitions ---------------------------------------------------------------------

    def apply(self, cmd: Command, pos: int) -> Outcome:
        """Apply ``cmd`` found at log position ``pos``."""
        body = cmd.body
        if isinstance(body, Hello):
            return self._hello(cmd, pos)
        session = self.sessions.get(cmd.controller)
        if session is None:
            return Outcome(OutcomeKind.STALE, f"controller {cmd.controller!r} has not said Hello")
        if session.nonce != cmd.nonce:
            return Outcome(
                OutcomeKind.STALE, f"session {cmd.nonce!r} was replaced by a newer Hello"
            )
        if cmd.seq <= session.last_seq:
            return Outcome(OutcomeKind.DUPLICATE, f"seq {cmd.seq} already seen")
        session.last_seq = cmd.seq
        session.last_pos = pos
        if isinstance(body, StatusRequest):
            return Outcome(OutcomeKind.APPLIED)
        if isinstance(body, CreateInstance):
            if session.stage is not SessionPhase.CREATION:
                return self._out_of_stage(session, "CreateInstance")
            session.stage = SessionPhase.INITIALIZATION
            session.create_pos = pos
            return Outcome(OutcomeKind.APPLIED)
        if isinstance(body, InitializationComplete):
            if session.stage is not SessionPhase.INITIALIZATION:
                return self._out_of_stage(session, "InitializationComplete")
            session.stage = SessionPhase.COMPUTATION
            session.init_pos = pos
            return Outcome(OutcomeKind.APPLIED)
        if session.stage is SessionPhase.CREATION:
            return self._out_of_stage(session, type(body).__name__)
        kept = Kept(pos, cmd, session.support() | {pos})
        if isinstance(body, ConfigureSubstreams):
            return self._configure(body, kept)
        if isinstance(body, AllowCompaction):
            return self._allow_compaction(body, kept)
        if isinstance(body, Peek):
            return self._peek(body, kept)
        if isinstance(body, CancelPeek):
            return self._cancel_peek(body, cmd.controller)
        raise TypeError(f"not a command body: {body!r}")

    def _configure(self, body: ConfigureSubstreams, kept: Kept) -> Outcome:
        unknown = sorted(set(body.substreams) - self.known_substreams)
        if unknown:
            return self._unknown(unknown)
        self.configured = kept
        return Outcome(OutcomeKind.APPLIED)

    def _allow_compaction(self, body: AllowCompaction, kept: Kept) -> Outcome:
        """The compaction frontier only moves forward."""
        if body.substream not in self.known_substreams:
            return self._unknown([body.substream])
        old = self.since_of(body.substream)
        if old is not None and not old.dominates(Antichain(body.frontier)):
            return Outcome(
                OutcomeKind.REJECTED,
                f"AllowCompaction of {body.substream!r} would move its compaction "
                "frontier back",
            )
        self.since[body.substream] = kept
        return Outcome(OutcomeKind.APPLIED)

    def _peek(self, body: Peek, kept: Kept) -> Outcome:
        """Owe an answer to a peek of an owned substream, once per uuid."""
        if body.substream not in self.known_substreams:
            return self._unknown([body.substream])
        if self.owned is not None and body.substream not in self.owned:
            return Outcome(OutcomeKind.IGNORED, f"{body.substream!r} is another shard's")
        if body.uuid in self.peeks:
            return Outcome(OutcomeKind.REJECTED, f"peek {body.uuid} is already pending")
        self.peeks[body.uuid] = kept
        return Outcome(OutcomeKind.APPLIED)

    def _cancel_peek(self, body: CancelPeek, controller: str) -> Outcome:
        """Only the controller that asked may cancel its pending peek."""
        pending = self.peeks.get(body.uuid)
        if pending is None or pending.command.controller != controller:
            return Outcome(OutcomeKind.IGNORED, f"peek {body.uuid} is not pending")
        del self.peeks[body.uuid]
        return Outcome(OutcomeKind.APPLIED, canceled=body.uuid)

    def answered(self, uuid: str) -> None:
        """The peek ``uuid`` was answered: it is no longer owed (nor replayed)."""
        self.peeks.pop(uuid, None)

    def _hello(self, cmd: Command, pos: int) -> Outcome:
        old = self.sessions.get(cmd.controller)
        retired: tuple[tuple[str, int], ...] = ()
        if old is not None:
            if any(n == cmd.nonce for n, _ in old.retired):
                return Outcome(
                    OutcomeKind.STALE, f"session {cmd.nonce!r} was replaced by a newer Hello"
                )
            if old.nonce == cmd.nonce and cmd.seq <= old.last_seq:
                return Outcome(OutcomeKind.DUPLICATE, f"seq {cmd.seq} already seen")
            retired = old.retired
            if old.nonce != cmd.nonce:
                retired = (*retired, (old.nonce, old.hello_pos))[-RETIRED_NONCES:]
            # the old session's peeks are owed to nobody now
            mine = [u for u, k in self.peeks.items() if k.command.controller == cmd.controller]
            for uuid in mine:
                del self.peeks[uuid]
        self.sessions[cmd.controller] = Session(
            cmd.controller, cmd.nonce, SessionPhase.CREATION, cmd.seq, pos, last_pos=pos,
            retired=retired,
        )
        return Outcome(OutcomeKind.APPLIED)

    @staticmethod
    def _out_of_stage(session: Session, what: str) -> Outcome:
        return Outcome(
            OutcomeKind.REJECTED,
            f"{what} is not allowed in the {session.stage.value} stage "
            f"of session {session.nonce!r}",
        )

    def _unknown(self, names: list[str]) -> Outcome:
        known = ", ".join(sorted(self.known_substreams)) or "(none)"
        return Outcome(
            OutcomeKind.REJECTED,
            f"unknown substream{'s' if len(names) > 1 else ''} {', '.join(names)}; "
            f"this acker tracks: {known}",
        )


class CommandHistory:
    """The command log plus the state it produces; ``reduce`` shrinks the log losslessly.

    ``keep_idle_sessions`` bounds the sessions that contribute nothing but their seq (e.g.
    finished CLI invocations): beyond the newest N such sessions, reduce forgets them (a command
    from a forgotten session is then stale, as if its controller never said Hello).
    ``None`` keeps every session.
    """

    def __init__(
        self,
        known_substreams: Iterable[str],
        keep_idle_sessions: int | None = 64,
        owned: Iterable[str] | None = None,
    ) -> None:
        self.state = CommandState(
            frozenset(known_substreams), owned=None if owned is None else frozenset(owned)
        )
        self.keep_idle_sessions = keep_idle_sessions
        self._log: dict[int, Command] = {}
        self._next = 0

    @property
    def commands(self) -> list[Command]:
        """The log, in order (after ``reduce``: the reduced history)."""
        return [self._log[p] for p in sorted(self._log)]

    def push(self, cmd: Command) -> Outcome:
        pos = self._next
        self._next += 1
        outcome = self.state.apply(cmd, pos)
        if outcome.kind not in (OutcomeKind.DUPLICATE, OutcomeKind.STALE):
            self._log[pos] = cmd
        return outcome

    def answered(self, uuid: str) -> None:
        self.state.answered(uuid)

    def reduce(self) -> None:
        """Drop every command whose replay is not needed to reach the current state."""
        st = self.state
        keep: set[int] = set()
        kept_items = [k for k in (st.configured, *st.since.values(), *st.peeks.values()) if k]
        for k in kept_items:
            keep |= k.support
        owners = {self._log[p].controller for p in keep}
        idle = [c for c in st.sessions if c not in owners]
        if self.keep_idle_sessions is not None:
            idle.sort(key=lambda c: st.sessions[c].last_pos)
            cut = max(0, len(idle) - self.keep_idle_sessions)
            for controller in idle[:cut]:
                del st.sessions[controller]
        synthesized: dict[int, Command] = {}
        for session in st.sessions.values():
            keep |= session.support() | {p for _, p in session.retired}
            if session.last_pos not in keep:  # carry the seq watermark without side effects
                synthesized[session.last_pos] = replace(
                    self._log[session.last_pos], body=StatusRequest()
                )
        self._log = {p: synthesized.get(p) or self._log[p] for p in keep | set(synthesized)}


def replay(
    commands: Iterable[Command],
    known_substreams: Iterable[str],
    owned: Iterable[str] | None = None,
) -> CommandState:
    """The state a fresh acker reaches by applying ``commands`` in order."""
    history = CommandHistory(known_substreams, keep_idle_sessions=None, owned=owned)
    for cmd in commands:
        history.push(cmd)
    return history.state
