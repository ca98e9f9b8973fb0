"""Schema evolution: every writer schema a stream has used, kept in a compacted topic.

Why a topic and not files (docs/design.md, "Schema evolution"): the schemas a reader needs
are those of the records *in the topic*, written by whatever publisher ran, wherever; a
history of ``.avsc`` files would be right only if every deployment copied it faithfully.
So each writer schema is registered, before its first record, in the compacted topic
``<control_topic_prefix>__schemas`` under the key ``<stream>/<fingerprint>`` (the same
fingerprint as every record's ``ss.fp`` header); compaction keeps one copy per key forever.

Rules (Avro schema resolution, checked with Apache Avro's own
``ReaderWriterCompatibilityChecker``): a new schema must read every registered one
(*backward*: an added field needs a default) and be readable by every registered one
(*forward*: old readers still run, so a removed field must have had a default — "optional").
A change that breaks either is refused at ``topics create`` and when a publisher starts,
with an error naming the field.  Readers decode a record written with any registered
schema into the shape of their own (the config's) schema.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from substreams.config import Config, TopicSpec
from substreams.errors import SchemaMismatchError, SubstreamsError
from substreams.kafka import client
from substreams.kafka.read import Reader
from substreams.kafka.topics import ensure_topics
from substreams.streams.schemas import envelope_schema, expanded, fingerprint

COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}


class IncompatibleSchemaError(SchemaMismatchError):
    """A stream's new schema cannot be resolved against one it used before."""


def schema_topic(config: Config) -> str:
    """The compacted topic holding every writer schema of every stream of ``config``."""
    return f"{config.acker.control_topic_prefix}__schemas"


def stream_fingerprint(payload: Mapping[str, Any]) -> str:
    """The ``ss.fp`` header value (hex) of records written with ``payload`` as schema."""
    return fingerprint(envelope_schema(payload)).hex()


# -- compatibility (pure) -------------------------------------------------------------------


def _field_at(schema: Mapping[str, Any], location: str) -> str:
    """The dotted field path of a checker location such as ``/fields/1/type/fields/0``."""
    node: Any = schema
    names: list[str] = []
    for part in [p for p in location.split("/") if p]:
        if isinstance(node, list) and part.isdigit():
            node = node[int(part)]
            if isinstance(node, dict) and "name" in node and "type" in node:
                names.append(str(node["name"]))
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            break
    return ".".join(names)


def incompatibilities(
    new: Mapping[str, Any], old: Mapping[str, Any]
) -> list[str]:
    """Why ``new`` cannot replace ``old`` (both payload schemas), one line per problem;
    empty when the change is compatible both ways."""
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
    from avro.schema import parse

    new_x, old_x = expanded(new), expanded(old)
    parsed_new, parsed_old = parse(json.dumps(new_x)), parse(json.dumps(old_x))
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    problems: list[str] = []
    for reader, writer, reader_doc, new_reads in (
        (parsed_new, parsed_old, new_x, True),
        (parsed_old, parsed_new, old_x, False),
    ):
        result = checker.get_compatibility(reader, writer)
        if result.compatibility is SchemaCompatibilityType.compatible:
            continue
        # The checker reports the field names of missing defaults as messages, and every
        # problem's place as a JSON-pointer-like location (as unordered sets).
        paths = sorted({_field_at(reader_doc, loc) for loc in result.locations} - {""})
        paths = paths or ["(the record itself)"]
        missing = {m for m in result.messages if " " not in m}
        for path in paths:
            if path.rsplit(".", 1)[-1] not in missing:
                continue
            if new_reads:
                problems.append(f"field '{path}' was added without a default")
            else:
                problems.append(
                    f"field '{path}' was removed but had no default (only optional fields, "
                    "with a default, may be removed)"
                )
        others = [p for p in paths if p.rsplit(".", 1)[-1] not in missing]
        details = sorted(m for m in result.messages if " " in m)
        if others and new_reads:
            problems.append(
                f"field{'s' if len(others) > 1 else ''} {', '.join(repr(p) for p in others)} "
                f"changed incompatibly ({'; '.join(details)})"
            )
        elif others and not problems:
            problems.append(
                f"old readers cannot read field{'s' if len(others) > 1 else ''} "
                f"{', '.join(repr(p) for p in others)} ({'; '.join(details)})"
            )
    return problems


# -- the registry ---------------------------------------------------------------------------


