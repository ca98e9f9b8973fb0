"""Avro single-object encoding of data-topic records: the prefix's layout, the round trip,
and what a reader does with a record whose prefix is missing, short or unknown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Message
from fastavro.schema import to_parsing_canonical_form

from substreams.config import load_config
from substreams.errors import ProtocolError, SchemaMismatchError
from substreams.punctuation.aligner import Punctuation
from substreams.streams.framing import EnvelopeEncoder
from substreams.streams.listener import PunctuationEntry, StreamDecoder
from substreams.streams.records import Entry
from substreams.streams.schemas import (
    PREFIX_BYTES,
    Codec,
    envelope_schema,
    prefix_fingerprint,
    protocol_codec,
    protocol_prefixes,
)

CLICK = {
    "type": "record",
    "name": "Click",
    "fields": [{"name": "user", "type": "string"}, {"name": "ts", "type": "long"}],
}
RECORD = {"order_key": 5, "tracking_id": -3, "source": "s", "times": {},
          "payload": {"user": "u", "ts": 5}}


def crc64_avro(data: bytes) -> int:
    """The specification's CRC-64-AVRO (Rabin) fingerprint, written out here to check the
    codec's against."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_the_prefix_is_the_marker_and_the_little_endian_crc64_fingerprint() -> None:
    assert crc64_avro(b'"null"') == 7195948357588979594  # the specification's test vector
    codec = Codec(envelope_schema(CLICK))
    canonical = to_parsing_canonical_form(codec.schema).encode()
    assert codec.prefix == b"\xc3\x01" + crc64_avro(canonical).to_bytes(8, "little")
    assert len(codec.prefix) == PREFIX_BYTES
    data = codec.encode_single(RECORD)
    assert data == codec.prefix + codec.encode(RECORD)
    assert prefix_fingerprint(data) == codec.fingerprint_hex


def test_round_trip() -> None:
    codec = Codec(envelope_schema(CLICK))
    assert codec.decode_single(codec.encode_single(RECORD)) == RECORD


@pytest.mark.parametrize(
    "value",
    [b"", b"\xc3", b"\xc3\x01\x00\x01", b"\x00" * 20, b"\xc3\x02" + b"\x00" * 20],
    ids=["empty", "marker cut", "fingerprint cut", "no marker", "other marker"],
)
def test_a_record_without_a_whole_prefix_is_refused(value: bytes) -> None:
    codec = Codec(envelope_schema(CLICK), label="stream 'clicks'")
    assert prefix_fingerprint(value) is None
    with pytest.raises(SchemaMismatchError, match="stream 'clicks': not a single-object"):
        codec.decode_single(value)


def test_an_unknown_fingerprint_is_refused_naming_it() -> None:
    other = Codec(envelope_schema({**CLICK, "name": "Other"}))
    codec = Codec(envelope_schema(CLICK), label="stream 'clicks'", writers=lambda fp: None)
    with pytest.raises(SchemaMismatchError, match=other.fingerprint_hex.decode()):
        codec.decode_single(other.encode_single(RECORD))


def test_a_known_prefix_before_a_body_that_does_not_decode_is_refused() -> None:
    codec = Codec(envelope_schema(CLICK))
    with pytest.raises(SchemaMismatchError, match="cannot decode record"):
        codec.decode_single(codec.prefix + b"\x01garbage")


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> StreamDecoder:
    folder: Path = tmp_path_factory.mktemp("singlecfg")
    (folder / "click.avsc").write_text(json.dumps(CLICK))
    (folder / "substreams.yaml").write_text(
        "kafka: {bootstrap: 127.0.0.1:1}\n"
        "streams: [{name: clicks, schema: click.avsc, order_key: ts}]\n"
    )
    return StreamDecoder(load_config(folder / "substreams.yaml"), "clicks")


def _msg(value: bytes) -> Message:
    return Message(topic="clicks", partition=1, offset=3, value=value)


def test_the_decoder_tells_punctuations_from_data_by_their_fingerprint(
    decoder: StreamDecoder,
) -> None:
    envelope = EnvelopeEncoder(CLICK, "src").encode(5, -3, {"s": 5}, {"user": "u", "ts": 5})
    entry = decoder.decode(_msg(envelope))
    assert isinstance(entry, Entry)
    assert (entry.order_key, entry.tracking_id, entry.times, entry.payload) == (
        5, -3, {"s": 5}, {"user": "u", "ts": 5})
    punct = protocol_codec("punctuation")
    assert punct.prefix in protocol_prefixes("punctuation")
    seal = punct.encode_single(Punctuation("SEAL", "p", "sub", 4, 0).to_wire())
    got = decoder.decode(_msg(seal))
    assert isinstance(got, PunctuationEntry)
    assert Punctuation.from_wire(got.fields, got.partition, got.index).kind == "SEAL"
    with pytest.raises(ProtocolError, match="punctuation"):
        decoder.decode(_msg(punct.prefix + b"\x09"))
    # the header form is not read: a schemaless body is a record without a prefix
    with pytest.raises(SchemaMismatchError, match="not a single-object"):
        decoder.decode(_msg(punct.encode(Punctuation("SEAL", "p", "sub", 4, 0).to_wire())))
