"""The acker's state as a store with a changelog: each transaction writes what changed.

Why: the acker used to write its whole state (:meth:`AckerState.dumps`) in every transaction,
so a transaction cost O(state) and one record passed Kafka's ~1 MB limit at ~50k open keyed
times.  Now (Kafka Streams' model: a store and a changelog topic; snapshots as in ARIES'
fuzzy checkpoints) the acker's checkpoint topic holds, per committed transaction ``seq``:

* a **delta** -- the *head* (everything small: sessions, sources' keyed seals, counters,
  the command handler's document, each table's and tracker's scalars) and the *entries* that
  changed: an open time's entry (or its removal), a chain class of the terminated times, of a
  source's seals, of a tracker's upper frontier.  Split into records of at most
  :data:`RECORD_BYTES`, all in the transaction (so a delta applies whole or not at all);
* now and then a **snapshot** of every entry, written a chunk or a few per transaction while
  deltas go on.  A snapshot started at ``seq = s`` is *fuzzy*: a chunk holds the entries'
  values when it was written, not at ``s``.  That is enough, because every change after
  ``s`` is in a delta after ``s``, and a delta entry is the entry's whole value (last writer
  wins): snapshot, then the deltas after ``s`` in order, is the state.

Every record names the latest *complete* snapshot (``base``); recovery reads the latest
record of the acker, finds the first chunk of its ``base`` (backwards, by the records' small
uncompressed headers), and reads forwards from there: the chunks of that snapshot, then the
deltas after it.  What a restart reads is bounded by when snapshots are taken: once the
deltas since the last snapshot outweigh it (:data:`SNAPSHOT_MIN_BYTES` at least).

Invariants, checked by the property tests (``tests/unit/test_changelog.py``): restoring from
the records of any prefix of committed transactions gives the state as of the last of them;
no record's encoded state exceeds :data:`RECORD_BYTES`; a record's ``base`` snapshot is
complete in the records before it (or in its own transaction).

Derived parts are not written: a tracker's active times are its table's open times (the
acker activates a time when its table opens it and retires it when the table closes it);
the lower frontiers and every index are rebuilt from them on restore.

Pure: bytes in, bytes out; the service does the Kafka I/O.
"""

from __future__ import annotations

import gc
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from substreams.acker.state import AckerState
from substreams.acker.table import OpenEntry, RunEntry, SegmentTable, open_entry
from substreams.control.progress import ProgressTracker
from substreams.errors import ProtocolError
from substreams.frontier import Keyed, Time, UpperAntichain
from substreams.frontier.antichain import ChainClass

MAGIC = b"SSCL4\n"
"""How a changelog record's state bytes begin (a v3 checkpoint is plain zlib)."""

RECORD_BYTES = 200_000
"""The most a record's state bytes may hold (compressed): under the 256 KB the acker
promises for any record it writes, with room for the control record's own fields."""

SNAPSHOT_MIN_BYTES = 4 << 20
"""Deltas written since the last snapshot before another is started (at least; or as many
as the last snapshot's size, so that a restart reads at most about twice the state)."""

SMALL_ENTRIES = 1_000
"""A state of at most this many entries (~60 KB of JSON, one record) is written whole in
every transaction, as a snapshot: recovery reads one transaction's records, as it did when
every checkpoint was the whole state, and a size retention that keeps only the newest
records of the checkpoint topic never takes what a restart needs."""

CHUNKS_PER_COMMIT = 1
"""Snapshot chunks written with each transaction while a snapshot is under way: a snapshot
of S bytes takes about S / RECORD_BYTES transactions, and no step encodes more than one
chunk's worth (~0.1 s)."""

_RAW_PER_RECORD = 4
"""Encoded JSON gathered into one record before compression, per byte of the record bound
(JSON of entries compresses ~4-8x; a record that still comes out too large is halved)."""

EntryKey = tuple[Any, ...]
"""("o", substream, time) an open time's entry; ("t", substream, class) a chain class of
the terminated times; ("s", substream, source, class) of a source's seals; ("u", substream,
class) of a tracker's upper frontier."""


# -- compact times (the checkpoint's own form: shorter than the wire form) ------------------


