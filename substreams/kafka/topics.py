"""Idempotent topic creation: `substreams topics create` and every component's start-up."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from substreams.errors import BrokerError


@dataclass
class TopicReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)


def partition_counts(admin: AdminClient, timeout: float = 10.0) -> dict[str, int]:
    meta = admin.list_topics(timeout=timeout)
    return {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}


def ensure_topics(
    admin: AdminClient,
    topics: Iterable[tuple[str, int]],
    replication_factor: int = 1,
    timeout: float = 30.0,
) -> TopicReport:
    """Create the missing topics; an existing topic with fewer partitions than wanted is an
    error (records would silently land elsewhere than the config says)."""
    wanted = dict(topics)
    report = TopicReport()
    have = partition_counts(admin)
    missing = [NewTopic(n, p, replication_factor) for n, p in wanted.items() if n not in have]
    for name, parts in wanted.items():
        if name in have:
            if have[name] < parts:
                raise BrokerError(
                    f"topic '{name}' exists with {have[name]} partitions; the config wants {parts}"
                )
            report.existing.append(name)
    if missing:
        futures = admin.create_topics(missing, operation_timeout=timeout, request_timeout=timeout)
        for name, fut in futures.items():
            try:
                fut.result()
                report.created.append(name)
            except KafkaException as exc:
                err = exc.args[0]
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    report.existing.append(name)
                else:
                    raise BrokerError(f"cannot create topic '{name}': {err}") from exc
    return report
