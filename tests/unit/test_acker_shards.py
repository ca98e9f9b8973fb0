"""Sharded ackers, the pure parts: which acks partition a segment's messages go to, which
partitions a shard owns, how an agent splits a commit, and how a checkpointed state is cut
into per-partition parts and merged again (what a take-over does)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import substreams.acker.agent as agent_module
from substreams.acker.agent import TrackingAgent
from substreams.acker.protocol import (
    AckBlock,
    AckEntry,
    AckReport,
    Register,
    SealEntry,
    SourceHeartbeat,
    Unregister,
    segment_partition,
    shard_partitions,
    split_body,
)
from substreams.acker.state import AckerState, SourceSession
from substreams.acker.table import SOURCE
from substreams.config.loader import load_config_text
from substreams.control.messages import OffsetRange
from substreams.errors import ConfigError, SubstreamsError

SUBS = [f"s{i}" for i in range(8)]


@given(st.integers(1, 12).flatmap(lambda p: st.tuples(st.just(p), st.integers(1, p))))
def test_shards_partition_the_acks_partitions(pn: tuple[int, int]) -> None:
    partitions, shards = pn
    owned = [shard_partitions(i, shards, partitions) for i in range(shards)]
    flat = [p for o in owned for p in o]
    assert sorted(flat) == list(range(partitions))  # every partition, exactly one owner
    assert all(o for o in owned)  # no idle shard
    for i, o in enumerate(owned):
        assert all(p % shards == i for p in o)


def test_impossible_layouts_are_refused() -> None:
    for shard, shards, partitions in ((0, 5, 4), (2, 2, 4), (-1, 2, 4)):
        with pytest.raises(SubstreamsError, match="acker shard"):
            shard_partitions(shard, shards, partitions)


def test_segment_partition_is_stable_and_spread() -> None:
    assert segment_partition("clicks-by-epoch", 4) == segment_partition("clicks-by-epoch", 4)
    hit = {segment_partition(f"sub{i}", 4) for i in range(64)}
    assert hit == {0, 1, 2, 3}


entries = st.lists(
    st.tuples(st.sampled_from(SUBS), st.integers(0, 5), st.integers(0, 2**63)), max_size=12
)
seals = st.lists(st.tuples(st.sampled_from(SUBS), st.integers(0, 5), st.booleans()), max_size=6)


@given(entries, seals, st.integers(1, 5))
def test_split_report_keeps_every_entry_in_its_segment_partition(
    es: list[tuple[str, int, int]], ss: list[tuple[str, int, bool]], partitions: int
) -> None:
    body = AckReport(
        tuple(AckEntry(s, t, x, 1, 1, (OffsetRange("d", 0, t, t + 1),)) for s, t, x in es),
        tuple(SealEntry(s, t, 0, k) for s, t, k in ss),
        tuple(AckBlock.pack(s, (t,), (x % 2**63,), (1,), (1,), (0,), ()) for s, t, x in es[::3]),
    )
    parts = split_body(body, lambda s: segment_partition(s, partitions))
    assert [p for p, _ in parts] == sorted({p for p, _ in parts})  # one part per partition
    for p, part in parts:
        assert isinstance(part, AckReport)
        assert part.entries or part.seals or part.columns
        assert all(segment_partition(e.substream, partitions) == p for e in part.entries)
        assert all(segment_partition(s.substream, partitions) == p for s in part.seals)
    # Nothing lost, nothing added, order kept within each partition.
    for p, part in parts:
        assert isinstance(part, AckReport)
        assert list(part.entries) == [
            e for e in body.entries if segment_partition(e.substream, partitions) == p
        ]
        assert list(part.seals) == [
            s for s in body.seals if segment_partition(s.substream, partitions) == p
        ]
        assert list(part.columns) == [
            k for k in body.columns if segment_partition(k.substream, partitions) == p
        ]
    assert sum(len(b.entries) for _, b in parts if isinstance(b, AckReport)) == len(es)


@given(st.lists(st.sampled_from(SUBS), min_size=1, max_size=8, unique=True), st.integers(1, 5))
def test_split_membership(subs: list[str], partitions: int) -> None:
    def where(s: str) -> int:
        return segment_partition(s, partitions)

    reg = split_body(Register(tuple(subs), SOURCE, "tx"), where)
    unreg = split_body(Unregister(tuple(subs)), where)
    joined = [s for _, b in reg if isinstance(b, Register) for s in b.substreams]
    assert sorted(joined) == sorted(subs)
    assert all(isinstance(b, Register) and b.writer == "tx" and b.role == SOURCE for _, b in reg)
    assert [p for p, _ in reg] == [p for p, _ in unreg]
    for p, b in [*reg, *unreg]:
        assert isinstance(b, Register | Unregister)
        assert all(where(s) == p for s in b.substreams)
    assert split_body(SourceHeartbeat(), where) == [(-1, SourceHeartbeat())]


def test_agent_numbers_each_partition_from_zero_and_heartbeats_everywhere() -> None:
    config: Any = SimpleNamespace(acker=SimpleNamespace(acks_topic="acks", acks_partitions=4))
    agent = TrackingAgent(config, "src", "inc")
    agent.register(SUBS)
    assert agent.partitions == {segment_partition(s, 4) for s in SUBS}
    for s in SUBS:
        agent.report(s, 1, 7)
        agent.seal(s, 1)
    agent.unregister(SUBS)
    msgs = agent.take()
    by_partition: dict[int, list[Any]] = {}
    for p, m in msgs:
        by_partition.setdefault(p, []).append(m)
    assert set(by_partition) == agent.partitions
    for ms in by_partition.values():
        assert [m.seq for m in ms] == list(range(len(ms)))  # its own count, no gaps
        assert [type(m.body).__name__ for m in ms] == ["Register", "AckReport", "Unregister"]
    agent.report(SUBS[0], 2, 1)
    [(p, again)] = agent.take()
    assert again.seq == len(by_partition[p])


def _state(partitions: int, rng_seed: int) -> AckerState:
    import random

    rng = random.Random(rng_seed)
    state = AckerState(acks_offsets={p: rng.randrange(100) for p in range(partitions)})
    for s in SUBS:
        state.ensure(s, 10)
        table = state.tables[s]
        for src in ("a", "b", "c"):
            if rng.random() < 0.6:
                table.register(src, SOURCE)
                state.sessions[(src, segment_partition(s, partitions))] = SourceSession(
                    f"inc-{src}", rng.randrange(50), rng.randrange(10**6), f"tx-{src}"
                )
        for t in range(rng.randrange(4)):
            table.report(t, rng.randrange(2**63), 1, 1, (), 0)
        state.last_notification[s] = None if rng.random() < 0.5 else (rng.randrange(9), 5)
    state.commands = {"x": 1}
    state.checkpoints = rng.randrange(1000)
    return state


def _doc(state: AckerState) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(zlib.decompress(state.dumps()))
    doc["sessions"] = sorted(doc["sessions"])
    for key in ("tables", "trackers", "last_notification"):
        doc[key] = dict(sorted(doc[key].items()))
    return doc


@settings(max_examples=40)
@given(st.integers(1, 6).flatmap(lambda p: st.tuples(st.just(p), st.integers(1, p))),
       st.integers(0, 10**6))
def test_parts_of_a_state_merge_back_to_it(pn: tuple[int, int], seed: int) -> None:
    """A state cut along any shard layout and merged again is the state (with its
    acks offsets) -- what a take-over from one layout to another relies on."""
    partitions, shards = pn
    whole = _state(partitions, seed)
    merged = AckerState()
    for i in range(shards):
        owned = set(shard_partitions(i, shards, partitions))
        subs = {s for s in SUBS if segment_partition(s, partitions) in owned}
        part = whole.part(owned, subs, commands=i == 0)
        assert set(part.acks_offsets) == owned
        assert all(p in owned for _, p in part.sessions)
        assert set(part.tables) == subs
        # the part survives its own checkpoint encoding
        again = AckerState.loads(part.dumps(), part.acks_offsets, 10)
        assert _doc(again) == _doc(part)
        merged.merge(again)
    assert merged.acks_offsets == whole.acks_offsets
    assert _doc(merged) == _doc(whole)


def test_overlapping_parts_are_refused() -> None:
    a, b = AckerState(acks_offsets={0: 1}), AckerState(acks_offsets={0: 2})
    with pytest.raises(SubstreamsError, match="overlap"):
        a.merge(b)


def test_retired_survives_the_checkpoint() -> None:
    state = _state(2, 1)
    state.retired = {"to_shards": 2, "by": "acker.shard0of2"}
    assert AckerState.loads(state.dumps(), {}, 10).retired == state.retired


@pytest.mark.parametrize("seed", range(5))
def test_a_checkpoint_document_encoded_later_is_the_state_it_was_taken_of(seed: int) -> None:
    """``to_doc`` shares nothing mutable with the state: encoded after the state moved on,
    it is still the checkpoint of when it was taken (what the simulator relies on)."""
    state = _state(2, seed)
    state.retired = {"to_shards": 2, "by": "acker.shard0of2"}
    then, doc = state.dumps(), state.to_doc()
    for s in SUBS:
        state.tables[s].report(7, 12345, 2, 1, (), 9)
        state.tables[s].register("z", SOURCE)
        state.trackers[s].activate_many([8])
        state.last_notification[s] = (99, 9)
    for session in state.sessions.values():
        session.seq += 1
    state.sessions[("z", 0)] = SourceSession("inc-z", 1, 2, "tx-z")
    assert isinstance(state.commands, dict) and isinstance(state.retired, dict)
    state.commands["x"] = 2
    state.retired["by"] = "someone else"
    state.checkpoints += 1
    assert state.dumps() != then
    assert AckerState.encode(doc) == then


def test_config_refuses_more_shards_than_partitions(tmp_path: Path) -> None:
    (tmp_path / "c.avsc").write_text(
        '{"type":"record","name":"C","fields":[{"name":"ts","type":"long"}]}'
    )
    text = (
        "kafka: {bootstrap: 'x:1'}\n"
        "streams: [{name: c, schema: c.avsc, order_key: ts}]\n"
        "acker:\n"
        "  acks_partitions: 2\n"
        "  shards: 3\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config_text(text, tmp_path / "substreams.yaml")
    msg = str(err.value)
    assert "substreams.yaml:5" in msg and "acker.shards" in msg and "must not exceed" in msg
    ok = load_config_text(text.replace("shards: 3", "shards: 2"), tmp_path / "substreams.yaml")
    assert ok.acker.shards == 2
    assert ok.acker.shard_name(1) == f"{ok.acker.name}.shard1of2"
    assert ok.acker.shard_name(0, 1) == ok.acker.name
    names = {t.name for t in ok.topics() if t.kind == "checkpoint"}
    assert names == {ok.acker.checkpoint_topic(ok.acker.shard_name(i)) for i in range(2)}


def test_heartbeats_go_to_each_partition_idle_for_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A source that commits only about one partition's segments still heartbeats to the
    others (the shards owning them would evict it otherwise)."""
    clock = [100.0]
    monkeypatch.setattr(agent_module.time, "monotonic", lambda: clock[0])
    config: Any = SimpleNamespace(acker=SimpleNamespace(acks_topic="acks", acks_partitions=4))
    agent = TrackingAgent(config, "src", "inc")
    subs = [s for s in SUBS if segment_partition(s, 4) in (0, 1)]
    a = next(s for s in subs if segment_partition(s, 4) == 0)
    agent.register(subs)
    assert agent.partitions == {0, 1}
    assert agent.heartbeat_due(100.5, 1.0) == []  # nothing due yet
    agent.take()  # the Register goes to both at 100
    clock[0] = 100.8
    agent.seal(a, 1)
    agent.take()  # a commit about partition 0 only
    assert agent.heartbeat_due(101.2, 1.0) == [1]  # idle there since 100
    assert agent.heartbeat_due(101.5, 1.0) == []
    assert agent.heartbeat_due(101.8, 1.0) == [0]  # and now idle on 0 too
    assert agent.heartbeat_due(102.2, 1.0) == [1]


def test_a_version_2_checkpoint_is_read_with_each_session_in_its_source_partition() -> None:
    """Upgrade: an unsharded acker's version-2 checkpoint (sessions per source) loads, each
    session under the partition its source wrote to before (crc32(source) % partitions)."""
    state = _state(1, 3)
    doc = json.loads(zlib.decompress(state.dumps()))
    doc["version"] = 2
    doc["sessions"] = {src: rest for src, _, *rest in doc["sessions"]}
    old = zlib.compress(json.dumps(doc).encode())
    again = AckerState.loads(old, {0: 5}, 10)
    assert set(again.sessions) == {(src, 0) for src, _ in state.sessions}
    assert {k[0]: v for k, v in again.sessions.items()} == {
        k[0]: v for k, v in state.sessions.items()
    }
    four = AckerState.loads(old, {p: 0 for p in range(4)}, 10)
    assert set(four.sessions) == {
        (src, zlib.crc32(src.encode()) % 4) for src, _ in state.sessions
    }
