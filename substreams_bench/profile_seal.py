"""Where seal -> EpochComplete time goes, phase by phase (issue #16, session 9).

    python -m substreams_bench.profile_seal [--samples 100] [--records 10] [--eos-debug] \
        [--seal-in-txn] [--broker-setting KEY=VALUE ...] [--nodes 1|3] \
        [--client-setting KEY=VALUE ...] [--warmup N]

Starts an embedded Apache Kafka and ``substreams acker run`` as its own process with
``SUBSTREAMS_ACKER_PHASES=1`` (the acker logs each notifying step's phases), then, like
``bench acker``'s latency row: one publisher writes ``--records`` records of epoch i,
commits, and at t0 calls ``seal()``; a ``ControlFollower`` of the substream's control topic sees
``EpochComplete(i)``.  The publisher's producer is wrapped to time its transaction calls.
Per epoch, on one wall clock (all processes share the machine):

- seal: begin + the acks message produced (t0 -> the publisher's commit called);
- publisher commit: its flush and EndTxn round trip;
- LSO + acker wake: the publisher's commit returned -> the acker's poll returned the ack
  (transaction markers written, last stable offset advanced, the read_committed fetch
  answered);
- acker apply / decide / begin / produce / commit: the acker's step, from its phase log;
- subscriber sees: the acker's commit returned -> the tail decoded the record.

Prints p50 / p99 / mean of each phase and of the total.  ``--eos-debug``: librdkafka's
``debug=eos`` on the publisher and the acker, to count the AddPartitionsToTxn requests the
coordinator refused with CONCURRENT_TRANSACTIONS (the previous transaction of the same
transactional id still writing its markers; librdkafka retries after a fixed 20 ms).
``--seal-in-txn``: no commit between an epoch's records and its seal, so ``seal()`` commits
both in one transaction -- no transaction of the publisher begins right after another ended
(what a user who publishes an epoch and seals it gets), at the price of waiting for the
records' delivery reports inside ``seal()`` (the acks carry their offsets).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from substreams.app import Application
from substreams.config import load_config
from substreams.control.messages import completions
from substreams_bench.acker import control_tail
from substreams_bench.harness import bench_context, parse_settings, percentile
from substreams_bench.workload import acker_process

PHASE = re.compile(
    r"phases acks=(\d+) first_ack_create_ms=(-?\d+) woke_wall=([\d.]+) waited=([\d.]+) "
    r"apply=([\d.]+) decide=([\d.]+) begin=([\d.]+) produce=([\d.]+) commit=([\d.]+) "
    r"after=([\d.]+) last=(\S*)"
)


class Refusals(logging.Handler):
    """Counts librdkafka's CONCURRENT_TRANSACTIONS answers to AddPartitionsToTxn."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "another concurrent operation" in record.getMessage():
            self.at.append(time.time())


