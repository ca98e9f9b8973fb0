"""The Quix Streams exactly-once producer line of ``bench throughput``, run by path in its own
venv (Quix Streams 3.28 pins ``confluent-kafka<2.13``; ours is 2.16): imports nothing of
substreams.  Protocol on stdin/stdout: it prints ``ready`` once its transactional producer is
initialised and one warm-up record is committed, waits for a line on stdin, writes ``n``
records of the value bytes round-robin over the partitions committing every ``batch``, and
prints ``done <cpu seconds>``: its own CPU time (every thread, librdkafka's too) from the go
to the last commit, which the benchmark counts as client CPU.

Why ``Application.get_producer(transactional=True)``: that is Quix Streams' exactly-once
write path without a consumer in front (its pipeline's producer is the same class, with
offsets sent in the transaction and commits every ``commit_interval``); a user commits
its transactions, here at the publishers' cadence."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("records", type=int)
    parser.add_argument("batch", type=int)
    parser.add_argument("partitions", type=int)
    parser.add_argument("value_file", type=Path)
    args = parser.parse_args()
    from quixstreams import Application  # type: ignore[import-not-found]  # its own venv

    value = args.value_file.read_bytes()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=f"bench-quix-{uuid.uuid4().hex[:8]}",
        processing_guarantee="exactly-once",
        loglevel="WARNING",
    )
    with app.get_producer(transactional=True) as producer:
        producer.begin_transaction()  # also init_transactions (lazily)
        producer.produce(args.topic, value=value, partition=0)
        producer.commit_transaction()
        print("ready", flush=True)
        sys.stdin.readline()
        cpu0 = time.process_time()
        for lo in range(0, args.records, args.batch):
            producer.begin_transaction()
            for i in range(lo, min(args.records, lo + args.batch)):
                producer.produce(args.topic, value=value, partition=i % args.partitions)
            producer.commit_transaction()
        cpu = time.process_time() - cpu0
    print(f"done {cpu:.6f}", flush=True)


if __name__ == "__main__":
    main()
