"""`substreams verify`: prove that each control topic is an unbroken, untampered timeline.

Why from offset 0: a hash chain only proves continuity from a point one trusts, and the only
point everyone trusts is the genesis digest.  Once retention moved a topic's log start past 0
the genesis is gone: each writer's chain is then proven from its first remaining record (whose
own digest is still checked), and the report says from which offset (``start_offset``).
The first break that no operator accepted is what counts (everything after it is
unprovable); the walk keeps counting records so the report shows how much of the topic is
affected, and lists the breaks an operator accepted with ``substreams control resume`` (see
docs/design.md, "Resuming a broken chain").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from substreams.config import Config
from substreams.control.chain import ChainHead, ChainVerifier, compute_digest, resumes
from substreams.control.io import ControlWriter, decode_control, find_resume
from substreams.control.messages import ChainResume, ControlRecord
from substreams.errors import ProtocolError, SubstreamsError
from substreams.kafka import client
from substreams.kafka.clock import Deadline
from substreams.kafka.read import Reader

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
    record: ControlRecord | None = field(default=None, compare=False, repr=False)
    """The record that breaks the chain (None when undecodable)."""


@dataclass
class TopicReport:
    """What the walk over one control topic found."""

    topic: str
    substream: str
    records: int = 0
    last_seq: dict[str, int] = field(default_factory=dict)
    breaks: list[Break] = field(default_factory=list)
    """Breaks no operator accepted, in topic order (the first one is what counts)."""
    resumed: list[tuple[Break, ChainResume]] = field(default_factory=list)
    """Breaks an operator accepted (``substreams control resume``), with the decision."""
    start_offset: int = 0
    """Where the walk started: the log start (0 unless retention deleted the head)."""

    @property
    def broken(self) -> Break | None:
        return self.breaks[0] if self.breaks else None

    @property
    def ok(self) -> bool:
        return not self.breaks


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
    """Walk ``topic`` from offset 0 to its end, checking every writer's chain.

    A break is provisional until the end of the topic: an operator's later
    :class:`ChainResume` for exactly that record moves it to ``resumed``, and the writer's
    chain is judged on from the accepted record (as readers do).  Undecodable records can
    not be resumed.  ``idle_timeout``: give up after that long without progress."""
    report = TopicReport(topic, substream)
    verifier = ChainVerifier()
    pending: dict[int, tuple[Break, ControlRecord]] = {}
    with Reader(bootstrap, config, [TopicPartition(topic, 0, 0)],
                name=f"control topic '{topic}'") as tail:
        report.start_offset = tail.log_start(topic)
        deadline = Deadline(idle_timeout)
        while not tail.caught_up:
            batch = tail.poll(0.2, 5000)
            if batch:
                deadline.restart()
            elif deadline.passed:
                raise SubstreamsError(
                    f"control topic '{topic}': no end of partition within {idle_timeout} s"
                )
            for msg in batch:
                report.records += 1
                offset = msg.offset()
                try:
                    rec = decode_control(msg)
                except ProtocolError as exc:  # reported as a break, never passed over
                    report.breaks.append(Break(offset, "?", UNDECODABLE, str(exc)))
                    continue
                if report.start_offset and rec.writer not in verifier.heads:
                    # the head was deleted by retention: anchor on the first remaining record
                    verifier.heads[rec.writer] = ChainHead(rec.seq, rec.prev_digest)
                brk = _judge(verifier, report, offset, rec)
                if brk is not None:
                    report.breaks.append(brk)
                    pending[offset] = (brk, rec)
                    verifier.heads[rec.writer] = ChainHead(rec.seq + 1, rec.digest)
                body = rec.body
                if isinstance(body, ChainResume) and body.offset in pending:
                    brk, broken = pending[body.offset]
                    if resumes(body, body.offset, broken):
                        del pending[body.offset]
                        report.breaks.remove(brk)
                        report.resumed.append((brk, body))
    return report


def _judge(verifier: ChainVerifier, report: TopicReport, offset: int,
           rec: ControlRecord) -> Break | None:
    kind = classify(verifier.heads.get(rec.writer, ChainHead()), rec)
    brk = verifier.check(offset, rec)
    if brk is not None:
        return Break(offset, rec.writer, kind or MODIFIED, brk.reason, rec)
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


def record_resume(
    config: Config,
    topic: str,
    offset: int,
    reason: str,
    operator: str,
    bootstrap: str | None = None,
) -> tuple[int, ChainResume]:
    """Record on ``topic`` the operator's decision to accept the chain break at ``offset``
    (a :class:`ChainResume`, hash-chained in the writer ``operator.<operator>``'s own chain);
    returns where it was written.  Refused unless ``offset`` is a break no one accepted yet,
    and for undecodable records (there is no chain to continue)."""
    if not reason.strip():
        raise SubstreamsError("give the reason for the decision (--reason): it is recorded")
    server = client.resolve_bootstrap(config, bootstrap)
    report = verify_topic(server, topic, "", config)
    if any(b.offset == offset for b, _ in report.resumed):
        raise SubstreamsError(f"control topic '{topic}' offset {offset}: already resumed")
    brk = next((b for b in report.breaks if b.offset == offset), None)
    if brk is None:
        found = ", ".join(str(b.offset) for b in report.breaks) or "none"
        raise SubstreamsError(
            f"control topic '{topic}' has no broken hash chain at offset {offset} "
            f"(unaccepted breaks at: {found})"
        )
    if brk.record is None:
        raise SubstreamsError(
            f"control topic '{topic}' offset {offset}: the record is undecodable; there is no "
            "chain to resume (readers stop there: restore the topic or re-create it)"
        )
    rec = brk.record
    decision = ChainResume(rec.writer, offset, rec.seq, rec.digest, operator, reason)
    name = f"operator.{operator}"
    writer = ControlWriter(server, name, [topic], config, transactional_id=f"substreams.{name}")
    try:
        writer.recover()
        writer.write([(topic, decision)])
    finally:
        writer.close()
    written = find_resume(server, topic, offset, rec, config)
    if written is None:  # pragma: no cover - read_committed sees the committed write
        raise SubstreamsError(f"control topic '{topic}': the decision was not read back")
    return written
