"""Avro schemas of `substreams/avro/` and a codec that refuses records written with another
schema.

The ``.avsc`` files are package data, read with :mod:`importlib.resources`: the same code
finds them in a source checkout, an installed wheel and the ``--py-files`` zip of
``substreams submit`` (zipimport serves resources too), never by a path.

Why a fingerprint on every record (Sherlock's "signature of the storage schema"): a reader
that decodes bytes written with a different schema gets garbage, not an error.  Each record
carries the 8-byte CRC-64-AVRO (Rabin) fingerprint of its writer schema's parsing canonical
form; a codec decodes only records whose fingerprint it knows: its own, or one its
``writers`` lookup resolves (a stream's earlier schemas, see
:mod:`substreams.streams.evolution`), decoded into its own shape by Avro resolution.

Where the fingerprint travels: data-topic records (data envelopes and in-band punctuations)
use Avro's *single-object encoding* -- the marker ``C3 01``, the fingerprint (8 bytes,
little-endian, as Java's ``SchemaNormalization`` gives it) and the Avro binary body
(:meth:`Codec.encode_single`, :meth:`Codec.decode_single`).  Why not Kafka headers: the
headers cost every record ~35 bytes on the wire and the broker and the client time per
record for each header, on the hot path; the prefix is 10 bytes in the value, readable by
any Avro library that implements the spec and cut with a ``substring`` in Spark SQL.  A
punctuation is told apart from a data record by its fingerprint (the punctuation schema's).
The protocol topics (control, acks, commands, responses: few records a second) keep the
fingerprint in the ``ss.fp`` header (:meth:`Codec.headers`).
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import fastavro
from fastavro.schema import fingerprint as _fingerprint
from fastavro.schema import parse_schema, to_parsing_canonical_form

from substreams.errors import ForeignRecordError, SchemaMismatchError, UnknownSchemaError

SCHEMA_PACKAGE = "substreams"
SCHEMA_FOLDER = "avro"
HEADER_FINGERPRINT = "ss.fp"
SINGLE_OBJECT_MARKER = b"\xc3\x01"
"""The two bytes that open an Avro single-object encoded record."""
PREFIX_BYTES = len(SINGLE_OBJECT_MARKER) + 8
"""The single-object prefix: the marker and the 8-byte writer fingerprint."""

WriterLookup = Callable[[bytes], Mapping[str, Any] | None]
"""fingerprint (hex, of its little-endian bytes) -> the full writer schema, or None if
unknown."""

# Shared named types, parsed first so that other schemas can refer to them by name.
_SHARED = ("time", "range")


def schema_file(name: str) -> Traversable:
    """The package resource ``substreams/avro/<name>.avsc`` (a file, or a member of a zip)."""
    return resources.files(SCHEMA_PACKAGE) / SCHEMA_FOLDER / f"{name}.avsc"


def raw_schema(name: str) -> dict[str, Any]:
    """The JSON of ``substreams/avro/<name>.avsc`` (a fresh copy: callers may change it)."""
    data: dict[str, Any] = json.loads(schema_file(name).read_text(encoding="utf-8"))
    return data


@cache
def _shared_definitions() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in _SHARED:
        raw = raw_schema(name)
        out[f"{raw['namespace']}.{raw['name']}"] = raw
    return out


def expanded(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema made self-contained: the first reference to each shared named type (from
    ``substreams/avro/time.avsc``, ``range.avsc``) is replaced by its definition, later ones stay
    references, as Avro requires."""
    shared = _shared_definitions()
    defined: set[str] = set()

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            if node in shared and node not in defined:
                defined.add(node)
                return walk(copy.deepcopy(shared[node]))
            return node
        if isinstance(node, list):
            return [walk(n) for n in node]
        if isinstance(node, dict):
            if node.get("type") in ("record", "enum", "fixed") and "name" in node:
                ns = node.get("namespace")
                full = node["name"] if "." in node["name"] or not ns else f"{ns}.{node['name']}"
                defined.add(full)
            return {
                k: (walk(v) if k in ("type", "fields", "items", "values") else v)
                for k, v in node.items()
            }
        return node

    result: dict[str, Any] = walk(copy.deepcopy(dict(schema)))
    return result


