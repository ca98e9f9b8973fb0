"""The control hash chain: a writer's one-pass signed encoding equals sign-then-encode."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from substreams.control.chain import GENESIS, ChainHead, ChainVerifier, compute_digest, sign
from substreams.control.messages import (
    Checkpoint,
    Completion,
    ControlBody,
    ControlRecord,
    EpochComplete,
    EpochsComplete,
    FrontierUpdate,
    OffsetRange,
    WriterHeartbeat,
    completions,
    record_from_wire,
    record_to_wire,
)
from substreams.frontier import Keyed, Time
from substreams.streams.schemas import Codec, protocol_codec, raw_schema

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
    assert_framed_like_fastavro(ControlRecord(writer, seq, prev, b"", stamp, body))


def assert_framed_like_fastavro(record: ControlRecord) -> None:
    """The hand-framed signed encoding is fastavro's, byte for byte, and so is the digest."""
    reference = CODEC.encode(record_to_wire(replace(record, digest=b"")))
    signed, encoded = sign(record)
    assert signed.digest == hashlib.sha256(record.prev_digest + reference).digest()
    assert encoded == CODEC.encode(record_to_wire(signed))
    assert record_from_wire(CODEC.decode(encoded)) == signed


epochs_completes = st.builds(
    EpochsComplete,
    st.text(max_size=8),
    st.lists(
        st.builds(
            Completion,
            times,
            st.lists(
                st.builds(OffsetRange, st.text(max_size=6), st.integers(0, 2**31 - 1), LONG,
                          LONG),
                max_size=3,
            ).map(tuple),
            LONG,
            LONG,
            st.one_of(st.none(), times),
        ),
        min_size=1,
        max_size=4,
    ).map(tuple),
    st.lists(st.tuples(times, st.sampled_from([-1, 1])), max_size=3).map(tuple),
)


@given(
    writer=st.text(max_size=30),
    seq=LONG,
    prev=st.one_of(st.just(GENESIS), st.binary(max_size=40)),
    stamp=LONG,
    body=epochs_completes,
)
def test_a_hand_framed_epochs_complete_is_fastavros_encoding(
    writer: str, seq: int, prev: bytes, stamp: int, body: EpochsComplete
) -> None:
    """A batched completion is framed by hand too: same bytes as fastavro, same digest."""
    assert_framed_like_fastavro(ControlRecord(writer, seq, prev, b"", stamp, body))


@given(body=epochs_completes)
def test_completions_expand_a_batch_in_order_with_lower_updates_last(
    body: EpochsComplete,
) -> None:
    """An EpochsComplete means exactly the EpochCompletes of its epochs, in order; its
    lower-frontier changes apply once, after the last."""
    out = completions(body)
    assert [(c.time, c.ranges, c.records, c.sealed_at_ms, c.until) for c in out] == [
        (e.time, e.ranges, e.records, e.sealed_at_ms, e.until) for e in body.epochs
    ]
    assert all(c.substream == body.substream for c in out)
    assert [c.lower_updates for c in out[:-1]] == [()] * (len(out) - 1)
    assert out[-1].lower_updates == body.lower_updates
    single = EpochComplete("s", 3, (), 1, 0)
    assert completions(single) == (single,)
    assert completions(WriterHeartbeat(None)) == ()


def test_records_written_with_the_previous_control_schema_still_decode() -> None:
    """Topics outlive an upgrade: an EpochComplete written by the schema version before
    EpochsComplete existed (other fingerprint) decodes, and its digest still verifies."""
    old = Codec(raw_schema("control.v1"), union_names=True)
    assert old.fingerprint_hex != CODEC.fingerprint_hex
    record, _ = sign(ControlRecord("acker.a", 0, GENESIS, b"", 5,
                                   EpochComplete("s", Keyed("u", 7), (), 2, 1)))
    data = old.encode(record_to_wire(record))
    decoded = record_from_wire(CODEC.decode(data, old.fingerprint_hex))
    assert decoded == record
    assert ChainVerifier().check(0, decoded) is None