def time_out(t: Time) -> Any:
    """``5`` -> 5, ``(1, 2)`` -> [1, 2], ``Keyed(k, 5)`` -> [k, 5], ``Keyed(k, (1, 2))`` ->
    [k, [1, 2]]: unambiguous, since a tuple's coordinates are ints and a key is a string."""
    if type(t) is int:
        return t
    if type(t) is tuple:
        return list(t)
    if type(t) is Keyed:
        inner = t.time
        return [t.key, inner if type(inner) is int else list(inner)]  # type: ignore[arg-type]
    raise TypeError(f"not a logical time: {t!r}")


def time_in(v: Any) -> Time:
    """The inverse of :func:`time_out`."""
    if type(v) is int:
        return v
    if type(v) is list:
        if v and type(v[0]) is str:
            inner = v[1]
            return Keyed(v[0], inner if type(inner) is int else tuple(inner))
        return tuple(v)
    raise ProtocolError(f"acker checkpoint: {v!r} is not a time")


def _class_out(c: ChainClass) -> list[Any]:
    return [c[0], c[1]]


def _class_in(v: Any) -> ChainClass:
    return (v[0], int(v[1]))


# -- the entries of a state -----------------------------------------------------------------


def _entry_value(e: OpenEntry) -> list[Any]:
    """An open entry's value; a session run's (:class:`RunEntry`) ends with its last time."""
    value = [e.xor, e.records, e.reports,
             [[s, p, lo, hi] for (s, p), (lo, hi) in e.ranges.items()],
             e.first_seen_ms, e.sealed_at_ms]
    if type(e) is RunEntry:
        value.append(e.last)
    return value


def _encode(key: EntryKey, state: AckerState) -> list[Any]:
    """Entry ``key`` as it is now in ``state``: ``[kind, substream, ..., value]``, the value
    None when the entry no longer exists (a removal)."""
    kind, sub = key[0], key[1]
    if kind == "o":
        table = state.tables.get(sub)
        e = None if table is None else table.open.get(key[2])
        return ["o", sub, time_out(key[2]), None if e is None else _entry_value(e)]
    if kind == "t":
        table = state.tables.get(sub)
        els = () if table is None else table.terminated.of_class(key[2])
        return ["t", sub, _class_out(key[2]), [time_out(t) for t in els] or None]
    if kind == "s":
        table = state.tables.get(sub)
        src = None if table is None else table.sources.get(key[2])
        els = () if src is None else src.seals.of_class(key[3])
        value = [[time_out(t), src.seal_ms.get(t, 0)] for t in els] if src else []
        return ["s", sub, key[2], _class_out(key[3]), value or None]
    tracker = state.trackers.get(sub)
    els = () if tracker is None else tracker.upper.of_class(key[2])
    return ["u", sub, _class_out(key[2]), [time_out(t) for t in els] or None]


class _Keys:
    """Every entry of a state at one moment, held as its containers' key lists (copied at C
    speed: a snapshot of a million sessions starts in milliseconds) and made into entry
    keys only as chunks read them."""

    def __init__(self, state: AckerState) -> None:
        self.segments: list[tuple[tuple[Any, ...], list[Any]]] = []
        for sub, table in state.tables.items():
            self.segments.append((("o", sub), list(table.open)))
            self.segments.append((("t", sub), table.terminated.classes()))
            for name, src in table.sources.items():
                self.segments.append((("s", sub, name), src.seals.classes()))
        for sub, tracker in state.trackers.items():
            self.segments.append((("u", sub), tracker.upper.classes()))
        self.total = sum(len(items) for _, items in self.segments)
        self._seg = self._pos = 0

    def __len__(self) -> int:
        return self.total

    def take(self, n: int) -> list[EntryKey]:
        """The next ``n`` entry keys (fewer at the end)."""
        out: list[EntryKey] = []
        while len(out) < n and self._seg < len(self.segments):
            prefix, items = self.segments[self._seg]
            part = items[self._pos:self._pos + n - len(out)]
            out.extend((*prefix, x) for x in part)
            self._pos += len(part)
            if self._pos >= len(items):
                self._seg, self._pos = self._seg + 1, 0
        return out

    def peek(self, n: int) -> list[EntryKey]:
        """The next ``n`` entry keys, not taken."""
        seg, pos = self._seg, self._pos
        out = self.take(n)
        self._seg, self._pos = seg, pos
        return out


def all_keys(state: AckerState) -> list[EntryKey]:
    """Every entry of ``state``, now (the same enumeration as :class:`_Keys`, taken whole)."""
    keys = _Keys(state)
    return keys.take(len(keys))


