"""The typed, validated view of ``substreams.yaml``.

Every other module takes these frozen dataclasses instead of raw YAML so that
validation happens once, at load time, with file/line diagnostics (see
:mod:`substreams.config.loader`), and the rest of the code can trust the values.
Defaults live here so that tests can build configs in code without a YAML file.

The field annotations also say what the file accepts (``Count``: an integer >= 1, ``Name``...):
pydantic validates the file against them (the loader), while the classes stay plain
dataclasses that build, compare and pickle without pydantic's help.

Every class pickles (plain ``pickle`` and the ``cloudpickle`` PySpark uses) and compares
equal after a round trip: a Spark job ships the :class:`Config` it validated on the driver
to its tasks, which therefore never read (or need) the YAML file or the ``.avsc`` files.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, PlainValidator, Strict
from pydantic_core import PydanticCustomError

from substreams.errors import ConfigError

Kind = Literal["epoch", "tumbling", "hopping", "session", "per_key"]
Mechanism = Literal["acker", "punctuations"]
Bound = Literal["firm", "soft"]
LateRule = Literal["raise", "dead_letter"]
BadRecordRule = Literal["dead_letter", "fail"]
ForeignFormat = Literal["json", "avro", "confluent-avro"]
"""How the records of an existing topic a stream follows are encoded (``source.format``)."""
ForeignStart = Literal["earliest", "latest"]
"""What a reader of a stream does with a record it cannot decode (``on_bad_record``)."""
ClientValue = str | int | float | bool

EMBEDDED: str = "embedded"
"""``kafka.bootstrap`` value meaning the broker started by ``substreams broker start``."""

TopicKind = Literal[
    "data", "control", "checkpoint", "acks", "command", "response", "dead_letter", "other"
]
"""What a topic holds, which decides how it is kept (docs/design.md, "Topic settings").
``other``: a topic a caller names without a kind (``ensure_topics`` with a plain tuple)."""

KEEP: int = -1
"""``retention.ms`` / ``retention.bytes`` value meaning "never delete"."""
MINUTE_MS: int = 60_000
DAY_MS: int = 24 * 3_600_000
MIB: int = 1 << 20
MAX_AUTO_REPLICATION: int = 3
"""The automatic replication factor is min(this, brokers in the cluster)."""
MIN_CHECKPOINT_RETENTION_BYTES: int = 16 * MIB
"""A quarter of it is the checkpoint topic's segment size: 4 MiB, above the largest record a
producer sends with default settings (1 MB), so the retained tail holds whole checkpoints."""


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Names of streams, substreams, stages and the acker: they become Kafka topic names
and transactional ids, so only characters Kafka accepts everywhere are allowed."""
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")


def _invalid(problem: str, allowed: str | None = None) -> PydanticCustomError:
    """A validation error worded like the loader's own (it passes ``problem`` through)."""
    return PydanticCustomError("config", "{problem}", {"problem": problem, "allowed": allowed})


def _name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN[1:-1], value):
        raise _invalid(
            f"{value!r} is not a valid name; names must match {NAME_PATTERN}"
            " (they become Kafka topic names)"
        )
    return value


