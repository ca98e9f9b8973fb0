"""`substreams bench keyed`: one acker shard holding K open sessions (issue #42's targets).

Per K (and records per key R): a session substream (gap 30 s), one source (and, up to
100,000 keys, two sources sharing every key: each session has records of both), K keys x R
records reported to the acks topic (pre-written: the acker alone is measured, as in `bench
acker`'s throughput row), then

* **open**: one acker (in this process, :class:`~substreams.acker.service.AckerService`
  stepped here so that every step is timed) applies them: the step times, the acker's RSS
  above the process's before it started, per open session, and the bytes it wrote per
  transaction (its checkpoint records and every record of the transaction);
* **steady**: with the K sessions open, a trickle of reports for keys already open, one
  ack message a step: step p99, as the acker thread's CPU time (what a live acker holding
  K sessions costs per step; the target) and as wall time (with its heartbeat commits'
  round trips to the broker);
* **close**: one keyed seal that closes every session: from its write to the last
  notification, sessions notified per second, the longest step;
* **recovery**: the acker closed (every step committed its state, as a SIGKILLed one's is)
  and a new one started on the same checkpoint topic, holding the K sessions: the time
  until it serves (the kill drills in the test suite check the same path under SIGKILL).

The baseline in the same run is the smallest K: "flat in K" compares each K's step p99
against it.  Not built: 2 shards of one session substream (acks are routed by substream, so
a session substream has one shard): its target is reported as missed.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

from substreams.acker.protocol import (
    AckEntry,
    AckMessage,
    AckReport,
    Register,
    SealEntry,
    ack_headers,
    encode_ack,
)
from substreams.acker.service import AckerService, relax_gc
from substreams.app import Application
from substreams.config import Config
from substreams.control.messages import OffsetRange
from substreams.frontier import Keyed
from substreams.kafka import client
from substreams.kafka.write import produce
from substreams_bench.harness import (
    BenchContext,
    BenchResult,
    Column,
    Target,
    command_line,
    percentile,
)

NAME = "keyed"
GAP_MS = 30_000
PER_MESSAGE = 2_000
"""Entries per pre-written ack message (~120 KB: what a publisher's agent sends per flush
at most once it splits its acks)."""
RECORD_LIMIT = 256_000
STEP_P99_MS = 20.0
CLOSE_PER_S = 35_000
RECOVERY_S = 5.0
RSS_PER_SESSION = 300
STEADY_STEPS = 200
"""Steps of the steady phase (one 10-entry message each; a heartbeat commit every 500 ms)."""

COLUMNS = [
    Column("keys", "open sessions", "{:,}"),
    Column("records_per_key", "records/key"),
    Column("sources", "sources"),
    Column("open_s", "open: apply s", "{:.1f}"),
    Column("rss_per_session", "RSS B/session", "{:,.0f}"),
    Column("max_record_kb", "max record KB", "{:.1f}"),
    Column("txn_p99_kb", "txn KB p99", "{:.1f}"),
    Column("txn_max_kb", "txn KB max", "{:.1f}"),
    Column("steady_p99_ms", "steady step CPU p99 ms", "{:.1f}"),
    Column("steady_wall_p99_ms", "steady step wall p99 ms", "{:.1f}"),
    Column("open_step_max_ms", "longest step ms (open)", "{:.0f}"),
    Column("close_s", "seal -> last note s", "{:.2f}"),
    Column("close_per_s", "sessions/s", "{:,.0f}"),
    Column("close_step_max_ms", "longest step ms (close)", "{:.0f}"),
    Column("recovery_s", "recovery s", "{:.2f}"),
    Column("notified", "notified"),
]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _config(ctx: BenchContext) -> Config:
    return ctx.config(
        [("bench", 1)],
        [{"name": "sessions", "stream": "bench", "kind": "session", "key": "body",
          "field": "ts", "gap_ms": GAP_MS}],
        # the pre-written source sends nothing while a million sessions close: not evicted
        acker={"heartbeat_ms": 500, "source_timeout_ms": 3_600_000},
    )


class _Acks:
    """The acks topic of one run, written as a source's agent would (one ack message per
    flush), with the sequence numbers the acker's exactly-once rule wants."""

    def __init__(self, config: Config, bootstrap: str, sources: int = 1) -> None:
        self.config, self.bootstrap = config, bootstrap
        self.sub = config.substreams[0].name
        self.sources = [f"src{i}" for i in range(sources)]
        self.seqs = dict.fromkeys(self.sources, 1)
        settings: dict[str, Any] = {"linger.ms": 20}
        self._producer = client.producer(bootstrap, config, **settings)

    def send(self, body: Any, source: str = "src0") -> None:
        produce(self._producer, self.config.acker.acks_topic,
                encode_ack(AckMessage(source, self.seqs[source], 0, body, "inc")),
                partition=0, headers=ack_headers())
        self.seqs[source] += 1

    def flush(self) -> None:
        self._producer.flush(120)

    def sessions(self, keys: int, per_key: int) -> int:
        """Register every source, then K x R reports (a data record each, offsets in order),
        the records of every key dealt round the sources (sources sharing keys: each
        session has records of several); how many ack messages that made."""
        first = sum(self.seqs.values())
        for src in self.sources:
            self.send(Register((self.sub,), writer=f"bench-{src}"), src)
        pending: dict[str, list[AckEntry]] = {src: [] for src in self.sources}
        offset = 0
        n = len(self.sources)
        for r in range(per_key):
            for k in range(keys):
                src = self.sources[(k + r) % n]
                entries = pending[src]
                entries.append(AckEntry(self.sub, Keyed(f"user-{k:08d}", 1_000 + r * 10), 0, 1,
                                        2, (OffsetRange("bench", 0, offset, offset + 1),)))
                offset += 1
                if len(entries) == PER_MESSAGE:
                    self.send(AckReport(tuple(entries), ()), src)
                    entries.clear()
        for src, entries in pending.items():
            if entries:
                self.send(AckReport(tuple(entries), ()), src)
        self.flush()
        return sum(self.seqs.values()) - first

    def close_all(self) -> None:
        """Every source's keyed seal past every session's end + gap."""
        for src in self.sources:
            self.send(AckReport((), (SealEntry(self.sub, 10**12, 1, True),)), src)
        self.flush()


