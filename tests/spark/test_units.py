"""The Spark integration's pure parts (no SparkSession): epoch text, offsets, options,
batch grouping, `substreams submit` and the docker-compose file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from substreams.app import DIRECT, Application
from substreams.cli.main import cli
from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.frontier import Keyed
from substreams.spark.epochs import epoch_int, epoch_key, format_time, parse_time
from substreams.spark.offsets import Notification, SourceOffset
from substreams.spark.operator import groups, row_order
from substreams.spark.options import SourceOptions
from substreams.spark.source import _chunks
from tests.conftest import ConfigFactory, docker_available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("t", [0, 42, -3, (1, 2), (), Keyed("u1", 5), Keyed("a@b", (3, 4))])
def test_epoch_text_round_trips(t: object) -> None:
    assert parse_time(format_time(t)) == t  # type: ignore[arg-type]


def test_epoch_parts() -> None:
    assert (epoch_int(7), epoch_key(7)) == (7, None)
    assert (epoch_int(Keyed("u", 9)), epoch_key(Keyed("u", 9))) == (9, "u")
    assert epoch_int((1, 2)) is None
    with pytest.raises(SubstreamsError, match="not an epoch"):
        parse_time("u@x")


def test_offsets_are_json_round_trips() -> None:
    firm, soft = SourceOffset(5), SourceOffset(3, {0: 10, 1: 0})
    assert firm.to_json() == {"control": 5}
    assert soft.to_json() == {"control": 3, "data": {"0": 10, "1": 0}}
    assert SourceOffset.from_json(soft.to_json()) == soft
    with pytest.raises(SubstreamsError, match="not a substreams source offset"):
        SourceOffset.from_json({"data": {}})


def test_options_validate_and_default_to_the_config(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 3}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 10, "bound": "soft"}],
    )
    w = config.substreams[0].name
    opts = SourceOptions.parse({"config": str(config.path), "substream": w})
    assert (opts.mode, opts.stream, opts.partitions) == ("soft", config.streams[0].name, 3)
    assert opts.control_topic == config.acker.control_topic(w)
    with pytest.raises(SubstreamsError, match="option 'config'"):
        SourceOptions.parse({"substream": w})
    with pytest.raises(SubstreamsError, match="no substream named 'nope'"):
        SourceOptions.parse({"config": str(config.path), "substream": "nope"})
    with pytest.raises(SubstreamsError, match="firm or soft"):
        SourceOptions.parse({"config": str(config.path), "substream": w, "mode": "hard"})


def test_options_carry_the_config_and_a_pickled_reader_never_reads_the_yaml(
    make_config: ConfigFactory,
) -> None:
    """The config is parsed once on the driver; the reader Spark pickles to executors reads
    the broker with the Config it carries, even when the files are gone."""
    import pyspark.cloudpickle as cloudpickle

    from substreams.spark.options import CONFIG_PICKLE, ship_config
    from substreams.spark.schema import PayloadLayout
    from substreams.spark.source import EpochsPartition, SubstreamsStreamReader

    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    w = config.substreams[0].name
    with Application(config, mechanisms=DIRECT).publisher(config.streams[0].name, "src") as pub:
        for ts in (5, 6, 7):
            pub.publish({"user": "u", "url": "/", "ts": ts})
        pub.seal(w, 0)
    by_path = SourceOptions.parse({"config": str(config.path), "substream": w})
    shipped = SourceOptions.parse({CONFIG_PICKLE: ship_config(config), "substream": w})
    assert by_path == shipped and shipped.config == config
    with pytest.raises(SubstreamsError, match="not a shipped config"):
        SourceOptions.parse({CONFIG_PICKLE: "bm90IGEgcGlja2xl", "substream": w})
    reader = SubstreamsStreamReader(shipped, PayloadLayout(config.stream(shipped.stream)))
    end = reader.latestOffset(reader.initialOffset(), None)
    parts = reader.partitions(reader.initialOffset(), end)
    reader.stop()
    blob = cloudpickle.dumps((reader, parts))
    config.path.unlink()  # an executor on another host: no YAML, no .avsc
    (config.path.parent / "click.avsc").unlink()
    task_reader, task_parts = cloudpickle.loads(blob)
    assert all(isinstance(p, EpochsPartition) for p in task_parts)
    # a firm read task yields Arrow batches (one per epoch, sliced)
    rows = [r for p in task_parts for b in task_reader.read(p) for r in b.to_pylist()]
    assert len(rows) == 3
    assert sorted(r["ts"] for r in rows) == [5, 6, 7]


def test_chunks_keep_notification_order_and_cover_everything() -> None:
    notes = [Notification(i, i, (), n, 0) for i, n in enumerate([5, 1, 1, 9, 0, 3])]
    chunks = _chunks(notes, 2)
    assert len(chunks) == 2
    assert [n for c in chunks for n in c] == notes
    assert _chunks([], 4) == []


def test_sorted_groups_order_by_notification_and_keep_empty_epochs() -> None:
    """What a per-epoch task does with its rows: sorted by :func:`row_order`, then
    :func:`groups`."""
    def rec(co: int, epoch: int, ok: int, off: int, ci: int = 0) -> dict[str, object]:
        return {
            "user": "u",
            "epoch": {"key": None, "coords": [epoch], "kind": "int"},
            "epoch_label": str(epoch),
            "epoch_int": epoch,
            "epoch_key": None,
            "order_key": ok,
            "partition": 0,
            "offset": off,
            "control_offset": co,
            "control_index": ci,
            "sealed_at_ms": 1,
            "records": None,
            "is_notification": False,
        }

    def mark(co: int, epoch: int, n: int, ci: int = 0) -> dict[str, object]:
        return {
            **rec(co, epoch, 0, 0, ci),
            "user": None,
            "order_key": None,
            "offset": None,
            "records": n,
            "is_notification": True,
        }

    rows = [
        rec(4, 2, 7, 9),
        mark(4, 2, 2),
        mark(2, 1, 0),
        rec(0, 0, 3, 1),
        rec(4, 2, 5, 8),
        mark(0, 0, 1),
        mark(4, 3, 1, ci=1),  # a second notification of control record 4
        rec(4, 3, 1, 2, ci=1),
    ]
    epochs = [g.info for g in groups(sorted(rows, key=row_order(None)))]
    assert [(e.time, e.records, [r["order_key"] for r in e.rows]) for e in epochs] == [
        (0, 1, [3]),
        (1, 0, []),
        (2, 2, [5, 7]),
        (3, 1, [1]),
    ]
    assert [e.ident for e in epochs] == [(0, 0), (2, 0), (4, 0), (4, 1)]
    assert set(epochs[0].rows[0]) == {"user", "order_key", "partition", "offset"}


def test_submit_dry_run_builds_the_spark_submit_command(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks", "partitions": 1}])
    job = ROOT / "jobs" / "windowed_counts.py"
    result = CliRunner().invoke(
        cli,
        [
            "submit",
            "-c",
            str(config.path),
            "--dry-run",
            "--conf",
            "spark.x=1",
            str(job),
            "--",
            "--once",
        ],
    )
    assert result.exit_code == 0, result.output
    words = result.output.split()
    assert words[0].endswith("pyspark/bin/spark-submit")
    assert words[words.index("--master") + 1] == "local[*]"
    assert words[-2:] == [str(job), "--once"]
    assert "--py-files" not in words
    bad = CliRunner().invoke(
        cli, ["submit", "-c", str(config.path), "--dry-run", "--conf", "x", str(job)]
    )
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output


def test_compose_file_describes_the_replicated_cluster() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    brokers = [s for s in services if s.startswith("kafka")]
    assert len(brokers) == 3
    from substreams.kafka.embedded import cluster_settings

    shared = cluster_settings(3)  # substreams/kafka/cluster.env, the compose file's env_file
    assert shared["process.roles"] == "broker,controller"  # KRaft, no ZooKeeper
    assert shared["default.replication.factor"] == "3"
    assert shared["min.insync.replicas"] == "2"
    for name in brokers:
        assert services[name]["env_file"] == "substreams/kafka/cluster.env"
        assert services[name]["environment"]["KAFKA_NODE_ID"] in (1, 2, 3)
    assert {"acker", "acker-standby", "producer", "spark-master", "spark-worker"} <= set(services)
    assert "--standby" in services["acker-standby"]["command"]
    from substreams.config import load_config

    cluster = load_config(ROOT / "jobs" / "substreams.cluster.yaml")
    assert cluster.kafka.replication_factor == 3
    assert cluster.kafka.bootstrap.count("kafka") == 3


@pytest.mark.docker
@pytest.mark.skipif(not docker_available(), reason="needs a Docker engine (none on this machine)")
def test_compose_config_is_valid_for_docker() -> None:  # pragma: no cover - no Docker here
    assert shutil.which("docker")
    out = subprocess.run(
        ["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def _one_sealed_epoch(make_config: ConfigFactory) -> tuple[Config, str, str, str]:
    """A tumbling substream with one record published and its epoch sealed (the publisher's
    own control record): the config, the substream, the stream and the control topic."""
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    w, stream = config.substreams[0].name, config.streams[0].name
    with Application(config, mechanisms=DIRECT).publisher(stream, "src") as pub:
        pub.publish({"user": "u", "url": "/", "ts": 5})
        pub.seal(w, 0)
    return config, w, stream, config.acker.control_topic(w)


def test_control_scanner_refuses_a_broken_hash_chain(make_config: ConfigFactory) -> None:
    """A second writer posing as the first (same writer name, its own chain from genesis)
    breaks the chain: the source stops instead of reading a forged timeline."""
    from substreams.control.io import ControlWriter
    from substreams.control.messages import EpochComplete
    from substreams.errors import ProtocolError
    from substreams.spark.offsets import ControlScanner

    config, w, stream, topic = _one_sealed_epoch(make_config)
    scanner = ControlScanner(config.kafka.bootstrap, topic, w, config)
    assert scanner.latest(0) == 1
    rogue = ControlWriter(
        config.kafka.bootstrap, f"direct.{stream}.src", [topic], config, transactional_id="rogue"
    )
    rogue.write([(topic, EpochComplete(w, 1, (), 0, 0))])
    rogue.close()
    with pytest.raises(ProtocolError, match="replay or duplicate"):
        scanner.latest(1)
    scanner.close()


def test_control_scanner_refuses_a_start_past_the_topic_end(make_config: ConfigFactory) -> None:
    """A checkpoint reused against another control topic names an offset that topic never
    reached: the source says so instead of waiting forever for it; the topic's end itself
    (a caught-up checkpoint) is a valid start."""
    from substreams.spark.offsets import ControlScanner

    config, w, _, topic = _one_sealed_epoch(make_config)
    scanner = ControlScanner(config.kafka.bootstrap, topic, w, config)
    try:
        end = scanner.latest(0)
        assert end >= 1
        resumed = ControlScanner(config.kafka.bootstrap, topic, w, config)
        assert resumed.latest(end) == end
        resumed.close()
        with pytest.raises(SubstreamsError, match=f"offset {end + 10}, past the topic's end"):
            ControlScanner(config.kafka.bootstrap, topic, w, config).latest(end + 10)
    finally:
        scanner.close()


def test_control_scanner_reads_each_epoch_of_a_batched_record(make_config: ConfigFactory) -> None:
    """An ``EpochsComplete`` (the acker's batched completions) is several notifications at one
    control offset: the scanner keeps each, identified by (offset, index), in order; a batch
    ends after the whole record."""
    from substreams.control.io import ControlWriter
    from substreams.control.messages import Completion, EpochsComplete
    from substreams.spark.offsets import ControlScanner

    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    w = config.substreams[0].name
    topic = config.acker.control_topic(w)
    writer = ControlWriter(config.kafka.bootstrap, "acker.t", [topic], config)
    writer.write([(topic, EpochsComplete(w, (Completion(0, (), 0, 1), Completion(1, (), 0, 2),
                                              Completion(2, (), 0, 3))))])
    writer.close()
    scanner = ControlScanner(config.kafka.bootstrap, topic, w, config)
    try:
        end = scanner.latest(0)
        notes = scanner.between(0, end)
        assert [(n.time, n.ident, n.sealed_at_ms) for n in notes] == [
            (0, (end - 1, 0), 1), (1, (end - 1, 1), 2), (2, (end - 1, 2), 3)
        ]
        scanner.forget_before(end)
        assert scanner.between(end, end) == []
    finally:
        scanner.close()
