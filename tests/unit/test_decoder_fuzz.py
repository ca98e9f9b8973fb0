"""Every decoder raises one documented error (:class:`DecodeError`) for any bytes.

Why mutations of valid messages as well as random bytes: random bytes rarely get past
the first field, while a valid message with a flipped, dropped or inserted byte reaches the
semantic checks (times, unions, nested records) where non-Avro errors could escape.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from substreams.acker.commands import (
    AllowCompaction,
    Command,
    Frontiers,
    Peek,
    PeekResponse,
    PeekRow,
    PeekRows,
    Response,
    SessionPhase,
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
    AckEntry,
    AckMessage,
    AckReport,
    Evict,
    Register,
    SealEntry,
    ack_headers,
    decode_ack,
    encode_ack,
)
from substreams.acker.state import STATE_VERSION, AckerState
from substreams.acker.table import SOURCE
from substreams.config import load_config
from substreams.control.chain import ChainHead
from substreams.control.io import decode_control
from substreams.control.messages import (
    ChainResume,
    Checkpoint,
    EpochComplete,
    FrontierSnapshot,
    FrontierUpdate,
    OffsetRange,
    SourceEvicted,
    WriterHeartbeat,
)
from substreams.errors import DecodeError, ProtocolError
from substreams.frontier import Antichain, Keyed, UpperAntichain
from substreams.punctuation.aligner import Punctuation
from substreams.streams.framing import EnvelopeEncoder
from substreams.streams.listener import PunctuationEntry, StreamDecoder
from substreams.streams.schemas import PREFIX_BYTES, protocol_codec

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

R = OffsetRange("clicks", 0, 3, 9)
ACKS = [
    encode_ack(
        AckMessage(
            "src",
            4,
            1000,
            AckReport(
                (AckEntry("sub", 7, 12345, 3, 2, (R,)), AckEntry("sub", (1, 2), 1, 1, 1, ())),
                (SealEntry("sub", Keyed("k", 3), 999),),
            ),
            "inc",
        )
    ),
    encode_ack(AckMessage("src", 1, 5, Register(("a", "b"), SOURCE, "tx"), "inc")),
    encode_ack(AckMessage("op", 0, 5, Evict("src", "by hand"))),
]
_BODIES = [
    EpochComplete("sub", 7, (R,), 6, 1000, ((7, -1), (8, 1))),
    FrontierSnapshot("sub", Antichain([3]), UpperAntichain([9]), (R,)),
    FrontierUpdate("sub", (((1, 2), 1), ((0, 5), -1))),
    WriterHeartbeat("sub"),
    Checkpoint(((0, 10), (1, 4)), b"state"),
    SourceEvicted("sub", "src", "inc", 100, "silent"),
    ChainResume("acker", 42, 41, b"\x01" * 32, "operator", "replayed by hand"),
]
CONTROL = [ChainHead().append_encoded("acker", body, 1234)[1] for body in _BODIES]
COMMANDS = [
    encode_command(Command("ctl", "n1", 3, Peek("u", "sub", Keyed("k", (1, 2))), 77)),
    encode_command(Command("ctl", "n1", 4, AllowCompaction("sub", (5, 6)), 78)),
]
RESPONSES = [
    encode_response(
        Response(
            "acker",
            "ctl",
            "n1",
            3,
            PeekResponse(
                "u", "sub", PeekRows((PeekRow(7, "OPEN", 2**64 - 1, 3, ("a",), 5, 9, (R,)),))
            ),
            1,
        )
    ),
    encode_response(
        Response(
            "acker",
            "ctl",
            "n1",
            -1,
            StatusResponse(
                SessionPhase.COMPUTATION,
                (SubstreamStatus("sub", (1,), (3,), 2, (0,), (2, 55)),),
                (),
                ("sub",),
            ),
            1,
        )
    ),
    encode_response(Response("acker", "ctl", "n1", -1, Frontiers("sub", (1,), (2,)), 1)),
]


def _checkpoint() -> bytes:
    state = AckerState()
    state.ensure("sub", 10)
    return state.dumps()


CHECKPOINTS = [_checkpoint()]


def mutated(samples: list[bytes]) -> st.SearchStrategy[bytes]:
    """Random bytes, or a valid sample truncated, with a byte changed, inserted or dropped."""

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        raw = bytearray(draw(st.sampled_from(samples)))
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(raw)))
            how = draw(st.sampled_from(["truncate", "set", "insert", "drop"]))
            if how == "truncate":
                raw = raw[:at]
            elif how == "set" and at < len(raw):
                raw[at] = draw(st.integers(0, 255))
            elif how == "insert":
                raw[at:at] = draw(st.binary(min_size=1, max_size=4))
            elif at < len(raw):
                del raw[at]
        return bytes(raw)

    return st.one_of(st.binary(max_size=200), mutate())


def headers_for(valid: list[tuple[str, bytes]]) -> st.SearchStrategy[Any]:
    """Mostly the right headers (so that the bytes are decoded), sometimes none or garbage."""
    return st.one_of(
        st.just(valid),
        st.just(valid),
        st.just(None),
        st.lists(st.tuples(st.sampled_from(["ss.fp", "x"]), st.binary(max_size=20))),
    )


def only_decode_errors(decode: Callable[[], object], error: type[DecodeError]) -> None:
    """``decode`` returns or raises ``error``; anything else fails the test."""
    with contextlib.suppress(error):
        decode()


def test_samples_decode() -> None:
    """The samples the fuzzers mutate are valid: the mutations start from real messages."""
    for value in ACKS:
        decode_ack(value, ack_headers())
    for value in COMMANDS:
        decode_command(value, command_headers())
    for value in RESPONSES:
        decode_response(value, response_headers())
    codec = protocol_codec("control")
    decoded = [decode_control(Message(value=v, headers=codec.headers())).body for v in CONTROL]
    assert decoded == _BODIES
    AckerState.loads(CHECKPOINTS[0], {0: 1}, 10)


@FUZZ
@given(mutated(ACKS), headers_for(ack_headers()))
def test_acks_decoder(value: bytes, headers: Any) -> None:
    only_decode_errors(lambda: decode_ack(value, headers), ProtocolError)


@FUZZ
@given(mutated(CONTROL), headers_for(protocol_codec("control").headers()))
def test_control_decoder(value: bytes, headers: Any) -> None:
    msg = Message(topic="_control", partition=0, offset=7, value=value, headers=headers)
    only_decode_errors(lambda: decode_control(msg), ProtocolError)


@FUZZ
@given(mutated(COMMANDS), headers_for(command_headers()))
def test_command_decoder(value: bytes, headers: Any) -> None:
    only_decode_errors(lambda: decode_command(value, headers), ProtocolError)


@FUZZ
@given(mutated(RESPONSES), headers_for(response_headers()))
def test_response_decoder(value: bytes, headers: Any) -> None:
    only_decode_errors(lambda: decode_response(value, headers), ProtocolError)


@FUZZ
@given(st.one_of(mutated(CHECKPOINTS), st.binary(max_size=100).map(zlib.compress)))
def test_checkpoint_decoder_bytes(value: bytes) -> None:
    only_decode_errors(lambda: AckerState.loads(value, {}, 10), ProtocolError)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@FUZZ
@given(
    st.fixed_dictionaries(
        {"version": st.just(STATE_VERSION)},
        optional={
            k: json_values
            for k in ("checkpoints", "tables", "trackers", "sessions", "last_notification")
        },
    )
)
def test_checkpoint_decoder_documents(doc: dict[str, Any]) -> None:
    """Well-compressed JSON of the right version whose content is nonsense."""
    value = zlib.compress(json.dumps(doc).encode())
    only_decode_errors(lambda: AckerState.loads(value, {}, 10), ProtocolError)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> StreamDecoder:
    folder: Path = tmp_path_factory.mktemp("fuzzcfg")
    (folder / "click.avsc").write_text(
        json.dumps(
            {
                "type": "record",
                "name": "Click",
                "fields": [
                    {"name": "user", "type": "string"},
                    {"name": "ts", "type": "long"},
                ],
            }
        )
    )
    (folder / "substreams.yaml").write_text(
        "kafka: {bootstrap: 127.0.0.1:1}\n"
        "streams: [{name: clicks, schema: click.avsc, order_key: ts}]\n"
    )
    return StreamDecoder(load_config(folder / "substreams.yaml"), "clicks")


def _envelopes(decoder: StreamDecoder) -> list[bytes]:
    enc = EnvelopeEncoder(
        {
            "type": "record",
            "name": "Click",
            "fields": [{"name": "user", "type": "string"}, {"name": "ts", "type": "long"}],
        },
        "src",
    )
    return [
        enc.encode(5, -3, {"s": 5, "w": (1, 2), "k": Keyed("u", 4)}, {"user": "u", "ts": 5}),
        enc.encode(9, 2**62, {}, {"user": "", "ts": -1}),
    ]


PUNCTUATIONS = [
    protocol_codec("punctuation").encode_single(
        Punctuation("SEAL", "p", "sub", (3, 4), 0).to_wire()),
    protocol_codec("punctuation").encode_single(
        Punctuation("REGISTER", "p", "sub", None, 0).to_wire()),
]


@FUZZ
@given(data=st.data())
def test_envelope_decoder(decoder: StreamDecoder, data: st.DataObject) -> None:
    """Mutated envelopes, their single-object prefix included (a missing, short or unknown
    prefix is a ``SchemaMismatchError``); headers are not read."""
    value = data.draw(mutated(_envelopes(decoder) + PUNCTUATIONS))
    headers = data.draw(headers_for(protocol_codec("control").headers()))
    msg = Message(topic="clicks", partition=1, offset=3, value=value, headers=headers)
    only_decode_errors(lambda: decoder.decode(msg), DecodeError)


@FUZZ
@given(data=st.data())
def test_punctuation_decoder(decoder: StreamDecoder, data: st.DataObject) -> None:
    """A mutated body behind the punctuation schema's prefix: a punctuation or a
    ``ProtocolError``, never a data record or another error."""
    sample = data.draw(st.sampled_from(PUNCTUATIONS))
    value = sample[:PREFIX_BYTES] + data.draw(mutated([sample[PREFIX_BYTES:]]))
    msg = Message(topic="clicks", partition=1, offset=3, value=value)

    def decode() -> Punctuation:
        entry = decoder.decode(msg)
        assert isinstance(entry, PunctuationEntry)
        return Punctuation.from_wire(entry.fields, entry.partition, entry.index)

    only_decode_errors(decode, ProtocolError)
