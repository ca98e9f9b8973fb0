"""The framework's own Avro schemas are package data: read with ``importlib.resources`` from
the source tree, and present in (and readable from) the ``--py-files`` zip ``substreams
submit`` builds for a cluster's workers.  The streams' schemas (``substreams.yaml``'s, the
jobs') are the user's, in the top-level ``avro/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import fastavro
import pytest

from substreams.cli.submit_cmd import package_zip
from substreams.streams.schemas import (
    envelope_schema,
    expanded,
    protocol_codec,
    raw_schema,
    schema_file,
)

PACKAGE = Path(__file__).resolve().parents[2] / "substreams"
SCHEMAS = sorted(p.stem for p in (PACKAGE / "avro").glob("*.avsc"))
USER_SCHEMAS = PACKAGE.parent / "avro"
CLICK = json.loads((USER_SCHEMAS / "click.avsc").read_text())
PROTOCOL = ("ack", "command", "control", "punctuation", "response")


def test_the_schemas_live_in_the_package() -> None:
    assert {"envelope", "time", "range", *PROTOCOL} <= set(SCHEMAS)
    user = {p.stem for p in USER_SCHEMAS.glob("*.avsc")}
    assert "click" in user and not user & set(SCHEMAS), "protocol schemas belong in the package"


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_schema_reads_through_importlib_resources(name: str) -> None:
    assert schema_file(name).is_file()
    schema = raw_schema(name)
    assert schema == json.loads((PACKAGE / "avro" / f"{name}.avsc").read_text())
    if name in PROTOCOL:
        assert protocol_codec(name).fingerprint  # shared types resolved, schema parses
    elif name == "envelope":  # a template: the stream's record replaces its payload
        fastavro.parse_schema(expanded(envelope_schema(CLICK)))
    else:
        fastavro.parse_schema(expanded(schema))


def test_submit_zip_holds_the_schemas_and_importlib_resources_finds_them(
    tmp_path: Path,
) -> None:
    zipped = package_zip(tmp_path)
    with zipfile.ZipFile(zipped) as zf:
        names = set(zf.namelist())
    assert {f"substreams/avro/{n}.avsc" for n in SCHEMAS} <= names
    assert {"substreams/__init__.py", "substreams/streams/schemas.py"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # A worker without the package: only the zip provides it (not the checkout, not an
    # editable install), and the codecs load their schemas from inside it.
    probe = f"""
import sys
sys.path.insert(0, {str(zipped)!r})
import substreams
assert substreams.__file__.startswith({str(zipped)!r}), substreams.__file__
from importlib import resources
from substreams.streams.schemas import envelope_schema, protocol_codec, raw_schema
folder = resources.files("substreams") / "avro"
found = sorted(f.name[:-5] for f in folder.iterdir() if f.name.endswith(".avsc"))
assert found == {SCHEMAS!r}, found
assert envelope_schema({CLICK!r})["name"] == "Envelope"
for name in {PROTOCOL!r}:
    protocol_codec(name)
print("ok", type(folder).__module__)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok zipfile"), out.stdout
