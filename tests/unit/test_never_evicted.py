"""A source may register as never evicted for silence (a Spark query's driver): the flag
travels on the wire, survives the acker's checkpoint, is read as "evictable" from older
checkpoints, and is chosen by the composition root."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from substreams.acker.protocol import AckMessage, Register, decode_ack, encode_ack, split_body
from substreams.acker.state import SourceSession
from substreams.acker.table import SOURCE, STAGE
from substreams.acker.tracker import source_tracker
from substreams.app import DIRECT, TRACKED, UNTRACKED, never_evicted
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec

names = st.text("abcxyz.", min_size=1, max_size=8)


@given(st.lists(names, min_size=1, max_size=5, unique=True), st.sampled_from([SOURCE, STAGE]),
       st.booleans())
def test_register_round_trips_with_its_eviction_flag(
    subs: list[str], role: str, evict: bool
) -> None:
    msg = AckMessage("src", 0, 5, Register(tuple(subs), role, "txn", evict), "inc")
    fp = protocol_codec("ack").fingerprint_hex
    assert decode_ack(encode_ack(msg), [(HEADER_FINGERPRINT, fp)]) == msg
    # Split per acks partition, every part keeps the flag.
    parts = split_body(msg.body, lambda s: len(s) % 3)
    assert {p.evict_when_silent for _, p in parts if isinstance(p, Register)} == {evict}


@given(st.booleans(), st.booleans())
def test_source_session_state_round_trips(evicted: bool, evict_when_silent: bool) -> None:
    s = SourceSession("inc", 7, 1000, "txn", evicted, evict_when_silent)
    assert SourceSession.from_state(s.to_state()) == s


def test_a_checkpoint_from_before_the_flag_reads_as_evictable() -> None:
    assert SourceSession.from_state(["inc", 7, 1000, "txn", False]).evict_when_silent


def test_never_evicted_only_changes_the_acker_tracker() -> None:
    pinned = never_evicted(TRACKED)
    assert pinned["punctuations"] is TRACKED["punctuations"]
    factory = pinned["acker"]
    assert factory is not source_tracker
    assert getattr(factory, "func", None) is source_tracker
    assert getattr(factory, "keywords", None) == {"evict_when_silent": False}
    # No acker tracker to tell: the same mechanisms.
    assert never_evicted(DIRECT) is DIRECT and never_evicted(UNTRACKED) is UNTRACKED
