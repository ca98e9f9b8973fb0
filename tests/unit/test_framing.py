"""The publisher's envelope framing must be byte-identical to fastavro's encoding."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from substreams.frontier import Keyed, Time
from substreams.streams.framing import (
    COLUMNAR_MIN_ROWS,
    EnvelopeEncoder,
    column_plan,
    frame_rows,
    payload_parts,
    payload_writer,
    zigzag_long,
)
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
    "n",
    [0, 1, -1, 63, -64, 64, -65, 8191, 8192, -8193, 2**62, 2**63 - 1, -(2**63),
     2**55 - 1, 2**55, -(2**55), -(2**55) - 1, 2**59, -(2**59) - 1,  # 5 digit pairs
     2**27 - 1, 2**27, -(2**27), -(2**27) - 1,  # 2 and 3 pairs
     2**41 - 1, 2**41, -(2**41), -(2**41) - 1, 1_700_000_000_000],  # 3 and 4 pairs
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
    # the single-object prefix, then exactly fastavro's encoding of the whole envelope
    expected = ENVELOPE.prefix + ENVELOPE.encode(
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
    assert data.startswith(b"\xc3\x01" + ENVELOPE.fingerprint)
    decoded = ENVELOPE.decode_single(data)
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


# -- #16: the batch path and the compiled payload writer ---------------------------------------

records = st.tuples(longs, longs, st.dictionaries(st.text(max_size=8), times, max_size=3), payloads)


@given(source=st.text(max_size=10), batch=st.lists(records, max_size=30))
def test_encode_many_equals_encode_record_by_record(
    source: str, batch: list[tuple[int, int, dict[str, Time], dict[str, Any]]]
) -> None:
    many = EnvelopeEncoder(PAYLOAD, source)
    one = EnvelopeEncoder(PAYLOAD, source)
    order_keys = [r[0] for r in batch]
    ids = [r[1] for r in batch]
    assigned = [r[2] for r in batch]
    bodies = [r[3] for r in batch]
    expected = [one.encode(k, i, t, p) for k, i, t, p in batch]
    assert many.encode_many(order_keys, ids, assigned, bodies) == expected


@given(
    batch=st.lists(st.tuples(longs, st.integers(0, 3), payloads), min_size=1, max_size=30),
    name=st.text(max_size=8),
)
def test_encode_many_with_runs_of_one_int_time_equals_fastavro(
    batch: list[tuple[int, int, dict[str, Any]]], name: str
) -> None:
    """The one-substream int-time splice (granularity 1 and runs of equal epochs)."""
    encoder = EnvelopeEncoder(PAYLOAD, "src")
    assigned: list[dict[str, Time]] = [{name: t} for _, t, _ in batch]
    got = encoder.encode_many([0] * len(batch), [r[0] for r in batch], assigned,
                              [r[2] for r in batch])
    expected = [
        ENVELOPE.prefix + ENVELOPE.encode(
            {
                "order_key": 0,
                "tracking_id": tid,
                "source": "src",
                "times": times_to_wire(a),
                "payload": p,
            }
        )
        for (tid, _, p), a in zip(batch, assigned, strict=True)
    ]
    assert got == expected


def test_encode_many_refuses_an_order_key_outside_long_before_encoding() -> None:
    encoder = EnvelopeEncoder(PAYLOAD, "s")
    payload = {"ts": 1, "batch": 0, "body": "", "score": None}
    with pytest.raises(ValueError, match="does not fit an Avro long"):
        encoder.encode_many([0, 2**63], [0, 0], [{}, {}], [payload, payload])


WIDE = {
    "type": "record",
    "name": "Wide",
    "fields": [
        {"name": "l", "type": "long"},
        {"name": "i", "type": {"type": "int"}},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "f", "type": "boolean"},
        {"name": "d", "type": "double"},
        {"name": "x", "type": "float"},
        {"name": "n", "type": "null"},
        {"name": "u", "type": ["null", "string", "long"], "default": None},
    ],
}
WIDE_PARSED = fastavro.parse_schema(WIDE)

# Values of every kind, the wrong ones included: the compiled writer must frame the right
# ones exactly as fastavro does and hand everything else to fastavro (same bytes or error).
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, width=32),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.binary(max_size=10),
)
wide_payloads = st.fixed_dictionaries(
    {
        "l": st.one_of(longs, anything),
        "i": st.one_of(st.integers(-(2**31), 2**31 - 1), anything),
        "s": st.one_of(st.text(max_size=20), anything),
        "b": st.one_of(st.binary(max_size=20), anything),
        "f": st.one_of(st.booleans(), anything),
        "d": st.one_of(st.floats(allow_nan=False), anything),
        "x": st.one_of(st.floats(allow_nan=False, width=32), anything),
        "n": st.one_of(st.none(), anything),
    },
    # "u" may be missing (its default), or anything
    optional={"u": st.one_of(st.none(), st.text(max_size=5), longs, anything)},
)


def _fastavro_or_error(schema: Any, payload: Any) -> bytes | type[BaseException]:
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, schema, payload)
    except Exception as exc:  # compared by type below
        return type(exc)
    return buf.getvalue()


@given(wide_payloads)
def test_the_compiled_payload_writer_equals_fastavro_or_fails_as_it_does(
    payload: dict[str, Any],
) -> None:
    encoder = EnvelopeEncoder(WIDE, "s")
    assert payload_writer(WIDE) is not None  # this schema is compiled, not left to fastavro
    expected = _fastavro_or_error(WIDE_PARSED, payload)
    try:
        got: bytes | type[BaseException] = encoder.payload(payload)
    except Exception as exc:
        got = type(exc)
    assert got == expected


@pytest.mark.parametrize(
    "field_type",
    [
        ["int", "double"],  # fastavro may write an int into the double branch
        ["boolean", "long"],
        {"type": "long", "logicalType": "timestamp-millis"},
        {"type": "array", "items": "long"},
        {"type": "record", "name": "Inner", "fields": [{"name": "a", "type": "long"}]},
        {"type": "enum", "name": "E", "symbols": ["A"]},
    ],
)
def test_schemas_the_compiled_writer_leaves_to_fastavro(field_type: Any) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "v", "type": field_type}]}
    assert payload_writer(schema) is None


# -- the publisher at granularity 1 (session 9): one int-time substream as a column ------------


@given(
    batch=st.lists(
        st.tuples(longs, longs, st.one_of(longs, st.integers(-3, 3)), payloads), max_size=30
    ),
    name=st.text(max_size=8),
    source=st.text(max_size=10),
    time_is_key=st.booleans(),
)
def test_encode_many_int_times_equals_the_generic_path_and_fastavro(
    batch: list[tuple[int, int, int, dict[str, Any]]], name: str, source: str, time_is_key: bool
) -> None:
    """Byte for byte what ``encode_many`` of ``{name: t}`` dicts gives, and what fastavro gives
    for the whole envelope: times equal to the order key (the reuse of its bytes), runs of
    equal small times and random longs."""
    keys = [r[0] for r in batch]
    ids = [r[1] for r in batch]
    column = keys if time_is_key else [r[2] for r in batch]
    bodies = [r[3] for r in batch]
    got = EnvelopeEncoder(PAYLOAD, source).encode_many_int_times(keys, ids, name, column, bodies)
    generic = EnvelopeEncoder(PAYLOAD, source).encode_many(
        keys, ids, [{name: t} for t in column], bodies
    )
    assert got == generic
    assert got == [
        ENVELOPE.prefix + ENVELOPE.encode(
            {
                "order_key": k,
                "tracking_id": i,
                "source": source,
                "times": times_to_wire({name: t}),
                "payload": p,
            }
        )
        for k, i, t, p in zip(keys, ids, column, bodies, strict=True)
    ]


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, 2**70])
def test_an_int_time_outside_long_is_refused_not_truncated(bad: int) -> None:
    """zigzag_long masks to 64 bits: without the range check such a time was written as
    another one (fastavro raises OverflowError for it)."""
    encoder = EnvelopeEncoder(PAYLOAD, "s")
    payload = {"ts": 1, "batch": 0, "body": "", "score": None}
    with pytest.raises(ValueError, match=r"time .* does not fit an Avro long"):
        encoder.encode_many_int_times([0, 1], [0, 0], "ep", [0, bad], [payload, payload])
    with pytest.raises(OverflowError):
        encoder.encode(1, 0, {"ep": bad}, payload)
    with pytest.raises(OverflowError):
        encoder.encode(1, 0, {"ep": 0, "other": bad}, payload)


# -- the columnar framing: a batch's longs framed a column at a time ---------------------------

EXTREMES = [-(2**63), 2**63 - 1, -1, 0, 1, 63, -64, 64, 2**55, -(2**55) - 1, 2**62, -(2**62)]
edge_longs = st.one_of(longs, st.sampled_from(EXTREMES), st.integers(-3, 3))
"""Uniform longs (what tracking ids are), every varint length's edges and runs of small ones."""


