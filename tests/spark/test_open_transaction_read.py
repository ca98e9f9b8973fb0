"""A firm Spark read over a data partition that a dead publisher's transaction held open.

The victim of tests/integration/test_open_transactions.py dies inside its commit with a record
on a data partition the live sources keep writing: every epoch's offset ranges there lie
behind (or around) its open transaction.  Once the acker fences it (the transaction aborted),
the firm source reads every epoch once, in order, with exactly its committed records, and
never the aborted one.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.conftest import ConfigFactory
from tests.integration.test_acker import AckerThread
from tests.integration.test_open_transactions import EPOCHS, LIVENESS, check, scenario
from tests.spark.test_source import drain

pytestmark = pytest.mark.spark


def test_a_firm_read_passes_a_dead_publishers_transaction(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=LIVENESS,
    )
    sub = config.substreams[0].name
    with AckerThread(config) as a:
        out = scenario(config, [sub], seed=3)
        check(config, [sub], out, [a])
        batches = drain(spark, config.path, sub, tmp_path / "ck")
    assert a.error is None
    rows = [r for _, b in batches for r in b if not r["is_notification"]]
    epochs = [r["epoch_int"] for r in rows]
    assert epochs == sorted(epochs), "epochs in notification order"
    got = Counter((r["epoch_int"], r["user"], r["url"]) for r in rows)
    want = Counter((e, src, url) for e, recs in out.sent[sub].items() for src, url in recs)
    assert got == want
    assert set(epochs) == set(range(EPOCHS))
    assert all(r["url"] != "/v-open" for r in rows)  # the aborted record