def _step(
    service: AckerService, sizes: list[list[int]], times: list[float],
    cpu: list[float] | None = None,
) -> int:
    """One timed step (wall; and the acker thread's CPU into ``cpu``); the sizes of the
    records its transaction wrote, if it wrote one."""
    writer = service._writer  # the bench reads what was written
    before = None if writer is None else writer.last_sizes
    t0, c0 = time.perf_counter(), time.thread_time()
    applied = service.step(0.01)
    times.append(time.perf_counter() - t0)
    if cpu is not None:
        cpu.append(time.thread_time() - c0)
    writer = service._writer
    if writer is not None and writer.last_sizes is not before:
        sizes.append(list(writer.last_sizes))
    return applied


def _apply_all(service: AckerService, messages: int, sizes: list[list[int]],
               times: list[float]) -> None:
    applied = 0
    deadline = time.perf_counter() + 1800
    while applied < messages and time.perf_counter() < deadline:
        applied += _step(service, sizes, times)
    while any(t.dirty for t in service.state.tables.values()):
        _step(service, sizes, times)


def one(ctx: BenchContext, keys: int, per_key: int, sources: int = 1) -> dict[str, Any]:
    config = _config(ctx)
    acks = _Acks(config, ctx.bootstrap, sources)
    messages = acks.sessions(keys, per_key)
    gc.collect()
    idle = _rss()
    service = Application(config, ctx.bootstrap).acker(max_batch=50)
    sizes: list[list[int]] = []
    open_steps: list[float] = []
    service.start()
    service.serve_commands()
    t0 = time.perf_counter()
    _apply_all(service, messages, sizes, open_steps)
    open_s = time.perf_counter() - t0
    gc.collect()
    held = _rss() - idle
    # steady: one small message a step, for keys already open
    steady: list[float] = []
    steady_cpu: list[float] = []
    for i in range(STEADY_STEPS):
        acks.send(AckReport(tuple(
            AckEntry(acks.sub, Keyed(f"user-{(i * 13 + j) % keys:08d}", 1_000), 0, 0, 1, ())
            for j in range(10)
        ), ()))
        acks.flush()
        until = time.perf_counter() + 10
        while time.perf_counter() < until:
            times: list[float] = []
            cpu: list[float] = []
            if _step(service, sizes, times, cpu):
                steady.extend(times)
                steady_cpu.extend(cpu)
                break
    # close: one keyed seal past every session's end + gap
    before = service.notifications
    close_steps: list[float] = []
    acks.close_all()
    t1 = time.perf_counter()
    deadline = t1 + 1800
    while service.notifications - before < keys and time.perf_counter() < deadline:
        _step(service, sizes, close_steps)
    close_s = time.perf_counter() - t1
    notified = service.notifications - before
    service.close()
    records = [n for txn in sizes for n in txn]
    txns = [sum(txn) for txn in sizes]
    return {
        "measurement": f"{keys:,} sessions x {per_key} records, {sources} source(s)",
        "keys": keys,
        "records_per_key": per_key,
        "sources": sources,
        "samples": len(open_steps),
        "open_s": round(open_s, 2),
        "rss_per_session": round(held / keys, 1),
        "max_record_kb": round(max(records, default=0) / 1000, 1),
        "txn_p99_kb": round(percentile(txns, 99) / 1000, 1),
        "txn_max_kb": round(max(txns, default=0) / 1000, 1),
        "steady_p99_ms": round(percentile(steady_cpu, 99) * 1000, 2),
        "steady_wall_p99_ms": round(percentile(steady, 99) * 1000, 2),
        "open_step_p99_ms": round(percentile(open_steps, 99) * 1000, 1),
        "open_step_max_ms": round(max(open_steps) * 1000, 1),
        "close_s": round(close_s, 3),
        "close_per_s": round(notified / close_s, 1) if close_s else None,
        "close_step_max_ms": round(max(close_steps, default=0) * 1000, 1),
        # on the state of K open sessions: a second run whose acker stops before the seal
        "recovery_s": _recovery(ctx, keys, per_key, sources),
        "notified": notified,
        "expected_notifications": keys,
        "notifications": notified,
    }


