"""Recovery benchmark: does an acker start as fast after a million notifications as after ten
thousand, and a punctuation aligner after a million punctuations?

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

The punctuation aligner, per size N (same broker): its history is N punctuations on a data
topic of ``ALIGNER_PARTITIONS`` partition(s) -- ``ALIGNER_PRODUCERS`` producers REGISTER, then
SEAL times 0, 1, 2, ... into every partition (P x Q punctuations per time), written by a
plain producer with the punctuation hook's encoding and headers (no data records: each time
is announced empty; a record costs a re-read what a punctuation costs) -- then the real
aligner service runs over it once, writing its control topic and its checkpoints, and stops.

- **aligner start-up**: a new ``PunctuationAligner`` from its construction until its reader
  has caught up with the data topic (it continues from its checkpoint);
- **baseline, same run**: the start-up before checkpoints: the control topic read from
  offset 0 and the data topic re-read and aligned from offset 0 until caught up.

Run: ``substreams bench recovery [--quick]``; ``--quick`` uses 1k and 10k notifications (and
punctuations).
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
from substreams.app import Application
from substreams.config import Config
from substreams.control.io import ControlWriter, read_control
from substreams.control.messages import (
    Checkpoint,
    ControlBody,
    FrontierSnapshot,
    OffsetRange,
    WriterHeartbeat,
)
from substreams.kafka import client
from substreams.kafka.topics import ensure_topics
from substreams.kafka.write import produce
from substreams.punctuation.aligner import Punctuation
from substreams.punctuation.reader import PunctuatedReader
from substreams.streams.schemas import protocol_codec
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
    Column("aligner_generate_s", "aligner history (s)", "{:.1f}"),
    Column("aligner_startup_s", "aligner start-up (s)", "{:.3f}"),
    Column("aligner_replay_s", "aligner baseline: replay from 0 (s)", "{:.3f}"),
]
ALIGNER_PRODUCERS = 2
ALIGNER_PARTITIONS = 1
"""One partition: the aligner keeps up as it reads.  With several, a replay reads one
partition's backlog ahead of the others', every time stays open meanwhile and each seal
re-checks all of them (quadratic): the baseline would be slower still, and writing the
history by running the aligner once would take hours at 1M."""


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
    service = Application(config).acker(commands=False)  # start() alone is measured
    t0 = time.perf_counter()
    service.start()
    return time.perf_counter() - t0, service


def takeover(config: Config) -> float:
    """A standby on a silent checkpoint topic: seconds from its start to serving, minus the
    configured silence it must wait out."""
    service = Application(config).acker(standby=True, commands=False)
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
        records += len(read_control(config.kafka.bootstrap, topic, config, timeout=1800.0))
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


def write_punctuations(config: Config, punctuations: int) -> int:
    """``punctuations`` punctuations on the data topic (see the module docstring); returns
    how many times every producer sealed in every partition."""
    sub = config.substreams[0].name
    stream = config.substreams[0].stream
    codec = protocol_codec("punctuation")
    fast: dict[str, Any] = {"linger.ms": 20}
    producer = client.producer(config.kafka.bootstrap, config, **fast)
    now = int(time.time() * 1000)
    written = 0

    def put(kind: Any, who: str, t: int | None) -> None:
        nonlocal written
        value = codec.encode_single(
            Punctuation(kind, who, sub, t, -1, sent_at_ms=now).to_wire())
        for q in range(ALIGNER_PARTITIONS):
            produce(producer, stream, value, partition=q)
            written += 1

    names = [f"src{i}" for i in range(ALIGNER_PRODUCERS)]
    for who in names:
        put("REGISTER", who, None)
    times = 0
    while written < punctuations:
        for who in names:
            put("SEAL", who, times)
        times += 1
    if producer.flush(120):
        raise RuntimeError("punctuations not all delivered")
    return times


def aligner_history(config: Config, punctuations: int) -> tuple[float, int]:
    """Seconds to write the history (the punctuations, then the aligner's one run over them)
    and the number of times it announced."""
    t0 = time.perf_counter()
    times = write_punctuations(config, punctuations)
    sub = config.substreams[0].name
    with Application(config).aligner(sub) as aligner:
        while not (aligner.reader.caught_up and aligner.tracker.completed >= times):
            aligner.step(0.1)
    return time.perf_counter() - t0, times


def aligner_startup(config: Config, times: int) -> float:
    """Seconds from a new aligner's construction until it has caught up (from its
    checkpoint: nothing is announced again)."""
    sub = config.substreams[0].name
    t0 = time.perf_counter()
    with Application(config).aligner(sub) as aligner:
        while not aligner.reader.caught_up:
            aligner.step(0.05)
        seconds = time.perf_counter() - t0
        if aligner.recovered_from is None or aligner.tracker.completed != times:
            raise RuntimeError(
                f"aligner did not continue from its checkpoint ({aligner.tracker.completed} "
                f"of {times} times)"
            )
    return seconds


def aligner_replay(config: Config) -> float:
    """The baseline: the start-up before checkpoints, the control topic from offset 0 and
    the data topic read and aligned from offset 0 until caught up."""
    sub = config.substreams[0].name
    t0 = time.perf_counter()
    read_control(config.kafka.bootstrap, config.acker.control_topic(sub), config, timeout=1800.0)
    with PunctuatedReader(config, sub, bound="soft") as reader:
        while not reader.caught_up:
            reader.poll(0.05)
    return time.perf_counter() - t0


def measure_aligner(ctx: BenchContext, punctuations: int) -> dict[str, Any]:
    config = ctx.config(
        [("clicks", ALIGNER_PARTITIONS)],
        [{"name": "punct", "stream": "clicks", "kind": "epoch", "field": "ts",
          "mechanism": "punctuations"}],
        acker={"heartbeat_ms": 100},
    )
    generate_s, times = aligner_history(config, punctuations)
    ctx.log(f"{punctuations:,} punctuations ({times:,} times) written and aligned in "
            f"{generate_s:.1f} s")
    return {
        "punctuations": punctuations,
        "aligner_times": times,
        "aligner_generate_s": round(generate_s, 2),
        "aligner_startup_s": round(aligner_startup(config, times), 3),
        "aligner_replay_s": round(aligner_replay(config), 3),
    }


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label, columns=COLUMNS)
    ctx.label = NAME
    sizes = (1_000, 10_000) if ctx.quick else (10_000, 1_000_000)
    for n in ctx.track(sizes, lambda n: f"{n:,} notifications / punctuations"):
        result.rows.append({**measure(ctx, n), **measure_aligner(ctx, n)})
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
    punct = f"{large['punctuations']:,} punctuations"
    result.targets.append(
        Target(f"aligner start-up after {punct}", f"<= {TARGET_S:g} s",
               f"{large['aligner_startup_s']:.3f} s", large["aligner_startup_s"] <= TARGET_S)
    )
    result.targets.append(
        Target(
            f"aligner start-up: {punct} vs {small['punctuations']:,}",
            f"the same (within {SAME_SLACK_S:g} s)",
            f"{large['aligner_startup_s']:.3f} s vs {small['aligner_startup_s']:.3f} s",
            large["aligner_startup_s"] <= small["aligner_startup_s"] + SAME_SLACK_S,
        )
    )
    result.notes.append(
        f"aligner histories: {ALIGNER_PRODUCERS} producers x {ALIGNER_PARTITIONS} partition "
        "of punctuations only (REGISTER, then a SEAL of each time in every partition), "
        "written by a plain producer, then aligned once by the real aligner service"
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
        ("aligner_startup_s", "aligner start-up", "^-"),
        ("aligner_replay_s", "aligner baseline: replay from offset 0", "v:"),
    ):
        if all(key in r for r in result.rows):  # runs from before the aligner's line
            ax.plot(xs, [r[key] for r in result.rows], style, label=label)
    ax.axhline(TARGET_S, color="red", linestyle="-.", linewidth=0.8, label="target")
    ax.set_xscale("log")
    ax.set_xlabel("notifications (punctuations) in the history")
    ax.set_ylabel("seconds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(titled("recovery", result))
    save_figure(fig, path)
