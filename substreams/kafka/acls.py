"""Least-privilege ACLs per role, generated from the config (``substreams acls``).

Why generated: the names a role touches -- data, acks, control, checkpoint and schema
topics, the transactional ids (``substreams.pub.<stream>.<source>``,
``substreams.acker.<name>[.shard<i>of<N>]``), the never-joined consumer groups
(``substreams-<random>``, ``substreams.stage.<name>``, ``substreams.spark...``) -- are the
code's, and a hand-written list drifts from them.  The rule the roles keep: only the acker
may write control and checkpoint topics (and only with its transactional ids); a publisher
writes its data topics, the acks topic (its reports travel in its own transactions) and the
dead-letter topic; a reader writes nothing.

Roles:

* ``publisher``: write the data topics (``streams``: all of the config's by default), the
  acks and dead-letter topics, the schema topic (it registers its writer schema); read the
  acker's checkpoint topics (it checks the acker serves its substreams);
  transactional ids ``substreams.pub.<stream>.`` (prefixed) of those streams;
* ``acker``: read the acks and command topics, write the control topics, its checkpoint
  topics (``<prefix>__acker.<name>``, prefixed: its shards', created by itself), the
  response and dead-letter topics; transactional ids ``substreams.acker.<name>``
  (prefixed: its shards) and ``substreams.pub.`` (prefixed: it fences an evicted source's id,
  which writes nothing without topic rights);
* ``reader``: read the data, control (prefixed: checkpoints and schemas too) and
  dead-letter topics; read the groups its consumers name (never joined);
* ``spark``: a reader that also writes results as a stage: the publisher's rights on the
  data topics, the sink's commit topics ``_substreams.commits.<stream>`` (it creates them),
  its groups ``substreams.`` (prefixed: units and stages commit offsets in their
  transactions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from substreams.config import Config
from substreams.errors import SubstreamsError

Role = Literal["publisher", "acker", "reader", "spark"]
ROLES: tuple[Role, ...] = ("publisher", "acker", "reader", "spark")

ResourceKind = Literal["TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER"]
Pattern = Literal["LITERAL", "PREFIXED"]
Operation = Literal["READ", "WRITE", "DESCRIBE", "CREATE", "DESCRIBE_CONFIGS"]

CLIENT_GROUPS = "substreams-"
"""The prefix of the group ids of our consumers (assigned, never joined)."""
PUBLISHER_TXN = "substreams.pub."
ACKER_TXN = "substreams.acker."


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW rule for a principal, on any host."""

    kind: ResourceKind
    pattern: Pattern
    name: str
    operation: Operation

    def line(self, principal: str) -> str:
        """As ``kafka-acls`` would describe it."""
        return (f"ALLOW {principal} {self.operation} {self.kind} {self.name}"
                + (" (prefixed)" if self.pattern == "PREFIXED" else ""))

    def binding(self, principal: str) -> Any:
        """The ``confluent_kafka.admin.AclBinding`` that creates it."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        kind = "BROKER" if self.kind == "CLUSTER" else self.kind
        return AclBinding(
            ResourceType[kind], self.name, ResourcePatternType[self.pattern], principal, "*",
            AclOperation[self.operation], AclPermissionType.ALLOW,
        )


def schema_topic(config: Config) -> str:
    """:func:`substreams.streams.evolution.schema_topic` (that module sits above this one;
    a test keeps the two equal)."""
    return f"{config.acker.control_topic_prefix}__schemas"


def commit_topic(stream: str) -> str:
    """:func:`substreams.spark.executor.commit_topic` (above this module; a test keeps the
    two equal): a Spark sink's batch and unit markers for ``stream``."""
    return f"_substreams.commits.{stream}"


def _topic(name: str, *ops: Operation, prefixed: bool = False) -> list[Acl]:
    pattern: Pattern = "PREFIXED" if prefixed else "LITERAL"
    return [Acl("TOPIC", pattern, name, op) for op in ("DESCRIBE", *ops)]


