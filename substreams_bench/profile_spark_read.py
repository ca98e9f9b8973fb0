"""CPU time per record of the firm Spark read path's Python stages, without Kafka or Spark.

``python -m substreams_bench.profile_spark_read [--records N]``: the stages a record goes through
between the Kafka consumer and the operator, before (row tuples, PySpark's tuple -> Arrow
conversion, ``to_pylist`` and ``groups`` in the unit task, the per-row ``WindowCounts``) and
after the columnar path (``epoch_batch``, ``arrow_groups``, ``ArrowWindowCounts``), each
timed with ``time.process_time`` (bench/README.md section 4, "Where the time goes").
"""

from __future__ import annotations

import argparse
import time
import types
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from substreams.control.messages import OffsetRange
from substreams.spark.columnar import arrow_groups
from substreams.spark.offsets import Notification
from substreams.spark.operator import apply_operator, groups
from substreams.spark.schema import PayloadLayout, row
from substreams.spark.source import (
    SOURCE_NAME,
    _marker_meta,
    _record_meta,
    arrow_schema,
    epoch_batch,
)
from substreams.streams.records import Entry, times_from_wire, times_to_wire
from substreams.streams.schemas import Codec, envelope_schema
from substreams_bench.spark import ArrowWindowCounts, WindowCounts, _key_body

SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "ts", "type": "long"}, {"name": "batch", "type": "long"},
    {"name": "body", "type": "string"}]}


class _Source:
    @staticmethod
    def name() -> str:
        return SOURCE_NAME


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    n = parser.parse_args().records

    def timed(label: str, fn: Callable[[], Any]) -> Any:
        t0 = time.process_time()
        out = fn()
        print(f"{label:62s} {(time.process_time() - t0) * 1e6 / n:7.2f} us/record")
        return out

    layout = PayloadLayout(types.SimpleNamespace(name="s", schema=SCHEMA))  # type: ignore[arg-type]
    codec = Codec(envelope_schema(SCHEMA))
    t = 3
    wire = times_to_wire({"w": t})
    recs = [
        codec.encode({"order_key": i, "tracking_id": i, "source": "src0", "times": wire,
                      "payload": {"ts": i, "batch": 0, "body": _key_body(i)}})
        for i in range(n)
    ]

    def decode() -> list[Entry]:
        out = []
        for i, b in enumerate(recs):
            rec = codec.decode(b, codec.fingerprint_hex)
            out.append(Entry("s", 0, i, rec["order_key"], rec["tracking_id"], rec["source"],
                             times_from_wire(rec["times"]), rec["payload"]))
        return out

    entries = timed("decode (Codec.decode + times_from_wire + Entry)", decode)
    note = Notification(5, t, (OffsetRange("s", 0, 0, n),), n, 1, None, 0)
    timed("sort by (order_key, partition, index)",
          lambda: sorted(entries, key=lambda e: (e.order_key, e.partition, e.index)))
    rows = timed("before: row tuples (row + _record_meta)",
                 lambda: [row(layout, e.payload, _record_meta(t, e, note)) for e in entries]
                 + [row(layout, None, _marker_meta(note))])
    timed("before: PySpark tuples -> Arrow (records_to_arrow_batches)",
          lambda: list(records_to_arrow_batches(iter(rows), 10_000, layout.struct(),
                                                _Source())))  # type: ignore[arg-type]
    schema = arrow_schema(layout)
    batch = timed("after: epoch_batch", lambda: epoch_batch(layout, schema, note, entries, True))
    batches = pa.Table.from_batches([batch]).to_batches(max_chunksize=10_000)
    pylist = timed("before: to_pylist (unit task)",
                   lambda: [r for b in batches for r in b.to_pylist()])
    grouped = timed("before: groups (row order check, strip)", lambda: list(groups(pylist)))
    timed("before: WindowCounts.on_epoch (Counter)",
          lambda: list(apply_operator(WindowCounts(1000), iter(grouped))))
    columnar = timed("after: arrow_groups", lambda: list(arrow_groups(batches)))
    timed("after: ArrowWindowCounts.on_epoch_table",
          lambda: list(apply_operator(ArrowWindowCounts(1000), iter(columnar))))


if __name__ == "__main__":
    main()
