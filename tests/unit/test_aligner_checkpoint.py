"""The punctuation aligner's checkpoint: an aligner restored from a dump taken at any point
of any input emits what one fed everything emits; the checkpoint document round-trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.control.progress import ProgressTracker
from substreams.errors import ProtocolError
from substreams.frontier import Keyed, Time
from substreams.punctuation.aligner import Aligner, Event, Punctuation
from substreams.punctuation.checkpoint import AlignerCheckpoint
from substreams.streams.records import Entry
from tests.unit.test_aligner import STREAM, SUB, feed

PARTS = 3
PRODUCERS = ("p0", "p1", "p2")

ints = st.integers(0, 5)
times: st.SearchStrategy[Time] = st.one_of(
    ints,
    st.tuples(st.integers(0, 3), st.integers(0, 3)),
    st.builds(Keyed, st.sampled_from(("a", "b")), ints),
)


@st.composite
def inputs(draw: st.DrawFn) -> list[Entry | Punctuation]:
    """Any messages in any order (registrations with and without a start, seals, leaves,
    records of registered and unknown producers, records below their own seals)."""
    offsets = dict.fromkeys(range(PARTS), 0)
    out: list[Entry | Punctuation] = []
    for i in range(draw(st.integers(0, 60))):
        q = draw(st.integers(0, PARTS - 1))
        who = draw(st.sampled_from((*PRODUCERS, "stranger")))
        kind = draw(st.sampled_from(("record", "record", "record", "SEAL", "SEAL", "REGISTER",
                                     "UNREGISTER")))
        at = offsets[q]
        offsets[q] += 1
        if kind == "record":
            t = draw(times)
            out.append(Entry(STREAM, q, at, 0, i, who, {SUB: t}, {"i": i}))
        elif kind == "REGISTER":
            out.append(Punctuation("REGISTER", who, SUB, draw(st.none() | times), q, at, i))
        elif kind == "SEAL":
            out.append(Punctuation("SEAL", who, SUB, draw(times), q, at, i))
        else:
            out.append(Punctuation("UNREGISTER", who, SUB, None, q, at, i))
    return out


def run(aligner: Aligner, msgs: list[Entry | Punctuation]) -> list[Event]:
    return [ev for m in msgs for ev in feed(aligner, m)]


@settings(max_examples=400, deadline=None)
@given(inputs(), st.data(), st.booleans())
def test_an_aligner_restored_at_any_point_emits_what_a_full_run_emits(
    msgs: list[Entry | Punctuation], data: st.DataObject, ordered: bool
) -> None:
    cut = data.draw(st.integers(0, len(msgs)))
    whole = run(Aligner(SUB, STREAM, range(PARTS), bound="soft", ordered=ordered), msgs)
    first = Aligner(SUB, STREAM, range(PARTS), bound="soft", ordered=ordered)
    before = run(first, msgs[:cut])
    dumped = json.loads(json.dumps(first.to_state()))  # as the checkpoint stores it
    again = Aligner.from_state(dumped, SUB, STREAM, bound="soft", ordered=ordered)
    assert again.to_state() == first.to_state()
    after = run(again, msgs[cut:])
    assert before + after == whole  # nothing lost, nothing twice, same order
    assert again.to_state() == run_state(msgs, ordered)


def run_state(msgs: list[Entry | Punctuation], ordered: bool) -> dict[str, object]:
    aligner = Aligner(SUB, STREAM, range(PARTS), bound="soft", ordered=ordered)
    run(aligner, msgs)
    return aligner.to_state()


def test_a_firm_aligner_holding_records_refuses_to_dump() -> None:
    aligner = Aligner(SUB, STREAM, [0], bound="firm")
    aligner.on_punctuation(Punctuation("REGISTER", "p", SUB, None, 0, 0))
    aligner.on_record(Entry(STREAM, 0, 1, 0, 1, "p", {SUB: 0}, {}))
    aligner.on_record(Entry(STREAM, 0, 2, 0, 2, "p", {SUB: 1}, {}))  # held behind time 0
    assert aligner.held() == 1
    with pytest.raises(ValueError, match="holds 1 records back"):
        aligner.to_state()


def test_a_malformed_aligner_state_is_a_protocol_error() -> None:
    state = Aligner(SUB, STREAM, [0]).to_state()
    del state["pending"]
    with pytest.raises(ProtocolError, match="aligner state"):
        Aligner.from_state(state, SUB, STREAM)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.integers(0, 7), st.integers(0, 2**40)),
    st.lists(times, unique=True, max_size=5),
    st.integers(0, 2**31),
    st.integers(0, 2**31),
)
def test_the_checkpoint_document_round_trips(
    positions: dict[int, int], announced: list[Time], seq: int, dead_from: int
) -> None:
    aligner = Aligner(SUB, STREAM, range(PARTS))
    aligner.on_punctuation(Punctuation("SEAL", "p", SUB, 3, 1, 0, 7))
    tracker = ProgressTracker(SUB)
    tracker.activate(4)
    ckpt = AlignerCheckpoint(positions, aligner.to_state(), tracker.to_state(), seq, dead_from,
                             announced)
    back = AlignerCheckpoint.from_body(ckpt.to_body())
    assert back == ckpt


def test_a_checkpoint_of_another_version_is_refused() -> None:
    body = AlignerCheckpoint({}, {}, {}, 0).to_body()
    doc = json.loads(body.state)
    doc["version"] = 99
    bad = type(body)(body.acks_offsets, json.dumps(doc).encode())
    with pytest.raises(ProtocolError, match="version 99"):
        AlignerCheckpoint.from_body(bad)