def _txn(prefix: str) -> list[Acl]:
    return [Acl("TRANSACTIONAL_ID", "PREFIXED", prefix, op) for op in ("WRITE", "DESCRIBE")]


def _group(prefix: str) -> Acl:
    return Acl("GROUP", "PREFIXED", prefix, "READ")


def role_acls(config: Config, role: str, streams: Sequence[str] = ()) -> list[Acl]:
    """The ACLs ``role`` needs under ``config``, sorted, each once.  ``streams``: the data
    streams a publisher (or Spark job) writes (default: every stream of the config)."""
    if role not in ROLES:
        raise SubstreamsError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    a = config.acker
    data = [s.name for s in config.streams]
    written = list(streams) or data
    for name in written:
        config.stream(name)  # a ConfigError naming the known ones
    acls: list[Acl] = []
    if role in ("publisher", "spark"):
        for name in written:
            acls += _topic(name, "WRITE", "READ", "DESCRIBE_CONFIGS")
            acls += _txn(f"{PUBLISHER_TXN}{name}.")
        acls += _topic(a.acks_topic, "WRITE", "DESCRIBE_CONFIGS")
        acls += _topic(a.dead_letter_topic, "WRITE", "DESCRIBE_CONFIGS")
        acls += _topic(schema_topic(config), "WRITE", "READ", "DESCRIBE_CONFIGS")
        # it checks that the acker serves its substreams (the acker's last checkpoint)
        acls += _topic(a.checkpoint_topic(a.name), "READ", prefixed=True)
        acls.append(_group(CLIENT_GROUPS))
    if role in ("reader", "spark"):
        for name in data:
            acls += _topic(name, "READ")
        acls += _topic(a.control_topic_prefix, "READ", prefixed=True)
        acls += _topic(a.dead_letter_topic, "READ")
        acls.append(_group(CLIENT_GROUPS))
    if role == "spark":
        for name in written:  # the sink's batch markers, created by the query itself
            acls += _topic(commit_topic(name), "WRITE", "READ", "CREATE", "DESCRIBE_CONFIGS")
        acls += _topic(a.dead_letter_topic, "WRITE")
        acls.append(_group("substreams."))  # units' and stages' offsets, Spark's JVM read
    if role == "acker":
        acls += _topic(a.acks_topic, "READ", "DESCRIBE_CONFIGS")
        acls += _topic(a.command_topic, "READ", "DESCRIBE_CONFIGS")
        for sub in config.substreams:
            if sub.mechanism == "acker":
                acls += _topic(a.control_topic(sub.name), "WRITE", "READ", "DESCRIBE_CONFIGS")
        acls += _topic(a.checkpoint_topic(a.name), "WRITE", "READ", "CREATE",
                       "DESCRIBE_CONFIGS", prefixed=True)
        acls += _topic(a.response_topic, "WRITE", "DESCRIBE_CONFIGS")
        acls += _topic(a.dead_letter_topic, "WRITE", "DESCRIBE_CONFIGS")
        acls += _topic(schema_topic(config), "READ")
        acls += _txn(f"{ACKER_TXN}{a.name}")
        acls += _txn(PUBLISHER_TXN)  # fencing an evicted source
        acls.append(_group(CLIENT_GROUPS))
    return sorted(set(acls))


def apply_acls(admin: Any, principal: str, acls: Sequence[Acl], timeout: float = 30.0) -> None:
    """Create ``acls`` for ``principal`` with ``admin`` (an ``AdminClient`` logged in as a
    principal that may alter the cluster's ACLs); creating an existing ACL is a no-op."""
    futures = admin.create_acls([acl.binding(principal) for acl in acls],
                                request_timeout=timeout)
    for future in futures.values():
        future.result(timeout)


def check_principal(principal: str) -> str:
    if not principal.startswith("User:") or len(principal) == len("User:"):
        raise SubstreamsError(f"--principal must be User:<name>, not {principal!r}")
    return principal
