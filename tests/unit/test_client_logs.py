"""librdkafka's log lines reach Python logging (``substreams.kafka.librdkafka``), not the
process's stderr as raw ``%3|...`` lines."""

from __future__ import annotations

import socket
import time

import pytest

from substreams.kafka import client


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_connection_is_logged_through_python_logging(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    consumer = client.consumer(bootstrap)
    try:
        consumer.subscribe(["t"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            r.name == client.RDKAFKA_LOG.name for r in caplog.records
        ):
            consumer.poll(0.2)
    finally:
        consumer.close()
    lines = [r for r in caplog.records if r.name == client.RDKAFKA_LOG.name]
    assert lines, "no librdkafka log line reached Python logging"
    assert any(bootstrap in r.getMessage() for r in lines), [r.getMessage() for r in lines]
    assert "%3|" not in capfd.readouterr().err
