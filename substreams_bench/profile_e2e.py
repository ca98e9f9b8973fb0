"""Where the wall-clock time of a ``bench throughput`` line goes (issue #16 item 5).

    python -m substreams_bench.profile_e2e --line raw|untracked|acker [--granularity 1] \
        [--api publish|many] [--records 10000] [--batch 5000] [--repeats 3] \
        [--producer linger.ms=5 ...] [--consumer fetch.wait.max.ms=5 ...] [--json OUT]

Runs the benchmark's lines as ``substreams_bench.throughput`` does (same config, records,
readers, acker process, a fresh embedded broker per run) with timestamps at the points the
benchmark cannot see: every commit's start, the end of its flush (records delivered) and its
end (markers written), the last produce, the moment the counting reader's count passes each
commit's records, and every ``EpochComplete``.  Around the timed section it reads CPU time
(``/proc/<pid>/task/*/schedstat``, nanoseconds) of the publishing thread, the reader
threads, librdkafka's threads, the acker process and the broker JVM, and the machine's busy
time (``/proc/stat``), so a line's time can be split into "someone was computing" and
"everyone waited".  Why a copy of the run functions and not the functions themselves: the
timestamps sit between their statements.

``--producer``/``--consumer`` add librdkafka settings to every producer/consumer of this
process (not the acker's), for A/B runs of client settings without editing the defaults.
Run under ``py-spy record --subprocesses --format raw`` for the sampled shares.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from substreams.app import UNTRACKED
from substreams.kafka import client
from substreams.streams.schemas import PREFIX_BYTES, Codec, envelope_schema
from substreams_bench import throughput as tp
from substreams_bench.harness import BenchContext, bench_context
from substreams_bench.observe import AckerObserver, Observer, RecordCounter
from substreams_bench.workload import acker_process, close_all, open_publishers, record

TICK = os.sysconf("SC_CLK_TCK")
BROKER_GROUPS = (
    ("JIT compilers", ("C1 Compiler", "C2 Compiler", "C1 CompilerThre", "C2 CompilerThre")),
    ("GC", ("GC ", "G1 ")),
    ("request handlers and network", ("data-plane-kafk",)),
)
"""Broker thread names (``/proc/<pid>/task/*/comm``, 15 characters) by what they do."""


def _task_ns(pid: int | str) -> dict[int, tuple[str, int]]:
    """CPU nanoseconds per thread of ``pid`` (schedstat's first field), with its name."""
    out: dict[int, tuple[str, int]] = {}
    base = Path(f"/proc/{pid}/task")
    with contextlib.suppress(OSError):
        for d in base.iterdir():
            with contextlib.suppress(OSError, ValueError):
                ns = int((d / "schedstat").read_text().split()[0])
                out[int(d.name)] = ((d / "comm").read_text().strip(), ns)
    return out


def _machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]
    total = sum(vals[:8])
    return total - idle, total


@dataclass
class CpuSnap:
    me: dict[int, tuple[str, int]]
    acker: dict[int, tuple[str, int]]
    broker: dict[int, tuple[str, int]]
    busy: int
    total: int

    @classmethod
    def take(cls, acker: int | None, broker: int | None) -> CpuSnap:
        busy, total = _machine_busy()
        return cls(
            _task_ns("self"),
            _task_ns(acker) if acker else {},
            _task_ns(broker) if broker else {},
            busy,
            total,
        )


def cpu_split(a: CpuSnap, b: CpuSnap, publisher: int, readers: set[int]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, by who spent them."""

    def delta(x: dict[int, tuple[str, int]], y: dict[int, tuple[str, int]]) -> dict[int, float]:
        return {t: (ns - x.get(t, ("", 0))[1]) / 1e9 for t, (_, ns) in y.items()}

    me = delta(a.me, b.me)
    names = {t: n for t, (n, _) in b.me.items()}
    out = {
        "publisher thread": me.get(publisher, 0.0),
        "reader threads": sum(v for t, v in me.items() if t in readers),
        "librdkafka threads": sum(v for t, v in me.items() if names[t].startswith("rdk:")),
    }
    out["other threads (this process)"] = sum(me.values()) - sum(out.values())
    out["acker process"] = sum(delta(a.acker, b.acker).values())
    broker = delta(a.broker, b.broker)
    bnames = {t: n for t, (n, _) in b.broker.items()}
    out["broker JVM"] = sum(broker.values())
    for group, prefixes in BROKER_GROUPS:
        out[f"  broker: {group}"] = sum(
            v for t, v in broker.items() if bnames[t].startswith(prefixes)
        )
    top: dict[str, float] = {}
    for t, v in broker.items():
        top[bnames[t]] = top.get(bnames[t], 0.0) + v
    for name, v in sorted(top.items(), key=lambda kv: -kv[1])[:6]:
        out[f"    broker thread {name!r}"] = v
    ours = sum(v for k, v in out.items() if not k.startswith("  "))
    busy = (b.busy - a.busy) / TICK
    out["machine busy (all processes)"] = busy
    out["other processes"] = max(0.0, busy - ours)
    return out


@dataclass
class Timeline:
    """Wall-clock marks of one run, relative to its ``t0``."""

    t0: float = 0.0
    marks: list[tuple[float, str]] = field(default_factory=list)
    produced: int = 0
    """Records handed to the publisher so far (set by the publish loop)."""
    commits: list[dict[str, float | int]] = field(default_factory=list)

    def mark(self, what: str) -> float:
        now = time.time()
        self.marks.append((now, what))
        return now


@contextlib.contextmanager
def instrumented(tl: Timeline) -> Iterator[None]:
    """Time every ``client.commit_transaction`` and ``client.flush_producer`` the publisher
    makes (it calls them through the module, so wrapping the module's functions suffices).
    The commit is split into librdkafka's implicit flush (records delivered: acks=all) and
    the rest (EndTxn: the coordinator writes the markers)."""
    commit, flush = client.commit_transaction, client.flush_producer

    def timed_commit(
        producer: Any,
        what: str,
        patience: float = client.COMMIT_PATIENCE_S,
        call_timeout: float = client.commit_timeout(None),
    ) -> None:
        start = time.time()
        producer.flush(30)
        flushed = time.time()
        commit(producer, what, patience, call_timeout)
        tl.commits.append(
            {"start": start, "flushed": flushed, "end": time.time(), "records": tl.produced}
        )

    def timed_flush(producer: Any, what: str, patience: float = client.COMMIT_PATIENCE_S) -> None:
        start = time.time()
        flush(producer, what, patience)
        tl.marks.append((start, "delivery flush start"))
        tl.marks.append((time.time(), "delivery flush end"))

    client.commit_transaction = timed_commit  # type: ignore[assignment]
    client.flush_producer = timed_flush  # type: ignore[assignment]
    try:
        yield
    finally:
        client.commit_transaction, client.flush_producer = commit, flush  # type: ignore[assignment]


@contextlib.contextmanager
def client_overrides(producer: dict[str, Any], consumer: dict[str, Any]) -> Iterator[None]:
    """Extra librdkafka settings for every producer/consumer this process makes."""
    make_p, make_c = client.producer, client.consumer

    def p(bootstrap: str, config: Any = None, **kw: Any) -> Any:
        return make_p(bootstrap, config, **{**kw, **producer})

    def c(bootstrap: str, config: Any = None, **kw: Any) -> Any:
        return make_c(bootstrap, config, **{**kw, **consumer})

    client.producer, client.consumer = p, c  # type: ignore[assignment]
    try:
        yield
    finally:
        client.producer, client.consumer = make_p, make_c  # type: ignore[assignment]


def _publish(
    tl: Timeline, pub: Any, substream: str | None, n: int, g: int, many: bool
) -> None:
    """``throughput._publish``/``sliced_publish_many`` with the produced count kept in ``tl``."""
    if many:
        sealed = -1
        for lo in range(0, n, tp.SLICE):
            hi = min(n, lo + tp.SLICE)
            tl.produced = hi
            pub.publish_many([record(i, i // g) for i in range(lo, hi)])
            if substream is None:
                continue
            done = (n - 1) // g if hi == n else hi // g - 1
            if done > sealed:
                pub.seal(substream, done, commit=hi == n)
                sealed = done
        return
    for i in range(n):
        tl.produced = i + 1
        pub.publish(record(i, i // g))
        if substream is not None and ((i + 1) % g == 0 or i == n - 1):
            pub.seal(substream, i // g, commit=i == n - 1)


@dataclass
class Run:
    line: str
    seconds: float
    timeline: dict[str, Any]
    cpu: dict[str, float]


def _broker_pid(ctx: BenchContext) -> int | None:
    if ctx.broker is None:
        return None
    return ctx.broker.pid(ctx.broker.nodes[0].node_id)


def _readers(*observers: Observer) -> set[int]:
    return {o._thread.native_id for o in observers if o._thread.native_id is not None}


def _report(
    line: str,
    tl: Timeline,
    end: float,
    counter: RecordCounter,
    notes: AckerObserver | None,
    cpu: dict[str, float],
) -> Run:
    t0 = tl.t0

    def rel(t: float) -> float:
        return round((t - t0) * 1000, 1)

    commits = []
    for c in tl.commits:
        if c["end"] < t0:
            continue  # the registration commit, before the timed section
        k = int(c["records"])
        row = {
            "records": k,
            "start_ms": rel(c["start"]),
            "flushed_ms": rel(c["flushed"]),
            "end_ms": rel(c["end"]),
            "reader_passed_ms": rel(counter.seen[k]) if k in counter.seen else None,
        }
        commits.append(row)
    marks = [(rel(t), w) for t, w in tl.marks if t >= t0]
    timeline: dict[str, Any] = {
        "first_seen_ms": rel(counter.seen[1]) if 1 in counter.seen else None,
        "marks": marks,
        "commits": commits,
        "end_ms": rel(end),
    }
    if notes is not None and notes.seen:
        times = sorted(notes.seen.values())
        timeline["epoch_complete_first_ms"] = rel(times[0])
        timeline["epoch_complete_last_ms"] = rel(times[-1])
        timeline["epoch_completes"] = len(times)
    return Run(line, end - t0, timeline, cpu)


def run_raw(
    ctx: BenchContext, n: int, value: bytes, headers: list[tuple[str, bytes]] | None = None
) -> Run:
    """``throughput.run_raw`` with marks (``headers``: on every record, e.g. the two data
    records carried before they were single-object encoded)."""
    topic = f"b.raw-throughput.{uuid.uuid4().hex[:8]}"
    ctx.topics([(topic, tp.PARTITIONS)])
    producer = client.producer(ctx.bootstrap, None)
    tl = Timeline()
    broker = _broker_pid(ctx)
    with RecordCounter(ctx.bootstrap, None, topic, tp.PARTITIONS) as counter:
        producer.produce(topic, value=value, partition=0)
        producer.flush(10)
        counter.wait_for(1, tp.WAIT_S)
        base = counter.count
        a = CpuSnap.take(None, broker)
        tl.t0 = time.time()
        for i in range(n):
            while True:
                try:
                    producer.produce(
                        topic, value=value, partition=i % tp.PARTITIONS, headers=headers
                    )
                    break
                except BufferError:
                    producer.poll(0.01)
        tl.mark("last produce")
        producer.flush(60)
        tl.mark("flush end (all delivered)")
        end = counter.wait_for(n + base, tp.WAIT_S)
        b = CpuSnap.take(None, broker)
        # the counter counts the warm-up record too: shift so that seen[k] = k-th timed one
        shifted: dict[object, float] = {
            k - base: t for k, t in counter.seen.items() if isinstance(k, int) and k > base
        }
        counter.seen = shifted
        cpu = cpu_split(a, b, threading.get_native_id(), _readers(counter))
        run = _report("raw" if headers is None else "raw+headers", tl, end, counter, None, cpu)
    del producer
    return run


def run_line(ctx: BenchContext, mechanism: str | None, n: int, g: int, many: bool) -> Run:
    """``throughput.run_untracked`` (``mechanism=None``) / ``run_tracked("acker")``."""
    config = tp._config(ctx, mechanism)
    stream = config.streams[0].name
    substream = config.substreams[0].name if mechanism else None
    tl = Timeline()
    broker = _broker_pid(ctx)
    with contextlib.ExitStack() as stack:
        acker_pid = stack.enter_context(acker_process(config, ctx.bootstrap)) if mechanism else None
        stack.enter_context(instrumented(tl))
        kw: dict[str, Any] = {} if mechanism else {"mechanisms": UNTRACKED}
        (pub,) = open_publishers(config, stream, ["src0"], ctx.bootstrap, batch_size=tp.BATCH, **kw)
        stack.callback(close_all, [pub])
        notes = (
            stack.enter_context(AckerObserver(ctx.bootstrap, config, substream))
            if substream
            else None
        )
        counter = stack.enter_context(RecordCounter(ctx.bootstrap, config, stream, tp.PARTITIONS))
        a = CpuSnap.take(acker_pid, broker)
        tl.t0 = time.time()
        _publish(tl, pub, substream, n, g, many)
        tl.mark("last publish returned")
        if substream is None:
            pub.flush()
            tl.mark("final flush returned")
        data_end = counter.wait_for(n, tp.WAIT_S)
        end = data_end
        if notes is not None:
            end = max(end, notes.wait_for((n - 1) // g, tp.WAIT_S))
        b = CpuSnap.take(acker_pid, broker)
        cpu = cpu_split(
            a, b, threading.get_native_id(), _readers(counter, *([notes] if notes else []))
        )
        line = ("acker" if mechanism else "untracked") + (" many" if many else "")
        run = _report(line, tl, end, counter, notes, cpu)
        run.timeline["data_all_seen_ms"] = round((data_end - tl.t0) * 1000, 1)
        del pub
    return run


def _settings(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        k, _, v = item.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def _print(run: Run, n: int) -> None:
    tl = run.timeline
    print(f"\n== {run.line}: {n} records in {run.seconds * 1000:.1f} ms = {n / run.seconds:,.0f}/s")
    print(f"   first record seen by the reader at {tl['first_seen_ms']} ms")
    for ms, what in tl["marks"]:
        print(f"   {ms:9.1f} ms  {what}")
    if tl["commits"]:
        print("   commit  records  start_ms  flushed_ms  end_ms  reader_passed_ms")
        for k, c in enumerate(tl["commits"]):
            print(
                f"   {k:6d} {c['records']:8d} {c['start_ms']:9.1f} {c['flushed_ms']:11.1f} "
                f"{c['end_ms']:7.1f} {c['reader_passed_ms']!s:>17}"
            )
    if "epoch_complete_last_ms" in tl:
        print(
            f"   EpochComplete: {tl['epoch_completes']} seen, first at "
            f"{tl['epoch_complete_first_ms']} ms, last at {tl['epoch_complete_last_ms']} ms; "
            f"all data seen at {tl['data_all_seen_ms']} ms"
        )
    print(f"   end at {tl['end_ms']} ms; CPU seconds in the timed section:")
    for who, s in run.cpu.items():
        print(f"     {who:32s} {s * 1000:8.1f} ms  ({s / run.seconds:.2f} cores)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--line", choices=("raw", "raw+headers", "untracked", "acker"), action="append")
    ap.add_argument("--granularity", type=int, default=1)
    ap.add_argument("--api", choices=("publish", "many"), default="publish")
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=tp.BATCH)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--producer", nargs="*", default=[])
    ap.add_argument("--consumer", nargs="*", default=[])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--same-broker", action="store_true", help="no fresh broker per run")
    ap.add_argument(
        "--warm", type=int, default=0,
        help="records of an untimed untracked run (own topic) on each fresh broker first: "
        "the broker's JIT compiles its produce, transaction and read_committed paths",
    )
    args = ap.parse_args()
    tp.BATCH = args.batch
    runs: list[Run] = []
    lines: list[str] = args.line or ["raw", "untracked", "acker"]
    with (
        bench_context(quick=True) as ctx,
        client_overrides(_settings(args.producer), _settings(args.consumer)),
    ):
        probe = tp._config(ctx, None)
        value = tp._value_bytes(probe)
        # what data records carried before single-object encoding: the writer fingerprint
        # (hex) and the record type, on a value without the 10-byte prefix
        codec = Codec(envelope_schema(probe.streams[0].schema), label="bench")
        headers = [("ss.fp", codec.fingerprint_hex), ("ss.type", b"data")]
        first = True
        for _ in range(args.repeats):
            for line in lines:
                if not first and not args.same_broker:
                    ctx.reset()
                first = False
                if args.warm:
                    tp.run_untracked(ctx, args.warm)
                if line == "raw":
                    run = run_raw(ctx, args.records, value)
                elif line == "raw+headers":
                    run = run_raw(ctx, args.records, value[PREFIX_BYTES:], headers)
                else:
                    mech = "acker" if line == "acker" else None
                    run = run_line(ctx, mech, args.records, args.granularity, args.api == "many")
                _print(run, args.records)
                runs.append(run)
    print(f"\nload average {os.getloadavg()}")
    for line in lines:
        secs = [r.seconds for r in runs if r.line.split()[0] == line]
        if not secs:
            continue
        print(f"{line}: median {args.records / statistics.median(secs):,.0f} records/s "
              f"over {len(secs)} runs: {[round(args.records / s) for s in secs]}")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in runs], indent=1))


if __name__ == "__main__":
    main()