def fingerprint(schema: Mapping[str, Any]) -> bytes:
    """CRC-64-AVRO fingerprint of the schema's parsing canonical form."""
    canonical = to_parsing_canonical_form(expanded(schema))
    return bytes.fromhex(_fingerprint(canonical, "CRC-64-AVRO"))


def envelope_schema(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The data-record schema of a stream: the envelope with the stream's record as payload."""
    env = raw_schema("envelope")
    for f in env["fields"]:
        if f["name"] == "payload":
            f["type"] = copy.deepcopy(dict(payload))
    return env


def prefix_fingerprint(data: bytes) -> bytes | None:
    """The writer fingerprint (hex) in the single-object prefix of ``data``, or None when
    ``data`` does not start with one (too short, or another marker)."""
    if len(data) < PREFIX_BYTES or not data.startswith(SINGLE_OBJECT_MARKER):
        return None
    return data[len(SINGLE_OBJECT_MARKER):PREFIX_BYTES].hex().encode()


UNTRACKED_HINT = (
    "Records of a data topic are written by substreams' publishers; to track a topic "
    "another producer writes (plain JSON, Avro, Confluent Schema Registry), declare a "
    "stream over it (streams[].source: {topic: ..., format: json}) and run `substreams "
    "ingest -c FILE --stream NAME` (README, \"Any producer\")."
)
"""What to do about a foreign record on a data topic: said by every reader's error."""


class Codec:
    """Avro encoding with the writer fingerprint checked on the way back: single-object
    encoded (:meth:`encode_single`), or schemaless with the fingerprint in a header
    (:meth:`encode`, :meth:`headers`)."""

    def __init__(
        self,
        schema: Mapping[str, Any],
        label: str | None = None,
        *,
        union_names: bool = False,
        writers: WriterLookup | None = None,
    ) -> None:
        self.schema = expanded(schema)
        self.union_names = union_names
        self.label = label or str(self.schema.get("name", "record"))
        self._parsed = parse_schema(self.schema)
        self.fingerprint = fingerprint(self.schema)
        self.fingerprint_hex = self.fingerprint.hex().encode()
        self.prefix = SINGLE_OBJECT_MARKER + self.fingerprint
        """What every single-object encoded record of this schema starts with."""
        self._writers = writers
        self._resolved: dict[bytes, Any] = {}  # fingerprint -> parsed writer schema

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """The schemaless Avro body (no fingerprint: see :meth:`headers`)."""
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self._parsed, record)
        return buf.getvalue()

    def encode_single(self, record: Mapping[str, Any]) -> bytes:
        """The single-object encoding: :attr:`prefix`, then the Avro body."""
        return self.prefix + self.encode(record)

    def decode(self, data: bytes, fingerprint_hex: bytes | None = None) -> dict[str, Any]:
        """Decode the schemaless body ``data``; ``fingerprint_hex`` is the record's ``ss.fp``
        header value (None: this codec's own schema)."""
        return self._read(io.BytesIO(data), fingerprint_hex)

    def decode_single(self, data: bytes) -> dict[str, Any]:
        """Decode a single-object encoded record.  :class:`SchemaMismatchError` when ``data``
        has no single-object prefix, or a fingerprint that is neither this codec's nor one
        its ``writers`` lookup resolves (decoding it would give garbage, not an error)."""
        buf = io.BytesIO(data)
        buf.seek(PREFIX_BYTES)
        if data.startswith(self.prefix):
            return self._read(buf, None)
        found = prefix_fingerprint(data)
        if found is None:
            raise ForeignRecordError(
                f"{self.label}: not a single-object encoded record (no C3 01 marker and "
                f"8-byte schema fingerprint before the body; {len(data)} bytes starting "
                f"{data[:PREFIX_BYTES].hex() or '<empty>'}); refusing to decode it. "
                f"{UNTRACKED_HINT}"
            )
        return self._read(buf, found)

    def _read(self, buf: io.BytesIO, fingerprint_hex: bytes | None) -> dict[str, Any]:
        writer = self._parsed
        if fingerprint_hex is not None and fingerprint_hex != self.fingerprint_hex:
            writer = self._writer(fingerprint_hex)
        try:
            out = fastavro.schemaless_reader(
                buf,
                writer,
                None if writer is self._parsed else self._parsed,
                return_record_name=self.union_names,
            )
        except Exception as exc:  # fastavro raises many types on truncated/garbled input
            if writer is not self._parsed:
                assert fingerprint_hex is not None
                raise SchemaMismatchError(
                    f"{self.label}: cannot decode a record written with schema fingerprint "
                    f"{fingerprint_hex.decode(errors='replace')} into this reader's schema "
                    f"(fingerprint {self.fingerprint_hex.decode()}): {exc}"
                ) from exc
            raise SchemaMismatchError(f"{self.label}: cannot decode record: {exc}") from exc
        if not isinstance(out, dict):
            raise SchemaMismatchError(f"{self.label}: not a record: {out!r}")
        return out

    def _writer(self, fingerprint_hex: bytes) -> Any:
        """The parsed writer schema of another fingerprint, or a SchemaMismatchError."""
        parsed = self._resolved.get(fingerprint_hex)
        if parsed is not None:
            return parsed
        found = self._writers(fingerprint_hex) if self._writers is not None else None
        if found is None:
            raise UnknownSchemaError(
                f"{self.label}: record written with schema fingerprint "
                f"{fingerprint_hex.decode(errors='replace')}, this reader knows "
                f"{self.fingerprint_hex.decode()}"
                + (" and no registered schema has it" if self._writers is not None else "")
                + "; refusing to decode it"
            )
        parsed = self._resolved[fingerprint_hex] = parse_schema(expanded(found))
        return parsed

    def headers(self) -> list[tuple[str, bytes]]:
        """The ``ss.fp`` header of a record written with :meth:`encode` (protocol topics)."""
        return [(HEADER_FINGERPRINT, self.fingerprint_hex)]


