"""The embedded Apache Kafka's pure parts: settings, prerequisites, the shared compose file."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from substreams import jvm
from substreams.errors import BrokerError
from substreams.kafka.embedded import KafkaCluster, cluster_settings

REPO = Path(__file__).resolve().parents[2]


def test_three_nodes_replicate_and_write_to_a_quorum() -> None:
    s = cluster_settings(3)
    assert s["default.replication.factor"] == "3"
    assert s["min.insync.replicas"] == "2"
    assert s["transaction.state.log.replication.factor"] == "3"
    assert s["transaction.state.log.min.isr"] == "2"
    assert s["auto.create.topics.enable"] == "false"
    assert s["process.roles"] == "broker,controller"


def test_one_node_brings_every_replication_setting_to_one() -> None:
    s = cluster_settings(1)
    replication = {
        k: v
        for k, v in s.items()
        if k.endswith(("replication.factor", "min.isr")) or k == "min.insync.replicas"
    }
    assert len(replication) >= 6 and set(replication.values()) == {"1"}
    assert s["num.io.threads"] == cluster_settings(3)["num.io.threads"]


def test_docker_compose_reads_the_same_settings_file() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name in ("kafka1", "kafka2", "kafka3"):
        service = compose["services"][name]
        assert service["env_file"] == "substreams/kafka/cluster.env"
        # nothing in the per-node environment may override a shared setting
        shared = {"KAFKA_" + k.upper().replace(".", "_") for k in cluster_settings(3)}
        assert not shared & set(service["environment"]), name


def test_missing_java_is_one_line_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(BrokerError) as err:
        jvm.java()
    assert "\n" not in str(err.value) and "apt-get install openjdk-17" in str(err.value)


def test_old_java_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(BrokerError, match="Java 11; Apache Kafka 4 needs Java 17"):
        jvm.java()


def test_missing_maven_is_one_line_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BrokerError) as err:
        jvm.mvn()
    assert "\n" not in str(err.value) and "apt-get install maven" in str(err.value)


def test_a_cluster_folder_keeps_its_size(tmp_path: Path) -> None:
    one = KafkaCluster(tmp_path, 1)
    one._load_or_plan()
    assert len(one.nodes) == 1 and (tmp_path / "cluster.json").exists()
    again = KafkaCluster(tmp_path, 1)
    again._load_or_plan()
    assert again.nodes == one.nodes and again.cluster_id == one.cluster_id
    with pytest.raises(BrokerError, match="holds a 1-node cluster, not 3 nodes"):
        KafkaCluster(tmp_path, 3)._load_or_plan()
    with pytest.raises(BrokerError, match="must be 1 or 3"):
        KafkaCluster(tmp_path, 2)


def test_stop_does_not_wait_out_a_node_left_without_its_quorum(tmp_path: Path) -> None:
    """Two nodes exit on SIGTERM, the third (like a KRaft node whose controlled shutdown
    lost its quorum) does not: ``stop`` SIGKILLs it once the majority is gone, within the
    grace, not after the whole timeout."""
    cluster = KafkaCluster(tmp_path, 3)
    cluster._load_or_plan()
    stuck = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    procs = []
    for i, node in enumerate(cluster.nodes):
        code = stuck if i == 0 else "import time; time.sleep(120)"
        proc = subprocess.Popen([sys.executable, "-c", code])
        procs.append(proc)
        cluster.node_dir(node.node_id).mkdir(parents=True, exist_ok=True)
        (cluster.node_dir(node.node_id) / "pid").write_text(str(proc.pid))
    time.sleep(0.5)  # the stuck one has set its SIGTERM handler
    reapers = [threading.Thread(target=p.wait, daemon=True) for p in procs]
    for r in reapers:
        r.start()
    began = time.monotonic()
    cluster.stop(timeout=60.0, quorum_lost_grace=1.0)
    took = time.monotonic() - began
    assert took < 30.0, took  # not the 60 s timeout
    for r in reapers:
        r.join(10)
    assert [p.returncode for p in procs] == [-signal.SIGKILL, -signal.SIGTERM, -signal.SIGTERM]