class TimedProducer:
    """Delegates to a confluent-kafka Producer, recording when each transaction call ran."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[tuple[str, float, float]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("begin_transaction", "commit_transaction", "flush"):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.time()
            try:
                return attr(*args, **kwargs)
            finally:
                self.calls.append((name, start, time.time()))

        return timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--records", type=int, default=10)
    ap.add_argument("--eos-debug", action="store_true")
    ap.add_argument("--keep-log", type=Path, help="copy the acker's log here")
    ap.add_argument(
        "--seal-in-txn", action="store_true",
        help="no commit between the epoch's records and its seal: seal() commits both in one "
        "transaction (no back-to-back transactions of the publisher)",
    )
    ap.add_argument(
        "--broker-setting", action="append", default=[], metavar="KEY=VALUE",
        help="a property over the embedded broker's defaults; repeatable",
    )
    ap.add_argument(
        "--warmup", type=int, default=0, metavar="N",
        help="seals run first and left out of the tables (a fresh broker's JIT compilers "
        "catch up: harness.WARMUP_S)",
    )
    ap.add_argument(
        "--nodes", type=int, choices=(1, 3), default=1,
        help="embedded brokers: 3 replicate every topic (factor 3, 2 in sync), as production",
    )
    ap.add_argument(
        "--client-setting", action="append", default=[], metavar="KEY=VALUE",
        help="a librdkafka property for every client of the run (kafka.client), e.g. "
        "fetch.wait.max.ms=500; repeatable",
    )
    args = ap.parse_args()
    settings = parse_settings(tuple(args.broker_setting))
    clients: dict[str, Any] = {
        k: int(v) if v.isdigit() else v
        for k, v in parse_settings(tuple(args.client_setting), "--client-setting").items()
    }
    refusals = Refusals()
    overrides: dict[str, Any] = {}
    if args.eos_debug:
        rdlog = logging.getLogger("rdkafka.publisher")
        rdlog.addHandler(refusals)
        rdlog.setLevel(logging.DEBUG)
        rdlog.propagate = False
        overrides = {"debug": "eos", "log_level": 7, "logger": rdlog}
    os.environ["SUBSTREAMS_ACKER_PHASES"] = "1"
    with bench_context(quick=True, broker_settings=settings, nodes=args.nodes) as ctx:
        config = ctx.config(
            [("bench", 1)],
            [{"name": "e", "stream": "bench", "kind": "epoch", "field": "batch"}],
            acker={"heartbeat_ms": 500},
        )
        if clients:  # every client of the run: the publisher, the acker, the tail
            doc = yaml.safe_load(config.path.read_text())
            doc.setdefault("kafka", {})["client"] = clients
            config.path.write_text(yaml.safe_dump(doc, sort_keys=False))
            config = load_config(config.path)
        stream, sub = config.streams[0].name, config.substreams[0].name
        seen: dict[object, tuple[float, int]] = {}
        pub_phases: dict[int, tuple[float, float, float, float]] = {}
        acker_config = config
        if args.eos_debug:  # the same topics, librdkafka's eos debug in the acker process
            doc = yaml.safe_load(config.path.read_text())
            doc.setdefault("kafka", {})["client"] = {**clients, "debug": "eos", "log_level": 7}
            path = Path(str(config.path).replace(".yaml", ".eos.yaml"))
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            acker_config = load_config(path)
        with acker_process(acker_config, ctx.bootstrap):
            tail = control_tail(ctx.bootstrap, config, config.acker.control_topic(sub))
            app = Application(config, ctx.bootstrap)
            with app.publisher(stream, "lat-src", producer_overrides=overrides) as pub:
                timed = TimedProducer(pub._producer)
                pub._producer = timed  # type: ignore[assignment]
                ts = 0
                for i in range(args.samples + args.warmup + 1):
                    for _ in range(args.records):
                        pub.publish({"ts": ts, "batch": i, "body": "x" * 100})
                        ts += 1
                    if not args.seal_in_txn:
                        pub.flush()
                    timed.calls.clear()
                    t0 = time.time()
                    pub.seal(sub, i)
                    t1 = time.time()
                    ends = [c for c in timed.calls if c[0] == "commit_transaction"]
                    pub_phases[i] = (t0, ends[0][1], ends[-1][2], t1)
                    deadline = time.time() + 10
                    while i not in seen and time.time() < deadline:
                        for followed in tail.poll(0.001, 100):
                            for note in completions(followed.record.body):
                                seen[note.time] = (time.time(), followed.record.written_at_ms)
                    time.sleep(0.02)
            tail.close()
            time.sleep(0.5)
        log = acker_config.path.with_suffix(".acker.log").read_text(errors="replace")
        if args.keep_log:
            args.keep_log.write_text(log)
    acker: dict[int, tuple[float, ...]] = {}
    for m in PHASE.finditer(log):
        woke = float(m.group(3))
        nums = [float(m.group(k)) / 1e3 for k in range(5, 11)]
        for part in m.group(11).split(","):
            if part.startswith(sub + "@"):
                acker[int(part.rsplit("@", 1)[1])] = (woke, *nums, float(m.group(1)))
    rows: dict[str, list[float]] = {}
    measured = range(1 + args.warmup, args.samples + args.warmup + 1)
    seal_refused = {
        i: sum(1 for at in refusals.at if pub_phases[i][0] <= at <= pub_phases[i][3])
        for i in measured if i in pub_phases
    }
    for i in measured:
        if i not in seen or i not in acker or i not in pub_phases:
            continue
        t0, c0, c1, t1 = pub_phases[i]
        woke, apply, decide, begin, produce, commit, _after, _ = acker[i]
        acked = woke + apply + decide + begin + produce + commit
        parts = {
            "publisher: seal() to its commit": c0 - t0,
            "publisher: commit_transaction": c1 - c0,
            "publisher: after commit": t1 - c1,
            "commit returned -> acker poll returned": woke - c1,
            "acker: apply": apply,
            "acker: decide (announce, encode bodies)": decide,
            "acker: begin_transaction": begin,
            "acker: encode + produce": produce,
            "acker: commit_transaction": commit,
            "acker commit returned -> subscriber saw it": seen[i][0] - acked,
            "total: seal() -> subscriber saw it": seen[i][0] - t0,
        }
        for k, v in parts.items():
            rows.setdefault(k, []).append(v * 1e3)
    n = len(rows.get("total: seal() -> subscriber saw it", []))
    print(f"{n} epochs matched (of {args.samples}); ms")
    print(f"{'phase':50s} {'p50':>8s} {'p90':>8s} {'p99':>8s} {'mean':>8s}")
    for k, ms in rows.items():
        print(f"{k:50s} {percentile(ms, 50):8.2f} {percentile(ms, 90):8.2f} "
              f"{percentile(ms, 99):8.2f} "
              f"{statistics.fmean(ms):8.2f}")
    if args.eos_debug:
        hit = sum(1 for n in seal_refused.values() if n)
        commits = rows.get("publisher: commit_transaction", [])
        matched = [i for i in measured
                   if i in seen and i in acker and i in pub_phases]
        for label, want in (("refused", True), ("not refused", False)):
            got = [c for c, i in zip(commits, matched, strict=True)
                   if bool(seal_refused[i]) == want]
            if got:
                print(f"publisher commit_transaction, AddPartitionsToTxn {label}: n={len(got)} "
                      f"p50 {percentile(got, 50):.2f} p90 {percentile(got, 90):.2f} ms")
        print(f"publisher: {hit} of {len(seal_refused)} seal transactions had their "
              f"AddPartitionsToTxn refused (CONCURRENT_TRANSACTIONS) "
              f"{sum(seal_refused.values())} times in all")
        acker_refused = log.count("another concurrent operation")
        txns = sum(1 for _ in PHASE.finditer(log))
        print(f"acker: {acker_refused} CONCURRENT_TRANSACTIONS refusals over {txns} "
              f"notifying transactions (and its heartbeat transactions); "
              f"{log.count('Registering partitions with transaction')} AddPartitionsToTxn "
              "requests in all")


if __name__ == "__main__":
    main()
