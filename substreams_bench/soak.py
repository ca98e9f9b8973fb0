"""Benchmark 6: soak -- a sustained workload for N minutes; does anything grow or slow down?

Set-up on one broker: an ``epoch`` substream tracked by the acker (its own process), a
publisher in its own process sealing an epoch every ``EPOCH_RECORDS`` records, and a firm
Spark query (``substreams.spark.run``, ``local[2]``, in this process) that notes when each
epoch reaches ``on_epoch``.  First the publisher runs flat out for a few seconds (the
baseline: the maximum tracked rate on this machine, in this run); then it is paced at half
that rate for ``--minutes``.

Every ``--sample-s`` seconds a sample row records: the resident set size of the acker, of the
publisher, of this process (the Spark driver's Python side) and of Spark's JVM (from
``/proc``: no extra dependency), the epochs sealed / notified by the acker / seen by Spark so
far, notifications per second in the interval, and the p99 latency of the epochs notified in
the interval (seal -> EpochComplete, and seal -> on_epoch).

Targets (after a warm-up of the first fifth of the run): acker and publisher RSS grow by at
most 10 %; no sealed epoch is missed (by the acker or by Spark); p99 steady: the last third's
p99 seal -> EpochComplete is at most 1.5x the first third's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from substreams_bench.harness import (
    BenchContext,
    BenchError,
    BenchResult,
    Column,
    Target,
    command_line,
    ms,
    percentile,
    save_figure,
    titled,
)
from substreams_bench.observe import AckerObserver
from substreams_bench.workload import acker_process

NAME = "soak"
EPOCH_RECORDS = 100
MAX_RATE_S = 8.0
RSS_GROWTH = 0.10
P99_DRIFT = 1.5


def rss_mb(pid: int) -> float | None:
    """Resident set size of ``pid`` in MB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


# -- the publisher process ----------------------------------------------------------------


def publish_main(argv: list[str]) -> None:
    """``python -m substreams_bench.soak CONFIG BOOTSTRAP RATE SECONDS FIRST``: publish epochs
    ``FIRST``, ``FIRST + 1``... of ``EPOCH_RECORDS`` records at ``RATE`` records/s (0: flat out)
    for ``SECONDS``, sealing each with its commit; print ``seal EPOCH UNIX_TIME`` per epoch and
    ``rate R`` at the end.  A later run of the same source id goes on after what it sealed."""
    from substreams.app import Application
    from substreams.config import load_config

    path, bootstrap, rate, seconds = argv[0], argv[1], float(argv[2]), float(argv[3])
    first = int(argv[4])
    config = load_config(path)
    stream, substream = config.streams[0].name, config.substreams[0].name
    body = "x" * 100
    with Application(config, bootstrap).publisher(stream, "soak", batch_size=10_000) as pub:
        t0 = time.monotonic()
        epoch, sent = first, 0
        while time.monotonic() - t0 < seconds:
            for _ in range(EPOCH_RECORDS):
                pub.publish({"ts": epoch * EPOCH_RECORDS + sent % EPOCH_RECORDS,
                             "batch": epoch, "body": body})  # fmt: skip
                sent += 1
            sealed_at = time.time()
            pub.seal(substream, epoch)
            print(f"seal {epoch} {sealed_at:.6f}", flush=True)
            epoch += 1
            if rate > 0:
                ahead = sent / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        print(f"rate {sent / (time.monotonic() - t0):.1f}", flush=True)


class _PublisherProcess:
    """The publisher subprocess and what it printed (seal moments, its rate)."""

    def __init__(
        self, ctx: BenchContext, config_path: Path, rate: float, seconds: float, first: int = 0
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "substreams_bench.soak", str(config_path), ctx.bootstrap,
             str(rate), str(seconds), str(first)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.sealed: dict[int, float] = {}
        self.rate: float | None = None
        self._thread = threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, out: IO[bytes] | None) -> None:
        assert out is not None
        for raw in out:
            parts = raw.decode().split()
            if parts and parts[0] == "seal":
                self.sealed[int(parts[1])] = float(parts[2])
            elif parts and parts[0] == "rate":
                self.rate = float(parts[1])

    def wait(self, timeout: float) -> None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            self.proc.kill()
            what = f"bench soak: the publisher did not finish in {timeout:.0f} s"
            raise BenchError(what) from exc
        self._thread.join(5)
        if code != 0:
            raise BenchError(f"bench soak: the publisher exited with {code}")


# -- the run --------------------------------------------------------------------------------


