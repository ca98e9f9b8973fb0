"""The demo end to end (broker given, acker in a thread, Spark printing notifications)."""

from __future__ import annotations

import io

import pytest
from pyspark.sql import SparkSession
from rich.console import Console

from substreams.spark.demo import run_demo
from tests.conftest import ConfigFactory

pytestmark = pytest.mark.spark


def test_demo_notifies_every_window_once_in_order(
    spark: SparkSession, make_config: ConfigFactory
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "clicks_1s", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    out = io.StringIO()
    report = run_demo(
        config.path,
        150,
        seconds=2.5,
        bootstrap=config.kafka.bootstrap,
        console=Console(file=out, width=120),
        wait_timeout=90,
    )
    text = out.getvalue()
    assert report.tracker == "acker"
    assert report.published == 150 and len(report.sealed) >= 2
    assert report.complete, text
    # one line per sealed window (the warm-up window is reported apart, not counted)
    assert text.count(" ms after seal") == len(report.sealed)
    assert "query warmed up" in text
    assert "every window notified once, in order" in text
