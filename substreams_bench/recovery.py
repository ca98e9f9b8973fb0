"""Recovery benchmark: does an acker start as fast after a million notifications as after ten
thousand?

History.  An acker that notified N epochs left on Kafka what :func:`write_history` writes: N
``EpochComplete`` records (and a ``FrontierSnapshot`` every ``snapshot_every``) on the
substream's control topic, and on its checkpoint topic a ``WriterHeartbeat`` + ``Checkpoint``
per transaction, all hash-chained under the acker's transactional id.  Running a real acker
over real acks to get there takes hours at a million, so the history is written directly,
the fastest honest way: the acker's own code computes it -- a real ``SegmentTable`` applies
a report (one record, its offset range) and a seal per epoch, a real ``ProgressTracker`` turns
each termination into its ``EpochComplete``/snapshot, the real ``AckerState`` is serialized
into each ``Checkpoint`` -- and the real ``ControlWriter`` writes it, ``BATCH`` notifications
per transaction (what a busy acker commits at once).  Only the acks topic is skipped: it is
empty, as after an acker that applied everything.

Measurements, per history size (each on a fresh broker):

- **acker start-up**: ``AckerService.start()`` (fence the transactional id, find the chain
  heads and the latest checkpoint, load it, seek the acks topic);
- **standby take-over**: a ``--standby`` acker on the same history: from its start until it
  is serving, minus the configured silence (``standby_timeout_ms``, a setting, not a cost);
- **baseline, same run**: the previous start-up's read (``ControlWriter.recover()``): every
  record of the acker's control topics from offset 0 to the end.

Run: ``substreams bench recovery [--quick]``; ``--quick`` uses 1k and 10k notifications.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from substreams.acker.protocol import segment_partition
from substreams.acker.service import AckerService, checkpoint_topic, transactional_id
from substreams.acker.state import AckerState, SourceSession
from substreams.acker.table import SOURCE
from substreams.config import Config
from substreams.control.io import ControlTail, ControlWriter
from substreams.control.messages import (
    Checkpoint,
    ControlBody,
    FrontierSnapshot,
    OffsetRange,
    WriterHeartbeat,
)
from substreams.kafka import client
from substreams.kafka.topics import ensure_topics
from substreams_bench.harness import (
    BenchContext,
    BenchResult,
    Column,
    Target,
    command_line,
    save_figure,
    titled,
)

NAME = "recovery"
BATCH = 1000
"""Notifications per transaction while writing a history."""
TARGET_S = 2.0
SAME_SLACK_S = 0.5
"""'The same' start-up after 1M as after 10k: within this much."""
STANDBY_TIMEOUT_MS = 500
RECOVER_LIMIT_S = 10.0
"""``read_control``'s limit, which ``ControlWriter.recover()`` runs into."""

COLUMNS = [
    Column("notifications", "notifications", "{:,}"),
    Column("control_records", "control records", "{:,}"),
    Column("checkpoints", "checkpoints", "{:,}"),
    Column("generate_s", "history written (s)", "{:.1f}"),
    Column("startup_s", "acker start-up (s)", "{:.3f}"),
    Column("takeover_s", "standby take-over (s)", "{:.3f}"),
    Column("replay_s", "baseline: replay from 0 (s)", "{:.3f}"),
]


def write_history(config: Config, notifications: int) -> dict[str, Any]:
    """Write the control and checkpoint topics of an acker that notified ``notifications``
    epochs (see the module docstring); returns counts and how long it took."""
    t0 = time.perf_counter()
    acker = config.acker
    sub = config.substreams[0].name
    stream = config.substreams[0].stream
    control, cp = acker.control_topic(sub), checkpoint_topic(config)
    now = int(time.time() * 1000)
    state = AckerState(acks_offsets={p: 0 for p in range(acker.acks_partitions)})
    state.ensure(sub, acker.snapshot_every)
    table, tracker = state.tables[sub], state.trackers[sub]
    table.register("src", SOURCE)
    home = segment_partition(sub, acker.acks_partitions)
    state.sessions[("src", home)] = SourceSession("incarnation", 0, now, "substreams.pub.src")
    writer = ControlWriter(
        config.kafka.bootstrap, acker.name, [control, cp], config,
        transactional_id=transactional_id(acker.name),
    )
    control_records = checkpoints = 0
    try:
        for first in range(0, notifications, BATCH):
            items: list[tuple[str, ControlBody]] = []
            for t in range(first, min(first + BATCH, notifications)):
                if table.report(t, 0, 1, 2, (OffsetRange(stream, 0, t, t + 1),), now):
                    tracker.activate(t)
                table.seal("src", t, now, now)
                for term in table.terminations():
                    for body in tracker.complete(term.time, term.ranges, term.records, now):
                        if isinstance(body, FrontierSnapshot):
                            body = tracker.snapshot({})
                        items.append((control, body))
                    state.last_notification[sub] = (term.time, now)
            control_records += len(items)
            state.checkpoints += 1
            checkpoints += 1
            items.append((cp, WriterHeartbeat(None)))
            items.append((cp, Checkpoint(tuple(sorted(state.acks_offsets.items())),
                                         state.dumps())))
            writer.write(items)
    finally:
        writer.close()
    return {
        "notifications": notifications,
        "control_records": control_records,
        "checkpoints": checkpoints,
        "checkpoint_bytes": len(state.dumps()),
        "generate_s": round(time.perf_counter() - t0, 2),
    }


