"""Every shard of a sharded acker serves the command protocol for what it owns: the shards'
command states against one unsharded acker's, and the merge of their status answers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.commands import (
    AcksPartition,
    CancelPeek,
    Command,
    CreateInstance,
    Hello,
    InitializationComplete,
    Peek,
    Stage,
    StatusResponse,
    SubstreamStatus,
    merge_statuses,
)
from substreams.acker.history import CommandHistory, OutcomeKind, replay
from tests.unit.test_command_history import KNOWN, Answer, cmd, op_lists

SHARDS = ({"a"}, {"b"})


@st.composite
def sharded_ops(draw: st.DrawFn) -> list[Command | Answer]:
    """Command lists whose peek uuids are unique per substream (a controller's uuids are
    random: one uuid for peeks of two shards' substreams is not a case shards can see)."""
    out: list[Command | Answer] = []
    for op in draw(op_lists()):
        if isinstance(op, Answer):
            out.append(Answer(op.uuid + draw(st.sampled_from(KNOWN))))
        elif isinstance(op.body, Peek):
            body = op.body
            out.append(Command(op.controller, op.nonce, op.seq,
                               Peek(body.uuid + body.substream, body.substream, body.time)))
        elif isinstance(op.body, CancelPeek):
            uuid = op.body.uuid + draw(st.sampled_from(KNOWN))
            out.append(Command(op.controller, op.nonce, op.seq, CancelPeek(uuid)))
        else:
            out.append(op)
    return out


def run(ops: list[Command | Answer], owned: set[str] | None) -> CommandHistory:
    h = CommandHistory(KNOWN, keep_idle_sessions=None, owned=owned)
    for op in ops:
        if isinstance(op, Answer):
            h.answered(op.uuid)
        else:
            h.push(op)
    return h


@settings(max_examples=300, deadline=None)
@given(sharded_ops())
def test_shards_agree_on_sessions_and_each_peek_is_owed_by_its_owner_only(
    ops: list[Command | Answer],
) -> None:
    whole = run(ops, None).state
    shards = [run(ops, owned).state for owned in SHARDS]
    _, configured, by, since, _ = whole.snapshot()
    for shard, owned in zip(shards, SHARDS, strict=True):
        sessions, s_configured, s_by, s_since, _ = shard.snapshot()
        # the same sessions (so the same duplicates and stale commands), configuration and
        # compaction frontiers as one acker serving everything
        assert (sessions, s_configured, s_by, s_since) == (
            whole.snapshot()[0], configured, by, since
        )
        assert all(k.command.body.substream in owned for k in shard.peeks.values())  # type: ignore[union-attr]
    # the pending peeks are the unsharded acker's, split by owner
    split = [u for s in shards for u in s.peeks]
    assert sorted(split) == sorted(whole.peeks)


@settings(max_examples=200, deadline=None)
@given(sharded_ops())
def test_a_shards_reduced_history_replays_to_its_state(ops: list[Command | Answer]) -> None:
    for owned in SHARDS:
        h = run(ops, owned)
        h.reduce()
        assert replay(h.commands, KNOWN, owned).snapshot() == h.state.snapshot()


def test_a_peek_of_another_shards_substream_is_ignored_not_owed() -> None:
    h = CommandHistory(KNOWN, owned={"a"})
    for seq, body in enumerate([Hello(), CreateInstance(), InitializationComplete()]):
        assert h.push(cmd("c", "n", seq, body)).kind is OutcomeKind.APPLIED
    assert h.push(cmd("c", "n", 3, Peek("p", "b"))).kind is OutcomeKind.IGNORED
    assert h.push(cmd("c", "n", 4, Peek("q", "a"))).kind is OutcomeKind.APPLIED
    assert h.push(cmd("c", "n", 5, Peek("r", "zz"))).kind is OutcomeKind.REJECTED  # unknown
    assert list(h.state.peeks) == ["q"]
    assert h.push(cmd("c", "n", 3, Peek("p", "b"))).kind is OutcomeKind.DUPLICATE


def _sub(name: str, open_times: int = 0) -> SubstreamStatus:
    return SubstreamStatus(name, (1,), (2,), open_times)


def test_merged_status_puts_the_shards_parts_side_by_side() -> None:
    zero = StatusResponse(
        Stage.COMPUTATION, (_sub("s3", 2), _sub("s0")),
        (AcksPartition(0, 10), AcksPartition(2, 30, 1)), ("s0", "s1"),
    )
    one = StatusResponse(
        Stage.INITIALIZATION, (_sub("s1", 5),), (AcksPartition(3, 40), AcksPartition(1, 20)),
        ("s0", "s1"),
    )
    merged = merge_statuses([zero, one])
    assert [s.substream for s in merged.substreams] == ["s0", "s1", "s3"]
    assert [s.open_times for s in merged.substreams] == [0, 5, 2]
    assert [(a.partition, a.offset, a.lag) for a in merged.acks] == [
        (0, 10, None), (1, 20, None), (2, 30, 1), (3, 40, None)
    ]
    assert merged.configured == ("s0", "s1")
    assert merged.stage is Stage.INITIALIZATION  # the stage every shard has reached
    assert merge_statuses([one, zero]) == merged  # the order of the answers does not matter
    assert merge_statuses([zero]) == StatusResponse(
        zero.stage, tuple(sorted(zero.substreams, key=lambda s: s.substream)),
        zero.acks, zero.configured,
    )
    with pytest.raises(ValueError):
        merge_statuses([])
