"""Encoding a data envelope field by field: the publisher's hot path.

Why not one ``fastavro.schemaless_writer`` call on the whole envelope: most of its cost per
record is re-walking the envelope and the ``times`` map, which only change from one epoch
to the next (``substreams bench framing`` checks that writing it here still pays).  Avro's
binary encoding of a record is the concatenation of its fields' encodings, so the envelope
is written here as

    prefix ++ zigzag(order_key) ++ zigzag(tracking_id) ++ source ++ times ++ payload

with ``prefix`` the single-object prefix of the stream's envelope schema (marker and writer
fingerprint, :mod:`substreams.streams.schemas`), ``source`` encoded once, ``times`` encoded
by fastavro once per distinct value (a small cache) and only the payload encoded per record
by fastavro.  The body after the prefix is byte-identical to fastavro's encoding of the
whole envelope (a property test holds it to that), so every reader keeps decoding with the
ordinary envelope schema.

The payload, too, skips fastavro when it can: a payload schema that is a record of
primitive fields (and nullable primitives) gets a compiled writer (:func:`payload_writer`)
that checks each value's exact Python type and frames it; any value it is not sure about
(a bool where a long is due, an out-of-range int, a missing field) sends the whole record
to fastavro, so odd inputs are encoded -- or refused -- exactly as fastavro does.

A batch (``encode_many``, from ``Publisher.publish_many``) is framed a column at a time
(:func:`frame_rows`): every long of the batch -- order keys, tracking ids, int times, and
the payload's own longs and string lengths when its schema allows (:func:`payload_parts`)
-- is written by numpy a column at once, and the rows are cut out of one buffer; a batch
with a value the compiled writer would not frame goes record by record, so a batch's bytes
are always what ``encode`` gives each record (property tests hold the two together).
"""

from __future__ import annotations

import functools
import io
import json
import operator
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import fastavro
from fastavro.schema import parse_schema

from substreams.frontier import Time, time_to_wire
from substreams.streams.records import times_to_wire
from substreams.streams.schemas import (
    SINGLE_OBJECT_MARKER,
    envelope_schema,
    expanded,
    fingerprint,
    raw_schema,
)

if TYPE_CHECKING:
    import numpy as np

_CACHE_LIMIT = 4096
_MIN_LONG = -(1 << 63)
_MAX_LONG = (1 << 63) - 1


# Base-128 varint digits two at a time: 14 bits -> 2 bytes.  Why: in CPython a table lookup
# per 14 bits beats a loop per 7 bits, and a 64-bit tracking id has 10 digits.
_PAIR_MORE = [bytes(((x & 0x7F) | 0x80, (x >> 7) | 0x80)) for x in range(1 << 14)]
_PAIR_LAST = [
    bytes((x,)) if x < 0x80 else bytes(((x & 0x7F) | 0x80, x >> 7)) for x in range(1 << 14)
]


def zigzag_long(n: int) -> bytes:
    """Avro's encoding of a ``long``: zigzag, then little-endian base-128 varint (a case
    per number of digit pairs, unrolled: no loop on a path run for every long written)."""
    u = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    if u < 0x4000:
        return _PAIR_LAST[u]
    if u < 0x10000000:  # < 2**28: counters, epochs, sizes
        return _PAIR_MORE[u & 0x3FFF] + _PAIR_LAST[u >> 14]
    if u >= 0x100000000000000:  # >= 2**56: nearly every random tracking id
        return (
            _PAIR_MORE[u & 0x3FFF]
            + _PAIR_MORE[(u >> 14) & 0x3FFF]
            + _PAIR_MORE[(u >> 28) & 0x3FFF]
            + _PAIR_MORE[(u >> 42) & 0x3FFF]
            + _PAIR_LAST[u >> 56]
        )
    if u < 0x40000000000:  # < 2**42: millisecond timestamps
        return _PAIR_MORE[u & 0x3FFF] + _PAIR_MORE[(u >> 14) & 0x3FFF] + _PAIR_LAST[u >> 28]
    return (
        _PAIR_MORE[u & 0x3FFF]
        + _PAIR_MORE[(u >> 14) & 0x3FFF]
        + _PAIR_MORE[(u >> 28) & 0x3FFF]
        + _PAIR_LAST[u >> 42]
    )


