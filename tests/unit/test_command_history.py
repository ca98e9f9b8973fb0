"""The reducible command history: replaying the reduced history reaches the same state."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.commands import (
    AllowCompaction,
    CancelPeek,
    Command,
    CommandBody,
    ConfigureSubstreams,
    CreateInstance,
    Hello,
    InitializationComplete,
    Peek,
    SessionPhase,
    StatusRequest,
    decode_command,
    encode_command,
)
from substreams.acker.history import CommandHistory, OutcomeKind, replay
from substreams.frontier import Keyed

KNOWN = ("a", "b")
SUBS = ("a", "b", "zz")  # "zz" is unknown to the acker
CONTROLLERS = ("c1", "c2")
UUIDS = ("p1", "p2", "p3")


@dataclass(frozen=True)
class Answer:
    """A pseudo-op: the acker answered peek ``uuid`` (not a command; never replayed)."""

    uuid: str


times = st.one_of(st.integers(0, 6), st.tuples(st.integers(0, 3), st.integers(0, 3)))
bodies: st.SearchStrategy[CommandBody] = st.one_of(
    st.just(Hello()),
    st.just(CreateInstance()),
    st.just(InitializationComplete()),
    st.just(StatusRequest()),
    st.lists(st.sampled_from(SUBS), max_size=3, unique=True).map(
        lambda s: ConfigureSubstreams(tuple(s))
    ),
    st.builds(AllowCompaction, st.sampled_from(SUBS), st.lists(times, max_size=2).map(tuple)),
    st.builds(Peek, st.sampled_from(UUIDS), st.sampled_from(SUBS), st.none() | times),
    st.builds(CancelPeek, st.sampled_from(UUIDS)),
)


@st.composite
def op_lists(draw: st.DrawFn) -> list[Command | Answer]:
    """Commands of two controllers with fresh nonces per Hello, re-deliveries (an earlier
    command sent again) and stale commands (an old nonce), interleaved with answers."""
    ops: list[Command | Answer] = []
    nonce = {c: 0 for c in CONTROLLERS}
    seq = {c: 0 for c in CONTROLLERS}
    sent: list[Command] = []
    for _ in range(draw(st.integers(0, 40))):
        choice = draw(st.integers(0, 9))
        if choice == 0 and sent:
            ops.append(draw(st.sampled_from(sent)))  # re-delivery / stale old-nonce command
            continue
        if choice == 1:
            ops.append(Answer(draw(st.sampled_from(UUIDS))))
            continue
        c = draw(st.sampled_from(CONTROLLERS))
        body = draw(bodies)
        if isinstance(body, Hello):
            nonce[c] += 1
            seq[c] = 0
        else:
            seq[c] += draw(st.integers(1, 2))
        cmd = Command(c, f"{c}-n{nonce[c]}", seq[c], body)
        sent.append(cmd)
        ops.append(cmd)
    return ops


def run_full(ops: list[Command | Answer], keep: int | None) -> CommandHistory:
    h = CommandHistory(KNOWN, keep_idle_sessions=keep)
    for op in ops:
        if isinstance(op, Answer):
            h.answered(op.uuid)
        else:
            h.push(op)
    return h


@settings(max_examples=400, deadline=None)
@given(op_lists(), st.integers(0, 40))
def test_replaying_the_reduced_history_reaches_the_same_state(
    ops: list[Command | Answer], split: int
) -> None:
    full = run_full(ops, keep=None)
    expected = full.state.snapshot()
    full.reduce()
    reduced = full.commands
    assert replay(reduced, KNOWN).snapshot() == expected
    assert full.state.snapshot() == expected
    # reducing again changes nothing, and the history never grows by reducing
    full.reduce()
    assert full.commands == reduced
    assert len(reduced) <= sum(1 for op in ops if isinstance(op, Command))


@settings(max_examples=300, deadline=None)
@given(op_lists(), op_lists(), st.integers(0, 3))
def test_reduction_is_a_congruence_for_later_commands(
    head: list[Command | Answer], tail: list[Command | Answer], keep: int
) -> None:
    """A restarted acker replays the reduced head and then sees the tail: it must end where
    an acker that saw everything ends (idle sessions aside, which reduce may forget)."""
    tail = [_shift(op) for op in tail]
    everything = run_full(head + tail, keep=None)
    h = run_full(head, keep=None)
    h.reduce()
    restarted = run_full([*h.commands, *[op for op in tail]], keep=None)
    assert restarted.state.snapshot() == everything.state.snapshot()
    # with a bound on idle sessions, the reduced state equals the replay of the reduced log
    bounded = run_full(head, keep=keep)
    bounded.reduce()
    assert replay(bounded.commands, KNOWN).snapshot() == bounded.state.snapshot()


def _shift(op: Command | Answer) -> Command | Answer:
    """Tail commands come from later sessions (fresh nonces), as after a restart."""
    if isinstance(op, Answer):
        return op
    return Command(op.controller, op.nonce + "-later", op.seq, op.body)


def cmd(controller: str, nonce: str, seq: int, body: CommandBody) -> Command:
    return Command(controller, nonce, seq, body)


def test_reduction_keeps_last_configure_latest_compaction_and_pending_peeks_only() -> None:
    h = CommandHistory(KNOWN)
    ops = [
        cmd("c", "n", 0, Hello()),
        cmd("c", "n", 1, CreateInstance()),
        cmd("c", "n", 2, ConfigureSubstreams(("a",))),
        cmd("c", "n", 3, ConfigureSubstreams(("a", "b"))),
        cmd("c", "n", 4, AllowCompaction("a", (1,))),
        cmd("c", "n", 5, AllowCompaction("a", (3,))),
        cmd("c", "n", 6, Peek("p1", "a", 4)),
        cmd("c", "n", 7, Peek("p2", "a", None)),
        cmd("c", "n", 8, CancelPeek("p2")),
        cmd("c", "n", 9, InitializationComplete()),
        cmd("c", "n", 10, Peek("p3", "b", Keyed("k", 1))),
        cmd("c", "n", 11, StatusRequest()),
    ]
    outcomes = [h.push(c).kind for c in ops]
    assert outcomes == [OutcomeKind.APPLIED] * len(ops)
    h.answered("p3")
    h.reduce()
    assert [c.seq for c in h.commands] == [0, 1, 3, 5, 6, 9, 11]
    assert h.state.configured_substreams() == ("a", "b")
    assert h.state.is_compacted("a", 2) and not h.state.is_compacted("a", 3)
    assert list(h.state.peeks) == ["p1"]


def test_duplicates_stale_and_out_of_stage_commands() -> None:
    h = CommandHistory(KNOWN)
    assert h.push(cmd("c", "n1", 0, Hello())).kind is OutcomeKind.APPLIED
    assert h.push(cmd("c", "n1", 1, Peek("p", "a"))).kind is OutcomeKind.REJECTED  # creation
    assert h.push(cmd("c", "n1", 2, CreateInstance())).kind is OutcomeKind.APPLIED
    assert h.push(cmd("c", "n1", 2, CreateInstance())).kind is OutcomeKind.DUPLICATE
    assert h.push(cmd("c", "n1", 3, Peek("p", "zz"))).kind is OutcomeKind.REJECTED
    assert h.push(cmd("c", "n1", 4, Peek("p", "a"))).kind is OutcomeKind.APPLIED
    assert h.push(cmd("c", "n1", 4, Peek("p", "a"))).kind is OutcomeKind.DUPLICATE
    assert h.push(cmd("c", "n2", 0, Hello())).kind is OutcomeKind.APPLIED
    assert not h.state.peeks  # the replaced session's peek is owed to nobody
    assert h.push(cmd("c", "n1", 5, StatusRequest())).kind is OutcomeKind.STALE
    assert h.push(cmd("x", "n", 1, StatusRequest())).kind is OutcomeKind.STALE
    assert h.state.sessions["c"].stage is SessionPhase.CREATION
    assert h.push(cmd("c", "n2", 1, CancelPeek("p"))).kind is OutcomeKind.REJECTED  # creation
    h.push(cmd("c", "n2", 2, CreateInstance()))
    assert h.push(cmd("c", "n2", 3, CancelPeek("p"))).kind is OutcomeKind.IGNORED
    assert h.push(cmd("c", "n2", 4, AllowCompaction("a", (5,)))).kind is OutcomeKind.APPLIED
    regress = h.push(cmd("c", "n2", 5, AllowCompaction("a", (4,))))
    assert regress.kind is OutcomeKind.REJECTED and "back" in regress.reason


def test_idle_sessions_beyond_the_bound_are_forgotten() -> None:
    h = CommandHistory(KNOWN, keep_idle_sessions=2)
    for i in range(5):
        h.push(cmd(f"cli{i}", "n", 0, Hello()))
        h.push(cmd(f"cli{i}", "n", 1, StatusRequest()))
    h.reduce()
    assert sorted(h.state.sessions) == ["cli3", "cli4"]
    assert len(h.commands) == 4  # a Hello and the seq-carrying Status of each


def test_commands_round_trip_through_avro() -> None:
    for body in (
        Hello(),
        CreateInstance(),
        InitializationComplete(),
        StatusRequest(),
        ConfigureSubstreams(("a", "b")),
        AllowCompaction("a", (1, (2, 3), Keyed("k", 4))),
        Peek("u", "a", None),
        Peek("u", "a", Keyed("k", (1, 2))),
        CancelPeek("u"),
    ):
        c = Command("ctl", "nonce", 7, body, 123)
        assert decode_command(encode_command(c)) == c


def test_command_line_times_parse_and_format_back() -> None:
    from substreams.acker.commands import format_time, parse_time

    for text, t in (
        ("5", 5),
        ("1,2", (1, 2)),
        ("alice@7", Keyed("alice", 7)),
        ("bob@1,2", Keyed("bob", (1, 2))),
    ):
        assert parse_time(text) == t and format_time(t) == text
