"""Load the example jobs (``jobs/*.py`` is not a package) and build configs for them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
AVRO = ROOT / "avro"


def load_job(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"jobs_{name}", ROOT / "jobs" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def out_stream(
    name: str, schema: str, order_key: str = "window", partitions: int = 1
) -> dict[str, Any]:
    return {
        "name": name,
        "schema": str(AVRO / schema),
        "order_key": order_key,
        "partitions": partitions,
    }
