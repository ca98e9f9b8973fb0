"""Which schema changes a stream accepts (Avro resolution both ways), and decoding an old
record into the new shape."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from substreams.errors import SchemaMismatchError
from substreams.streams.evolution import incompatibilities, stream_fingerprint
from substreams.streams.schemas import Codec, envelope_schema

V1: dict[str, Any] = {
    "type": "record",
    "name": "Click",
    "namespace": "substreams.test",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "ts", "type": "long"},
        {"name": "agent", "type": ["null", "string"], "default": None},
        {"name": "geo", "type": {"type": "record", "name": "Geo",
                                 "fields": [{"name": "lat", "type": "double"}]}},
    ],
}


def changed(edit: Any) -> dict[str, Any]:
    schema = copy.deepcopy(V1)
    edit(schema["fields"])
    return schema


def test_adding_a_field_with_a_default_is_compatible() -> None:
    assert incompatibilities(
        changed(lambda f: f.append({"name": "ref", "type": "string", "default": "-"})), V1
    ) == []


def test_removing_an_optional_field_is_compatible() -> None:
    assert incompatibilities(changed(lambda f: f.pop(2)), V1) == []


def test_a_promotion_old_readers_cannot_follow_is_refused() -> None:
    # long -> double: new readers can read old records, old readers cannot read new ones
    problems = incompatibilities(changed(lambda f: f[1].update(type="double")), V1)
    assert len(problems) == 1 and "'ts'" in problems[0] and "old readers" in problems[0]


@pytest.mark.parametrize(
    ("edit", "field", "why"),
    [
        (lambda f: f.append({"name": "country", "type": "string"}), "country", "added"),
        (lambda f: f.pop(0), "user", "removed"),
        (lambda f: f[0].update(type="int"), "user", "changed"),
        (lambda f: f[3]["type"]["fields"].append({"name": "lon", "type": "double"}),
         "geo.lon", "added"),
    ],
)
def test_an_incompatible_change_names_the_field(edit: Any, field: str, why: str) -> None:
    problems = incompatibilities(changed(edit), V1)
    assert problems, "refused"
    assert any(f"'{field}'" in p and why in p for p in problems), problems


def test_an_old_record_decodes_into_the_new_shape() -> None:
    v2 = changed(lambda f: (f.pop(2), f.append({"name": "ref", "type": "string",
                                                  "default": "-"})))
    old = Codec(envelope_schema(V1))
    writers = {old.fingerprint_hex: envelope_schema(V1)}
    new = Codec(envelope_schema(v2), writers=writers.get)
    record = {"order_key": 5, "tracking_id": 1, "source": "s", "times": {},
              "payload": {"user": "u", "ts": 5, "agent": "curl", "geo": {"lat": 1.5}}}
    got = new.decode_single(old.encode_single(record))
    assert got["payload"] == {"user": "u", "ts": 5, "geo": {"lat": 1.5}, "ref": "-"}
    assert new.decode(old.encode(record), old.fingerprint_hex) == got  # header form
    assert stream_fingerprint(V1) == old.fingerprint_hex.decode()


def test_an_unregistered_fingerprint_is_still_refused() -> None:
    old = Codec(envelope_schema(V1))
    new = Codec(envelope_schema(changed(lambda f: f.pop(2))), writers=lambda fp: None)
    record = {"order_key": 5, "tracking_id": 1, "source": "s", "times": {},
              "payload": {"user": "u", "ts": 5, "agent": None, "geo": {"lat": 1.5}}}
    with pytest.raises(SchemaMismatchError, match="no registered schema has it"):
        new.decode_single(old.encode_single(record))
