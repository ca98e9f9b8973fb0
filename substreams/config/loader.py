"""Load and validate ``substreams.yaml`` into :class:`~substreams.config.model.Config`.

Pydantic checks each key's type and range against the model's annotations; this module
keeps what it cannot know: the YAML *node* of every key (``yaml.compose`` keeps line numbers,
so an error reads ``file:line: key: problem``), duplicate keys, the ``.avsc`` files and the
rules that span keys.  The first problem in the file is raised as a
:class:`~substreams.errors.ConfigError`; nothing here raises anything else.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Union, get_args, get_origin, get_type_hints

import fastavro
import pydantic
import yaml
from pydantic_core import ErrorDetails
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from substreams.config.model import (
    KEEP,
    MAX_AUTO_REPLICATION,
    NAME_PATTERN,
    Config,
    StreamConfig,
    SubstreamConfig,
    show,
)
from substreams.errors import ConfigError

__all__ = ["NAME_PATTERN", "load_config", "load_config_text"]

_MAX_TOPIC_LEN: Final = 249  # Kafka's limit
_NOT_IN_FILE: Final = ("path", "schema_path")  # fields the loader fills in, not keys
_ACKER_TOPIC_KEYS: Final = ("acks_topic", "command_topic", "response_topic", "dead_letter_topic")
_SEAL_KEYS: Final = "lateness_ms, idle_ms, late"

# Which kind-specific substream keys each kind requires (R), accepts (O) or rejects
# (absent). Rejecting rather than ignoring catches e.g. a session written with
# ``size_ms`` instead of ``gap_ms``, which would otherwise silently get a default.
_KIND_KEYS: Final[dict[str, dict[str, str]]] = {
    "field": {"epoch": "R", "tumbling": "O", "hopping": "O", "session": "O"},
    "size_ms": {"tumbling": "R", "hopping": "R"},
    "slide_ms": {"hopping": "R"},
    "key": {"session": "R", "per_key": "R"},
    "gap_ms": {"session": "R"},
}
_KINDS: Final = ("epoch", "tumbling", "hopping", "session", "per_key")

# Order keys and event-time fields are compared as integers. Logical types are
# refused because fastavro would decode e.g. timestamp-millis to a datetime.
_INT_TYPES: Final = ("int", "long")
# Keys are compared for equality: exact primitive types only (no float/double/null).
_KEY_TYPES: Final = ("string", "bytes", "int", "long", "boolean")

_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_ADAPTER: Final = pydantic.TypeAdapter(Config)

Loc = tuple[str | int, ...]
"""Where a value is: keys and list indexes from the top (pydantic's ``loc``)."""

# pydantic's error types, worded as the loader always did ({got}: the value as written).
_PROBLEMS: Final = {
    "int_type": "expected an integer, got {got}",
    "string_type": "expected a string, got {got}",
    "bool_type": "expected a boolean (true/false), got {got}",
    "list_type": "expected a list, got {got}",
    "tuple_type": "expected a list, got {got}",
    "dict_type": "expected a mapping, got {got}",
    "dataclass_type": "expected a mapping, got {got}",
    "dataclass_args_type": "expected a mapping, got {got}",
    "greater_than_equal": "{input} is out of range; must be >= {ge}",
    "less_than_equal": "{input} is out of range; must be <= {le}",
    "literal_error": "{got} is not allowed; allowed: {allowed}",
}


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
        if root is None:
            raise ConfigError(
                file, None, "", "the file is empty; expected a mapping with at least 'streams'"
            )
        ctx = _Ctx(file, root, path.absolute().parent)
        ctx.read(loader, root, ())
        try:
            data = loader.construct_document(root)
        except yaml.MarkedYAMLError as exc:
            line = exc.problem_mark.line + 1 if exc.problem_mark else None
            raise ConfigError(file, line, "", f"cannot read value: {exc.problem}") from None
    finally:
        loader.dispose()
    return _build(ctx, data, path.absolute())


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


def _dotted(loc: Loc) -> str:
    """``("substreams", 0, "kind")`` -> ``substreams[0].kind``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


@functools.cache
def _type_at(loc: tuple[str, ...]) -> Any:
    """The model type of the value at ``loc`` (list indexes left out), None if not a model's."""
    t: Any = Config
    for part in loc:
        if not dataclasses.is_dataclass(t):
            return None
        t = get_type_hints(t, include_extras=True)[part]
        while get_origin(t) in (Annotated, Union, types.UnionType, tuple):
            t = next(a for a in get_args(t) if a is not type(None))
    return t


def _keys(loc: Loc) -> tuple[str, ...]:
    return tuple(p for p in loc if isinstance(p, str))


def _allowed(loc: Loc) -> list[str]:
    """The keys the mapping at ``loc`` accepts, or the values a choice at ``loc`` accepts."""
    t = _type_at(_keys(loc))
    if dataclasses.is_dataclass(t):
        return [f.name for f in dataclasses.fields(t) if f.name not in _NOT_IN_FILE]
    return [str(a) for a in get_args(t)]


class _Ctx:
    """Per-load state: the file name and every key's YAML nodes, for messages."""

    def __init__(self, file: str, root: Node, base_dir: Path) -> None:
        self.file = file
        self.base_dir = base_dir
        self.nodes: dict[Loc, tuple[Node | None, Node]] = {(): (None, root)}
        """(key node, value node) of each value, by where it is."""
        self.merged: set[int] = set()  # mappings already flattened (an alias reaches twice)

    def read(self, loader: yaml.SafeLoader, node: Node, loc: Loc) -> None:
        """Record the nodes under ``node``; refuse duplicate keys; apply merge keys ``<<``."""
        if isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                self.nodes[(*loc, i)] = (None, item)
                self.read(loader, item, (*loc, i))
        if not isinstance(node, MappingNode):
            return
        if id(node) not in self.merged:
            self._merge(loader, node, loc)
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            self.nodes[(*loc, str(key))] = (key_node, value_node)
            if not isinstance(key, str) and dataclasses.is_dataclass(_type_at(_keys(loc))):
                raise self.unknown((*loc, str(key)), key)
            if not isinstance(key, str):  # under kafka.client, any string is a key
                line = key_node.start_mark.line + 1
                problem = f"keys must be strings, got {show(key)}"
                raise ConfigError(self.file, line, _dotted(loc), problem, value=key)
            self.read(loader, value_node, (*loc, key))

    def _merge(self, loader: yaml.SafeLoader, node: MappingNode, loc: Loc) -> None:
        # Duplicates are checked before merging: merged-in keys may legitimately be
        # overridden, but a key written twice by hand is a mistake (YAML keeps the last).
        first: dict[object, Node] = {}
        for key_node, value_node in node.value:
            key = None if key_node.tag == _MERGE_TAG else loader.construct_object(key_node)
            if isinstance(key, str) and key in first:
                self.nodes[(*loc, key)] = (key_node, value_node)
                raise self.error(
                    (*loc, key),
                    f"duplicate key {key!r} (first at line {first[key].start_mark.line + 1})",
                    value=key,
                    at_key=True,
                )
            first[key] = key_node
        try:
            loader.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            raise self.error(loc, f"invalid merge key '<<': {exc.problem}") from None
        self.merged.add(id(node))

    def node(self, loc: Loc, at_key: bool = False) -> Node:
        """The node at ``loc`` (its key's with ``at_key``), else the nearest mapping above."""
        while loc not in self.nodes:
            loc = loc[:-1]
        key_node, value_node = self.nodes[loc]
        return key_node if at_key and key_node is not None else value_node

    def written(self, *loc: str | int) -> bool:
        return loc in self.nodes

    def error(
        self,
        loc: Loc,
        problem: str,
        *,
        value: object = None,
        allowed: str | None = None,
        at_key: bool = False,
    ) -> ConfigError:
        line = self.node(loc, at_key).start_mark.line + 1
        return ConfigError(self.file, line, _dotted(loc), problem, value=value, allowed=allowed)

    def missing(self, loc: Loc, why: str = "") -> ConfigError:
        """Missing keys are reported at the line of the mapping that lacks them."""
        return self.error(loc, f"missing required key {loc[-1]!r}{why}")

    def unknown(self, loc: Loc, key: object = None) -> ConfigError:
        """An unknown key (``key``: as written, when not the string ending ``loc``)."""
        allowed = _allowed(loc[:-1])
        key = loc[-1] if key is None else key
        problem = f"unknown key {show(key)}; allowed: {', '.join(allowed)}"
        close = difflib.get_close_matches(str(key), allowed, n=1)
        if close:
            problem += f"; did you mean {close[0]!r}?"
        return self.error(loc, problem, value=key, allowed=", ".join(allowed), at_key=True)

    def translate(self, error: ErrorDetails) -> ConfigError:
        """A pydantic error as the loader words it, at its key's line."""
        loc, kind, value = tuple(error["loc"]), error["type"], error["input"]
        if kind == "missing":
            return self.missing(loc)
        if kind == "unexpected_keyword_argument":
            return self.unknown(loc)
        info = dict(error.get("ctx") or {})
        if kind == "config":  # our own validators' (model.py)
            return self.error(loc, info["problem"], value=value, allowed=info["allowed"])
        got = show(value)
        node = self.node(loc)
        if kind == "string_type" and value is not None and isinstance(node, ScalarNode):
            got += " (quote it to make it a string)" if node.style is None else ""
        allowed = ", ".join(_allowed(loc)) if kind == "literal_error" else None
        template = _PROBLEMS.get(kind)
        problem = (
            template.format(got=got, allowed=allowed, input=value, **info)
            if template
            else error["msg"]
        )
        return self.error(loc, problem, value=value, allowed=allowed)


def _build(ctx: _Ctx, data: object, path: Path) -> Config:
    if not isinstance(data, dict):
        raise ctx.error(
            (),
            f"the top level must be a mapping (keys: {', '.join(_allowed(()))}), got {show(data)}",
            value=data,
        )
    # From the file's shape to the model's: what the model holds but the file does not say.
    if "path" in data:
        raise ctx.unknown(("path",))
    for key in ("kafka", "substreams", "stages", "acker"):
        if key in data and data[key] is None:  # ``acker:`` alone: the defaults
            del data[key]
    data.setdefault("kafka", {})
    for i, raw in _mappings(data, "streams"):
        if "schema_path" in raw:
            raise ctx.unknown(("streams", i, "schema_path"))
        raw.setdefault("partitions", 1)
        _read_schema(ctx, ("streams", i), raw)
    for i, sub in _mappings(data, "substreams"):
        if not isinstance(sub.get("seal"), dict | None):
            _seal_manual(ctx, ("substreams", i, "seal"), sub)
    try:
        config = _ADAPTER.validate_python({**data, "path": path})
    except pydantic.ValidationError as exc:
        errors = [e for e in exc.errors() if e["loc"][-1] not in _NOT_IN_FILE]
        first = min(errors, key=lambda e: _position(ctx, e))
        raise ctx.translate(first) from None
    if not config.streams:
        raise ctx.error(("streams",), "at least one stream is required", value=[])
    _check_kafka(ctx, config)
    config = _security(ctx, config)
    _unique(ctx, "stream", config.streams)
    for i, stream in enumerate(config.streams):
        if stream.order_key is not None:
            loc = ("streams", i, "order_key")
            _check_field(ctx, loc, stream, stream.order_key, "order key", _INT_TYPES)
        if stream.source is not None:
            _check_source(ctx, ("streams", i, "source"), stream)
    _unique(ctx, "substream", config.substreams)
    subs = tuple(_substream(ctx, config, i, sub) for i, sub in enumerate(config.substreams))
    config = dataclasses.replace(config, substreams=subs)
    _unique(ctx, "stage", config.stages)
    for i, stage in enumerate(config.stages):
        _reference(ctx, config, ("stages", i, "input"), stage.input)
        _reference(ctx, config, ("stages", i, "output"), stage.output)
    _check_acker(ctx, config)
    _check_topics(ctx, config)
    _check_dead_letter_retention(ctx, config)
    return config


def _position(ctx: _Ctx, error: ErrorDetails) -> int:
    """Where in the file an error is: a missing key at the end of its mapping (as if the
    reader looked for it there), so that a misspelt key is reported before its absence."""
    node = ctx.node(tuple(error["loc"]))
    return int(node.end_mark.index if error["type"] == "missing" else node.start_mark.index)


def _mappings(data: dict[str, Any], key: str) -> list[tuple[int, dict[str, Any]]]:
    """The mappings in the list at ``data[key]``, with their indexes (pydantic judges the rest)."""
    items = data.get(key)
    return (
        [(i, x) for i, x in enumerate(items) if isinstance(x, dict)]
        if isinstance(items, list)
        else []
    )


def _read_schema(ctx: _Ctx, loc: Loc, stream: dict[str, Any]) -> None:
    """Replace a stream's ``schema`` (a path) with its file's path and JSON, read here."""
    if "schema" not in stream:
        return
    rel = stream["schema"]
    key = (*loc, "schema")
    if not isinstance(rel, str):
        raise ctx.translate({"loc": key, "type": "string_type", "input": rel, "msg": ""})
    stream["schema_path"], stream["schema"] = _load_schema(ctx, key, rel)


def _seal_manual(ctx: _Ctx, loc: Loc, sub: dict[str, Any]) -> None:
    """``seal: manual`` is no policy (the publisher's code seals), like no ``seal`` at all."""
    if sub["seal"] != "manual":
        raise ctx.error(
            loc,
            f"{show(sub['seal'])} is not allowed; allowed: manual, or a mapping with {_SEAL_KEYS}",
            value=sub["seal"],
            allowed="manual, {" + _SEAL_KEYS + "}",
        )
    sub["seal"] = None


def _check_kafka(ctx: _Ctx, config: Config) -> None:
    replication, min_insync = config.kafka.replication_factor, config.kafka.min_insync_replicas
    limit = MAX_AUTO_REPLICATION if replication is None else replication
    if min_insync is not None and min_insync > limit:
        what = (
            f"kafka.replication_factor ({replication}): no write could ever be acknowledged"
            if replication is not None
            else "the automatic replication factor can be (min("
            f"{MAX_AUTO_REPLICATION}, brokers in the cluster)); set kafka.replication_factor"
        )
        raise ctx.error(
            ("kafka", "min_insync_replicas"),
            f"{min_insync} is more than {what}",
            value=min_insync,
            allowed=f"1..{limit}",
        )


def _security(ctx: _Ctx, config: Config) -> Config:
    """``kafka.security``'s rules across keys; its files resolved against the config's
    folder.  Only where the password is, never the password, is checked here: a config is
    loaded on hosts (a CI job, ``config check``) that hold no secret."""
    sec = config.kafka.security
    if sec is None:
        return config
    loc: Loc = ("kafka", "security")
    sources = [k for k in ("password_env", "password_file") if getattr(sec, k) is not None]
    if sec.sasl:
        if sec.username is None:
            raise ctx.missing((*loc, "username"), f" (protocol {sec.protocol} logs in)")
        if len(sources) != 1:
            raise ctx.error(
                (*loc, *sources[1:2]),
                f"protocol {sec.protocol} needs exactly one of password_env, password_file "
                f"(got {', '.join(sources) or 'neither'})",
                allowed="password_env, password_file",
            )
    else:
        for key in ("username", *sources):
            if getattr(sec, key) is not None:
                raise ctx.error(
                    (*loc, key),
                    f"protocol {sec.protocol} does not log in; {key} is only for SASL_SSL or "
                    "SASL_PLAINTEXT",
                    allowed="SASL_SSL, SASL_PLAINTEXT",
                )
    if sec.ca_file is not None and not sec.tls:
        raise ctx.error(
            (*loc, "ca_file"),
            f"protocol {sec.protocol} does not use TLS; ca_file is only for SSL or SASL_SSL",
            allowed="SSL, SASL_SSL",
        )
    if "security.protocol" in config.kafka.client:
        raise ctx.error(
            ("kafka", "client", "security.protocol"),
            "set either kafka.security or the librdkafka security keys under kafka.client, "
            "not both",
        )
    def resolved(value: str | None) -> str | None:
        return None if value is None else str(ctx.base_dir / value)

    security = dataclasses.replace(
        sec, password_file=resolved(sec.password_file), ca_file=resolved(sec.ca_file)
    )
    if security.ca_file is not None and not Path(security.ca_file).is_file():
        raise ctx.error((*loc, "ca_file"), f"no such file: {security.ca_file}",
                        value=sec.ca_file)
    return dataclasses.replace(config, kafka=dataclasses.replace(config.kafka, security=security))


def _unique(ctx: _Ctx, what: str, items: Sequence[Any]) -> None:
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        if item.name in seen:
            first = ctx.node((f"{what}s", seen[item.name], "name")).start_mark.line + 1
            raise ctx.error(
                (f"{what}s", i, "name"),
                f"duplicate {what} name {item.name!r} (first defined at line {first})",
                value=item.name,
            )
        seen[item.name] = i


def _reference(ctx: _Ctx, config: Config, loc: Loc, name: str) -> StreamConfig:
    """The stream a key names; an error listing the streams if there is none."""
    for stream in config.streams:
        if stream.name == name:
            return stream
    listing = ", ".join(s.name for s in config.streams)
    raise ctx.error(
        loc, f"no stream named {name!r}; streams: {listing}", value=name, allowed=listing
    )


def _substream(ctx: _Ctx, config: Config, i: int, sub: SubstreamConfig) -> SubstreamConfig:
    """Check the rules between a substream's keys; fill in the event-time field."""
    loc = ("substreams", i)
    stream = _reference(ctx, config, (*loc, "stream"), sub.stream)
    for specific, rules in _KIND_KEYS.items():
        if sub.kind not in rules and ctx.written(*loc, specific):
            kinds = ", ".join(k for k in _KINDS if k in rules)
            raise ctx.error(
                (*loc, specific),
                f"{specific!r} is not allowed for kind {sub.kind!r}; only for: {kinds}",
                value=getattr(sub, specific),
                at_key=True,
            )
        if rules.get(sub.kind) == "R" and getattr(sub, specific) is None:
            raise ctx.missing((*loc, specific), f" (required for kind {sub.kind!r})")
    if sub.kind == "hopping":
        _check_hopping(ctx, loc, sub)
    if sub.kind in ("tumbling", "hopping", "session") and sub.field is None:
        if stream.order_key is None:
            raise ctx.missing(
                (*loc, "field"),
                f" (stream {stream.name!r} has no order_key to default to: name the "
                "event-time field)",
            )
        sub = dataclasses.replace(sub, field=stream.order_key)
    if sub.field is not None:
        role = "epoch field" if sub.kind == "epoch" else "event-time field"
        _check_field(ctx, (*loc, "field"), stream, sub.field, role, _INT_TYPES)
    if sub.key is not None:
        _check_field(ctx, (*loc, "key"), stream, sub.key, "key", _KEY_TYPES)
    if sub.kind == "session" and sub.mechanism != "acker":
        # Sessions are cut from every source's keyed event times where all reports meet
        # (docs/design.md, "Keyed substreams with many sources"); punctuations have no
        # such place.
        raise ctx.error(
            (*loc, "mechanism"),
            "a session substream is tracked by the acker (sessions are cut from every "
            "source's records where their reports meet); use mechanism: acker",
            value=sub.mechanism,
        )
    if sub.seal is not None and sub.kind == "per_key":
        raise ctx.error(
            (*loc, "seal"),
            "a seal policy needs an event time, and per_key times have none; seal a per_key "
            "substream from code (seal, seal_keys) or leave seal: manual",
        )
    if sub.seal is not None and sub.seal.idle_ms is not None and sub.kind == "epoch":
        raise ctx.error(
            (*loc, "seal", "idle_ms"),
            "idle_ms seals up to the publisher's clock, and epoch numbers are not clock "
            "times; only for kinds tumbling, hopping and session",
            value=sub.seal.idle_ms,
            at_key=True,
        )
    return sub


def _check_source(ctx: _Ctx, loc: Loc, stream: StreamConfig) -> None:
    """The rules between a foreign source's keys: a registry for the Confluent wire format
    (and only for it)."""
    source = stream.source
    assert source is not None
    if source.format == "confluent-avro" and source.registry_url is None:
        raise ctx.missing(
            (*loc, "registry_url"),
            " (format 'confluent-avro' resolves each record's schema id from a Schema "
            "Registry, e.g. http://127.0.0.1:8081)",
        )
    if source.format != "confluent-avro" and source.registry_url is not None:
        raise ctx.error(
            (*loc, "registry_url"),
            f"'registry_url' is only for format 'confluent-avro', not {source.format!r}",
            value=source.registry_url,
            at_key=True,
        )
    if stream.order_key is not None:
        raise ctx.error(
            ("streams", loc[1], "order_key"),
            "a stream over an existing topic has the order key the framework keeps (the "
            "ingest time): its records' event times may come in any order; remove order_key",
            value=stream.order_key,
            at_key=True,
        )
    if source.topic == stream.name:
        raise ctx.error(
            (*loc, "topic"),
            f"the source topic {source.topic!r} is the stream's own topic: a stream over an "
            "existing topic is a new topic that substreams writes; give the stream another "
            "name",
            value=source.topic,
        )


def _check_hopping(ctx: _Ctx, loc: Loc, sub: SubstreamConfig) -> None:
    """A hopping window is a run of whole panes (slide-sized tumbling windows): its size
    must be a multiple of its slide (one pane: a tumbling window)."""
    assert sub.size_ms is not None and sub.slide_ms is not None
    if sub.size_ms % sub.slide_ms:
        raise ctx.error(
            (*loc, "size_ms"),
            f"size_ms {sub.size_ms} is not a multiple of slide_ms {sub.slide_ms}; a hopping "
            "window is a run of whole slide_ms panes",
            value=sub.size_ms,
        )


def _check_acker(ctx: _Ctx, config: Config) -> None:
    acker = config.acker
    if acker.shards > acker.acks_partitions:
        # A shard owns the acks partitions p with p % shards == shard: more shards than
        # partitions would leave a shard with nothing to do.
        key = "shards" if ctx.written("acker", "shards") else "acks_partitions"
        raise ctx.error(
            ("acker", key),
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
            key = timeout if ctx.written("acker", timeout) else beat
            raise ctx.error(
                ("acker", key),
                f"{timeout} ({getattr(acker, timeout)}) must be greater than"
                f" {beat} ({getattr(acker, beat)}), or {why}",
                value=getattr(acker, key),
            )


def _check_topics(ctx: _Ctx, config: Config) -> None:
    """Every topic must be distinct and short enough for Kafka, or two roles share data."""
    origins: list[tuple[str, Loc]] = [
        (s.name, ("streams", i, "name")) for i, s in enumerate(config.streams)
    ]
    origins += [
        (s.source.topic, ("streams", i, "source", "topic"))
        for i, s in enumerate(config.streams) if s.source is not None
    ]
    for i, sub in enumerate(config.substreams):
        origins.append((config.acker.control_topic(sub.name), ("substreams", i, "name")))
    for attr in _ACKER_TOPIC_KEYS:
        origins.append((getattr(config.acker, attr), ("acker", attr)))
    seen: dict[str, Loc] = {}
    for topic, loc in origins:
        if len(topic) > _MAX_TOPIC_LEN:
            raise ctx.error(
                loc,
                f"topic {topic!r} is {len(topic)} characters long; Kafka allows at most"
                f" {_MAX_TOPIC_LEN}",
                value=topic,
            )
        if topic in seen:
            other = seen[topic]
            if not ctx.written(*loc):  # a default collides with a value the user wrote
                loc, other = other, loc
            raise ctx.error(
                loc,
                f"topic {topic!r} is also used by {_dotted(other)}; every stream, control and"
                " acker topic must be distinct",
                value=topic,
            )
        seen[topic] = loc


def _check_dead_letter_retention(ctx: _Ctx, config: Config) -> None:
    """The punctuation service re-reads its data topics from their start on every start-up and
    reads the dead-letter topic back so as not to report a late record twice: its dead
    letters must outlive the data they point at."""
    punctuated = {s.stream for s in config.substreams if s.mechanism == "punctuations"}
    dlq = config.acker.dead_letter_retention_ms
    for i, stream in enumerate(config.streams):
        data = config.retention_of(stream)
        if stream.name not in punctuated or _outlives(dlq, data):
            continue
        value = data
        if ctx.written("acker", "dead_letter_retention_ms"):
            loc: Loc = ("acker", "dead_letter_retention_ms")
            value = dlq
        elif stream.retention_ms is not None:
            loc = ("streams", i, "retention_ms")
        else:
            loc = ("kafka", "data_retention_ms")
        shown = "-1 (forever)" if data == KEEP else str(data)
        raise ctx.error(
            loc,
            f"acker.dead_letter_retention_ms ({dlq}) is shorter than the retention of stream"
            f" {stream.name!r} ({shown}), which has a punctuation substream: after a restart"
            " the punctuation service would report its late records to the dead-letter"
            " topic a second time; make the dead-letter retention at least as long",
            value=value,
        )


def _outlives(retention: int, other: int) -> bool:
    """Does a retention of ``retention`` keep records at least as long as ``other``?"""
    if retention == KEEP:
        return True
    return other != KEEP and retention >= other


def _load_schema(ctx: _Ctx, key: Loc, rel: str) -> tuple[Path, dict[str, Any]]:
    """Read an ``.avsc`` file, keeping the JSON (not fastavro's parsed form) for the model."""
    if not rel:
        raise ctx.error(key, "the schema path is empty", value=rel)
    path = (ctx.base_dir / rel).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ctx.error(
            key, f"schema file {rel!r} not found (looked for {path})", value=rel
        ) from None
    except UnicodeDecodeError as exc:
        raise ctx.error(
            key, f"schema file {rel!r} is not valid UTF-8 (byte {exc.start})", value=rel
        ) from None
    except OSError as exc:
        raise ctx.error(
            key, f"cannot read schema file {rel!r}: {exc.strerror}", value=rel
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ctx.error(
            key,
            f"schema file {rel!r} is not valid JSON: {exc.msg} at line {exc.lineno},"
            f" column {exc.colno}",
            value=rel,
        ) from None
    if not isinstance(data, dict) or data.get("type") != "record":
        if isinstance(data, dict):
            what = f"its type is {show(data.get('type'))}, expected 'record'"
        elif isinstance(data, list):
            what = "it is a union (a JSON list)"
        else:
            what = f"it is {show(data)}"
        raise ctx.error(key, f"schema file {rel!r} is not an Avro record schema: {what}", value=rel)
    try:
        fastavro.parse_schema(copy.deepcopy(data))
    except Exception as exc:  # fastavro raises many types; any of them means "invalid"
        raise ctx.error(
            key, f"schema file {rel!r} is not a valid Avro schema: {exc}", value=rel
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
    ctx: _Ctx, loc: Loc, stream: StreamConfig, field: str, role: str, allowed: Sequence[str]
) -> None:
    """Check that ``field`` exists in the stream's schema with one of the ``allowed`` types."""
    fields = {str(f["name"]): f["type"] for f in stream.schema["fields"]}
    listing = ", ".join(f"{n} ({_type_label(t)})" for n, t in fields.items())
    if field not in fields:
        raise ctx.error(
            loc,
            f"{field!r} is not a field of stream {stream.name!r}; its fields are: {listing}",
            value=field,
            allowed=", ".join(fields),
        )
    if not _is_plain(fields[field], allowed):
        fitting = [n for n, t in fields.items() if _is_plain(t, allowed)]
        types_ = " or ".join(allowed) if len(allowed) <= 2 else ", ".join(allowed)
        problem = (
            f"field {field!r} of stream {stream.name!r} has type {_type_label(fields[field])};"
            f" the {role} must be a plain {types_}"
        )
        if isinstance(fields[field], dict) and fields[field].get("logicalType") is not None:
            problem += " (no logicalType: fastavro would decode it to another Python type)"
        problem += "; " + (
            f"fields of that type: {', '.join(fitting)}" if fitting else "no field has that type"
        )
        raise ctx.error(loc, problem, value=field, allowed=", ".join(fitting) or None)
