"""The per-call floor of Spark's Kafka batch read, phase by phase, lever against lever.

``python -m substreams_bench.spark_read_floor [--calls N] [--levers a,b] [--bootstrap B]``

One warm ``local[2]`` session reads, N times per lever, a fresh ~100-record range of a
2-partition topic written as the firm path writes it (one transaction per epoch, so the
ranges sit between transaction markers): ``spark.read.format("kafka")`` in batch mode with
``assign`` / ``startingOffsets`` / ``endingOffsets`` and ``read_committed``, the JVM read
path's options.  Levers alternate call by call (round robin), so they share the machine's
load; each phase is a median over the calls after the first round.

Why these tools: the phases are Spark's own records, not guesses.  Spark's event log
(``spark.eventLog``, parsed after the session stops) gives each call's job submission,
task launch/finish and task metrics; a Log4j2 file with millisecond timestamps gives
the driver's offset resolution (the Kafka ``AdminClient`` creation to the relation's
``GetBatch generating RDD`` line), executor consumer creation (``ConsumerConfig values``)
and the executor consumer's own accounting (``KafkaDataConsumer``: records, polls, time
reading).  The Python side times only what it calls: building the DataFrame and the action.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOPIC = "floor"
PARTITIONS = 2
SCHEMA = {
    "type": "record", "name": "Click",
    "fields": [{"name": "user", "type": "string"}, {"name": "n", "type": "long"}],
}

LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.f.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{UNIX_MILLIS}} [%t] %c{{1}} %p: %m%n
logger.k.name = org.apache.spark.sql.kafka010
logger.k.level = debug
logger.kc.name = org.apache.kafka.common.utils.AppInfoParser
logger.kc.level = info
logger.cc.name = org.apache.kafka.clients.consumer.ConsumerConfig
logger.cc.level = info
logger.ac.name = org.apache.kafka.clients.admin.AdminClientConfig
logger.ac.level = info
"""


@contextlib.contextmanager
def _broker(bootstrap: str | None, work: Path) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from substreams.kafka.embedded import KafkaCluster

    with KafkaCluster(work / "kafka", progress=lambda m: None) as cluster:
        yield cluster.bootstrap


def _write(bootstrap: str, epochs: int, per_epoch: int) -> list[dict[int, tuple[int, int]]]:
    """``epochs`` transactions of ``per_epoch`` records over the partitions; each epoch's
    per-partition range ``[first, last + 1)`` (the firm path's ranges: the marker follows)."""
    import fastavro
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        try:
            f.result()
        except Exception as exc:  # already there from an earlier run on --bootstrap
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    parsed = fastavro.parse_schema(SCHEMA)
    prod = Producer({"bootstrap.servers": bootstrap, "transactional.id": "floor-writer",
                     "linger.ms": 5})
    prod.init_transactions()
    ranges: list[dict[int, tuple[int, int]]] = []
    for e in range(epochs):
        seen: dict[int, list[int]] = {}

        def report(err: Any, msg: Any, seen: dict[int, list[int]] = seen) -> None:
            assert err is None, err
            seen.setdefault(msg.partition(), []).append(msg.offset())

        prod.begin_transaction()
        for i in range(per_epoch):
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, {"user": f"u{i % 10}", "n": e * per_epoch + i})
            prod.produce(TOPIC, buf.getvalue(), partition=i % PARTITIONS, on_delivery=report)
        prod.commit_transaction()
        prod.flush()
        ranges.append({p: (min(o), max(o) + 1) for p, o in seen.items()})
    return ranges


def kafka_options(
    bootstrap: str, rng: Mapping[int, tuple[int, int]], group: str
) -> dict[str, str]:
    """The JVM read path's options (``substreams.spark.jvm_read.kafka_options``).  Each lever
    has its own group id: Spark's consumer pool refuses other settings under one key."""
    parts = sorted(rng)
    return {
        "kafka.bootstrap.servers": bootstrap,
        "assign": json.dumps({TOPIC: parts}),
        "startingOffsets": json.dumps({TOPIC: {str(p): rng[p][0] for p in parts}}),
        "endingOffsets": json.dumps({TOPIC: {str(p): rng[p][1] for p in parts}}),
        "kafka.isolation.level": "read_committed",
        "kafka.group.id": group,
        "failOnDataLoss": "true",
    }


@dataclass
class Lever:
    name: str
    what: str
    options: Callable[[dict[str, str]], dict[str, str]] = lambda o: o
    action: str = "count"
    """count: ``df.count()``; decode: ``from_avro`` + an aggregate over a decoded field;
    collect: decoded rows collected; range: ``spark.range(100).count()`` (no Kafka)."""
    reader: str = "relation"
    """relation: ``spark.read.format("kafka")``; direct: ``jvm_read.direct_frame``."""
    conf: dict[str, str] = field(default_factory=dict)
    """Session SQL settings for this lever's calls only (set before, reset after)."""


