"""`substreams bench foreign`: exact windows of a topic written by a plain producer.

The same click workload (users ``u0..u49``, event time = the wall clock, 4 partitions,
200 ms tumbling windows sealed by policy: lateness 0; the last records, one window
ahead, seal the rest) goes three ways,
each on a fresh broker with its acker as its own process:

- ``publisher`` (the baseline): our ``Publisher``, one per partition, in a process of its own;
- ``foreign json``: a plain confluent-kafka producer (no transactions, no envelope) writes
  JSON into an existing topic; ``substreams ingest`` (its own process) follows it into the
  tracked stream;
- ``foreign json + SIGKILL``: the same, the ingest process SIGKILLed halfway and restarted.

Per line: records/s written, CPU per record of the writing process (the publisher's, or the
ingest's: the plain producer is the user's own and not counted; each from the moment it is
ready -- publishers open, topic followed --, the kill line's restart included) and of the
broker, window
end -> notification p50/p99 (the moment ``notifications()`` delivers the window minus its end
in event time, which is wall-clock time here), and every window's per-user counts, read
from the notification's records (a firm read), checked against what was produced.
Targets: foreign records per CPU-second >= 0.8x the publisher line's; notification p99
<= 2x the publisher line's (the line without a kill: the kill's restart is in the other's
p99, reported, not judged); 0 wrong windows in every line (the kill changes no count).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer, TopicPartition

from substreams.app import Application
from substreams.config import Config, TopicSpec, load_config
from substreams.streams.records import Entry
from substreams_bench.harness import (
    BenchContext,
    BenchResult,
    Column,
    Target,
    command_line,
    percentile,
    process_cpu_ticks,
    save_figure,
    titled,
)
from substreams_bench.workload import acker_process

PARTITIONS = 4
USERS = 50
SIZE_MS = 200
CLICK: dict[str, Any] = {
    "type": "record", "name": "Click", "namespace": "substreams.bench",
    "fields": [{"name": "user", "type": "string"}, {"name": "url", "type": "string"},
               {"name": "ts", "type": "long"}],
}
MIN_CPU_RATIO = 0.8
MAX_P99_RATIO = 2.0


def _cpu_s(pid: int) -> float:
    return process_cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")


def _config(ctx: BenchContext, foreign: bool) -> Config:
    suffix = uuid.uuid4().hex[:8]
    schema = ctx.workdir / "click.avsc"
    schema.write_text(json.dumps(CLICK))
    stream: dict[str, Any] = {"name": f"b.clicks.{suffix}", "schema": schema.name,
                              "partitions": PARTITIONS}
    if foreign:
        stream["source"] = {"topic": f"b.legacy.{suffix}", "format": "json"}
    doc = {
        "kafka": {"bootstrap": ctx.bootstrap},
        "streams": [stream],
        "substreams": [{"name": f"w.{suffix}", "stream": stream["name"], "kind": "tumbling",
                        "field": "ts", "size_ms": SIZE_MS,
                        "seal": {"lateness_ms": 0, "late": "dead_letter"}}],
        "acker": {"name": f"bench-acker.{suffix}", "acks_topic": f"_b.acks.{suffix}",
                  "control_topic_prefix": f"_b.control.{suffix}.",
                  "command_topic": f"_b.commands.{suffix}",
                  "response_topic": f"_b.responses.{suffix}",
                  "dead_letter_topic": f"_b.dlq.{suffix}"},
    }
    path = ctx.workdir / f"foreign-{suffix}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    config = load_config(path)
    ctx.topics(config.topics())
    if foreign:
        ctx.topics([TopicSpec(stream["source"]["topic"], PARTITIONS)])
    return config


def _click(n: int, ts: int) -> dict[str, Any]:
    return {"user": f"u{n % USERS}", "url": f"/p/{n}", "ts": ts}


def paced(rate: int, seconds: float) -> Any:
    """(n, ts) at ``rate`` records/s for ``seconds``, ts the wall clock in ms (a batch per
    5 ms tick)."""
    total = int(rate * seconds)
    start = time.monotonic()
    n = 0
    while n < total:
        due = int((time.monotonic() - start) * rate) + 1
        now_ms = int(time.time() * 1000)
        batch = [(i, now_ms) for i in range(n, min(due, total))]
        n += len(batch)
        if batch:
            yield batch
        time.sleep(0.005)


def publisher_main(path: str, rate: int, seconds: float, out: str) -> None:
    """The baseline line's writer process: one Publisher per partition (as the ingest has
    one source per input partition), records round-robin over them."""
    config = load_config(path)
    stream = config.streams[0].name
    app = Application(config)
    pubs = [app.publisher(stream, f"pub.{p}", batch_size=500) for p in range(PARTITIONS)]
    written: list[tuple[int, int]] = []
    cpu0 = time.process_time()
    t0 = time.monotonic()
    for batch in paced(rate, seconds):
        by_p: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for n, ts in batch:
            by_p[n % PARTITIONS].append(_click(n, ts))
            written.append((n, ts))
        for p, payloads in by_p.items():
            # committed by the seal policy's seals (each window's end) or every 500
            pubs[p].publish_many(payloads, partitions=[p] * len(payloads))
    # a closing record per partition far enough ahead to seal every window written
    end = (max(ts for _, ts in written) // SIZE_MS + 1) * SIZE_MS
    for p, pub in enumerate(pubs):
        pub.publish(_click(-1 - p, end), partition=p)
        pub.flush()
    elapsed = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    for pub in pubs:
        pub.abort()  # a pause, as the ingest's stop: no Unregister
    Path(out).write_text(json.dumps({"written": written, "seconds": elapsed, "cpu_s": cpu}))


def _produce_foreign(
    config: Config, rate: int, seconds: float
) -> tuple[list[tuple[int, int]], float]:
    source = config.streams[0].source
    assert source is not None
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 5})
    written: list[tuple[int, int]] = []
    t0 = time.monotonic()
    for batch in paced(rate, seconds):
        for n, ts in batch:
            producer.produce(source.topic, json.dumps(_click(n, ts)).encode(),
                             partition=n % PARTITIONS)
            written.append((n, ts))
        producer.poll(0)
    producer.flush(30)
    end = (max(ts for _, ts in written) // SIZE_MS + 1) * SIZE_MS
    for p in range(PARTITIONS):
        producer.produce(source.topic, json.dumps(_click(-1 - p, end)).encode(), partition=p)
    producer.flush(30)
    return written, time.monotonic() - t0


class Observer:
    """``notifications(records=True)`` in a thread: per window its per-user counts and the
    moment it was delivered."""

    def __init__(self, config: Config) -> None:
        self.notes = Application(config).notifications(config.substreams[0].name,
                                                       from_="beginning", records=True)
        self.seen: dict[int, tuple[Counter[str], float]] = {}
        self.twice = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for note in self.notes.poll(0.2):
                at = time.time() * 1000
                if not isinstance(note.time, int):
                    continue
                if note.time in self.seen:
                    self.twice += 1
                users = Counter(e.payload["user"] for e in note.entries if isinstance(e, Entry))
                self.seen[note.time] = (users, at)

    def wait_for(self, windows: set[int], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not windows <= set(self.seen) and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.notes.close()


def _truth(written: list[tuple[int, int]]) -> dict[int, Counter[str]]:
    out: dict[int, Counter[str]] = defaultdict(Counter)
    for n, ts in written:
        out[ts // SIZE_MS][f"u{n % USERS}"] += 1
    return out


def _spawn_ingest(config: Config, log_path: Path) -> subprocess.Popen[bytes]:
    log = open(log_path, "ab")  # noqa: SIM115 (the child owns it)
    return subprocess.Popen(
        [sys.executable, "-m", "substreams", "ingest", "-c", str(config.path), "--stream",
         config.streams[0].name, "--progress", "1"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )


def _wait_registered(config: Config, timeout: float = 60.0) -> None:
    """Until the ingest committed its first offsets (every partition followed)."""
    from substreams.ingest import group_id
    from substreams.kafka import client
    from substreams.kafka.read import Reader

    source = config.streams[0].source
    assert source is not None
    tps = [TopicPartition(source.topic, p) for p in range(PARTITIONS)]
    deadline = time.monotonic() + timeout
    with Reader(client.resolve_bootstrap(config), config,
                **{"group.id": group_id(config.streams[0].name)}) as reader:
        while time.monotonic() < deadline:
            if all(tp.offset >= 0 for tp in reader.committed(tps)):
                return
            time.sleep(0.2)
    raise RuntimeError("the ingest process did not start within 60 s")


def _line(ctx: BenchContext, name: str, rate: int, seconds: float) -> dict[str, Any]:
    foreign = name != "publisher"
    config = _config(ctx, foreign)
    broker = None if ctx.broker is None else ctx.broker.pid(ctx.broker.nodes[0].node_id)
    with contextlib.ExitStack() as stack:
        stack.enter_context(acker_process(config, ctx.bootstrap))
        observer = Observer(config)
        stack.callback(observer.close)
        cpu_s = 0.0
        if foreign:
            log_path = config.path.with_suffix(".ingest.log")
            proc = _spawn_ingest(config, log_path)
            procs = [proc]
            _wait_registered(config)
            # from the moment it follows the topic, as the publisher line's clock starts
            # once its publishers are open (imports and start-up are not per record)
            cpu_s -= _cpu_s(proc.pid)
            b0 = _cpu_s(broker) if broker else 0.0
            kill_at = seconds / 2 if name.endswith("SIGKILL") else None

            out = config.path.with_suffix(".produced.json")
            writer = subprocess.Popen(  # its own process, as another team's service
                [sys.executable, "-m", "substreams_bench.foreign", "produce", str(config.path),
                 str(rate), str(seconds), str(out)], stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            if kill_at is not None:
                time.sleep(kill_at)
                cpu_s += _cpu_s(proc.pid)
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                proc = _spawn_ingest(config, log_path)
                procs.append(proc)
            _, err = writer.communicate(timeout=seconds + 120)
            if writer.returncode:
                raise RuntimeError(f"producer process failed: {err.decode()[-1500:]}")
            doc = json.loads(out.read_text())
            written = [(int(n), int(ts)) for n, ts in doc["written"]]
            elapsed = doc["seconds"]
            truth = _truth(written)
            observer.wait_for(set(truth), 60)
            cpu_s += _cpu_s(proc.pid)
            for p in procs:
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(15)
        else:
            out = config.path.with_suffix(".pub.json")
            b0 = _cpu_s(broker) if broker else 0.0
            pub = subprocess.run(
                [sys.executable, "-m", "substreams_bench.foreign", "publish", str(config.path),
                 str(rate), str(seconds), str(out)], capture_output=True, text=True,
                timeout=seconds + 120,
            )
            if pub.returncode:
                raise RuntimeError(f"publisher process failed: {pub.stderr[-1500:]}")
            doc = json.loads(out.read_text())
            written = [(int(n), int(ts)) for n, ts in doc["written"]]
            elapsed, cpu_s = doc["seconds"], doc["cpu_s"]
            truth = _truth(written)
            observer.wait_for(set(truth), 60)
        broker_s = (_cpu_s(broker) - b0) if broker else None
        seen = dict(observer.seen)
        twice = observer.twice
    lat = [at - (w + 1) * SIZE_MS for w, (_, at) in seen.items() if w in truth]
    wrong = sum(1 for w, want in truth.items() if w not in seen or seen[w][0] != want)
    n = len(written)
    return {
        "line": name, "records": n, "records_per_s": n / elapsed,
        "cpu_us_per_record": cpu_s / n * 1e6, "records_per_cpu_s": n / cpu_s if cpu_s else None,
        "broker_cpu_us_per_record": None if broker_s is None else broker_s / n * 1e6,
        "p50_ms": percentile(lat, 50) if lat else None,
        "p99_ms": percentile(lat, 99) if lat else None,
        "windows": len(truth), "wrong_windows": wrong, "notified_twice": twice,
    }


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult("foreign", ctx.quick, command_line(), ctx.broker_label)
    result.columns = [
        Column("line", "line"),
        Column("records", "records"),
        Column("records_per_s", "records/s", "{:,.0f}"),
        Column("cpu_us_per_record", "writer CPU µs/record", "{:.1f}"),
        Column("records_per_cpu_s", "records/CPU-s", "{:,.0f}"),
        Column("broker_cpu_us_per_record", "broker CPU µs/record", "{:.1f}"),
        Column("p50_ms", "window end→note p50 ms", "{:.1f}"),
        Column("p99_ms", "p99 ms", "{:.1f}"),
        Column("windows", "windows"),
        Column("wrong_windows", "wrong windows"),
        Column("notified_twice", "notified twice"),
    ]
    rate, seconds = (2000, 6.0) if ctx.quick else (4000, 20.0)
    lines = ["publisher", "foreign json", "foreign json + SIGKILL"]
    for name in ctx.track(lines, lambda s: s):
        result.rows.append(_line(ctx, name, rate, seconds))
    base = result.rows[0]
    for row in result.rows[1:]:
        ratio = (row["records_per_cpu_s"] or 0) / (base["records_per_cpu_s"] or 1)
        result.targets.append(Target(f"{row['line']}: records per CPU-s vs publisher",
                                     f">= {MIN_CPU_RATIO}x", f"{ratio:.2f}x",
                                     ratio >= MIN_CPU_RATIO))
        if row["p99_ms"] is not None and base["p99_ms"] and not row["line"].endswith("SIGKILL"):
            p99 = row["p99_ms"] / base["p99_ms"]
            result.targets.append(Target(f"{row['line']}: notification p99 vs publisher",
                                         f"<= {MAX_P99_RATIO}x", f"{p99:.2f}x",
                                         p99 <= MAX_P99_RATIO))
    for row in result.rows:
        bad = row["wrong_windows"] + row["notified_twice"]
        result.targets.append(Target(f"{row['line']}: wrong windows", "0", str(bad), bad == 0))
    result.notes.append(
        f"{rate} records/s for {seconds:.0f} s per line, {PARTITIONS} partitions, "
        f"{SIZE_MS} ms windows, seal policy lateness 0 (no idle_ms: a loaded machine's stalls "
        "would make idle seals, and late records); the writer's CPU "
        "is the publisher process's or the ingest process's (the plain producer is the "
        "user's own); the SIGKILL line's p99 includes the restart")
    return result


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    names = [r["line"] for r in result.rows]
    a.bar(names, [r["cpu_us_per_record"] or 0 for r in result.rows])
    a.set_ylabel("writer CPU µs/record")
    b.bar(names, [r["p99_ms"] or 0 for r in result.rows])
    b.set_ylabel("window end → notification p99 ms")
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(titled("foreign", result))
    save_figure(fig, path)


def producer_main(path: str, rate: int, seconds: float, out: str) -> None:
    """The foreign lines' writer process: a plain producer, as another team's service."""
    written, elapsed = _produce_foreign(load_config(path), rate, seconds)
    Path(out).write_text(json.dumps({"written": written, "seconds": elapsed}))


if __name__ == "__main__":  # the writers' own processes
    main_of = {"publish": publisher_main, "produce": producer_main}[sys.argv[1]]
    main_of(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
