"""`substreams verify`: prove that each control topic is an unbroken, untampered timeline.

Why from offset 0: a hash chain only proves continuity from a point one trusts, and the only
point everyone trusts is the genesis digest.  Once retention moved a topic's log start past 0
the genesis is gone: each writer's chain is then proven from its first remaining record (whose
own digest is still checked), and the report says from which offset (``start_offset``).
The walk stops judging a topic at its FIRST break (everything after it is unprovable) but
keeps counting records so the report shows how much of the topic is affected.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from substreams.config import Config
from substreams.control.chain import ChainHead, ChainVerifier, compute_digest
from substreams.control.io import ControlTail, Corrupt
from substreams.control.messages import ControlRecord
from substreams.errors import SubstreamsError
from substreams.kafka import client

# Why a record broke the chain, as short labels for tables and tests.
UNDECODABLE = "undecodable record"
SEQ_GAP = "seq gap"
SEQ_DUPLICATE = "seq duplicate"
PREV_MISMATCH = "prev_digest mismatch"
MODIFIED = "digest mismatch (modified)"


@dataclass(frozen=True)
class Break:
    """The first place a topic's chain does not hold."""

    offset: int
    writer: str
    kind: str
    detail: str


@dataclass
class TopicReport:
    """What the walk over one control topic found."""

    topic: str
    substream: str
    records: int = 0
    last_seq: dict[str, int] = field(default_factory=dict)
    broken: Break | None = None
    start_offset: int = 0
    """Where the walk started: the log start (0 unless retention deleted the head)."""

    @property
    def ok(self) -> bool:
        return self.broken is None


def classify(head: ChainHead, record: ControlRecord) -> str | None:
    """The kind of break ``record`` makes after ``head``, or None if it continues it."""
    if record.seq > head.next_seq:
        return SEQ_GAP
    if record.seq < head.next_seq:
        return SEQ_DUPLICATE
    if record.prev_digest != head.digest:
        return PREV_MISMATCH
    if record.digest != compute_digest(record):
        return MODIFIED
    return None


def verify_topic(bootstrap: str, topic: str, substream: str, config: Config | None = None,
                 idle_timeout: float = 30.0) -> TopicReport:
    """Walk ``topic`` from offset 0 to its end, checking every writer's chain; stop judging
    at the first break.  ``idle_timeout``: give up after that long without progress."""
    report = TopicReport(topic, substream)
    verifier = ChainVerifier()
    with ControlTail(bootstrap, topic, 0, config) as tail:
        report.start_offset = tail.log_start()
        deadline = time.monotonic() + idle_timeout
        while not tail.at_end:
            batch = tail.poll(0.2, max_records=5000)
            if batch:
                deadline = time.monotonic() + idle_timeout
            elif time.monotonic() > deadline:
                raise SubstreamsError(
                    f"control topic '{topic}': no end of partition within {idle_timeout} s"
                )
            for offset, rec in batch:
                report.records += 1
                if (
                    report.start_offset
                    and not isinstance(rec, Corrupt)
                    and rec.writer not in verifier.heads
                ):  # the head was deleted by retention: anchor on the first remaining record
                    verifier.heads[rec.writer] = ChainHead(rec.seq, rec.prev_digest)
                if report.broken is None:
                    report.broken = _judge(verifier, report, offset, rec)
    return report


def _judge(verifier: ChainVerifier, report: TopicReport, offset: int,
           rec: ControlRecord | Corrupt) -> Break | None:
    if isinstance(rec, Corrupt):
        return Break(offset, "?", UNDECODABLE, rec.reason)
    kind = classify(verifier.heads.get(rec.writer, ChainHead()), rec)
    brk = verifier.check(offset, rec)
    if brk is not None:
        return Break(offset, rec.writer, kind or MODIFIED, brk.reason)
    report.last_seq[rec.writer] = rec.seq
    return None


def verify_config(
    config: Config, substreams: Sequence[str] | None = None, bootstrap: str | None = None
) -> list[TopicReport]:
    """Verify the control topic of every substream of ``config`` (or the named ones)."""
    names = list(substreams) if substreams else [s.name for s in config.substreams]
    for name in names:
        config.substream(name)  # a ConfigError naming the known ones if unknown
    server = client.resolve_bootstrap(config, bootstrap)
    return [
        verify_topic(server, config.acker.control_topic(n), n, config) for n in names
    ]