def _topic(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", value):
        raise _invalid(
            f"{value!r} is not a valid Kafka topic name; use letters, digits, '.', '_', '-'"
        )
    return value


def _retention(value: int) -> int:
    if value != KEEP and value < MINUTE_MS:
        raise _invalid(
            f"{value} is out of range; must be {KEEP} (keep forever) or >= {MINUTE_MS}"
            " (one minute, in ms)"
        )
    return value


def _bootstrap(value: str) -> str:
    for part in value.split(",") if value != EMBEDDED else ():
        m = _HOST_PORT.fullmatch(part)
        if m is None or not 1 <= int(m.group(1)) <= 65535:
            raise _invalid(
                f"{value!r} is not a valid bootstrap; expected {EMBEDDED!r} or "
                "host:port[,host:port...]",
                f"{EMBEDDED}, host:port[,host:port...]",
            )
    return value


def show(value: object) -> str:
    """A value as the user wrote it, YAML-flavoured (``null``, ``true``, ``'text'``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return repr(value)


def _client_value(value: object) -> ClientValue:
    if not isinstance(value, str | int | float | bool):
        raise _invalid(f"expected a string, number or boolean, got {show(value)}")
    return value


def _timeout_or_null(value: object) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise _invalid(
            f"expected a timeout in ms or null, got {show(value)}",
            "null (off, the default) or an integer >= 1",
        )
    return value


# What a key of the file accepts.  Strict: ``'2'`` is not an integer nor ``1`` a string.
Text = Annotated[str, Strict()]
Flag = Annotated[bool, Strict()]
COMMIT_TIMEOUT_MAX_MS = 60_000
"""``kafka.commit_timeout_ms`` at most: below how long a writer waits out an outage in all
(``client.COMMIT_PATIENCE_S``, 75 s), so that a timed-out commit is called again at least
once."""
Count = Annotated[int, Strict(), Field(ge=1)]
Name = Annotated[str, Strict(), AfterValidator(_name)]
Topic = Annotated[str, Strict(), AfterValidator(_topic)]
RetentionMs = Annotated[int, Strict(), Field(ge=KEEP), AfterValidator(_retention)]
"""A topic's retention.ms: -1 (keep forever) or at least a minute."""
_FILE = ConfigDict(extra="forbid")
"""Every class of the file: a key it does not define is an error, not ignored."""


def _empty_client() -> Mapping[str, ClientValue]:
    return MappingProxyType({})


def _rebuild(cls: type[Any], fields: dict[str, Any]) -> Any:
    """Unpickling helper: ``cls(**fields)`` (runs ``__post_init__``, unlike plain unpickling)."""
    return cls(**fields)


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]


@dataclass(frozen=True)
class SecurityConfig:
    """How every client of the config authenticates and encrypts (``kafka.security``).

    One block for all of them: :mod:`substreams.kafka.security` maps it onto librdkafka's
    keys (publishers, ackers, readers, the CLI) and onto the Java client's (Spark's Kafka
    source, ``kafka.*`` options).  The password is never a value of the file nor of this
    object: only where to find it (``password_env`` or ``password_file``), read when a
    client is built, so no repr, log line, pickle shipped to Spark or dashboard page holds
    it.  Relative file paths are resolved against the config file's folder."""

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
    protocol: SecurityProtocol = "SASL_SSL"
    sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    username: Text | None = None
    password_env: Text | None = None
    """The environment variable holding the password (on every host a client runs on,
    Spark executors included)."""
    password_file: Text | None = None
    """A file holding the password (its first line; a trailing newline is not part of it)."""
    ca_file: Text | None = None
    """PEM file of the CA(s) that signed the brokers' certificates (None: the system's)."""
    check_hostname: Flag = True
    """Check that the broker's certificate names the host connected to (turn off only for a
    test cluster whose certificate does not)."""

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")


@dataclass(frozen=True)
class KafkaConfig:
    """Where the broker is and how topics are created."""

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
    bootstrap: Annotated[str, Strict(), AfterValidator(_bootstrap)] = EMBEDDED
    replication_factor: Count | None = None
    """None: automatic, min(3, brokers in the cluster) when a topic is created."""
    client: Mapping[str, Annotated[ClientValue, PlainValidator(_client_value)]] = dataclasses.field(
        default_factory=_empty_client
    )
    """Extra librdkafka settings, passed through untouched (read-only mapping)."""
    security: SecurityConfig | None = None
    """TLS / SASL settings of every client (None: PLAINTEXT, or what ``client`` says)."""
    min_insync_replicas: Count | None = None
    """None: 2 when the replication factor is >= 3, else 1 (:func:`default_min_insync`)."""
    data_retention_ms: RetentionMs = 7 * DAY_MS
    """Retention of data topics (-1: keep forever); ``streams[].retention_ms`` overrides it."""
    commit_timeout_ms: Annotated[int, Strict(), Field(ge=1000, le=COMMIT_TIMEOUT_MAX_MS)] = 30_000
    """How long one ``commit_transaction`` call of a transactional writer waits before it is
    called again (a timed-out commit is still in progress; see
    :func:`substreams.kafka.client.commit_transaction`).  Not how long a writer waits out an
    outage in all: that is ``client.COMMIT_PATIENCE_S``."""

    def __post_init__(self) -> None:
        # A read-only view of a private copy, whatever mapping the caller passed.
        object.__setattr__(self, "client", MappingProxyType(dict(self.client)))

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy does not pickle: ship the settings as a dict, re-wrapped on load.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["client"] = dict(self.client)
        return (_rebuild, (KafkaConfig, fields))

    @property
    def embedded(self) -> bool:
        """True when the embedded broker (``substreams broker start``) is meant."""
        return self.bootstrap == EMBEDDED


