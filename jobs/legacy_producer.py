"""Another team's service: plain confluent-kafka JSON into `legacy.clicks`, knowing nothing
of substreams (no transactions, no envelope, event times slightly out of order).

    python jobs/legacy_producer.py -c jobs/substreams.foreign.yaml [--rate 200]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from confluent_kafka import Producer

from substreams.config import load_config
from substreams.kafka import client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--stream", default="clicks_json")
    parser.add_argument("--rate", type=int, default=200, help="records per second")
    args = parser.parse_args()
    config = load_config(args.config)
    source = config.stream(args.stream).source
    assert source is not None, f"stream {args.stream} has no source topic"
    producer = Producer({"bootstrap.servers": client.resolve_bootstrap(config)})
    n = 0
    while True:
        now = int(time.time() * 1000)
        click = {"user": f"u{random.randrange(20)}", "url": f"/p/{n}",
                 "ts": now - random.randint(0, 150)}  # out of order, within the lateness
        producer.produce(source.topic, json.dumps(click).encode(), key=click["user"].encode())
        producer.poll(0)
        n += 1
        time.sleep(1 / args.rate)


if __name__ == "__main__":
    main()