columnar_batches = st.lists(st.tuples(edge_longs, edge_longs, edge_longs, payloads),
                            min_size=COLUMNAR_MIN_ROWS, max_size=3 * COLUMNAR_MIN_ROWS)
"""(order key, tracking id, time, payload) rows, enough of them to be framed by column."""


@given(columnar_batches, st.text(max_size=8), st.text(max_size=10), st.booleans())
def test_a_columnar_batch_equals_encode_record_by_record(
    batch: list[tuple[int, int, int, dict[str, Any]]], name: str, source: str, same_times: bool
) -> None:
    """Batches long enough for the columnar framing (numpy): both batch paths give, record by
    record, what ``encode`` gives -- negative and extreme order keys, tracking ids and times,
    one times map for the whole batch or one per record."""
    keys = [r[0] for r in batch]
    ids = [r[1] for r in batch]
    column = [batch[0][2]] * len(batch) if same_times else [r[2] for r in batch]
    bodies = [r[3] for r in batch]
    one = EnvelopeEncoder(PAYLOAD, source)
    expected = [
        one.encode(k, i, {name: t}, p) for k, i, t, p in zip(keys, ids, column, bodies, strict=True)
    ]
    many = EnvelopeEncoder(PAYLOAD, source)
    assert many.encode_many_int_times(keys, ids, name, column, bodies) == expected
    assert many.encode_many(keys, ids, [{name: t} for t in column], bodies) == expected
    empty = [one.encode(k, i, {}, p) for k, i, p in zip(keys, ids, bodies, strict=True)]
    assert many.encode_many(keys, ids, [{}] * len(batch), bodies) == empty


