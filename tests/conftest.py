"""Shared fixtures: one Apache Kafka broker per test session, per-test unique topics; the tiers.

Broker choice, in order: ``$SUBSTREAMS_BOOTSTRAP`` (any external cluster), Apache Kafka in a
testcontainer when a Docker engine answers, else the embedded Apache Kafka (one KRaft node
in a temporary folder, from the Maven-resolved jars).
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

from substreams.config import Config, load_config
from substreams.control.follower import RAISE, ControlFollower
from substreams.control.messages import EpochComplete, completions
from substreams.kafka import client
from substreams.kafka.embedded import KafkaCluster
from substreams.kafka.read import drain
from substreams.kafka.topics import ensure_topics
from substreams.streams.deadletter import DeadLetter

# Hypothesis' per-example deadline (200 ms) measures the machine, not the property: on the
# shared 2-core machine a loaded moment failed a pure framing test as "flaky".  Speed
# targets live in benchmarks.
settings.register_profile("substreams", deadline=None)
settings.load_profile("substreams")

# The suite's tiers, run in this order: a broken rule fails in seconds, before any broker or
# SparkSession starts.  Each test gets its tier's marker (``pytest -m pure`` runs the first
# two tiers alone; ``-m "not chaos"`` skips the real-process fault drills).
TIERS: tuple[tuple[str, str], ...] = (
    ("pure", "rules and encodings, no broker: unit and property tests"),
    ("sim", "the deterministic simulator over the in-memory log"),
    ("contract", "the same Log cases against real Kafka and the in-memory log"),
    ("integration", "real Apache Kafka, real processes"),
    ("spark", "a real local SparkSession (slow start)"),
    ("chaos", "SIGKILLed publishers, ackers, Spark drivers, broker nodes: what only a real "
     "process or broker can show"),
)
CHAOS_MODULES = frozenset({
    "test_publisher_crashes", "test_open_transactions", "test_acker_recovery",
    "test_driver_kill", "test_sink_driver_kill", "test_broker_failures", "test_cluster",
    "test_submit_kill", "test_keyed_scale",
})
"""Modules whose tests kill real processes or broker nodes (the chaos tier)."""


def tier_of(path: Path) -> str:
    if path.stem in CHAOS_MODULES:
        return "chaos"
    if path.stem == "test_log_contract":
        return "contract"
    folder = path.parent.name
    return {"unit": "pure", "sim": "sim", "spark": "spark"}.get(folder, "integration")


def worker_id(config: pytest.Config) -> str | None:
    """The pytest-xdist worker's id (``gw0``, ``gw1``, ...) inside a worker; None in the
    controller of a parallel run and in a plain (``-n 0``) run."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["workerid"])


def parallel_controller(config: pytest.Config) -> bool:
    """True in the process that starts pytest-xdist workers (``-n N``, N > 0)."""
    if worker_id(config) is not None or not config.pluginmanager.hasplugin("xdist"):
        return False
    return bool(config.getoption("numprocesses", None)) and config.getoption("dist") != "no"


def fetch_jars_once() -> None:
    """Fetch the embedded Kafka's jars and Spark's Kafka connector with Maven, once, before
    any worker starts.

    Why in the controller: each worker is its own session with its own broker and
    SparkSession, and would otherwise run ``mvn`` into ``~/.m2`` at the same moment as the
    others on a fresh machine (the Kafka classpath has a lock file; the connector fetch has
    not).  Both are folder checks when the jars are there.  Missing Java or Maven is not
    this hook's failure: the tests that need them fail with the fix in their message."""
    from substreams.errors import BrokerError
    from substreams.kafka.embedded import kafka_classpath

    try:
        kafka_classpath()
        from substreams.spark.connector import ensure_jvm_packages

        ensure_jvm_packages()
    except (BrokerError, ImportError) as e:
        print(f"conftest: jars not fetched before the workers start: {e}", file=sys.stderr)


JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
"""What every JVM the tests start gets (brokers, the 3-node cluster, Spark sessions,
``spark-submit`` drivers, the standalone cluster), through ``JAVA_TOOL_OPTIONS``: C1 only.
Why: they live seconds to minutes on small inputs, where the C2 compiler's work costs more CPU
than its faster code saves (the Spark benchmark's smoke run: its first query 33 -> 23 s; the
whole suite in two workers 716 -> 680 s), on two cores they share with everything else.  Only
the JIT changes, not what the code does; a caller's own ``JAVA_TOOL_OPTIONS`` wins."""


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("JAVA_TOOL_OPTIONS", JVM_OPTIONS)  # before any worker or JVM starts
    for name, what in TIERS:
        config.addinivalue_line("markers", f"{name}: {what}")
    if not config.pluginmanager.hasplugin("xdist"):  # pytest-xdist registers it itself
        config.addinivalue_line("markers", "xdist_group(name): run together on one worker")
    if parallel_controller(config):
        fetch_jars_once()


ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("substreams", "substreams_bench", "tests", "jobs")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules once, when ``PYTHONDONTWRITEBYTECODE`` is set.

    Why: the suite starts a few hundred Python processes (CLI services, publisher
    processes, Spark drivers and their Python workers), each importing substreams; with the
    variable set none of them writes bytecode, so every one compiled the whole package from
    source again (~0.4 CPU-s a launch).  They still read bytecode that exists, so one
    compilation here (~1 CPU-s, into the ignored ``__pycache__`` folders) serves them all.
    Under pytest-xdist the controller does it, before its workers start."""
    if worker_id(session.config) is not None:
        return
    if sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE"):
        for package in PROJECT_PACKAGES:
            if (ROOT / package).is_dir():
                compileall.compile_dir(ROOT / package, quiet=1)


MODULE_FIXTURE_MODULES = frozenset({"test_broker_failures", "test_install", "test_secured"})
"""Modules whose module-scoped fixture is costly (a 3-node cluster, a wheel in a fresh venv, a
secured broker): under ``--dist loadgroup`` each runs on one worker, so the fixture starts
once."""


SPARK_GROUP = "spark"
"""Every test that starts a Spark JVM runs on one worker under ``--dist loadgroup``: those
using the ``spark`` fixture, a whole module under ``tests/spark`` with a costly module
fixture, and those marked ``xdist_group(SPARK_GROUP)`` (the standalone cluster, the Spark
benchmark's smoke run, whose JVMs are their own).  Two Spark JVMs with their job processes on
two cores made each heavy Spark test slower than the waits they overlapped (docs/design.md,
"The suite in parallel workers"); one worker also means one test SparkSession, while the
other workers run the broker-only tests beside it, the JVM-free tests under ``tests/spark``
(options, encodings, read limits) among them."""


def in_spark_group(item: pytest.Item) -> bool:
    path = Path(str(item.path))
    if path.parent.name == "spark" and path.stem in MODULE_FIXTURE_MODULES:
        return True
    marks = [m.args[0] if m.args else m.kwargs.get("name") for m in
             item.iter_markers("xdist_group")]
    return SPARK_GROUP in marks or "spark" in getattr(item, "fixturenames", ())


def name_group(config: pytest.Config, item: pytest.Item, group: str) -> None:
    """Put ``@group`` at the end of ``item``'s node id, as pytest-xdist's ``loadgroup`` does.

    Why here: the scheduler groups tests by that suffix, and pytest-xdist 3.8 writes it to
    ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is ``item._id``): the
    marks were there, no group was, and ``--dist loadgroup`` ran as ``--dist load``, Spark
    tests on both workers.  With a pytest that still reads ``_nodeid``, xdist adds it."""
    if worker_id(config) is None or not config.getvalue("loadgroup") or "@" in item.nodeid:
        return
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId  # pytest >= 9.2

        item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = {name: i for i, (name, _) in enumerate(TIERS)}
    # In a parallel run the Spark group goes first: one worker takes it at once and runs it
    # beside the others' tiers, instead of starting it after them and running alone.
    in_worker = worker_id(config) is not None
    tiers: dict[str, str] = {}
    spark_group: set[str] = set()
    for item in items:
        path = Path(str(item.path))
        tier = tier_of(path)
        item.add_marker(tier)
        if in_spark_group(item):
            item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))
            name_group(config, item, SPARK_GROUP)
            spark_group.add(item.nodeid)
        elif path.stem in MODULE_FIXTURE_MODULES:
            item.add_marker(pytest.mark.xdist_group(path.stem))
            name_group(config, item, path.stem)
        tiers[item.nodeid] = tier
    # A stable sort keeps each module's tests together (module fixtures start once).
    items.sort(key=lambda item: (
        in_worker and item.nodeid not in spark_group, order[tiers[item.nodeid]]
    ))

CLICK_SCHEMA = {
    "type": "record",
    "name": "Click",
    "namespace": "substreams.test",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "url", "type": "string"},
        {"name": "ts", "type": "long"},
    ],
}


def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def kafka_kind() -> str:
    if os.environ.get(client.ENV_BOOTSTRAP):
        return "external"
    return "docker" if docker_available() else "embedded"


@pytest.fixture(scope="session")
def bootstrap(kafka_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if kafka_kind == "external":
        yield os.environ[client.ENV_BOOTSTRAP]
        return
    if kafka_kind == "docker":  # pragma: no cover - no Docker engine on our machines
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    with KafkaCluster(tmp_path_factory.mktemp("kafka")) as cluster:
        yield cluster.bootstrap


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may find (or clobber) a developer's recorded broker."""
    monkeypatch.setenv("SUBSTREAMS_HOME", str(tmp_path / "home"))


