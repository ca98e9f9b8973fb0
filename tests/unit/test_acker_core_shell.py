"""The decisions the acker's shell used to make itself, now the core's (substreams.acker.core
rules 10-12): when to heartbeat and probe, naming a blocker from its first message, what a
starting shard recovers, where it reads from, whom it takes over from -- on a simulated
clock (``now`` as a value), without a broker."""

from __future__ import annotations

import pytest

from substreams.acker.core import (
    AckerCore,
    check_retirable,
    predecessors,
    recovery,
    start_offsets,
    superseded,
)
from substreams.acker.liveness import probe_interval_ms
from substreams.acker.protocol import AckMessage, Register, SourceHeartbeat, ack_headers, encode_ack
from substreams.acker.state import AckerState, Blocker
from substreams.control.messages import ControlRecord, WriterHeartbeat
from substreams.errors import SubstreamsError

TIMEOUT = 3000
HEARTBEAT = 200


def core() -> AckerCore:
    state = AckerState()
    state.ensure("s", 100)
    c = AckerCore(
        "a", (0,), {"s": 0}, {"s": "_control.s"}, acks_partitions=1,
        source_timeout_ms=TIMEOUT, heartbeat_ms=HEARTBEAT, state=state,
    )
    c.started(0)
    return c


# -- rule 10: the shell's timers -------------------------------------------------------------


def test_a_started_core_heartbeats_at_once_then_every_heartbeat_ms() -> None:
    c = core()
    assert c.heartbeat_due(0)  # a (re)started acker: its first step commits
    c.committed(0)
    assert not c.heartbeat_due(HEARTBEAT - 1)
    assert c.heartbeat_due(HEARTBEAT)
    c.committed(150)  # any transaction counts, not only heartbeats
    assert not c.heartbeat_due(HEARTBEAT)
    assert c.heartbeat_due(150 + HEARTBEAT)
    c.started(400)
    assert c.heartbeat_due(400)


def test_the_partitions_ends_are_probed_every_probe_interval() -> None:
    c = core()
    every = probe_interval_ms(TIMEOUT)
    assert c.probe_due(1000)
    assert not c.probe_due(1000)  # counted: a second ask in the same ms waits
    assert not c.probe_due(1000 + every - 1)
    assert c.probe_due(1000 + every)


# -- naming a blocker from its first message -------------------------------------------------


def message(source: str, body: object, inc: str = "i1") -> bytes:
    return encode_ack(AckMessage(source, 0, 0, body, inc))  # type: ignore[arg-type]


def test_a_blocker_is_named_by_its_first_message() -> None:
    c = core()
    reg = c.named_record(
        Blocker(0, 5, 0), message("a", Register(("s",), writer="txn.a")), ack_headers()
    )
    assert (reg.source, reg.incarnation, reg.writer) == ("a", "i1", "txn.a")
    # not a Register: the writer is the session's of that incarnation (none here)
    beat = c.named_record(Blocker(0, 6, 0), message("b", SourceHeartbeat()), ack_headers())
    assert (beat.source, beat.incarnation, beat.writer) == ("b", "i1", None)
    garbage = c.named_record(Blocker(0, 7, 0), b"\x00not an ack", None)
    assert garbage.looked and garbage.source is None
    gone = c.named_record(Blocker(0, 8, 0), None, None)
    assert gone.looked and gone.source is None


# -- rule 11: start-up -----------------------------------------------------------------------


def retired(to_shards: int) -> AckerState:
    state = AckerState()
    state.retired = {"to_shards": to_shards, "by": "acker.shard0of2"}
    return state


def resumed(*partitions: int) -> AckerState:
    state = AckerState()
    state.acks_offsets = dict.fromkeys(partitions, 10)
    return state


def test_recovery_resumes_its_own_checkpoint_or_starts_empty() -> None:
    assert recovery("a", None, (0, 1), None) == "empty"
    assert recovery("a", resumed(0, 1), (0, 1), None) == "resume"
    # told to take over, it still resumes a live checkpoint of its own
    assert recovery("a", resumed(0), (0, 1), 1) == "resume"


def test_recovery_takes_over_only_when_told_and_without_a_live_checkpoint() -> None:
    assert recovery("a", None, (0,), 1) == "take_over"
    assert recovery("a", retired(2), (0,), 1) == "take_over"
    with pytest.raises(SubstreamsError, match=r"was retired.*2-shard layout"):
        recovery("a", retired(2), (0,), None)


def test_recovery_refuses_a_checkpoint_of_partitions_not_owned() -> None:
    with pytest.raises(SubstreamsError, match=r"partitions \[2\] that shard 0 of 2"):
        recovery("a", resumed(0, 2), (0,), None, "shard 0 of 2")


def test_start_offsets_from_the_log_start_or_the_checkpoint() -> None:
    offsets = {0: 7}
    start_offsets(offsets, {0: 3, 1: 4, 2: -1}, "acks")
    assert offsets == {0: 7, 1: 4, 2: 0}  # never read: the log start (never negative)
    start_offsets(offsets, {0: 7}, "acks")  # exactly at the log start: nothing lost
    with pytest.raises(SubstreamsError, match="deleted by retention"):
        start_offsets({0: 7}, {0: 8}, "acks")


# -- rule 12: take-over ----------------------------------------------------------------------


def test_each_partition_comes_from_its_shard_of_the_old_layout() -> None:
    def name(i: int) -> str:
        return f"acker.shard{i}of2"

    assert predecessors("acker.shard1of4", (1, 5, 9), 2, name) == {"acker.shard1of2": {1, 5, 9}}
    assert predecessors("acker", (0, 1, 2), 2, name) == {
        "acker.shard0of2": {0, 2}, "acker.shard1of2": {1},
    }
    with pytest.raises(SubstreamsError, match="names this same layout"):
        predecessors("acker.shard0of2", (0, 2), 2, name)


def test_a_predecessor_retired_to_another_layout_is_refused() -> None:
    check_retirable("p", AckerState(), 4)
    check_retirable("p", retired(4), 4)  # a sibling shard of ours retired it: read again
    with pytest.raises(SubstreamsError, match="'p' was retired"):
        check_retirable("p", retired(3), 4)


def test_superseded_when_its_name_wrote_at_or_past_our_next_sequence_number() -> None:
    def rec(writer: str, seq: int) -> ControlRecord:
        return ControlRecord(writer, seq, b"", b"", 0, WriterHeartbeat(None))

    assert not superseded([rec("a", 3), rec("b", 9)], "a", 4)
    assert superseded([rec("a", 3), rec("a", 4)], "a", 4)
