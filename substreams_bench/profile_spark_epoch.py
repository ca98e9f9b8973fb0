"""Where one epoch's time goes from seal to ``on_epoch`` on the JVM read path.

``python -m substreams_bench.profile_spark_epoch [--epochs N] [--read jvm,python]
[--rounds R]``: an embedded
broker, the acker in its own process and ``bench spark``'s part-(b) firm query alone
(100-record epochs, paced as there), with the runner's DEBUG phase lines captured and
summarised per phase (median, p90, max over the epochs after the warm-up).  Phases (wall
clock, ms): ``seal -> batch`` (acker notification, the source's ``latestOffset`` and
Spark's planning up to ``foreachBatch``), ``notes`` (the batch's notification rows: made
on the driver from the offset log, else collected from the source), ``schemas + plan`` (the
schema topic checked and the batch read planned), ``jobs`` (Kafka read, decode, units,
their commits), ``driver seal`` and ``callbacks``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from substreams.kafka.embedded import KafkaCluster
from substreams_bench.harness import BenchContext
from substreams_bench.spark import _measure

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
        if record.levelno >= logging.WARNING:  # e.g. a fallback to the Python read
            print(f"runner {record.levelname}: {record.getMessage()}")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=21)
    parser.add_argument("--read", default="jvm",
                        help="jvm, python, or both as jvm,python (alternated per round)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every read path, alternating, one broker and session")
    args = parser.parse_args()
    reads = args.read.split(",")
    lines = Lines()
    runner = logging.getLogger("substreams.spark.runner")
    runner.setLevel(logging.DEBUG)
    runner.addHandler(lines)
    console = Console()
    phases: dict[str, dict[str, list[float]]] = {r: {} for r in reads}
    firm: dict[str, list[float]] = {r: [] for r in reads}
    loads: list[float] = []
    names = ("seal -> batch", "jobs (all)", "notes to driver", "driver seal", "callbacks",
             "seal -> callback")
    with tempfile.TemporaryDirectory(prefix="ss-profile-") as tmp, Progress() as progress:
        work = Path(tmp)
        with KafkaCluster(work / "kafka", progress=console.print) as broker:
            ctx = BenchContext(broker.bootstrap, work, False, console, progress, broker)
            for round_ in range(args.rounds):
                for read in reads:
                    who = read if args.rounds == 1 else f"{read}, round {round_ + 1}"
                    lines.lines.clear()
                    loads.append(os.getloadavg()[0])
                    got, _ = _measure(ctx, args.epochs, 100, windowed=False, read=read)
                    firm[read].extend(got)
                    batches: dict[str, list[float]] = {}
                    for text in lines.lines:
                        if m := PHASES.search(text):
                            for name, value in zip(names, m.groups(), strict=True):
                                batches.setdefault(name, []).append(float(value))
                        if m := JVM.search(text):
                            for name, value in zip(("  of which: notes collect",
                                                    "  schemas + plan",
                                                    "  read + decode + units"),
                                                   m.groups(), strict=True):
                                batches.setdefault(name, []).append(float(value))
                    for text in [t for t in lines.lines
                                 if t.startswith("batch notes") or "not found" in t][:3]:
                        print(f"{who}: {text}")
                    first = {n: v[0] for n, v in batches.items() if v}
                    print(f"{who}: the first batch (warm-up, fresh session): "
                          + (", ".join(f"{n.strip()} {v:.0f} ms" for n, v in first.items())
                             or "none timed"))
                    for name, values in batches.items():  # the first batch is the warm-up
                        phases[read].setdefault(name, []).extend(values[1:] or values)
    print(f"# {args.rounds} round(s) of {', '.join(reads)}, {args.epochs} epochs of 100 "
          f"records each; load average (1 min) at each start: "
          f"{', '.join(f'{x:.1f}' for x in loads)}")
    print("| phase | " + " | ".join(f"{r} p50 / p90 / max ms" for r in reads) + " |")
    print("|---|" + "---|" * len(reads))
    order: list[str] = []
    for r in reads:
        order.extend(n for n in phases[r] if n not in order)
    for name in order:
        cells = []
        for r in reads:
            v = phases[r].get(name)
            cells.append(f"{statistics.median(v):.0f} / {_pct(v, 0.9):.0f} / {max(v):.0f}"
                         if v else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for r in reads:
        if firm[r]:
            ms = [x * 1000 for x in firm[r]]
            print(f"seal -> on_notification, {r} read (bench's own clock): p50 "
                  f"{statistics.median(ms):.0f} ms, p99 {_pct(ms, 0.99):.0f} ms, "
                  f"max {max(ms):.0f} ms, n {len(ms)}")


if __name__ == "__main__":
    main()
