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

Records per run scale with g (a seal per g records is the cost being measured), capped;
each line runs ``repeats`` times and reports the median rate (all runs are in the JSON).

Why the untracked lines run again at every smaller record count a tracked line uses (g=1's
2 000 quick / 20 000 full records): a line's time holds a fixed part that does not shrink
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
    loglog_axes,
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
    if quick:
        return Plan((1, 100), 10000, 2000, 3)
    return Plan((1, 10, 100, 1000), 40000, 20000, 3)


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
    """An envelope exactly like the publisher's, for the raw line's value."""
    sc = config.streams[0]
    codec = Codec(envelope_schema(sc.schema), label="bench")
    return codec.encode(
        {
            "order_key": 0,
            "tracking_id": 0,
            "source": "src0",
            "times": {},
            "payload": record(0, 0),
        }
    )


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


def run_raw(ctx: BenchContext, n: int, value: bytes) -> float:
    topic = f"b.raw-throughput.{uuid.uuid4().hex[:8]}"
    ctx.topics([(topic, PARTITIONS)])
    producer = client.producer(ctx.bootstrap, None)
    with RecordCounter(ctx.bootstrap, None, topic, PARTITIONS) as counter:
        producer.produce(topic, value=value, partition=0)  # warm the connection, like the
        producer.flush(10)  # publishers' init_transactions does for the other lines
        counter.wait_for(1, WAIT_S)
        t0 = time.time()
        _produce_raw(producer, topic, value, 0, n)
        producer.flush(60)
        end = counter.wait_for(n + 1, WAIT_S)
    del producer
    return end - t0


def run_raw_txn(ctx: BenchContext, n: int, value: bytes) -> float:
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
        t0 = time.time()
        for lo in range(0, n, BATCH):
            producer.begin_transaction()
            _produce_raw(producer, topic, value, lo, min(n, lo + BATCH))
            producer.commit_transaction(60)
        end = counter.wait_for(n + 1, WAIT_S)
    del producer
    return end - t0


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


