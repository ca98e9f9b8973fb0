"""The control hash chain: a writer's one-pass signed encoding equals sign-then-encode."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from substreams.control.chain import GENESIS, ChainHead, ChainVerifier, compute_digest, sign
from substreams.control.messages import (
    Checkpoint,
    ControlBody,
    ControlRecord,
    EpochComplete,
    FrontierUpdate,
    OffsetRange,
    WriterHeartbeat,
    record_from_wire,
    record_to_wire,
)
from substreams.frontier import Keyed, Time
from substreams.streams.schemas import protocol_codec

CODEC = protocol_codec("control")

ranges = st.builds(
    OffsetRange,
    st.text(max_size=6),
    st.integers(0, 64),
    st.integers(0, 2**40),
    st.integers(0, 2**40),
)
bodies: st.SearchStrategy[ControlBody] = st.one_of(
    st.builds(
        EpochComplete,
        st.text(max_size=8),
        st.integers(-(2**40), 2**40),
        st.lists(ranges, max_size=3).map(tuple),
        st.integers(0, 2**31),
        st.integers(0, 2**45),
    ),
    st.builds(
        FrontierUpdate,
        st.text(max_size=8),
        st.lists(st.tuples(st.integers(0, 2**40), st.sampled_from([-1, 1])), max_size=3).map(tuple),
    ),
    st.builds(WriterHeartbeat, st.one_of(st.none(), st.text(max_size=8))),
    st.builds(Checkpoint, st.just(((0, 5),)), st.binary(max_size=300)),
)


@given(
    writer=st.text(max_size=30),
    seq=st.integers(0, 2**62),
    prev=st.one_of(st.just(GENESIS), st.binary(min_size=32, max_size=32), st.binary(max_size=3)),
    stamp=st.integers(0, 2**45),
    body=bodies,
)
def test_sign_equals_digest_then_encode(
    writer: str, seq: int, prev: bytes, stamp: int, body: ControlBody
) -> None:
    record = ControlRecord(writer, seq, prev, b"", stamp, body)
    signed, encoded = sign(record)
    assert signed.digest == compute_digest(record)
    assert encoded == CODEC.encode(record_to_wire(signed))


def test_a_chain_of_encoded_records_verifies() -> None:
    head = ChainHead()
    verifier = ChainVerifier()
    for i in range(5):
        _, encoded = head.append_encoded("acker.a", EpochComplete("s", i, (), 1, 0), 1000 + i)
        decoded = record_from_wire(CODEC.decode(encoded))
        assert verifier.check(i, decoded) is None
    assert head.next_seq == 5


LONG = st.integers(-(2**63), 2**63 - 1)
coords = st.one_of(LONG, st.lists(LONG, max_size=3).map(tuple))
times: st.SearchStrategy[Time] = st.one_of(
    LONG, st.lists(LONG, max_size=3).map(tuple), st.builds(Keyed, st.text(max_size=6), coords)
)
epoch_completes = st.builds(
    EpochComplete,
    st.text(max_size=8),
    times,
    st.lists(
        st.builds(OffsetRange, st.text(max_size=6), st.integers(0, 2**31 - 1), LONG, LONG),
        max_size=3,
    ).map(tuple),
    LONG,
    LONG,
    st.lists(st.tuples(times, st.sampled_from([-1, 1])), max_size=3).map(tuple),
    st.one_of(st.none(), times),
)


@given(
    writer=st.text(max_size=30),
    seq=LONG,
    prev=st.one_of(st.just(GENESIS), st.binary(max_size=40)),
    stamp=LONG,
    body=epoch_completes,
)
def test_a_hand_framed_epoch_complete_is_fastavros_encoding(
    writer: str, seq: int, prev: bytes, stamp: int, body: EpochComplete
) -> None:
    """EpochComplete skips fastavro when signed: its bytes, and so its digest, must be
    exactly fastavro's, for every shape of time (int, tuple, keyed) and any long."""
    record = ControlRecord(writer, seq, prev, b"", stamp, body)
    reference = CODEC.encode(record_to_wire(replace(record, digest=b"")))
    signed, encoded = sign(record)
    assert signed.digest == hashlib.sha256(prev + reference).digest()
    assert encoded == CODEC.encode(record_to_wire(signed))
    assert record_from_wire(CODEC.decode(encoded)) == signed
