"""`substreams bench` as a user runs it: a smoke test of the outputs, not a timed test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from substreams.kafka import client
from substreams.kafka.embedded import broker_answers
from substreams_bench.harness import bench_context, jit_cpu_ticks, release_clients
from tests.conftest import SPARK_GROUP

REPO = Path(__file__).resolve().parents[2]

TRAFFIC_FIELDS = (
    "producers",
    "partitions",
    "stages",
    "substreams",
    "messages_punctuation",
    "messages_acker",
    "messages_acker_unaggregated",
    "lower_bound",
)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "substreams", "bench", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )


def test_bench_traffic_quick_writes_json_and_png(bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = bench(
        "traffic", "--quick", "--grid", "2x2x1x2", "--out", str(out), "--bootstrap", bootstrap
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "target met" in done.stdout

    data = json.loads((out / "traffic.json").read_text())
    assert data["name"] == "traffic" and data["quick"] is True
    assert len(data["rows"]) == 1
    row = data["rows"][0]
    for field in TRAFFIC_FIELDS:
        assert isinstance(row[field], int), (field, row)
    assert (row["producers"], row["partitions"], row["stages"], row["substreams"]) == (2, 2, 1, 2)
    # |Π| = 2 producers + 1 stage x 2 tasks + 2 consumer tasks; K = 2 substreams
    assert row["lower_bound"] == 2 * 6
    # punctuations: per substream P·Q SEALs into s0 and Q·Q into s1, one delivery each
    assert row["messages_punctuation"] == 2 * (2 * 2 + 2 * 2)
    # every producer and stage task acks each substream, each consumer task reads its end
    assert row["messages_acker"] >= row["lower_bound"]
    assert row["messages_acker_unaggregated"] >= row["messages_acker"]
    assert {t["name"] for t in data["targets"]} and all("met" in t for t in data["targets"])

    png = out / "traffic.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_acker_quick_writes_json_and_png(bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = bench("acker", "--quick", "--out", str(out), "--bootstrap", bootstrap)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "target met" in done.stdout and "bench acker (quick)" in done.stdout

    data = json.loads((out / "acker.json").read_text())
    assert data["name"] == "acker" and data["quick"] is True
    (generic, per_run, kafka_generic, kafka_run, *decode, g1_one, g1_two, throughput, one_shard,
     two_shards, seal, raw) = data["rows"]
    for row in (generic, per_run, kafka_generic, kafka_run):
        assert row["notifications"] == row["expected_notifications"] > 0, row
        assert isinstance(row["per_cpu_s"], float) and row["per_cpu_s"] > 0, row
    # the micro-benchmark that keeps AckBlock's columns packed: v2, Avro arrays, packed
    assert [r["measurement"].split(":")[0] for r in decode] == [
        "ack block decode, v2", "ack block decode, v3 as Avro arrays of long",
        "ack block decode, v3, packed bytes columns (decode_ack + unpack)",
    ]
    for row in decode:
        assert row["samples"] > 0 and row["per_cpu_s"] > 0 and row["bytes_per_block"] > 0
    assert "generic" in generic["measurement"] and "per run" in per_run["measurement"]
    assert "with Kafka" in kafka_generic["measurement"] and "per run" in kafka_run["measurement"]
    # the target's input: real publishers at g=1, then one acker process
    for row, sources in ((g1_one, 1), (g1_two, 2)):
        assert row["measurement"].startswith("one acker process, publish_many g=1"), row
        assert row["sources"] == sources and row["steps"] > 0 and row["ack_messages"] > 0
        assert row["notifications"] == row["expected_notifications"] > 0, row
        assert row["completed_per_s"] > 0 and row["per_cpu_s"] > 0, row
    for row in (throughput, one_shard, two_shards):
        for field in ("rate", "entries_per_s"):
            assert isinstance(row[field], float) and row[field] > 0, (field, row)
        assert row["notifications"] == row["expected_notifications"] > 0, row
    assert "1 shard" in one_shard["measurement"] and "2 shards" in two_shards["measurement"]
    for row in (seal, raw):
        assert row["samples"] > 0, row
        for field in ("p50_ms", "p99_ms"):
            assert isinstance(row[field], float) and row[field] > 0, (field, row)
        assert row["p50_ms"] <= row["p99_ms"]
    assert seal["measurement"].startswith("seal()") and "baseline" in raw["measurement"]
    # the publisher's (those its commits waited for, then all) and the acker's
    # CONCURRENT_TRANSACTIONS retries, counted from their logs
    assert seal["txn_retries"] == (
        f"{seal['txn_retries_publishers_commit_waited']}/{seal['txn_retries_publishers']}"
        f"/{seal['txn_retries_other']}"
    )
    assert seal["txn_retries_publishers_commit_waited"] <= seal["txn_retries_publishers"]
    assert any(name.startswith("substreams.pub.") for name in seal["txn_retries_by_id"])
    assert "CONCURRENT_TRANSACTIONS retries" in done.stdout
    assert [t["name"] for t in data["targets"]] == [
        "p99 seal -> notification",
        "acker step alone completes times (per run, no Kafka I/O)",
        "one acker process completes times (publish_many g=1 input)",
        "one acker process, shard-row input (~1 time per message)",
        "two shards against one (acks/s)",
    ]

    png = out / "acker.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_a_malformed_grid(tmp_path: Path) -> None:
    done = bench("traffic", "--grid", "2x2", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "--grid '2x2'" in done.stderr and "Traceback" not in done.stderr


def test_bench_rejects_malformed_or_misdirected_broker_settings(tmp_path: Path) -> None:
    done = bench("latency", "--broker-setting", "num.io.threads", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "--broker-setting 'num.io.threads'" in done.stderr and "Traceback" not in done.stderr
    done = bench(
        "latency", "--broker-setting", "num.io.threads=8", "--bootstrap", "127.0.0.1:1",
        "--out", str(tmp_path),
    )
    assert done.returncode == 2
    assert "127.0.0.1:1 is not one" in done.stderr and "Traceback" not in done.stderr


def test_latency_grid_replaces_the_configurations() -> None:
    from substreams_bench.latency import cases

    got = {(c.producers, c.partitions) for c in cases(True, [(4, 4)])}
    assert got == {(4, 4)}
    assert {(c.producers, c.partitions) for c in cases(True)} == {(1, 1), (8, 8)}


def test_embedded_broker_takes_settings_over_its_defaults(tmp_path: Path) -> None:
    from substreams.kafka.embedded import KafkaCluster

    cluster = KafkaCluster(tmp_path, settings={"num.io.threads": "8"})
    cluster._load_or_plan()
    props = cluster._properties(cluster.nodes[0])
    assert props["num.io.threads"] == "8"
    assert props["num.network.threads"] == "2"  # cluster.env's, untouched


def test_percentile_is_nearest_rank() -> None:
    from substreams_bench.harness import percentile

    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values[:30], 99) == 30.0  # with 30 samples p99 is the maximum
    assert percentile([], 50) != percentile([], 50)  # NaN for no samples


def test_traffic_targets_report_a_miss_as_not_met() -> None:
    from substreams_bench.traffic import targets

    rows = [
        {"producers": 2, "partitions": 2, "acker_over_bound": 1.2, "punct_over_acker": 1.5},
        {"producers": 32, "partitions": 32, "acker_over_bound": 1.8, "punct_over_acker": 12.0},
    ]
    bound, ratio = targets(rows)
    assert bound.met is False and "1.80" in bound.value
    assert ratio.met is True and "12.0" in ratio.value
    unmeasured = targets([{"producers": 32, "partitions": 32, "acker_over_bound": None}])
    assert [t.met for t in unmeasured] == [None, None]


def test_soak_targets_report_growth_missed_epochs_and_drift_as_misses() -> None:
    from substreams_bench.soak import _targets

    def row(i: int, acker: float, p99: float) -> dict[str, float]:
        return {"acker_rss_mb": acker, "publisher_rss_mb": 100.0 + i * 0.1, "p99_ms": p99}

    steady = [row(i, 100.0, 10.0) for i in range(10)]
    acker, publisher, missed, drift = _targets(steady, 50, [], [])
    assert [acker.met, publisher.met, missed.met, drift.met] == [True, True, True, True]
    grown = [row(i, 100.0 + 10 * i, 10.0 + 10 * i) for i in range(10)]
    acker, publisher, missed, drift = _targets(grown, 50, [7], [])
    assert acker.met is False and "+" in acker.value
    assert publisher.met is True
    assert missed.met is False and missed.value == "1 / 0 of 50"
    assert drift.met is False
    assert [t.met for t in _targets(grown[:2], 0, [], [])] == [None, None, False, None]


def test_each_configuration_runs_on_a_fresh_embedded_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --bootstrap, ctx.track restarts the embedded broker between items: a topic
    of one configuration is gone for the next, and the last broker stops with the run."""
    monkeypatch.delenv(client.ENV_BOOTSTRAP, raising=False)
    seen: list[str] = []
    with bench_context(quick=True, console=Console(quiet=True)) as ctx:
        assert ctx.broker_label.startswith("embedded")
        for item in ctx.track(["first", "second"], str):
            seen.append(ctx.bootstrap)
            assert broker_answers(ctx.bootstrap)
            # a JVM that just started Kafka has compiled: its compiler threads are read
            assert ctx.broker is not None
            pid = ctx.broker.pid(ctx.broker.nodes[0].node_id)
            assert pid is not None and sum(jit_cpu_ticks(pid).values()) > 0
            names = set(client.admin(ctx.bootstrap).list_topics(timeout=10).topics)
            assert not any(n.startswith("b.s0.") for n in names), (item, names)
            ctx.config([("s0", 1)])
            release_clients()
        assert seen[0] != seen[1]
        assert not broker_answers(seen[0])
    assert not broker_answers(seen[1])