class SchemaRegistry:
    """The writer schemas of every stream, read from (and registered in) the schema topic.

    One per (bootstrap, topic) per process (:func:`registry`): it reads the topic once and
    again only when asked for a fingerprint it does not know."""

    def __init__(self, config: Config, bootstrap: str) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self.topic = schema_topic(config)
        self._known: dict[str, dict[str, dict[str, Any]]] = {}  # stream -> fp -> payload
        self._position = 0
        self._misses: dict[tuple[str, str], float] = {}
        self._down: tuple[float, str] | None = None
        """When the schema topic last could not be read, and why: asked again only after
        MISS_RETRY_S (a decoder fed garbage fingerprints must not wait on a dead broker per
        record)."""
        self._lock = threading.Lock()
        self._ensured = False

    def _ensure_topic(self) -> None:
        if self._ensured:
            return
        k = self.config.kafka
        spec = TopicSpec(self.topic, 1, "other", COMPACTED, k.replication_factor,
                         k.min_insync_replicas)
        ensure_topics(client.admin(self.bootstrap, self.config), [spec], log_differences=False)
        self._ensured = True

    def refresh(self, timeout: float = 30.0) -> None:
        """Read the schema topic from where the last read stopped to its end."""
        self._ensure_topic()
        with Reader(self.bootstrap, self.config, [TopicPartition(self.topic, 0, self._position)],
                    name=f"schema topic '{self.topic}'") as reader:
            for msg in reader.iter_to_end(timeout, 500):
                self._position = msg.offset() + 1
                self._take(msg.value())

    def _take(self, value: bytes | None) -> None:
        try:
            doc = json.loads(value or b"")
            stream, fp, schema = str(doc["stream"]), str(doc["fingerprint"]), doc["schema"]
        except (ValueError, KeyError, TypeError):
            return  # not ours: the topic is shared with nothing, but never trust a byte
        self._known.setdefault(stream, {})[fp] = schema

    def schemas(self, stream: str) -> dict[str, dict[str, Any]]:
        """Every registered payload schema of ``stream`` by fingerprint (hex)."""
        with self._lock:
            return dict(self._known.get(stream, {}))

    def writer(self, stream: str, fingerprint_hex: str) -> dict[str, Any] | None:
        """The payload schema ``stream``'s records with this fingerprint were written with."""
        with self._lock:
            found = self._known.get(stream, {}).get(fingerprint_hex)
            key = (stream, fingerprint_hex)
            # A fingerprint nobody registered (garbage bytes) is looked up again at most every
            # MISS_RETRY_S: bad input must not cost a topic read per record.
            if found is None and time.monotonic() - self._misses.get(key, -MISS_RETRY_S) >= (
                MISS_RETRY_S
            ):
                if self._down is not None and time.monotonic() - self._down[0] < MISS_RETRY_S:
                    raise SubstreamsError(self._down[1])
                try:
                    self.refresh()
                except (KafkaException, SubstreamsError) as exc:
                    self._down = (time.monotonic(), f"schema topic '{self.topic}': {exc}")
                    raise
                self._down = None
                found = self._known.get(stream, {}).get(fingerprint_hex)
                if found is None:
                    if len(self._misses) > 10_000:
                        self._misses.clear()
                    self._misses[key] = time.monotonic()
            return found

    def register(self, stream: str, payload: Mapping[str, Any], label: str) -> str:
        """Register ``payload`` as a writer schema of ``stream`` (idempotent); an
        :class:`IncompatibleSchemaError` naming the field if it breaks a registered one.
        Returns its fingerprint.  ``label`` names the schema in errors (its file)."""
        fp = stream_fingerprint(payload)
        with self._lock:
            if fp in self._known.get(stream, {}):
                return fp
            self.refresh()
            known = self._known.get(stream, {})
            if fp in known:
                return fp
            for old_fp, old in known.items():
                problems = incompatibilities(payload, old)
                if problems:
                    raise IncompatibleSchemaError(
                        f"stream '{stream}': schema {label} is not compatible with the schema "
                        f"the stream used before (fingerprint {old_fp}): "
                        + "; ".join(problems)
                        + ". Add fields with a default, remove only fields that have one; "
                        "for any other change, write a new stream"
                    )
            doc: dict[str, Any] = {"stream": stream, "fingerprint": fp, "schema": expanded(payload),
                   "registered_ms": int(time.time() * 1000)}
            producer = client.producer(self.bootstrap, self.config)
            producer.produce(self.topic, key=f"{stream}/{fp}".encode(),
                             value=json.dumps(doc, sort_keys=True).encode(), partition=0)
            if producer.flush(30) != 0:
                raise SubstreamsError(
                    f"schema topic '{self.topic}': could not register the schema of stream "
                    f"'{stream}' within 30 s"
                )
            self._known.setdefault(stream, {})[fp] = doc["schema"]
            return fp


MISS_RETRY_S = 5.0

# Process-wide cache: every reader and publisher of a cluster shares one view of its schema topic
# (one consumer, one producer) instead of re-reading the topic per client.
_REGISTRIES: dict[tuple[str, str], SchemaRegistry] = {}
_REGISTRIES_LOCK = threading.Lock()


def registry(config: Config, bootstrap: str | None = None) -> SchemaRegistry:
    """The process's registry for ``config``'s cluster and schema topic."""
    server = client.resolve_bootstrap(config, bootstrap)
    key = (server, schema_topic(config))
    with _REGISTRIES_LOCK:
        found = _REGISTRIES.get(key)
        if found is None:
            found = _REGISTRIES[key] = SchemaRegistry(config, server)
        return found


def register_stream(config: Config, stream: str, bootstrap: str | None = None) -> str:
    """Register the config's schema of ``stream``; see :meth:`SchemaRegistry.register`."""
    sc = config.stream(stream)
    return registry(config, bootstrap).register(stream, sc.schema, str(sc.schema_path))