def auto_replication(brokers: int) -> int:
    """The automatic replication factor: min(3, brokers), at least 1."""
    return max(1, min(MAX_AUTO_REPLICATION, brokers))


def default_min_insync(replication_factor: int) -> int:
    """2 when there are >= 3 replicas (an acknowledged write is on two brokers, and one
    broker may be down without stopping writes), else 1 (with 2 replicas, 2 would stop every
    write while either broker is down)."""
    return 2 if replication_factor >= 3 else 1


@dataclass(frozen=True)
class ForeignSource:
    """An existing topic a stream follows (``streams[].source``): written by producers that
    know nothing of substreams (a Java service, Kafka Connect, a plain confluent-kafka
    client), read by ``substreams ingest``, which republishes each record into the stream
    exactly once, its input offsets committed in the stream's transaction (docs/design.md,
    "Any producer: a stream over an existing topic").

    ``format``: ``json`` (a JSON object per record, validated against the stream's schema),
    ``avro`` (Avro single-object encoding of the stream's schema), ``confluent-avro`` (the
    Schema Registry wire format, magic 0 and a 4-byte schema id; needs ``registry_url``).
    ``start``: where a first run starts when the topic has no committed position."""

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
    topic: Topic
    format: ForeignFormat = "json"
    registry_url: Text | None = None
    start: ForeignStart = "earliest"


@dataclass(frozen=True)
class StreamConfig:
    """A Kafka data topic (named like the stream) and the Avro schema of its records."""

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
    name: Name
    schema_path: Path
    """Absolute path of the ``.avsc`` file."""
    schema: dict[str, Any]
    """The schema as JSON (not fastavro-parsed), so it can be re-serialised or shipped."""
    partitions: Count
    order_key: Text | None = None
    """An int/long field, non-decreasing per publisher; None (the default): the framework
    keeps the order key itself -- each publisher's ingest time in ms, made non-decreasing
    -- so a stream whose event times arrive out of order needs no field for it."""
    retention_ms: RetentionMs | None = None
    """The data topic's retention.ms (-1: forever); None: ``kafka.data_retention_ms``."""
    on_bad_record: BadRecordRule = "dead_letter"
    """A record of the topic no reader can decode (foreign bytes, an unknown schema
    fingerprint, a truncated body): ``dead_letter`` writes it to the dead-letter topic with
    its topic, partition, offset and reason and reads on; ``fail`` stops the reader with an
    error naming them (:mod:`substreams.streams.badrecords`)."""
    source: ForeignSource | None = None
    """An existing topic this stream follows (``substreams ingest``); None: the stream is
    written by substreams' own publishers."""


@dataclass(frozen=True)
class SealPolicy:
    """When a publisher seals on its own (``seal: {lateness_ms, idle_ms, late}``).

    Bounded out-of-orderness at the source: once the event time it has published reaches
    ``h``, the publisher promises no later record below ``h - lateness_ms`` and seals every
    time below that.  ``idle_ms`` (None: never): after that long without a record (processing
    time) it promises the same of its clock, ``now - lateness_ms`` -- a promise it keeps, so
    a record that then arrives below it is late.  ``late``: what a record at a time the
    publisher already sealed gets: ``raise`` (:class:`~substreams.errors.SealedTimeError`,
    nothing written) or ``dead_letter`` (written to the dead-letter topic with the reason and
    the time it missed, counted in ``substreams_dead_letters_total``; the rest go on)."""

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
    lateness_ms: Annotated[int, Strict(), Field(ge=0)] = 0
    idle_ms: Count | None = None
    late: LateRule = "raise"

    def __post_init__(self) -> None:
        if self.lateness_ms < 0:
            raise ValueError(f"lateness_ms must be >= 0, not {self.lateness_ms}")
        if self.idle_ms is not None and self.idle_ms < 1:
            raise ValueError(f"idle_ms must be >= 1, not {self.idle_ms}")
        if self.late not in ("raise", "dead_letter"):
            raise ValueError(f"late must be 'raise' or 'dead_letter', not {self.late!r}")