@given(
    columns=st.lists(st.lists(edge_longs, min_size=40, max_size=40), min_size=1, max_size=4),
    constants=st.lists(st.binary(max_size=6), min_size=5, max_size=5),
    rows=st.sampled_from([0, 1, COLUMNAR_MIN_ROWS - 1, COLUMNAR_MIN_ROWS, 40]),
)
def test_frame_rows_is_the_parts_concatenated(
    columns: list[list[int]], constants: list[bytes], rows: int
) -> None:
    parts: list[bytes | list[int]] = [constants[0]]
    for i, column in enumerate(columns):
        parts += [column[:rows], constants[i + 1]]
    assert list(frame_rows(parts, rows)) == [
        b"".join(p if isinstance(p, bytes) else zigzag_long(p[r]) for p in parts)
        for r in range(rows)
    ]


def test_a_record_the_compiled_writer_declines_in_a_columnar_batch() -> None:
    """A bool where a long is due: fastavro encodes that record (as ``encode`` does), the
    others keep the compiled writer's bytes."""
    encoder = EnvelopeEncoder(PAYLOAD, "s")
    bodies = [{"ts": i, "batch": 0, "body": "x", "score": None} for i in range(40)]
    bodies[7] = {**bodies[7], "batch": True}
    keys = list(range(40))
    got = encoder.encode_many_int_times(keys, keys, "ep", [0] * 40, bodies)
    assert got == [encoder.encode(k, k, {"ep": 0}, p) for k, p in zip(keys, bodies, strict=True)]


