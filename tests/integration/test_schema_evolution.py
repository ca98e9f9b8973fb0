"""A stream whose schema evolves with its old records still in the topic: readers of the
new schema (and of the old one) decode everything; an incompatible change is refused at
`topics create` and at publish, naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from substreams.app import Application
from substreams.config import Config, load_config
from substreams.streams.evolution import IncompatibleSchemaError
from substreams.streams.listener import Listener
from substreams.streams.records import Entry
from tests.conftest import CLICK_SCHEMA, ConfigFactory
from tests.integration.test_cli import run

V1: dict[str, Any] = {
    **CLICK_SCHEMA,
    "fields": [*CLICK_SCHEMA["fields"],
               {"name": "agent", "type": ["null", "string"], "default": None}],
}
# v2: 'agent' (optional) removed, 'ref' added with a default
V2: dict[str, Any] = {
    **CLICK_SCHEMA,
    "fields": [*CLICK_SCHEMA["fields"], {"name": "ref", "type": "string", "default": "-"}],
}


def with_schema(config: Config, schema: dict[str, Any], name: str) -> Config:
    """The same deployment (topics, names) with the stream's schema file replaced."""
    folder = config.path.parent
    (folder / f"{name}.avsc").write_text(json.dumps(schema))
    text = config.path.read_text().replace("schema: v1.avsc", f"schema: {name}.avsc")
    path = folder / f"{config.path.stem}-{name}.yaml"
    path.write_text(text)
    return load_config(path)


def read(config: Config) -> list[Entry]:
    with Listener(config, config.streams[0].name) as listener:
        out = [e for e in listener.entries(idle_timeout=0.5) if isinstance(e, Entry)]
    return sorted(out, key=lambda e: e.order_key)


@pytest.fixture
def v1(make_config: ConfigFactory, tmp_path: Path) -> Config:
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    return make_config([{"name": "clicks", "partitions": 2, "schema": "v1.avsc"}])


def test_old_records_are_read_in_the_new_shape_and_new_ones_by_old_readers(v1: Config) -> None:
    stream = v1.streams[0].name
    with Application(v1).publisher(stream, "old") as pub:
        for ts in range(3):
            pub.publish({"user": "u", "url": f"/{ts}", "ts": ts, "agent": f"a{ts}"})
    v2 = with_schema(v1, V2, "v2")
    created = run("topics", "create", "-c", str(v2.path))
    assert created.returncode == 0, created.stderr
    assert f"schema   {stream}" in created.stdout
    with Application(v2).publisher(stream, "new") as pub:
        for ts in range(3, 5):
            pub.publish({"user": "u", "url": f"/{ts}", "ts": ts, "ref": f"r{ts}"})

    new_reader = read(v2)
    assert [e.payload for e in new_reader] == [
        {"user": "u", "url": "/0", "ts": 0, "ref": "-"},
        {"user": "u", "url": "/1", "ts": 1, "ref": "-"},
        {"user": "u", "url": "/2", "ts": 2, "ref": "-"},
        {"user": "u", "url": "/3", "ts": 3, "ref": "r3"},
        {"user": "u", "url": "/4", "ts": 4, "ref": "r4"},
    ]
    old_reader = read(v1)  # a reader still on v1 (e.g. a job not redeployed yet)
    assert [e.payload.get("agent") for e in old_reader] == ["a0", "a1", "a2", None, None]

    tail = run("tail", stream, "-c", str(v2.path), "--json")
    assert tail.returncode == 0, tail.stderr
    refs = sorted(json.loads(line)["payload"]["ref"] for line in tail.stdout.splitlines())
    assert refs == ["-", "-", "-", "r3", "r4"]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda f: f.append({"name": "country", "type": "string"}), "country"),  # no default
        (lambda f: f.pop(1), "url"),  # required field removed
        (lambda f: f[0].update(type="int"), "user"),  # string -> int
    ],
)
def test_an_incompatible_change_is_refused_naming_the_field(
    v1: Config, edit: Any, field: str
) -> None:
    stream = v1.streams[0].name
    with Application(v1).publisher(stream, "old") as pub:
        pub.publish({"user": "u", "url": "/0", "ts": 0, "agent": None})
    bad_schema = copy.deepcopy(V1)
    edit(bad_schema["fields"])
    bad = with_schema(v1, bad_schema, "bad")

    created = run("topics", "create", "-c", str(bad.path))
    assert created.returncode == 2
    assert f"'{field}'" in created.stderr and "bad.avsc" in created.stderr
    assert "Traceback" not in created.stderr

    with pytest.raises(IncompatibleSchemaError, match=f"'{field}'"):
        Application(bad).publisher(stream, "other")
    # the refused schema was not registered: the old one still publishes
    with Application(v1).publisher(stream, "old") as pub:
        pub.publish({"user": "u", "url": "/1", "ts": 1, "agent": None})
    assert [e.payload["url"] for e in read(v1)] == ["/0", "/1"]