@cache
def _previous_versions(name: str) -> dict[bytes, dict[str, Any]]:
    """Earlier versions of a protocol schema (``substreams/avro/<name>.v<N>.avsc``) by
    fingerprint (hex).  Why kept: topics outlive an upgrade, and a reader must still decode
    what the previous version wrote (a new message type is appended to a union, so records
    of the old types resolve unchanged)."""
    folder = resources.files(SCHEMA_PACKAGE) / SCHEMA_FOLDER
    out: dict[bytes, dict[str, Any]] = {}
    for entry in folder.iterdir():
        if entry.name.startswith(f"{name}.v") and entry.name.endswith(".avsc"):
            schema = expanded(json.loads(entry.read_text(encoding="utf-8")))
            out[fingerprint(schema).hex().encode()] = schema
    return out


@cache
def protocol_codec(name: str) -> Codec:
    """Codec of one of the project's own protocol schemas (control, ack, punctuation...);
    it also decodes records written with the schema's previous versions."""
    return Codec(raw_schema(name), label=f"{name} record", union_names=True,
                 writers=_previous_versions(name).get)


@cache
def protocol_prefixes(name: str) -> frozenset[bytes]:
    """The single-object prefixes of a protocol schema and of its previous versions: what
    tells its records apart from others on a shared topic (punctuations among data)."""
    return frozenset(
        {protocol_codec(name).prefix}
        | {SINGLE_OBJECT_MARKER + bytes.fromhex(fp.decode()) for fp in _previous_versions(name)}
    )


def is_punctuation(data: bytes) -> bool:
    """Whether a data-topic record is an in-band punctuation: its single-object prefix is
    the punctuation schema's (or a previous version's).  The one rule every reader of a
    data topic in Python applies (the JVM read states it in Spark SQL)."""
    return data[:PREFIX_BYTES] in protocol_prefixes("punctuation")