def _head(state: AckerState) -> dict[str, Any]:
    """Everything of ``state`` that is not an entry (small: no open time, key or seal)."""
    return state.head_doc()


# -- records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """A record's uncompressed prefix: enough to find a snapshot without decompressing."""

    kind: str
    """"delta" or "snap"."""
    seq: int
    """The transaction (the state's checkpoint counter) that wrote it."""
    base: int | None
    """The latest complete snapshot when it was written (its ``snap``), None: none yet."""
    snap: int | None = None
    """For a chunk: the snapshot it belongs to (the seq that started it)."""
    part: int = 0
    """Its place among its delta's records, or in its snapshot's chunks."""
    last: bool = True
    """The last record of its delta, or its snapshot's last chunk."""

    def encode(self) -> bytes:
        return json.dumps([self.kind, self.seq, self.base, self.snap, self.part, self.last],
                          separators=(",", ":")).encode()


def is_changelog(data: bytes) -> bool:
    return data.startswith(MAGIC)


def read_header(data: bytes) -> Header:
    """The header of a changelog record's state bytes (ProtocolError if it is not one)."""
    if not data.startswith(MAGIC):
        raise ProtocolError("acker checkpoint is not a changelog record")
    end = data.find(b"\n", len(MAGIC))
    try:
        kind, seq, base, snap, part, last = json.loads(data[len(MAGIC):end])
        return Header(str(kind), int(seq), base, snap, int(part), bool(last))
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"acker checkpoint header is malformed: {exc}") from exc


def _body(data: bytes) -> dict[str, Any]:
    end = data.find(b"\n", len(MAGIC))
    try:
        doc = json.loads(zlib.decompress(data[end + 1:]))
    except (zlib.error, ValueError) as exc:
        raise ProtocolError(f"acker checkpoint is not readable: {exc}") from exc
    if not isinstance(doc, dict):
        raise ProtocolError("acker checkpoint body is not a JSON object")
    return doc


def _compress(body: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 1)


def _pack(header: Header, body: bytes) -> bytes:
    return MAGIC + header.encode() + b"\n" + body


_HEADER_ROOM = 200
"""Bytes kept for a record's magic and header next to its compressed body."""


def _per_run(entries: Sequence[list[Any]], raw: int) -> int:
    """How many of ``entries`` make about ``raw`` bytes of JSON, judged from a sample (not
    by encoding each: that doubled the cost of writing them)."""
    sample = entries[:64]
    if not sample:
        return 1
    avg = len(json.dumps(sample, separators=(",", ":"))) / len(sample)
    return max(1, int(raw / max(avg, 1.0)))


def _split(entries: Sequence[list[Any]], raw: int) -> Iterator[list[list[Any]]]:
    """``entries`` in runs whose JSON is about ``raw`` bytes (a run that compresses over
    the record bound is halved by :func:`_bodies`)."""
    per = _per_run(entries, raw)
    for at in range(0, len(entries), per):
        yield list(entries[at:at + per])


def _bodies(
    entries: list[list[Any]], body: Callable[[list[list[Any]], int], dict[str, Any]],
    limit: int,
) -> list[bytes]:
    """The compressed bodies of ``entries`` (``body(run, i)``: the i-th record's document),
    each within ``limit`` with its header: a run that comes out too large is halved until
    it fits (at least one body, possibly of no entry)."""
    out: list[bytes] = []
    todo = list(_split(entries, _RAW_PER_RECORD * limit)) or [[]]
    while todo:
        run = todo.pop(0)
        data = _compress(body(run, len(out)))
        if len(data) + _HEADER_ROOM > limit:
            if len(run) > 1:
                half = len(run) // 2
                todo[:0] = [run[:half], run[half:]]
                continue
            raise ProtocolError(
                f"acker checkpoint: one entry encodes to {len(data)} bytes, over the "
                f"{limit}-byte record bound (a key or a range list that large is a "
                "design error)"
            )
        out.append(data)
    return out


# -- the writer -----------------------------------------------------------------------------


@dataclass
class _Snapshot:
    seq: int
    keys: _Keys
    at: int = 0
    part: int = 0
    size: int = 0
    per: int | None = None
    """Entries a chunk takes (judged from the first ones)."""