def _recovery(ctx: BenchContext, keys: int, per_key: int, sources: int = 1) -> float | None:
    ctx.reset()
    config = _config(ctx)
    messages = _Acks(config, ctx.bootstrap, sources).sessions(keys, per_key)
    service = Application(config, ctx.bootstrap).acker(max_batch=50)
    service.start()
    _apply_all(service, messages, [], [])
    time.sleep(0.6)
    service.step(0.01)  # a heartbeat: every step committed its state
    service.close()
    del service
    gc.collect()
    again = Application(config, ctx.bootstrap).acker(max_batch=50)
    t0 = time.perf_counter()
    again.start()
    took = time.perf_counter() - t0
    held = sum(len(t.open) for t in again.state.tables.values())  # one entry a session
    again.close()
    return round(took, 3) if held == keys else None


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label, columns=COLUMNS)
    ctx.label = NAME
    relax_gc()
    grid = ctx.keys or ([1_000, 5_000] if ctx.quick else [1_000, 10_000, 100_000])
    per_keys = [3] if ctx.quick else [3, 100]
    # Smallest first, by open times: RSS above the process's before a run is only meaningful
    # when no larger run came before it (freed memory is kept by the allocator and reused).
    # ... and 2 sources sharing every key (each session has records of both, both must
    # seal) for the first records-per-key, up to 100,000 keys.
    runs = [(k, r, 1) for r in per_keys for k in grid if k * r <= 3_000_000]
    runs += [(k, per_keys[0], 2) for k in grid if k <= 100_000]
    runs.sort(key=lambda kr: (kr[0] * kr[1], kr[1], kr[2]))
    for keys, per_key, sources in ctx.track(
        runs, lambda kr: f"{kr[0]:,} keys x {kr[1]}, {kr[2]} source(s)"
    ):
        result.rows.append(one(ctx, keys, per_key, sources))
    rows = [r for r in result.rows
            if r["records_per_key"] == per_keys[0] and r.get("sources", 1) == 1]
    big = max(rows, key=lambda r: r["keys"])
    small = min(rows, key=lambda r: r["keys"])
    longest = max(max(r["open_step_max_ms"], r["close_step_max_ms"]) for r in result.rows)
    result.targets += [
        Target(f"RSS per open session ({big['keys']:,} sessions)", f"<= {RSS_PER_SESSION} B",
               f"{big['rss_per_session']:,.0f} B", big["rss_per_session"] <= RSS_PER_SESSION),
        Target("largest record written (every K)", f"<= {RECORD_LIMIT // 1000} KB",
               f"{max(r['max_record_kb'] for r in result.rows):.1f} KB",
               max(r["max_record_kb"] for r in result.rows) * 1000 <= RECORD_LIMIT),
        Target(f"step p99 (acker thread CPU) while {big['keys']:,} sessions are open",
               f"<= {STEP_P99_MS:g} ms",
               f"{big['steady_p99_ms']:.1f} ms", big["steady_p99_ms"] <= STEP_P99_MS),
        Target("step p99 flat in K (largest / smallest K)", "<= 1.2 x",
               f"{big['steady_p99_ms'] / max(small['steady_p99_ms'], 1e-9):.2f} x",
               big["steady_p99_ms"] <= 1.2 * small["steady_p99_ms"]),
        Target(f"sessions notified per second ({big['keys']:,} closed by one seal)",
               f">= {CLOSE_PER_S:,} /s", f"{big['close_per_s'] or 0:,.0f} /s",
               (big["close_per_s"] or 0) >= CLOSE_PER_S),
        Target(f"recovery holding {big['keys']:,} open sessions", f"<= {RECOVERY_S:g} s",
               "-" if big["recovery_s"] is None else f"{big['recovery_s']:.2f} s",
               None if big["recovery_s"] is None else big["recovery_s"] <= RECOVERY_S),
        Target("longest step (any K, any phase) within the heartbeat", "<= 500 ms",
               f"{longest:,.0f} ms", longest <= 500),
        Target("2 shards against one (one session substream)", ">= 1.7 x",
               "not built: a session substream has one shard", False),
    ]
    for r in result.rows:
        if r["notified"] != r["keys"]:
            result.notes.append(f"{r['measurement']}: {r['notified']} of {r['keys']} notified")
    result.notes.append(
        f"one process: the acker stepped in this process (its steps timed here), the broker "
        f"a JVM on the same {os.cpu_count()} CPUs (1-minute load {os.getloadavg()[0]:.1f} at "
        "the end); acks pre-written, 2,000 entries a message; RSS is the process's above "
        "its own before the acker started"
    )
    return result


def plot(result: BenchResult, path: Path) -> None:
    """Sessions/s and steady step p99 against K."""
    import matplotlib.pyplot as plt

    rows = [r for r in result.rows if r["records_per_key"] == 3 and r.get("sources", 1) == 1]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4))
    ks = [r["keys"] for r in rows]
    a.plot(ks, [r["close_per_s"] or 0 for r in rows], marker="o")
    a.axhline(CLOSE_PER_S, linestyle="--", color="grey")
    a.set_xscale("log")
    a.set_xlabel("open sessions")
    a.set_ylabel("sessions notified / s")
    b.plot(ks, [r["steady_p99_ms"] for r in rows], marker="o")
    b.axhline(STEP_P99_MS, linestyle="--", color="grey")
    b.set_xscale("log")
    b.set_xlabel("open sessions")
    b.set_ylabel("steady step p99 ms")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