_DIGITS = 10
"""Base-128 digits of a 64-bit value, at most."""
COLUMNAR_MIN_ROWS = 16
"""Fewer rows than this are framed value by value: numpy's fixed cost per call (some
microseconds) is more than a few ``zigzag_long`` calls."""


@functools.cache
def _digit_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shift of every digit, the least value with more than k + 1 digits
    (``more[k]``), the digits' indexes.  numpy is imported here (first called when an
    encoder is built) and where it is used, not with the module: a process that imports
    the package and publishes nothing does not pay its import (~0.1 s)."""
    import numpy as np

    shifts = np.arange(0, 7 * _DIGITS, 7, dtype=np.uint64)
    return shifts, np.uint64(1) << shifts[1:], np.arange(_DIGITS)


def _varint_digits(column: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``zigzag_long`` of every value as a matrix of bytes, a column per value and a row
    per digit (as many as the largest value has), the mask of each value's own digits and
    their count.  Digits are rows, values columns: numpy's inner loops run along the batch,
    not along a varint's few digits."""
    import numpy as np

    shifts, more, digit_index = _digit_tables()
    x = np.asarray(column, dtype=np.int64)
    u = ((x << 1) ^ (x >> 63)).view(np.uint64)  # zigzag (numpy's >> on int64 is arithmetic)
    width = 1 + int(np.searchsorted(more, u.max(), side="right"))
    length = 1 + np.searchsorted(more[: width - 1], u, side="right")
    digits = ((u >> shifts[:width, None]) & np.uint64(0x7F)).astype(np.uint8)
    index = digit_index[:width, None]
    digits |= (index < length - 1).view(np.uint8) << np.uint8(7)  # the "more" bits
    return digits, index < length, length


_SPLIT_MAX = 4096


@functools.cache
def _split_items() -> np.ndarray:
    """Row ``n``: struct's format item for ``n`` bytes, ``"%4ds" % n`` (struct skips the
    spaces), so that the format of a whole batch's pieces is one table lookup."""
    import numpy as np

    table = "".join(f"{n:4d}s" for n in range(_SPLIT_MAX)).encode()
    return np.frombuffer(table, np.uint8).reshape(_SPLIT_MAX, 5)


def _split(flat: bytes, lengths: np.ndarray) -> Sequence[bytes]:
    """``flat`` cut into pieces of ``lengths`` bytes, by one ``struct`` call (a few times
    cheaper than a slice per piece)."""
    import numpy as np

    if int(lengths.max()) >= _SPLIT_MAX:
        ends: list[int] = np.cumsum(lengths).tolist()
        return list(map(flat.__getitem__, map(slice, [0, *ends[:-1]], ends)))
    fmt = _split_items()[lengths].tobytes().decode()
    pieces: tuple[bytes, ...] = struct.Struct(fmt).unpack(flat)
    return pieces


class Pieces(list[bytes]):
    """A column of byte strings for :func:`frame_rows`: each row's own, written as it is."""


Part = bytes | Pieces | Sequence[int]
"""A part of every row of a batch: the same bytes, each row's own bytes, or an int column
(each row's value as an Avro long)."""