@dataclass(frozen=True)
class SubstreamConfig:
    """How a stream is cut into substreams and how their ends are tracked.

    ``field`` is the epoch field (epoch) or the event-time field in ms
    (tumbling/hopping/session; the stream's order key unless set) and None for per_key.
    ``size_ms`` is set for tumbling and hopping only, ``slide_ms`` for hopping only,
    ``gap_ms`` for session only and ``key`` for session and per_key only.

    A hopping substream's times are its *panes*, tumbling windows of ``slide_ms``
    (:attr:`pane_ms`): the publisher, the seal policy and the acker treat it as the
    tumbling substream of that width; only its firm readers group ``size_ms // slide_ms``
    consecutive panes into a window (:mod:`substreams.control.panes`).
    """

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
    name: Name
    stream: Text
    kind: Kind
    field: Text | None = None
    size_ms: Count | None = None
    key: Text | None = None
    gap_ms: Count | None = None
    slide_ms: Count | None = None
    mechanism: Mechanism = "acker"
    bound: Bound = "firm"
    ordered: Flag = True
    seal: SealPolicy | None = None
    """None: ``seal: manual``, the publisher's code seals."""

    @property
    def pane_ms(self) -> int | None:
        """The width of the tumbling windows the acker tracks: ``size_ms`` (tumbling),
        ``slide_ms`` (hopping: its panes), None for the other kinds."""
        if self.kind == "tumbling":
            return self.size_ms
        if self.kind == "hopping":
            return self.slide_ms
        return None

    @property
    def panes_per_window(self) -> int:
        """How many panes a window spans: ``size_ms // slide_ms`` (hopping), else 1."""
        if self.kind == "hopping" and self.size_ms and self.slide_ms:
            return self.size_ms // self.slide_ms
        return 1


@dataclass(frozen=True)
class StageConfig:
    """A Python stage reading ``input`` and writing ``output`` (tracked by the acker).

    ``input == output`` is allowed: that is a cycle, which only the acker can track.
    """

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
    name: Name
    input: Text
    output: Text