def run(ctx: BenchContext) -> BenchResult:
    minutes = ctx.minutes if ctx.minutes is not None else (1.0 if ctx.quick else 30.0)
    sample_s = ctx.sample_s if ctx.sample_s is not None else (5.0 if ctx.quick else 30.0)
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label)
    result.columns = [
        Column("t_s", "t s", "{:.0f}"),
        Column("acker_rss_mb", "acker RSS MB", "{:.1f}"),
        Column("publisher_rss_mb", "publisher RSS MB", "{:.1f}"),
        Column("driver_rss_mb", "driver RSS MB", "{:.1f}"),
        Column("jvm_rss_mb", "Spark JVM RSS MB", "{:.0f}"),
        Column("sealed", "sealed"),
        Column("notified", "notified"),
        Column("spark_seen", "Spark saw"),
        Column("notifications_per_s", "notif./s", "{:.1f}"),
        Column("p99_ms", "p99 seal->notif. ms", "{:.1f}"),
        Column("spark_p99_ms", "p99 seal->on_epoch ms", "{:.0f}"),
    ]
    sub = {"name": "ep", "stream": "s0", "kind": "epoch", "field": "batch", "mechanism": "acker"}
    config = ctx.config([("s0", 2)], [sub])
    substream = config.substreams[0].name
    with contextlib.ExitStack() as stack:
        acker_pid = stack.enter_context(acker_process(config, ctx.bootstrap))
        ctx.log(f"baseline: the tracked publisher flat out for {MAX_RATE_S:.0f} s ...")
        probe = _PublisherProcess(ctx, config.path, 0, MAX_RATE_S)
        probe.wait(MAX_RATE_S + 120)
        if not probe.rate:
            raise BenchError("bench soak: the baseline publisher reported no rate")
        rate = probe.rate / 2
        result.notes.append(
            f"baseline (same run): the acker-tracked publisher flat out reached "
            f"{probe.rate:,.0f} records/s; the soak runs at half: {rate:,.0f} records/s "
            f"({rate / EPOCH_RECORDS:.1f} epochs/s of {EPOCH_RECORDS} records)"
        )
        first_soak_epoch = max(probe.sealed, default=-1) + 1
        observer = AckerObserver(ctx.bootstrap, config, substream)
        stack.enter_context(observer)
        spark_seen, jvm_pid = _start_spark(ctx, config.path, substream, stack)
        ctx.log(f"soak: {minutes:g} min at {rate:,.0f} records/s, a sample every {sample_s:g} s")
        pub = _PublisherProcess(ctx, config.path, rate, minutes * 60, first_soak_epoch)
        task = ctx.progress.add_task("soak", total=minutes * 60)
        t0 = time.monotonic()
        last_t, last_notified = t0, 0
        while pub.proc.poll() is None:
            time.sleep(min(sample_s, 1.0))
            now = time.monotonic()
            ctx.progress.update(task, completed=min(now - t0, minutes * 60))
            if now - last_t < sample_s:
                continue
            row = _sample(
                now - t0, now - last_t, last_notified, acker_pid, pub, jvm_pid, observer,
                spark_seen,
            )  # fmt: skip
            result.rows.append(row)
            last_t, last_notified = now, row["notified"]
        pub.wait(60)
        ctx.progress.remove_task(task)
        sealed = dict(pub.sealed)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            all(e in observer.seen for e in sealed) and all(e in spark_seen for e in sealed)
        ):
            time.sleep(0.5)
        seen, spark = dict(observer.seen), dict(spark_seen)
        missed_acker = [e for e in sealed if e not in seen]
        missed_spark = [e for e in sealed if e not in spark]
    result.targets = _targets(result.rows, len(sealed), missed_acker, missed_spark)
    result.notes.append(
        f"{minutes:g} min, sample every {sample_s:g} s, warm-up = the first fifth of the "
        "samples; RSS from /proc/<pid>/status (VmRSS); the acker and the publisher are their "
        "own processes, the Spark driver (Python side) is this process"
    )
    return result


