"""The one protocol converter (substreams.streams.wire): every protocol message survives
encode -> bytes -> decode unchanged, and a type that does not match its schema is refused
when the converter is built, naming the field."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.commands import (
    AcksPartition,
    AllowCompaction,
    CancelPeek,
    Command,
    ConfigureSubstreams,
    CreateInstance,
    Frontiers,
    Hello,
    InitializationComplete,
    Peek,
    PeekCanceled,
    PeekError,
    PeekResponse,
    PeekRow,
    PeekRows,
    Rejected,
    Response,
    SessionPhase,
    StatusRequest,
    StatusResponse,
    SubstreamStatus,
    command_headers,
    decode_command,
    decode_response,
    encode_command,
    encode_response,
    response_headers,
)
from substreams.acker.protocol import (
    AckBlock,
    AckEntry,
    AckMessage,
    AckReport,
    Evict,
    Register,
    SealEntry,
    SourceHeartbeat,
    Unregister,
    ack_headers,
    decode_ack,
    encode_ack,
)
from substreams.control.messages import OffsetRange
from substreams.errors import ProtocolError
from substreams.frontier import Keyed
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec
from substreams.streams.wire import Converter

LONG = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=6)
coords = st.one_of(LONG, st.lists(LONG, min_size=1, max_size=3).map(tuple))
times = st.one_of(coords, st.builds(Keyed, TEXT, coords))
tuples_of = lambda s: st.lists(s, max_size=3).map(tuple)  # noqa: E731
ranges = st.builds(OffsetRange, TEXT, st.integers(0, 2**31 - 1), LONG, LONG)

command_bodies = st.one_of(
    st.builds(Hello, st.integers(0, 2**31 - 1)),
    st.just(CreateInstance()),
    st.just(InitializationComplete()),
    st.builds(ConfigureSubstreams, tuples_of(TEXT)),
    st.builds(AllowCompaction, TEXT, tuples_of(times)),
    st.builds(Peek, TEXT, TEXT, st.one_of(st.none(), times)),
    st.builds(CancelPeek, TEXT),
    st.just(StatusRequest()),
)
rows = st.builds(
    PeekRow, times, st.sampled_from(["OPEN", "COMPLETE"]), st.integers(0, 2**64 - 1), LONG,
    tuples_of(TEXT), LONG, st.one_of(st.none(), LONG), tuples_of(ranges),
)
response_bodies = st.one_of(
    st.builds(Frontiers, TEXT, tuples_of(times), tuples_of(times)),
    st.builds(
        PeekResponse, TEXT, TEXT,
        st.one_of(st.builds(PeekRows, tuples_of(rows)), st.builds(PeekError, TEXT),
                  st.just(PeekCanceled())),
    ),
    st.builds(
        StatusResponse,
        st.sampled_from(list(SessionPhase)),
        tuples_of(st.builds(
            SubstreamStatus, TEXT, tuples_of(times), tuples_of(times), LONG,
            st.one_of(st.none(), tuples_of(times)),
            st.one_of(st.none(), st.tuples(times, LONG)),
        )),
        tuples_of(st.builds(AcksPartition, st.integers(0, 2**31 - 1), LONG,
                            st.one_of(st.none(), LONG))),
        tuples_of(TEXT),
    ),
    st.builds(Rejected, TEXT),
)
ack_bodies = st.one_of(
    st.builds(Register, tuples_of(TEXT), st.sampled_from(["SOURCE", "STAGE"]), TEXT),
    st.builds(Unregister, tuples_of(TEXT)),
    st.builds(
        AckReport,
        tuples_of(st.builds(AckEntry, TEXT, times, LONG, LONG, LONG, tuples_of(ranges))),
        tuples_of(st.builds(SealEntry, TEXT, times, LONG, st.booleans())),
        tuples_of(st.builds(AckBlock, TEXT, *[st.binary()] * 5, tuples_of(TEXT),
                            *[st.binary()] * 4)),
    ),
    st.just(SourceHeartbeat()),
    st.builds(Evict, TEXT, TEXT),
)


@settings(max_examples=200)
@given(st.builds(Command, TEXT, TEXT, LONG, command_bodies, LONG))
def test_commands_round_trip(cmd: Command) -> None:
    assert decode_command(encode_command(cmd), command_headers()) == cmd


@settings(max_examples=200)
@given(st.builds(Response, TEXT, TEXT, TEXT, LONG, response_bodies, LONG))
def test_responses_round_trip(resp: Response) -> None:
    back = decode_response(encode_response(resp), response_headers())
    assert back == resp
    if isinstance(resp.body, PeekResponse):  # the wire's result union, seen as before
        assert isinstance(back.body, PeekResponse)
        assert (back.body.rows, back.body.error, back.body.canceled) == (
            resp.body.rows, resp.body.error, resp.body.canceled
        )


@settings(max_examples=200)
@given(st.builds(AckMessage, TEXT, LONG, LONG, ack_bodies, TEXT))
def test_acks_round_trip(msg: AckMessage) -> None:
    assert decode_ack(encode_ack(msg), ack_headers()) == msg


SCHEMA = {
    "type": "record", "name": "Pair", "namespace": "t",
    "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}],
}


def test_a_dataclass_without_a_schema_field_is_refused_naming_it() -> None:
    @dataclass(frozen=True)
    class Pair:
        a: int

    with pytest.raises(TypeError, match=r"Avro record Pair has fields \['b'\]"):
        Converter(SCHEMA).to_wire(Pair(1))


def test_a_python_only_field_needs_a_default() -> None:
    @dataclass(frozen=True)
    class Pair:
        a: int
        b: str
        c: int

    with pytest.raises(TypeError, match=r"Pair\.c is not in Avro record Pair"):
        Converter(SCHEMA).to_wire(Pair(1, "x", 2))


def test_a_record_may_be_a_positional_tuple() -> None:
    conv = Converter(SCHEMA)
    hint = tuple[int, str]
    assert conv.to_wire((3, "x"), hint) == {"a": 3, "b": "x"}
    assert conv.from_wire({"a": 3, "b": "x"}, hint) == (3, "x")


def test_a_field_with_an_avro_default_may_be_missing_from_an_older_datum() -> None:
    @dataclass(frozen=True)
    class Pair:
        a: int
        b: tuple[str, ...] = ()

    schema = {**SCHEMA, "fields": [SCHEMA["fields"][0],  # type: ignore[index]
                                   {"name": "b", "type": {"type": "array", "items": "string"},
                                    "default": []}]}
    conv = Converter(schema)
    assert conv.from_wire({"a": 1}, Pair) == Pair(1, ())
    assert conv.from_wire({"a": 1, "b": ["x"]}, Pair) == Pair(1, ("x",))


def test_an_ack_of_another_schema_is_refused() -> None:
    """One ack schema: a message whose fingerprint is not ``ack.avsc``'s (an older version,
    another protocol) is refused, never decoded by guess."""
    msg = AckMessage("src", 3, 5, AckReport((AckEntry("s", 4, -7, 1, 2, ()),), ()), "inc")
    other = protocol_codec("command").fingerprint_hex
    with pytest.raises(ProtocolError, match="fingerprint"):
        decode_ack(encode_ack(msg), [(HEADER_FINGERPRINT, other)])
