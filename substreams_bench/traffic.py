"""Benchmark 1: control traffic vs processes, punctuations against the acker.

The pipeline of one configuration (P producers, Q partitions, S stages, K substreams)::

    P producers -> s0 -> stage 1 (Q tasks) -> s1 -> ... -> stage S (Q tasks) -> sS -> Q consumers

Every stream has Q partitions; task q of a stage reads partition q of its input and writes
partition q of its output.  The K substreams are K epochs of one ``epoch`` substream.

Counting (what "a service message delivered to a process" is here):

- |Π| = P producer tasks + S·Q stage tasks + Q consumer tasks of the sink stream.
  The lower bound is K·|Π|: every process must hear about (or tell about) every substream's
  end at least once.
- Punctuations: a SEAL written into a partition is delivered to the one task reading that
  partition.  Hop 0 costs P·Q per substream (every producer into every partition), every
  later hop Q·Q (every task of the previous stage is a producer of the next stream).
  Stage tasks forward a SEAL when their aligner terminates the time, as a real pipeline
  does.  The Q readers of one hop are simulated by one consumer that reads the topic once
  and dispatches each message to the task of its partition (one delivery each).
- Acker: every message on the acks topic is delivered to one process (the acker); every
  record on the substream's control topic is delivered to each of the Q consumer tasks
  (stage tasks need no notification: they report, the acker tracks through them).  The
  acker's own checkpoint/heartbeat topic is read by nobody but a standby and is not
  counted.  "Unaggregated" counts every SND/RCV report (the ``reports`` field of each
  AckEntry) and every seal as its own message, plus the same control deliveries.
- Set-up messages (punctuation REGISTER/UNREGISTER, acker Register/Unregister) are
  independent of K; they are reported in ``setup_*`` fields and excluded from the
  per-substream columns.  Heartbeats of sources would count in ``messages_acker`` (they
  are time-based, not set-up); none are sent in these runs.

32 producers are 32 Publisher objects (separate source ids, separate transactional
producers) in this one process; stage tasks are separate Publisher / Stage objects too.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from substreams.config import Config
from substreams.control.io import read_control
from substreams.errors import SubstreamsError
from substreams.kafka.read import Reader
from substreams.streams.listener import PunctuationEntry, StreamDecoder
from substreams.streams.publisher import Publisher
from substreams_bench.harness import (
    BenchContext,
    BenchError,
    BenchResult,
    Column,
    Target,
    command_line,
    loglog_axes,
    release_clients,
    save_figure,
    titled,
)
from substreams_bench.workload import close_all, open_publishers, parallel, record

NAME = "traffic"
SUB = "ep"
NOTIFY_WAIT_S = 120.0  # a count benchmark: a slow (saturated) broker must not fail it


@dataclass(frozen=True)
class Case:
    producers: int
    partitions: int
    stages: int
    substreams: int

    @property
    def processes(self) -> int:
        return self.producers + self.stages * self.partitions + self.partitions

    @property
    def lower_bound(self) -> int:
        return self.substreams * self.processes


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            Case(2, 2, 1, 3),
            Case(4, 4, 2, 3),
            Case(32, 32, 1, 2),
        ]
    grid = [(1, 1), (4, 4), (8, 8), (16, 16), (32, 32), (32, 4), (4, 32)]
    return [Case(p, q, s, 8) for s in (1, 2, 4) for p, q in grid]


def _streams(case: Case) -> list[tuple[str, int]]:
    return [(f"s{k}", case.partitions) for k in range(case.stages + 1)]


def _targets_of(case: Case, producer: int) -> list[int]:
    """Partitions producer ``producer`` writes each epoch: a block that, over all producers,
    covers every partition (so every task has work in every substream)."""
    per = max(1, math.ceil(case.partitions / case.producers))
    return [(producer * per + j) % case.partitions for j in range(per)]


def _publish_epoch(pubs: Sequence[Publisher], case: Case, epoch: int) -> None:
    for i, pub in enumerate(pubs):
        for q in _targets_of(case, i):
            pub.publish(record(epoch * 1000, epoch), partition=q)


# --- punctuations --------------------------------------------------------------------------


class _HopReader:
    """The Q tasks of one hop, simulated by one consumer over the Q partitions."""

    def __init__(self, ctx: BenchContext, config: Config, stream: str, substream: str) -> None:
        from substreams.punctuation.aligner import Aligner

        self.stream = stream
        self.substream = substream
        parts = config.stream(stream).partitions
        self.decoder = StreamDecoder(config, stream)
        self.aligners = {q: Aligner(substream, stream, [q]) for q in range(parts)}
        self.reader = Reader(
            ctx.bootstrap, config, [TopicPartition(stream, q, 0) for q in range(parts)],
            name=f"bench traffic: '{stream}'",
        )
        self.delivered: Counter[str] = Counter()  # punctuation kind -> deliveries

    def read_all(self, on_event: Callable[[int, Any], None], timeout: float = 300.0) -> None:
        """Read to the end of every partition (all writers have committed and closed)."""
        from substreams.punctuation.aligner import Punctuation

        for msg in self.reader.iter_to_end(timeout):
            q = msg.partition()
            entry = self.decoder.decode(msg)
            if isinstance(entry, PunctuationEntry):
                p = Punctuation.from_wire(entry.fields, q, entry.index)
                if p.substream != self.substream:
                    continue
                self.delivered[p.kind] += 1  # delivered to task q
                events = self.aligners[q].on_punctuation(p)
            else:
                events = self.aligners[q].on_record(entry)
            for ev in events:
                on_event(q, ev)

    def close(self) -> None:
        self.reader.close()


def run_punctuations(ctx: BenchContext, case: Case) -> dict[str, int]:
    from substreams.punctuation.aligner import Released, Terminated

    subs = [
        {
            "name": f"{SUB}{k}",
            "stream": f"s{k}",
            "kind": "epoch",
            "field": "batch",
            "mechanism": "punctuations",
        }
        for k in range(case.stages + 1)
    ]
    config = ctx.config(_streams(case), subs)
    streams = [s.name for s in config.streams]
    names = [s.name for s in config.substreams]
    seals = 0
    setup = 0
    pubs = open_publishers(
        config, streams[0], [f"src{i}" for i in range(case.producers)], ctx.bootstrap
    )
    try:
        for epoch in range(case.substreams):
            _publish_epoch(pubs, case, epoch)
            parallel(pubs, lambda p, e=epoch: p.seal(names[0], e))  # type: ignore[misc]
    finally:
        close_all(pubs)
        del pubs
    for hop in range(1, case.stages + 2):
        reader = _HopReader(ctx, config, streams[hop - 1], names[hop - 1])
        last = hop == case.stages + 1
        tasks: list[Publisher] = []
        if not last:
            tasks = open_publishers(
                config,
                streams[hop],
                [f"st{hop}.{q}" for q in range(case.partitions)],
                ctx.bootstrap,
            )
        terminated: Counter[int] = Counter()

        def on_event(
            q: int,
            ev: Any,
            tasks: list[Publisher] = tasks,
            terminated: Counter[int] = terminated,
            hop: int = hop,
        ) -> None:
            if isinstance(ev, Terminated):
                terminated[q] += 1
                if tasks:
                    tasks[q].seal(names[hop], ev.time)
            elif isinstance(ev, Released) and tasks:
                tasks[q].publish(dict(ev.entry.payload), partition=q)

        try:
            reader.read_all(on_event)
        finally:
            reader.close()
            close_all(tasks)
            del tasks
        if any(terminated[q] != case.substreams for q in range(case.partitions)):
            raise BenchError(
                f"bench traffic: punctuations: hop {hop} terminated {dict(terminated)} "
                f"substreams per task, expected {case.substreams}"
            )
        seals += reader.delivered["SEAL"]
        setup += reader.delivered["REGISTER"] + reader.delivered["UNREGISTER"]
    release_clients()
    return {"messages_punctuation": seals, "setup_punctuation": setup}


# --- acker ---------------------------------------------------------------------------------


def run_acker(ctx: BenchContext, case: Case) -> dict[str, int]:
    from substreams.acker.protocol import (
        AckReport,
        Register,
        SourceHeartbeat,
        Unregister,
        decode_ack,
    )
    from substreams.acker.stage import Stage
    from substreams.app import Application

    stages = [
        {"name": f"st{k}-{q}", "input": f"s{k - 1}", "output": f"s{k}"}
        for k in range(1, case.stages + 1)
        for q in range(case.partitions)
    ]
    sub = {"name": SUB, "stream": "s0", "kind": "epoch", "field": "batch", "mechanism": "acker"}
    config = ctx.config(_streams(case), [sub], stages)
    substream = config.substreams[0].name
    streams = [s.name for s in config.streams]
    app = Application(config, ctx.bootstrap)
    service = app.acker(commands=False)  # control traffic only: no command protocol
    stop = threading.Event()
    acker = threading.Thread(target=service.run, args=(stop,), daemon=True)
    acker.start()
    tasks: list[list[Stage]] = []
    pubs: list[Publisher] = []
    control_topic = config.acker.control_topic(substream)
    try:
        for k in range(1, case.stages + 1):
            row = []
            for q in range(case.partitions):
                name = config.stages[(k - 1) * case.partitions + q].name
                st = app.stage(name, lambda e: [dict(e.payload)])
                # task q reads partition q only (Stage assigns every partition)
                st.consumer.assign([TopicPartition(streams[k - 1], q, 0)])
                row.append(st)
            tasks.append(row)
        pubs = open_publishers(
            config, streams[0], [f"src{i}" for i in range(case.producers)], ctx.bootstrap
        )
        expected = Counter(q for i in range(case.producers) for q in _targets_of(case, i))
        with _ControlWatch(ctx, config, control_topic) as watch:
            for epoch in range(case.substreams):
                _publish_epoch(pubs, case, epoch)
                parallel(pubs, lambda p, e=epoch: p.seal(substream, e))  # type: ignore[misc]
                for row in tasks:
                    for q, st in enumerate(row):
                        want = expected[q] * (epoch + 1)
                        deadline = time.monotonic() + 30
                        while st.processed < want:
                            if time.monotonic() > deadline:
                                raise BenchError(
                                    f"bench traffic: acker: stage task {q} processed "
                                    f"{st.processed} of {want} records"
                                )
                            st.step(0.05)
                watch.wait_for(epoch, NOTIFY_WAIT_S)
        close_all(pubs)
        pubs = []
        for row in tasks:
            parallel(row, lambda st: st.close())
    finally:
        close_all(pubs)
        for row in tasks:
            parallel(row, lambda st: st.close())
        stop.set()
        acker.join(10)
        del tasks, pubs, service
        release_clients()
    # Count what was delivered: the acks topic (to the acker) and the control topic (to
    # each of the Q consumer tasks).
    acks: list[Any] = []
    parts = config.acker.acks_partitions
    with Reader(ctx.bootstrap, config,
                [TopicPartition(config.acker.acks_topic, p, 0) for p in range(parts)],
                name="bench traffic: acks") as reader:
        for msg in reader.iter_to_end(30.0):
            acks.append(decode_ack(msg.value(), msg.headers()))
    reports = [a for a in acks if isinstance(a.body, AckReport)]
    setup = sum(isinstance(a.body, Register | Unregister) for a in acks)
    heartbeats = sum(isinstance(a.body, SourceHeartbeat) for a in acks)
    unagg = sum(e.reports for a in reports for e in a.body.all_entries()) + sum(
        len(a.body.seals) for a in reports
    )
    control = len(read_control(ctx.bootstrap, control_topic, config))
    deliveries = control * case.partitions
    from_stages = sum(a.source.startswith("stage.") for a in reports)
    return {
        "messages_acker": len(reports) + heartbeats + deliveries,
        "messages_acker_unaggregated": unagg + heartbeats + deliveries,
        "acks_sent": len(reports) + heartbeats,
        "acks_from_producers": len(reports) - from_stages,
        "acks_from_stages": from_stages,
        "control_records": control,
        "setup_acker": setup,
    }


class _ControlWatch:
    """Waits for the acker's notification of each epoch on the control topic."""

    def __init__(self, ctx: BenchContext, config: Config, topic: str) -> None:
        from substreams.control.follower import LOG, ControlFollower

        self.tail = ControlFollower(ctx.bootstrap, config, name="bench: control", on_bad=LOG,
                                    verify=False)
        self.tail.assign({topic: 0})
        self.done: set[int] = set()

    def wait_for(self, epoch: int, timeout: float) -> None:
        from substreams.control.messages import completions

        deadline = time.monotonic() + timeout
        while epoch not in self.done:
            if time.monotonic() > deadline:
                raise BenchError(f"bench traffic: acker: no notification of epoch {epoch}")
            for followed in self.tail.poll(0.05):
                for note in completions(followed.record.body):
                    if isinstance(note.time, int):
                        self.done.add(note.time)

    def __enter__(self) -> _ControlWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.tail.close()