def _start_spark(
    ctx: BenchContext, path: Path, substream: str, stack: contextlib.ExitStack
) -> tuple[dict[int, float], int | None]:
    """The firm query; returns the moments its ``on_epoch`` saw each epoch, and the JVM pid."""
    from substreams.spark import EpochOperator, run
    from substreams.spark.runner import stop
    from substreams.spark.session import session

    seen: dict[int, float] = {}

    class Probe(EpochOperator):
        def on_epoch(self, epoch: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if isinstance(epoch, int):
                seen.setdefault(epoch, time.time())
            return []

    ctx.log("starting Spark local[2] ...")
    spark = session("substreams-soak", master="local[2]", shuffle_partitions=2)
    query = run(
        Probe(), path, substream, spark=spark, bootstrap=ctx.bootstrap, block=False,
        checkpoint=ctx.workdir / "ckpt-soak",
    )  # fmt: skip
    stack.callback(lambda: stop(query))
    jvm_pid: int | None = None
    with contextlib.suppress(Exception):
        jvm: Any = spark._jvm
        jvm_pid = int(jvm.ProcessHandle.current().pid())
    return seen, jvm_pid


def _sample(
    t: float,
    dt: float,
    last_notified: int,
    acker_pid: int,
    pub: _PublisherProcess,
    jvm_pid: int | None,
    observer: AckerObserver,
    spark_seen: dict[int, float],
) -> dict[str, Any]:
    # Copies first: other threads add to these dicts (dict() is one step under the GIL).
    seals = dict(pub.sealed)
    seen, spark = dict(observer.seen), dict(spark_seen)
    notified = {e: at for e, at in seen.items() if isinstance(e, int) and e in seals}
    fresh = [at - seals[e] for e, at in notified.items() if at > time.time() - dt]
    spark_fresh = [at - seals[e] for e, at in spark.items() if e in seals and at > time.time() - dt]
    return {
        "t_s": round(t, 1),
        "acker_rss_mb": rss_mb(acker_pid),
        "publisher_rss_mb": rss_mb(pub.proc.pid),
        "driver_rss_mb": rss_mb(os.getpid()),
        "jvm_rss_mb": rss_mb(jvm_pid) if jvm_pid is not None else None,
        "sealed": len(seals),
        "notified": len(notified),
        "spark_seen": len([e for e in spark if e in seals]),
        "notifications_per_s": round((len(notified) - last_notified) / dt, 2),
        "p99_ms": ms(percentile(fresh, 99)) if fresh else None,
        "spark_p99_ms": ms(percentile(spark_fresh, 99)) if spark_fresh else None,
    }


def _growth(rows: list[dict[str, Any]], key: str) -> float | None:
    """RSS of the last sample over the RSS at the end of the warm-up, minus 1."""
    values = [r[key] for r in rows if r.get(key) is not None]
    if len(values) < 3:
        return None
    base = values[max(1, len(values) // 5) - 1]
    return float(values[-1]) / float(base) - 1.0


def _targets(
    rows: list[dict[str, Any]], sealed: int, missed_acker: list[int], missed_spark: list[int]
) -> list[Target]:
    out = []
    for who in ("acker", "publisher"):
        g = _growth(rows, f"{who}_rss_mb")
        out.append(
            Target(
                f"{who} RSS growth after warm-up",
                f"<= {RSS_GROWTH:.0%}",
                "n/a" if g is None else f"{g:+.1%}",
                None if g is None else g <= RSS_GROWTH,
            )
        )
    out.append(
        Target(
            "no sealed epoch missed (acker / Spark)",
            "0 / 0",
            f"{len(missed_acker)} / {len(missed_spark)} of {sealed}",
            sealed > 0 and not missed_acker and not missed_spark,
        )
    )
    p99s = [r["p99_ms"] for r in rows[max(1, len(rows) // 5) :] if r.get("p99_ms") is not None]
    third = len(p99s) // 3
    if third:
        first = percentile(p99s[:third], 50)
        last = percentile(p99s[-third:], 50)
        out.append(
            Target(
                "p99 seal->notification steady (last third / first third, medians)",
                f"<= {P99_DRIFT}x",
                f"{last / first:.2f}x ({first:.1f} -> {last:.1f} ms)",
                last / first <= P99_DRIFT,
            )
        )
    else:
        out.append(Target("p99 seal->notification steady", f"<= {P99_DRIFT}x", "n/a", None))
    return out


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    rows = result.rows
    t = [r["t_s"] / 60 for r in rows]
    for key, label in (
        ("acker_rss_mb", "acker"),
        ("publisher_rss_mb", "publisher"),
        ("driver_rss_mb", "Spark driver (Python)"),
    ):
        top.plot(t, [r.get(key) for r in rows], marker=".", label=label)
    top.set_ylabel("RSS (MB)")
    top.legend(fontsize=8)
    bottom.plot(t, [r.get("p99_ms") for r in rows], marker=".", label="seal -> EpochComplete")
    bottom.plot(t, [r.get("spark_p99_ms") for r in rows], marker=".", label="seal -> on_epoch")
    bottom.set_yscale("log")
    bottom.set_ylabel("p99 per sample (ms)")
    bottom.set_xlabel("minutes")
    bottom.legend(fontsize=8)
    top.set_title(titled("Soak: memory and latency over time", result))
    save_figure(fig, path)


if __name__ == "__main__":
    publish_main(sys.argv[1:])