@dataclass(frozen=True)
class AckerConfig:
    """The acker service: its identity, internal topics and timing knobs."""

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
    name: Name = "acker"
    """Used for the transactional.id, so that a restarted acker fences the old one."""
    acks_topic: Topic = "_substreams.acks"
    acks_partitions: Count = 1
    """Messages about acker substream S go to partition crc32(S) % acks_partitions."""
    shards: Count = 1
    """How many acker processes share the acks partitions (shard i owns the partitions
    p with p % shards == i; ``acker run --shard i``).  At most ``acks_partitions``."""
    control_topic_prefix: Topic = "_substreams.control."
    command_topic: Topic = "_substreams.commands"
    response_topic: Topic = "_substreams.responses"
    dead_letter_topic: Topic = "_substreams.dead_letter"
    flush_ms: Count = 5
    """Ignored since reports travel inside their writer's transaction (kept so that older
    files load)."""
    flush_reports: Count = 1000
    """Ignored, like ``flush_ms``."""
    source_heartbeat_ms: Count = 1000
    """A source that committed nothing for this long says it is alive."""
    source_timeout_ms: Count = 30000
    """A source silent for this long is evicted (fenced; the acker stops waiting for its
    seals; what it committed stays tracked).  Must exceed ``source_heartbeat_ms``."""
    unsealed_timeout_ms: Annotated[int | None, PlainValidator(_timeout_or_null)] = None
    """A live source that has held a substream's oldest open time unsealed for this long is
    evicted like a silent one (None, the default: never; see docs/design.md, "A live source
    that never seals", for what its later records at the times then notified become).  Must
    exceed the longest a healthy source keeps a window open: its size plus lateness (plus
    ``idle_ms`` when idle), or how long it takes between two epoch seals."""
    heartbeat_ms: Count = 500
    standby_timeout_ms: Count = 3000
    """A standby takes over after this long without a heartbeat (> heartbeat_ms)."""
    snapshot_every: Count = 100
    """Write a frontier snapshot every N notifications (bounds recovery replay)."""
    acks_retention_ms: RetentionMs = 7 * DAY_MS
    """The acks topic's retention.ms: how long the acker may be down (it resumes from the
    acks offsets of its last checkpoint, and refuses to start if retention passed them)."""
    response_retention_ms: RetentionMs = DAY_MS
    """The response topic's retention.ms (a client reads only what follows its Hello)."""
    dead_letter_retention_ms: RetentionMs = 30 * DAY_MS
    """The dead-letter topic's retention.ms (-1: forever)."""
    checkpoint_retention_bytes: Annotated[
        int, Strict(), Field(ge=MIN_CHECKPOINT_RETENTION_BYTES)
    ] = 64 * MIB
    """Size retention of each acker's checkpoint topic.  Never a time retention: recovery
    needs the latest checkpoint however long the acker was down."""
    trusted_writers: tuple[Text, ...] = ()
    """More writer names (shell patterns, ``direct.*``) whose control records readers obey,
    besides the ones the config implies: the acker (its name and its shards'), each
    punctuation substream's aligner, operators' chain resumes
    (:mod:`substreams.control.writers`).  Any other writer's record is refused."""

    def control_topic(self, substream: str) -> str:
        """The control topic (punctuations, notifications) of substream ``substream``."""
        return self.control_topic_prefix + substream

    def shard_name(self, shard: int, shards: int | None = None, name: str | None = None) -> str:
        """The name (checkpoint topic, transactional id, chain writer) of shard ``shard`` of
        ``shards``: the acker's name itself when there is one shard, else
        ``<name>.shard<i>of<N>`` (the layout is in the name, so that a shard of a new layout
        never mistakes the checkpoint of a shard of the old one for its own)."""
        base = name or self.name
        n = shards or self.shards
        return base if n == 1 else f"{base}.shard{shard}of{n}"

    def checkpoint_topic(self, acker_name: str | None = None) -> str:
        """The acker's own control topic: its checkpoints and heartbeats (standbys watch it)."""
        return f"{self.control_topic_prefix}__acker.{acker_name or self.name}"

    def aligner_checkpoint_topic(self, substream: str) -> str:
        """The punctuation aligner's checkpoints of ``substream`` (kept like an acker's)."""
        return f"{self.control_topic_prefix}__aligner.{substream}"