def run_quix(ctx: BenchContext, python: Path, n: int, value: bytes) -> float:
    """Quix Streams' exactly-once producer writing the raw line's records, timed like it:
    from the go (its process started, producer initialised, one record committed) until
    the counting reader saw every record."""
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
            t0 = time.time()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            end = counter.wait_for(n + 1, WAIT_S)
            if proc.wait(60):
                raise NotRun(f"the Quix producer failed: {_tail(proc)}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return end - t0


def _tail(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate(timeout=30)
    return " | ".join((err or "").strip().splitlines()[-3:]) or f"exit {proc.returncode}"


def run_untracked(ctx: BenchContext, n: int, many: bool = False) -> float:
    config = _config(ctx, None)
    stream = config.streams[0].name
    (pub,) = open_publishers(
        config, stream, ["src0"], ctx.bootstrap, mechanisms=UNTRACKED, batch_size=BATCH
    )
    try:
        with RecordCounter(ctx.bootstrap, config, stream, PARTITIONS) as counter:
            t0 = time.time()
            (sliced_publish_many if many else _publish)(pub, None, n, n)
            pub.flush()
            end = counter.wait_for(n, WAIT_S)
    finally:
        close_all([pub])
        del pub
    return end - t0


def run_tracked(
    ctx: BenchContext, mechanism: str, n: int, granularity: int, many: bool = False
) -> float:
    config = _config(ctx, mechanism)
    stream = config.streams[0].name
    substream = config.substreams[0].name
    last_epoch = (n - 1) // granularity
    with contextlib.ExitStack() as stack:
        if mechanism == "acker":
            stack.enter_context(acker_process(config, ctx.bootstrap))
        (pub,) = open_publishers(config, stream, ["src0"], ctx.bootstrap, batch_size=BATCH)
        stack.callback(close_all, [pub])
        if mechanism == "acker":
            notes = stack.enter_context(AckerObserver(ctx.bootstrap, config, substream))
            data = stack.enter_context(RecordCounter(ctx.bootstrap, config, stream, PARTITIONS))
            t0 = time.time()
            (sliced_publish_many if many else _publish)(pub, substream, n, granularity)
            end = max(notes.wait_for(last_epoch, WAIT_S), data.wait_for(n, WAIT_S))
        else:
            aligned = stack.enter_context(PunctuationObserver(ctx.bootstrap, config, substream))
            t0 = time.time()
            (sliced_publish_many if many else _publish)(pub, substream, n, granularity)
            end = aligned.wait_for(last_epoch, WAIT_S)
        del pub
    return end - t0


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


def _row(
    line: str, granularity: int | None, n: int, runs: Sequence[float], error: str | None
) -> dict[str, Any]:
    """The median of the repeated runs: one hiccup of the shared machine moves it less
    than it moves a mean, and every line (baselines included) is treated alike.  A line
    with a run that did not finish has no rate: it is reported with its error."""
    seconds = statistics.median(runs) if runs and error is None else None
    return {
        "line": line,
        "granularity": granularity,
        "records": n,
        "seconds": None if seconds is None else round(seconds, 3),
        "records_per_s": None if seconds is None else round(n / seconds, 1),
        "runs_records_per_s": [round(n / r, 1) for r in runs],
        "complete": error is None,
        "error": error,
    }


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label)
    result.columns = [
        Column("line", "line"),
        Column("granularity", "records/substream"),
        Column("records", "records"),
        Column("records_per_s", "records/s", "{:,.0f}"),
        Column("vs_raw", "% of raw", "{:.1%}"),
        Column("vs_raw_txn", "% of raw txn", "{:.1%}"),
        Column("vs_untracked", "% of untracked", "{:.1%}"),
        Column("complete", "finished"),
    ]
    ctx.label = NAME
    p = plan(ctx.quick)
    probe = _config(ctx, None)
    value = _value_bytes(probe)
    steps: list[tuple[str, int | None, int]] = [
        ("raw", None, p.max_records),
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
    steps += [(m, g, p.records(g)) for g in p.granularities for m in ("acker", "punctuations")]
    steps += [(ACKER_MANY, g, p.records(g)) for g in MANY_GRANULARITIES]

    def describe(step: tuple[str, int | None, int]) -> str:
        return f"{step[0]}" + (f" g={step[1]}" if step[1] else f" n={step[2]}")

    for line, g, n in ctx.track(steps, describe):
        runs: list[float] = []
        error: str | None = None
        if line == QUIX and quix is None:
            try:
                quix = quix_python()
            except NotRun as exc:
                quix = exc
                result.notes.append(f"{QUIX}: not run: {exc}")
        if line == QUIX and isinstance(quix, NotRun):
            result.rows.append(_row(line, g, n, [], f"not run: {quix}"))
            continue
        for k in range(p.repeats):
            if k:
                ctx.reset()  # every run on a fresh broker, as every line's first is
            try:
                if line == "raw":
                    runs.append(run_raw(ctx, n, value))
                elif line == RAW_TXN:
                    runs.append(run_raw_txn(ctx, n, value))
                elif line == QUIX:
                    assert isinstance(quix, Path)
                    runs.append(run_quix(ctx, quix, n, value))
                elif line == "untracked publisher":
                    runs.append(run_untracked(ctx, n))
                elif line == UNTRACKED_MANY:
                    runs.append(run_untracked(ctx, n, many=True))
                elif line == ACKER_MANY:
                    runs.append(run_tracked(ctx, "acker", n, g or 1, many=True))
                else:
                    runs.append(run_tracked(ctx, line, n, g or 1))
            except (SubstreamsError, KafkaException, NotRun) as exc:  # kept in the results
                error = str(exc)
                ctx.log(f"[red]{line} g={g}: {error}[/]")
                result.notes.append(f"{line} g={g}: a run did not finish: {error}")
                break
        result.rows.append(_row(line, g, n, runs, error))
    raw = result.rows[0]["records_per_s"]
    for row in result.rows:
        rate = row["records_per_s"]
        # a batch line against the untracked batch line of as many records: the cost of
        # tracking alone
        base = _untracked_rate(result.rows, row["line"], row["records"])
        txn = _same_records(result.rows, RAW_TXN, row["records"])
        row["vs_raw"] = round(rate / raw, 4) if rate and raw else None
        row["vs_raw_txn"] = round(rate / txn, 4) if rate and txn else None
        row["vs_untracked"] = round(rate / base, 4) if rate and base else None
    result.rows[0]["value_bytes"] = len(value)
    result.targets = targets(result.rows)
    result.notes.append(
        f"value size {len(value)} bytes (our Avro envelope; raw writes the same bytes); "
        f"{PARTITIONS} partitions, one producer; the acker is its own process, readers are "
        "threads of the producer's process; data readers count messages on every line "
        f"(none decodes); publishers commit every {BATCH} records."
    )
    old_basis = [
        f"{r['line']} g={r['granularity']} {r['records_per_s'] / base:.1%}"
        for r in result.rows
        if r["granularity"] is not None and r["records"] != p.max_records and r["records_per_s"]
        and (base := _rate(result.rows, _untracked_of(r["line"]), None))
    ]
    if old_basis:
        result.notes.append(
            "'% of untracked' compares equal record counts (the untracked lines also run at "
            "each smaller count); against the untracked line of "
            f"{p.max_records} records instead (the basis before session 10): "
            + ", ".join(old_basis)
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


def _same_records(rows: Sequence[dict[str, Any]], line: str, records: int) -> float | None:
    """The rate of baseline ``line`` over ``records`` records (or, not run at that count,
    over its most records)."""
    row = next((r for r in rows if r["line"] == line and r["records"] == records), None)
    row = row or _row_of(rows, line, None)
    return None if row is None else row["records_per_s"]


def _untracked_of(line: str) -> str:
    return UNTRACKED_MANY if line in (UNTRACKED_MANY, ACKER_MANY) else "untracked publisher"


def _untracked_rate(rows: Sequence[dict[str, Any]], line: str, records: int) -> float | None:
    """The rate of the untracked line ``line`` is measured against (``publish_many`` lines
    against ``publish_many``), over the same number of records (module doc: why)."""
    wanted = _untracked_of(line)
    row = next((r for r in rows if r["line"] == wanted and r["records"] == records), None)
    return None if row is None else row["records_per_s"]


def _pct(x: float | None) -> str:
    return "did not finish" if x is None else f"{x:.1%}"


def _rate(rows: Sequence[dict[str, Any]], line: str, g: int | None) -> float | None:
    """The rate of ``line`` at ``g`` (an untracked line: over the most records)."""
    row = _row_of(rows, line, g)
    return None if row is None else row["records_per_s"]


def _row_of(rows: Sequence[dict[str, Any]], line: str, g: int | None) -> dict[str, Any] | None:
    """The first row of ``line`` at ``g`` (an untracked line's first: the most records)."""
    return next((r for r in rows if r["line"] == line and r["granularity"] == g), None)


def _ratio_target(
    name: str, limit: float, num: float | None, den: float | None
) -> Target:
    if num is None or not den:
        return Target(name, f">= {limit:.0%}", "did not finish", None)
    ratio = num / den
    return Target(name, f">= {limit:.0%}", f"{ratio:.1%}", ratio >= limit)


def targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """Issue #16's targets, for the batch API and for the per-record one, then the older
    targets against raw."""
    out = []
    raw = _rate(rows, "raw", None)
    for api, untracked_line, acker_line in (
        ("publish_many", UNTRACKED_MANY, ACKER_MANY),
        ("publish", "untracked publisher", "acker"),
    ):
        untracked = _rate(rows, untracked_line, None)
        out.append(_ratio_target(f"#16 untracked {api} vs raw", 0.5, untracked, raw))
        for g, limit in ((1, 0.8), (100, 0.95)):
            row = _row_of(rows, acker_line, g)
            same = None if row is None else _untracked_rate(rows, acker_line, row["records"])
            out.append(
                _ratio_target(
                    f"#16 acker {api} g={g} vs untracked {api} (same records)",
                    limit,
                    None if row is None else row["records_per_s"],
                    same,
                )
            )
    out += baseline_targets(rows)
    for g, limit in ((100, 0.8), (1, 0.5)):
        row = _row_of(rows, "acker", g)
        out.append(
            Target(
                f"acker throughput at granularity {g} vs raw",
                f">= {limit:.0%}",
                "-" if row is None else _pct(row["vs_raw"]),
                None if row is None else (row["vs_raw"] or 0.0) >= limit,
            )
        )
    return out


def baseline_targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """The targets against the fair baselines: the untracked publisher against raw
    transactional (``publish`` reported beside it), the tracked publisher against Quix
    Streams' exactly-once producer at every granularity, equal record counts."""
    out = []
    txn = _rate(rows, RAW_TXN, None)
    for api, line in (("publish_many", UNTRACKED_MANY), ("publish", "untracked publisher")):
        t = _ratio_target(f"untracked {api} vs raw transactional", 0.8, _rate(rows, line, None),
                          txn)
        out.append(t if api == "publish_many" else Target(t.name, "reported", t.value, None))
    for line in (ACKER_MANY, "acker"):
        for row in (r for r in rows if r["line"] == line):
            quix = next(
                (r for r in rows if r["line"] == QUIX and r["records"] == row["records"]), None
            )
            name = f"{line} g={row['granularity']} vs {QUIX} ({row['records']:,} records)"
            if quix is not None and quix["error"] and quix["error"].startswith("not run"):
                out.append(Target(name, ">= 100%", quix["error"], None))
                continue
            out.append(_ratio_target(
                name, 1.0, row["records_per_s"], None if quix is None else quix["records_per_s"]
            ))
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
