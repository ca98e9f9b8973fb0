"""A secured cluster end to end: ONE embedded Apache Kafka with a SASL_SSL listener
(SCRAM-SHA-512, a throwaway CA), the StandardAuthorizer and no access without an ACL; the
demo's pipeline against it (publisher, acker, ``notifications()``, the Spark firm query on
the JVM read) from one ``kafka.security`` block, a wrong password's one-line error.

Why under tests/spark: the firm query shares the session's SparkSession (its Kafka
connector is set when the JVM starts); the broker is this module's own."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from substreams.app import Application
from substreams.config import Config, load_config
from substreams.kafka import client
from substreams.kafka.acls import apply_acls, role_acls
from substreams.kafka.clock import Deadline
from substreams.kafka.embedded import KafkaCluster
from substreams.kafka.tls import Credentials, make_ca
from substreams.kafka.topics import ensure_topics
from substreams.spark.frames import run_frames
from substreams.spark.jvm_read import jvm_unsupported
from substreams.streams.evolution import register_stream
from substreams.ui.model import DashboardModel
from tests.conftest import CLICK_SCHEMA
from tests.spark.conftest import output_rows, running_acker, wait_for_epochs, window_clicks
from tests.spark.jobs import out_stream

pytestmark = pytest.mark.spark

PASSWORD_ENV = "SUBSTREAMS_TEST_KAFKA_PASSWORD"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with KafkaCluster(tmp_path_factory.mktemp("kafka-secure"), secure=True) as cluster:
        yield cluster


SecuredConfig = Callable[..., Config]


@pytest.fixture
def secured_config(
    secured: KafkaCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> SecuredConfig:
    """A config whose clients log in as ``user`` (default: the super user), its topics
    created by the super user.  The password is in a file (what Spark's Python workers,
    started with the session, can read), or with ``via_env`` in
    ``$SUBSTREAMS_TEST_KAFKA_PASSWORD``."""
    admin = secured.admin_security
    assert admin is not None and admin.ca_file and admin.password_file

    def factory(user: str = "admin", password: str | None = None, *,
                suffix: str | None = None, create: bool = True, via_env: bool = False,
                mechanism: str = "acker", stage: bool = False) -> Config:
        suffix = suffix or uuid.uuid4().hex[:8]
        secret = password or Path(str(admin.password_file)).read_text().strip()
        source: dict[str, str] = {"password_env": PASSWORD_ENV}
        if via_env:
            monkeypatch.setenv(PASSWORD_ENV, secret)
        else:
            (tmp_path / f"{user}.password").write_text(secret + "\n")
            source = {"password_file": f"{user}.password"}
        (tmp_path / "click.avsc").write_text(json.dumps(CLICK_SCHEMA))
        doc: dict[str, Any] = {
            "kafka": {
                "bootstrap": secured.bootstrap,
                "security": {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                             "username": user, **source, "ca_file": admin.ca_file},
            },
            "streams": [{"name": f"clicks-{suffix}", "schema": "click.avsc",
                         "order_key": "ts", "partitions": 2},
                        {**out_stream(f"counts-{suffix}", "url_count.avsc")}],
            "substreams": [{"name": f"w-{suffix}", "stream": f"clicks-{suffix}",
                            "kind": "tumbling", "size_ms": 1000, "mechanism": mechanism},
                           {"name": f"cw-{suffix}", "stream": f"counts-{suffix}",
                            "kind": "epoch", "field": "window"}],
            "stages": [{"name": f"st-{suffix}", "input": f"clicks-{suffix}",
                        "output": f"counts-{suffix}"}] if stage else [],
            "acker": {"name": f"acker-{suffix}", "acks_topic": f"_acks-{suffix}",
                      "control_topic_prefix": f"_control-{suffix}.",
                      "command_topic": f"_commands-{suffix}",
                      "response_topic": f"_responses-{suffix}",
                      "dead_letter_topic": f"_dlq-{suffix}", "heartbeat_ms": 200},
        }
        path = tmp_path / f"substreams-{user}-{suffix}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        config = load_config(path)
        if create:
            from dataclasses import replace

            as_admin = replace(config, kafka=replace(config.kafka, security=admin))
            ensure_topics(client.admin(secured.bootstrap, as_admin), config.topics())
            for stream in config.streams:  # what `topics create` does (the schema topic)
                register_stream(as_admin, stream.name, secured.bootstrap)
        return config

    return factory


def test_the_pipeline_runs_against_the_secured_cluster(
    secured: KafkaCluster, secured_config: SecuredConfig, spark: SparkSession, tmp_path: Path
) -> None:
    """Publisher, acker, ``notifications()`` with the records, and the firm query read by
    Spark's own Kafka source (no fallback to the Python read), all over SASL_SSL."""
    config = secured_config()
    w, cw = (s.name for s in config.substreams)
    clicks, out = (s.name for s in config.streams)
    assert jvm_unsupported(config, clicks) is None
    windows = [(0, 6), (1, 4), (2, 5)]
    want: Counter[tuple[int, str]] = Counter()

    def counts(df: DataFrame) -> DataFrame:  # Spark operations only: never leaves the JVM
        return (df.where(~F.col("is_notification"))
                .groupBy("control_offset", "control_index", "epoch", "url")
                .agg(F.count("*").alias("clicks"))
                .withColumn("window", F.col("epoch.coords")[0]))

    with acker_with_commands(config), Application(config).publisher(clicks, "src") as pub:
        for window, n in windows:
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
                want[(window, str(c["url"]))] += 1
            pub.seal(w, window)
        pub.flush()
        wait_for_epochs(config, w, len(windows), timeout=60)
        status = cli("acker", "status", "-c", str(config.path))
        assert config.acker.name in status and w in status
        # the firm query, logged in as a user with the spark role's ACLs only: read by
        # Spark's Kafka source (run_frames refuses a config the JVM cannot read), results
        # written by the executors' writers, their epochs notified by the acker
        user = f"spark-{uuid.uuid4().hex[:8]}"
        secured.add_user(user, f"pw-{user}")
        apply_acls(client.admin(secured.bootstrap, config), f"User:{user}",
                   role_acls(config, "spark"))
        as_spark = secured_config(user, f"pw-{user}", suffix=w.rsplit("-", 1)[1],
                                  create=False)
        run_frames(counts, as_spark, w, out, name="secured", key_field="url", spark=spark,
                   once=True, checkpoint=tmp_path / "q")
        wait_for_epochs(config, cw, len(windows), timeout=90)
    rows = output_rows(config, out)
    assert sorted((r["window"], r["url"], r["clicks"]) for r in rows) == sorted(
        (win, u, n) for (win, u), n in want.items())
    assert "OK" in cli("verify", "-c", str(config.path))
    assert cli("tail", "-c", str(config.path), clicks).count("'url'") == sum(
        n for _, n in windows)
    model = DashboardModel(config)  # the dashboard's follower
    model.start()
    try:
        deadline = Deadline(30)
        shown: list[str] = []
        while len(shown) < len(windows) and not deadline.passed:
            model.wait(model.version, 1.0)
            [card] = [c for c in model.snapshot()["substreams"] if c["name"] == w]
            shown = [n["time"] for n in card["notifications"]]
        assert sorted(shown) == [str(win) for win, _ in windows]
    finally:
        model.close()
    with Application(config).notifications(
        w, from_="beginning", records=True, idle_timeout=5
    ) as notes:
        got = [(int(n.time), len(n.entries)) for n in notes]  # type: ignore[call-overload]
    assert got == windows



