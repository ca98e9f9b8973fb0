"""One converter between protocol types and their Avro form, driven by the schema.

Why: the control, command, response and acks protocols are written once as frozen
dataclasses (the types *are* the protocol, as in Materialize's ``protocol`` crate) and once
as Avro schemas (``substreams/avro/*.avsc``, what is on the wire).  The first version had a
hand-written ``to_wire``/``from_wire`` per message, ~600 lines that had to change with every
field; here the mapping is derived once per (schema, type) pair and compiled into closures,
so a new field is one line in the dataclass and one in the schema.

Rules (checked when a converter is built, not per message):

* A **record** maps to a dataclass with a field of the same name for every Avro field
  (Python-only fields must have defaults), or to a ``tuple[A, B, ...]`` positionally (the
  ``(time, delta)`` pairs of frontier updates).
* An **array** maps to ``tuple[X, ...]`` / ``list[X]``, or to a container class listed in
  ``containers`` (``Antichain``: iterated with ``elements()``, rebuilt from an iterable).
* A **union** with ``"null"`` maps to ``X | None``; a union of records maps to a union of
  dataclasses, the branch chosen by the class (``names`` maps Avro record names to classes
  when they differ).  fastavro hands a union's record back as ``(name, value)`` when
  decoding with record names; both forms are accepted.
* An **enum** maps to ``str`` or to an ``enum.Enum`` whose values are the symbols.
* A named type in ``adapters`` (``substreams.Time``) and a field annotated
  ``Annotated[int, Adapter]`` (an unsigned 64-bit XOR on a signed long) use the adapter's
  own two functions.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Adapter", "Converter"]

ToWire = Callable[[Any], Any]
FromWire = Callable[[Any], Any]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


@dataclass(frozen=True, slots=True)
class Adapter:
    """A value whose wire form is not derived from its fields."""

    to_wire: ToWire
    from_wire: FromWire


class Converter:
    """Compiles and caches the to/from-wire functions of (Avro type, Python type) pairs of
    one schema."""

    def __init__(
        self,
        schema: Mapping[str, Any],
        *,
        names: Mapping[str, type] | None = None,
        adapters: Mapping[str, Adapter] | None = None,
        containers: Mapping[type, Any] | None = None,
    ) -> None:
        self.schema = dict(schema)
        self.names = dict(names or {})
        self.adapters = {k.rsplit(".", 1)[-1]: a for k, a in (adapters or {}).items()}
        self.containers = dict(containers or {})
        self._defs: dict[str, Mapping[str, Any]] = {}
        self._index(self.schema, None)
        self._to: dict[tuple[str, Any], ToWire] = {}
        self._from: dict[tuple[str, Any], FromWire] = {}
        self._root_to: dict[Any, ToWire] = {}
        self._root_from: dict[Any, FromWire] = {}

    # -- the schema's named types ----------------------------------------------------------

    def _index(self, node: Any, ns: str | None) -> None:
        if isinstance(node, list):
            for n in node:
                self._index(n, ns)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "enum", "fixed") and "name" in node:
                ns = node.get("namespace", ns)
                self._defs[self._full(node["name"], ns)] = node
                self._defs.setdefault(node["name"], node)
            for key in ("type", "items", "values"):
                if key in node and not isinstance(node[key], str):
                    self._index(node[key], ns)
            for f in node.get("fields", ()):
                self._index(f["type"], ns)

    @staticmethod
    def _full(name: str, ns: str | None) -> str:
        return name if "." in name or not ns else f"{ns}.{name}"

    def _resolve(self, avro: Any) -> Any:
        """A named reference's definition (primitives and adapted names stay strings)."""
        if isinstance(avro, str) and avro not in _PRIMITIVES:
            found = self._defs.get(avro) or self._defs.get(avro.rsplit(".", 1)[-1])
            if found is None:
                raise TypeError(f"schema {self.schema.get('name')}: unknown type {avro!r}")
            return found
        if isinstance(avro, dict) and avro.get("type") in _PRIMITIVES and len(avro) == 1:
            return avro["type"]
        return avro

    @staticmethod
    def _name(node: Any) -> str:
        if isinstance(node, str):
            return node
        if isinstance(node, dict) and "name" in node:
            return str(node["name"])
        if isinstance(node, dict):
            return str(node["type"])
        return "union"

    # -- public ------------------------------------------------------------------------------

    def to_wire(self, value: Any, hint: Any = None) -> Any:
        """``value`` (of ``hint``, default its class) as the schema's top-level datum."""
        return self.root_encoder(hint or type(value))(value)

    def from_wire(self, datum: Any, hint: Any) -> Any:
        return self.root_decoder(hint)(datum)

    def root_encoder(self, hint: Any) -> ToWire:
        """The compiled encoder of the top-level record as ``hint`` (cached by ``hint``
        alone: the per-message path does no schema lookups)."""
        fn = self._root_to.get(hint)
        if fn is None:
            fn = self._root_to[hint] = self.encoder(self.schema, hint)
        return fn

    def root_decoder(self, hint: Any) -> FromWire:
        fn = self._root_from.get(hint)
        if fn is None:
            fn = self._root_from[hint] = self.decoder(self.schema, hint)
        return fn

    def encoder(self, avro: Any, hint: Any) -> ToWire:
        key = (repr(avro) if not isinstance(avro, str) else avro, hint)
        fn = self._to.get(key)
        if fn is None:
            fn = self._to[key] = self._compile_to(avro, hint)
        return fn

    def decoder(self, avro: Any, hint: Any) -> FromWire:
        key = (repr(avro) if not isinstance(avro, str) else avro, hint)
        fn = self._from.get(key)
        if fn is None:
            fn = self._from[key] = self._compile_from(avro, hint)
        return fn

    # -- compiling ---------------------------------------------------------------------------

    def _adapter(self, avro: Any, hint: Any) -> Adapter | None:
        if typing.get_origin(hint) is typing.Annotated:
            for meta in hint.__metadata__:
                if isinstance(meta, Adapter):
                    return meta
        name = avro.get("name") if isinstance(avro, dict) else avro
        if isinstance(name, str):
            return self.adapters.get(name.rsplit(".", 1)[-1])
        return None

    def _compile_to(self, avro: Any, hint: Any) -> ToWire:
        adapter = self._adapter(avro, hint)
        if adapter is not None:
            return adapter.to_wire
        avro = self._resolve(avro)
        if isinstance(avro, str):  # a primitive
            return _identity
        if isinstance(avro, list):
            return self._union_to(avro, hint)
        kind = avro["type"]
        if kind == "record":
            return self._record_to(avro, hint)
        if kind == "array":
            item, iterate = self._array_item(hint)
            enc = self.encoder(avro["items"], item)
            if enc is _identity:
                return lambda v: list(iterate(v))
            return lambda v: [enc(x) for x in iterate(v)]
        if kind == "enum":
            if isinstance(hint, type) and issubclass(hint, enum.Enum):
                return lambda v: v.value
            return _identity
        raise TypeError(f"unsupported Avro type {kind!r}")

    def _compile_from(self, avro: Any, hint: Any) -> FromWire:
        adapter = self._adapter(avro, hint)
        if adapter is not None:
            return adapter.from_wire
        avro = self._resolve(avro)
        if isinstance(avro, str):
            return _identity  # fastavro already hands back int, str, bytes...
        if isinstance(avro, list):
            return self._union_from(avro, hint)
        kind = avro["type"]
        if kind == "record":
            return self._record_from(avro, hint)
        if kind == "array":
            item, _ = self._array_item(hint)
            dec = self.decoder(avro["items"], item)
            build = self._array_build(hint)
            if dec is _identity:
                return build
            return lambda d: build([dec(x) for x in d])
        if kind == "enum":
            if isinstance(hint, type) and issubclass(hint, enum.Enum):
                cls = hint
                return lambda d: cls(d)
            return str
        raise TypeError(f"unsupported Avro type {kind!r}")

    # records

    def _fields(self, cls: type) -> dict[str, Any]:
        return typing.get_type_hints(cls, include_extras=True)

    def _record_to(self, avro: Mapping[str, Any], hint: Any) -> ToWire:
        fields = [(f["name"], f["type"]) for f in avro["fields"]]
        if _is_tuple(hint):
            args = typing.get_args(hint)
            encs = [self.encoder(t, h) for (_, t), h in zip(fields, args, strict=True)]
            items = [(n, f"v[{i}]") for i, (n, _) in enumerate(fields)]
            return _generate_dict(avro["name"], items, encs)
        cls = _dataclass(hint, avro)
        hints = self._fields(cls)
        self._check_fields(cls, avro)
        encs = [self.encoder(t, hints[n]) for n, t in fields]
        return _generate_dict(avro["name"], [(n, f"v.{n}") for n, _ in fields], encs)

    def _record_from(self, avro: Mapping[str, Any], hint: Any) -> FromWire:
        fields = [(f["name"], f["type"]) for f in avro["fields"]]
        if _is_tuple(hint):
            args = typing.get_args(hint)
            decs = [self.decoder(t, h) for (_, t), h in zip(fields, args, strict=True)]
            return _generate_call(avro["name"], tuple, _defaults(avro), decs, tupled=True)
        cls = _dataclass(hint, avro)
        hints = self._fields(cls)
        self._check_fields(cls, avro)
        decs = [self.decoder(t, hints[n]) for n, t in fields]
        return _generate_call(avro["name"], cls, _defaults(avro), decs, tupled=False)

    def _check_fields(self, cls: type, avro: Mapping[str, Any]) -> None:
        wire = {f["name"] for f in avro["fields"]}
        for f in dataclasses.fields(cls):
            missing_default = (
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            )
            if f.name not in wire and missing_default:
                raise TypeError(
                    f"{cls.__name__}.{f.name} is not in Avro record {avro['name']} and has no "
                    "default"
                )
        extra = wire - {f.name for f in dataclasses.fields(cls)}
        if extra:
            raise TypeError(f"Avro record {avro['name']} has fields {sorted(extra)} that "
                            f"{cls.__name__} lacks")

    # arrays

    def _array_item(self, hint: Any) -> tuple[Any, Callable[[Any], Iterable[Any]]]:
        origin = typing.get_origin(hint)
        if origin in (tuple, list):
            args = typing.get_args(hint)
            return args[0], _identity
        if hint in self.containers:
            return self.containers[hint], _elements
        raise TypeError(f"an Avro array needs tuple[X, ...], list[X] or a container, not {hint}")

    def _array_build(self, hint: Any) -> Callable[[Iterable[Any]], Any]:
        origin = typing.get_origin(hint)
        if origin is tuple:
            return tuple
        if origin is list:
            return list
        built: Callable[[Iterable[Any]], Any] = hint
        return built

    # unions

    def _union_to(self, avro: list[Any], hint: Any) -> ToWire:
        branches = [b for b in avro if b != "null"]
        hints = [h for h in _union_args(hint) if h is not type(None)]
        if len(branches) == 1:
            inner = hints[0] if len(hints) == 1 else _rebuild_union(hints)
            enc = self.encoder(branches[0], inner)
            return lambda v: None if v is None else enc(v)
        by_class: dict[type, tuple[str, ToWire]] = {}
        for b in branches:
            node = self._resolve(b)
            cls = self._class_of(node, hints)
            by_class[cls] = (self._full(node["name"], node.get("namespace", "substreams")),
                             self.encoder(b, cls))

        def enc_union(v: Any) -> Any:
            if v is None:
                return None
            name, enc = by_class[type(v)]
            return (name, enc(v))

        return enc_union

    def _union_from(self, avro: list[Any], hint: Any) -> FromWire:
        branches = [b for b in avro if b != "null"]
        hints = [h for h in _union_args(hint) if h is not type(None)]
        if len(branches) == 1:
            inner = hints[0] if len(hints) == 1 else _rebuild_union(hints)
            dec = self.decoder(branches[0], inner)

            def dec_optional(d: Any) -> Any:
                if d is None:
                    return None
                return dec(d[1] if type(d) is tuple else d)

            return dec_optional
        by_name: dict[str, FromWire] = {}
        for b in branches:
            node = self._resolve(b)
            cls = self._class_of(node, hints)
            dec = self.decoder(b, cls)
            by_name[node["name"]] = dec
            by_name[self._full(node["name"], node.get("namespace", "substreams"))] = dec

        def dec_union(d: Any) -> Any:
            if d is None:
                return None
            name, value = d
            try:
                fn = by_name[name]
            except KeyError:
                raise ValueError(f"unknown union branch {name!r}") from None
            return fn(value)

        return dec_union

    def _class_of(self, node: Mapping[str, Any], hints: list[Any]) -> type:
        name = node["name"]
        cls = self.names.get(name)
        if cls is not None:
            return cls
        for h in hints:
            if isinstance(h, type) and h.__name__ == name:
                return h
        raise TypeError(f"no type among {hints} for Avro record {name}")


