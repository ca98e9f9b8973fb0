"""The acker's changelog (substreams.acker.changelog) against the whole state it replaces.

Random runs of what the acker does to its state -- registrations, reports, seals, keyed
seals, terminations -- over a session substream and an int substream, with commits (the
records of one transaction appended to the log), failed commits (the records dropped) and
crashes anywhere between them.  After every crash the state restored from the committed
records alone must be the state of the last commit, and the run goes on from it (so
restoring a restored state's changelog is exercised too).  Records are made tiny and
snapshots frequent, so that deltas are split over several records and snapshots over
several transactions (fuzzy: entries change while their chunks are written).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker import changelog
from substreams.acker.changelog import StateLog, base_of, is_first_chunk, read_header, restore
from substreams.acker.core import announce, apply_entry
from substreams.acker.state import AckerState
from substreams.acker.table import SOURCE, STAGE, Violation
from substreams.control.messages import OffsetRange
from substreams.frontier import Keyed

SUBS = {"sess": 3, "x": None}
SOURCES = ["a", "b"]
RECORD = 2_500


def fresh_state() -> AckerState:
    state = AckerState()
    for sub, gap in SUBS.items():
        state.ensure(sub, 3, gap)
    return state


ranges = st.lists(
    st.builds(OffsetRange, st.just("s"), st.integers(0, 1), st.integers(0, 20),
              st.integers(20, 40)),
    max_size=2,
)


@st.composite
def op(draw: st.DrawFn) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(
        ["report"] * 6 + ["announce"] * 3 + ["seal"] * 2 + ["seal_keys"] * 2
        + ["commit"] * 4 + ["failed_commit", "crash", "register", "unregister"]
    ))
    sub = draw(st.sampled_from(list(SUBS)))
    if kind == "report":
        t: Any = (draw(st.builds(Keyed, st.sampled_from(["k", "j", "user-" + "x" * 40]),
                                 st.integers(0, 30)))
                  if SUBS[sub] is not None else draw(st.integers(0, 12)))
        return (kind, sub, t, draw(st.sampled_from([0, 0, 1])), draw(ranges))
    if kind == "seal":
        t = (draw(st.builds(Keyed, st.sampled_from(["k", "j"]), st.integers(0, 30)))
             if SUBS[sub] is not None else draw(st.integers(0, 12)))
        return (kind, sub, draw(st.sampled_from(SOURCES)), t)
    if kind == "seal_keys":
        return (kind, "sess", draw(st.sampled_from(SOURCES)), draw(st.integers(0, 40)))
    if kind in ("register", "unregister"):
        return (kind, sub, draw(st.sampled_from(SOURCES)), draw(st.sampled_from([SOURCE, STAGE])))
    return (kind,)


def apply(state: AckerState, o: tuple[Any, ...], now: int) -> None:
    kind = o[0]
    try:
        if kind == "report":
            _, sub, t, x, rs = o
            apply_entry(state.tables[sub], state.trackers[sub], t, x, 1, 1, rs, now)
        elif kind == "seal":
            _, sub, src, t = o
            if state.tables[sub].seal(src, t, now, now):
                state.trackers[sub].activate(t)
        elif kind == "seal_keys":
            state.tables[o[1]].seal_keys(o[2], o[3], now)
        elif kind == "register":
            state.tables[o[1]].register(o[2], o[3])
        elif kind == "unregister":
            state.tables[o[1]].unregister(o[2])
        elif kind == "announce":
            for sub, table in state.tables.items():
                tracker = state.trackers[sub]
                if announce(table, tracker, now)[2] is not None:
                    tracker.prune_keyed(table.keyed_floor())
                    state.last_notification[sub] = (0, now)
    except Violation:
        pass


def doc(state: AckerState) -> str:
    d = state.to_doc()
    for t in d["trackers"].values():
        t["active"] = sorted(json.dumps(a, sort_keys=True) for a in t["active"])
        t["upper"] = sorted(json.dumps(a, sort_keys=True) for a in t["upper"])
    for t in d["tables"].values():
        t["open"] = sorted(t["open"], key=lambda e: json.dumps(e[0], sort_keys=True))
        t["terminated"] = sorted(json.dumps(a, sort_keys=True) for a in t["terminated"])
        for src in t["sources"].values():
            src["seals"] = sorted(src["seals"], key=lambda e: json.dumps(e, sort_keys=True))
    return json.dumps(d, sort_keys=True)


def load(records: list[bytes]) -> tuple[AckerState, int]:
    """What the service's recovery does: the snapshot the last record names, from its first
    chunk on."""
    base = base_of(records[-1])
    assert base is not None
    first = max(i for i, r in enumerate(records) if is_first_chunk(r, base))
    return restore(records[first:], {}, 3)


def make_log(state: AckerState, base: int | None, chunks: int, small: int = 0) -> StateLog:
    log = StateLog.adopt(state, base)
    log.record_bytes = RECORD
    log.snapshot_min_bytes = 3_000
    log.chunks_per_commit = chunks
    log.small_entries = small
    return log


@settings(max_examples=300, deadline=None)
@given(st.lists(op(), min_size=5, max_size=80), st.integers(1, 3),
       st.sampled_from([0, 0, 0, 6]))
def test_restore_is_the_last_committed_state(
    ops: list[tuple[Any, ...]], chunks: int, small: int
) -> None:
    """``small``: 0 (every state is large: deltas and fuzzy snapshots), or a few entries
    (a state that small is written whole in each transaction, and grows out of it)."""
    state = fresh_state()
    log = make_log(state, None, chunks, small)
    committed: list[bytes] = []
    last_doc: str | None = None
    snapshots = 0
    for i, o in enumerate([("register", "sess", "a", SOURCE), ("register", "x", "a", SOURCE),
                           *ops, ("commit",), ("crash",)]):
        now = 1_000 + i
        kind = o[0]
        if kind in ("commit", "failed_commit"):
            state.checkpoints += 1
            records = log.records()
            for r in records:
                assert len(r) <= RECORD, len(r)  # the record bound, whatever the state
            if kind == "failed_commit":
                state.checkpoints -= 1
                kind = "crash"  # the service rewinds to its latest checkpoint
            else:
                log.committed()
                committed.extend(records)
                assert read_header(records[-1]).kind == "delta"
                snapshots += sum(1 for r in records if read_header(r).kind == "snap"
                                 and read_header(r).last)
                last_doc = doc(state)
                continue
        if kind == "crash":
            if not committed:
                state = fresh_state()
                log = make_log(state, None, chunks, small)
                continue
            state, base = load(committed)
            assert doc(state) == last_doc, i
            log = make_log(state, base, chunks, small)
            for sub, gap in SUBS.items():  # as the service's start does
                state.ensure(sub, 3, gap)
            continue
        apply(state, o, now)
    assert snapshots >= 1


def test_a_large_state_is_written_as_it_changes() -> None:
    """20,000 open sessions: no record over the bound, and a step that changes one key
    writes a delta of a few hundred bytes (not the state)."""
    state = fresh_state()
    table, tracker = state.tables["sess"], state.trackers["sess"]
    table.register("a", SOURCE)
    for k in range(20_000):
        t = Keyed(f"user-{k:07d}", 1_000)
        apply_entry(table, tracker, t, 0, 1, 1, [OffsetRange("s", 0, k, k + 1)], 5)
    log = StateLog(state)
    log.small_entries = 0
    state.checkpoints += 1
    first = log.records()
    log.committed()
    assert all(len(r) <= changelog.RECORD_BYTES for r in first)
    assert len(first) > 1  # a whole snapshot, in several records
    apply_entry(table, tracker, Keyed("user-0000007", 1_001), 0, 1, 1,
                [OffsetRange("s", 0, 9, 10)], 6)
    state.checkpoints += 1
    delta = log.records()
    log.committed()
    assert len(delta) == 1 and len(delta[0]) < 2_000, [len(r) for r in delta]
    again, _ = load(first + delta)
    assert doc(again) == doc(state)
