"""Benchmark 2: notification latency, from seal to the notification a subscriber sees.

Per configuration (mechanism, P producers, Q partitions, granularity g records per
substream) and per epoch: the P publishers write the epoch's g records (spread over the
producers, round-robin over partitions); then, at ``t0``, all P seal the epoch at once
(one thread each, like P processes whose epoch timer fires), each seal committing its
publisher's records of the epoch with it (the default path: no ``flush()`` before a seal,
whose transaction would then follow the records' one back to back); the latency is
the moment an observer thread sees the end of the epoch minus the moment the *last* of the P
publishers called ``seal()`` -- the epoch's end, since no notification can precede it:

- acker: the ``EpochComplete`` record on the substream's control topic (the acker runs as
  its own process, ``substreams acker run``, as deployed);
- punctuations: one consumer of all Q partitions whose ``Aligner`` terminates the epoch
  (what ``PunctuatedReader`` does for a subscriber of the whole substream).

Why from the last ``seal()`` call and not from the moment the threads were started: the P
seals of one Python process run one after the other under its GIL (32 of them take ~10 ms
here), a stagger that P processes on P machines would not have.  The latency from the first
seal is kept beside it (``p99_from_first_ms``), so the stagger is visible, not hidden.

Baseline in the same run: raw one-message produce->consume latency (confluent-kafka,
``linger.ms=0``, ``acks=all``) on the same broker.  Publishers and observer share one
Python process (and its GIL): on this 2-core machine that adds noise to both mechanisms.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from substreams.app import Application
from substreams.control.notes import EpochNote
from substreams.errors import SealedTimeError, SubstreamsError
from substreams.kafka import client
from substreams.streams.publisher import Publisher
from substreams_bench.harness import (
    TXN_RETRIES,
    BenchContext,
    BenchError,
    BenchResult,
    Column,
    Target,
    command_line,
    loglog_axes,
    ms,
    percentile,
    save_figure,
    titled,
    txn_retry_fields,
    warmup_s,
)
from substreams_bench.observe import AckerObserver, Observer, PunctuationObserver, RecordCounter
from substreams_bench.workload import (
    acker_process,
    close_all,
    open_publishers,
    parallel,
    record,
)

NAME = "latency"
MECHANISMS = ("acker", "punctuations")
TARGET_P99_MS = 20.0
WAIT_S = 60.0


@dataclass(frozen=True)
class Case:
    mechanism: str
    producers: int
    partitions: int
    granularity: int
    epochs: int


def cases(quick: bool, only: Sequence[tuple[int, ...]] | None = None) -> list[Case]:
    """The grid of P x Q x granularity; ``only`` (``--grid``) replaces its P x Q."""
    if quick:
        grid, grans, epochs = [(1, 1), (8, 8)], [1, 100], 30
    else:
        grid, grans, epochs = [(1, 1), (4, 4), (16, 16), (32, 32)], [1, 10, 100, 1000], 60
    if only:
        grid = [(d[0], d[1]) for d in only]
    return [Case(m, p, q, g, epochs) for m in MECHANISMS for g in grans for p, q in grid]


@dataclass(frozen=True)
class PolicyCase:
    """A click-like workload in real event time, one publisher at ``POLICY_RATE`` records/s
    into ``POLICY_WINDOW_MS`` tumbling windows: sealed by hand as the clock leaves each
    window (``lateness_ms`` None, today's way), or by a seal policy; ``late_share`` of the
    records carry an event time ``late_by_ms`` in the past."""

    lateness_ms: int | None
    late_share: float = 0.0
    late_by_ms: int = 0

    @property
    def label(self) -> str:
        if self.lateness_ms is None:
            return "acker, manual seal()"
        late = (
            f", {self.late_share:.0%} records {self.late_by_ms} ms late" if self.late_share
            else ""
        )
        return f"acker, seal policy lateness {self.lateness_ms} ms{late}"


POLICY_RATE = 1000
POLICY_WINDOW_MS = 200


def policy_cases() -> list[PolicyCase]:
    return [
        PolicyCase(None),
        PolicyCase(0),
        PolicyCase(500, 0.02, 300),
        PolicyCase(100, 0.02, 300),
    ]


@dataclass
class Samples:
    """Per epoch, seconds from the last and from the first ``seal()`` call to the
    notification; ``error``: what cut the run short (an epoch whose end was never seen)."""

    from_last: list[float]
    from_first: list[float]
    error: str | None = None
    warmup: int = 0
    """Epochs run and discarded first (:data:`~substreams_bench.harness.WARMUP_S`)."""


def measure(ctx: BenchContext, case: Case) -> Samples:
    sub = {
        "name": "ep",
        "stream": "s0",
        "kind": "epoch",
        "field": "batch",
        "mechanism": case.mechanism,
    }
    config = ctx.config([("s0", case.partitions)], [sub])
    stream = config.streams[0].name
    substream = config.substreams[0].name
    out = Samples([], [])
    with contextlib.ExitStack() as stack:
        if case.mechanism == "acker":
            stack.enter_context(acker_process(config, ctx.bootstrap))
        observer: Observer = stack.enter_context(
            AckerObserver(ctx.bootstrap, config, substream)
            if case.mechanism == "acker"
            else PunctuationObserver(ctx.bootstrap, config, substream)
        )
        pubs = open_publishers(
            config,
            stream,
            [f"src{i}" for i in range(case.producers)],
            ctx.bootstrap,
            batch_size=max(500, case.granularity),
        )
        stack.callback(close_all, pubs)
        warm_until = time.monotonic() + warmup_s(ctx.quick)
        epoch = -1
        while len(out.from_last) < case.epochs:
            epoch += 1
            warming = time.monotonic() < warm_until
            for r in range(case.granularity):
                pubs[r % case.producers].publish(record(epoch, epoch))
            sealed_at: list[float] = []

            def seal(pub: Publisher, e: int = epoch, at: list[float] = sealed_at) -> None:
                at.append(time.time())  # list.append is atomic under the GIL
                pub.seal(substream, e)  # commits the epoch's records with it

            t0 = time.time()
            parallel(pubs, seal)
            try:
                seen = observer.wait_for(epoch, WAIT_S)
            except BenchError as exc:
                error = str(exc)
                log = config.path.with_suffix(".acker.log")
                if case.mechanism == "acker" and log.exists():
                    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                    error += " (acker log: " + " | ".join(tail) + ")"
                ctx.log(f"[red]{case}: {error}[/]")
                out.error = error
                break
            if warming:
                out.warmup += 1
                continue
            out.from_last.append(seen - max(sealed_at))
            out.from_first.append(seen - t0)
        del pubs
    return out


def measure_policy(ctx: BenchContext, case: PolicyCase, seconds: float) -> dict[str, Any]:
    """Window end (event time) -> the notification a ``notifications()`` reader gets, per
    window, and what became of every record: in its window's notification (firm read),
    dead-lettered, refused, or lost."""
    size = POLICY_WINDOW_MS
    sub: dict[str, Any] = {
        "name": "w", "stream": "s0", "kind": "tumbling", "field": "batch", "size_ms": size,
    }
    if case.lateness_ms is not None:
        sub["seal"] = {"lateness_ms": case.lateness_ms, "idle_ms": 1000, "late": "dead_letter"}
    config = ctx.config([("s0", 2)], [sub])
    stream, substream = config.streams[0].name, config.substreams[0].name
    app = Application(config, ctx.bootstrap)
    notes: list[EpochNote] = []
    stop = threading.Event()
    rng = random.Random(31)
    sent: dict[int, int] = {}
    late = dead = refused = kept_late = 0
    last_event = 0

    def read() -> None:  # notes only: a firm read per batch would be timed too
        with app.notifications(substream, from_="beginning") as reader:
            while not stop.is_set():
                notes.extend(reader.poll(0.2))

    with contextlib.ExitStack() as stack:
        stack.enter_context(acker_process(config, ctx.bootstrap))
        reader = threading.Thread(target=read, name="bench-notes", daemon=True)
        reader.start()
        stack.callback(reader.join, 10)
        stack.callback(stop.set)
        with app.publisher(stream, "clicks", batch_size=500) as pub:
            start = time.time()
            window = int(start * 1000) // size
            for i in range(int(seconds * POLICY_RATE)):
                pause = start + i / POLICY_RATE - time.time()
                if pause > 0:
                    time.sleep(pause)
                now = int(time.time() * 1000)
                if case.lateness_ms is None and now // size > window:
                    pub.seal(substream, now // size - 1)  # the clock left the window
                window = max(window, now // size)
                event = now
                if case.late_share and rng.random() < case.late_share:
                    event, late = now - case.late_by_ms, late + 1
                try:
                    got = pub.publish(record(now, event))
                except SealedTimeError:
                    refused += 1
                    continue
                if got.dead_lettered:
                    dead += 1
                else:
                    kept_late += event != now
                    sent[event // size] = sent.get(event // size, 0) + 1
                    last_event = max(last_event, event)
        # Closing released the last windows; latency counts only those the seals ended.
        deadline = time.monotonic() + WAIT_S
        while not set(sent) <= {n.time for n in notes} and time.monotonic() < deadline:
            time.sleep(0.2)
    stop.set()
    # Then every window's firm read, from the beginning: what each holds.
    firm: list[EpochNote] = []
    with app.notifications(substream, from_="beginning", records=True) as again:
        while len(firm) < len(notes) and time.monotonic() < deadline + 30:
            firm.extend(again.poll(1.0))
    lateness = case.lateness_ms or 0
    windows = [(n.time, n) for n in notes if isinstance(n.time, int)]
    latency = [  # the windows a seal ended, not the publisher's close
        (n.notified_at_ms - (w + 1) * size) / 1000.0
        for w, n in windows
        if (w + 2) * size + lateness <= last_event
    ]
    delivered = {n.time: len(n.entries) for n in firm if isinstance(n.time, int)}
    exact = all(
        all(int(e.payload["batch"]) // size == n.time for e in n.entries) for n in firm
    )
    lost = sum(max(0, c - delivered.get(w, 0)) for w, c in sent.items())
    error = None if set(sent) <= set(delivered) else "windows never notified"
    row = _row(case.label, None, latency, error)
    row.update(
        producers=1, partitions=2, granularity=POLICY_RATE * size // 1000,
        lateness_ms=case.lateness_ms, late=late, dead_lettered=dead, refused=refused,
        kept_late=kept_late,
        lost=lost, exact=exact and lost == 0,
    )
    return row


def raw_baseline(ctx: BenchContext, samples: int) -> list[float]:
    """One message at a time: produce (linger 0) -> seen by a polling consumer."""
    topic = f"b.raw-latency.{uuid.uuid4().hex[:8]}"
    ctx.topics([(topic, 1)])
    settings: dict[str, Any] = {"linger.ms": 0}
    producer = client.producer(ctx.bootstrap, None, **settings)
    value = b"x" * 140
    out: list[float] = []
    with RecordCounter(ctx.bootstrap, None, topic, 1) as counter:
        # The consumer must be positioned before the first timed message.
        producer.produce(topic, value=value, partition=0)
        producer.flush(10)
        counter.wait_for(1, 30.0)
        for i in range(samples):
            t0 = time.time()
            producer.produce(topic, value=value, partition=0)
            producer.poll(0)
            seen = counter.wait_for(i + 2, 30.0)
            out.append(seen - t0)
        producer.flush(10)
    del producer
    return out


def _row(
    name: str,
    case: Case | None,
    samples: Sequence[float],
    error: str | None = None,
    from_first: Sequence[float] = (),
) -> dict[str, Any]:
    return {
        "mechanism": name,
        "producers": case.producers if case else None,
        "partitions": case.partitions if case else None,
        "granularity": case.granularity if case else None,
        "samples": len(samples),
        "p50_ms": ms(percentile(samples, 50)),
        "p99_ms": ms(percentile(samples, 99)),
        "max_ms": ms(max(samples)) if samples else None,
        "p99_from_first_ms": ms(percentile(from_first, 99)) if from_first else None,
        "complete": error is None,
        "error": error,
    }


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label)
    result.columns = [
        Column("mechanism", "mechanism"),
        Column("producers", "P"),
        Column("partitions", "Q"),
        Column("granularity", "records/substream"),
        Column("samples", "n"),
        Column("p50_ms", "p50 ms", "{:.1f}"),
        Column("p99_ms", "p99 ms", "{:.1f}"),
        Column("p99_from_first_ms", "p99 ms from first seal", "{:.1f}"),
        Column("complete", "all epochs seen"),
        Column("late", "late"),
        Column("dead_lettered", "dead-lettered"),
        Column("refused", "refused"),
        Column("lost", "lost"),
        TXN_RETRIES,
    ]
    ctx.label = NAME
    all_cases = [c for c in cases(ctx.quick, ctx.grid) if ctx.mechanism in (None, c.mechanism)]
    raw = raw_baseline(ctx, 50 if ctx.quick else 500)
    result.rows.append(_row("raw produce->consume", None, raw))
    for case in ctx.track(
        all_cases,
        lambda c: f"{c.mechanism} P={c.producers} Q={c.partitions} g={c.granularity}",
    ):
        with client.counting_txn_retries() as counted:
            try:
                got = measure(ctx, case)
            except (SubstreamsError, KafkaException) as exc:  # kept in the table and JSON
                got = Samples([], [], f"{type(exc).__name__}: {exc}")
                ctx.log(f"[red]{case}: {got.error}[/]")
            retries = txn_retry_fields(counted)
        result.rows.append(
            _row(case.mechanism, case, got.from_last, got.error, got.from_first) | retries
            | {"warmup_epochs": got.warmup}
        )
    if ctx.mechanism in (None, "acker") and not ctx.grid:  # a --grid names its lines
        seconds = 4.0 if ctx.quick else 15.0
        for pcase in ctx.track(policy_cases(), lambda c: c.label):
            with client.counting_txn_retries() as counted:
                try:
                    row = measure_policy(ctx, pcase, seconds)
                except (SubstreamsError, KafkaException) as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    ctx.log(f"[red]{pcase.label}: {error}[/]")
                    row = _row(pcase.label, None, [], error)
                result.rows.append(row | txn_retry_fields(counted))
    for row in result.rows:
        if row.get("error"):
            result.notes.append(
                f"{row['mechanism']} P={row['producers']} Q={row['partitions']} "
                f"g={row['granularity']}: stopped after {row['samples']} epochs: {row['error']}"
            )
    result.targets = targets(result.rows) + policy_targets(result.rows)
    result.notes.append(
        "latency = the last of the P producers' seal() calls (all P seal at once, in threads) "
        "-> end visible to an observer: EpochComplete on the control topic (acker) / Aligner "
        "termination over all Q partitions (punctuations); 'from first seal' counts from the "
        "moment the P seal threads started instead. Every configuration on a fresh embedded "
        "broker; the acker is its own process, publishers and observer share one. "
        f"Each configuration first runs its own epochs for {warmup_s(ctx.quick):g} s and "
        "discards them ('warmup_epochs' in the JSON): the fresh broker's JIT compilers "
        "catch up (harness.WARMUP_S); the retry counts include those epochs."
    )
    result.notes.append(
        "CONCURRENT_TRANSACTIONS retries: requests the transaction coordinator refused "
        "because the writer's previous transaction was still being completed, each retried "
        "by librdkafka after a fixed ~20 ms; first the publishers' retries a commit waited "
        "for (the seal path: each seal() commits its epoch's records with it), then all the "
        "publishers' (the rest: the next records' transaction, begun right behind a commit, "
        "registered long before its own commit), then the acker's and control writers' "
        "(the acker process included); counted from librdkafka's eos debug log, which every "
        "transactional producer of the run writes (client.TxnRetryCounter)."
    )
    result.notes.append(
        f"seal policy lines: one publisher, {POLICY_RATE} records/s in real event time, "
        f"{POLICY_WINDOW_MS} ms tumbling windows, 2 partitions; latency = window end (event "
        "time) -> the note read by Application.notifications() in the same process (the "
        "firm read of each window's records checked after, not timed); 'manual seal()' "
        "seals each window as the clock leaves it (today's way). "
        "Late records are refused (raise) or dead-lettered by the policy's rule, never lost."
    )
    return result


def policy_targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """The seal-policy goals: p50 within lateness + 50 ms, and within 1.2x of manual seals
    at lateness 0; with late records, none lost or refused, and every one dead-lettered
    exactly when the lateness is below their delay."""
    out = []
    manual = next((r for r in rows if r["mechanism"] == "acker, manual seal()"), None)
    for r in rows:
        lateness = r.get("lateness_ms")
        if lateness is None or r.get("p50_ms") is None:
            continue
        p50 = r["p50_ms"]
        out.append(Target(
            f"{r['mechanism']}: p50 window end -> notification", f"<= {lateness + 50} ms",
            f"{p50:.1f} ms", p50 <= lateness + 50,
        ))
        if lateness == 0 and manual is not None and manual.get("p50_ms"):
            ratio = p50 / manual["p50_ms"]
            out.append(Target(
                "seal policy lateness 0 vs manual seal(), p50", "<= 1.2x",
                f"{ratio:.2f}x", ratio <= 1.2,
            ))
        if r.get("late"):
            # Late by more than the lateness: dead-lettered unless its window was still
            # open by the publisher's own promise (then it is counted in that window).
            expect = "0 dead-lettered" if lateness >= 300 else "the rest dead-lettered"
            ok = (
                r["lost"] == 0 and r["refused"] == 0
                and r["dead_lettered"] + r["kept_late"] == r["late"]
                and (lateness < 300 or r["dead_lettered"] == 0)
            )
            out.append(Target(
                f"{r['mechanism']}: late records",
                f"0 lost, 0 refused, {expect}",
                f"{r['lost']} lost, {r['refused']} refused, {r['dead_lettered']} dead-lettered, "
                f"{r['kept_late']} in open windows, "
                f"windows {'exact' if r.get('exact') else 'NOT exact'}",
                ok and bool(r.get("exact")),
            ))
    return out


def targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    acker = [r for r in rows if r["mechanism"] == "acker"]
    failed = [r for r in acker if r.get("error")]
    worst = max((r["p99_ms"] for r in acker), default=None)
    if failed:  # a notification that never came is an infinite latency
        worst = float("inf")
    out = [
        Target(
            "acker p99 seal->notification, every configuration",
            f"<= {TARGET_P99_MS:.0f} ms",
            "-" if worst is None else f"worst {worst:.1f} ms",
            None if worst is None else worst <= TARGET_P99_MS,
        )
    ]
    # Flat in P x Q: per granularity, p99 at the largest P x Q vs at the smallest.
    ratios = []
    for g in sorted({r["granularity"] for r in acker}):
        by_size = sorted(
            (r for r in acker if r["granularity"] == g),
            key=lambda r: r["producers"] * r["partitions"],
        )
        if len(by_size) >= 2:
            small, large = by_size[0]["p99_ms"], by_size[-1]["p99_ms"]
            if small > 0 and not math.isnan(small):
                ratios.append(large / small)
    flat = max(ratios) if ratios else None
    out.append(
        Target(
            "acker p99 flat in P x Q (largest / smallest, per granularity)",
            "<= 2.0",
            "-" if flat is None else f"worst {flat:.2f}x",
            None if flat is None else flat <= 2.0,
        )
    )
    return out


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    mech_rows = [r for r in result.rows if r["granularity"] is not None]
    grans = sorted({r["granularity"] for r in mech_rows})
    fig, axes = plt.subplots(
        1, max(1, len(grans)), figsize=(4.5 * max(1, len(grans)), 4), squeeze=False
    )
    raw = next((r for r in result.rows if r["granularity"] is None), None)
    for ax, g in zip(axes[0], grans, strict=False):
        for mech, color in (("acker", "tab:green"), ("punctuations", "tab:blue")):
            rows = sorted(
                (r for r in mech_rows if r["mechanism"] == mech and r["granularity"] == g),
                key=lambda r: r["producers"] * r["partitions"],
            )
            if not rows:
                continue
            x = [r["producers"] * r["partitions"] for r in rows]
            ax.plot(x, [r["p50_ms"] for r in rows], "o--", color=color, label=f"{mech} p50")
            ax.plot(x, [r["p99_ms"] for r in rows], "o-", color=color, label=f"{mech} p99")
        if raw is not None:
            ax.axhline(raw["p99_ms"], color="gray", linestyle=":", label="raw Kafka p99")
        ax.axhline(TARGET_P99_MS, color="red", linestyle="-.", linewidth=0.8, label="target")
        loglog_axes(
            ax,
            "P x Q",
            "seal → notification (ms)",
            f"{g} record{'s' if g > 1 else ''} per substream",
            legend_size=7,
        )
    fig.suptitle(titled("notification latency", result))
    save_figure(fig, path)
