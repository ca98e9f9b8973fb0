"""A Spark firm query survives bad records (issue 43): foreign JSON bytes, a truncated record
and a record of an unregistered schema fingerprint between the good records of its epochs
are dead-lettered with their topic, partition and offset, never reach the operator, and the
query restarted from its checkpoint twice goes on -- where one such record used to fail
every batch after it, restarts included.  Both reads: the JVM's (``from_avro``) and the
source's Python read tasks."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from substreams.config import Config
from substreams.spark import EpochOperator
from substreams.spark.operator import EpochNote
from substreams.spark.runner import run
from tests.conftest import ConfigFactory
from tests.integration.test_poison_records import Poisoned, expected, letters_of, poison
from tests.spark.conftest import output_rows, running_acker, wait_for_epochs
from tests.spark.jobs import out_stream

pytestmark = pytest.mark.spark


class Seen(EpochOperator):
    """One result per epoch: which records it got (each good record must be there once)."""

    key_field = "key"

    def __init__(self) -> None:
        self.notes: list[EpochNote] = []

    def on_notification(self, note: EpochNote) -> None:
        self.notes.append(note)

    def on_epoch(self, epoch: Any, rows: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        return [{"window": int(epoch), "window_start": int(epoch) * 1000,
                 "key": ",".join(str(r["ts"]) for r in sorted(rows, key=lambda r: r["ts"])),
                 "count": len(rows)}]


def _merge(into: Poisoned, more: Poisoned) -> None:
    into.goods += more.goods
    into.bad.update(more.bad)
    into.raw.update(more.raw)


def test_a_firm_query_dead_letters_bad_records_and_goes_on_across_two_restarts(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1}, out_stream("counts", "window_count.avsc"),
         out_stream("pcounts", "window_count.avsc")],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000},
         {"name": "cw", "stream": "counts", "kind": "epoch", "field": "window"},
         {"name": "pw", "stream": "pcounts", "kind": "epoch", "field": "window"}],
    )
    w = config.substreams[0].name
    out, pout = config.streams[1].name, config.streams[2].name
    ckpt = tmp_path / "ck"
    op = Seen()

    def once(cfg: Config, read: str = "jvm", output: str = out, name: str = "poison",
             where: Path = ckpt, operator: Seen = op) -> None:
        run(operator, cfg, w, output, spark=spark, once=True, checkpoint=where,
            query_name=name, read=read)

    with running_acker(config):
        # the first run: two windows, bad records among the good ones of both
        p = poison(config, [10, "json", 20, "truncated", 30, "unregistered", 40, 1010, "json",
                            1020], seal=w, seal_after={40: 0, 1020: 1})
        wait_for_epochs(config, w, 2, timeout=60)
        once(config)
        # restarted from its checkpoint: a window after the bad records
        more = poison(config, [2010, "unregistered", "truncated", 2020], seal=w,
                      seal_after={2020: 2})
        _merge(p, more)
        wait_for_epochs(config, w, 3, timeout=60)
        once(config)
        # restarted again
        more = poison(config, [3010, "json", 3020], seal=w, seal_after={3020: 3})
        _merge(p, more)
        wait_for_epochs(config, w, 4, timeout=60)
        once(config)
        # the same epochs by the source's Python read tasks, another query
        python = Seen()
        once(config, read="python", output=pout, name="poison-py", where=tmp_path / "py",
             operator=python)
        for sub in (config.substreams[1].name, config.substreams[2].name):
            wait_for_epochs(config, sub, 4, timeout=120)

    want = {0: [10, 20, 30, 40], 1: [1010, 1020], 2: [2010, 2020], 3: [3010, 3020]}
    for stream in (out, pout):
        rows = sorted(output_rows(config, stream), key=lambda r: r["window"])
        assert [(r["window"], r["key"], r["count"]) for r in rows] == [
            (win, ",".join(map(str, ts)), len(ts)) for win, ts in want.items()]  # each once
    for notes in (op.notes, python.notes):
        assert [(n.time, n.records) for n in notes] == [(w_, len(ts)) for w_, ts in want.items()]
    # every bad record dead-lettered once per reader run, with its offset and reason
    assert letters_of(config, "spark.poison") == expected(p)
    assert letters_of(config, "spark.source:" + w) == expected(p)
    print("\npoison-record run (Spark firm query, JVM read, 3 runs):")
    print(f"  good records read: {sum(len(ts) for ts in want.values())} "
          f"(per window: {[(win, len(ts)) for win, ts in want.items()]})")
    print(f"  dead-lettered: {len(letters_of(config, 'spark.poison'))}: "
          + ", ".join(f"{config.streams[0].name}[0]@{o} {r}"
                      for o, r, _ in letters_of(config, "spark.poison")))