def test_bench_recovery_quick_writes_json_and_png(bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = bench("recovery", "--quick", "--out", str(out), "--bootstrap", bootstrap)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "target met" in done.stdout and "bench recovery (quick)" in done.stdout

    data = json.loads((out / "recovery.json").read_text())
    assert data["name"] == "recovery" and data["quick"] is True
    assert [r["notifications"] for r in data["rows"]] == [1_000, 10_000]
    for row in data["rows"]:
        # one EpochComplete per notification plus a snapshot every 100 (snapshot_every)
        assert row["control_records"] == row["notifications"] * 101 // 100, row
        assert row["checkpoints"] == row["notifications"] // 1000, row
        assert row["replay_records"] >= row["control_records"] + 2 * row["checkpoints"], row
        for field in ("startup_s", "takeover_s", "replay_s", "aligner_startup_s",
                      "aligner_replay_s"):
            assert isinstance(row[field], float) and row[field] > 0, (field, row)
        # 2 producers x 1 partition: a REGISTER each, then 2 punctuations per time
        assert row["aligner_times"] == (row["punctuations"] - 2 + 1) // 2, row
    assert [t["name"] for t in data["targets"]] == [
        "acker start-up after 10,000",
        "acker start-up: 10,000 vs 1,000",
        "standby take-over after 10,000",
        "standby take-over: 10,000 vs 1,000",
        "aligner start-up after 10,000 punctuations",
        "aligner start-up: 10,000 punctuations vs 1,000",
    ]
    assert (out / "recovery.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_framing_quick_checks_hand_framing_against_the_converter(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = bench("framing", "--quick", "--out", str(out))
    assert done.returncode == 0, done.stderr + done.stdout
    assert "(no broker needed)" in done.stdout
    data = json.loads((out / "framing.json").read_text())
    assert [r["path"] for r in data["rows"]] == [
        "acker: EpochComplete", "acker: session EpochComplete", "publisher: data envelope",
    ]
    for row in data["rows"]:
        assert row["hand_us"] > 0 and row["converter_us"] > 0, row
        assert abs(row["speedup"] - row["converter_us"] / row["hand_us"]) < 1e-9, row
    assert len(data["targets"]) == 3 and all(t["met"] is not None for t in data["targets"])
    assert (out / "framing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SMOKE_RECORDS = 500
"""``--records``' minimum: 25 records per window of the 20-window query.  Every query's cost
here is its start and its batches, not the records."""


@pytest.mark.spark
@pytest.mark.xdist_group(SPARK_GROUP)  # its Spark JVM: on the worker that runs Spark
@pytest.mark.timeout(1800)
def test_bench_spark_quick_writes_both_parts_and_targets(bootstrap: str, tmp_path: Path) -> None:
    """``--smoke``: every query of both parts in one Spark session in the bench process (one
    JVM in all, not seven), the small-epoch query runs 20 windows, part (b) 2 epochs: what
    is checked is the outputs, not the rates.  Minutes on the loaded 2-core machine, hence
    its own timeout."""
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "substreams", "bench", "spark", "--smoke",
         "--records", str(SMOKE_RECORDS), "--out", str(out), "--bootstrap", bootstrap],
        capture_output=True, text=True, timeout=1700, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "target met" in done.stdout and "bench spark (quick)" in done.stdout

    data = json.loads((out / "spark.json").read_text())
    assert data["name"] == "spark" and data["quick"] is True
    a = [r for r in data["rows"] if r["part"] == "a"]
    b = [r for r in data["rows"] if r["part"] == "b"]
    # the JVM firm paths, the Python read, the two watermark queries: one run
    assert [(r["path"], r["windows"]) for r in a] == [
        ("jvm-df", 10), ("jvm-arrow", 10), ("jvm-arrow", 20), ("python", 10),
        ("watermark-avro", 10), ("watermark-pandas", 10),
    ]
    for row in a:
        assert row["error"] is None, row
        assert row["records"] == SMOKE_RECORDS and row["records_per_s"] > 0, row
        assert row["driver_peak_mb"] > 0 and row["tree_peak_mb"] > 0, row
        assert row["cpu_s"] > 0 and row["records_per_cpu_s"] > 0, row
        assert row["correct"] is True, row
    # the firm queries drained the backlog in batches of whole epochs (maxEpochsPerTrigger)
    assert a[1]["batches"] == 1 and a[2]["batches"] == 2, a
    assert len(b) == 3 and all(r["samples"] > 0 for r in b), b
    assert [t["name"][:3] for t in data["targets"]] == ["(a)", "(a)", "(a)", "(b)", "(b)"]
    assert all(t["met"] is not None for t in data["targets"]), data["targets"]
    assert (out / "spark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spark_targets_report_misses_and_unmeasured() -> None:
    from substreams_bench.spark import targets

    def a(path: str, windows: int, rate: float, mb: float) -> dict[str, object]:
        return {"part": "a", "path": path, "windows": windows, "records_per_cpu_s": rate,
                "driver_peak_mb": mb, "correct": True}

    def b(path: str, p50: float, p99: float) -> dict[str, object]:
        return {"part": "b", "path": path, "p50_ms": p50, "p99_ms": p99, "error": None}

    rows = [
        a("jvm-df", 50, 1100.0, 900.0),
        a("jvm-arrow", 50, 900.0, 1300.0),
        a("jvm-arrow", 500, 800.0, 1000.0),
        a("watermark-avro", 50, 1000.0, 900.0),
        a("watermark-pandas", 50, 800.0, 900.0),
        b("firm", 150.0, 700.0),
        b("watermark-avro", 4000.0, 9000.0),
    ]
    df, arrow, rss, p50, p99 = targets(rows)
    assert df.met is False and df.value.startswith("1.10x")
    assert arrow.met is True and arrow.value.startswith("1.12x")
    assert rss.met is False and rss.value.startswith("1.30x")
    assert (p50.met, p99.met) == (True, False)
    assert "9,000 ms" in p99.value
    assert [t.met for t in targets(rows[5:])] == [None, None, None, True, False]


def test_bench_keyed_quick_writes_json_with_every_target(bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = bench("keyed", "--quick", "--keys", "300,1200", "--out", str(out),
                 "--bootstrap", bootstrap)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "bench keyed (quick)" in done.stdout and "target met" in done.stdout
    data = json.loads((out / "keyed.json").read_text())
    rows = data["rows"]  # smallest first; one source, then two sharing every key
    assert [(r["keys"], r["sources"]) for r in rows] == [(300, 1), (300, 2), (1200, 1), (1200, 2)]
    for row in rows:
        keys = row["keys"]
        assert row["records_per_key"] == 3, row
        assert row["notified"] == keys, row  # one seal closed every session, each once
        assert row["recovery_s"] is not None and row["recovery_s"] > 0, row
        assert 0 < row["max_record_kb"] <= 256 and row["rss_per_session"] > 0, row
    assert len(data["targets"]) == 8
    shards = data["targets"][-1]
    assert shards["met"] is False and "not built" in shards["value"]
    assert (out / "keyed.png").stat().st_size > 0
    wrong = bench("acker", "--keys", "5")
    said = wrong.stderr + wrong.stdout
    assert wrong.returncode != 0 and "--keys applies to 'bench keyed' only" in said