@dataclass
class StateLog:
    """What the acker writes to its checkpoint topic with each transaction.

    ``base``: the latest complete snapshot the records already committed name (None for a
    state that has none: the next commit writes a whole one in its own transaction -- a new
    acker, one taken over from other shards, one restored from a version-3 checkpoint)."""

    state: AckerState
    base: int | None = None
    record_bytes: int = RECORD_BYTES
    snapshot_min_bytes: int = SNAPSHOT_MIN_BYTES
    chunks_per_commit: int = CHUNKS_PER_COMMIT
    small_entries: int = SMALL_ENTRIES
    _snap: _Snapshot | None = None
    _since: int = 0
    _last_size: int = 0
    _pending_base: int | None = None
    _seen_tables: dict[str, SegmentTable] = field(default_factory=dict)
    _seen_trackers: dict[str, ProgressTracker] = field(default_factory=dict)
    _seen_antichains: dict[tuple[Any, ...], UpperAntichain] = field(default_factory=dict)
    _full: bool = True
    """The next drain writes every entry (a new state object, or the first commit)."""

    @classmethod
    def adopt(cls, state: AckerState, base: int | None) -> StateLog:
        """The log of a ``state`` restored from committed records naming snapshot ``base``:
        only what changes from now on is written (a state with no base gets a snapshot at
        its first commit, whatever this says)."""
        log = cls(state, base)
        if base is not None:
            log._drain_all(collect=False)  # tracking on everywhere; nothing written for it
        return log

    def records(self) -> list[bytes]:
        """The state bytes of the checkpoint records for the transaction about to commit,
        whose seq is ``state.checkpoints`` (the caller increments it first): the snapshot
        chunks due, then the delta (last: the record recovery starts from names the base)."""
        state = self.state
        seq = state.checkpoints
        if (self.base is None and self._snap is None) or self._small():
            # No snapshot yet, or a state that fits in a record or two: this transaction
            # writes a whole snapshot (any fuzzy one under way is dropped) and an empty
            # delta; recovery then reads this transaction's records alone.
            self._drain()
            self._snap = _Snapshot(seq, _Keys(state))
            chunks = self._chunks(limit=None)
            return [*chunks, *self._delta(seq, [], base=self._pending_base)]
        changed = self._drain()
        if self._snap is None and self._since >= max(self.snapshot_min_bytes, self._last_size):
            self._snap = _Snapshot(seq, _Keys(state))
        chunks = [] if self._snap is None else self._chunks(limit=self.chunks_per_commit)
        base = self.base if self._pending_base is None else self._pending_base
        return [*chunks, *self._delta(seq, changed, base=base)]

    def _small(self) -> bool:
        """Whether the state has at most :data:`SMALL_ENTRIES` entries (counted from the
        containers' lengths: no walk)."""
        n = 0
        for table in self.state.tables.values():
            n += len(table.open) + len(table.terminated)
            n += sum(len(src.seals) for src in table.sources.values())
        n += sum(len(t.upper) for t in self.state.trackers.values())
        return n <= self.small_entries

    def committed(self) -> None:
        """The transaction of the last :meth:`records` committed."""
        if self._pending_base is not None:
            self.base = self._pending_base
            self._pending_base = None

    # -- the delta ----------------------------------------------------------------------

    def _delta(self, seq: int, keys: list[EntryKey], base: int | None) -> list[bytes]:
        state = self.state
        entries = [_encode(k, state) for k in keys]
        head = _head(state)
        bodies = _bodies(
            entries, lambda run, i: {"head": head if i == 0 else None, "entries": run},
            self.record_bytes,
        )
        out = [
            _pack(Header("delta", seq, base, None, i, i == len(bodies) - 1), b)
            for i, b in enumerate(bodies)
        ]
        self._since += sum(len(b) for b in out)
        return out

    def _drain(self) -> list[EntryKey]:
        """The entries that changed since the last drain (all of a replaced table, tracker
        or antichain: an object not seen before is written whole)."""
        if self._full:
            return self._drain_all()
        state = self.state
        keys: list[EntryKey] = []
        for sub, table in state.tables.items():
            if self._seen_tables.get(sub) is not table:
                keys.extend(self._adopt_table(sub, table))
                continue
            touched = table.touched
            assert touched is not None
            keys.extend(("o", sub, t) for t in touched)
            touched.clear()
            keys.extend(self._antichain_changes(("t", sub), table.terminated))
            for name, src in table.sources.items():
                keys.extend(self._antichain_changes(("s", sub, name), src.seals))
        for sub, tracker in state.trackers.items():
            if self._seen_trackers.get(sub) is not tracker:
                self._seen_trackers[sub] = tracker
            keys.extend(self._antichain_changes(("u", sub), tracker.upper))
        return keys

    def _drain_all(self, collect: bool = True) -> list[EntryKey]:
        """Every entry (``collect``), and tracking switched on everywhere."""
        self._full = False
        state = self.state
        self._seen_antichains = {}
        for sub, table in state.tables.items():
            self._adopt_table(sub, table, collect=False)
        for sub, tracker in state.trackers.items():
            self._seen_trackers[sub] = tracker
            self._antichain_changes(("u", sub), tracker.upper)
        return all_keys(state) if collect else []

    def _adopt_table(self, sub: str, table: SegmentTable, collect: bool = True
                     ) -> list[EntryKey]:
        """Start tracking ``table``; every entry it has (and had: the replaced one's), if
        ``collect``."""
        old = self._seen_tables.get(sub)
        self._seen_tables[sub] = table
        table.track_open()
        assert table.touched is not None
        table.touched.clear()
        keys: list[EntryKey] = [("o", sub, t) for t in table.open] if collect else []
        if old is not None and old is not table:
            keys.extend(("o", sub, t) for t in old.open if t not in table.open)
        keys.extend(self._antichain_changes(("t", sub), table.terminated))
        for name, src in table.sources.items():
            keys.extend(self._antichain_changes(("s", sub, name), src.seals))
        return keys

    def _antichain_changes(self, where: tuple[Any, ...], chain: UpperAntichain) -> list[EntryKey]:
        """The changed classes of the antichain at ``where``; all of its classes (and of
        the one it replaced) when it is not the one seen last."""
        seen = self._seen_antichains.get(where)
        if seen is chain:
            return [(*where, c) for c in chain.drain_touched()]
        classes = set(chain.classes())
        if seen is not None:
            classes.update(seen.classes())
            if seen._touched is not None:
                classes.update(seen.drain_touched())
        self._seen_antichains[where] = chain
        chain.track()
        chain.drain_touched()
        return [(*where, c) for c in classes]

    # -- snapshots ----------------------------------------------------------------------

    def _chunks(self, limit: int | None) -> list[bytes]:
        """The next chunks of the snapshot under way (``limit`` None: all of it)."""
        snap = self._snap
        assert snap is not None
        state = self.state
        out: list[bytes] = []
        while snap.at < len(snap.keys) and (limit is None or len(out) < limit):
            if snap.per is None:
                sample = [_encode(k, state) for k in snap.keys.peek(64)]
                snap.per = _per_run(sample, _RAW_PER_RECORD * self.record_bytes)
            keys = snap.keys.take(snap.per)
            snap.at += len(keys)
            # an entry gone since the snapshot started is left out: a delta after it says so
            run = [e for k in keys if (e := _encode(k, state))[-1] is not None]
            if run:
                out.extend(self._chunk_records(snap, run))
        if snap.at >= len(snap.keys):
            # the last chunk (possibly an empty one, for a state without entries)
            out.extend(self._chunk_records(snap, [], last=True))
            self._last_size = snap.size
            self._since = 0
            self._pending_base = snap.seq
            self._snap = None
        return out

    def _chunk_records(self, snap: _Snapshot, run: list[list[Any]], last: bool = False
                       ) -> list[bytes]:
        seq = self.state.checkpoints
        bodies = _bodies(run, lambda r, i: {"entries": r}, self.record_bytes)
        out: list[bytes] = []
        for i, b in enumerate(bodies):
            is_last = last and i == len(bodies) - 1
            out.append(_pack(Header("snap", seq, self.base, snap.seq, snap.part, is_last), b))
            snap.part += 1
        snap.size += sum(len(b) for b in out)
        return out


