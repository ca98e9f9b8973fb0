"""Acks messages bounded in bytes (protocol rule 8): a commit's report cut into several
messages applies at the acker exactly as the whole one -- the same tables, frontiers,
notifications and refusals -- and a replay of the pieces is a no-op (rule 3 per piece)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.agent import TrackingAgent
from substreams.acker.core import AckerCore, Effects
from substreams.acker.protocol import (
    MAX_ACK_BYTES,
    AckBlock,
    AckEntry,
    AckMessage,
    AckReport,
    Register,
    SealEntry,
    ack_headers,
    bounded,
    decode_ack,
    encode_ack,
)
from substreams.acker.state import AckerState
from substreams.config import Config, load_config
from substreams.control.messages import OffsetRange
from substreams.frontier import Keyed, Time

GAP = 10
STREAMS = ("clicks", "views-" + "v" * 40)


class Core:
    """One acker core owning partition 0 with an int-time substream ``s`` and a session
    substream ``k``, fed messages of source ``a`` at increasing offsets."""

    def __init__(self) -> None:
        state = AckerState()
        state.ensure("s", 100)
        state.ensure("k", 100, GAP)
        self.core = AckerCore(
            "acker", (0,), {"s": 0, "k": 0}, {"s": "_c.s", "k": "_c.k"},
            acks_partitions=1, source_timeout_ms=60_000, heartbeat_ms=200, state=state,
        )
        self.core.started(0)
        self.offset = 0
        self.problems: list[tuple[str, str]] = []

    def apply(self, value: bytes, now: int = 100) -> None:
        for r in self.core.apply(0, self.offset, value, ack_headers(), now):
            self.problems.extend((r.reason, d) for d in r.detail.split("; "))
        self.offset += 1

    def tick(self, now: int = 100) -> Effects:
        return self.core.tick(now, {0: self.offset})

    def result(self) -> tuple[object, ...]:
        s = self.core.state
        return (
            {n: t.to_state() for n, t in s.tables.items()},
            {n: t.to_state() for n, t in s.trackers.items()},
            sorted(set(self.problems)),  # a refused entry cut in parts: one refusal each
        )


def message(seq: int, body: AckReport | Register) -> bytes:
    return encode_ack(AckMessage("a", seq, 7, body, "inc"))


def pieces(report: AckReport, first_seq: int, max_bytes: int) -> list[tuple[AckReport, bytes]]:
    """``bounded`` numbering the pieces as they come (what the agent does)."""
    seq = [first_seq]

    def encode(piece: AckReport) -> bytes:
        return message(seq[0], piece)

    out = []
    for piece, value in bounded(report, encode, max_bytes):
        out.append((piece, value))
        seq[0] += 1
    return out


# -- strategies ----------------------------------------------------------------------------

ranges = st.lists(
    st.builds(OffsetRange, st.sampled_from(STREAMS), st.integers(0, 7), st.integers(0, 50),
              st.integers(0, 5)).map(lambda r: OffsetRange(r.stream, r.partition, r.start,
                                                           r.start + r.end)),
    min_size=0, max_size=6,
).map(tuple)
keys = st.text(alphabet="abcdeé", min_size=1, max_size=12)
xors = st.sampled_from([0, 0, 5, -3, 2**62])


@st.composite
def entries(draw: st.DrawFn) -> AckEntry:
    if draw(st.booleans()):
        t: Time = Keyed(draw(keys), draw(st.integers(0, 60)))
        sub = "k"
    else:
        t, sub = draw(st.integers(0, 40)), "s"
    return AckEntry(sub, t, draw(xors), draw(st.integers(0, 4)), draw(st.integers(1, 4)),
                    draw(ranges))


@st.composite
def blocks(draw: st.DrawFn) -> AckBlock:
    rows = draw(st.lists(st.tuples(st.integers(0, 40), xors, st.integers(0, 3),
                                   st.integers(1, 4), ranges), min_size=0, max_size=8))
    with_xors = draw(st.booleans())
    return AckBlock.pack(
        "s", [r[0] for r in rows], [r[1] for r in rows] if with_xors else [],
        [r[2] for r in rows], [r[3] for r in rows], [len(r[4]) for r in rows],
        [x for r in rows for x in r[4]],
    )


@st.composite
def seals(draw: st.DrawFn) -> SealEntry:
    kind = draw(st.sampled_from(["int", "keyed", "all_keys"]))
    if kind == "int":
        return SealEntry("s", draw(st.integers(0, 40)), 3)
    if kind == "keyed":
        return SealEntry("k", Keyed(draw(keys), draw(st.integers(0, 80))), 3)
    return SealEntry("k", draw(st.integers(0, 80)), 3, True)


reports = st.builds(
    AckReport,
    st.lists(entries(), max_size=25).map(tuple),
    st.lists(seals(), max_size=5).map(tuple),
    st.lists(blocks(), max_size=3).map(tuple),
)


# -- properties ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(before=reports, report=reports, max_bytes=st.integers(120, 1500),
       replay_from=st.integers(0, 50))
def test_a_split_report_applies_exactly_as_the_whole(
    before: AckReport, report: AckReport, max_bytes: int, replay_from: int
) -> None:
    """Two acker cores with the same history (a Register and an earlier report, which may
    seal and terminate times so that later entries are refused); one applies the report
    whole, the other its bounded pieces: same tables, frontiers, notifications and
    refusals -- and replaying the pieces from any point changes nothing (each has its own
    sequence number above the last applied one: rule 3)."""
    whole, split = Core(), Core()
    for c in (whole, split):
        c.apply(message(0, Register(("s", "k"))))
        c.apply(message(1, before))
        c.tick()
    whole.apply(message(2, report))
    done = pieces(report, 2, max_bytes)
    for _, value in done:
        split.apply(value)
    assert split.result() == whole.result()
    assert split.tick().records == whole.tick().records
    again = done[min(replay_from, len(done)):]
    for _, value in again:  # the acker restarted from a checkpoint before them
        split.apply(value)
    assert split.core.duplicates == len(again)
    assert split.result() == whole.result()
    assert split.tick().records == whole.tick().records == []


def _indivisible(piece: AckReport) -> bool:
    """One item that :func:`bounded` cannot cut: a seal, an entry with at most one range,
    a block of at most one row with at most one range."""
    n = len(piece.entries) + len(piece.seals) + len(piece.columns)
    if n != 1:
        return False
    if piece.columns:
        rows = list(piece.columns[0].entries())
        return len(rows) == 0 or (len(rows) == 1 and len(rows[0].ranges) <= 1)
    return bool(piece.seals) or len(piece.entries[0].ranges) <= 1


@settings(max_examples=150, deadline=None)
@given(report=reports, max_bytes=st.integers(120, 1500))
def test_the_pieces_are_bounded_in_order_and_hold_the_whole(
    report: AckReport, max_bytes: int
) -> None:
    """Every piece is at most ``max_bytes`` encoded unless it is one item that cannot be
    cut; the pieces decode to the report's entries, blocks and seals in order (a cut entry
    as consecutive parts of the same time, ranges only but the last); every seal after
    every entry; the report itself when it fits."""
    done = pieces(report, 0, max_bytes)
    for i, (piece, value) in enumerate(done):
        assert decode_ack(value, ack_headers()) == AckMessage("a", i, 7, piece, "inc")
        assert len(value) <= max_bytes or _indivisible(piece)
    assert [s for p, _ in done for s in p.seals] == list(report.seals)
    last_entry = max((i for i, (p, _) in enumerate(done) if p.entries or p.columns), default=-1)
    first_seal = min((i for i, (p, _) in enumerate(done) if p.seals), default=len(done))
    assert last_entry <= first_seal
    cut = [e for p, _ in done for e in p.all_entries()]
    assert _merged(cut) == _merged(list(report.all_entries()))
    if len(message(0, report)) <= max_bytes:
        assert [p for p, _ in done] == [report]


def _merged(entries: list[AckEntry]) -> list[tuple[str, Time, int, int, int, list[OffsetRange]]]:
    """The entries with the ranges-only parts of a cut entry (xor 0, no counts) put back
    into the part that follows them."""
    out: list[tuple[str, Time, int, int, int, list[OffsetRange]]] = []
    held: list[OffsetRange] = []
    for e in entries:
        if (e.xor, e.records, e.reports) == (0, 0, 0):
            held.extend(e.ranges)  # the strategies give every whole entry a report
            continue
        out.append((e.substream, e.time, e.xor, e.records, e.reports, [*held, *e.ranges]))
        held = []
    assert not held
    return out


def test_a_step_between_the_pieces_of_a_cut_entry_waits_for_its_last_range() -> None:
    """A stage's entry whose XOR closes a sealed time (its input's RCV; its terminal
    output's SND and RCV cancel), with more ranges than one message holds: an acker step
    between the pieces does not terminate the time early, and the notification holds
    every range (were the XOR in the first piece, the time would terminate with a few of
    them and the rest be refused as late)."""
    c = Core()
    c.apply(message(0, Register(("s",))))
    c.apply(message(1, AckReport((AckEntry("s", 5, 99, 0, 1, ()),), (SealEntry("s", 5, 3),))))
    assert not _completions(c)  # sealed, XOR not zero: open
    out = tuple(OffsetRange("out-" + "o" * 30, p, 0, 1) for p in range(40))
    entry = AckEntry("s", 5, 99, 40, 81, out)
    done = pieces(AckReport((entry,)), 2, 600)
    assert len(done) > 2
    notes = []
    for _, value in done:
        c.apply(value)
        notes += _completions(c)
    assert c.problems == []
    [(t, records, ranges)] = notes
    assert (t, records, sorted(ranges, key=lambda r: r.partition)) == (5, 40, list(out))


def _completions(c: Core) -> list[tuple[Time, int, tuple[OffsetRange, ...]]]:
    from substreams.control.messages import completions

    return [(n.time, n.records, n.ranges) for _, body in c.tick().records
            for n in completions(body)]


def _config(tmp_path: object) -> Config:
    from pathlib import Path

    path = Path(str(tmp_path))
    (path / "click.avsc").write_text(
        '{"type":"record","name":"Click","fields":[{"name":"user","type":"string"},'
        '{"name":"ts","type":"long"}]}'
    )
    (path / "c.yaml").write_text(
        "streams: [{name: clicks, schema: click.avsc, order_key: ts, partitions: 4}]\n"
        "substreams: [{name: s, stream: clicks, kind: session, key: user, field: ts, "
        "gap_ms: 10}]\n"
    )
    return load_config(path / "c.yaml")


def test_a_commit_over_100000_keys_is_many_bounded_messages(tmp_path: object) -> None:
    """The agent of a publisher that wrote 10^5 distinct keys and a keyed seal in one
    commit: every message at most MAX_ACK_BYTES, numbered on from the Register, the keyed
    seal in the last one, and together every key's entry once."""
    agent = TrackingAgent(_config(tmp_path), "a", "inc")
    agent.register(["s"])
    assert [m.seq for _, m in agent.take()] == [0]
    n = 100_000
    agent.sent_and_delivered_columns(
        "s", "clicks", [Keyed(f"user-{i:06d}", 1000) for i in range(n)],
        [i % 4 for i in range(n)], list(range(n)),
    )
    agent.seal_keys("s", 2000)
    taken = agent.take_encoded()
    assert len(taken) > 1
    assert all(len(v) <= MAX_ACK_BYTES for _, _, v in taken)
    assert [m.seq for _, m, _ in taken] == list(range(1, len(taken) + 1))
    bodies = [decode_ack(v, agent.headers).body for _, _, v in taken]
    assert all(isinstance(b, AckReport) for b in bodies)
    reps = [b for b in bodies if isinstance(b, AckReport)]
    assert [s for r in reps for s in r.seals] == [SealEntry("s", 2000, reps[-1].seals[0]
                                                            .sealed_at_ms, True)]
    assert all(not r.seals for r in reps[:-1])
    assert sorted(str(e.time) for r in reps for e in r.entries) == sorted(
        str(Keyed(f"user-{i:06d}", 1000)) for i in range(n)
    )


def test_a_block_at_granularity_one_is_cut_by_rows(tmp_path: object) -> None:
    """10^5 int times of one commit (a block of 44 bytes a time: 4.4 MB) go as blocks of
    consecutive rows, each message bounded, the rows in order."""
    agent = TrackingAgent(_config(tmp_path), "a", "inc", max_bytes=64 * 1024)
    n = 100_000
    agent.sent_and_delivered_columns("u", "clicks", list(range(n)), [i % 4 for i in range(n)],
                                     list(range(n)))
    taken = agent.take_encoded()
    assert len(taken) > 1 and all(len(v) <= 64 * 1024 for _, _, v in taken)
    times = [e.time for _, m, _ in taken if isinstance(m.body, AckReport)
             for e in m.body.all_entries()]
    assert times == list(range(n))
