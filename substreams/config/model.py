"""The typed, validated view of ``substreams.yaml``.

Every other module takes these frozen dataclasses instead of raw YAML so that
validation happens once, at load time, with file/line diagnostics (see
:mod:`substreams.config.loader`), and the rest of the code can trust the values.
Defaults live here so that tests can build configs in code without a YAML file.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from substreams.errors import ConfigError

Kind = Literal["epoch", "tumbling", "session", "per_key"]
Mechanism = Literal["acker", "punctuations"]
Bound = Literal["firm", "soft"]
ClientValue = str | int | float | bool

EMBEDDED: str = "embedded"
"""``kafka.bootstrap`` value meaning the broker started by ``substreams broker start``."""


def _empty_client() -> Mapping[str, ClientValue]:
    return MappingProxyType({})


@dataclass(frozen=True)
class KafkaConfig:
    """Where the broker is and how topics are created."""

    bootstrap: str = EMBEDDED
    replication_factor: int = 1
    client: Mapping[str, ClientValue] = dataclasses.field(default_factory=_empty_client)
    """Extra librdkafka settings, passed through untouched (read-only mapping)."""

    @property
    def embedded(self) -> bool:
        """True when the embedded broker (``substreams broker start``) is meant."""
        return self.bootstrap == EMBEDDED


@dataclass(frozen=True)
class StreamConfig:
    """A Kafka data topic (named like the stream) and the Avro schema of its records."""

    name: str
    schema_path: Path
    """Absolute path of the ``.avsc`` file."""
    schema: dict[str, Any]
    """The schema as JSON (not fastavro-parsed), so it can be re-serialised or shipped."""
    partitions: int
    order_key: str
    """An int/long field, non-decreasing per partition: what firm bounds are built on."""

    def parsed_schema(self) -> Any:
        """The fastavro-parsed schema (a fresh copy: fastavro may annotate its input)."""
        import fastavro

        return fastavro.parse_schema(copy.deepcopy(self.schema))

    def field_names(self) -> tuple[str, ...]:
        """Names of the record's fields, in schema order."""
        return tuple(str(f["name"]) for f in self.schema.get("fields", ()))


@dataclass(frozen=True)
class SubstreamConfig:
    """How a stream is cut into substreams and how their ends are tracked.

    ``field`` is the epoch field (epoch) or the event-time field in ms
    (tumbling/session; the stream's order key unless set) and None for per_key.
    ``size_ms`` is set for tumbling only, ``gap_ms`` for session only and ``key``
    for session and per_key only.
    """

    name: str
    stream: str
    kind: Kind
    field: str | None = None
    size_ms: int | None = None
    key: str | None = None
    gap_ms: int | None = None
    mechanism: Mechanism = "acker"
    bound: Bound = "firm"
    ordered: bool = True


@dataclass(frozen=True)
class StageConfig:
    """A Python stage reading ``input`` and writing ``output`` (tracked by the acker).

    ``input == output`` is allowed: that is a cycle, which only the acker can track.
    """

    name: str
    input: str
    output: str


@dataclass(frozen=True)
class AckerConfig:
    """The acker service: its identity, internal topics and timing knobs."""

    name: str = "acker"
    """Used for the transactional.id, so that a restarted acker fences the old one."""
    acks_topic: str = "_substreams.acks"
    acks_partitions: int = 1
    control_topic_prefix: str = "_substreams.control."
    command_topic: str = "_substreams.commands"
    response_topic: str = "_substreams.responses"
    dead_letter_topic: str = "_substreams.dead_letter"
    flush_ms: int = 5
    """Tracking agents flush aggregated acks at least this often..."""
    flush_reports: int = 1000
    """...or after this many reports, whichever comes first."""
    heartbeat_ms: int = 500
    standby_timeout_ms: int = 3000
    """A standby takes over after this long without a heartbeat (> heartbeat_ms)."""
    snapshot_every: int = 100
    """Write a frontier snapshot every N notifications (bounds recovery replay)."""

    def control_topic(self, substream: str) -> str:
        """The control topic (punctuations, notifications) of substream ``substream``."""
        return self.control_topic_prefix + substream

    def checkpoint_topic(self, acker_name: str | None = None) -> str:
        """The acker's own control topic: its checkpoints and heartbeats (standbys watch it)."""
        return f"{self.control_topic_prefix}__acker.{acker_name or self.name}"


@dataclass(frozen=True)
class Config:
    """The whole of ``substreams.yaml``."""

    path: Path
    """Absolute path of the config file (schemas were resolved against its directory)."""
    kafka: KafkaConfig
    streams: tuple[StreamConfig, ...]
    substreams: tuple[SubstreamConfig, ...] = ()
    stages: tuple[StageConfig, ...] = ()
    acker: AckerConfig = dataclasses.field(default_factory=AckerConfig)

    def stream(self, name: str) -> StreamConfig:
        """The stream called ``name``; a :class:`ConfigError` naming the known ones if none."""
        for s in self.streams:
            if s.name == name:
                return s
        raise self._unknown("streams", "stream", name, [s.name for s in self.streams])

    def substream(self, name: str) -> SubstreamConfig:
        """The substream called ``name``; a :class:`ConfigError` naming the known ones if none."""
        for s in self.substreams:
            if s.name == name:
                return s
        raise self._unknown("substreams", "substream", name, [s.name for s in self.substreams])

    def substreams_of(self, stream: str) -> tuple[SubstreamConfig, ...]:
        """The substreams defined over ``stream`` (possibly none), in file order."""
        return tuple(s for s in self.substreams if s.stream == stream)

    def topics(self) -> list[tuple[str, int]]:
        """Every topic this config needs, with its partition count, for ``topics create``."""
        out = [(s.name, s.partitions) for s in self.streams]
        out += [(self.acker.control_topic(s.name), 1) for s in self.substreams]
        out.append((self.acker.checkpoint_topic(), 1))
        out.append((self.acker.acks_topic, self.acker.acks_partitions))
        out += [
            (self.acker.command_topic, 1),
            (self.acker.response_topic, 1),
            (self.acker.dead_letter_topic, 1),
        ]
        return out

    def _unknown(self, section: str, what: str, name: str, known: list[str]) -> ConfigError:
        listing = ", ".join(known) if known else "(none)"
        return ConfigError(
            str(self.path),
            None,
            section,
            f"no {what} named {name!r}; known: {listing}",
            value=name,
            allowed=listing,
        )
