"""`substreams tail` in a real process, and the same lines from the dashboard's
``/tail/STREAM`` endpoint (chunked JSON lines over HTTP)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from substreams.app import Application
from substreams.config import Config
from substreams.ui.server import serve
from tests.conftest import ConfigFactory
from tests.integration.test_cli import run


@pytest.fixture
def clicks(make_config: ConfigFactory) -> Config:
    config = make_config([{"name": "clicks", "partitions": 2}])
    with Application(config).publisher(config.streams[0].name, "src") as pub:
        for ts in range(6):
            pub.publish({"user": f"u{ts}", "url": f"/{ts}", "ts": ts}, partition=ts % 2)
    return config


def test_tail_cli_prints_json_lines_from_an_order_key(clicks: Config) -> None:
    stream = clicks.streams[0].name
    out = run("tail", stream, "-c", str(clicks.path), "--json", "--from-order-key", "3")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(d["order_key"] for d in lines) == [3, 4, 5]
    first = min(lines, key=lambda d: d["order_key"])
    assert first["payload"] == {"user": "u3", "url": "/3", "ts": 3}
    assert first["source"] == "src" and first["stream"] == stream


def test_tail_cli_human_output_and_from_index(clicks: Config) -> None:
    stream = clicks.streams[0].name
    out = run("tail", stream, "-c", str(clicks.path), "--from-index", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # 3 records per partition (offsets 0, 1, 2 plus a transaction marker): index 2 on each
    assert len(lines) == 2
    assert all(line.split()[0].endswith(":2") for line in lines)
    assert "'url': '/4'" in out.stdout and "'url': '/5'" in out.stdout


def test_tail_cli_user_errors(clicks: Config) -> None:
    both = run("tail", clicks.streams[0].name, "-c", str(clicks.path), "--from-index", "0",
               "--from-order-key", "1")
    assert both.returncode == 2 and "not both" in both.stderr
    unknown = run("tail", "nope", "-c", str(clicks.path))
    assert unknown.returncode == 2 and "nope" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_tail_over_http_reads_and_follows(clicks: Config) -> None:
    stream = clicks.streams[0].name
    server = serve(clicks, port=0)
    try:
        with urllib.request.urlopen(f"{server.url}tail/{stream}?from_order_key=4",
                                    timeout=30) as resp:
            assert resp.headers["Transfer-Encoding"] == "chunked"
            got = [json.loads(line) for line in resp.read().splitlines()]
        assert sorted(d["payload"]["url"] for d in got) == ["/4", "/5"]

        with urllib.request.urlopen(f"{server.url}tail/{stream}?from_index=0&follow=1",
                                    timeout=30) as resp:
            seen = [json.loads(resp.readline()) for _ in range(6)]
            assert sorted(d["order_key"] for d in seen) == list(range(6))

            def publish_one() -> None:
                with Application(clicks).publisher(stream, "late") as pub:
                    pub.publish({"user": "x", "url": "/new", "ts": 99})

            writer = threading.Thread(target=publish_one)
            writer.start()
            new = json.loads(resp.readline())  # arrives on the open response
            writer.join()
        assert new["payload"]["url"] == "/new" and new["source"] == "late"

        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{server.url}tail/nope", timeout=30)
        assert err.value.code == 400
        assert "nope" in json.load(err.value)["error"]
    finally:
        server.stop()