def startup(config: Config) -> tuple[float, AckerService]:
    """Seconds for ``AckerService.start()``; the service is returned started."""
    service = AckerService(config)
    t0 = time.perf_counter()
    service.start()
    return time.perf_counter() - t0, service


def takeover(config: Config) -> float:
    """A standby on a silent checkpoint topic: seconds from its start to serving, minus the
    configured silence it must wait out."""
    service = AckerService(config, standby=True)
    stop = threading.Event()
    t0 = time.perf_counter()
    try:
        if not service.wait_for_takeover(stop):  # pragma: no cover - stop is never set
            raise RuntimeError("standby did not take over")
        service.start()
        return time.perf_counter() - t0 - config.acker.standby_timeout_ms / 1000.0
    finally:
        service.close()


def replay_from_zero(config: Config) -> tuple[float, int]:
    """The baseline: the previous start-up's read, every record of the acker's control
    topics from offset 0 to the end (what ``ControlWriter.recover()`` does, without its 10 s
    limit, which a long history exceeds); seconds and records read."""
    acker = config.acker
    topics = [acker.control_topic(config.substreams[0].name), checkpoint_topic(config)]
    t0 = time.perf_counter()
    records = 0
    for topic in topics:
        with ControlTail(config.kafka.bootstrap, topic, 0, config) as tail:
            records += sum(1 for _ in tail.read_to_end(timeout=1800.0))
    return time.perf_counter() - t0, records


def measure(ctx: BenchContext, notifications: int) -> dict[str, Any]:
    config = ctx.config(
        [("clicks", 1)],
        [{"name": "epochs", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker={"standby_timeout_ms": STANDBY_TIMEOUT_MS, "heartbeat_ms": 100},
    )
    ensure_topics(client.admin(ctx.bootstrap), [config.topic_spec(checkpoint_topic(config))])
    row = write_history(config, notifications)
    ctx.log(f"{notifications:,} notifications written in {row['generate_s']:.1f} s")
    seconds, service = startup(config)
    service.close()
    row["startup_s"] = round(seconds, 3)
    row["takeover_s"] = round(takeover(config), 3)
    replay_s, records = replay_from_zero(config)
    row["replay_s"] = round(replay_s, 3)
    row["replay_records"] = records
    return row


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label, columns=COLUMNS)
    ctx.label = NAME
    sizes = (1_000, 10_000) if ctx.quick else (10_000, 1_000_000)
    for n in ctx.track(sizes, lambda n: f"{n:,} notifications"):
        result.rows.append(measure(ctx, n))
    small, large = result.rows[0], result.rows[-1]
    big = f"{large['notifications']:,}"
    for key, what in (("startup_s", "acker start-up"), ("takeover_s", "standby take-over")):
        result.targets.append(
            Target(f"{what} after {big}", f"< {TARGET_S:g} s", f"{large[key]:.3f} s",
                   large[key] < TARGET_S)
        )
        result.targets.append(
            Target(
                f"{what}: {big} vs {small['notifications']:,}",
                f"the same (within {SAME_SLACK_S:g} s)",
                f"{large[key]:.3f} s vs {small[key]:.3f} s",
                large[key] <= small[key] + SAME_SLACK_S,
            )
        )
    result.notes.append(
        f"histories written directly by the acker's own table, tracker, state and control "
        f"writer ({BATCH} notifications per transaction; the acks topic is empty), not by "
        "running an acker over acks: see substreams_bench/recovery.py"
    )
    slow = [r for r in result.rows if r["replay_s"] > RECOVER_LIMIT_S]
    if slow:
        result.notes.append(
            "the previous start-up could not even finish after "
            f"{slow[0]['notifications']:,} notifications: ControlWriter.recover() gives up "
            f"when a topic does not reach its end within {RECOVER_LIMIT_S:g} s (the replay "
            f"took {slow[0]['replay_s']:.1f} s)"
        )
    result.notes.append(
        f"take-over excludes the configured silence (standby_timeout_ms={STANDBY_TIMEOUT_MS})"
    )
    return result


def plot(result: BenchResult, path: Path) -> None:
    """Start-up, take-over and the replay-from-0 baseline against the history's length."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["notifications"] for r in result.rows]
    for key, label, style in (
        ("startup_s", "acker start-up", "o-"),
        ("takeover_s", "standby take-over", "s-"),
        ("replay_s", "baseline: replay from offset 0", "x--"),
    ):
        ax.plot(xs, [r[key] for r in result.rows], style, label=label)
    ax.axhline(TARGET_S, color="red", linestyle="-.", linewidth=0.8, label="target")
    ax.set_xscale("log")
    ax.set_xlabel("notifications in the history")
    ax.set_ylabel("seconds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(titled("recovery", result))
    save_figure(fig, path)