@dataclass(frozen=True)
class Config:
    """The whole of ``substreams.yaml``."""

    __pydantic_config__: ClassVar[ConfigDict] = _FILE
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

    def topics(self) -> list[TopicSpec]:
        """Every topic this config needs, for ``topics create`` and ``ensure_topics``.

        Each is a ``(name, partitions)`` tuple (callers that unpack or compare pairs keep
        working) that also carries its kind and topic-level settings (:class:`TopicSpec`)."""
        a = self.acker
        out = [self._spec(s.name, s.partitions, "data", self.retention_of(s)) for s in self.streams]
        out += [self._spec(a.control_topic(s.name), 1, "control") for s in self.substreams]
        out += [
            self._spec(a.checkpoint_topic(a.shard_name(i)), 1, "checkpoint")
            for i in range(a.shards)
        ]
        out += [
            self._spec(a.aligner_checkpoint_topic(s.name), 1, "checkpoint")
            for s in self.substreams
            if s.mechanism == "punctuations"
        ]
        out.append(self._spec(a.acks_topic, a.acks_partitions, "acks", a.acks_retention_ms))
        out += [
            self._spec(a.command_topic, 1, "command"),
            self._spec(a.response_topic, 1, "response", a.response_retention_ms),
            self._spec(a.dead_letter_topic, 1, "dead_letter", a.dead_letter_retention_ms),
        ]
        return out

    def topic_spec(self, topic: str) -> TopicSpec:
        """The spec of one topic of :meth:`topics`, or of the checkpoint topic of an acker of
        any name (``<control prefix>__acker.<name>``) or of an aligner
        (``<control prefix>__aligner.<substream>``); a :class:`ConfigError` if neither."""
        specs = self.topics()
        for spec in specs:
            if spec.name == topic:
                return spec
        prefix = self.acker.control_topic_prefix
        if topic.startswith((f"{prefix}__acker.", f"{prefix}__aligner.")):
            return self._spec(topic, 1, "checkpoint")
        raise self._unknown("topics", "topic", topic, [s.name for s in specs])

    def retention_of(self, stream: StreamConfig) -> int:
        """The data topic's retention.ms: the stream's own, else ``kafka.data_retention_ms``."""
        if stream.retention_ms is not None:
            return stream.retention_ms
        return self.kafka.data_retention_ms

    def _spec(
        self, name: str, partitions: int, kind: TopicKind, retention_ms: int = KEEP
    ) -> TopicSpec:
        if kind == "checkpoint":
            configs = checkpoint_settings(self.acker.checkpoint_retention_bytes)
        else:
            configs = delete_settings(retention_ms)
        k = self.kafka
        return TopicSpec(
            name, partitions, kind, configs, k.replication_factor, k.min_insync_replicas
        )

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


def delete_settings(retention_ms: int) -> dict[str, str]:
    """Topic settings: delete records older than ``retention_ms`` (-1: never), never by size."""
    return {"cleanup.policy": "delete", "retention.ms": str(retention_ms), "retention.bytes": "-1"}


def checkpoint_settings(retention_bytes: int) -> dict[str, str]:
    """Topic settings: never by age, by size only.  Kafka deletes whole old segments, and only
    while the rest still holds ``retention_bytes``, so the newest records always stay."""
    return {
        "cleanup.policy": "delete",
        "retention.ms": str(KEEP),
        "retention.bytes": str(retention_bytes),
        "segment.bytes": str(retention_bytes // 4),
    }


class TopicSpec(tuple[str, int]):
    """A topic to create: ``(name, partitions)``, plus what it holds and how it is kept.

    A 2-tuple on purpose: code that unpacks ``name, partitions`` or compares with
    ``("clicks", 4)`` is unaffected (two specs are equal only if their settings are too).
    ``configs`` are Kafka topic-level settings (default: kept forever, the safe choice for a
    topic of unknown use); ``replication_factor`` / ``min_insync_replicas`` None mean
    automatic (see :class:`KafkaConfig`).
    """

    kind: TopicKind
    configs: Mapping[str, str]
    replication_factor: int | None
    min_insync_replicas: int | None

    def __new__(
        cls,
        name: str,
        partitions: int,
        kind: TopicKind = "other",
        configs: Mapping[str, str] | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
    ) -> TopicSpec:
        self = super().__new__(cls, (name, partitions))
        settings = dict(configs) if configs is not None else delete_settings(KEEP)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "configs", MappingProxyType(settings))
        object.__setattr__(self, "replication_factor", replication_factor)
        object.__setattr__(self, "min_insync_replicas", min_insync_replicas)
        return self

    @property
    def name(self) -> str:
        return self[0]

    @property
    def partitions(self) -> int:
        return self[1]

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"TopicSpec is immutable (cannot set {key!r})")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TopicSpec):
            return tuple.__eq__(self, other) and self._extra() == other._extra()
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return tuple.__hash__(self)

    def __repr__(self) -> str:
        return (
            f"TopicSpec({self.name!r}, {self.partitions}, {self.kind!r}, {dict(self.configs)!r},"
            f" replication_factor={self.replication_factor!r},"
            f" min_insync_replicas={self.min_insync_replicas!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (TopicSpec, (self.name, self.partitions, *self._extra()))

    def _extra(self) -> tuple[Any, ...]:
        return (self.kind, dict(self.configs), self.replication_factor, self.min_insync_replicas)
