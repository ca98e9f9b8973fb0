"""Records of a topic substreams does not write: JSON, Avro single-object, Confluent wire.

Why a decoder of its own: a data topic's records are single-object encoded envelopes
(:mod:`substreams.streams.schemas`); an existing topic written by another team's service
holds bare payloads in whatever format that service chose.  ``substreams ingest``
(:mod:`substreams.ingest`) reads such a topic with this decoder and republishes each payload
into a tracked stream.  A record that cannot be made a payload of the stream's schema is a
*bad record* (:class:`ForeignPayloadError`, with the dead-letter reason), never a stop: the
ingest dead-letters it with its topic, partition and offset and goes on.

Formats (``streams[].source.format``):

* ``json``: a JSON object per record.  Its fit to the stream's Avro schema is checked by the
  stream's encoder (the hot path pays nothing more); a batch that does not encode is
  validated record by record (:func:`~substreams.streams.validate.payload_mismatch`) to
  name the misfits.
* ``avro``: Avro single-object encoding (``C3 01``, the 8-byte fingerprint, the body) of the
  stream's schema.
* ``confluent-avro``: the Schema Registry wire format -- magic byte 0, the 4-byte big-endian
  schema id, the Avro body.  The writer schema is fetched once per id through confluent-kafka's
  own ``SchemaRegistryClient`` and resolved into the stream's schema (Avro schema resolution:
  fields added with defaults, removed, promoted), so producers may evolve their schema across
  ids without a change here; a writer schema that does not resolve is a bad record.
"""

from __future__ import annotations

import io
import json
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

import fastavro

from substreams.config import StreamConfig
from substreams.errors import DecodeError, SubstreamsError
from substreams.streams.schemas import Codec

REASON_NOT_JSON = "not_json"
"""A ``json`` source's record that is not a JSON object."""
REASON_MISFIT = "schema_misfit"
"""A record whose payload does not fit the stream's schema (a field missing, of another
type; a writer schema that does not resolve into the stream's)."""
REASON_NOT_CONFLUENT = "not_confluent_wire"
"""A ``confluent-avro`` source's record without the magic byte 0 and a 4-byte schema id."""
REASON_UNKNOWN_ID = "unknown_schema_id"
"""A schema id the registry does not know."""
REASON_NOT_AVRO = "not_single_object"
"""An ``avro`` source's record that is not single-object encoded with the stream's schema."""

CONFLUENT_MAGIC = 0
CONFLUENT_PREFIX = 5


