"""The real :class:`Publisher` over the in-memory log, through
:class:`~substreams.kafka.memproducer.MemoryProducers` (no broker, a simulated clock).

What runs here is the publisher's own transaction handling -- what goes into which
transaction, a seal riding in its records' transaction, ``flush()``, the Unregister in the
last commit, a fence raised as :class:`PublisherFencedError` -- the part the simulator used to
re-implement by hand."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from substreams.acker.protocol import (
    SOURCE,
    AckBody,
    AckReport,
    Register,
    Unregister,
    decode_ack,
)
from substreams.acker.tracker import Tracker
from substreams.app import Application
from substreams.config import Config
from substreams.config.loader import load_config_text
from substreams.errors import PublisherFencedError
from substreams.frontier import Time
from substreams.kafka.clock import SimClock
from substreams.kafka.log import Record
from substreams.kafka.memory import MemoryLog
from substreams.kafka.memproducer import MemoryProducers
from substreams.streams.publisher import Ending, Publisher, Write, transactional_id
from substreams.streams.records import SentRecord


def delivered_records(log: MemoryLog, topic: str, partitions: int) -> list[Record]:
    """Every committed record of ``topic`` (a ``read_committed`` read from the start)."""
    reader = log.reader(committed=True, name="delivered")
    reader.assign({(topic, p): 0 for p in range(partitions)})
    out: list[Record] = []
    while got := reader.poll(0, 10_000):
        out.extend(got)
    return out


ROOT = Path(__file__).resolve().parents[2]
CONFIG_TEXT = """\
streams:
  - {name: clicks, schema: avro/click.avsc, order_key: ts, partitions: 2}
substreams:
  - {name: w, stream: clicks, kind: tumbling, field: ts, size_ms: 10}
acker:
  acks_partitions: 1
"""


@pytest.fixture(scope="module")
def config() -> Config:
    return load_config_text(CONFIG_TEXT, ROOT / "substreams.yaml")


def tracker(pub: Publisher, names: list[str]) -> Tracker:
    """The acker's tracker without its heartbeat thread (the tests drive the time)."""
    return Tracker(pub.config, pub.stream, pub.source_id, pub.incarnation, names, SOURCE,
                   writer=transactional_id(pub.stream, pub.source_id))


class Recorder:
    """A hook that keeps what the publisher hands its hooks (offsets, endings)."""

    wants_send = False
    wants_delivery = True

    def __init__(self) -> None:
        self.got: list[tuple[int, int]] = []
        self.endings: list[Ending] = []

    def sent(self, records: Sequence[SentRecord]) -> None:
        pass

    def delivered(
        self, records: Sequence[SentRecord], partitions: Sequence[int],
        offsets: Sequence[int], times: Any,
    ) -> None:
        self.got.extend(zip(partitions, offsets, strict=True))

    def seal(self, substream: str, time: Time, every_key: bool) -> Sequence[Write]:
        return ()

    def before_commit(self, last: bool) -> Sequence[Write]:
        return ()

    def ended(self, how: Ending) -> None:
        self.endings.append(how)


class Crash(Exception):
    """The process dies here (raised by the producers' call hook)."""