# -- restore --------------------------------------------------------------------------------


def base_of(data: bytes) -> int | None:
    """The snapshot a reader of the changelog starts from, named by its latest record (a
    delta: the last record of every transaction)."""
    return read_header(data).base


def is_first_chunk(data: bytes, snap: int) -> bool:
    """Whether ``data`` is the first chunk of snapshot ``snap`` (recovery reads from it)."""
    if not is_changelog(data):
        return False
    h = read_header(data)
    return h.kind == "snap" and h.snap == snap and h.part == 0


class ChangelogView:
    """A changelog read in topic order from the first chunk of a snapshot: every record,
    chunk or delta, applied as it comes (a chunk's values are as new as the deltas before
    it, so chunks of a later snapshot may be applied too: module doc).  What a restart
    restores from, and what the dashboard follows."""

    def __init__(self, snapshot_every: int) -> None:
        self.snapshot_every = snapshot_every
        self.entries: dict[EntryKey, Any] = {}
        self.head: dict[str, Any] | None = None
        self.complete: set[int] = set()
        """The snapshots whose every chunk was read."""
        self.started: set[int] = set()
        """The snapshots whose first chunk was read."""
        self.last: Header | None = None

    def feed(self, data: bytes) -> Header:
        """Apply one record's state bytes."""
        h = read_header(data)
        body = _body(data)
        if h.kind == "snap":
            assert h.snap is not None
            if h.part == 0:
                self.started.add(h.snap)
            if h.last and h.snap in self.started:
                self.complete.add(h.snap)
        elif body.get("head") is not None:
            self.head = body["head"]
        for e in body["entries"]:
            _put(self.entries, e)
        self.last = h
        return h

    def ready(self) -> bool:
        """A state can be built: a delta was read after a snapshot read whole, the one the
        last delta names."""
        last = self.last
        return (last is not None and last.kind == "delta" and last.base in self.complete
                and self.head is not None)

    def state(self, acks_offsets: dict[int, int]) -> AckerState:
        """The state as of the last delta read (:meth:`ready` must hold)."""
        if not self.ready():
            last = self.last
            raise ProtocolError(
                "acker checkpoint: the changelog read does not end with a delta after a "
                f"complete snapshot (last record: {last}, complete: {sorted(self.complete)})"
            )
        assert self.head is not None
        return _build(self.head, self.entries, acks_offsets, self.snapshot_every)