def test_a_column_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="a column of 3 values for 20 rows"):
        frame_rows((b"", [1, 2, 3]), 20)


COLUMNAR = {**WIDE, "name": "Columnar", "fields": WIDE["fields"][:5]}
"""long, int, string, bytes, boolean: a schema whose batches are framed a field at a time."""
good_payloads = st.fixed_dictionaries({
    "l": edge_longs,
    "i": st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), 2**31 - 1])),
    "s": st.text(max_size=20),
    "b": st.binary(max_size=20),
    "f": st.booleans(),
})
odd_values = st.one_of(anything, st.just("\ud800"), st.just(2**31), st.just(-(2**63) - 1))


@given(
    batch=st.lists(good_payloads, min_size=COLUMNAR_MIN_ROWS, max_size=3 * COLUMNAR_MIN_ROWS),
    odd=st.one_of(st.none(), st.tuples(st.integers(0), st.sampled_from("lisbf"),
                                       st.one_of(st.none(), odd_values))),
    int_times=st.booleans(),
)
def test_a_columnar_payload_batch_equals_encode_or_fails_as_it_does(
    batch: list[dict[str, Any]], odd: tuple[int, str, Any] | None, int_times: bool
) -> None:
    """The payloads framed a field at a time: the bytes ``encode`` gives each record, and
    where one record has a value the compiled writer declines (a wrong type, a long out of
    range, a surrogate; None: the field is missing) the batch gives what ``encode`` gives
    for it -- fastavro's bytes, or the error ``encode`` raises."""
    if odd is not None:
        at, field, value = odd
        bad = dict(batch[at % len(batch)])
        if value is None:
            del bad[field]
        else:
            bad[field] = value
        batch[at % len(batch)] = bad
    encoder = EnvelopeEncoder(COLUMNAR, "s")
    assert column_plan(COLUMNAR) is not None  # this schema's batches are framed by column
    keys = list(range(len(batch)))
    expected: list[bytes] = []
    error: type[BaseException] | None = None
    for k, p in enumerate(batch):
        try:
            expected.append(encoder.encode(k, -k, {"ep": 0}, p))
        except Exception as exc:  # compared by type below
            error = type(exc)
            break
    try:
        if int_times:
            got = encoder.encode_many_int_times(keys, [-k for k in keys], "ep", [0] * len(keys),
                                                batch)
        else:
            got = encoder.encode_many(keys, [-k for k in keys], [{"ep": 0}] * len(keys), batch)
    except Exception as exc:
        assert type(exc) is error
    else:
        assert error is None and got == expected


def test_a_batch_of_right_values_is_framed_by_column_and_an_odd_one_is_not() -> None:
    plan = column_plan(COLUMNAR)
    assert plan is not None
    batch = [{"l": k, "i": -k, "s": "é" * k, "b": b"x", "f": k % 2 == 0} for k in range(20)]
    assert payload_parts(plan, batch) is not None
    assert payload_parts(plan, [*batch, {**batch[0], "l": True}]) is None
    assert payload_parts(plan, [*batch, {**batch[0], "i": 2**31}]) is None
    assert payload_parts(plan, [*batch, {**batch[0], "s": "\ud800"}]) is None
    assert column_plan(WIDE) is None  # a double: record by record


def test_equal_columns_framed_once_each_in_its_place() -> None:
    """An order key column equal to a payload field's (framed once) still lands in both
    places, and a tuple or a different column is not taken for it."""
    keys = [2**40 + k for k in range(COLUMNAR_MIN_ROWS)]
    other = [-k for k in range(COLUMNAR_MIN_ROWS)]
    parts: list[bytes | list[int] | tuple[int, ...]] = [
        b"<", keys, b"|", list(keys), tuple(other), other, list(reversed(keys)), b">"]
    assert frame_rows(parts, COLUMNAR_MIN_ROWS) == [
        b"".join(p if isinstance(p, bytes) else zigzag_long(p[r]) for p in parts)
        for r in range(COLUMNAR_MIN_ROWS)
    ]