class ForeignPayloadError(DecodeError):
    """A foreign record that is no payload of the stream: ``reason`` is its dead-letter
    reason (``REASON_*`` above)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RegistryError(SubstreamsError):
    """The Schema Registry could not be asked (down, refused): no record's fault, so the
    ingest stops (its committed position is exact; a restart resumes there)."""


SchemaLookup = Callable[[int], "str | None"]
"""Schema id -> the writer schema as JSON text, None when the registry has no such id."""


def registry_lookup(url: str) -> SchemaLookup:
    """A lookup through confluent-kafka's ``SchemaRegistryClient`` (the ``registry`` extra:
    ``pip install 'substreams[registry]'``), which also caches the schemas it fetched."""
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.error import SchemaRegistryError
    except ImportError as exc:  # the extra's dependencies (httpx, authlib...) are missing
        raise SubstreamsError(
            f"format confluent-avro needs confluent-kafka's schema registry client ({exc}); "
            "install it with: pip install 'substreams[registry]'"
        ) from exc
    client = SchemaRegistryClient({"url": url})

    def lookup(schema_id: int) -> str | None:
        try:
            schema = client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise RegistryError(f"schema registry {url}: schema id {schema_id}: {exc}") from exc
        except Exception as exc:  # httpx's connection errors and the like
            raise RegistryError(f"schema registry {url}: schema id {schema_id}: {exc}") from exc
        return str(schema.schema_str)

    return lookup


class ForeignDecoder:
    """Bytes of a foreign topic -> payloads of the stream's schema (module doc)."""

    def __init__(self, stream: StreamConfig, lookup: SchemaLookup | None = None) -> None:
        source = stream.source
        if source is None:
            raise SubstreamsError(f"stream '{stream.name}' has no source topic")
        self.stream = stream
        self.format = source.format
        self.topic = source.topic
        self._reader = fastavro.parse_schema(json.loads(json.dumps(stream.schema)))
        self._codec: Codec | None = None
        self._writers: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._lookup = lookup
        if self.format == "avro":
            self._codec = Codec(stream.schema, label=f"topic '{self.topic}'")
        elif self.format == "confluent-avro" and lookup is None:
            assert source.registry_url is not None  # the loader requires it
            self._lookup = registry_lookup(source.registry_url)

    def decode(self, value: bytes | None) -> dict[str, Any]:
        """The payload of one record; :class:`ForeignPayloadError` if there is none."""
        data = value or b""
        if self.format == "json":
            return self._json(data)
        if self.format == "avro":
            assert self._codec is not None
            try:
                return self._codec.decode_single(data)
            except DecodeError as exc:
                raise ForeignPayloadError(REASON_NOT_AVRO, str(exc)) from exc
        return self._confluent(data)

    def _json(self, data: bytes) -> dict[str, Any]:
        try:  # a str: json.loads of bytes first guesses their encoding, per record
            payload = json.loads(data.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError included
            raise ForeignPayloadError(
                REASON_NOT_JSON,
                f"topic '{self.topic}': not JSON ({exc}); {len(data)} bytes starting "
                f"{data[:16]!r}",
            ) from exc
        if not isinstance(payload, dict):
            raise ForeignPayloadError(
                REASON_NOT_JSON,
                f"topic '{self.topic}': a JSON {type(payload).__name__}, not an object of "
                f"{self.stream.schema.get('name')}'s fields",
            )
        return payload

    def _confluent(self, data: bytes) -> dict[str, Any]:
        if len(data) < CONFLUENT_PREFIX or data[0] != CONFLUENT_MAGIC:
            raise ForeignPayloadError(
                REASON_NOT_CONFLUENT,
                f"topic '{self.topic}': not in the Schema Registry wire format (magic byte 0 "
                f"and a 4-byte schema id); {len(data)} bytes starting {data[:8].hex() or '-'}",
            )
        (schema_id,) = struct.unpack(">I", data[1:CONFLUENT_PREFIX])
        writer = self._writer(schema_id)
        try:
            out = fastavro.schemaless_reader(
                io.BytesIO(data[CONFLUENT_PREFIX:]), writer, self._reader
            )
        except Exception as exc:  # fastavro: truncated body, a writer that does not resolve
            raise ForeignPayloadError(
                REASON_MISFIT,
                f"topic '{self.topic}': schema id {schema_id}: the body does not decode into "
                f"{self.stream.schema.get('name')}: {exc}",
            ) from exc
        if not isinstance(out, dict):
            raise ForeignPayloadError(
                REASON_MISFIT, f"topic '{self.topic}': schema id {schema_id} is not a record"
            )
        return out

    def _writer(self, schema_id: int) -> Any:
        with self._lock:
            found = self._writers.get(schema_id)
        if found is not None:
            return found
        assert self._lookup is not None
        text = self._lookup(schema_id)
        if text is None:
            raise ForeignPayloadError(
                REASON_UNKNOWN_ID,
                f"topic '{self.topic}': the registry has no schema id {schema_id}",
            )
        try:
            parsed = fastavro.parse_schema(json.loads(text))
        except Exception as exc:
            raise ForeignPayloadError(
                REASON_MISFIT, f"topic '{self.topic}': schema id {schema_id} is no Avro "
                f"schema fastavro reads: {exc}",
            ) from exc
        with self._lock:
            self._writers[schema_id] = parsed
        return parsed


def confluent_frame(schema_id: int, body: bytes) -> bytes:
    """The Schema Registry wire format of an Avro body (tests, benchmarks)."""
    return struct.pack(">bI", CONFLUENT_MAGIC, schema_id) + body


def untimed(payload: Mapping[str, Any], field: str) -> str | None:
    """Why ``payload`` has no integer event time in ``field`` (None: it has one)."""
    value = payload.get(field)
    if isinstance(value, int) and not isinstance(value, bool):
        return None
    return f"field '{field}' is {value!r}, not an integer event time in ms"


__all__ = [
    "REASON_MISFIT",
    "REASON_NOT_AVRO",
    "REASON_NOT_CONFLUENT",
    "REASON_NOT_JSON",
    "REASON_UNKNOWN_ID",
    "ForeignDecoder",
    "ForeignPayloadError",
    "RegistryError",
    "SchemaLookup",
    "confluent_frame",
    "registry_lookup",
    "untimed",
]