def _without(key: str) -> Callable[[dict[str, str]], dict[str, str]]:
    return lambda o: {k: v for k, v in o.items() if k != key}


def _with(**extra: str) -> Callable[[dict[str, str]], dict[str, str]]:
    return lambda o: {**o, **{k.replace("__", "."): v for k, v in extra.items()}}


LEVERS: dict[str, Lever] = {lv.name: lv for lv in (
    Lever("base", "JVM read path's options, count()"),
    Lever("decode", "base + from_avro + sum(length(user))", action="decode"),
    Lever("collect", "base + from_avro, rows collected to the driver", action="collect"),
    Lever("uncommitted", "isolation read_uncommitted (markers not skipped by the consumer)",
          _with(kafka__isolation__level="read_uncommitted")),
    Lever("poll100", "kafkaConsumer.pollTimeoutMs=100",
          _with(kafkaConsumer__pollTimeoutMs="100")),
    Lever("fetchwait10", "kafka.fetch.max.wait.ms=10 (executor consumer)",
          _with(kafka__fetch__max__wait__ms="10")),
    Lever("fetchwait200", "kafka.fetch.max.wait.ms=200 (executor consumer)",
          _with(kafka__fetch__max__wait__ms="200")),
    Lever("fetchwait10-noaqe", "fetch.max.wait.ms=10 and spark.sql.adaptive.enabled=false",
          _with(kafka__fetch__max__wait__ms="10"), conf={"spark.sql.adaptive.enabled": "false"}),
    Lever("direct", "fetch.max.wait.ms=10, Spark's KafkaSourceRDD built without the Kafka "
          "relation (substreams.spark.jvm_read.direct_frame)",
          _with(kafka__fetch__max__wait__ms="10"), action="count", reader="direct"),
    Lever("direct-noaqe", "direct, and spark.sql.adaptive.enabled=false",
          _with(kafka__fetch__max__wait__ms="10"), reader="direct",
          conf={"spark.sql.adaptive.enabled": "false"}),
    Lever("nogroup", "no kafka.group.id (a fresh group, so a fresh consumer, per call)",
          _without("kafka.group.id")),
    Lever("range", "spark.range(100).count(): a job without Kafka", action="range"),
)}


@dataclass
class Call:
    lever: str
    index: int
    t0: float = 0.0
    built: float = 0.0
    t1: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