def restore(
    records: Iterable[bytes], acks_offsets: dict[int, int], snapshot_every: int
) -> tuple[AckerState, int]:
    """The state the changelog ``records`` describe (the state bytes of one acker's
    checkpoint records, in topic order, from the first chunk of the base snapshot that the
    last of them names), and that base."""
    view = ChangelogView(snapshot_every)
    enabled = gc.isenabled()
    gc.disable()  # millions of objects, none in a cycle: the collector would only rescan them
    try:
        for data in records:
            view.feed(data)
        state = view.state(acks_offsets)
    finally:
        if enabled:
            gc.enable()
    assert view.last is not None and view.last.base is not None
    return state, view.last.base


def _put(entries: dict[EntryKey, Any], e: list[Any]) -> None:
    kind = e[0]
    if kind == "o":
        key: EntryKey = ("o", e[1], time_in(e[2]))
    elif kind == "s":
        key = ("s", e[1], e[2], _class_in(e[3]))
    else:
        key = (kind, e[1], _class_in(e[2]))
    value = e[-1]
    if value is None:
        entries.pop(key, None)
    else:
        entries[key] = value


def _build(
    head: dict[str, Any], entries: dict[EntryKey, Any], acks_offsets: dict[int, int],
    snapshot_every: int,
) -> AckerState:
    state = AckerState.from_doc(head, acks_offsets, snapshot_every)
    for key, v in entries.items():
        kind, sub = key[0], key[1]
        table = state.tables.get(sub)
        if kind == "o" and table is not None:
            xor, records, reports, ranges, first, sealed, *last = v
            table.open[key[2]] = open_entry(
                int(xor), int(records), int(reports),
                {(s, int(p)): [int(lo), int(hi)] for s, p, lo, hi in ranges},
                int(first), int(sealed), int(last[0]) if last else None,
            )
        elif kind == "t" and table is not None:
            for w in v:
                table.terminated.insert(time_in(w))
        elif kind == "s" and table is not None:
            src = table.sources.get(key[2])
            if src is not None:
                for w, ms in v:
                    t = time_in(w)
                    src.seals.insert(t)
                    src.seal_ms[t] = int(ms)
        elif kind == "u":
            tracker = state.trackers.get(sub)
            if tracker is not None:
                for w in v:
                    tracker.upper.insert(time_in(w))
    for sub, table in state.tables.items():
        table.reindexed()
        tracker = state.trackers.get(sub)
        if tracker is not None:
            tracker.restore_active(table.open)
    return state


