import time, sys
from pathlib import Path
import pytest
from substreams.spark.runner import run
from tests.spark.conftest import publish_windows
from substreams.frontier import Time

pytestmark = pytest.mark.spark

def count(epoch, rows):
    return [{"user": "x", "url": str(len(rows)), "ts": epoch}]

def test_dbg(spark, make_config, tmp_path):
    config = make_config([{"name": "clicks", "partitions": 2}, {"name": "out", "partitions": 2}],
                         [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}])
    w = config.substreams[0].name
    publish_windows(config, w, [(0, 5), (1, 3)])
    t = time.time()
    notes = []
    from substreams.spark.operator import FunctionOperator
    op = FunctionOperator(count, on_notification=notes.append)
    run(op, config, w, config.streams[1].name, checkpoint=tmp_path / "ck", once=True, spark=spark, query_name="dbg")
    print("took", time.time() - t, notes, file=sys.stderr)