def _action(spark: Any, lever: Lever, df: Any) -> dict[str, float]:
    """Run the lever's action; Spark's own planning phases of it (``QueryPlanningTracker``:
    analysis, optimization, planning; ms)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    if lever.action in ("count", "range"):
        out = df.groupBy().count()  # what df.count() runs, with its QueryExecution at hand
    else:
        dec = df.select(from_avro(F.col("value"), json.dumps(SCHEMA)).alias("d"))
        out = (dec.agg(F.sum(F.length("d.user"))) if lever.action == "decode"
               else dec.select("d.*"))
    out.collect()
    phases = out._jdf.queryExecution().tracker().phases()
    return {f"driver: {name} (tracker)": float(phases.apply(name).durationMs())
            for name in ("analysis", "optimization", "planning")
            if phases.contains(name)}


class Sampler:
    """``jstack`` of the Spark JVM every ``period`` s while running: where the driver's
    py4j thread and the executor task threads are, counted by their top Spark/Kafka frame
    (poor man's sampling profiler; each dump costs the JVM a safepoint)."""

    def __init__(self, pid: int, period: float = 0.1) -> None:
        import threading

        self.pid, self.period = pid, period
        self.counts: dict[str, dict[str, int]] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import subprocess

        while not self._stop.wait(self.period):
            dump = subprocess.run(["jstack", str(self.pid)], capture_output=True, text=True,
                                  check=False).stdout
            self.samples += 1
            for block in dump.split("\n\n"):
                head = block.split("\n", 1)[0]
                if head.startswith('"Thread-'):
                    kind = "driver (py4j call)"
                elif "Executor task launch worker" in head:
                    kind = "executor task"
                elif "dag-scheduler" in head:
                    kind = "dag-scheduler"
                else:
                    continue
                frames = [re.sub(r"\(.*\)$", "", ln.strip()[3:])
                          for ln in block.splitlines() if ln.strip().startswith("at ")]
                ours = [f for f in frames if f.startswith(("org.apache.spark", "org.apache.kafka"))]
                if kind == "driver (py4j call)" and not ours:
                    continue  # an idle py4j thread, waiting for a Python command
                top = frames[0] if frames else "?"
                if ours and ours[0] != top:
                    top = f"{top} <- {ours[0]}"
                self.counts.setdefault(kind, {})
                self.counts[kind][top] = self.counts[kind].get(top, 0) + 1

    def report(self, n: int = 12) -> None:
        print(f"# jstack samples: {self.samples} (every {self.period * 1000:.0f} ms)")
        for kind, tops in self.counts.items():
            print(f"## {kind}: top frames (Spark/Kafka), samples")
            for top, k in sorted(tops.items(), key=lambda kv: -kv[1])[:n]:
                print(f"  {k:4d}  {top}")


def _events(log_dir: Path) -> list[dict[str, Any]]:
    files = sorted(p for p in log_dir.rglob("*")
                   if p.is_file() and not p.name.startswith("appstatus"))
    out: list[dict[str, Any]] = []
    for p in files:
        for line in p.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


LOG_LINE = re.compile(r"^(\d{13}) \[([^\]]*)\] (\S+) (\w+): (.*)$")
CONSUMER_READ = re.compile(r"taking ([\d.]+) ms")


def _attribute(calls: list[Call], events: list[dict[str, Any]], log_lines: list[str]) -> None:
    """Fill each call's phases (ms) from the event log and the Log4j lines in its window."""
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    for ev in events:
        kind = ev.get("Event")
        if kind == "SparkListenerJobStart":
            props = ev.get("Properties") or {}
            jid = ev["Job ID"]
            jobs[jid] = {"call": props.get("floor.call"), "submit": ev["Submission Time"],
                         "tasks": []}
            for sid in ev.get("Stage IDs", []):
                stage_job[sid] = jid
        elif kind == "SparkListenerJobEnd":
            jobs[ev["Job ID"]]["end"] = ev["Completion Time"]
        elif kind == "SparkListenerTaskEnd":
            jid = stage_job.get(ev["Stage ID"])
            if jid is not None:
                info, m = ev["Task Info"], ev.get("Task Metrics") or {}
                jobs[jid]["tasks"].append((info["Launch Time"], info["Finish Time"],
                                           m.get("Executor Deserialize Time", 0),
                                           m.get("Executor Run Time", 0)))
    by_call: dict[str, list[dict[str, Any]]] = {}
    for j in jobs.values():
        if j["call"]:
            by_call.setdefault(j["call"], []).append(j)
    parsed = [m for m in (LOG_LINE.match(x) for x in log_lines) if m]
    for c in calls:
        ph = c.phases
        t0, built, t1 = c.t0 * 1000, c.built * 1000, c.t1 * 1000
        ph["build (py4j, relation)"] = built - t0
        js = sorted(by_call.get(f"{c.lever}#{c.index}", []), key=lambda j: j["submit"])
        if not js:
            ph["action"] = t1 - built
            continue
        ph["driver: action -> 1st job"] = js[0]["submit"] - built
        tasks = [t for j in js for t in j["tasks"]]
        first_launch = min(t[0] for t in tasks) if tasks else js[0]["submit"]
        last_finish = max(t[1] for t in tasks) if tasks else js[-1].get("end", t1)
        ph["jobs: submit -> 1st task"] = first_launch - js[0]["submit"]
        ph["tasks: 1st launch -> last finish"] = last_finish - first_launch
        ph["  task run time (sum)"] = float(sum(t[3] for t in tasks))
        ph["  task deserialize (sum)"] = float(sum(t[2] for t in tasks))
        ph["jobs: last task -> last job end"] = js[-1].get("end", last_finish) - last_finish
        ph["between jobs (gaps)"] = float(sum(
            max(0, b["submit"] - a.get("end", b["submit"])) for a, b in itertools.pairwise(js)))
        ph["driver: last job end -> return"] = t1 - js[-1].get("end", t1)
        ph["jobs"] = float(len(js))
        window = [m for m in parsed if t0 <= int(m.group(1)) <= t1]
        admin = [int(m.group(1)) for m in window if m.group(3) == "AdminClientConfig"]
        getbatch = [int(m.group(1)) for m in window if "GetBatch generating RDD" in m.group(5)]
        if admin and getbatch:
            ph["  driver offset resolution (admin -> ranges)"] = float(getbatch[0] - admin[0])
        ph["consumers created"] = float(sum(1 for m in window
                                            if m.group(3) == "ConsumerConfig"))
        read = [float(x) for m in window for x in CONSUMER_READ.findall(m.group(5))]
        if read:
            ph["  executor consumer read (sum)"] = float(sum(read))
        ph["total"] = t1 - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--calls", type=int, default=8, help="calls per lever")
    parser.add_argument("--records", type=int, default=100, help="records per read")
    parser.add_argument("--levers", default=",".join(LEVERS))
    parser.add_argument("--bootstrap", default=None, help="an existing broker (else embedded)")
    parser.add_argument("--conf", action="append", default=[], help="extra k=v Spark conf")
    parser.add_argument("--jstack", action="store_true",
                        help="sample the JVM's threads with jstack during the calls (perturbs "
                             "the timings: run it apart from a timing run)")
    parser.add_argument("--keep", default=None, help="keep the event log and Log4j file here")
    args = parser.parse_args()
    levers = [LEVERS[n] for n in args.levers.split(",")]
    import os

    with tempfile.TemporaryDirectory(prefix="ss-floor-") as tmp:
        work = Path(tmp)
        events_dir, log_file = work / "events", work / "spark.log"
        events_dir.mkdir()
        (work / "log4j2.properties").write_text(LOG4J.format(path=log_file))
        with _broker(args.bootstrap, work) as bootstrap:
            ranges = _write(bootstrap, args.calls * len(levers) + 1, args.records)
            from substreams.spark.session import session

            extra = dict(kv.split("=", 1) for kv in args.conf)
            java = f"-Xss16m -Dlog4j2.configurationFile=file:{work / 'log4j2.properties'}"
            spark = session("floor", master="local[2]", shuffle_partitions=2,
                            **{"spark.eventLog.enabled": "true",
                               "spark.eventLog.dir": f"file://{events_dir}",
                               "spark.eventLog.compress": "false",
                               "spark.eventLog.rolling.enabled": "false",
                               "spark.driver.extraJavaOptions": java, **extra})
            sc = spark.sparkContext
            calls: list[Call] = []
            # warm-up: one call of each lever on the first range (JIT, consumers, workers)
            order = [(r, lv) for r in range(args.calls) for lv in levers]
            warm = ranges.pop()
            for lv in levers:
                sc.setLocalProperty("floor.call", "warm-up")
                for k, v in lv.conf.items():
                    spark.conf.set(k, v)
                _one(spark, lv, bootstrap, warm)
                for k in lv.conf:
                    spark.conf.unset(k)
            sampler = Sampler(int(sc._jvm.ProcessHandle.current().pid()))  # type: ignore[union-attr]
            stack = contextlib.ExitStack()
            if args.jstack:
                stack.enter_context(sampler)
            for i, (r, lv) in enumerate(order):
                c = Call(lv.name, r)
                sc.setLocalProperty("floor.call", f"{lv.name}#{r}")
                for k, v in lv.conf.items():
                    spark.conf.set(k, v)
                c.t0 = time.time()
                df = _one_build(spark, lv, bootstrap, ranges[i])
                c.built = time.time()
                c.phases.update(_action(spark, lv, df))
                c.t1 = time.time()
                for k in lv.conf:
                    spark.conf.unset(k)
                calls.append(c)
            stack.close()
            spark.stop()
        load = os.getloadavg()
        _attribute(calls, _events(events_dir), log_file.read_text().splitlines())
        if args.keep:
            import shutil

            shutil.copytree(events_dir, Path(args.keep) / "events", dirs_exist_ok=True)
            shutil.copy(log_file, Path(args.keep) / "spark.log")
    _print(calls, levers, load, args)
    if args.jstack:
        sampler.report()


def _one_build(spark: Any, lever: Lever, bootstrap: str,
               rng: Mapping[int, tuple[int, int]]) -> Any:
    if lever.action == "range":
        return spark.range(100)
    group = f"substreams.spark.floor.{lever.name}"
    opts = lever.options(kafka_options(bootstrap, rng, group))
    if lever.reader == "direct":
        from substreams.spark.jvm_read import direct_frame

        return direct_frame(spark, opts)
    return spark.read.format("kafka").options(**opts).load()


def _one(spark: Any, lever: Lever, bootstrap: str, rng: Mapping[int, tuple[int, int]]) -> None:
    _action(spark, lever, _one_build(spark, lever, bootstrap, rng))


def _print(calls: list[Call], levers: list[Lever], load: tuple[float, float, float],
           args: argparse.Namespace) -> None:
    print(f"# spark_read_floor: {args.calls} calls per lever, {args.records} records per call, "
          f"local[2], load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for lv in levers:
        print(f"#   {lv.name}: {lv.what}")
    names: list[str] = []
    for c in calls:
        for n in c.phases:
            if n not in names:
                names.append(n)
    print("| phase (median ms) | " + " | ".join(lv.name for lv in levers) + " |")
    print("|---|" + "---:|" * len(levers))
    for n in names:
        cells = []
        for lv in levers:
            vals = [c.phases[n] for c in calls if c.lever == lv.name and n in c.phases]
            cells.append(f"{statistics.median(vals):.0f}" if vals else "-")
        print(f"| {n} | " + " | ".join(cells) + " |")
    for n in ("  executor consumer read (sum)", "total"):
        cells = []
        for lv in levers:
            vals = sorted(c.phases[n] for c in calls if c.lever == lv.name and n in c.phases)
            cells.append(f"{vals[min(len(vals) - 1, int(0.9 * len(vals)))]:.0f}" if vals else "-")
        print(f"| {n.strip()}, p90 | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
