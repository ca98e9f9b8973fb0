"""Hopping windows end to end: YAML ``kind: hopping`` -> panes tracked by the real acker
-> windows in ``on_epoch`` on both read paths, with several sources and one publisher
process SIGKILLed in the middle of a window (the acker evicts it; what it committed stays
in its windows).  Each window is notified once, in order, and its records are exactly
those a brute-force count over the committed records puts in it; a control scan resuming
between two windows that share panes (a restarted query) hands out the same windows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from substreams.app import Application
from substreams.spark.offsets import ControlScanner
from substreams.spark.operator import EpochNote, EpochOperator
from substreams.spark.runner import run
from substreams.streams.listener import Listener
from substreams.streams.records import Entry
from tests.conftest import ConfigFactory
from tests.integration.test_acker import acker
from tests.integration.test_publisher_crashes import Remote
from tests.spark.conftest import wait_for_epochs

pytestmark = pytest.mark.spark

SLIDE, SIZE = 1000, 3000  # three panes a window


class SeenCounts(EpochOperator):
    """One result per record ``on_epoch`` got: a note's ``results`` is what the operator
    saw of its window on the executors, its ``records`` what the window announced."""

    def __init__(self) -> None:
        self.notes: list[EpochNote] = []

    def on_epoch(self, epoch: Any, rows: list[Any]) -> list[dict[str, Any]]:
        return [{} for _ in rows]

    def on_notification(self, note: EpochNote) -> None:  # the driver's copy
        self.notes.append(note)


def brute_force(config: Any, stream: str) -> Counter[int]:
    """Committed records (``read_committed``) per hopping window: a record at event time
    ``ts`` is in every window ``w`` with ``w * SLIDE <= ts < w * SLIDE + SIZE``."""
    out: Counter[int] = Counter()
    with Listener(config, stream) as listener:
        for e in listener.entries(idle_timeout=0.5):
            assert isinstance(e, Entry)
            ts = int(e.payload["ts"])
            for w in range(ts // SLIDE - SIZE // SLIDE + 1, ts // SLIDE + 1):
                if w * SLIDE <= ts < w * SLIDE + SIZE:
                    out[w] += 1
    return out


def test_hopping_windows_once_in_order_with_exact_counts_on_both_read_paths(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "h", "stream": "clicks", "kind": "hopping", "size_ms": SIZE,
          "slide_ms": SLIDE}],
        acker={"heartbeat_ms": 200, "source_heartbeat_ms": 200, "source_timeout_ms": 1500},
    )
    sub, stream = config.substreams[0].name, config.streams[0].name
    jvm, python = SeenCounts(), SeenCounts()
    app = Application(config)

    def query(op: SeenCounts, name: str, read: str) -> None:
        run(op, config, sub, spark=spark, once=True, query_name=name, read=read,
            checkpoint=tmp_path / name)

    with acker(config), app.publisher(stream, "a") as a, app.publisher(stream, "b") as b:
        c = Remote(config, stream, "c")  # a publisher process, SIGKILLed below
        for pane in (0, 1):
            for i, pub in enumerate((a, b)):
                for k in range(pane + i + 1):
                    pub.publish({"user": "ab"[i], "url": "/", "ts": pane * SLIDE + 7 * k})
                pub.seal(sub, pane)
            assert c.do("publish", f"/c{pane}", pane * SLIDE + 500) == "ok"
            assert c.do("flush") == "ok" and c.do("seal", sub, pane) == "ok"
        # c commits a record in pane 2, never seals it, and dies: the acker evicts it
        assert c.do("publish", "/c2", 2 * SLIDE + 10) == "ok" and c.do("flush") == "ok"
        c.kill()
        for pane in (2, 3, 4, 6):  # pane 5 never opens: pane 6 completes windows 3 and 4
            for i, pub in enumerate((a, b)):
                for k in range(pane % 3 + i):
                    pub.publish({"user": "ab"[i], "url": "/", "ts": pane * SLIDE + 11 * k})
                pub.seal(sub, pane)
        wait_for_epochs(config, sub, 6, timeout=20)
    query(jvm, "hop-jvm", "jvm")
    query(python, "hop-python", "python")

    truth = brute_force(config, stream)
    assert truth[0] > 0 and truth[4] > 0
    want = [(w, truth[w]) for w in range(-2, 5)]  # window 5 ends at pane 7: still open
    for op in (jvm, python):
        assert [(n.time, n.records) for n in op.notes] == want
        assert [n.results for n in op.notes] == [count for _, count in want]
        idents = [(n.control_offset, n.control_index) for n in op.notes]
        assert idents == sorted(set(idents))
    # a scan resuming after any pane notification hands out the windows a whole scan does
    whole = ControlScanner(config.kafka.bootstrap, config.acker.control_topic(sub), sub, config)
    windows = whole.between(0, whole.latest(0))
    assert [n.time for n in windows] == [w for w, _ in want]
    for start in sorted({n.control_offset + 1 for n in windows}):
        resumed = ControlScanner(whole.bootstrap, whole.topic, sub, config)
        assert resumed.between(start, whole.latest(0)) == [
            n for n in windows if n.control_offset >= start]
        resumed.close()
    whole.close()
