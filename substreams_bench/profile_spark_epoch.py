"""Where one epoch's time goes from seal to ``on_epoch`` on the JVM read path.

``python -m substreams_bench.profile_spark_epoch [--epochs N] [--read jvm|python]``: an embedded
broker, the acker in its own process and ``bench spark``'s part-(b) firm query alone
(100-record epochs, paced as there), with the runner's DEBUG phase lines captured and
summarised per phase (median, p90, max over the epochs after the warm-up).  Phases (wall
clock, ms): ``seal -> batch`` (acker notification, the source's ``latestOffset`` and
Spark's planning up to ``foreachBatch``), ``notes`` (the batch's notification rows
collected from the source), ``schemas + plan`` (the schema topic checked and the batch read
planned), ``jobs`` (Kafka read, decode, units, their commits), ``driver seal`` and
``callbacks``.
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from substreams_bench.harness import BenchContext
from substreams_bench.spark import _measure
from substreams.kafka.embedded import KafkaCluster

PHASES = re.compile(
    r"oldest seal -> batch (\d+) ms, jobs (\d+) ms, notes (\d+) ms, driver seal (\d+) ms, "
    r"callbacks (\d+) ms; seal -> callback (\d+) ms"
)
JVM = re.compile(r"JVM path: notes (\d+) ms, schemas \+ plan (\d+) ms, jobs (\d+) ms")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=21)
    parser.add_argument("--read", choices=("jvm", "python"), default="jvm")
    args = parser.parse_args()
    lines = Lines()
    runner = logging.getLogger("substreams.spark.runner")
    runner.setLevel(logging.DEBUG)
    runner.addHandler(lines)
    console = Console()
    with tempfile.TemporaryDirectory(prefix="ss-profile-") as tmp, Progress() as progress:
        work = Path(tmp)
        with KafkaCluster(work / "kafka", progress=console.print) as broker:
            ctx = BenchContext(broker.bootstrap, work, False, console, progress, broker)
            firm, _ = _measure(ctx, args.epochs, 100, windowed=False, read=args.read)
    phases: dict[str, list[float]] = {}
    names = ("seal -> batch", "jobs (all)", "notes to driver", "driver seal", "callbacks",
             "seal -> callback")
    for text in lines.lines:
        if m := PHASES.search(text):
            for name, value in zip(names, m.groups(), strict=True):
                phases.setdefault(name, []).append(float(value))
        if m := JVM.search(text):
            for name, value in zip(("  of which: notes collect", "  schemas + plan",
                                    "  read + decode + units"), m.groups(), strict=True):
                phases.setdefault(name, []).append(float(value))
    print("| phase | p50 ms | p90 ms | max ms | n |")
    print("|---|---:|---:|---:|---:|")
    for name, values in phases.items():
        values = values[1:] or values  # the first batch is the warm-up
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        print(f"| {name} | {statistics.median(values):.0f} | {p90:.0f} | "
              f"{max(values):.0f} | {len(values)} |")
    if firm:
        ordered = sorted(firm)
        print(f"\nseal -> on_notification (bench's own clock): p50 "
              f"{statistics.median(firm) * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms, "
              f"n {len(firm)}")


if __name__ == "__main__":
    main()