def _identity(v: Any) -> Any:
    return v


def _elements(v: Any) -> Iterable[Any]:
    elements: Callable[[], Iterable[Any]] = v.elements
    return elements()


_NO_DEFAULT = object()


def _defaults(avro: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(name, Avro default or _NO_DEFAULT) of a record's fields (defaults are datums, JSON
    form: ``null``, ``[]``, ``""``; copied so that no decoded value shares one)."""
    return [(f["name"], copy.deepcopy(f["default"]) if "default" in f else _NO_DEFAULT)
            for f in avro["fields"]]


def _generate_dict(name: str, items: list[tuple[str, str]], encs: list[ToWire]) -> ToWire:
    """``lambda v: {"field": enc(v.field), ...}`` as one generated function (a dict display
    instead of a loop over a plan: this runs per message); identity encoders are inlined."""
    env: dict[str, Any] = {}
    parts = []
    for i, ((field, expr), enc) in enumerate(zip(items, encs, strict=True)):
        if enc is _identity:
            parts.append(f"{field!r}: {expr}")
        else:
            env[f"e{i}"] = enc
            parts.append(f"{field!r}: e{i}({expr})")
    return _compile(f"to_{name}", "v", "{" + ", ".join(parts) + "}", env)


def _generate_call(
    name: str,
    cls: Any,
    fields: list[tuple[str, Any]],
    decs: list[FromWire],
    *,
    tupled: bool,
) -> FromWire:
    """``lambda d: cls(field=dec(d["field"]), ...)`` (or a tuple, positionally) as one
    generated function; identity decoders are inlined.  A field with an Avro default is
    read with ``d.get`` (a datum of an older schema version may lack it)."""
    env: dict[str, Any] = {"cls": cls}
    args = []
    for i, ((field, default), dec) in enumerate(zip(fields, decs, strict=True)):
        if default is _NO_DEFAULT:
            raw = f"d[{field!r}]"
        else:
            env[f"g{i}"] = default
            raw = f"d.get({field!r}, g{i})"
        value = raw if dec is _identity else f"f{i}({raw})"
        if dec is not _identity:
            env[f"f{i}"] = dec
        args.append(value if tupled else f"{field}={value}")
    body = "(" + ", ".join(args) + ("," if tupled and len(args) == 1 else "") + ")"
    return _compile(f"from_{name}", "d", body if tupled else "cls" + body, env)


def _compile(name: str, arg: str, expr: str, env: dict[str, Any]) -> Callable[[Any], Any]:
    source = f"def {name}({arg}):\n    return {expr}\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<wire {name}>", "exec"), env, namespace)
    fn: Callable[[Any], Any] = namespace[name]
    return fn


def _is_tuple(hint: Any) -> bool:
    args = typing.get_args(hint)
    return typing.get_origin(hint) is tuple and not (len(args) == 2 and args[1] is Ellipsis)


def _union_args(hint: Any) -> list[Any]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return list(typing.get_args(hint))
    return [hint]


def _rebuild_union(hints: list[Any]) -> Any:
    out = hints[0]
    for h in hints[1:]:
        out = out | h
    return out


def _dataclass(hint: Any, avro: Mapping[str, Any]) -> type:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    raise TypeError(f"Avro record {avro.get('name')} needs a dataclass or a tuple, not {hint!r}")
