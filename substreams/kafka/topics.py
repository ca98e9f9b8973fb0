"""Idempotent topic creation: `substreams topics create` and every component's start-up.

A missing topic is created with the replication factor, ``min.insync.replicas`` and
cleanup settings its :class:`~substreams.config.TopicSpec` asks for (``Config.topics()``; why
each kind is kept the way it is: docs/design.md, "Topic settings").  An existing topic is never
changed: an operator may have changed it on purpose, and altering retention or replication
under running readers is a decision, not a side effect of starting a component.  Instead, its
settings are compared with the wanted ones and every difference is reported
(:attr:`TopicReport.differences`; `topics create` prints them, other callers log them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ClusterMetadata,
    ConfigResource,
    NewTopic,
    ResourceType,
    TopicMetadata,
)

from substreams.config.model import (
    DAY_MS,
    KEEP,
    MIB,
    TopicKind,
    TopicSpec,
    auto_replication,
    default_min_insync,
)
from substreams.errors import BrokerError
from substreams.kafka.clock import Deadline

log = logging.getLogger(__name__)

REPLICATION = "replication factor"
"""The name differences use for the replication factor (not a topic config in Kafka)."""


@dataclass(frozen=True)
class Wanted:
    """What a topic should look like, resolved against the cluster (automatic values filled)."""

    name: str
    kind: TopicKind
    partitions: int
    replication_factor: int
    configs: Mapping[str, str]
    """Topic-level settings, ``min.insync.replicas`` included."""
    automatic_replication: bool = False


@dataclass(frozen=True)
class Difference:
    """An existing topic's setting that is not what the config wants (left as it is)."""

    topic: str
    setting: str
    actual: str
    wanted: str

    def __str__(self) -> str:
        return (
            f"{self.topic}: {self.setting} is {show(self.setting, self.actual)}, "
            f"the config wants {show(self.setting, self.wanted)}"
        )


@dataclass
class TopicReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    unchecked: dict[str, str] = field(default_factory=dict)
    """Existing topics whose settings could not be read, and why."""
    wanted: dict[str, Wanted] = field(default_factory=dict)
    brokers: int = 0


def ensure_topics(
    admin: AdminClient,
    topics: Iterable[tuple[str, int]],
    replication_factor: int | None = None,
    timeout: float = 30.0,
    *,
    min_insync_replicas: int | None = None,
    log_differences: bool = True,
) -> TopicReport:
    """Create the missing ``topics``; report how the existing ones differ from what is wanted.

    ``topics`` are :class:`TopicSpec`\\ s (``Config.topics()``) or plain ``(name, partitions)``
    pairs, which get the settings of kind ``other`` (kept forever: nothing is lost when it is
    not known who reads the topic back).  ``replication_factor`` / ``min_insync_replicas``
    override a spec's; None everywhere means automatic: min(3, brokers in the cluster), and 2
    in-sync replicas when there are >= 3 replicas, else 1.  An existing topic with fewer
    partitions than wanted is an error (records would silently land elsewhere than the config
    says); other differences are only reported (and logged as warnings unless
    ``log_differences`` is false).
    """
    specs = {spec.name: spec for spec in map(_as_spec, topics)}
    meta = admin.list_topics(timeout=10.0)
    report = TopicReport(brokers=len(meta.brokers))
    for spec in specs.values():
        report.wanted[spec.name] = _resolve(
            spec, replication_factor, min_insync_replicas, report.brokers
        )
    have = {name: t for name, t in meta.topics.items() if t.error is None}
    to_check = _existing(specs, have, report)
    missing = [
        NewTopic(w.name, w.partitions, w.replication_factor, config=dict(w.configs))
        for w in report.wanted.values()
        if w.name not in have
    ]
    if missing:
        to_check += _create(admin, missing, report, timeout)
    if report.created:
        _wait_served(admin, report.created, timeout)
    checked = [n for n in to_check if specs[n].kind != "other"]
    if checked:
        _compare(admin, [report.wanted[n] for n in checked], meta, report, timeout)
    if log_differences:
        for diff in report.differences:
            log.warning("topic settings differ (left unchanged): %s", diff)
    return report


def _existing(
    specs: dict[str, TopicSpec], have: dict[str, TopicMetadata], report: TopicReport
) -> list[str]:
    """The wanted topics that exist (recorded in ``report.existing``); raises when one has
    fewer partitions than wanted (records would silently land elsewhere than the config
    says)."""
    existing: list[str] = []
    for name, spec in specs.items():
        if name not in have:
            continue
        parts = len(have[name].partitions)
        if parts < spec.partitions:
            raise BrokerError(
                f"topic '{name}' exists with {parts} partitions; the config wants {spec.partitions}"
            )
        report.existing.append(name)
        existing.append(name)
    return existing


def _create(
    admin: AdminClient, missing: list[NewTopic], report: TopicReport, timeout: float
) -> list[str]:
    """Create ``missing`` (recorded in ``report.created``); returns those another process
    created meanwhile (recorded in ``report.existing``: their settings are to be checked)."""
    raced: list[str] = []
    futures = admin.create_topics(missing, operation_timeout=timeout, request_timeout=timeout)
    for name, fut in futures.items():
        try:
            fut.result()
            report.created.append(name)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                report.existing.append(name)
                raced.append(name)
            else:
                raise BrokerError(f"cannot create topic '{name}': {err}") from exc
    return raced


