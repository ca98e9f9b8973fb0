"""Who may write a control topic: the rule every reader applies before it obeys a record.

Why: the product is the notification.  Any client that can produce to a control topic could
announce a window as complete; the hash chain shows afterwards that a writer's timeline is
unbroken, not that the writer is the acker.  So a reader checks the record's ``writer``
against the names the config implies, and refuses (logs, counts, passes over; never obeys)
any other.  The name is what the writer says it is: against a principal that may write the
topic and names itself after the acker, only the broker's ACLs protect (``substreams
acls``: only the acker's principal and transactional id may write control topics); this
check stops every other writer -- a misconfigured publisher, a test tool, a foreign
service -- and makes the attempt visible (docs/design.md, "Threat model and writer
identity").

Trusted, per topic:

* a substream's control topic: the acker (``acker.name`` and its shards
  ``<name>.shard<i>of<N>``) when the substream is tracked by the acker, its aligner
  (``aligner.<substream>``) when by punctuations;
* an acker's checkpoint topic ``<prefix>__acker.<name>``: that acker (``<name>``, and what a
  shard of a new layout writes there when it retires it: the same name);
* an aligner's checkpoint topic: that aligner;
* on every topic, a ``ChainResume`` by ``operator.<name>`` (``substreams control resume``: a
  decision about a broken chain, not a notification);
* on every topic, the ``acker.trusted_writers`` patterns (shell-style: ``direct.*``).

Topics the config does not know are not judged (a reader of another config's topic)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from substreams.config import Config
from substreams.control.messages import ChainResume, ControlRecord

__all__ = ["FOREIGN_WRITER", "WriterCheck"]

FOREIGN_WRITER = "foreign_writer"
"""The ``kind`` label of ``substreams_control_bad_records_total`` for a refused record."""

OPERATOR_PREFIX = "operator."


@dataclass(frozen=True)
class WriterCheck:
    """The trusted writers of each control topic of one config."""

    exact: dict[str, frozenset[str]]
    """topic -> writer names."""
    shard_bases: dict[str, str]
    """topic -> the acker name whose shards (``<name>.shard...``) may write it."""
    patterns: tuple[str, ...]

    @staticmethod
    def of(config: Config, also: tuple[str, ...] = ()) -> WriterCheck:
        """``also``: names trusted on every topic besides (an acker run under a name of
        its own trusts itself)."""
        a = config.acker
        exact: dict[str, frozenset[str]] = {}
        shard_bases: dict[str, str] = {}
        for sub in config.substreams:
            topic = a.control_topic(sub.name)
            if sub.mechanism == "punctuations":
                exact[topic] = frozenset({f"aligner.{sub.name}"})
                exact[a.aligner_checkpoint_topic(sub.name)] = frozenset({f"aligner.{sub.name}"})
            else:
                exact[topic] = frozenset({a.name})
                shard_bases[topic] = a.name
        return WriterCheck(exact, shard_bases, (*a.trusted_writers, *also))

    def admits(self, topic: str, record: ControlRecord) -> bool:
        """Whether a reader may use ``record`` read from ``topic``."""
        writer = record.writer
        names = self.exact.get(topic)
        if names is None:
            if self._checkpoint_writer(topic, writer):
                return True
        elif writer in names:  # the common case first: the acker's own record
            return True
        else:
            base = self.shard_bases.get(topic)
            if base is not None and writer.startswith(f"{base}.shard"):
                return True
        if isinstance(record.body, ChainResume) and writer.startswith(OPERATOR_PREFIX):
            return True
        return any(fnmatch.fnmatchcase(writer, p) for p in self.patterns)

    def _checkpoint_writer(self, topic: str, writer: str) -> bool:
        """An acker's checkpoint topic is written by that acker; any other topic the config
        does not know is not judged."""
        marker = "__acker."
        at = topic.find(marker)
        if at < 0:
            return True
        return writer == topic[at + len(marker):]

    def trusted(self, topic: str) -> str:
        """Who may write ``topic``, for a refusal's message."""
        names = sorted(self.exact.get(topic, ()))
        base = self.shard_bases.get(topic)
        if base is not None:
            names.append(f"{base}.shard*")
        return ", ".join([*names, *self.patterns]) or "(any)"