ConfigFactory = Callable[..., Config]


@pytest.fixture
def make_config(tmp_path: Path, bootstrap: str) -> ConfigFactory:
    """Write a config with uniquely named streams (a topic per test) and create its topics.

    ``streams`` / ``substreams`` / ``stages`` are lists of dicts as in the YAML; every
    name is given a unique suffix, references are rewritten to match.  Returns the
    loaded Config; ``config.kafka.bootstrap`` points at the session's broker.
    """

    def factory(
        streams: list[dict[str, Any]],
        substreams: list[dict[str, Any]] | None = None,
        stages: list[dict[str, Any]] | None = None,
        acker: dict[str, Any] | None = None,
        create: bool = True,
        kafka: dict[str, Any] | None = None,
    ) -> Config:
        suffix = uuid.uuid4().hex[:8]
        ren = {s["name"]: f"{s['name']}-{suffix}" for s in streams}
        schema_path = tmp_path / "click.avsc"
        schema_path.write_text(json.dumps(CLICK_SCHEMA))
        doc: dict[str, Any] = {
            "kafka": {"bootstrap": bootstrap, **(kafka or {})},
            "streams": [
                {"schema": "click.avsc", "order_key": "ts", **s, "name": ren[s["name"]]}
                for s in streams
            ],
            "substreams": [
                {**s, "name": f"{s['name']}-{suffix}", "stream": ren[s["stream"]]}
                for s in substreams or []
            ],
            "stages": [
                {
                    **s,
                    "name": f"{s['name']}-{suffix}",
                    "input": ren[s["input"]],
                    "output": ren[s["output"]],
                }
                for s in stages or []
            ],
            "acker": {
                "name": f"acker-{suffix}",
                "acks_topic": f"_acks-{suffix}",
                "control_topic_prefix": f"_control-{suffix}.",
                "command_topic": f"_commands-{suffix}",
                "response_topic": f"_responses-{suffix}",
                "dead_letter_topic": f"_dlq-{suffix}",
                # the writers tests run besides the acker: publishers writing their own
                # control records (DIRECT) and hand-made progress writers named acker...
                "trusted_writers": ["direct.*", "acker*"],
                **(acker or {}),
            },
        }
        path = tmp_path / f"substreams-{suffix}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        config = load_config(path)
        if create:
            ensure_topics(client.admin(bootstrap), config.topics())
        return config

    return factory


def short(name: str) -> str:
    """A test's logical name from a suffixed one ("clicks-1a2b3c4d" -> "clicks")."""
    return name.rsplit("-", 1)[0]


def read_dead_letters(
    config: Config, timeout: float = 30.0, *, markers: bool = False
) -> list[DeadLetter]:
    """Every dead letter so far: the whole dead-letter topic, or an error.  A replay's
    markers are not letters: left out unless ``markers``."""
    topic = config.acker.dead_letter_topic
    out = [DeadLetter.from_json(m.value()) for m in
           drain(client.resolve_bootstrap(config), config, topic, timeout=timeout)]
    return out if markers else [d for d in out if not d.is_replay_marker]


def follow_notifications(
    config: Config, substream: str, count: int, timeout: float = 30.0
) -> list[EpochComplete]:
    """The EpochComplete notes of ``substream``'s control topic once there are ``count`` (or
    ``timeout`` passed), with whatever else is already there: one tail read as the records
    come (the wait ends when the notification arrives, the topic is not read again and
    again from its start)."""
    return follow_each(config, [substream], count, timeout)[substream]


def follow_each(
    config: Config, substreams: Sequence[str], count: int, timeout: float = 30.0
) -> dict[str, list[EpochComplete]]:
    """:func:`follow_notifications` for several substreams at once (one reader of all their
    control topics): the notes of each once every one has ``count``, or ``timeout`` passed."""
    notes: dict[str, list[EpochComplete]] = {s: [] for s in substreams}
    of_topic = {config.acker.control_topic(s): s for s in substreams}
    deadline = time.monotonic() + timeout
    with ControlFollower(
        config.kafka.bootstrap, config, name="test: notifications", on_bad=RAISE, verify=False
    ) as tail:
        tail.assign(dict.fromkeys(of_topic, 0))
        while True:
            batch = tail.poll_batch(0.2)
            for followed in batch:  # one per time, batched or not
                notes[of_topic[followed.topic]].extend(completions(followed.record.body))
            if all(len(n) >= count for n in notes.values()):
                if not batch:  # reached, and nothing more is buffered
                    return notes
                deadline = min(deadline, time.monotonic() + 1.0)
            if time.monotonic() > deadline:
                return notes