def frame_rows(parts: Sequence[Part], rows: int) -> list[bytes]:
    """Row ``i`` of a batch: its ``parts`` concatenated -- ``bytes`` as they are,
    ``Pieces`` as ``pieces[i]``, an int column as ``zigzag_long(column[i])``, each column's
    varints computed at once.

    Why: a random 64-bit tracking id is a 9 or 10 byte varint, so ``zigzag_long`` per record
    is a Python call with five lookups and four concatenations, and a record's other longs
    (order key, time, payload fields, string lengths) each cost a call more; numpy writes a
    whole column's digits in a few array operations, the rows are cut out of one buffer and
    joined with the byte columns in C.  Every value must fit a long (numpy raises
    ``OverflowError`` for one that does not)."""
    for part in parts:
        if not isinstance(part, bytes) and len(part) != rows:
            raise ValueError(f"a column of {len(part)} values for {rows} rows")
    if rows < COLUMNAR_MIN_ROWS:
        return [
            b"".join([
                p if isinstance(p, bytes) else p[i] if isinstance(p, Pieces) else zigzag_long(p[i])
                for p in parts
            ])
            for i in range(rows)
        ]
    columns: list[Sequence[bytes]] = []
    longs: list[bytes | Sequence[int]] = []  # the run of parts since the last Pieces
    for part in parts:
        if isinstance(part, Pieces):
            if longs:
                columns.append(_frame_longs(longs, rows))
                longs = []
            columns.append(part)
        else:
            longs.append(part)
    if longs:
        columns.append(_frame_longs(longs, rows))
    if len(columns) == 1:
        return list(columns[0])
    return list(map(b"".join, zip(*columns, strict=True)))


