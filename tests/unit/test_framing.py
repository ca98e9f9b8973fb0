"""The publisher's envelope framing must be byte-identical to fastavro's encoding."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from substreams.frontier import Keyed, Time
from substreams.streams.framing import EnvelopeEncoder, zigzag_long
from substreams.streams.records import times_to_wire
from substreams.streams.schemas import Codec, envelope_schema

PAYLOAD = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "ts", "type": "long"},
        {"name": "batch", "type": "long"},
        {"name": "body", "type": "string"},
        {"name": "score", "type": ["null", "double"], "default": None},
    ],
}
ENVELOPE = Codec(envelope_schema(PAYLOAD))
LONG_SCHEMA = fastavro.parse_schema("long")

longs = st.integers(-(2**63), 2**63 - 1)
coords = st.integers(-(2**40), 2**40)
times: st.SearchStrategy[Time] = st.one_of(
    coords,
    st.tuples(coords, coords),
    st.builds(Keyed, st.text(max_size=5), coords),
    st.builds(Keyed, st.text(max_size=5), st.tuples(coords, coords, coords)),
)
payloads = st.fixed_dictionaries(
    {
        "ts": longs,
        "batch": longs,
        "body": st.text(max_size=40),
        "score": st.one_of(st.none(), st.floats(allow_nan=False)),
    }
)


def fastavro_long(n: int) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, LONG_SCHEMA, n)
    return buf.getvalue()


@given(longs)
def test_zigzag_long_matches_fastavro(n: int) -> None:
    assert zigzag_long(n) == fastavro_long(n)


@pytest.mark.parametrize(
    "n", [0, 1, -1, 63, -64, 64, -65, 8191, 8192, -8193, 2**62, 2**63 - 1, -(2**63)]
)
def test_zigzag_long_at_varint_boundaries(n: int) -> None:
    assert zigzag_long(n) == fastavro_long(n)


@given(
    order_key=longs,
    tracking_id=longs,
    source=st.text(max_size=20),
    assigned=st.dictionaries(st.text(max_size=8), times, max_size=4),
    payload=payloads,
)
def test_envelope_matches_fastavro(
    order_key: int,
    tracking_id: int,
    source: str,
    assigned: dict[str, Time],
    payload: dict[str, Any],
) -> None:
    encoder = EnvelopeEncoder(PAYLOAD, source)
    expected = ENVELOPE.encode(
        {
            "order_key": order_key,
            "tracking_id": tracking_id,
            "source": source,
            "times": times_to_wire(assigned),
            "payload": payload,
        }
    )
    # twice: the second call is served from the times cache
    assert encoder.encode(order_key, tracking_id, assigned, payload) == expected
    assert encoder.encode(order_key, tracking_id, assigned, payload) == expected


def test_envelope_decodes_with_the_envelope_schema() -> None:
    encoder = EnvelopeEncoder(PAYLOAD, "src-1")
    payload = {"ts": 7, "batch": 3, "body": "hello", "score": 0.5}
    data = encoder.encode(7, -42, {"ep": 3, "win": Keyed("k", 10)}, payload)
    decoded = ENVELOPE.decode(data)
    assert decoded["order_key"] == 7
    assert decoded["tracking_id"] == -42
    assert decoded["source"] == "src-1"
    assert decoded["payload"] == payload


def test_an_order_key_outside_long_is_refused() -> None:
    encoder = EnvelopeEncoder(PAYLOAD, "s")
    payload = {"ts": 1, "batch": 0, "body": "", "score": None}
    with pytest.raises(ValueError, match="does not fit an Avro long"):
        encoder.encode(2**63, 0, {}, payload)


def test_a_payload_of_the_wrong_type_is_refused() -> None:
    encoder = EnvelopeEncoder(PAYLOAD, "s")
    with pytest.raises((ValueError, TypeError)):
        encoder.encode(1, 0, {}, {"ts": "not a long", "batch": 0, "body": "", "score": None})
