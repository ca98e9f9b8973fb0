"""Benchmark 3: end-to-end throughput with tracking, against raw Kafka on the same broker.

Every line writes N records of the same value bytes to a 4-partition topic from one
producer and is timed from the first write until a reader has seen everything it needs:

- ``raw``: confluent-kafka produce (idempotent, not transactional) and a consumer that
  counts messages -- the ceiling, with the same value bytes as our Avro envelopes;
- ``raw transactional``: the same producer writing the same bytes in transactions of
  ``BATCH`` records (the publishers' cadence), read by the same ``read_committed`` counter
  -- the floor any exactly-once Python producer pays, so "% of raw txn" is the library's
  own cost per record;
- ``quix exactly-once``: Quix Streams 3.28's transactional producer
  (``Application(processing_guarantee="exactly-once").get_producer(transactional=True)``)
  writing the same bytes, committing every ``BATCH`` records, in a subprocess of its own
  venv (``$SUBSTREAMS_CACHE/quix-venv``, made on first use: Quix pins
  ``confluent-kafka<2.13``, ours is 2.16; ``substreams_bench/quix_producer.py``);
- ``untracked publisher``: our Publisher with no mechanism (``UNTRACKED``) (the Avro envelope per
  record, transactions of ``BATCH`` records) and the same counting consumer: the cost of
  our publisher without any substream mechanism;
- ``acker``: the Publisher with acker tracking, sealing every g records (``seal(...,
  commit=False)``: seals ride on the publisher's batch commits), the acker (its own
  process, ``substreams acker run``), the same counting data consumer, and the end = the
  last epoch's ``EpochComplete`` seen and every record read;
- ``punctuations``: the Publisher sealing every g records with punctuations, and one
  aligning consumer of all partitions; the end = the last epoch terminated;
- ``untracked publish_many`` / ``acker publish_many`` (#16): the same records through
  ``Publisher.publish_many``, ``SLICE`` records a call, one seal after each call (of the
  highest epoch it completed: seals are downward closed); their "% of untracked" is
  against the untracked batch line, so it is the cost of tracking alone.

Why the data readers count and do not decode: the raw line's reader cannot decode, and
what a subscriber does with a record is its own work, the same with or without tracking;
every line's data reader does the same work (count the data messages of the topic).
Decoding is still paid where the mechanism needs it: the punctuation aligner must read
every record's time.  Why ``BATCH``: a transaction commit waits for the broker (~3 ms
here); throughput-minded publishers batch more than the latency-minded default of 500.

Records per run scale with g (a seal per g records is the cost being measured), capped.
The lines run in ``repeats`` rounds, every line once a round, so that a slow minute of the
shared machine hits every line alike; a line reports the median rate, the spread of its runs
and whether it is too short to compare (:data:`MIN_RUN_S`, :data:`MAX_SPREAD`): such a line's
ratios and targets read "too short to compare", not a number.  Beside the rate, the CPU per
1 000 records of the broker JVM (``/proc/<pid>/stat``) and of everything else, so that the
broker's cost of a tracked line can be held against the Quix Streams peer's.

**Warm brokers.**  Every run gets a fresh broker JVM (``BenchContext.reset``), and a fresh
JVM compiles Kafka's hot paths while the line runs: on this 2-core machine its JIT compiler
threads took about half of the broker's CPU over a 300 000-record line, and their CPU is
taken from the line's producer and readers.  A deployed broker is warm.  So, in full runs,
each timed run follows one untimed run of the same line on the same broker, and the
broker's CPU is reported with its compiler threads' share apart ("of it JIT"); the
broker-CPU target compares what is left (the work a warm broker does).  Quick runs are
cold: their lines are too short to compare anyway.

Why the untracked lines run again at every smaller record count a tracked line uses (g=1's
2 000 quick / 150 000 full records): a line's time holds a fixed part that does not shrink
with its records -- the first commit (nothing is visible to a read_committed reader before
it), the readers' fetch after the last one, a fresh broker's JIT warming up -- so a rate
over 2 000 records is not comparable with one over 10 000 (session 10's profile,
``substreams_bench/profile_e2e.py``: the untracked publisher itself made ~7 000 records/s over 2 000
records and ~30 000 over 10 000 on the same machine).  "% of untracked" compares equal
record counts.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from substreams.app import UNTRACKED
from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.jvm import cache_home
from substreams.kafka import client
from substreams.streams.schemas import Codec, envelope_schema
from substreams_bench.harness import (
    BenchContext,
    BenchResult,
    Column,
    Target,
    command_line,
    jit_cpu_ticks,
    jit_ticks_between,
    loglog_axes,
    process_cpu_ticks,
    save_figure,
    titled,
)
from substreams_bench.observe import AckerObserver, PunctuationObserver, RecordCounter
from substreams_bench.workload import acker_process, close_all, open_publishers, record

NAME = "throughput"
PARTITIONS = 4
WAIT_S = 120.0
BATCH = 5000
SLICE = 1000
"""Records per ``publish_many`` call in the batch lines."""
RAW_TXN = "raw transactional"
QUIX = "quix exactly-once"
QUIX_VERSION = "3.28.1"
UNTRACKED_MANY = "untracked publish_many"
ACKER_MANY = "acker publish_many"
MANY_GRANULARITIES = (1, 100)


@dataclass(frozen=True)
class Plan:
    granularities: tuple[int, ...]
    max_records: int
    max_epochs: int
    repeats: int

    def records(self, granularity: int | None) -> int:
        if granularity is None:
            return self.max_records
        return min(self.max_records, granularity * self.max_epochs)


def plan(quick: bool) -> Plan:
    """The record counts.  Full: sized so that every line's run lasts over :data:`MIN_RUN_S`
    on this machine -- raw at ~250 000 records/s needs 300 000 records for 1.2 s, raw
    transactional at up to ~130 000 records/s needs 150 000 for g=1's baselines -- so that
    the full run measures its targets.  Quick: what finishes in minutes, and says it is too
    short."""
    if quick:
        return Plan((1, 100), 10000, 2000, 3)
    return Plan((1, 10, 100, 1000), 300_000, 150_000, 3)


def _config(ctx: BenchContext, mechanism: str | None) -> Config:
    subs = []
    if mechanism is not None:
        subs = [
            {
                "name": "ep",
                "stream": "s0",
                "kind": "epoch",
                "field": "batch",
                "mechanism": mechanism,
            }
        ]
    return ctx.config([("s0", PARTITIONS)], subs)


def _value_bytes(config: Config) -> bytes:
    """An envelope exactly like the publisher's (single-object encoded), for the raw line's
    value."""
    sc = config.streams[0]
    codec = Codec(envelope_schema(sc.schema), label="bench")
    return codec.encode_single(
        {
            "order_key": 0,
            "tracking_id": 0,
            "source": "src0",
            "times": {},
            "payload": record(0, 0),
        }
    )


@dataclass(frozen=True)
class Run:
    """One timed run: its wall time and the CPU time spent during it."""

    seconds: float
    broker_cpu_s: float | None
    """The broker JVM's utime + stime over the run; None when the broker is not ours."""
    broker_jit_s: float | None
    """Of it, its JIT compiler threads' (:func:`~substreams_bench.harness.jit_cpu_ticks`)."""
    client_cpu_s: float
    """Everything but the broker: this process (the producer and the reader threads) and
    the helper processes of the line (the acker, the Quix producer)."""


