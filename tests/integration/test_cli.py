"""The `substreams` command as a user runs it: a real process, real broker, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ConfigFactory

REPO = Path(__file__).resolve().parents[2]


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "substreams", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def test_help_lists_commands_and_each_has_its_own_help() -> None:
    """The entry point once as a process; each command's help in this process (the same
    click tree ``python -m substreams`` runs, without a Python start-up per command)."""
    from click.testing import CliRunner

    from substreams.cli.main import cli

    top = run("--help")
    assert top.returncode == 0

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(cli, list(args), prog_name="substreams")

    for name in ("broker", "topics", "config", "demo", "tail", "ui", "spark-cluster",
                 "dead-letters", "ingest"):
        assert name in top.stdout
        sub = invoke(name, "--help")
        assert sub.exit_code == 0 and "Usage:" in sub.output
    for path in (
        ("broker", "start"),
        ("broker", "stop"),
        ("broker", "status"),
        ("topics", "create"),
        ("config", "check"),
        ("spark-cluster", "start"),
        ("spark-cluster", "kill-worker"),
        ("dead-letters", "list"),
        ("dead-letters", "show"),
        ("dead-letters", "replay"),
        ("acker", "status"),
    ):
        assert invoke(*path, "--help").exit_code == 0


def test_broker_start_status_stop_and_restart_keeps_topics(tmp_path: Path) -> None:
    """The embedded Apache Kafka keeps its data on disk: a topic and its records outlive a
    stop and a start (on the same address, which the config's `embedded` resolves to)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import NewTopic

    from substreams.kafka import client

    env = {"SUBSTREAMS_HOME": str(tmp_path / "home")}
    try:
        started = run("broker", "start", env=env)
        assert started.returncode == 0, started.stderr
        assert "broker started on 127.0.0.1:" in started.stdout
        again = run("broker", "start", env=env)
        assert "already runs" in again.stdout
        status = run("broker", "status", env=env)
        assert status.returncode == 0 and "answering" in status.stdout
        assert "node 1: 127.0.0.1:" in status.stdout
        bootstrap = started.stdout.split("broker started on ")[1].split()[0]
        admin = client.admin(bootstrap)
        admin.create_topics([NewTopic("kept", 1, 1)])["kept"].result(30)
        producer = client.producer(bootstrap)
        producer.produce("kept", b"survives")
        assert producer.flush(30) == 0
        stopped = run("broker", "stop", env=env)
        assert "stopped" in stopped.stdout and "data kept" in stopped.stdout
        assert run("broker", "status", env=env).returncode == 1
        restarted = run("broker", "start", env=env)
        assert f"broker started on {bootstrap}" in restarted.stdout, restarted.stderr
        consumer = client.consumer(bootstrap, **{"enable.partition.eof": True})
        consumer.assign([TopicPartition("kept", 0, 0)])
        msg = consumer.poll(30)
        assert msg is not None and msg.error() is None and msg.value() == b"survives"
        consumer.close()
    finally:
        stopped = run("broker", "stop", env=env)
    after = run("broker", "status", env=env)
    assert after.returncode == 1 and "no embedded broker is running" in after.stdout
    assert "no embedded broker is running" in run("broker", "stop", env=env).stdout


def test_topics_create_is_idempotent(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks", "partitions": 3}], create=False)
    wanted = len(config.topics())
    first = run("topics", "create", "-c", str(config.path))
    assert first.returncode == 0, first.stderr
    assert f"{wanted} created, 0 already existed" in first.stdout
    second = run("topics", "create", "-c", str(config.path))
    assert f"0 created, {wanted} already existed" in second.stdout


def test_config_check_ok_and_error_names_file_line_key(tmp_path: Path) -> None:
    ok = run("config", "check", "-c", str(REPO / "substreams.yaml"))
    assert ok.returncode == 0 and "ok (" in ok.stdout
    bad = tmp_path / "bad.yaml"
    text = (REPO / "substreams.yaml").read_text().replace("kind: tumbling", "kind: tumblin", 1)
    bad.write_text(text)
    click = tmp_path / "avro" / "click.avsc"  # where bad.yaml looks for it
    click.parent.mkdir(parents=True)
    click.write_text((REPO / "avro" / "click.avsc").read_text())
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "kind: tumblin" in ln)
    res = run("config", "check", "-c", str(bad))
    assert res.returncode == 2
    assert f"bad.yaml:{line}: substreams[0].kind: 'tumblin' is not allowed" in res.stderr
    assert "Traceback" not in res.stderr


def test_embedded_without_broker_is_a_clear_error(tmp_path: Path) -> None:
    env = {"SUBSTREAMS_HOME": str(tmp_path / "empty-home"), "SUBSTREAMS_BOOTSTRAP": ""}
    res = run("topics", "create", "-c", str(REPO / "substreams.yaml"), env=env)
    assert res.returncode == 2
    assert "no embedded broker is running" in res.stderr and "substreams broker start" in res.stderr
    assert "Traceback" not in res.stderr


def test_spark_cluster_commands_without_a_cluster_are_clear_errors(tmp_path: Path) -> None:
    env = {"SUBSTREAMS_HOME": str(tmp_path / "empty-home")}
    for args in (("status",), ("stop",), ("kill-worker", "0")):
        res = run("spark-cluster", *args, env=env)
        assert res.returncode == 2, res
        assert "no spark cluster was started here" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.parametrize("missing", ["nope.yaml"])
def test_missing_config_file(missing: str, tmp_path: Path) -> None:
    res = run("config", "check", "-c", str(tmp_path / missing))
    assert res.returncode == 2 and missing in res.stderr and "Traceback" not in res.stderr


@contextmanager
def serving(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A long-running `substreams ARGS` process and the first line it writes to stderr
    (where it says where it listens).  Leaving the block interrupts it (Ctrl-C) and asserts
    a clean exit; a process that does not stop is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "substreams", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        assert proc.stderr is not None
        yield proc, proc.stderr.readline()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