def _frame_longs(parts: Sequence[bytes | Sequence[int]], rows: int) -> Sequence[bytes]:
    """:func:`frame_rows` of constants and int columns: a matrix of every row's bytes (the
    constants, each column's digits; a column per row) and the mask of the ones to keep,
    kept row after row into one buffer and cut into rows."""
    import numpy as np

    blocks: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    lengths = np.zeros(rows, dtype=np.intp)
    done: list[tuple[Sequence[int], tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
    for part in parts:
        if isinstance(part, bytes):
            const = np.frombuffer(part, np.uint8)[:, None]
            blocks.append(np.broadcast_to(const, (len(part), rows)))
            masks.append(np.ones((len(part), rows), dtype=bool))
            lengths += len(part)
        else:
            # A column equal to one already framed is framed once: an envelope's order
            # key is its payload's order key field (and an epoch's time a field too).
            # Lists only: their == is one C-level pass, stopping at the first difference.
            same = (v for c, v in done if type(c) is list and type(part) is list and c == part)
            framed = next(same, None)
            if framed is None:
                framed = _varint_digits(part)
                done.append((part, framed))
            digits, mask, length = framed
            blocks.append(digits)
            masks.append(mask)
            lengths += length
    kept = np.concatenate(blocks).T[np.concatenate(masks).T]  # row after row
    return _split(kept.tobytes(), lengths)


def avro_string(s: str) -> bytes:
    raw = s.encode()
    return zigzag_long(len(raw)) + raw


def _time_kinds() -> dict[str, bytes]:
    """The enum index of every ``TimeKind`` symbol, read from ``substreams/avro/time.avsc``."""
    kind = next(f for f in raw_schema("time")["fields"] if f["name"] == "kind")
    return {s: zigzag_long(i) for i, s in enumerate(kind["type"]["symbols"])}


_KIND = _time_kinds()
_INT_TIME_HEAD = b"\x00\x02"  # key: null (union branch 0); coords: a block of one item
_INT_TIME_TAIL = b"\x00" + _KIND["int"]  # end of the coords array; kind: int
_INT_TIME_TAIL_END = _INT_TIME_TAIL + b"\x00"  # ... and the end of a one-entry times map


def avro_array(items: list[bytes]) -> bytes:
    """Avro's array: one block (count, items) ended by a zero count; empty = the zero."""
    if not items:
        return b"\x00"
    return zigzag_long(len(items)) + b"".join(items) + b"\x00"


def avro_time(t: Time) -> bytes:
    """``substreams.Time``: key (union null|string), coords (array of long), kind (enum)."""
    if type(t) is int:  # the common case: {key: null, coords: [t], kind: int}
        return _INT_TIME_HEAD + zigzag_long(t) + _INT_TIME_TAIL
    wire = time_to_wire(t)
    key = wire["key"]
    head = b"\x00" if key is None else b"\x02" + avro_string(key)
    return head + avro_array([zigzag_long(c) for c in wire["coords"]]) + _KIND[wire["kind"]]


_MIN_INT = -(1 << 31)
_MAX_INT = (1 << 31) - 1
_DOUBLE = struct.Struct("<d").pack
_FLOAT = struct.Struct("<f").pack


class _NotFast(Exception):
    """A value the compiled writer does not frame itself: fastavro encodes the record."""


FieldWriter = Callable[[Any], bytes]


def _long(v: Any) -> bytes:
    if type(v) is not int or not _MIN_LONG <= v <= _MAX_LONG:
        raise _NotFast
    return zigzag_long(v)


def _int(v: Any) -> bytes:
    if type(v) is not int or not _MIN_INT <= v <= _MAX_INT:
        raise _NotFast
    return zigzag_long(v)


def _string(v: Any) -> bytes:
    if type(v) is not str:
        raise _NotFast
    raw = v.encode()
    return zigzag_long(len(raw)) + raw


def _bytes(v: Any) -> bytes:
    if type(v) is not bytes:
        raise _NotFast
    return zigzag_long(len(v)) + v


def _boolean(v: Any) -> bytes:
    if type(v) is not bool:
        raise _NotFast
    return b"\x01" if v else b"\x00"


def _double(v: Any) -> bytes:
    if type(v) is not float:
        raise _NotFast
    return _DOUBLE(v)


def _float(v: Any) -> bytes:
    if type(v) is not float:
        raise _NotFast
    return _FLOAT(v)


def _null(v: Any) -> bytes:
    if v is not None:
        raise _NotFast
    return b""


_PRIMITIVES: dict[str, tuple[FieldWriter, type]] = {
    "long": (_long, int),
    "int": (_int, int),
    "string": (_string, str),
    "bytes": (_bytes, bytes),
    "boolean": (_boolean, bool),
    "double": (_double, float),
    "float": (_float, float),
    "null": (_null, type(None)),
}


def _primitive(node: Any) -> str | None:
    """The primitive type name of a field type, or None (named, complex, logical types)."""
    if isinstance(node, dict) and set(node) == {"type"}:
        node = node["type"]
    return node if isinstance(node, str) and node in _PRIMITIVES else None


def _field_writer(node: Any) -> FieldWriter | None:
    """A writer for one field type: a primitive, or a union of primitives of distinct Python
    types (``["null", "string"]``): the branch is picked by the value's exact type, as
    fastavro's first match would pick it."""
    name = _primitive(node)
    if name is not None:
        return _PRIMITIVES[name][0]
    if not isinstance(node, list) or not node:
        return None
    branches: dict[type, tuple[bytes, FieldWriter]] = {}
    for index, branch in enumerate(node):
        bname = _primitive(branch)
        if bname is None:
            return None
        write, py = _PRIMITIVES[bname]
        if py in branches:
            return None
        branches[py] = (zigzag_long(index), write)
    if len({int, bool, float} & set(branches)) > 1:
        return None  # fastavro may take a bool or an int for another number branch

    def union(v: Any) -> bytes:
        hit = branches.get(type(v))
        if hit is None:
            raise _NotFast
        return hit[0] + hit[1](v)

    return union


def payload_writer(schema: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bytes] | None:
    """A compiled writer of ``schema`` (self-contained, not parsed) if it is a record whose
    every field has a primitive type or a union of primitives, else None.  The writer raises
    :class:`_NotFast` for a record it cannot frame (see the module docstring)."""
    if schema.get("type") != "record":
        return None
    fields: list[tuple[str, FieldWriter]] = []
    for field in schema.get("fields", ()):
        field_writer = _field_writer(field["type"])
        if field_writer is None:
            return None
        fields.append((field["name"], field_writer))
    return _generated_writer(fields)


_INLINE: dict[FieldWriter, str] = {
    _long: "if type(v) is not int or not {lo} <= v <= {hi}: raise _NotFast\n"
    "    b{i} = zz(v)\n",
    _int: "if type(v) is not int or not {lo32} <= v <= {hi32}: raise _NotFast\n"
    "    b{i} = zz(v)\n",
    _string: "if type(v) is not str: raise _NotFast\n"
    "    v = v.encode()\n"
    "    b{i} = zz(len(v)) + v\n",
    _bytes: "if type(v) is not bytes: raise _NotFast\n"
    "    b{i} = zz(len(v)) + v\n",
    _boolean: "if type(v) is not bool: raise _NotFast\n"
    "    b{i} = b'\\x01' if v else b'\\x00'\n",
}
"""The field writers whose checks and framing are written out in a generated writer (the
others -- double, float, null, unions -- are called)."""


def _generated_writer(
    fields: list[tuple[str, FieldWriter]],
) -> Callable[[Mapping[str, Any]], bytes]:
    """One function for the whole record, its fields' checks written out in line (what
    ``dataclasses`` does for ``__init__``): a Python call and a list item per field fewer
    than looping over the field writers, on a path run once per record.  The same checks in
    the same order as the field writers, so the same records go to fastavro.  Field names
    enter the source only through ``repr`` (a literal)."""
    env: dict[str, Any] = {"_NotFast": _NotFast, "zz": zigzag_long}
    lines = ["def write(p):\n", "  try:\n"]
    for i, (name, writer) in enumerate(fields):
        lines.append(f"    v = p[{name!r}]\n    ")
        inline = _INLINE.get(writer)
        if inline is None:
            env[f"w{i}"] = writer
            lines.append(f"b{i} = w{i}(v)\n")
        else:
            lines.append(
                inline.format(
                    i=i, lo=_MIN_LONG, hi=_MAX_LONG, lo32=_MIN_INT, hi32=_MAX_INT
                )
            )
    pieces = ", ".join(f"b{i}" for i in range(len(fields)))
    lines.append(f"    return b''.join(({pieces}{',' if len(fields) == 1 else ''}))\n")
    lines.append("  except _NotFast:\n    raise\n")
    # a missing field, a surrogate...: fastavro gives its own answer
    lines.append("  except Exception:\n    raise _NotFast from None\n")
    exec("".join(lines), env)
    write: Callable[[Mapping[str, Any]], bytes] = env["write"]
    return write


_COLUMN_TYPES = {"long": int, "int": int, "string": str, "bytes": bytes, "boolean": bool}
_COLUMN_RANGES = {"long": (_MIN_LONG, _MAX_LONG), "int": (_MIN_INT, _MAX_INT)}
_BOOLEAN = {True: b"\x01", False: b"\x00"}
ColumnPlan = tuple[tuple[str, str], ...]
"""A payload record's fields as (name, Avro type), for :func:`payload_parts`."""


def column_plan(schema: Mapping[str, Any]) -> ColumnPlan | None:
    """The plan of a record (self-contained) whose every field is a long, int, string,
    bytes or boolean -- what :func:`payload_parts` frames a column at a time -- else None."""
    if schema.get("type") != "record":
        return None
    plan = tuple((f["name"], _primitive(f["type"])) for f in schema.get("fields", ()))
    if not all(kind in _COLUMN_TYPES for _, kind in plan):
        return None
    return cast(ColumnPlan, plan)


def payload_parts(plan: ColumnPlan, payloads: Sequence[Mapping[str, Any]]) -> list[Part] | None:
    """A batch's payloads as :func:`frame_rows` parts, a field at a time: its column's
    values checked at once (exact type, range) and its longs (values, string lengths) left
    to ``frame_rows``.  None -- encode record by record -- if a value of the batch is one
    the compiled writer would not frame (a missing field, a bool for a long, an int out of
    range, a surrogate), so the bytes are always the compiled writer's or fastavro's.

    Why: the compiled writer is a Python call per record and a ``zigzag_long`` call per
    long field; here the Python work is per field, the per-value work in C (``map``) and
    numpy."""
    parts: list[Part] = []
    try:
        for name, kind in plan:
            column = list(map(operator.itemgetter(name), payloads))
            if set(map(type, column)) != {_COLUMN_TYPES[kind]}:
                return None
            if kind in _COLUMN_RANGES:
                lo, hi = _COLUMN_RANGES[kind]
                if not (lo <= min(column) and max(column) <= hi):
                    return None
                parts.append(column)
            elif kind == "boolean":
                parts.append(Pieces(map(_BOOLEAN.__getitem__, column)))
            else:
                raw = list(map(str.encode, column)) if kind == "string" else column
                parts += (list(map(len, raw)), Pieces(raw))
    except Exception:  # a missing field, a payload that is no mapping, a surrogate
        return None
    return parts


@functools.lru_cache(maxsize=256)
def _compiled(
    payload_schema: str,
) -> tuple[Any, Callable[[Mapping[str, Any]], bytes] | None, ColumnPlan | None, Any, bytes]:
    """A payload schema's (given as canonical JSON) parsed form, generated writer, column
    plan, the parsed times schema and the envelope's single-object prefix, once per
    process: an encoder is built per publisher, and a publisher per source incarnation and
    task attempt.  All are used read-only."""
    payload = json.loads(payload_schema)
    full = expanded(payload)
    times = parse_schema(expanded({"type": "map", "values": raw_schema("time")}))
    prefix = SINGLE_OBJECT_MARKER + fingerprint(envelope_schema(payload))
    return parse_schema(full), payload_writer(full), column_plan(full), times, prefix


class EnvelopeEncoder:
    """Writes one source's data envelopes for one stream, single-object encoded (see the
    module docstring)."""

    def __init__(self, payload_schema: Mapping[str, Any], source: str) -> None:
        self._payload, self._fast, self._plan, self._times_schema, self.prefix = _compiled(
            json.dumps(payload_schema, sort_keys=True))
        self._source = avro_string(source)
        self._times_cache: dict[tuple[tuple[str, Time], ...], bytes] = {}
        self._names: dict[str, bytes] = {}
        self._heads: dict[str, bytes] = {}
        # numpy's import (~0.1 s, once per process) with the publisher's set-up, not in
        # its first batch
        _digit_tables()

    def _name(self, name: str) -> bytes:
        out = self._names.get(name)
        if out is None:
            out = self._names[name] = avro_string(name)
        return out

    def _int_time_head(self, name: str) -> bytes:
        """Everything of a one-entry ``times`` map ``{name: t}`` (t an int) before
        ``zigzag(t)``: the block count, the key, the Time's null key and its coords block
        count.  With :data:`_INT_TIME_TAIL_END` after ``zigzag(t)`` it is the whole map, so
        granularity 1 (a new time per record) pays one concatenation, not a generic call."""
        out = self._heads.get(name)
        if out is None:
            out = self._heads[name] = b"\x02" + self._name(name) + _INT_TIME_HEAD
        return out

    def times(self, times: Mapping[str, Time]) -> bytes:
        """The encoded ``times`` map, cached by value (times change once per epoch).

        Plain int times (epochs, windows) are spliced from cached pieces even on a cache
        miss: a record per epoch (granularity 1) misses every time."""
        if len(times) == 1:  # one substream at an int time (granularity 1 misses the cache)
            ((name, t),) = times.items()
            if type(t) is int and _MIN_LONG <= t <= _MAX_LONG:
                return self._int_time_head(name) + zigzag_long(t) + _INT_TIME_TAIL_END
        key = tuple(times.items())
        out = self._times_cache.get(key)
        if out is not None:
            return out
        if all(type(t) is int and _MIN_LONG <= t <= _MAX_LONG for _, t in key):
            parts = [zigzag_long(len(key))] if key else []
            for name, t in key:
                parts.append(self._name(name))
                parts.append(avro_time(t))
            parts.append(b"\x00")
            out = b"".join(parts)
        else:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, self._times_schema, times_to_wire(times))
            out = buf.getvalue()
        if len(self._times_cache) >= _CACHE_LIMIT:
            self._times_cache.clear()
        self._times_cache[key] = out
        return out

    def encode(
        self,
        order_key: int,
        tracking_id: int,
        times: Mapping[str, Time],
        payload: Mapping[str, Any],
    ) -> bytes:
        """The envelope's bytes (single-object encoded); raises fastavro's
        ``ValueError``/``TypeError`` when the payload does not fit the stream's schema."""
        if not _MIN_LONG <= order_key <= _MAX_LONG:
            raise ValueError(f"order key {order_key} does not fit an Avro long")
        return b"".join(
            (
                self.prefix,
                zigzag_long(order_key),
                zigzag_long(tracking_id),
                self._source,
                self.times(times),
                self.payload(payload),
            )
        )

    def payload(self, payload: Mapping[str, Any]) -> bytes:
        """The payload's bytes: the compiled writer's, or fastavro's when it declines."""
        fast = self._fast
        if fast is not None:
            try:
                return fast(payload)
            except _NotFast:
                pass
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self._payload, payload)
        return buf.getvalue()

    def payloads(self, payloads: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """``payload`` of every record: the compiled writer mapped over the batch (no
        Python loop around it) unless it declines one, then record by record."""
        fast = self._fast
        if fast is not None:
            try:
                return list(map(fast, payloads))
            except _NotFast:
                pass
        return list(map(self.payload, payloads))

    def _payload_parts(self, payloads: Sequence[Mapping[str, Any]]) -> list[Part]:
        """A batch's payloads as :func:`frame_rows` parts: a field at a time
        (:func:`payload_parts`) where the schema and the values allow it, else each
        record's bytes (:meth:`payloads`)."""
        if self._plan is not None and len(payloads) >= COLUMNAR_MIN_ROWS:
            parts = payload_parts(self._plan, payloads)
            if parts is not None:
                return parts
        return [Pieces(self.payloads(payloads))]

    def encode_many(
        self,
        order_keys: Sequence[int],
        tracking_ids: Sequence[int],
        times: Sequence[Mapping[str, Time]],
        payloads: Sequence[Mapping[str, Any]],
    ) -> list[bytes]:
        """``encode`` of every record, byte for byte, with the per-record costs that need
        not be per record paid once: the order keys' range is checked at the ends (the
        caller passes them sorted, or checks each: see ``Publisher.publish_many``), the
        batch is framed a column at a time (:func:`frame_rows`) and a run of records with
        equal times shares one ``times`` encoding.  Raises as ``encode`` does, before
        returning anything."""
        if not order_keys:
            return []
        _check_longs(order_keys, "order key")
        encode_times = self.times
        prev: Mapping[str, Time] | None = None
        encoded = Pieces()
        append = encoded.append
        prev_bytes = b""
        runs = 0
        for t in times:
            if t is not prev and t != prev:
                prev_bytes = encode_times(t)
                prev = t
                runs += 1
            append(prev_bytes)
        # one times map for the whole batch: a constant, with the source before it
        head: list[Part] = [self._source, encoded] if runs > 1 else [self._source + prev_bytes]
        parts = [self.prefix, order_keys, tracking_ids, *head, *self._payload_parts(payloads)]
        return frame_rows(parts, len(order_keys))

    def encode_many_int_times(
        self,
        order_keys: Sequence[int],
        tracking_ids: Sequence[int],
        name: str,
        times: Sequence[int],
        payloads: Sequence[Mapping[str, Any]],
    ) -> list[bytes]:
        """``encode_many`` of records whose ``times`` are ``{name: times[i]}``, ints (one
        epoch or tumbling substream, the publisher's usual case), without a dict per record:
        the map is the name's cached head, ``zigzag(t)`` and a constant tail, each a part of
        :func:`frame_rows`.  A time outside a long raises ValueError, as an order key does."""
        if not order_keys:
            return []
        _check_longs(order_keys, "order key")
        _check_longs(times, "time")
        # source ++ times: the source and the map's head are adjacent constants: one piece.
        source_head = self._source + self._int_time_head(name)
        parts = [self.prefix, order_keys, tracking_ids, source_head, times, _INT_TIME_TAIL_END,
                 *self._payload_parts(payloads)]
        return frame_rows(parts, len(order_keys))


def _check_longs(values: Sequence[int], what: str) -> None:
    """Every value fits an Avro long, checked at the extremes (two C-level passes)."""
    for v in (min(values), max(values)):
        if not _MIN_LONG <= v <= _MAX_LONG:
            raise ValueError(f"{what} {v} does not fit an Avro long")
