"""Reading dead letters back: which letters a filter selects, what identifies the record a
letter holds, and what replaying it would do (pure rules; the I/O is in
:mod:`substreams.dead_letters`).

Why a record identity apart from the letter's own position: several readers may dead-letter
the same undecodable record (a Spark query, ``tail``, ``notifications``: one letter each),
and a replay must publish it once.  A record that had an offset is identified by where it
was read (topic, partition, offset); a record that never got one (a late record, refused
before it was written) by its letter's position in the dead-letter topic, since its
publisher wrote that letter exactly once (in its transaction).

Why the replay log lives in the dead-letter topic: a replay writes, in the transaction of
each republished record, a *replayed* marker naming the record's identity
(:func:`replay_marker`).  Record and marker become visible together or not at all, so a
replay killed at any moment and run again skips exactly what was committed before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from substreams.config import Config, SubstreamConfig
from substreams.errors import SubstreamsError
from substreams.frontier import Keyed, Time, UpperAntichain
from substreams.streams.deadletter import REASON_REPLAYED, DeadLetter
from substreams.streams.times import TimeAssigner

REPLAY_SERVICE = "dead-letters replay"
REPLAY_SOURCE = "dead-letters.replay"
"""The source id replays publish as: one per stream, so a second replay fences the first
(and a killed one's open transaction is aborted by the next)."""

_NAMED_SUBSTREAM = re.compile(r"substream '([^']+)'")


@dataclass(frozen=True)
class StoredLetter:
    """One message of the dead-letter topic, as read back.  ``letter`` is None for a
    message that is not a dead letter (``error`` says why); ``fields`` is the JSON document
    as written (fields a writer added beyond :class:`DeadLetter`'s are kept)."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    letter: DeadLetter | None
    fields: Mapping[str, Any]
    error: str = ""

    @property
    def id(self) -> str:
        """``P:O``, the letter's position in the dead-letter topic (what ``show`` takes)."""
        return f"{self.partition}:{self.offset}"

    @property
    def is_marker(self) -> bool:
        """A replay's marker: replay history, never a letter (not listed, counted, replayed)."""
        return self.letter is not None and self.letter.is_replay_marker


def parse_stored(
    partition: int, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None
) -> StoredLetter:
    """A message of the dead-letter topic; one that is no dead letter is kept with why (a
    listing shows it, never stops at it)."""
    try:
        letter = DeadLetter.from_json(value or b"")
        doc = json.loads(value or b"")
    except (SubstreamsError, ValueError) as exc:
        return StoredLetter(partition, offset, timestamp_ms, key, None, {}, str(exc))
    return StoredLetter(partition, offset, timestamp_ms, key, letter, doc)


def parse_id(text: str) -> tuple[int, int]:
    """A letter id, ``P:O`` or ``O`` (partition 0), as (partition, offset)."""
    part, _, off = text.rpartition(":")
    try:
        partition, offset = int(part or 0), int(off)
    except ValueError:
        raise SubstreamsError(
            f"letter id {text!r}: expected PARTITION:OFFSET or OFFSET (as `list` shows it)"
        ) from None
    if partition < 0 or offset < 0:
        raise SubstreamsError(f"letter id {text!r}: partition and offset must be >= 0")
    return partition, offset


def named_substreams(stored: StoredLetter) -> tuple[str, ...]:
    """The substreams a letter concerns: its ``substream``/``substreams`` field when its
    writer gave one, else those its ``detail`` names (``substream 'NAME'``)."""
    doc = stored.fields
    if isinstance(doc.get("substreams"), list) and doc["substreams"]:
        return tuple(str(s) for s in doc["substreams"])
    if isinstance(doc.get("substream"), str):
        return (doc["substream"],)
    detail = stored.letter.detail if stored.letter is not None else ""
    return tuple(dict.fromkeys(_NAMED_SUBSTREAM.findall(detail)))


@dataclass(frozen=True)
class LetterFilter:
    """What ``list``/``replay`` select: every given criterion must hold (empty: any)."""

    reasons: frozenset[str] = frozenset()
    streams: frozenset[str] = frozenset()
    """The topic the record was read from (or was bound for): a stream's name."""
    substreams: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    """When the letter was written (its Kafka timestamp), ``since <= t < until``."""

    def matches(self, stored: StoredLetter) -> bool:
        if stored.is_marker:
            return False
        if self.since_ms is not None and stored.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and stored.timestamp_ms >= self.until_ms:
            return False
        letter = stored.letter
        if letter is None:  # unreadable: only an unfiltered listing shows it
            return not (self.reasons or self.streams or self.substreams)
        if self.reasons and letter.reason not in self.reasons:
            return False
        if self.streams and letter.topic not in self.streams:
            return False
        return not self.substreams or bool(self.substreams & set(named_substreams(stored)))


def record_identity(stored: StoredLetter) -> str:
    """What one record is, however many letters hold it (see the module)."""
    letter = stored.letter
    if letter is not None and letter.offset >= 0:
        return f"{letter.topic}[{letter.partition}]@{letter.offset}"
    return f"letter {stored.id}"


def replay_marker(stored: StoredLetter, identity: str, partition: int) -> bytes:
    """The marker a replay writes with the republished record (same transaction)."""
    assert stored.letter is not None
    return json.dumps({
        "service": REPLAY_SERVICE,
        "reason": REASON_REPLAYED,
        "topic": stored.letter.topic,
        "partition": partition,
        "offset": stored.letter.offset,
        "raw": "",
        "detail": f"letter {stored.id} ({identity}) republished to "
                  f"'{stored.letter.topic}'[{partition}]",
        "source": REPLAY_SOURCE,
        "replayed": identity,
        "letter": stored.id,
    }).encode()


def replayed_identities(letters: Iterable[StoredLetter]) -> dict[str, str]:
    """Record identity -> the id of the marker saying it was republished."""
    out: dict[str, str] = {}
    for stored in letters:
        if stored.is_marker and isinstance(stored.fields.get("replayed"), str):
            out.setdefault(stored.fields["replayed"], stored.id)
    return out


Outcome = Literal["replay", "replayed", "notified", "not_a_record", "no_payload", "duplicate",
                  "unknown_substream"]


@dataclass(frozen=True)
class Decision:
    """What a replay does with one letter, and the line that says so."""

    stored: StoredLetter
    outcome: Outcome
    message: str
    identity: str = ""
    payload: Mapping[str, Any] | None = None
    partition: int = 0
    substreams: tuple[str, ...] | None = None
    """The substreams to publish the record in (None: every one of its stream's): those a
    late record's letter names, the record being already in the others."""


Closed = Callable[[str, Time], bool]
"""(substream, time) -> whether that time was already notified."""


class Notified:
    """The times notified on substreams' control topics, as a :data:`Closed`: a time is
    closed when it is at or below a notified one (or inside a notified session) -- the
    acker's own rule for a late report (``SegmentTable``: at or below a terminated time).

    Times are compared as the control topic holds them: a hopping substream's are *panes*
    (the acker notifies panes; windows exist only in the firm readers,
    :mod:`substreams.control.panes`), and a record's time there is its pane too
    (:class:`~substreams.streams.times.TimeAssigner`), so a pane below a notified one --
    announced or empty -- is closed, and so is every window holding it."""

    def __init__(self) -> None:
        self._upper: dict[str, UpperAntichain] = {}

    def add(self, substream: str, time: Time, until: Time | None = None) -> None:
        upper = self._upper.setdefault(substream, UpperAntichain())
        upper.insert(until if until is not None else time)

    def __call__(self, substream: str, t: Time) -> bool:
        upper = self._upper.get(substream)
        return upper is not None and upper.covers(t)


def decide(
    config: Config,
    stored: StoredLetter,
    payload: Mapping[str, Any] | None,
    why_no_payload: str,
    replayed: Mapping[str, str],
    planned: set[str],
    closed: Closed,
) -> Decision:
    """The replay decision for one letter (``payload``: the record it holds, decoded or
    fixed by the user; ``planned``: identities already chosen in this run, updated).

    Which substreams the record goes to: those its letter names (``DeadLetter.substreams``,
    a late record's: it was kept out of those only and is on the stream, counted, in the
    others), else every one of its stream's (a record no reader could decode is in none).
    It is republished only when its time in every one of those is still open: one already
    notified cannot get it any more (the acker refuses a report for a terminated time), and
    publishing it for the others only would leave it half counted."""
    letter = stored.letter
    where = "?" if letter is None else f"'{letter.topic}'[{letter.partition}]@{letter.offset}"
    if letter is None or letter.topic not in {s.name for s in config.streams}:
        what = stored.error or f"read from '{letter.topic if letter else '?'}', not a stream"
        return Decision(stored, "not_a_record", f"not republished: {what}")
    identity = record_identity(stored)
    if identity in replayed:
        return Decision(stored, "replayed", f"already replayed (marker {replayed[identity]})",
                        identity)
    if identity in planned:
        return Decision(stored, "duplicate", f"{identity} is replayed once, by another letter",
                        identity)
    if payload is None:
        return Decision(stored, "no_payload",
                        f"{where}: {why_no_payload}; not republished (give a fixed payload "
                        "with --fixed)", identity)
    order_key = config.stream(letter.topic).order_key
    subs = config.substreams_of(letter.topic)
    only: tuple[str, ...] | None = None
    if letter.substreams:
        gone = [name for name in letter.substreams if name not in {s.name for s in subs}]
        if gone:
            return Decision(stored, "unknown_substream",
                            f"{where}: kept out of substream(s) "
                            f"{', '.join(map(repr, gone))}, which stream '{letter.topic}' no "
                            "longer has; not republished", identity)
        if len(set(letter.substreams)) < len(subs):
            only = tuple(s.name for s in subs if s.name in letter.substreams)
            subs = tuple(s for s in subs if s.name in letter.substreams)
    notified: list[str] = []
    for sub in subs:
        try:
            t = TimeAssigner(sub, order_key).raw_time_of(payload)
        except (KeyError, TypeError, ValueError) as exc:
            return Decision(stored, "no_payload",
                            f"{where}: payload has no time in substream '{sub.name}' "
                            f"({exc!r}); not republished", identity)
        if closed(sub.name, t):
            notified.append(f"substream '{sub.name}' {_what(sub, t)}")
    if notified:
        return Decision(stored, "notified",
                        f"{where}: {', '.join(notified)} already notified; not republished",
                        identity)
    partitions = config.stream(letter.topic).partitions
    partition = letter.partition if 0 <= letter.partition < partitions else 0
    planned.add(identity)
    into = "" if only is None else f" for substream(s) {', '.join(map(repr, only))} only"
    return Decision(stored, "replay", f"republish to '{letter.topic}'[{partition}]{into}",
                    identity, payload, partition, only)


def _what(sub: SubstreamConfig, t: Time) -> str:
    """A record's time as the line names it: a hopping substream's time is a pane (what
    the acker tracks and notifies, and what the check compares), held by the windows
    ``t - k + 1 .. t`` (docs/design.md, "Hopping windows")."""
    if sub.kind == "hopping" and isinstance(t, int):
        return f"pane {t} (windows {t - sub.panes_per_window + 1}..{t})"
    return f"time {_label(t)}"


def _label(t: Time) -> str:
    """A time as notifications label it (``5``, ``(1,2)``, ``user@5``)."""
    if isinstance(t, Keyed):
        return f"{t.key}@{_label(t.time)}"
    if isinstance(t, tuple):
        return "(" + ",".join(str(c) for c in t) + ")"
    return str(t)


def summary(decisions: Sequence[Decision]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in decisions:
        out[d.outcome] = out.get(d.outcome, 0) + 1
    return out
