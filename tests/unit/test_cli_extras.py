"""A command of an optional part (``substreams bench``) without its extra installed: one
``error:`` line saying how to get it, exit 2, no traceback -- ``--help`` included."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import click
import pytest
from click.testing import CliRunner

from substreams.cli.main import COMMANDS, _unavailable


def test_bench_without_its_extra_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.delitem(sys.modules, "substreams_bench.cli", raising=False)
    with pytest.raises(ImportError) as caught:
        importlib.import_module("substreams_bench.cli")
    assert "pip install 'substreams[bench]'" in str(caught.value)

    group = click.Group("substreams", commands=[_unavailable("bench", str(caught.value))])
    for args in (["bench", "acker", "--quick"], ["bench", "--help"]):
        result = CliRunner().invoke(group, args)
        assert result.exit_code == 2
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: substreams bench: "), lines
        assert "substreams[bench]" in lines[0]


def test_a_launch_imports_only_the_module_of_its_command() -> None:
    """Each `substreams` process imports the module of the command it runs and no other
    (the suite and the services launch hundreds); ``--help`` still lists them all."""
    import subprocess

    probe = (
        "import sys\n"
        "from substreams.cli.main import cli\n"
        "try:\n"
        "    cli(sys.argv[1:], prog_name='substreams')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted(m for m in sys.modules if m.endswith('_cmd'))))\n"
    )

    def modules(*args: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True
        )
        return out.stdout.strip().splitlines()[-1].split()

    assert modules("config", "--help") == ["substreams.cli.config_cmd"]
    assert modules("spark-cluster", "--help") == ["substreams.cli.spark_cluster_cmd"]
    assert len(modules("--help")) == len(COMMANDS)  # every built-in one, for its short help
