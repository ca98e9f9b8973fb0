"""What is wrong with a payload that does not fit its stream's schema, by field.

Why: fastavro's writers say ``an integer is required on field n`` or ``no value and no
default for n`` -- or, from the compiled writer, nothing about the field at all -- and a
Spark task's error arrives hundreds of log lines away from the operator that made it.  An
error that names the stream, the field and the value is one a user can act on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from fastavro import parse_schema
from fastavro.validation import ValidationError, validate


@lru_cache(maxsize=64)
def _parsed(schema_json: str) -> Any:
    return parse_schema(json.loads(schema_json))


def _value(datum: Any) -> str:
    text = repr(datum)
    return text if len(text) <= 80 else text[:77] + "..."


def payload_mismatch(schema: Mapping[str, Any], payload: Mapping[str, Any]) -> str | None:
    """None if ``payload`` fits the record ``schema``; else what does not, one clause per
    field: ``field 'n': value 'x' (str) is not a long``, ``field 'user' is missing (no
    default)``."""
    parsed = _parsed(json.dumps(schema, sort_keys=True))
    try:
        validate(dict(payload), parsed, raise_errors=True)
    except ValidationError as exc:
        return _describe(schema, payload, exc)
    except (TypeError, ValueError, AttributeError) as exc:  # not a mapping of fields, say
        return f"not a record of {schema.get('name')}: {exc}"
    return None


def _describe(schema: Mapping[str, Any], payload: Mapping[str, Any],
              exc: ValidationError) -> str:
    top = str(schema.get("name", ""))
    expected: dict[str, list[str]] = {}
    datums: dict[str, Any] = {}
    for err in getattr(exc, "errors", ()):
        field = str(getattr(err, "field", "") or "")
        name = field.rsplit(".", 1)[-1]
        record = field.rsplit(".", 2)[-2] if field.count(".") >= 1 else top
        label = name if record == top else f"{record}.{name}"
        kind = getattr(err, "schema", "?")
        expected.setdefault(label, []).append(kind if isinstance(kind, str) else
                                              str(kind.get("type", kind))
                                              if isinstance(kind, dict) else str(kind))
        datums[label] = getattr(err, "datum", None)
    if not expected:
        return str(exc)
    clauses = []
    for label, kinds in expected.items():
        datum = datums[label]
        if datum is None and "." not in label and label not in payload:
            clauses.append(f"field '{label}' is missing (no default)")
        else:
            clauses.append(f"field '{label}': value {_value(datum)} ({type(datum).__name__}) "
                           f"is not {' or '.join(dict.fromkeys(kinds))}")
    return "; ".join(clauses)
