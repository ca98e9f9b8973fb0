"""A publisher keeps its seals: a record at a time it sealed is refused (substreams.streams.times).

The model: a time is refused iff some seal of the source is ``>=`` it in the partial order
(or, for keyed times, at or below the keyed seal).  Checked against the assigner for random
seals and times of every kind, through ``time_of``, ``times_of`` and ``check``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.config.model import SubstreamConfig
from substreams.errors import SealedTimeError
from substreams.frontier import Keyed, Time, less_equal
from substreams.streams.times import TimeAssigner


def assigner(kind: str, **extra: Any) -> TimeAssigner:
    fields: dict[str, Any] = {"name": "s", "stream": "clicks", "kind": kind, "field": "ts"}
    if kind == "tumbling":
        fields["size_ms"] = 10
    if kind in ("session", "per_key"):
        fields["key"] = "user"
    if kind == "session":
        fields["gap_ms"] = 5
    fields.update(extra)
    return TimeAssigner(SubstreamConfig(**fields), "ts")


def refused(a: TimeAssigner, payload: dict[str, Any]) -> bool:
    try:
        a.time_of(payload)
    except SealedTimeError:
        return True
    return False


def test_epoch_seal_refuses_its_time_and_below_only() -> None:
    a = assigner("epoch")
    a.seal(5)
    assert refused(a, {"ts": 5}) and refused(a, {"ts": 0})
    assert not refused(a, {"ts": 6})
    a.seal(3)  # lower: changes nothing
    assert refused(a, {"ts": 4})
    with pytest.raises(SealedTimeError, match=r"substream 's': a record at time 2 .*sealed 5"):
        a.times_of([{"ts": 9}, {"ts": 2}])


def test_tumbling_seal_covers_windows_that_never_opened() -> None:
    a = assigner("tumbling")
    a.seal(4)  # windows 0..4: event times 0..49
    assert refused(a, {"ts": 49}) and refused(a, {"ts": 3})
    assert not refused(a, {"ts": 50})
    with pytest.raises(SealedTimeError, match="window 1"):
        a.time_of({"ts": 12})


def test_keyed_seal_is_per_key_and_keyed_seals_are_for_every_key() -> None:
    a = assigner("per_key")
    a.seal(Keyed("ada", 0))
    assert refused(a, {"user": "ada", "ts": 1})
    assert not refused(a, {"user": "bob", "ts": 1})
    a.seal_keys(0)
    assert refused(a, {"user": "bob", "ts": 1})
    s = assigner("session")
    s.seal(Keyed("ada", 100))
    assert refused(s, {"user": "ada", "ts": 100}) and not refused(s, {"user": "ada", "ts": 101})
    assert not refused(s, {"user": "bob", "ts": 50})
    s.seal_keys(60)
    assert refused(s, {"user": "bob", "ts": 50}) and not refused(s, {"user": "bob", "ts": 61})


def test_tuple_times_use_the_product_order() -> None:
    a = assigner("epoch")
    a.seal((2, 5))
    a.seal((4, 1))
    a.seal((1, 1))  # below (2, 5): kept out of the antichain
    assert a.sealed_other == [(2, 5), (4, 1)]
    for t in [(2, 5), (0, 0), (4, 0), (1, 5)]:
        with pytest.raises(SealedTimeError):
            a.check(t)
    for t in [(3, 2), (5, 0), (2, 6), (1, 2, 3)]:
        a.check(t)


times = st.one_of(
    st.integers(0, 20),
    st.tuples(st.integers(0, 5), st.integers(0, 5)),
    st.builds(Keyed, st.sampled_from(["a", "b"]), st.integers(0, 20)),
)


@settings(max_examples=300, deadline=None)
@given(seals=st.lists(times, max_size=8), keyed=st.none() | st.integers(0, 20), probe=times)
def test_check_refuses_exactly_what_some_seal_covers(
    seals: list[Time], keyed: int | None, probe: Time
) -> None:
    a = assigner("session")
    for t in seals:
        a.seal(t)
    if keyed is not None:
        a.seal_keys(keyed)
    covered = any(less_equal(probe, s) for s in seals) or (
        keyed is not None and type(probe) is Keyed and type(probe.time) is int
        and probe.time <= keyed
    )
    try:
        a.check(probe)
    except SealedTimeError:
        assert covered
    else:
        assert not covered


@settings(max_examples=200, deadline=None)
@given(
    seals=st.lists(st.integers(0, 30), max_size=5),
    batch=st.lists(st.integers(0, 400), min_size=1, max_size=20),
    kind=st.sampled_from(["epoch", "tumbling"]),
)
def test_a_batch_is_refused_iff_one_record_is_sealed(
    seals: list[int], batch: list[int], kind: str
) -> None:
    a = assigner(kind)
    for t in seals:
        a.seal(t)
    size = 10 if kind == "tumbling" else 1
    late = bool(seals) and any(ts // size <= max(seals) for ts in batch)
    payloads = [{"ts": ts} for ts in batch]
    try:
        col = a.times_of(payloads)
    except SealedTimeError:
        assert late
    else:
        assert not late
        assert col == [ts // size for ts in batch]
