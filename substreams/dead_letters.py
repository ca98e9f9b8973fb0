"""Dead letters read back: list them, decode one, replay the records they hold.

The rules (what a filter selects, a record's identity, what a replay does with each
letter) are in :mod:`substreams.streams.letters`; this module reads the dead-letter topic
and the control topics and publishes through :class:`~substreams.app.Application`.

Exactly once, for a replay killed at any moment and run again:

1. every replay publisher of the config's streams is fenced first (``init_transactions``
   with its transactional id aborts a killed replay's open transaction, which would also
   hold the dead-letter topic's last stable offset and hide what came after it);
2. the dead-letter topic is read whole (``read_committed``): the letters, and the
   *replayed* markers of the replays that committed;
3. each record not yet replayed, whose times are all still open, is published in one
   transaction with its marker (the record first: one the publisher refuses writes no
   marker).  A commit holds both or neither.

What is left to chance: a time that becomes notified between step 2's check and the
commit.  The acker then dead-letters the record's report (``terminated_time``): the record
is on the stream but in no notification, and says so in the dead-letter topic.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from substreams.app import Application
from substreams.config import Config
from substreams.control.io import read_control
from substreams.control.messages import completions
from substreams.control.writers import WriterCheck
from substreams.errors import ProtocolError, PublisherFencedError, SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.read import Reader
from substreams.streams.letters import (
    REPLAY_SOURCE,
    Decision,
    Notified,
    StoredLetter,
    decide,
    parse_stored,
    replay_marker,
    replayed_identities,
)
from substreams.streams.listener import StreamDecoder
from substreams.streams.publisher import transactional_id
from substreams.streams.schemas import is_punctuation

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
PROGRESS_EVERY_S = 2.0
"""How often a long read or replay says how far it got."""


def _quiet(line: str) -> None:
    pass


# --- reading ----------------------------------------------------------------------------


def read_letters(
    config: Config,
    bootstrap: str | None = None,
    *,
    since_ms: int | None = None,
    progress: Progress = _quiet,
    timeout: float = 30.0,
) -> Iterator[StoredLetter]:
    """Every message of the dead-letter topic, in order (per partition), from ``since_ms``
    (a Kafka timestamp: the first letter written at or after it) or the start."""
    boot = client.resolve_bootstrap(config, bootstrap)
    topic = config.acker.dead_letter_topic
    with Reader(boot, config, name=f"dead-letter topic '{topic}'") as reader:
        partitions = _partitions(reader, topic)
        ends = {p: reader.watermarks(topic, p)[1] for p in partitions}
        starts = {p: 0 for p in partitions}
        if since_ms is not None:
            asked = [TopicPartition(topic, p, since_ms) for p in partitions]
            for tp in reader.consumer.offsets_for_times(asked, 10):
                starts[tp.partition] = tp.offset if tp.offset >= 0 else ends[tp.partition]
        reader.assign([TopicPartition(topic, p, starts[p]) for p in partitions])
        total = sum(max(0, ends[p] - starts[p]) for p in partitions)
        said = time.monotonic()
        for seen, msg in enumerate(reader.iter_to_end(timeout), 1):
            if time.monotonic() - said >= PROGRESS_EVERY_S:
                said = time.monotonic()
                progress(f"read {seen} of ~{total} messages of '{topic}'")
            _, stamp = msg.timestamp()
            yield parse_stored(msg.partition() or 0, msg.offset() or 0, stamp, msg.key(),
                               msg.value())


def _partitions(reader: Reader, topic: str) -> list[int]:
    meta = reader.consumer.list_topics(topic, timeout=10)
    found = meta.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise SubstreamsError(
            f"dead-letter topic '{topic}' does not exist (run `substreams topics create`)"
        )
    return sorted(found.partitions)


def find_letter(
    config: Config, partition: int, offset: int, bootstrap: str | None = None
) -> StoredLetter:
    """The letter at ``partition:offset`` of the dead-letter topic, or an error naming the
    topic, the partition and the offsets it holds."""
    boot = client.resolve_bootstrap(config, bootstrap)
    topic = config.acker.dead_letter_topic
    with Reader(boot, config, name=f"dead-letter topic '{topic}'") as reader:
        if partition not in _partitions(reader, topic):
            raise SubstreamsError(f"dead-letter topic '{topic}' has no partition {partition}")
        low, high = reader.watermarks(topic, partition)
        if not low <= offset < high:
            raise SubstreamsError(
                f"no dead letter at '{topic}'[{partition}]@{offset}: the partition holds "
                f"offsets {low}..{high - 1}" if high > low else
                f"no dead letter at '{topic}'[{partition}]@{offset}: the partition is empty"
            )
        reader.assign([TopicPartition(topic, partition, offset)])
        for msg in reader.iter_to_end(10.0):
            if msg.offset() == offset:
                _, stamp = msg.timestamp()
                return parse_stored(partition, offset, stamp, msg.key(), msg.value())
            break
    raise SubstreamsError(
        f"no dead letter at '{topic}'[{partition}]@{offset} (a transaction marker, or a "
        "letter of a transaction that did not commit)"
    )


# --- decoding ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    """What a letter's ``raw`` bytes are: ``kind`` one of ``record`` (a data record of the
    stream, decoded with its writer schema), ``punctuation``, ``json`` (a payload as JSON:
    what a publisher's late record holds), ``protocol`` (an acker message),
    ``replay_marker`` (no letter: a replay's record of what it republished) or ``raw``
    (undecodable: ``error`` says why)."""

    kind: str
    value: Mapping[str, Any] | None = None
    error: str = ""

    @property
    def payload(self) -> Mapping[str, Any] | None:
        """The stream payload it holds, if any."""
        if self.kind == "record" and self.value is not None:
            inner = self.value.get("payload")
            return inner if isinstance(inner, Mapping) else None
        if self.kind == "json":
            return self.value
        return None


class LetterDecoder:
    """Decodes letters' raw bytes, with one stream decoder per stream (the stream's schema
    and every earlier writer schema in the schema registry topic)."""

    def __init__(self, config: Config, bootstrap: str | None = None) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self._streams: dict[str, StreamDecoder] = {}
        self._names = {s.name for s in config.streams}

    def decode(self, stored: StoredLetter) -> Decoded:
        letter = stored.letter
        if letter is None:
            return Decoded("raw", error=stored.error)
        if stored.is_marker:  # replay history: which record, replayed from which letter
            return Decoded("replay_marker", {k: stored.fields.get(k)
                                             for k in ("replayed", "letter", "detail")})
        raw = letter.raw
        if letter.topic in self._names:
            return self._stream_record(letter.topic, raw)
        if letter.topic == self.config.acker.acks_topic:
            return self._protocol(raw)
        return _as_json(raw) or Decoded("raw", error=f"'{letter.topic}' is not a stream")

    def _stream_record(self, stream: str, raw: bytes) -> Decoded:
        decoder = self._streams.get(stream)
        if decoder is None:
            decoder = self._streams[stream] = StreamDecoder(self.config, stream, self.bootstrap)
        if is_punctuation(raw):
            try:
                return Decoded("punctuation", decoder.punct.decode_single(raw))
            except SubstreamsError as exc:
                return Decoded("raw", error=str(exc))
        try:
            rec = decoder.codec.decode_single(raw)
        except SubstreamsError as exc:
            return _as_json(raw) or Decoded("raw", error=str(exc))
        return Decoded("record", rec)

    @staticmethod
    def _protocol(raw: bytes) -> Decoded:
        from substreams.acker.protocol import decode_ack

        try:
            msg = decode_ack(raw, None)
        except (SubstreamsError, ValueError, KeyError, TypeError) as exc:
            return Decoded("raw", error=f"not an acker message: {exc}")
        return Decoded("protocol", {"message": repr(msg)})


def _as_json(raw: bytes) -> Decoded | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return Decoded("json", value) if isinstance(value, dict) else None


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it (bytes as base64, times in their wire form)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def letter_json(stored: StoredLetter, decoded: Decoded | None = None,
                replayed: str | None = None) -> dict[str, Any]:
    """One letter as a JSON document: where it is, what it says, and (``show``) what its
    raw bytes decode to."""
    out: dict[str, Any] = {
        "id": stored.id,
        "written_ms": stored.timestamp_ms,
        **plain(dict(stored.fields)),
    }
    if stored.letter is None:
        out["error"] = stored.error
    if replayed is not None:
        out["replayed_by"] = replayed
    if decoded is not None:
        out["decoded"] = {"kind": decoded.kind, "value": plain(decoded.value),
                          **({"error": decoded.error} if decoded.error else {})}
    return out


# --- filters from the command line -----------------------------------------------------

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_when(text: str, now_ms: int | None = None) -> int:
    """A point in time as epoch ms: ``1700000000000`` (ms), an ISO-8601 date/time (local
    time unless it names a zone), or a duration ago (``90s``, ``15m``, ``2h``, ``7d``)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    text = text.strip()
    ago = _AGO.match(text)
    if ago:
        return now - int(float(ago.group(1)) * _UNIT_MS[ago.group(2)])
    if text.isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise SubstreamsError(
            f"time {text!r}: expected epoch milliseconds, an ISO date/time "
            "(2025-01-31T12:00) or a duration ago (90s, 15m, 2h, 7d)"
        ) from None
    return int(when.timestamp() * 1000)


# --- replay -----------------------------------------------------------------------------


def closed_times(config: Config, substreams: Sequence[str],
                 bootstrap: str | None = None) -> Callable[[str, Time], bool]:
    """Whether a time of a substream was already notified (:class:`Notified`), from each
    substream's control topic read whole."""
    boot = client.resolve_bootstrap(config, bootstrap)
    done = Notified()
    trusted = WriterCheck.of(config)
    for name in substreams:
        topic = config.acker.control_topic(name)
        try:
            records = read_control(boot, topic, config)
        except ProtocolError as exc:
            raise SubstreamsError(f"substream '{name}': {exc}") from exc
        for offset, rec in records:
            if not trusted.admits(topic, rec):  # a foreign notification closes nothing
                log.warning("control topic '%s' offset %d: record of writer '%s' refused: "
                            "only %s may write this topic", topic, offset, rec.writer,
                            trusted.trusted(topic))
                continue
            for note in completions(rec.body):
                done.add(name, note.time, note.until)
    return done


def fence_replays(config: Config, bootstrap: str | None = None) -> None:
    """Abort a killed replay's open transaction, stream by stream (see the module)."""
    boot = client.resolve_bootstrap(config, bootstrap)
    for stream in config.streams:
        producer = client.producer(
            boot, config, transactional_id=transactional_id(stream.name, REPLAY_SOURCE)
        )
        try:
            producer.init_transactions(30)
        except KafkaException as exc:
            raise SubstreamsError(
                f"stream '{stream.name}': could not fence an earlier replay: {exc.args[0]}"
            ) from exc
        finally:
            producer.flush(1)


def plan_replay(
    config: Config,
    letters: Sequence[StoredLetter],
    chosen: Sequence[StoredLetter],
    fixed: Mapping[str, Mapping[str, Any]],
    bootstrap: str | None = None,
) -> list[Decision]:
    """The decision for each letter of ``chosen`` (``letters``: the whole topic, for its
    markers; ``fixed``: replacement payloads by letter id)."""
    replayed = replayed_identities(letters)
    decoder = LetterDecoder(config, bootstrap)
    streams = {s.letter.topic for s in chosen if s.letter is not None}
    names = [sub.name for st in config.streams if st.name in streams
             for sub in config.substreams_of(st.name)]
    closed = closed_times(config, names, bootstrap)
    planned: set[str] = set()
    out = []
    for stored in chosen:
        payload: Mapping[str, Any] | None = fixed.get(stored.id)
        why = ""
        if payload is None:
            decoded = decoder.decode(stored)
            payload = decoded.payload
            why = decoded.error or f"its raw bytes hold a {decoded.kind}, not a payload"
        out.append(decide(config, stored, payload, why, replayed, planned, closed))
    return out


def replay(
    config: Config,
    decisions: Sequence[Decision],
    *,
    bootstrap: str | None = None,
    commit_every: int = 500,
    progress: Progress = _quiet,
    report: Callable[[Decision, str, str], None] = lambda d, outcome, line: None,
) -> int:
    """Publish the records of the ``replay`` decisions, each with its marker, stream by
    stream; ``report`` gets each decision with its final outcome (the decision's, or
    ``republished`` once committed, ``refused`` when the publisher refused the payload)
    and line.  Returns how many were republished."""
    app = Application(config, bootstrap)
    topic = config.acker.dead_letter_topic
    todo: dict[str, list[Decision]] = {}
    for d in decisions:
        if d.outcome == "replay":
            assert d.stored.letter is not None
            todo.setdefault(d.stored.letter.topic, []).append(d)
        else:
            report(d, d.outcome, d.message)
    total = sum(len(v) for v in todo.values())
    done, said = 0, time.monotonic()
    for stream, chosen in todo.items():
        manual = {s.name: None for s in config.substreams_of(stream)}
        pub = app.publisher(stream, REPLAY_SOURCE, batch_size=commit_every + 1,
                            seal_policies=manual)
        try:
            chosen = sorted(chosen, key=lambda d: _order_key(config, stream, d))
            uncommitted: list[tuple[Decision, str]] = []
            for d in chosen:
                assert d.payload is not None
                try:
                    pub.publish(d.payload, key=d.stored.key, partition=d.partition,
                                check_order=False, substreams=d.substreams)
                except PublisherFencedError:
                    raise
                except SubstreamsError as exc:
                    report(d, "refused", f"not republished: {exc}")
                    continue
                pub.produce_aside(topic, replay_marker(d.stored, d.identity, d.partition),
                                  key=d.identity.encode())
                into = "" if d.substreams is None else \
                    f" for substream(s) {', '.join(map(repr, d.substreams))} only"
                uncommitted.append((d, f"republished to '{stream}'[{d.partition}]{into}"))
                if len(uncommitted) >= commit_every:
                    pub.flush()
                    done += _reported(uncommitted, report)
                    progress(f"replay: committed {done} of {total}")
                    said = time.monotonic()
                elif time.monotonic() - said >= PROGRESS_EVERY_S:
                    said = time.monotonic()
                    progress(f"replay: {done + len(uncommitted)} of {total} written")
            pub.close()
            done += _reported(uncommitted, report)
            progress(f"replay: committed {done} of {total}")
        except BaseException:
            pub.abort()
            raise
    return done


def _reported(
    batch: list[tuple[Decision, str]], report: Callable[[Decision, str, str], None]
) -> int:
    for d, line in batch:
        report(d, "republished", line)
    n = len(batch)
    batch.clear()
    return n


def _order_key(config: Config, stream: str, d: Decision) -> int:
    try:
        field = config.stream(stream).order_key
        return 0 if field is None else int((d.payload or {})[field])
    except (KeyError, TypeError, ValueError):
        return 0


def load_fixed(path: str) -> dict[str, Mapping[str, Any]]:
    """Replacement payloads: a JSON-lines file of ``{"id": "P:O", "payload": {...}}`` (what
    ``show --json`` prints has both: edit its ``decoded.value.payload`` or the payload)."""
    out: dict[str, Mapping[str, Any]] = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                ident, payload = str(doc["id"]), doc["payload"]
            except (ValueError, KeyError, TypeError) as exc:
                raise SubstreamsError(
                    f"{path}:{n}: expected {{\"id\": \"P:O\", \"payload\": {{...}}}}: {exc}"
                ) from exc
            if not isinstance(payload, dict):
                raise SubstreamsError(f"{path}:{n}: payload must be a JSON object")
            out[ident] = payload
    return out