@contextlib.contextmanager
def acker_with_commands(config: Config) -> Iterator[None]:
    """The acker as `acker run` runs it (with its command handler), in a thread."""
    stop = threading.Event()
    service = Application(config).acker()
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True, name="acker")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def cli(*args: str) -> str:
    """A ``substreams`` command's output (it must succeed)."""
    proc = subprocess.run([sys.executable, "-m", "substreams", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_punctuation_aligner_runs_against_the_secured_cluster(
    secured_config: SecuredConfig,
) -> None:
    """The baseline mechanism too: punctuations in the data topic, the aligner's
    notifications read back by ``notifications()``."""
    config = secured_config(mechanism="punctuations")
    w, clicks = config.substreams[0].name, config.streams[0].name
    with Application(config).publisher(clicks, "src") as pub:
        for window, n in ((0, 3), (1, 2)):
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
            pub.seal(w, window)
        pub.flush()
    with Application(config).aligner(w) as aligner:
        deadline = Deadline(30)
        while aligner.tracker.completed < 2 and not deadline.passed:
            aligner.step()
    got = []
    with Application(config).notifications(
        w, from_="beginning", records=True, idle_timeout=10
    ) as notes:
        for note in notes:
            got.append((int(note.time), len(note.entries)))  # type: ignore[call-overload]
            if len(got) == 2:
                break
    assert got == [(0, 3), (1, 2)]


def test_a_stage_runs_against_the_secured_cluster(secured_config: SecuredConfig) -> None:
    """A Python stage (its input group's offsets committed in its output transaction) between
    the publisher and the acker: every window is notified once the stage's outputs are in."""
    config = secured_config(stage=True)
    w, clicks, out = config.substreams[0].name, config.streams[0].name, config.streams[1].name

    def per_click(entry: Any) -> list[dict[str, Any]]:
        return [{"window": entry.payload["ts"] // 1000, "url": entry.payload["url"],
                 "clicks": 1}]

    with acker_with_commands(config), Application(config).publisher(clicks, "src") as pub:
        for window, n in ((0, 3), (1, 2)):
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
            pub.seal(w, window)
        pub.flush()
        with Application(config).stage(config.stages[0].name, per_click) as stage:
            assert stage.run_until_idle(1.0, timeout=60) == 5
        wait_for_epochs(config, w, 2, timeout=60)
    assert sorted((r["window"], r["clicks"]) for r in output_rows(config, out)) == (
        [(0, 1)] * 3 + [(1, 1)] * 2)


def test_a_wrong_password_fails_fast_naming_user_and_broker(
    secured: KafkaCluster, secured_config: SecuredConfig
) -> None:
    """One line naming the principal and the broker, no traceback, within seconds."""
    config = secured_config(password="not-the-password", create=False, via_env=True)
    proc = subprocess.run(
        [sys.executable, "-m", "substreams", "topics", "create", "-c", str(config.path)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "'admin'" in lines[0] and secured.bootstrap in lines[0], lines[0]
    assert "authentication failed" in lines[0].lower()
    assert "not-the-password" not in proc.stderr + proc.stdout


def _delivery_error(producer: Any, topic: str) -> str:
    """Produce one record to ``topic``: the error it got ("" when delivered)."""
    errors: list[str] = []
    try:
        producer.produce(topic, value=b"x", partition=0,
                         on_delivery=lambda err, _: errors.append(str(err) if err else ""))
        producer.flush(15)
    except KafkaException as exc:
        errors.append(str(exc))
    return errors[0] if errors else "not delivered within 15 s"


def test_a_certificate_another_ca_signed_fails_fast_naming_ca_file(
    secured: KafkaCluster, secured_config: SecuredConfig, tmp_path: Path
) -> None:
    """A client that trusts another CA: one line naming the broker and ca_file."""
    other = Credentials(tmp_path / "other")
    other.folder.mkdir()
    make_ca(other, "unused-store-password")
    config = secured_config(create=False)
    text = config.path.read_text().replace(str(secured.admin_security.ca_file),  # type: ignore[union-attr]
                                           str(other.ca_pem))
    config.path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "substreams", "topics", "create", "-c", str(config.path)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert f"TLS with Kafka at {secured.bootstrap} failed" in line, line
    assert str(other.ca_pem) in line and "certificate verify failed" in line, line


def test_each_role_does_its_job_and_is_refused_beyond_it(
    secured: KafkaCluster, secured_config: SecuredConfig, tmp_path: Path
) -> None:
    """Users with exactly the ACLs ``substreams acls`` generates: the publisher publishes,
    the acker notifies, the reader reads the notes and their records; a publisher writing a
    control topic and a reader writing anything are refused by the broker."""
    suffix = uuid.uuid4().hex[:8]
    admin_config = secured_config(suffix=suffix)
    users = {role: f"{role}-{suffix}" for role in ("publisher", "acker", "reader")}
    for role, user in users.items():
        secured.add_user(user, f"pw-{user}")
        if role == "publisher":  # through the command, as an operator would
            proc = subprocess.run(
                [sys.executable, "-m", "substreams", "acls", "-c", str(admin_config.path),
                 "--role", role, "--principal", f"User:{user}", "--apply"],
                capture_output=True, text=True, timeout=60,
            )
            assert proc.returncode == 0, proc.stderr
            assert f"ACLs for User:{user} (publisher) created" in proc.stdout
        else:
            apply_acls(client.admin(secured.bootstrap, admin_config), f"User:{user}",
                       role_acls(admin_config, role))
    pub, ack, reader = (secured_config(user, f"pw-{user}", suffix=suffix, create=False)
                        for user in users.values())
    w = pub.substreams[0].name
    clicks = pub.streams[0].name
    control = pub.acker.control_topic(w)
    with running_acker(ack), Application(pub).publisher(clicks, "src") as publisher:
        for window, n in ((0, 3), (1, 2)):
            for c in window_clicks(window, n):
                publisher.publish(c, key=str(c["user"]))
            publisher.seal(w, window)
        publisher.flush()
        with Application(reader).notifications(
            w, from_="beginning", records=True, idle_timeout=10
        ) as notes:
            got = []
            for note in notes:
                got.append((int(note.time), len(note.entries)))  # type: ignore[call-overload]
                if len(got) == 2:
                    break
    assert got == [(0, 3), (1, 2)]

    # plain (not idempotent) producers: the refusal is the topic's, not the producer id's
    plain = {"enable.idempotence": False, "acks": 1}
    refused = _delivery_error(client.producer(secured.bootstrap, pub, **plain), control)
    assert "authorization failed" in refused.lower(), refused
    refused = _delivery_error(client.producer(secured.bootstrap, reader, **plain), clicks)
    assert "authorization failed" in refused.lower(), refused
    assert _delivery_error(client.producer(secured.bootstrap, pub, **plain), clicks) == ""
