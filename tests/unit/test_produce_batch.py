"""``publish_many``'s produce and delivery bookkeeping without a broker (#16, session 9).

``_produce_batch``: librdkafka called directly, a full queue waited out -- every record
produced exactly once, in order, with its own partition, key and delivery callback, however
often the queue fills up.  ``_deliver_batches``: the offsets collected per partition (in any
callback order) are matched to the records exactly as per-record callbacks would have
filled them in, so the hooks -- and the acks they aggregate -- see the same offsets."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from substreams.streams.publisher import Publisher


class FullQueueProducer:
    """Refuses the ``produce`` calls numbered in ``refuse`` with BufferError (librdkafka's
    full queue) and records the others."""

    def __init__(self, refuse: set[int]) -> None:
        self.refuse = refuse
        self.calls = 0
        self.polls = 0
        self.produced: list[tuple[Any, ...]] = []

    def produce(self, topic: str, value: bytes, key: Any, partition: int, cb: Any,
                headers: Any = None) -> None:
        self.calls += 1
        if self.calls in self.refuse:
            raise BufferError("Local: Queue full")
        self.produced.append((topic, value, key, partition, cb, headers))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def _publisher(producer: FullQueueProducer) -> Publisher:
    pub = Publisher.__new__(Publisher)  # no broker: only what _produce_batch reads
    pub._producer = producer  # type: ignore[assignment]
    pub.stream = "s"
    return pub


@given(
    n=st.integers(0, 30),
    refuse=st.sets(st.integers(1, 60), max_size=10),
    with_keys=st.booleans(),
    with_callbacks=st.booleans(),
)
def test_every_record_once_in_order_through_full_queues(
    n: int, refuse: set[int], with_keys: bool, with_callbacks: bool
) -> None:
    producer = FullQueueProducer(refuse)
    values = [f"v{i}".encode() for i in range(n)]
    parts = [i % 3 for i in range(n)]
    keys = [f"k{i}" if i % 2 else None for i in range(n)] if with_keys else None
    callbacks = [(lambda e, m, i=i: i) for i in range(n)] if with_callbacks else None
    _publisher(producer)._produce_batch(values, parts, keys, callbacks)
    assert [p[1] for p in producer.produced] == values
    assert [p[3] for p in producer.produced] == parts
    assert [p[2] for p in producer.produced] == (keys or [None] * n)
    assert [p[4] for p in producer.produced] == (callbacks or [None] * n)
    assert all(p[0] == "s" and p[5] is None for p in producer.produced)
    assert producer.polls == producer.calls - n  # one wait per refusal


@given(
    parts=st.lists(st.integers(0, 3), max_size=40),
    gaps=st.lists(st.integers(1, 5), min_size=40, max_size=40),
    seed=st.integers(0, 2**32),
    failed=st.sets(st.integers(0, 3), max_size=2),
)
def test_offsets_matched_per_partition_equal_per_record_callbacks(
    parts: list[int], gaps: list[int], seed: int, failed: set[int]
) -> None:
    """Each partition appends the batch's records in produce order at increasing offsets,
    with gaps (other writers, markers); the callbacks arrive shuffled.  The hooks get every
    record with its own offset; a partition with a failed delivery is left out whole."""
    truth: list[int] = []
    nxt = dict.fromkeys(range(4), 100)
    for i, p in enumerate(parts):
        nxt[p] += gaps[i]
        truth.append(nxt[p])
    records = [f"r{i}" for i in range(len(parts))]
    got: dict[int, list[int]] = {p: [] for p in set(parts)}
    order = list(range(len(parts)))
    random.Random(seed).shuffle(order)
    lost = {
        next(i for i in order if parts[i] == p) for p in failed if p in parts
    }  # one record of each failed partition
    for i in order:
        if i not in lost:
            got[parts[i]].append(truth[i])
    seen: list[tuple[list[Any], list[int], list[int], dict[str, list[Any]]]] = []
    pub = Publisher.__new__(Publisher)
    column = [10 * i for i in range(len(parts))]  # a time column rides along
    pub._batches = [(records, parts, got, {"ep": column})]  # type: ignore[list-item]
    pub._delivered = [
        lambda r, q, o, t: seen.append((list(r), list(q), list(o), dict(t)))
    ]
    pub._deliver_batches()
    keep = [i for i, p in enumerate(parts) if not any(parts[j] == p for j in lost)]
    assert seen == [([records[i] for i in keep], [parts[i] for i in keep],
                     [truth[i] for i in keep], {"ep": [column[i] for i in keep]})]
    assert pub._batches == []


@given(n=st.integers(1, 20), data=st.data())
def test_a_refused_record_stops_the_batch_and_says_where(n: int, data: st.DataObject) -> None:
    """An error other than a full queue (a record too large...) is raised after
    ``refused(i)``: records before ``i`` were produced, ``i`` and later were not."""
    bad = data.draw(st.integers(0, n - 1))
    full = data.draw(st.sets(st.integers(1, bad + 1), max_size=3))

    class Refusing(FullQueueProducer):
        def produce(self, topic: str, value: bytes, key: Any, partition: int, cb: Any,
                    headers: Any = None) -> None:
            if value == f"v{bad}".encode() and self.calls + 1 not in self.refuse:
                raise ValueError("Message size too large")
            super().produce(topic, value, key, partition, cb, headers)

    producer = Refusing(full)
    seen: list[int] = []
    values = [f"v{i}".encode() for i in range(n)]
    try:
        _publisher(producer)._produce_batch(values, [0] * n, None, None, seen.append)
    except ValueError:
        pass
    else:
        raise AssertionError("the refusal was swallowed")
    assert seen == [bad]
    assert [p[1] for p in producer.produced] == values[:bad]


def test_hooks_that_want_no_send_or_delivery_are_not_called() -> None:
    """``wants_send = False`` (an acker tracker whose substreams are all terminal) and
    ``wants_delivery = False``: the publisher keeps neither ``sent`` nor ``delivered`` of
    such a hook (no call per record, no delivery callback), and those of the others."""

    class Hook:
        def __init__(self, wants_send: bool, wants_delivery: bool) -> None:
            self.wants_send = wants_send
            self.wants_delivery = wants_delivery

        def sent(self, records: Any) -> None: ...

        def delivered(self, *columns: Any) -> None: ...

    pub = Publisher.__new__(Publisher)
    pub._hook_list, pub._sent, pub._delivery_hooks, pub._delivered = [], [], [], []
    quiet, sender, deliverer = Hook(False, False), Hook(True, False), Hook(False, True)
    for hook in (quiet, sender, deliverer):
        pub._attach(hook)  # type: ignore[arg-type]
    assert pub._sent == [sender.sent]
    assert pub._delivered == [deliverer.delivered]
    assert pub._delivery_hooks == [deliverer]
    assert pub._hook_list == [quiet, sender, deliverer]