# --- the benchmark -------------------------------------------------------------------------


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label)
    result.columns = [
        Column("producers", "P"),
        Column("partitions", "Q"),
        Column("stages", "S"),
        Column("substreams", "K"),
        Column("processes", "|Π|"),
        Column("lower_bound", "lower bound"),
        Column("messages_punctuation", "punctuations"),
        Column("messages_acker", "acker"),
        Column("messages_acker_unaggregated", "acker unaggr."),
        Column("acker_over_bound", "acker/bound", "{:.2f}"),
        Column("punct_over_acker", "punct/acker", "{:.1f}"),
    ]
    all_cases = cases(ctx.quick)
    if ctx.grid:
        all_cases = [Case(*dims) for dims in ctx.grid]
    ctx.label = NAME
    for case in ctx.track(
        all_cases, lambda c: f"P={c.producers} Q={c.partitions} S={c.stages} K={c.substreams}"
    ):
        row: dict[str, Any] = {
            "producers": case.producers,
            "partitions": case.partitions,
            "stages": case.stages,
            "substreams": case.substreams,
            "processes": case.processes,
            "lower_bound": case.lower_bound,
        }
        for mechanism, measure in (("punctuations", run_punctuations), ("acker", run_acker)):
            try:
                row.update(measure(ctx, case))
            except (SubstreamsError, KafkaException) as exc:  # kept in the table and JSON
                row[f"error_{mechanism}"] = str(exc)
                result.notes.append(f"{case}: {mechanism}: {exc}")
                ctx.log(f"[red]{case}: {mechanism}: {exc}[/]")
        row.setdefault("messages_punctuation", None)
        row.setdefault("messages_acker", None)
        row.setdefault("messages_acker_unaggregated", None)
        acker = row.get("messages_acker")
        row["acker_over_bound"] = round(acker / case.lower_bound, 3) if acker else None
        punct = row.get("messages_punctuation")
        row["punct_over_acker"] = round(punct / acker, 2) if acker and punct else None
        result.rows.append(row)
    result.targets = targets(result.rows)
    result.notes.append(
        "|Π| = P producers + S·Q stage tasks + Q consumer tasks; punctuation SEALs counted "
        "once per reading task; acker = acks-topic messages + control records x Q consumer "
        "tasks; REGISTER/UNREGISTER counted apart (setup_*)."
    )
    return result


def targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """A configuration that failed counts as a miss (it is never left out quietly)."""
    ratios = [r["acker_over_bound"] for r in rows if r.get("acker_over_bound") is not None]
    worst = max(ratios) if ratios else None
    failed = sum(1 for r in rows if r.get("error_acker"))
    big_rows = [r for r in rows if r["producers"] == 32 and r["partitions"] == 32]
    big = [r["punct_over_acker"] for r in big_rows if r.get("punct_over_acker")]
    big_failed = sum(1 for r in big_rows if r.get("error_acker") or r.get("error_punctuations"))
    least = min(big) if big else None
    value = "-" if worst is None else f"worst {worst:.2f}"
    if failed:
        value += f"; {failed} configuration(s) failed"
    value32 = "-" if least is None else f"least {least:.1f}"
    if big_failed:
        value32 += f"; {big_failed} configuration(s) failed"
    met: bool | None = None
    if failed:
        met = False
    elif worst is not None:
        met = worst <= 1.5
    met32: bool | None = None
    if big_failed:
        met32 = False
    elif least is not None:
        met32 = least >= 10
    return [
        Target("acker <= 1.5 x lower bound, every configuration", "<= 1.50", value, met),
        Target("punctuations / acker at 32x32", ">= 10", value32, met32),
    ]


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    stages = sorted({r["stages"] for r in result.rows})
    fig, axes = plt.subplots(1, len(stages), figsize=(5 * len(stages), 4), squeeze=False)
    for ax, s in zip(axes[0], stages, strict=True):
        rows = sorted((r for r in result.rows if r["stages"] == s), key=lambda r: r["processes"])
        x = [r["processes"] for r in rows]
        for key, label, style in (
            ("messages_punctuation", "punctuations", "o-"),
            ("messages_acker_unaggregated", "acker, no aggregation", "s--"),
            ("messages_acker", "acker", "^-"),
            ("lower_bound", "lower bound |Π| per substream", "k.:"),
        ):
            ys = [
                r[key] / r["substreams"] if r.get(key) is not None else float("nan") for r in rows
            ]
            if any(y == y for y in ys):  # not all NaN
                ax.plot(x, ys, style, label=label)
        loglog_axes(
            ax,
            "processes |Π|",
            "service messages delivered per substream",
            f"S = {s} stage{'s' if s > 1 else ''}",
        )
    fig.suptitle(titled("control traffic vs processes", result))
    save_figure(fig, path)