class World:
    """A log on a simulated clock, the producers over it, the calls they made."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.clock = SimClock()
        self.log = MemoryLog(self.clock)
        self.log.create_topics({"clicks": 2, config.acker.acks_topic: 1})
        self.calls: list[tuple[str, str]] = []
        self.crash_at: tuple[str, str] | None = None
        self.producers = MemoryProducers(self.log, self.call)
        self.app = Application(
            config, mechanisms={"acker": tracker}, clock=self.clock,
            producers=self.producers, schemas=lambda *_: None,
        )

    def call(self, what: str, when: str) -> None:
        self.calls.append((what, when))
        if (what, when) == self.crash_at:
            raise Crash(f"{when} {what}")

    def publisher(self, process: str = "p1") -> Publisher:
        """A publisher of source ``web`` in ``process`` (a second process's publisher of
        the same source is the source's next incarnation), built as the composition root
        builds it."""
        return self.app.publisher("clicks", "web", bootstrap=f"memory/{process}")

    def records(self) -> list[Record]:
        return delivered_records(self.log, "clicks", 2)

    def acks(self) -> list[AckBody]:
        out = []
        for r in delivered_records(self.log, self.config.acker.acks_topic, 1):
            body = decode_ack(r.value or b"", r.headers).body
            assert body is not None
            out.append(body)
        return out

    def commits(self) -> int:
        return self.calls.count(("commit", "after"))


def click(ts: int) -> dict[str, Any]:
    return {"user": "u", "url": "/", "ts": ts}


def test_registers_first_and_publishes_in_a_transaction_flush_commits(config: Config) -> None:
    world = World(config)
    pub = world.publisher()
    assert isinstance(world.acks()[0], Register)  # committed before any record
    assert world.commits() == 1
    sent = pub.publish(click(1))
    pub.publish_many([click(2), click(3)])
    assert world.records() == []  # the transaction is open: nothing visible
    pub.flush()
    assert world.commits() == 2
    got = world.records()
    assert len(got) == 3
    assert any(r.partition == sent.partition for r in got)
    pub.flush()  # nothing pending: no transaction
    assert world.commits() == 2
    pub.close()


def test_delivery_callbacks_carry_the_log_offsets(config: Config) -> None:
    world = World(config)
    pub = world.publisher()
    rec = Recorder()
    pub.add_hook(rec)
    pub.publish(click(1))
    pub.publish_many([click(2), click(3), click(4)], partitions=[0, 1, 0])
    pub.publish(click(5), partition=1)
    pub.flush()
    assert sorted(rec.got) == sorted((r.partition, r.offset) for r in world.records())
    assert rec.endings == ["committed"]
    pub.close()


def test_a_seal_rides_in_the_transaction_of_its_records(config: Config) -> None:
    world = World(config)
    pub = world.publisher()
    before = world.commits()
    pub.publish_many([click(1), click(2)])
    pub.seal("w", 0)
    assert world.commits() == before + 1  # records, report and seal: one transaction
    reports = [b for b in world.acks() if isinstance(b, AckReport)]
    assert len(reports) == 1
    assert [s.time for s in reports[0].seals] == [0]
    assert sum(e.records for e in reports[0].all_entries()) == 2
    assert len(world.records()) == 2
    pub.close()


def test_a_seal_without_commit_waits_for_flush(config: Config) -> None:
    world = World(config)
    pub = world.publisher()
    pub.publish(click(1))
    pub.seal("w", 0, commit=False)
    assert world.records() == [] and not any(isinstance(b, AckReport) for b in world.acks())
    pub.flush()
    reports = [b for b in world.acks() if isinstance(b, AckReport)]
    assert [s.time for r in reports for s in r.seals] == [0]
    pub.close()


def test_the_publisher_draws_from_the_rng_it_is_given(config: Config) -> None:
    world = World(config)
    incs = []
    for process in ("p1", "p2"):
        pub = Publisher(config, "clicks", "web", bootstrap=f"memory/{process}",
                        mechanisms=world.app.mechanisms, producers=world.producers,
                        schemas=lambda *_: None, clock=world.clock, rng=random.Random(7))
        incs.append((pub.incarnation, pub.publish(click(1)).tracking_id))
        pub.close()
    assert incs[0] == incs[1]


def test_close_commits_the_unregister_last(config: Config) -> None:
    world = World(config)
    pub = world.publisher()
    pub.publish(click(1))
    pub.close()
    acks = world.acks()
    assert isinstance(acks[0], Register)
    assert isinstance(acks[-1], Unregister)
    assert len(world.records()) == 1
    # the Unregister rides in the records' transaction: one commit after the Register
    assert world.commits() == 2


def test_a_new_incarnation_fences_the_old_one(config: Config) -> None:
    world = World(config)
    old = world.publisher("p1")
    old.publish(click(1))  # an open transaction when the successor starts
    new = world.publisher("p2")
    assert new.incarnation != old.incarnation
    with pytest.raises(PublisherFencedError):
        old.seal("w", 0)
    old.close()  # after a failed commit: drops it and lets go, writes nothing, never raises
    assert world.records() == []  # the old transaction was aborted by the fence
    assert not any(isinstance(b, Unregister) for b in world.acks())
    new.publish(click(3))
    new.close()
    assert len(world.records()) == 1
    registers = [b for b in world.acks() if isinstance(b, Register)]
    assert len(registers) == 2


def test_a_fenced_close_raises_and_writes_nothing(config: Config) -> None:
    world = World(config)
    old = world.publisher("p1")
    new = world.publisher("p2")
    acks = len(world.acks())
    with pytest.raises(PublisherFencedError):
        old.close()
    assert len(world.acks()) == acks
    assert not any(isinstance(b, Unregister) for b in world.acks())
    new.close()
    assert isinstance(world.acks()[-1], Unregister)


def test_a_call_hook_can_end_the_process_between_produce_and_commit(config: Config) -> None:
    """What the simulator does: the hook raises before the commit reaches the log; the
    transaction stays open and holds the partitions until the id is taken again."""
    world = World(config)
    pub = world.publisher()
    world.crash_at = ("commit", "before")
    pub.publish(click(1))
    with pytest.raises(Crash):
        pub.flush()
    assert world.log.end_offsets("clicks", [0, 1], committed=True) != \
        world.log.end_offsets("clicks", [0, 1], committed=False)
    world.log.fence(transactional_id("clicks", "web"))
    assert world.records() == []