def _wait_served(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait until every partition of the new topics has a leader.

    Why: CreateTopics returns once the controller recorded the topic, and the brokers learn
    of it a moment later; a client that asks for offsets in between gets
    NOT_LEADER_FOR_PARTITION (seen here on Apache Kafka 4.1 under load)."""
    deadline = Deadline(timeout)
    waiting = set(names)
    while waiting:
        meta = admin.list_topics(timeout=10.0)
        for name in list(waiting):
            t = meta.topics.get(name)
            if t is not None and t.error is None and t.partitions and all(
                p.leader >= 0 and p.error is None for p in t.partitions.values()
            ):
                waiting.discard(name)
        if not waiting:
            return
        if deadline.passed:
            raise BrokerError(
                f"topics {sorted(waiting)} were created but have no leader after {timeout:.0f} s"
            )
        time.sleep(0.05)


def _as_spec(topic: tuple[str, int]) -> TopicSpec:
    if isinstance(topic, TopicSpec):
        return topic
    name, partitions = topic
    return TopicSpec(name, partitions)


def _resolve(
    spec: TopicSpec, replication: int | None, min_insync: int | None, brokers: int
) -> Wanted:
    explicit = replication if replication is not None else spec.replication_factor
    rf = explicit if explicit is not None else auto_replication(brokers)
    isr = min_insync if min_insync is not None else spec.min_insync_replicas
    if isr is None:
        isr = default_min_insync(rf)
    elif isr > rf:
        # The loader refuses this for a configured replication factor; an automatic one is
        # only known now.
        how = f" (automatic: min(3, {brokers} broker(s)))" if explicit is None else ""
        raise BrokerError(
            f"kafka.min_insync_replicas is {isr} but topic '{spec.name}' gets {rf} replica(s)"
            f"{how}: no write could ever be acknowledged; lower kafka.min_insync_replicas"
        )
    configs = {**spec.configs, "min.insync.replicas": str(isr)}
    return Wanted(spec.name, spec.kind, spec.partitions, rf, configs, explicit is None)


def _compare(
    admin: AdminClient,
    wanted: list[Wanted],
    meta: ClusterMetadata,
    report: TopicReport,
    timeout: float,
) -> None:
    """Add the differences of the existing ``wanted`` topics to ``report``."""
    for w in wanted:
        t = meta.topics.get(w.name)
        if t is None:  # created meanwhile by someone else: ask again
            t = admin.list_topics(topic=w.name, timeout=10.0).topics.get(w.name)
        if t is not None and t.error is None:
            factors = sorted({len(p.replicas) for p in t.partitions.values()})
            if factors and factors != [w.replication_factor]:
                actual = "/".join(str(f) for f in factors)
                want = str(w.replication_factor)
                if w.automatic_replication:
                    want += f" (automatic: min(3, {report.brokers} broker(s)))"
                report.differences.append(Difference(w.name, REPLICATION, actual, want))
    resources = [ConfigResource(ResourceType.TOPIC, w.name) for w in wanted]
    futures = admin.describe_configs(resources, request_timeout=timeout)
    by_name = {r.name: f for r, f in futures.items()}
    for w in wanted:
        try:
            entries = by_name[w.name].result()
        except KafkaException as exc:
            report.unchecked[w.name] = str(exc.args[0])
            continue
        for key, value in w.configs.items():
            entry = entries.get(key)
            found: str | None = entry.value if entry is not None else None
            if found is None:
                report.unchecked[w.name] = f"the broker did not return {key}"
            elif _normal(key, found) != _normal(key, value):
                report.differences.append(Difference(w.name, key, found, value))


def _normal(key: str, value: str) -> str:
    if key == "cleanup.policy":
        return ",".join(sorted(p.strip() for p in value.split(",")))
    return value.strip()


# --------------------------------------------------------------------------- display


def show(setting: str, value: str) -> str:
    """A setting's value with a human reading: ``604800000 (7 d)``, ``-1 (forever)``."""
    try:
        number = int(value)
    except ValueError:
        return value
    if setting.endswith(".ms"):
        return f"{value} ({duration(number)})"
    if setting.endswith(".bytes"):
        return f"{value} ({size(number)})"
    return value


def duration(ms: int) -> str:
    if ms == KEEP:
        return "forever"
    for unit, label in ((DAY_MS, "d"), (3_600_000, "h"), (60_000, "min"), (1000, "s")):
        if ms >= unit and ms % unit == 0:
            return f"{ms // unit} {label}"
    return f"{ms} ms"


def size(n: int) -> str:
    if n == KEEP:
        return "unlimited"
    for unit, label in ((1 << 30, "GiB"), (MIB, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {label}"
    return f"{n} bytes"


def policy(wanted: Wanted) -> str:
    """How a topic is kept, in a few words: ``deleted after 7 d``, ``kept forever``..."""
    retention = int(wanted.configs.get("retention.ms", KEEP))
    limit = int(wanted.configs.get("retention.bytes", KEEP))
    if "compact" in wanted.configs.get("cleanup.policy", "delete"):
        kept = "compacted"
    elif retention != KEEP:
        kept = f"deleted after {duration(retention)}"
    elif limit != KEEP:
        kept = f"newest {size(limit)} kept"
    else:
        kept = "kept forever"
    rf = f"RF {wanted.replication_factor}" + (" (auto)" if wanted.automatic_replication else "")
    isr = wanted.configs.get("min.insync.replicas", "?")
    return f"{wanted.kind}, {kept}, {rf}, min.insync.replicas {isr}"
