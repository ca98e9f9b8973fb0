"""The Spark schema of the ``substreams`` source: the stream's payload fields plus metadata.

Why derived from the Avro schema of the configured stream: a job reads typed columns
without declaring them, and a schema change in ``substreams.yaml`` shows up in Spark at once.
Nested Avro types (records, arrays, maps) arrive as JSON strings: Spark can parse them with
``from_json`` when needed, and the common case (flat click-like records) stays simple.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from substreams.config import StreamConfig
from substreams.errors import SubstreamsError
from substreams.spark.epochs import META_COLUMNS

EPOCH_TYPE = StructType(
    [
        StructField("key", StringType(), True),
        StructField("coords", ArrayType(LongType(), False), False),
        StructField("kind", StringType(), False),
    ]
)
"""The ``epoch`` column: the Avro ``substreams.Time`` (``substreams/avro/time.avsc``)."""

META_FIELDS: tuple[tuple[str, DataType], ...] = (
    ("epoch", EPOCH_TYPE),
    ("epoch_label", StringType()),
    ("epoch_int", LongType()),
    ("epoch_key", StringType()),
    ("order_key", LongType()),
    ("partition", IntegerType()),
    ("offset", LongType()),
    ("control_offset", LongType()),
    ("control_index", IntegerType()),
    ("sealed_at_ms", LongType()),
    ("records", LongType()),
    ("is_notification", BooleanType()),
)
"""Columns after the payload's.  ``(control_offset, control_index)`` identifies the
notification that closed the row's epoch (firm; the notification order): the control-topic
offset of its record and its index within that record (a record may complete several
epochs); ``records`` and ``sealed_at_ms`` are set on notification rows."""
META_NAMES = tuple(name for name, _ in META_FIELDS)
assert META_NAMES == META_COLUMNS

_PRIMITIVES: dict[str, DataType] = {
    "string": StringType(),
    "long": LongType(),
    "int": IntegerType(),
    "double": DoubleType(),
    "float": FloatType(),
    "boolean": BooleanType(),
    "bytes": BinaryType(),
    "enum": StringType(),
    "fixed": BinaryType(),
}


def _spark_type(avro: Any) -> tuple[DataType, bool, bool]:
    """(Spark type, nullable, as_json) of an Avro field type."""
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) == 1:
            dtype, _, as_json = _spark_type(branches[0])
            return dtype, True, as_json
        return StringType(), True, True
    if isinstance(avro, Mapping):
        kind = avro.get("type")
        if kind in ("enum", "fixed") or (isinstance(kind, str) and kind in _PRIMITIVES):
            return _PRIMITIVES[str(kind)], False, False
        return StringType(), False, True
    if isinstance(avro, str) and avro in _PRIMITIVES:
        return _PRIMITIVES[avro], False, False
    return StringType(), False, True


class PayloadLayout:
    """How payload dicts become the leading values of a row (picklable: plain data only)."""

    def __init__(self, stream: StreamConfig) -> None:
        self.names: list[str] = []
        self.as_json: list[bool] = []
        self.types: list[DataType] = []
        for field in stream.schema.get("fields", ()):
            name = str(field["name"])
            if name in META_NAMES:
                raise SubstreamsError(
                    f"stream '{stream.name}': payload field '{name}' clashes with the "
                    f"substreams source's column of the same name; rename the field"
                )
            dtype, _nullable, as_json = _spark_type(field["type"])
            self.names.append(name)
            self.as_json.append(as_json)
            self.types.append(dtype)

    def struct(self) -> StructType:
        # Every column is nullable: notification rows carry no payload.
        payload = [StructField(n, t, True) for n, t in zip(self.names, self.types, strict=True)]
        return StructType(payload + [StructField(n, t, True) for n, t in META_FIELDS])

    def columns(self, payloads: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
        """The payload columns of ``payloads`` (one list per field): :meth:`values` by
        column, for the source's Arrow batches (one pass per field, no row tuples)."""
        out: list[list[Any]] = []
        for name, as_json in zip(self.names, self.as_json, strict=True):
            col = [p.get(name) for p in payloads]
            if as_json:
                col = [None if v is None else json.dumps(v, default=str) for v in col]
            out.append(col)
        return out

    def values(self, payload: Mapping[str, Any] | None) -> list[Any]:
        if payload is None:
            return [None] * len(self.names)
        out: list[Any] = []
        for name, as_json in zip(self.names, self.as_json, strict=True):
            value = payload.get(name)
            out.append(json.dumps(value, default=str) if as_json and value is not None else value)
        return out


def row(
    layout: PayloadLayout, payload: Mapping[str, Any] | None, meta: Sequence[Any]
) -> tuple[Any, ...]:
    """One output row: payload values then ``META_FIELDS`` values, in order."""
    return (*layout.values(payload), *meta)
