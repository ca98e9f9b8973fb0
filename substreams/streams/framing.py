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
"""

from __future__ import annotations

import functools
import io
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
    """Avro's encoding of a ``long``: zigzag, then little-endian base-128 varint."""
    u = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    if u < 0x4000:
        return _PAIR_LAST[u]
    if u >= 0x100000000000000:  # >= 2**56: nearly every random tracking id; unrolled
        return (
            _PAIR_MORE[u & 0x3FFF]
            + _PAIR_MORE[(u >> 14) & 0x3FFF]
            + _PAIR_MORE[(u >> 28) & 0x3FFF]
            + _PAIR_MORE[(u >> 42) & 0x3FFF]
            + _PAIR_LAST[u >> 56]
        )
    out = b""
    while u >= 0x4000:
        out += _PAIR_MORE[u & 0x3FFF]
        u >>= 14
    return out + _PAIR_LAST[u]


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


@functools.lru_cache(maxsize=256)
def _compiled(
    payload_schema: str,
) -> tuple[Any, Callable[[Mapping[str, Any]], bytes] | None, Any, bytes]:
    """A payload schema's (given as canonical JSON) parsed form, generated writer, the
    parsed times schema and the envelope's single-object prefix, once per process: an
    encoder is built per publisher, and a publisher per source incarnation and task
    attempt.  All are used read-only."""
    payload = json.loads(payload_schema)
    full = expanded(payload)
    times = parse_schema(expanded({"type": "map", "values": raw_schema("time")}))
    prefix = SINGLE_OBJECT_MARKER + fingerprint(envelope_schema(payload))
    return parse_schema(full), payload_writer(full), times, prefix


class EnvelopeEncoder:
    """Writes one source's data envelopes for one stream, single-object encoded (see the
    module docstring)."""

    def __init__(self, payload_schema: Mapping[str, Any], source: str) -> None:
        self._payload, self._fast, self._times_schema, self.prefix = _compiled(
            json.dumps(payload_schema, sort_keys=True))
        self._source = avro_string(source)
        self._times_cache: dict[tuple[tuple[str, Time], ...], bytes] = {}
        self._names: dict[str, bytes] = {}
        self._heads: dict[str, bytes] = {}

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

    def encode_many(
        self,
        order_keys: Sequence[int],
        tracking_ids: Sequence[int],
        times: Sequence[Mapping[str, Time]],
        payloads: Sequence[Mapping[str, Any]],
    ) -> list[bytes]:
        """``encode`` of every record, byte for byte, with the per-record costs that need
        not be per record paid once: the order keys' range is checked at the ends (the
        caller passes them sorted, or checks each: see ``Publisher.publish_many``), a run of
        records with equal times shares one ``times`` encoding, and the method lookups are
        hoisted.  Raises as ``encode`` does, before returning anything."""
        if not order_keys:
            return []
        _check_longs(order_keys, "order key")
        encode_times = self.times
        prev: Mapping[str, Time] | None = None
        encoded: list[bytes] = []
        append = encoded.append
        prev_bytes = b""
        for t in times:
            if t is not prev and t != prev:
                prev_bytes = encode_times(t)
                prev = t
            append(prev_bytes)
        return self._frame(order_keys, tracking_ids, encoded, payloads)

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
        the map is the name's cached head, ``zigzag(t)`` (the order key's own bytes when the
        time equals it, as for an epoch of the order key at granularity 1) and a constant
        tail, built once per run of equal times.  A time outside a long raises ValueError,
        as an order key does."""
        if not order_keys:
            return []
        _check_longs(order_keys, "order key")
        _check_longs(times, "time")
        zz = zigzag_long
        join = b"".join
        prefix = self.prefix
        # source ++ times: the source and the map's head are adjacent constants: one piece.
        source_head = self._source + self._int_time_head(name)
        tail = _INT_TIME_TAIL_END
        fast = self._fast
        slow = self.payload
        out: list[bytes] = []
        append = out.append
        prev: int | None = None
        time_bytes = b""
        for order_key, tracking_id, t, p in zip(
            order_keys, tracking_ids, times, payloads, strict=True
        ):
            key_bytes = zz(order_key)
            if prev is None or t != prev:
                time_bytes = key_bytes if t == order_key else zz(t)
                prev = t
            # self.payload(p) inlined (here and in _frame): one Python call less per record
            if fast is not None:
                try:
                    body = fast(p)
                except _NotFast:
                    body = slow(p)
            else:
                body = slow(p)
            # one join, not four concatenations (cheaper for these short pieces)
            append(join((prefix, key_bytes, zz(tracking_id), source_head, time_bytes, tail,
                         body)))
        return out

    def _frame(
        self,
        order_keys: Sequence[int],
        tracking_ids: Sequence[int],
        times: Sequence[bytes],
        payloads: Sequence[Mapping[str, Any]],
    ) -> list[bytes]:
        """The envelopes from already encoded ``times`` maps (one per record)."""
        zz = zigzag_long
        join = b"".join
        prefix = self.prefix
        source = self._source
        fast = self._fast
        slow = self.payload
        out: list[bytes] = []
        append = out.append
        for order_key, tracking_id, times_bytes, p in zip(
            order_keys, tracking_ids, times, payloads, strict=True
        ):
            if fast is not None:
                try:
                    body = fast(p)
                except _NotFast:
                    body = slow(p)
            else:
                body = slow(p)
            append(join((prefix, zz(order_key), zz(tracking_id), source, times_bytes, body)))
        return out


def _check_longs(values: Sequence[int], what: str) -> None:
    """Every value fits an Avro long, checked at the extremes (two C-level passes)."""
    for v in (min(values), max(values)):
        if not _MIN_LONG <= v <= _MAX_LONG:
            raise ValueError(f"{what} {v} does not fit an Avro long")
