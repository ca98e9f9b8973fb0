"""Load and validate ``substreams.yaml`` into :class:`~substreams.config.model.Config`.

Validation walks the YAML *node* tree (``yaml.compose``) instead of the plain
``yaml.safe_load`` result because nodes keep their line numbers: a config mistake
is the most common user error, and ``file:line: key: problem`` turns it into a
five-second fix. The first problem found is raised as a
:class:`~substreams.errors.ConfigError`; nothing here raises anything else.
"""

from __future__ import annotations

import copy
import difflib
import enum
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar, cast

import fastavro
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from substreams.config.model import (
    EMBEDDED,
    KEEP,
    MAX_AUTO_REPLICATION,
    MIN_CHECKPOINT_RETENTION_BYTES,
    MINUTE_MS,
    AckerConfig,
    Bound,
    ClientValue,
    Config,
    KafkaConfig,
    Kind,
    LateRule,
    Mechanism,
    SealPolicy,
    StageConfig,
    StreamConfig,
    SubstreamConfig,
)
from substreams.errors import ConfigError

__all__ = ["NAME_PATTERN", "load_config", "load_config_text"]

NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Names of streams, substreams, stages and the acker: they become Kafka topic names
and transactional ids, so only characters Kafka accepts everywhere are allowed."""
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TOPIC_RE: Final = re.compile(r"[A-Za-z0-9._-]+")
_HOST_PORT_RE: Final = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")
_MAX_TOPIC_LEN: Final = 249  # Kafka's limit

_TOP_KEYS: Final = ("kafka", "streams", "substreams", "stages", "acker")
_KAFKA_KEYS: Final = (
    "bootstrap",
    "replication_factor",
    "min_insync_replicas",
    "data_retention_ms",
    "client",
)
_STREAM_KEYS: Final = ("name", "schema", "partitions", "order_key", "retention_ms")
_SUBSTREAM_KEYS: Final = (
    "name",
    "stream",
    "kind",
    "field",
    "size_ms",
    "key",
    "gap_ms",
    "mechanism",
    "bound",
    "ordered",
    "seal",
)
_SEAL_KEYS: Final = ("lateness_ms", "idle_ms", "late")
_LATE_RULES: Final[tuple[LateRule, ...]] = ("raise", "dead_letter")
_STAGE_KEYS: Final = ("name", "input", "output")
_ACKER_KEYS: Final = (
    "name",
    "acks_topic",
    "acks_partitions",
    "shards",
    "control_topic_prefix",
    "command_topic",
    "response_topic",
    "dead_letter_topic",
    "flush_ms",
    "flush_reports",
    "source_heartbeat_ms",
    "source_timeout_ms",
    "unsealed_timeout_ms",
    "heartbeat_ms",
    "standby_timeout_ms",
    "snapshot_every",
    "acks_retention_ms",
    "response_retention_ms",
    "dead_letter_retention_ms",
    "checkpoint_retention_bytes",
)
_ACKER_TOPIC_KEYS: Final = ("acks_topic", "command_topic", "response_topic", "dead_letter_topic")
_ACKER_INT_KEYS: Final = (
    "acks_partitions",
    "shards",
    "flush_ms",
    "flush_reports",
    "source_heartbeat_ms",
    "source_timeout_ms",
    "heartbeat_ms",
    "standby_timeout_ms",
    "snapshot_every",
)
_ACKER_RETENTION_KEYS: Final = (
    "acks_retention_ms",
    "response_retention_ms",
    "dead_letter_retention_ms",
)

_KINDS: Final[tuple[Kind, ...]] = ("epoch", "tumbling", "session", "per_key")
_MECHANISMS: Final[tuple[Mechanism, ...]] = ("acker", "punctuations")
_BOUNDS: Final[tuple[Bound, ...]] = ("firm", "soft")

# Which kind-specific substream keys each kind requires (R), accepts (O) or rejects
# (absent). Rejecting rather than ignoring catches e.g. a session written with
# ``size_ms`` instead of ``gap_ms``, which would otherwise silently get a default.
_KIND_KEYS: Final[dict[str, dict[str, str]]] = {
    "field": {"epoch": "R", "tumbling": "O", "session": "O"},
    "size_ms": {"tumbling": "R"},
    "key": {"session": "R", "per_key": "R"},
    "gap_ms": {"session": "R"},
}

# Order keys and event-time fields are compared as integers. Logical types are
# refused because fastavro would decode e.g. timestamp-millis to a datetime.
_INT_TYPES: Final = ("int", "long")
# Keys are compared for equality: exact primitive types only (no float/double/null).
_KEY_TYPES: Final = ("string", "bytes", "int", "long", "boolean")

_NULL_TAG: Final = "tag:yaml.org,2002:null"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"

T = TypeVar("T")


class _Required(enum.Enum):
    REQUIRED = enum.auto()


_REQUIRED: Final = _Required.REQUIRED


def load_config(path: str | Path) -> Config:
    """Read and validate the config file at ``path``.

    Schema paths are resolved against the file's directory, so the config works from
    any working directory.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(p), None, "", "file not found") from None
    except IsADirectoryError:
        raise ConfigError(str(p), None, "", "is a directory, not a config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(p), None, "", f"not valid UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(str(p), None, "", f"cannot read: {exc.strerror}") from None
    return load_config_text(text, p)


def load_config_text(text: str, path: Path) -> Config:
    """Validate config ``text`` as if read from ``path`` (used for messages and schemas)."""
    file = str(path)
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:
        raise _syntax_error(file, text, exc) from None
    try:
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise _syntax_error(file, text, exc) from None
        return _build(_Ctx(file, loader, path.absolute().parent), root, path.absolute())
    finally:
        loader.dispose()


def _syntax_error(file: str, text: str, exc: yaml.YAMLError) -> ConfigError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        if exc.context and exc.problem:
            where = ""
            cmark = exc.context_mark
            if cmark is not None and mark is not None and cmark.line != mark.line:
                where = f" at line {cmark.line + 1}"
            problem += f" ({exc.context}{where})"
        return ConfigError(
            file,
            mark.line + 1 if mark else None,
            "",
            f"invalid YAML: {problem}",
            column=mark.column + 1 if mark else None,
        )
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        return ConfigError(file, line, "", f"invalid YAML: {exc.reason} {exc.character!r}")
    return ConfigError(file, None, "", f"invalid YAML: {exc}")


# --------------------------------------------------------------------------- helpers


def _show(value: object) -> str:
    """A value as the user wrote it, YAML-flavoured (``null``, ``true``, ``'text'``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _NULL_TAG


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


class _Ctx:
    """Per-load state: the file name for messages and the YAML constructor for values."""

    def __init__(self, file: str, loader: yaml.SafeLoader, base_dir: Path) -> None:
        self.file = file
        self.loader = loader
        self.base_dir = base_dir

    def error(
        self,
        node: Node | None,
        key: str,
        problem: str,
        *,
        value: object = None,
        allowed: str | None = None,
    ) -> ConfigError:
        line = _line(node) if node is not None else None
        return ConfigError(self.file, line, key, problem, value=value, allowed=allowed)

    def construct(self, node: Node, key: str) -> object:
        """The Python value of ``node`` (SafeLoader rules: ``yes`` is a bool, ``1_000`` an int)."""
        try:
            return cast(object, self.loader.construct_object(node, deep=True))
        except yaml.YAMLError as exc:
            problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else None
            raise self.error(node, key, f"cannot read value: {problem or exc}") from None

    def string(self, node: Node, key: str) -> str:
        value = self.construct(node, key)
        if not isinstance(value, str):
            hint = ""
            if isinstance(node, ScalarNode) and node.style is None and value is not None:
                hint = " (quote it to make it a string)"
            raise self.error(node, key, f"expected a string, got {_show(value)}{hint}", value=value)
        return value

    def integer(self, minimum: int) -> Callable[[Node, str], int]:
        """A converter for integers >= ``minimum``; booleans are not integers here."""

        def convert(node: Node, key: str) -> int:
            value = self.construct(node, key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.error(node, key, f"expected an integer, got {_show(value)}", value=value)
            if value < minimum:
                raise self.error(
                    node, key, f"{value} is out of range; must be >= {minimum}", value=value
                )
            return value

        return convert

    def retention_ms(self, node: Node, key: str) -> int:
        """A topic's retention.ms: -1 (keep forever) or at least a minute."""
        value = self.integer(KEEP)(node, key)
        if value != KEEP and value < MINUTE_MS:
            raise self.error(
                node,
                key,
                f"{value} is out of range; must be {KEEP} (keep forever) or >= {MINUTE_MS}"
                " (one minute, in ms)",
                value=value,
            )
        return value

    def boolean(self, node: Node, key: str) -> bool:
        value = self.construct(node, key)
        if not isinstance(value, bool):
            raise self.error(
                node, key, f"expected a boolean (true/false), got {_show(value)}", value=value
            )
        return value

    def choice(self, choices: Sequence[str]) -> Callable[[Node, str], str]:
        """A converter accepting only one of ``choices``."""
        allowed = ", ".join(choices)

        def convert(node: Node, key: str) -> str:
            value = self.construct(node, key)
            if not isinstance(value, str) or value not in choices:
                raise self.error(
                    node,
                    key,
                    f"{_show(value)} is not allowed; allowed: {allowed}",
                    value=value,
                    allowed=allowed,
                )
            return value

        return convert

    def name(self, node: Node, key: str) -> str:
        value = self.string(node, key)
        if not _NAME_RE.fullmatch(value):
            raise self.error(
                node,
                key,
                f"{value!r} is not a valid name; names must match {NAME_PATTERN}"
                " (they become Kafka topic names)",
                value=value,
            )
        return value

    def topic(self, node: Node, key: str) -> str:
        value = self.string(node, key)
        if not _TOPIC_RE.fullmatch(value):
            raise self.error(
                node,
                key,
                f"{value!r} is not a valid Kafka topic name; use letters, digits, '.', '_', '-'",
                value=value,
            )
        return value

    def sequence(self, node: Node, key: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            value = self.construct(node, key)
            raise self.error(node, key, f"expected a list, got {_show(value)}", value=value)
        return list(node.value)


class _Section:
    """A YAML mapping checked for unknown and duplicate keys (merge keys ``<<`` honoured).

    ``allowed=None`` accepts any string key (pass-through settings like ``kafka.client``).
    """

    def __init__(self, ctx: _Ctx, node: Node, path: str, allowed: Sequence[str] | None) -> None:
        self.ctx = ctx
        self.path = path
        if not isinstance(node, MappingNode):
            value = ctx.construct(node, path)
            raise ctx.error(node, path, f"expected a mapping, got {_show(value)}", value=value)
        self.node: MappingNode = node
        # Duplicates are checked before merging: merged-in keys may legitimately be
        # overridden, but a key written twice by hand is a mistake (YAML keeps the last).
        first: dict[object, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = ctx.construct(key_node, path)
            if isinstance(key, str) and key in first:
                raise ctx.error(
                    key_node,
                    _join(path, key),
                    f"duplicate key {key!r} (first at line {_line(first[key])})",
                    value=key,
                )
            if isinstance(key, str):
                first[key] = key_node
        try:
            ctx.loader.flatten_mapping(node)
        except yaml.YAMLError as exc:
            problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else None
            raise ctx.error(node, path, f"invalid merge key '<<': {problem or exc}") from None
        self.entries: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            key = ctx.construct(key_node, path)
            if not isinstance(key, str) or (allowed is not None and key not in allowed):
                raise self._unknown(key_node, key, allowed)
            self.entries[key] = (key_node, value_node)

    def _unknown(self, node: Node, key: object, allowed: Sequence[str] | None) -> ConfigError:
        if allowed is None:
            return self.ctx.error(
                node, self.path, f"keys must be strings, got {_show(key)}", value=key
            )
        listing = ", ".join(allowed)
        problem = f"unknown key {_show(key)}; allowed: {listing}"
        if isinstance(key, str):
            close = difflib.get_close_matches(key, allowed, n=1)
            if close:
                problem += f"; did you mean {close[0]!r}?"
        return self.ctx.error(node, _join(self.path, str(key)), problem, value=key, allowed=listing)

    def key_path(self, key: str) -> str:
        return _join(self.path, key)

    def value_node(self, key: str) -> Node | None:
        entry = self.entries.get(key)
        return entry[1] if entry is not None else None

    def key_node(self, key: str) -> Node | None:
        entry = self.entries.get(key)
        return entry[0] if entry is not None else None

    def missing(self, key: str, why: str = "") -> ConfigError:
        """Missing keys are reported at the line of the mapping that lacks them."""
        return self.ctx.error(self.node, self.key_path(key), f"missing required key {key!r}{why}")

    def require(self, key: str, why: str = "") -> Node:
        node = self.value_node(key)
        if node is None:
            raise self.missing(key, why)
        return node

    def get(
        self,
        key: str,
        convert: Callable[[Node, str], T],
        default: T | _Required = _REQUIRED,
        why: str = "",
    ) -> T:
        """The converted value of ``key``, ``default`` if absent (error if required)."""
        node = self.value_node(key)
        if node is None:
            if isinstance(default, _Required):
                raise self.missing(key, why)
            return default
        return convert(node, self.key_path(key))

    def section(self, key: str, allowed: Sequence[str] | None) -> _Section | None:
        """A nested mapping, or None when absent or empty (``key:`` alone means defaults)."""
        node = self.value_node(key)
        if node is None or _is_null(node):
            return None
        return _Section(self.ctx, node, self.key_path(key), allowed)


# --------------------------------------------------------------------------- sections


def _build(ctx: _Ctx, root: Node | None, path: Path) -> Config:
    if root is None:
        raise ctx.error(None, "", "the file is empty; expected a mapping with at least 'streams'")
    if not isinstance(root, MappingNode):
        value = ctx.construct(root, "")
        raise ctx.error(
            root,
            "",
            f"the top level must be a mapping (keys: {', '.join(_TOP_KEYS)}), got {_show(value)}",
            value=value,
        )
    top = _Section(ctx, root, "", _TOP_KEYS)
    kafka_section = top.section("kafka", _KAFKA_KEYS)
    kafka = _kafka(ctx, kafka_section)
    streams, topic_origins, retention_nodes = _streams(ctx, top)
    by_name = {s.name: s for s in streams}
    substreams, control_origins = _substreams(ctx, top, by_name)
    stages = _stages(ctx, top, by_name)
    acker_section = top.section("acker", _ACKER_KEYS)
    acker = _acker(ctx, acker_section)
    config = Config(
        path=path,
        kafka=kafka,
        streams=tuple(streams),
        substreams=tuple(substreams),
        stages=tuple(stages),
        acker=acker,
    )
    _check_topics(ctx, config, topic_origins, control_origins, acker_section, top)
    _check_dead_letter_retention(ctx, config, retention_nodes, kafka_section, acker_section, top)
    return config


def _kafka(ctx: _Ctx, sec: _Section | None) -> KafkaConfig:
    if sec is None:
        return KafkaConfig()
    defaults = KafkaConfig()
    bootstrap = sec.get("bootstrap", _bootstrap(ctx), defaults.bootstrap)
    replication = sec.get("replication_factor", ctx.integer(1), defaults.replication_factor)
    min_insync = sec.get("min_insync_replicas", ctx.integer(1), defaults.min_insync_replicas)
    if min_insync is not None:
        limit = MAX_AUTO_REPLICATION if replication is None else replication
        if min_insync > limit:
            what = (
                f"kafka.replication_factor ({replication}): no write could ever be acknowledged"
                if replication is not None
                else "the automatic replication factor can be (min("
                f"{MAX_AUTO_REPLICATION}, brokers in the cluster)); set kafka.replication_factor"
            )
            raise ctx.error(
                sec.value_node("min_insync_replicas"),
                sec.key_path("min_insync_replicas"),
                f"{min_insync} is more than {what}",
                value=min_insync,
                allowed=f"1..{limit}",
            )
    retention = sec.get("data_retention_ms", ctx.retention_ms, defaults.data_retention_ms)
    client: dict[str, ClientValue] = {}
    client_sec = sec.section("client", None)
    if client_sec is not None:
        for key, (_, value_node) in client_sec.entries.items():
            key_path = client_sec.key_path(key)
            value = ctx.construct(value_node, key_path)
            if not isinstance(value, str | int | float | bool):
                raise ctx.error(
                    value_node,
                    key_path,
                    f"expected a string, number or boolean, got {_show(value)}",
                    value=value,
                )
            client[key] = value
    return KafkaConfig(
        bootstrap,
        replication,
        MappingProxyType(client),
        min_insync_replicas=min_insync,
        data_retention_ms=retention,
    )


def _bootstrap(ctx: _Ctx) -> Callable[[Node, str], str]:
    def convert(node: Node, key: str) -> str:
        value = ctx.string(node, key)
        if value == EMBEDDED:
            return value
        for part in value.split(","):
            m = _HOST_PORT_RE.fullmatch(part)
            if m is None or not 1 <= int(m.group(1)) <= 65535:
                raise ctx.error(
                    node,
                    key,
                    f"{value!r} is not a valid bootstrap; expected {EMBEDDED!r} or "
                    "host:port[,host:port...]",
                    value=value,
                    allowed=f"{EMBEDDED}, host:port[,host:port...]",
                )
        return value

    return convert


_Origin = tuple[str, Node | None]  # (dotted key, node) a topic name comes from


def _unique(ctx: _Ctx, sec: _Section, what: str, name: str, seen: dict[str, Node]) -> None:
    node = sec.value_node("name")
    assert node is not None  # name was required just before
    if name in seen:
        raise ctx.error(
            node,
            sec.key_path("name"),
            f"duplicate {what} name {name!r} (first defined at line {_line(seen[name])})",
            value=name,
        )
    seen[name] = node


def _streams(
    ctx: _Ctx, top: _Section
) -> tuple[list[StreamConfig], list[_Origin], dict[str, _Origin]]:
    node = top.require("streams")
    items = ctx.sequence(node, "streams")
    if not items:
        raise ctx.error(node, "streams", "at least one stream is required", value=[])
    streams: list[StreamConfig] = []
    origins: list[_Origin] = []
    retention_origins: dict[str, _Origin] = {}
    seen: dict[str, Node] = {}
    for i, item in enumerate(items):
        sec = _Section(ctx, item, f"streams[{i}]", _STREAM_KEYS)
        name = sec.get("name", ctx.name)
        _unique(ctx, sec, "stream", name, seen)
        origins.append((sec.key_path("name"), sec.value_node("name")))
        schema_node = sec.require("schema")
        schema_key = sec.key_path("schema")
        schema_path, schema = _load_schema(ctx, schema_node, schema_key)
        partitions = sec.get("partitions", ctx.integer(1), 1)
        order_key = sec.get("order_key", ctx.string)
        order_node = sec.value_node("order_key")
        _check_field(
            ctx, order_node, sec.key_path("order_key"), name, schema, order_key, "order key",
            _INT_TYPES,
        )  # fmt: skip
        retention = sec.get("retention_ms", ctx.retention_ms, None)
        if retention is not None:
            retention_origins[name] = (sec.key_path("retention_ms"), sec.value_node("retention_ms"))
        streams.append(StreamConfig(name, schema_path, schema, partitions, order_key, retention))
    return streams, origins, retention_origins


def _load_schema(ctx: _Ctx, node: Node, key: str) -> tuple[Path, dict[str, Any]]:
    """Read an ``.avsc`` file, keeping the JSON (not fastavro's parsed form) for the model."""
    rel = ctx.string(node, key)
    if not rel:
        raise ctx.error(node, key, "the schema path is empty", value=rel)
    path = (ctx.base_dir / rel).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ctx.error(
            node, key, f"schema file {rel!r} not found (looked for {path})", value=rel
        ) from None
    except UnicodeDecodeError as exc:
        raise ctx.error(
            node, key, f"schema file {rel!r} is not valid UTF-8 (byte {exc.start})", value=rel
        ) from None
    except OSError as exc:
        raise ctx.error(
            node, key, f"cannot read schema file {rel!r}: {exc.strerror}", value=rel
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ctx.error(
            node,
            key,
            f"schema file {rel!r} is not valid JSON: {exc.msg} at line {exc.lineno},"
            f" column {exc.colno}",
            value=rel,
        ) from None
    if not isinstance(data, dict) or data.get("type") != "record":
        if isinstance(data, dict):
            what = f"its type is {_show(data.get('type'))}, expected 'record'"
        elif isinstance(data, list):
            what = "it is a union (a JSON list)"
        else:
            what = f"it is {_show(data)}"
        raise ctx.error(
            node, key, f"schema file {rel!r} is not an Avro record schema: {what}", value=rel
        )
    try:
        fastavro.parse_schema(copy.deepcopy(data))
    except Exception as exc:  # fastavro raises many types; any of them means "invalid"
        raise ctx.error(
            node, key, f"schema file {rel!r} is not a valid Avro schema: {exc}", value=rel
        ) from None
    return path, data


def _type_label(avro_type: Any) -> str:
    """A short human description of an Avro field type: ``long``, ``null | string``..."""
    if isinstance(avro_type, str):
        return avro_type
    if isinstance(avro_type, list):
        return " | ".join(_type_label(t) for t in avro_type)
    if isinstance(avro_type, dict):
        label = _type_label(avro_type.get("type"))
        if avro_type.get("logicalType") is not None:
            label += f" ({avro_type['logicalType']})"
        return label
    return repr(avro_type)


def _is_plain(avro_type: Any, allowed: Sequence[str]) -> bool:
    if isinstance(avro_type, str):
        return avro_type in allowed
    if isinstance(avro_type, dict):
        return avro_type.get("type") in allowed and avro_type.get("logicalType") is None
    return False


def _check_field(
    ctx: _Ctx,
    node: Node | None,
    key: str,
    stream: str,
    schema: dict[str, Any],
    field: str,
    role: str,
    allowed: Sequence[str],
) -> None:
    """Check that ``field`` exists in the stream's schema with one of the ``allowed`` types."""
    fields = {str(f["name"]): f["type"] for f in schema["fields"]}
    listing = ", ".join(f"{n} ({_type_label(t)})" for n, t in fields.items())
    if field not in fields:
        raise ctx.error(
            node,
            key,
            f"{field!r} is not a field of stream {stream!r}; its fields are: {listing}",
            value=field,
            allowed=", ".join(fields),
        )
    if not _is_plain(fields[field], allowed):
        fitting = [n for n, t in fields.items() if _is_plain(t, allowed)]
        types = " or ".join(allowed) if len(allowed) <= 2 else ", ".join(allowed)
        problem = (
            f"field {field!r} of stream {stream!r} has type {_type_label(fields[field])};"
            f" the {role} must be a plain {types}"
        )
        if isinstance(fields[field], dict) and fields[field].get("logicalType") is not None:
            problem += " (no logicalType: fastavro would decode it to another Python type)"
        problem += "; " + (
            f"fields of that type: {', '.join(fitting)}" if fitting else "no field has that type"
        )
        raise ctx.error(node, key, problem, value=field, allowed=", ".join(fitting) or None)


def _substreams(
    ctx: _Ctx, top: _Section, streams: dict[str, StreamConfig]
) -> tuple[list[SubstreamConfig], list[tuple[str, str, Node | None]]]:
    node = top.value_node("substreams")
    if node is None or _is_null(node):
        return [], []
    out: list[SubstreamConfig] = []
    origins: list[tuple[str, str, Node | None]] = []
    seen: dict[str, Node] = {}
    for i, item in enumerate(ctx.sequence(node, "substreams")):
        sec = _Section(ctx, item, f"substreams[{i}]", _SUBSTREAM_KEYS)
        name = sec.get("name", ctx.name)
        _unique(ctx, sec, "substream", name, seen)
        origins.append((name, sec.key_path("name"), sec.value_node("name")))
        stream_name = sec.get("stream", _reference(ctx, streams))
        stream = streams[stream_name]
        kind = cast(Kind, sec.get("kind", ctx.choice(_KINDS)))
        for specific, rules in _KIND_KEYS.items():
            if kind not in rules and specific in sec.entries:
                kinds = ", ".join(k for k in _KINDS if k in rules)
                raise ctx.error(
                    sec.key_node(specific),
                    sec.key_path(specific),
                    f"{specific!r} is not allowed for kind {kind!r}; only for: {kinds}",
                    value=_value_or_none(ctx, sec, specific),
                )
        why = f" (required for kind {kind!r})"
        field: str | None = None
        if kind in _KIND_KEYS["field"]:
            default: str | _Required = _REQUIRED if kind == "epoch" else stream.order_key
            field = sec.get("field", ctx.string, default, why)
            role = "epoch field" if kind == "epoch" else "event-time field"
            _check_field(
                ctx, sec.value_node("field"), sec.key_path("field"), stream.name, stream.schema,
                field, role, _INT_TYPES,
            )  # fmt: skip
        size_ms = sec.get("size_ms", ctx.integer(1), why=why) if kind == "tumbling" else None
        gap_ms = sec.get("gap_ms", ctx.integer(1), why=why) if kind == "session" else None
        key: str | None = None
        if kind in _KIND_KEYS["key"]:
            key = sec.get("key", ctx.string, why=why)
            _check_field(
                ctx, sec.value_node("key"), sec.key_path("key"), stream.name, stream.schema,
                key, "key", _KEY_TYPES,
            )  # fmt: skip
        mechanism = cast(Mechanism, sec.get("mechanism", ctx.choice(_MECHANISMS), "acker"))
        if kind == "session" and mechanism != "acker":
            # Sessions are cut from every source's keyed event times where all reports meet
            # (docs/design.md, "Keyed substreams with many sources"); punctuations have no
            # such place.
            raise ctx.error(
                sec.value_node("mechanism"),
                sec.key_path("mechanism"),
                "a session substream is tracked by the acker (sessions are cut from every "
                "source's records where their reports meet); use mechanism: acker",
                value=mechanism,
            )
        bound = cast(Bound, sec.get("bound", ctx.choice(_BOUNDS), "firm"))
        ordered = sec.get("ordered", ctx.boolean, True)
        seal = _seal_policy(ctx, sec, kind)
        out.append(
            SubstreamConfig(
                name=name,
                stream=stream_name,
                kind=kind,
                field=field,
                size_ms=size_ms,
                key=key,
                gap_ms=gap_ms,
                mechanism=mechanism,
                bound=bound,
                ordered=ordered,
                seal=seal,
            )
        )
    return out, origins


def _seal_policy(ctx: _Ctx, sec: _Section, kind: Kind) -> SealPolicy | None:
    """``seal: manual`` (or absent) -> None; ``seal: {lateness_ms, idle_ms, late}`` -> a
    policy, refused where the kind has no event time to apply it to."""
    node = sec.value_node("seal")
    if node is None or _is_null(node):
        return None
    path = sec.key_path("seal")
    if not isinstance(node, MappingNode):
        value = ctx.construct(node, path)
        if value == "manual":
            return None
        raise ctx.error(
            node, path,
            f"{_show(value)} is not allowed; allowed: manual, or a mapping with "
            f"{', '.join(_SEAL_KEYS)}",
            value=value, allowed="manual, {lateness_ms, idle_ms, late}",
        )
    if kind == "per_key":
        raise ctx.error(
            node, path,
            "a seal policy needs an event time, and per_key times have none; seal a per_key "
            "substream from code (seal, seal_keys) or leave seal: manual",
        )
    policy = _Section(ctx, node, path, _SEAL_KEYS)
    lateness = policy.get("lateness_ms", ctx.integer(0), 0)
    idle = policy.get("idle_ms", ctx.integer(1), None)
    if idle is not None and kind == "epoch":
        raise ctx.error(
            policy.key_node("idle_ms"), policy.key_path("idle_ms"),
            "idle_ms seals up to the publisher's clock, and epoch numbers are not clock "
            "times; only for kinds tumbling and session",
            value=idle,
        )
    late = cast(LateRule, policy.get("late", ctx.choice(_LATE_RULES), "raise"))
    return SealPolicy(lateness_ms=lateness, idle_ms=idle, late=late)


def _value_or_none(ctx: _Ctx, sec: _Section, key: str) -> object:
    node = sec.value_node(key)
    return ctx.construct(node, sec.key_path(key)) if node is not None else None


def _reference(ctx: _Ctx, streams: dict[str, StreamConfig]) -> Callable[[Node, str], str]:
    """A converter for a key that must name a stream defined in ``streams:``."""

    def convert(node: Node, key: str) -> str:
        value = ctx.string(node, key)
        if value not in streams:
            listing = ", ".join(streams)
            raise ctx.error(
                node,
                key,
                f"no stream named {value!r}; streams: {listing}",
                value=value,
                allowed=listing,
            )
        return value

    return convert


def _stages(ctx: _Ctx, top: _Section, streams: dict[str, StreamConfig]) -> list[StageConfig]:
    node = top.value_node("stages")
    if node is None or _is_null(node):
        return []
    out: list[StageConfig] = []
    seen: dict[str, Node] = {}
    for i, item in enumerate(ctx.sequence(node, "stages")):
        sec = _Section(ctx, item, f"stages[{i}]", _STAGE_KEYS)
        name = sec.get("name", ctx.name)
        _unique(ctx, sec, "stage", name, seen)
        out.append(
            StageConfig(
                name=name,
                input=sec.get("input", _reference(ctx, streams)),
                output=sec.get("output", _reference(ctx, streams)),
            )
        )
    return out


def _acker(ctx: _Ctx, sec: _Section | None) -> AckerConfig:
    defaults = AckerConfig()
    if sec is None:
        return defaults
    values: dict[str, Any] = {"name": sec.get("name", ctx.name, defaults.name)}
    for key in (*_ACKER_TOPIC_KEYS, "control_topic_prefix"):
        values[key] = sec.get(key, ctx.topic, getattr(defaults, key))
    for key in _ACKER_INT_KEYS:
        values[key] = sec.get(key, ctx.integer(1), getattr(defaults, key))
    for key in _ACKER_RETENTION_KEYS:
        values[key] = sec.get(key, ctx.retention_ms, getattr(defaults, key))
    node = sec.value_node("unsealed_timeout_ms")
    if node is not None and not _is_null(node):  # null, the default: off
        key = sec.key_path("unsealed_timeout_ms")
        value = ctx.construct(node, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ctx.error(
                node, key, f"expected a timeout in ms or null, got {_show(value)}",
                value=value, allowed="null (off, the default) or an integer >= 1",
            )
        values["unsealed_timeout_ms"] = value
    values["checkpoint_retention_bytes"] = sec.get(
        "checkpoint_retention_bytes",
        ctx.integer(MIN_CHECKPOINT_RETENTION_BYTES),
        defaults.checkpoint_retention_bytes,
    )
    acker = AckerConfig(**values)
    if acker.shards > acker.acks_partitions:
        # A shard owns the acks partitions p with p % shards == shard: more shards than
        # partitions would leave a shard with nothing to do.
        key = "shards" if "shards" in sec.entries else "acks_partitions"
        raise ctx.error(
            sec.value_node(key),
            sec.key_path(key),
            f"shards ({acker.shards}) must not exceed acks_partitions "
            f"({acker.acks_partitions}): each shard owns whole acks partitions",
            value=getattr(acker, key),
        )
    for timeout, beat, why in (
        ("standby_timeout_ms", "heartbeat_ms", "standbys would take over from a live acker"),
        ("source_timeout_ms", "source_heartbeat_ms", "live sources would be evicted"),
    ):
        if getattr(acker, timeout) <= getattr(acker, beat):
            # Blame the key the user wrote; if both are written, the timeout.
            key = timeout if timeout in sec.entries else beat
            raise ctx.error(
                sec.value_node(key),
                sec.key_path(key),
                f"{timeout} ({getattr(acker, timeout)}) must be greater than"
                f" {beat} ({getattr(acker, beat)}), or {why}",
                value=getattr(acker, key),
            )
    return acker


def _check_topics(
    ctx: _Ctx,
    config: Config,
    stream_origins: list[_Origin],
    control_origins: list[tuple[str, str, Node | None]],
    acker_sec: _Section | None,
    top: _Section,
) -> None:
    """Every topic must be distinct and short enough for Kafka, or two roles share data."""
    origins: list[tuple[str, str, Node | None]] = [
        (s.name, key, node) for s, (key, node) in zip(config.streams, stream_origins, strict=True)
    ]
    for name, key, node in control_origins:
        origins.append((config.acker.control_topic(name), key, node))
    for attr in _ACKER_TOPIC_KEYS:
        node = acker_sec.value_node(attr) if acker_sec is not None else None
        origins.append((getattr(config.acker, attr), f"acker.{attr}", node))
    seen: dict[str, tuple[str, Node | None]] = {}
    for topic, key, node in origins:
        if len(topic) > _MAX_TOPIC_LEN:
            raise ctx.error(
                node,
                key,
                f"topic {topic!r} is {len(topic)} characters long; Kafka allows at most"
                f" {_MAX_TOPIC_LEN}",
                value=topic,
            )
        if topic in seen:
            other_key, other_node = seen[topic]
            if node is None:  # a default collides with a value the user wrote
                key, node, other_key = other_key, other_node, key
            raise ctx.error(
                node if node is not None else top.node,
                key,
                f"topic {topic!r} is also used by {other_key}; every stream, control and"
                " acker topic must be distinct",
                value=topic,
            )
        seen[topic] = (key, node)


def _check_dead_letter_retention(
    ctx: _Ctx,
    config: Config,
    stream_retention: dict[str, _Origin],
    kafka_sec: _Section | None,
    acker_sec: _Section | None,
    top: _Section,
) -> None:
    """The punctuation service re-reads its data topics from their start on every start-up and
    reads the dead-letter topic back so as not to report a late record twice: its dead
    letters must outlive the data they point at."""
    punctuated = {s.stream for s in config.substreams if s.mechanism == "punctuations"}
    dlq = config.acker.dead_letter_retention_ms
    for stream in config.streams:
        data = config.retention_of(stream)
        if stream.name not in punctuated or _outlives(dlq, data):
            continue
        dlq_node = acker_sec.value_node("dead_letter_retention_ms") if acker_sec else None
        key: str
        node: Node | None
        if dlq_node is not None:
            key, node = "acker.dead_letter_retention_ms", dlq_node
        elif stream.name in stream_retention:
            key, node = stream_retention[stream.name]
        else:
            node = kafka_sec.value_node("data_retention_ms") if kafka_sec else None
            key = "kafka.data_retention_ms"
        shown = "-1 (forever)" if data == KEEP else str(data)
        raise ctx.error(
            node if node is not None else top.node,
            key,
            f"acker.dead_letter_retention_ms ({dlq}) is shorter than the retention of stream"
            f" {stream.name!r} ({shown}), which has a punctuation substream: after a restart"
            " the punctuation service would report its late records to the dead-letter"
            " topic a second time; make the dead-letter retention at least as long",
            value=config.acker.dead_letter_retention_ms if dlq_node is not None else data,
        )


def _outlives(retention: int, other: int) -> bool:
    """Does a retention of ``retention`` keep records at least as long as ``other``?"""
    if retention == KEEP:
        return True
    return other != KEEP and retention >= other