def _pid_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` so far (0 when gone)."""
    return process_cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")


class CpuClock:
    """Reads, at the start and at the end of a timed run, the CPU time of the embedded
    broker's JVM(s) (known only when the harness started the broker: a ``--bootstrap``
    broker's CPU is not ours to read) and of the client side (this process and the
    line's helper processes)."""

    def __init__(self, ctx: BenchContext, helpers: Sequence[int] = ()) -> None:
        self._brokers = [] if ctx.broker is None else [
            pid for node in ctx.broker.nodes if (pid := ctx.broker.pid(node.node_id))
        ]
        self._helpers = list(helpers)
        self._jit = [jit_cpu_ticks(pid) for pid in self._brokers]
        self._start = self._now()

    def _now(self) -> tuple[float | None, float]:
        broker = sum(map(_pid_cpu_s, self._brokers)) if self._brokers else None
        return broker, time.process_time() + sum(map(_pid_cpu_s, self._helpers))

    def run(self, seconds: float, extra_client_s: float = 0.0) -> Run:
        """The run that ends now and took ``seconds``."""
        (b0, c0), (b1, c1) = self._start, self._now()
        broker = None if b0 is None or b1 is None else b1 - b0
        jit = None
        if broker is not None:
            ticks = sum(
                jit_ticks_between(before, jit_cpu_ticks(pid))
                for pid, before in zip(self._brokers, self._jit, strict=True)
            )
            jit = ticks / os.sysconf("SC_CLK_TCK")
        return Run(seconds, broker, jit, c1 - c0 + extra_client_s)


def _produce_raw(producer: Any, topic: str, value: bytes, lo: int, hi: int) -> None:
    """Records ``lo`` to ``hi`` round-robin over the partitions with the bare client call
    (the raw lines measure the client, so not through the kafka layer's ``produce``)."""
    for i in range(lo, hi):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)


def run_raw(ctx: BenchContext, n: int, value: bytes) -> Run:
    topic = f"b.raw-throughput.{uuid.uuid4().hex[:8]}"
    ctx.topics([(topic, PARTITIONS)])
    producer = client.producer(ctx.bootstrap, None)
    with RecordCounter(ctx.bootstrap, None, topic, PARTITIONS) as counter:
        producer.produce(topic, value=value, partition=0)  # warm the connection, like the
        producer.flush(10)  # publishers' init_transactions does for the other lines
        counter.wait_for(1, WAIT_S)
        t0, cpu = time.time(), CpuClock(ctx)
        _produce_raw(producer, topic, value, 0, n)
        producer.flush(60)
        end = counter.wait_for(n + 1, WAIT_S)
        done = cpu.run(end - t0)
    del producer
    return done


def run_raw_txn(ctx: BenchContext, n: int, value: bytes) -> Run:
    """The raw line in transactions of ``BATCH`` records: what exactly-once costs by itself."""
    topic = f"b.rawtxn-throughput.{uuid.uuid4().hex[:8]}"
    ctx.topics([(topic, PARTITIONS)])
    producer = client.producer(
        ctx.bootstrap, None, transactional_id=f"bench.rawtxn.{uuid.uuid4().hex[:8]}"
    )
    with RecordCounter(ctx.bootstrap, None, topic, PARTITIONS) as counter:
        producer.init_transactions(30)
        producer.begin_transaction()  # warm up, as init_transactions does for publishers
        producer.produce(topic, value=value, partition=0)
        producer.commit_transaction(30)
        counter.wait_for(1, WAIT_S)
        t0, cpu = time.time(), CpuClock(ctx)
        for lo in range(0, n, BATCH):
            producer.begin_transaction()
            _produce_raw(producer, topic, value, lo, min(n, lo + BATCH))
            producer.commit_transaction(60)
        end = counter.wait_for(n + 1, WAIT_S)
        done = cpu.run(end - t0)
    del producer
    return done


class NotRun(Exception):
    """A baseline that could not run here (kept in the results with its reason)."""


def quix_python() -> Path:
    """The Python of Quix Streams' own venv, made on first use (it pins an older
    confluent-kafka than ours, so it cannot share our venv)."""
    venv = cache_home() / "quix-venv"
    python = venv / "bin" / "python"
    check = f"import quixstreams; assert quixstreams.__version__ == {QUIX_VERSION!r}"
    if python.exists() and subprocess.run(
        [str(python), "-c", check], capture_output=True, timeout=120
    ).returncode == 0:
        return python
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}"],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NotRun(f"cannot make Quix Streams' venv ({venv}): {exc}") from exc
        if done.returncode:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise NotRun(f"cannot make Quix Streams' venv ({venv}): {' '.join(tail)}")
    return python


def run_quix(ctx: BenchContext, python: Path, n: int, value: bytes) -> Run:
    """Quix Streams' exactly-once producer writing the raw line's records, timed like it:
    from the go (its process started, producer initialised, one record committed) until
    the counting reader saw every record; its CPU is what it reports for that span."""
    topic = f"b.quix-throughput.{uuid.uuid4().hex[:8]}"
    ctx.topics([(topic, PARTITIONS)])
    script = Path(__file__).with_name("quix_producer.py")
    with tempfile.NamedTemporaryFile(suffix=".value") as vf, RecordCounter(
        ctx.bootstrap, None, topic, PARTITIONS
    ) as counter:
        vf.write(value)
        vf.flush()
        proc = subprocess.Popen(
            [str(python), str(script), ctx.bootstrap, topic, str(n), str(BATCH),
             str(PARTITIONS), vf.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            if proc.stdout.readline().strip() != "ready":
                raise NotRun(f"the Quix producer did not start: {_tail(proc)}")
            counter.wait_for(1, WAIT_S)
            t0, cpu = time.time(), CpuClock(ctx)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            end = counter.wait_for(n + 1, WAIT_S)
            run = cpu.run(end - t0)
            done = proc.stdout.readline().split()
            if proc.wait(60) or len(done) != 2 or done[0] != "done":
                raise NotRun(f"the Quix producer failed: {_tail(proc)}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return Run(run.seconds, run.broker_cpu_s, run.broker_jit_s, run.client_cpu_s + float(done[1]))


def _tail(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate(timeout=30)
    return " | ".join((err or "").strip().splitlines()[-3:]) or f"exit {proc.returncode}"


def run_untracked(ctx: BenchContext, n: int, many: bool = False) -> Run:
    config = _config(ctx, None)
    stream = config.streams[0].name
    (pub,) = open_publishers(
        config, stream, ["src0"], ctx.bootstrap, mechanisms=UNTRACKED, batch_size=BATCH
    )
    try:
        with RecordCounter(ctx.bootstrap, config, stream, PARTITIONS) as counter:
            t0, cpu = time.time(), CpuClock(ctx)
            (sliced_publish_many if many else _publish)(pub, None, n, n)
            pub.flush()
            end = counter.wait_for(n, WAIT_S)
            done = cpu.run(end - t0)
    finally:
        close_all([pub])
        del pub
    return done


def run_tracked(
    ctx: BenchContext, mechanism: str, n: int, granularity: int, many: bool = False
) -> Run:
    config = _config(ctx, mechanism)
    stream = config.streams[0].name
    substream = config.substreams[0].name
    last_epoch = (n - 1) // granularity
    helpers: list[int] = []
    with contextlib.ExitStack() as stack:
        if mechanism == "acker":
            helpers.append(stack.enter_context(acker_process(config, ctx.bootstrap)))
        (pub,) = open_publishers(config, stream, ["src0"], ctx.bootstrap, batch_size=BATCH)
        stack.callback(close_all, [pub])
        if mechanism == "acker":
            notes = stack.enter_context(AckerObserver(ctx.bootstrap, config, substream))
            data = stack.enter_context(RecordCounter(ctx.bootstrap, config, stream, PARTITIONS))
            t0, cpu = time.time(), CpuClock(ctx, helpers)
            (sliced_publish_many if many else _publish)(pub, substream, n, granularity)
            end = max(notes.wait_for(last_epoch, WAIT_S), data.wait_for(n, WAIT_S))
        else:
            aligned = stack.enter_context(PunctuationObserver(ctx.bootstrap, config, substream))
            t0, cpu = time.time(), CpuClock(ctx)
            (sliced_publish_many if many else _publish)(pub, substream, n, granularity)
            end = aligned.wait_for(last_epoch, WAIT_S)
        done = cpu.run(end - t0)
        del pub
    return done


def _publish(pub: Any, substream: str | None, n: int, granularity: int) -> None:
    """One ``publish`` per record; with a ``substream``, a seal every ``granularity``."""
    for i in range(n):
        epoch = i // granularity
        pub.publish(record(i, epoch))
        if substream is not None and ((i + 1) % granularity == 0 or i == n - 1):
            # Fine-grained seals share the publisher's batch transactions (one commit per
            # batch_size records); the last one commits at once.
            pub.seal(substream, epoch, commit=i == n - 1)


def sliced_publish_many(pub: Any, substream: str | None, n: int, granularity: int) -> None:
    """The same records through ``publish_many``, ``SLICE`` records a call; after each call
    one seal of the highest epoch it completed (a seal is downward closed: it ends every
    earlier epoch of this source too, and the acker still notifies each epoch)."""
    sealed = -1
    for lo in range(0, n, SLICE):
        hi = min(n, lo + SLICE)
        pub.publish_many([record(i, i // granularity) for i in range(lo, hi)])
        if substream is None:
            continue
        done = (n - 1) // granularity if hi == n else hi // granularity - 1
        if done > sealed:
            pub.seal(substream, done, commit=hi == n)
            sealed = done


MIN_RUN_S = 1.0
"""A line whose median run is shorter is too short to compare.  Why 1 s: a run holds a part
that does not shrink with its records (the first commit, the readers' fetch after the last
one, the fresh broker's JIT warming up); fitted from the baselines' two record counts of one
run on this machine it is 0.1-0.2 s (the run's notes print the fit), so at 1 s it is at most
a fifth of the time -- the gap between the 80 % targets and 100 %."""
MAX_SPREAD = 0.20
"""A line whose runs spread wider (max - min, over the median) is too noisy to compare: its
runs disagree by more than the 20 points the targets tell apart."""
TOO_SHORT = "too short to compare"
OVER_100 = "over 100 %: noise, not a result"
"""A tracked line cannot be faster than the untracked one (it does the same and more)."""
TRACKED = ("acker", "punctuations", ACKER_MANY)


def spread(rates: Sequence[float]) -> float | None:
    """(max - min) / median of a line's runs, None for fewer than two runs."""
    if len(rates) < 2:
        return None
    mid = statistics.median(rates)
    return (max(rates) - min(rates)) / mid if mid else None


def too_short(seconds: float | None, spread_: float | None) -> str | None:
    """Why a line's rate cannot be compared with another's (None: it can)."""
    if seconds is not None and seconds < MIN_RUN_S:
        return f"median run {seconds:.2f} s < {MIN_RUN_S:.0f} s"
    if spread_ is not None and spread_ > MAX_SPREAD:
        return f"runs spread {spread_:.0%} > {MAX_SPREAD:.0%}"
    return None


def fixed_part(n1: int, t1: float, n2: int, t2: float) -> float:
    """The time of a run that does not grow with its records, from two record counts of
    one line (time = fixed + records / rate)."""
    return t1 - n1 * (t2 - t1) / (n2 - n1)


def _per_1k(values: Sequence[float | None], n: int) -> float | None:
    """The median of ``values`` (CPU seconds of a run) in ms per 1 000 records."""
    if not values or any(v is None for v in values):
        return None
    return round(statistics.median(v for v in values if v is not None) * 1e6 / n, 2)


def _warm(run: Run) -> float | None:
    """The broker's CPU over ``run`` but its JIT compilers': what a warm broker pays."""
    if run.broker_cpu_s is None or run.broker_jit_s is None:
        return None
    return max(0.0, run.broker_cpu_s - run.broker_jit_s)


def _row(
    line: str, granularity: int | None, n: int, runs: Sequence[Run], error: str | None
) -> dict[str, Any]:
    """The median of the runs: one hiccup of the shared machine moves it less than it
    moves a mean, and every line (baselines included) is treated alike; beside it the
    spread of the runs and whether the line is too short to compare.  A line with a run
    that did not finish has no rate: it is reported with its error."""
    ok = bool(runs) and error is None
    seconds = statistics.median(r.seconds for r in runs) if ok else None
    rates = [n / r.seconds for r in runs]
    spread_ = spread(rates) if ok else None
    return {
        "line": line,
        "granularity": granularity,
        "records": n,
        "seconds": None if seconds is None else round(seconds, 3),
        "records_per_s": None if seconds is None else round(n / seconds, 1),
        "spread": None if spread_ is None else round(spread_, 4),
        "too_short": too_short(seconds, spread_) if ok else None,
        "broker_cpu_ms_per_1k": _per_1k([r.broker_cpu_s for r in runs], n) if ok else None,
        "broker_jit_ms_per_1k": _per_1k([r.broker_jit_s for r in runs], n) if ok else None,
        "broker_warm_ms_per_1k": _per_1k([_warm(r) for r in runs], n) if ok else None,
        "client_cpu_ms_per_1k": _per_1k([r.client_cpu_s for r in runs], n) if ok else None,
        "runs_records_per_s": [round(x, 1) for x in rates],
        "runs_broker_cpu_s": [r.broker_cpu_s for r in runs],
        "runs_broker_jit_s": [r.broker_jit_s for r in runs],
        "runs_client_cpu_s": [round(r.client_cpu_s, 3) for r in runs],
        "complete": error is None,
        "error": error,
    }


def compare(
    row: dict[str, Any] | None, base: dict[str, Any] | None, capped: bool = False
) -> float | str | None:
    """``row``'s rate over ``base``'s; :data:`TOO_SHORT` when either line is; with
    ``capped`` (a tracked line against an untracked one) a ratio over 1 is noise,
    :data:`OVER_100`; None when either did not finish."""
    if row is None or base is None or not row.get("records_per_s"):
        return None
    if not base.get("records_per_s"):
        return None
    if row.get("too_short") or base.get("too_short"):
        return TOO_SHORT
    ratio = float(row["records_per_s"]) / float(base["records_per_s"])
    return OVER_100 if capped and ratio > 1.0 else round(ratio, 4)


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label)
    result.columns = [
        Column("line", "line"),
        Column("granularity", "records/substream"),
        Column("records", "records"),
        Column("records_per_s", "records/s", "{:,.0f}"),
        Column("spread", "spread", "±{:.0%}"),
        Column("seconds", "run s", "{:.2f}"),
        Column("vs_raw", "% of raw", "{:.1%}"),
        Column("vs_raw_txn", "% of raw txn", "{:.1%}"),
        Column("vs_untracked", "% of untracked", "{:.1%}"),
        Column("broker_cpu_ms_per_1k", "broker CPU ms/1k", "{:.1f}"),
        Column("broker_jit_ms_per_1k", "of it JIT ms/1k", "{:.1f}"),
        Column("client_cpu_ms_per_1k", "client CPU ms/1k", "{:.1f}"),
        Column("complete", "finished"),
    ]
    ctx.label = NAME
    p = plan(ctx.quick)
    probe = _config(ctx, None)
    value = _value_bytes(probe)
    steps: list[tuple[str, int | None, int]] = [
        # twice the records: warm, the ceiling ran 300 000 in under MIN_RUN_S
        ("raw", None, 2 * p.max_records),
        (RAW_TXN, None, p.max_records),
        (QUIX, None, p.max_records),
        ("untracked publisher", None, p.max_records),
        (UNTRACKED_MANY, None, p.max_records),
    ]
    # the same-sized baselines of the tracked lines with fewer records (module doc)
    for n in sorted({p.records(g) for g in p.granularities} - {p.max_records}):
        steps += [(RAW_TXN, None, n), (QUIX, None, n), ("untracked publisher", None, n),
                  (UNTRACKED_MANY, None, n)]
    quix: Path | NotRun | None = None
    mechanisms = [m for m in ("acker", "punctuations") if ctx.mechanism in (None, m)]
    steps += [(m, g, p.records(g)) for g in p.granularities for m in mechanisms]
    if ctx.mechanism in (None, "acker"):
        steps += [(ACKER_MANY, g, p.records(g)) for g in MANY_GRANULARITIES]
    # Rounds: every line once, then every line again, so that a slow minute of the shared
    # machine hits every line alike rather than all the runs of one.
    rounds = [(k, i) for k in range(p.repeats) for i in range(len(steps))]
    runs: list[list[Run]] = [[] for _ in steps]
    errors: list[str | None] = [None] * len(steps)

    def describe(item: tuple[int, int]) -> str:
        line, g, n = steps[item[1]]
        return f"round {item[0] + 1}/{p.repeats}: {line}" + (f" g={g}" if g else f" n={n}")

    for _, i in ctx.track(rounds, describe):
        line, g, n = steps[i]
        if errors[i] is not None:
            continue  # a line that failed once is reported with its error
        if line == QUIX and quix is None:
            try:
                quix = quix_python()
            except NotRun as exc:
                quix = exc
                result.notes.append(f"{QUIX}: not run: {exc}")
        if line == QUIX and isinstance(quix, NotRun):
            errors[i] = f"not run: {quix}"
            continue
        try:
            if not ctx.quick:  # untimed: warms the fresh broker's JIT (module doc)
                run_line(ctx, line, g, n, value, quix)
            runs[i].append(run_line(ctx, line, g, n, value, quix))
        except (SubstreamsError, KafkaException, NotRun) as exc:  # kept in the results
            errors[i] = str(exc)
            ctx.log(f"[red]{line} g={g}: {exc}[/]")
            result.notes.append(f"{line} g={g}: a run did not finish: {exc}")
    result.rows = [_row(line, g, n, runs[i], errors[i]) for i, (line, g, n) in enumerate(steps)]
    raw = result.rows[0]
    for row in result.rows:
        # a batch line against the untracked batch line of as many records: the cost of
        # tracking alone
        base = _untracked_row(result.rows, row["line"], row["records"])
        row["vs_raw"] = compare(row, raw)
        row["vs_raw_txn"] = compare(row, _same_records(result.rows, RAW_TXN, row["records"]))
        row["vs_untracked"] = compare(row, base, capped=row["line"] in TRACKED)
    result.rows[0]["value_bytes"] = len(value)
    result.targets = targets(result.rows)
    result.notes += stability_notes(result.rows, p)
    result.notes.append(
        f"value size {len(value)} bytes (our Avro envelope; raw writes the same bytes); "
        f"{PARTITIONS} partitions, one producer; the acker is its own process, readers are "
        "threads of the producer's process; data readers count messages on every line "
        f"(none decodes); publishers commit every {BATCH} records."
    )
    result.notes.append(
        "CPU per 1k records, the median of the runs: 'broker' is the embedded broker JVM's "
        "utime+stime (/proc/<pid>/stat) from the go to the end of the run (not measured with "
        "--bootstrap); 'client' is everything else in that span: this process (the producer "
        "and the reader threads, the same readers on every line), the acker process of the "
        "acker lines, the Quix producer's process (its own CPU report). 'of it JIT': the "
        "broker JVM's JIT compiler threads (/proc/<pid>/task/*/comm 'C1/C2 CompilerThre'), "
        "left out of the broker-CPU targets: a deployed broker is warm. "
        + ("Quick run: cold brokers, no warm-up run." if ctx.quick else
           "Each timed run followed an untimed run of the same line on the same broker.")
    )
    result.notes.append(
        f"'% of raw txn': against the raw transactional line of as many records (the same "
        f"producer settings and bytes as raw, a transaction per {BATCH} records). "
        f"{QUIX}: Quix Streams {QUIX_VERSION}'s transactional producer "
        "(Application(processing_guarantee='exactly-once').get_producer(transactional=True): "
        "Quix's own exactly-once write path without a consumer in front; its pipeline would "
        "also send consumer offsets in each transaction and commit every 5 s), the same "
        f"bytes round-robin over the partitions, a commit every {BATCH} records; timed from "
        "the go once its producer is initialised, read by the same read_committed counter. "
        "It runs as a subprocess of its own venv ($SUBSTREAMS_CACHE/quix-venv, made on first "
        "use by pip): Quix Streams pins confluent-kafka<2.13 (librdkafka 2.12), ours is 2.16."
    )
    result.notes.append(
        f"publish_many lines: {SLICE} records per call and one seal per call (of the highest "
        "epoch the call completed; a seal is downward closed, every epoch is still notified); "
        "their '% of untracked' is against the untracked publish_many line."
    )
    return result


def run_line(
    ctx: BenchContext, line: str, g: int | None, n: int, value: bytes,
    quix: Path | NotRun | None,
) -> Run:
    """One run of ``line`` (``quix``: the Quix venv's Python, for its line)."""
    if line == "raw":
        return run_raw(ctx, n, value)
    if line == RAW_TXN:
        return run_raw_txn(ctx, n, value)
    if line == QUIX:
        assert isinstance(quix, Path)
        return run_quix(ctx, quix, n, value)
    if line == "untracked publisher":
        return run_untracked(ctx, n)
    if line == UNTRACKED_MANY:
        return run_untracked(ctx, n, many=True)
    if line == ACKER_MANY:
        return run_tracked(ctx, "acker", n, g or 1, many=True)
    return run_tracked(ctx, line, n, g or 1)


def stability_notes(rows: Sequence[dict[str, Any]], p: Plan) -> list[str]:
    """What the run says about its own stability: how the rounds ran, the lines too short
    to compare, and the fixed part of a run fitted from the baselines' two record counts."""
    notes = [
        f"{p.repeats} rounds, each running every line once on a fresh broker (a slow minute "
        "hits every line alike); a rate is the median of the rounds, 'spread' is (max - min) "
        f"/ median of the runs. A line is {TOO_SHORT} when its median run is under "
        f"{MIN_RUN_S:.0f} s or its spread over {MAX_SPREAD:.0%}: its ratios read "
        f"'{TOO_SHORT}' and the targets it feeds are not measured (n/a)."
    ]
    short = [f"{r['line']} n={r['records']}: {r['too_short']}" for r in rows if r["too_short"]]
    if short:
        notes.append(f"{TOO_SHORT}: " + "; ".join(short))
    fits = []
    for line in ("raw", RAW_TXN, QUIX, "untracked publisher", UNTRACKED_MANY):
        timed = sorted(
            (r["records"], r["seconds"]) for r in rows
            if r["line"] == line and r["granularity"] is None and r["seconds"]
        )
        if len(timed) >= 2 and timed[0][0] != timed[-1][0]:
            (n1, t1), (n2, t2) = timed[0], timed[-1]
            fits.append(f"{line} {fixed_part(n1, t1, n2, t2):.2f} s")
    if fits:
        notes.append(
            "the fixed part of a run (time = fixed + records / rate, fitted from a line's two "
            "record counts): " + ", ".join(fits)
        )
    return notes


def _same_records(
    rows: Sequence[dict[str, Any]], line: str, records: int
) -> dict[str, Any] | None:
    """Baseline ``line`` over ``records`` records (or, not run at that count, over its most
    records)."""
    row = next((r for r in rows if r["line"] == line and r["records"] == records), None)
    return row or _row_of(rows, line, None)


def _untracked_of(line: str) -> str:
    return UNTRACKED_MANY if line in (UNTRACKED_MANY, ACKER_MANY) else "untracked publisher"


def _untracked_row(
    rows: Sequence[dict[str, Any]], line: str, records: int
) -> dict[str, Any] | None:
    """The untracked line ``line`` is measured against (``publish_many`` lines against
    ``publish_many``), over the same number of records (module doc: why)."""
    wanted = _untracked_of(line)
    return next((r for r in rows if r["line"] == wanted and r["records"] == records), None)


def _row_of(rows: Sequence[dict[str, Any]], line: str, g: int | None) -> dict[str, Any] | None:
    """The first row of ``line`` at ``g`` (an untracked line's first: the most records)."""
    return next((r for r in rows if r["line"] == line and r["granularity"] == g), None)


def _ratio_target(
    name: str,
    limit: float,
    row: dict[str, Any] | None,
    base: dict[str, Any] | None,
    capped: bool = False,
) -> Target:
    """A ``>= limit`` target on ``row`` over ``base``; not measured (met None) when either
    line is too short to compare or a capped ratio is over 100 %."""
    ratio = compare(row, base, capped)
    if ratio is None:
        return Target(name, f">= {limit:.0%}", "did not finish", None)
    if isinstance(ratio, str):
        return Target(name, f">= {limit:.0%}", f"not measured: {ratio}", None)
    return Target(name, f">= {limit:.0%}", f"{ratio:.1%}", ratio >= limit)


def targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """Issue #16's targets, for the batch API and for the per-record one, then the fair
    baselines', the broker's CPU against the peer, and the older targets against raw."""
    out = []
    raw = _row_of(rows, "raw", None)
    for api, untracked_line, acker_line in (
        ("publish_many", UNTRACKED_MANY, ACKER_MANY),
        ("publish", "untracked publisher", "acker"),
    ):
        untracked = _row_of(rows, untracked_line, None)
        out.append(_ratio_target(f"#16 untracked {api} vs raw", 0.5, untracked, raw))
        for g, limit in ((1, 0.8), (100, 0.95)):
            row = _row_of(rows, acker_line, g)
            same = None if row is None else _untracked_row(rows, acker_line, row["records"])
            out.append(_ratio_target(
                f"#16 acker {api} g={g} vs untracked {api} (same records)", limit, row, same,
                capped=True,
            ))
    out += baseline_targets(rows)
    out += cpu_targets(rows)
    for g, limit in ((100, 0.8), (1, 0.5)):
        row = _row_of(rows, "acker", g)
        if row is None:
            out.append(Target(f"acker throughput at granularity {g} vs raw", f">= {limit:.0%}",
                              "-", None))
        else:
            out.append(_ratio_target(f"acker throughput at granularity {g} vs raw", limit, row,
                                     raw))
    return out


def _quix_of(rows: Sequence[dict[str, Any]], records: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["line"] == QUIX and r["records"] == records), None)


def _not_run(row: dict[str, Any] | None) -> str | None:
    error = None if row is None else row.get("error")
    return error if error and error.startswith("not run") else None


def baseline_targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """The targets against the fair baselines: the untracked publisher against raw
    transactional (``publish`` reported beside it), the tracked publisher against Quix
    Streams' exactly-once producer at every granularity, equal record counts."""
    out = []
    txn = _row_of(rows, RAW_TXN, None)
    for api, line in (("publish_many", UNTRACKED_MANY), ("publish", "untracked publisher")):
        t = _ratio_target(f"untracked {api} vs raw transactional", 0.8, _row_of(rows, line, None),
                          txn)
        out.append(t if api == "publish_many" else Target(t.name, "reported", t.value, None))
    for line in (ACKER_MANY, "acker"):
        for row in (r for r in rows if r["line"] == line):
            quix = _quix_of(rows, row["records"])
            name = f"{line} g={row['granularity']} vs {QUIX} ({row['records']:,} records)"
            reason = _not_run(quix)
            if reason:
                out.append(Target(name, ">= 100%", reason, None))
                continue
            out.append(_ratio_target(name, 1.0, row, quix))
    return out


CPU_LIMIT = 1.5
"""The tracked publisher may cost the broker at most this many times the CPU per record of
Quix Streams' exactly-once producer on the same records."""


def cpu_target(name: str, row: dict[str, Any] | None, quix: dict[str, Any] | None) -> Target:
    """The broker's CPU per record of ``row`` against the Quix line of as many records, its
    JIT compilers' left out (module doc: a warm broker's work)."""
    limit = f"<= {CPU_LIMIT}x"
    reason = _not_run(quix)
    if reason:
        return Target(name, limit, reason, None)
    ours = None if row is None else row.get("broker_warm_ms_per_1k")
    peer = None if quix is None else quix.get("broker_warm_ms_per_1k")
    if row is None or quix is None or not row.get("records_per_s") or not quix.get(
        "records_per_s"
    ):
        return Target(name, limit, "did not finish", None)
    if ours is None or not peer:
        return Target(name, limit, "not measured: the broker is not the embedded one", None)
    if row.get("too_short") or quix.get("too_short"):
        return Target(name, limit, f"not measured: {TOO_SHORT}", None)
    ratio = float(ours) / float(peer)
    assert row is not None and quix is not None
    total = _ratio_text(row.get("broker_cpu_ms_per_1k"), quix.get("broker_cpu_ms_per_1k"))
    return Target(
        name, limit,
        f"{ratio:.2f}x ({ours:.1f} vs {peer:.1f} ms/1k without the JIT compilers; "
        f"with them {total})",
        ratio <= CPU_LIMIT,
    )


def _ratio_text(ours: float | None, peer: float | None) -> str:
    if ours is None or not peer:
        return "n/a"
    return f"{float(ours) / float(peer):.2f}x"


def cpu_targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """The peer line of the broker's CPU: the tracked publisher (both APIs, g=1 and g=100)
    against Quix Streams' exactly-once producer on as many records."""
    out = []
    for line in (ACKER_MANY, "acker"):
        for g in MANY_GRANULARITIES:
            row = _row_of(rows, line, g)
            if row is None:
                continue
            name = f"broker CPU/record: {line} g={g} vs {QUIX} ({row['records']:,} records)"
            out.append(cpu_target(name, row, _quix_of(rows, row["records"])))
    return out


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    grans = sorted({r["granularity"] for r in result.rows if r["granularity"] is not None})
    for line, style in (("acker", "^-"), ("punctuations", "o-"), (ACKER_MANY, "s-")):
        rows = sorted(
            (r for r in result.rows if r["line"] == line and r["records_per_s"]),
            key=lambda r: r["granularity"],
        )
        if rows:
            ax.plot(
                [r["granularity"] for r in rows],
                [r["records_per_s"] for r in rows],
                style,
                label=line,
            )
    for line, style in (("raw", "k--"), (RAW_TXN, "b--"), (QUIX, "r--"),
                        ("untracked publisher", "k:"), (UNTRACKED_MANY, "k-.")):
        row = next((r for r in result.rows if r["line"] == line), None)
        if row is not None and row["records_per_s"]:
            ax.axhline(
                row["records_per_s"],
                linestyle=style[1:],
                color=style[0],
                label=f"{line} ({row['records_per_s']:,.0f}/s)",
            )
    loglog_axes(
        ax,
        "records per substream (granularity)",
        "records / s, end to end",
        titled("throughput", result),
    )
    if grans:
        ax.set_xticks(grans, [str(g) for g in grans])
    save_figure(fig, path)
