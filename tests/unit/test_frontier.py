"""Tests for substreams.frontier: unit examples plus property tests against brute force.

The brute-force model below re-implements the partial order independently of the
module, so the property tests check the module against the specification rather
than against itself.
"""

from __future__ import annotations

import io
import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from substreams.frontier import (
    Antichain,
    ChangeBatch,
    Keyed,
    MutableAntichain,
    Time,
    UpperAntichain,
    less_equal,
    less_than,
    sort_key,
    time_from_wire,
    time_to_wire,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------------------
# Brute-force model
# --------------------------------------------------------------------------------------


def b_le(a: Time, b: Time) -> bool:
    """Reference partial order, written from the spec."""
    if isinstance(a, Keyed) or isinstance(b, Keyed):
        return (
            isinstance(a, Keyed)
            and isinstance(b, Keyed)
            and a.key == b.key
            and b_le(a.time, b.time)
        )
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(x <= y for x, y in zip(a, b, strict=True))
    return False


def b_lt(a: Time, b: Time) -> bool:
    return a != b and b_le(a, b)


def b_min(xs: object) -> set[Time]:
    s = set(xs)  # type: ignore[call-overload]
    return {x for x in s if not any(b_lt(y, x) for y in s)}


def b_max(xs: object) -> set[Time]:
    s = set(xs)  # type: ignore[call-overload]
    return {x for x in s if not any(b_lt(x, y) for y in s)}


KEYS = ("a", "b")
HI = 5
# Every time whose coordinates lie in [0, HI]: bounded universe for checking
# least-upper-bound / greatest-lower-bound / upset properties exhaustively.
_INNER: list[int | tuple[int, ...]] = [
    *range(HI + 1),
    *itertools.product(range(HI + 1), repeat=2),
]
UNIVERSE: list[Time] = [*_INNER, *(Keyed(k, i) for k in KEYS for i in _INNER)]

ints = st.integers(0, HI - 1)
pairs = st.tuples(ints, ints)
keyed = st.builds(Keyed, st.sampled_from(KEYS), st.one_of(ints, pairs))
times: st.SearchStrategy[Time] = st.one_of(ints, pairs, keyed)
time_sets = st.lists(times, max_size=10)
deltas = st.integers(-2, 2)


# --------------------------------------------------------------------------------------
# time.py
# --------------------------------------------------------------------------------------


class TestTime:
    def test_int_order(self) -> None:
        assert less_equal(1, 2) and less_equal(2, 2) and not less_equal(3, 2)
        assert less_than(1, 2) and not less_than(2, 2)

    def test_tuple_product_order(self) -> None:
        assert less_equal((1, 2), (1, 3))
        assert less_equal((1, 2), (1, 2))
        assert not less_equal((1, 3), (2, 2)) and not less_equal((2, 2), (1, 3))
        assert less_than((0, 0), (0, 1)) and not less_than((0, 1), (0, 1))
        # Different lengths and int-vs-tuple are incomparable.
        assert not less_equal((1,), (1, 2)) and not less_equal((1, 2), (1,))
        assert not less_equal(1, (1,)) and not less_equal((1,), 1)

    def test_keyed_order(self) -> None:
        assert less_equal(Keyed("u", 1), Keyed("u", 2))
        assert not less_equal(Keyed("u", 1), Keyed("v", 2))
        assert not less_equal(Keyed("u", 1), 2) and not less_equal(1, Keyed("u", 2))
        assert less_equal(Keyed("u", (1, 2)), Keyed("u", (1, 5)))
        assert not less_equal(Keyed("u", 1), Keyed("u", (1,)))
        assert less_than(Keyed("u", 1), Keyed("u", 2))
        assert not less_than(Keyed("u", 2), Keyed("u", 2))

    def test_keyed_is_frozen_hashable_and_validated(self) -> None:
        k = Keyed("u", (1, 2))
        assert k == Keyed("u", (1, 2)) and hash(k) == hash(Keyed("u", (1, 2)))
        with pytest.raises(AttributeError):
            k.key = "v"  # type: ignore[misc]
        assert not hasattr(k, "__dict__")  # slots
        with pytest.raises(TypeError):
            Keyed(1, 2)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            Keyed("u", "x")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            Keyed("u", (1, "x"))  # type: ignore[arg-type]
        assert repr(k) == "Keyed('u', (1, 2))"

    def test_wire_examples(self) -> None:
        assert time_to_wire(5) == {"key": None, "coords": [5], "kind": "int"}
        assert time_to_wire((1, 2)) == {"key": None, "coords": [1, 2], "kind": "tuple"}
        assert time_to_wire(Keyed("u1", 7)) == {"key": "u1", "coords": [7], "kind": "int"}
        assert time_to_wire(Keyed("u1", (1, 2))) == {
            "key": "u1",
            "coords": [1, 2],
            "kind": "tuple",
        }
        assert time_to_wire(()) == {"key": None, "coords": [], "kind": "tuple"}
        assert time_from_wire({"key": None, "coords": [5], "kind": "int"}) == 5
        assert time_from_wire({"coords": [5], "kind": "tuple"}) == (5,)

    def test_wire_rejects_malformed(self) -> None:
        with pytest.raises(ValueError):
            time_from_wire({"key": None, "coords": [1, 2], "kind": "int"})
        with pytest.raises(ValueError):
            time_from_wire({"key": None, "coords": [1], "kind": "float"})
        with pytest.raises(ValueError):
            time_from_wire({"key": 3, "coords": [1], "kind": "int"})
        with pytest.raises(ValueError):
            time_from_wire({"key": None, "coords": ["x"], "kind": "tuple"})
        with pytest.raises(TypeError):
            time_to_wire("x")  # type: ignore[arg-type]

    def test_wire_matches_avro_schema(self) -> None:
        fastavro = pytest.importorskip("fastavro")
        from substreams.streams.schemas import raw_schema

        schema = fastavro.parse_schema(raw_schema("time"))
        for t in (5, (1, 2), Keyed("u1", 7), Keyed("u1", (1, 2)), ()):
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, schema, time_to_wire(t))
            buf.seek(0)
            assert time_from_wire(fastavro.schemaless_reader(buf, schema)) == t

    @SETTINGS
    @given(times, times)
    def test_order_matches_brute(self, a: Time, b: Time) -> None:
        assert less_equal(a, b) == b_le(a, b)
        assert less_than(a, b) == b_lt(a, b)

    @SETTINGS
    @given(times, times, times)
    def test_partial_order_axioms(self, a: Time, b: Time, c: Time) -> None:
        assert less_equal(a, a)
        if less_equal(a, b) and less_equal(b, a):
            assert a == b
        if less_equal(a, b) and less_equal(b, c):
            assert less_equal(a, c)

    @SETTINGS
    @given(times, times)
    def test_sort_key_is_linear_extension(self, a: Time, b: Time) -> None:
        if b_lt(a, b):
            assert sort_key(a) < sort_key(b)
        if a != b:
            assert sort_key(a) != sort_key(b)

    @SETTINGS
    @given(
        st.one_of(
            st.integers(-(2**62), 2**62),
            st.lists(st.integers(-(2**62), 2**62), max_size=4).map(tuple),
            st.builds(
                Keyed,
                st.text(max_size=5),
                st.one_of(
                    st.integers(-(2**62), 2**62),
                    st.lists(st.integers(), max_size=4).map(tuple),
                ),
            ),
        )
    )
    def test_wire_round_trip(self, t: Time) -> None:
        back = time_from_wire(time_to_wire(t))
        assert back == t
        assert type(back) is type(t)
        if isinstance(t, Keyed):
            assert isinstance(back, Keyed) and type(back.time) is type(t.time)


# --------------------------------------------------------------------------------------
# Antichain / UpperAntichain
# --------------------------------------------------------------------------------------


class TestAntichain:
    def test_insert_timely_examples(self) -> None:
        f = Antichain()
        assert f.insert(2)
        assert not f.insert(3)
        assert f.insert(1)
        assert f.elements() == (1,)
        g = Antichain()
        assert g.extend([3])
        assert g.extend([2, 5])
        assert not g.extend([3, 4])
        assert g.elements() == (2,)

    def test_partial_order_insert(self) -> None:
        f = Antichain([(1, 3), (3, 1)])
        assert f.elements() == ((1, 3), (3, 1))
        assert f.insert((2, 2))  # (2, 2) is incomparable to both
        assert f.elements() == ((1, 3), (2, 2), (3, 1))
        assert f.insert((1, 1))
        assert f.elements() == ((1, 1),)
        assert not f.insert((1, 1))

    def test_queries(self) -> None:
        f = Antichain([2])
        assert f.less_equal(3) and f.less_equal(2) and not f.less_equal(1)
        assert f.less_than(3) and not f.less_than(2) and not f.less_than(1)
        g = Antichain([(0, 2), (2, 0)])
        assert g.less_equal((1, 2)) and g.less_equal((2, 0))
        assert not g.less_equal((1, 1))
        assert not g.less_than((2, 0)) and g.less_than((2, 1))
        assert not Antichain().less_equal(0)

    def test_keyed_frontier_holds_one_per_key(self) -> None:
        f = Antichain([Keyed("a", 5), Keyed("b", 3), Keyed("a", 4), 7])
        assert f.elements() == (7, Keyed("a", 4), Keyed("b", 3))
        assert f.less_equal(Keyed("a", 4)) and not f.less_equal(Keyed("a", 3))
        assert not f.less_equal(Keyed("c", 100))
        assert not f.less_equal(6) and f.less_equal(8)

    def test_container_protocol(self) -> None:
        f = Antichain([3, (1, 2), Keyed("k", 1)])
        assert len(f) == 3 and bool(f) and not f.is_empty()
        assert list(f) == list(f.elements())
        assert 3 in f and 4 not in f
        assert f == Antichain([Keyed("k", 1), (1, 2), 3])
        assert hash(f) == hash(Antichain([Keyed("k", 1), (1, 2), 3]))
        assert f != Antichain([3])
        assert f != UpperAntichain([3, (1, 2), Keyed("k", 1)])
        assert repr(Antichain([2])) == "Antichain([2])"
        empty = Antichain()
        assert empty.is_empty() and not empty and len(empty) == 0
        c = f.copy()
        c.insert(0)
        assert c != f and 3 in f
        c.clear()
        assert c.is_empty()

    def test_dominates(self) -> None:
        assert Antichain([1]).dominates(Antichain([2]))
        assert not Antichain([2]).dominates(Antichain([1]))
        assert Antichain([1]).dominates(Antichain())
        assert not Antichain().dominates(Antichain([1]))
        assert Antichain([(0, 1), (1, 0)]).dominates(Antichain([(1, 1)]))
        assert not Antichain([(0, 1)]).dominates(Antichain([(1, 0)]))

    def test_meet_examples(self) -> None:
        a, b = Antichain([(0, 2)]), Antichain([(2, 0)])
        assert a.meet(b) == Antichain([(0, 2), (2, 0)])
        assert Antichain([3]).meet(Antichain([5])) == Antichain([3])
        assert Antichain([1]).meet(Antichain()) == Antichain([1])

    @SETTINGS
    @given(time_sets)
    def test_minimal_elements(self, xs: list[Time]) -> None:
        f = Antichain(xs)
        assert set(f.elements()) == b_min(xs)
        assert list(f.elements()) == sorted(b_min(xs), key=sort_key)

    @SETTINGS
    @given(time_sets, times)
    def test_insert_and_queries_match_brute(self, xs: list[Time], t: Time) -> None:
        f = Antichain(xs)
        assert f.less_equal(t) == any(b_le(x, t) for x in xs)
        assert f.less_than(t) == any(b_lt(x, t) for x in xs)
        before = set(f.elements())
        assert f.insert(t) == (not any(b_le(x, t) for x in before))
        assert set(f.elements()) == b_min([*xs, t])
        f.check()
        assert (t in f) == (t in b_min([*xs, t])) and len(f) == len(b_min([*xs, t]))

    @SETTINGS
    @given(time_sets, time_sets)
    def test_dominates_matches_brute(self, xs: list[Time], ys: list[Time]) -> None:
        a, b = Antichain(xs), Antichain(ys)
        expected = all(any(b_le(x, y) for x in a.elements()) for y in b.elements())
        assert a.dominates(b) == expected

    @SETTINGS
    @given(time_sets, time_sets)
    def test_meet_matches_brute(self, xs: list[Time], ys: list[Time]) -> None:
        a, b = Antichain(xs), Antichain(ys)
        m = a.meet(b)
        assert set(m.elements()) == b_min([*xs, *ys])
        # Complete in the merge iff complete in each.
        for u in UNIVERSE:
            assert m.less_equal(u) == (a.less_equal(u) or b.less_equal(u))
        assert a == Antichain(xs)  # inputs untouched


class TestUpperAntichain:
    def test_insert_keeps_maximal(self) -> None:
        u = UpperAntichain()
        assert u.insert(2)
        assert not u.insert(1)
        assert u.insert(5)
        assert u.elements() == (5,)
        v = UpperAntichain([(1, 3), (3, 1), (2, 2), (0, 0)])
        assert v.elements() == ((1, 3), (2, 2), (3, 1))
        assert v.insert((3, 3)) and v.elements() == ((3, 3),)

    def test_covers(self) -> None:
        u = UpperAntichain([(1, 3), (3, 1)])
        assert u.covers((1, 3)) and u.covers((0, 0)) and not u.covers((2, 2))
        k = UpperAntichain([Keyed("a", 5)])
        assert k.covers(Keyed("a", 5)) and not k.covers(Keyed("b", 1)) and not k.covers(1)

    def test_union_and_retain(self) -> None:
        u = UpperAntichain([(1, 3)]).union(UpperAntichain([(3, 1), (0, 0)]))
        assert u == UpperAntichain([(1, 3), (3, 1)])
        lower = Antichain([(2, 0)])
        kept = u.retain_not_passed(lower)
        assert kept == UpperAntichain([(3, 1)])  # (1, 3) is complete: (2, 0) !<= (1, 3)
        assert u == UpperAntichain([(1, 3), (3, 1)])  # unchanged
        assert u.retain_not_passed(Antichain()).is_empty()  # everything complete
        assert repr(UpperAntichain([1])) == "UpperAntichain([1])"

    @SETTINGS
    @given(time_sets, times)
    def test_matches_brute(self, xs: list[Time], t: Time) -> None:
        u = UpperAntichain(xs)
        assert set(u.elements()) == b_max(xs)
        assert u.covers(t) == any(b_le(t, x) for x in xs)
        before = set(u.elements())
        assert u.insert(t) == (not any(b_le(t, x) for x in before))
        assert set(u.elements()) == b_max([*xs, t])
        u.check()
        # discard: a subset of an antichain is one; the others stay
        for x in list(u.elements())[::2]:
            assert u.discard(x) and not u.discard(x) and x not in u
        u.check()
        assert set(u.elements()) == set(list(sorted(b_max([*xs, t]), key=sort_key))[1::2])

    @SETTINGS
    @given(time_sets, time_sets, time_sets)
    def test_union_and_retain_match_brute(
        self, xs: list[Time], ys: list[Time], ls: list[Time]
    ) -> None:
        a, b = UpperAntichain(xs), UpperAntichain(ys)
        assert set(a.union(b).elements()) == b_max([*xs, *ys])
        a.union(b).check()
        assert a.union(b) == UpperAntichain([*ys, *xs])  # equality is set equality
        lower = Antichain(ls)
        kept = a.retain_not_passed(lower)
        kept.check()
        assert set(kept.elements()) == {x for x in b_max(xs) if any(b_le(m, x) for m in ls)}


# --------------------------------------------------------------------------------------
# ChangeBatch
# --------------------------------------------------------------------------------------


def b_consolidate(updates: list[tuple[Time, int]]) -> list[tuple[Time, int]]:
    acc: Counter[Time] = Counter()
    for t, d in updates:
        acc[t] += d
    return sorted(((t, d) for t, d in acc.items() if d != 0), key=lambda x: sort_key(x[0]))


class TestChangeBatch:
    def test_examples(self) -> None:
        b = ChangeBatch()
        assert b.is_empty() and len(b) == 0 and not b
        b.update(17, 1)
        assert not b.is_empty()
        b.update(17, -1)
        assert b.is_empty()
        b.extend([(3, 2), ((1, 1), -1), (3, -1), (Keyed("k", 1), 4), (5, 0)])
        assert len(b) == 3
        assert list(b.iter()) == [(3, 1), ((1, 1), -1), (Keyed("k", 1), 4)]
        assert list(b) == list(b.iter())
        assert b == ChangeBatch([(Keyed("k", 1), 4), (3, 1), ((1, 1), -1)])
        assert b != ChangeBatch()
        assert repr(ChangeBatch([(1, 2)])) == "ChangeBatch([(1, 2)])"
        assert b.drain() == [(3, 1), ((1, 1), -1), (Keyed("k", 1), 4)]
        assert b.is_empty() and b.drain() == []
        with pytest.raises(TypeError):
            hash(b)

    @SETTINGS
    @given(st.lists(st.tuples(times, deltas), max_size=30), st.integers(0, 30))
    def test_drain_matches_brute(self, updates: list[tuple[Time, int]], split: int) -> None:
        b = ChangeBatch()
        for t, d in updates[:split]:
            b.update(t, d)
        b.extend(updates[split:])
        expected = b_consolidate(updates)
        assert len(b) == len(expected)
        assert list(b) == expected
        assert b.drain() == expected
        assert b.is_empty()


# --------------------------------------------------------------------------------------
# MutableAntichain
# --------------------------------------------------------------------------------------


def _holding(t: Time) -> MutableAntichain:
    """A multiset holding ``t`` once, so the frontier is ``{t}``."""
    m = MutableAntichain()
    m.update(t, 1)
    return m


class TestMutableAntichain:
    def test_timely_example(self) -> None:
        m = _holding(1)
        assert m.frontier() == Antichain([1])
        assert not m.less_than(0) and not m.less_than(1) and m.less_than(2)
        assert not m.less_equal(0) and m.less_equal(1) and m.less_equal(2)
        assert m.update_iter([(1, -1), (2, 7)]) == [(1, -1), (2, 1)]
        assert m.frontier() == Antichain([2])
        assert m.count_for(2) == 7 and m.count_for(1) == 0

    def test_empty(self) -> None:
        m = MutableAntichain()
        assert m.is_empty() and m.frontier().is_empty()
        assert not m.less_equal(0) and not m.less_equal((0, 0))
        assert not m.less_equal(Keyed("k", 0)) and not m.less_equal(Keyed("k", (0,)))
        assert m.update_iter([]) == []
        assert repr(m) == "MutableAntichain(frontier=[])"

    def test_leave_and_reenter_reports_nothing(self) -> None:
        m = _holding(3)
        assert m.update_iter([(3, -1), (3, 1)]) == []
        assert m.update_iter([(3, -1), (1, 1), (1, -1), (3, 1)]) == []
        assert m.frontier() == Antichain([3])

    def test_negative_counts_are_not_in_frontier(self) -> None:
        m = MutableAntichain()
        assert m.update_iter([(5, -1)]) == []  # ack overtook its message
        assert m.is_empty() and m.count_for(5) == -1
        assert m.update_iter([(5, 1)]) == []  # back to zero
        assert m.is_empty() and m.count_for(5) == 0
        assert m.update_iter([(5, 1), (7, 1)]) == [(5, 1)]
        assert m.update_iter([(2, -1)]) == []
        assert m.update_iter([(2, 2)]) == [(2, 1), (5, -1)]

    def test_partial_order(self) -> None:
        m = MutableAntichain()
        assert m.update_iter([((1, 2), 1), ((2, 1), 1), ((3, 3), 1)]) == [
            ((1, 2), 1),
            ((2, 1), 1),
        ]
        assert m.less_equal((3, 3)) and not m.less_equal((1, 1))
        assert m.less_than((2, 2)) and not m.less_than((1, 2))
        assert m.update_iter([((1, 2), -1)]) == [((1, 2), -1)]  # (3,3) still above (2,1)
        assert m.update_iter([((2, 1), -1)]) == [((2, 1), -1), ((3, 3), 1)]
        assert m.update_iter([((0, 0), 1)]) == [((0, 0), 1), ((3, 3), -1)]
        assert m.count_for((3, 3)) == 1 and m.count_for((9, 9)) == 0

    def test_keyed_and_mixed(self) -> None:
        m = MutableAntichain()
        changes = m.update_iter(
            [(Keyed("s1", 4), 1), (Keyed("s2", 2), 1), (Keyed("s1", 9), 1), (10, 1)]
        )
        assert changes == [(10, 1), (Keyed("s1", 4), 1), (Keyed("s2", 2), 1)]
        assert m.less_equal(Keyed("s1", 4)) and not m.less_equal(Keyed("s1", 3))
        assert not m.less_equal(Keyed("s3", 100)) and not m.less_than(Keyed("s3", 100))
        assert m.less_than(Keyed("s2", 3)) and not m.less_than(Keyed("s2", 2))
        assert m.count_for(Keyed("s1", 9)) == 1 and m.count_for(Keyed("zz", 1)) == 0
        assert m.update_iter([(Keyed("s1", 4), -1)]) == [
            (Keyed("s1", 4), -1),
            (Keyed("s1", 9), 1),
        ]
        assert m.update_iter([(Keyed("s2", 2), -1)]) == [(Keyed("s2", 2), -1)]
        assert m.frontier() == Antichain([10, Keyed("s1", 9)])
        # Finished sessions are forgotten, so per-key state does not leak.
        assert "s2" not in m._total
        m.update_iter([(Keyed("s1", (1, 1)), 1)])
        assert m.less_equal(Keyed("s1", (1, 2))) and not m.less_equal(Keyed("s2", (1, 2)))
        assert m.count_for(Keyed("s1", (1, 1))) == 1
        m.update_iter([(Keyed("s1", (1, 1)), -1)])
        assert m._partial == {}
        m.clear()
        assert m.is_empty() and m.count_for(10) == 0

    def test_rejects_non_times(self) -> None:
        m = MutableAntichain()
        with pytest.raises(TypeError):
            m.update_iter([("x", 1)])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            m.update_iter([((1, "x"), 1)])  # type: ignore[list-item]

    def test_int_heap_stays_bounded(self) -> None:
        m = _holding(0)  # pins the frontier at 0
        for t in range(1, 5000):
            assert m.update_iter([(t, 1)]) == []
            assert m.update_iter([(t, -1)]) == []
        assert len(m._ints.heap) < 200
        assert m.frontier() == Antichain([0])
        assert m.update(0, -1) == [(0, -1)]
        assert m.is_empty()

    def test_int_hot_path_sequence(self) -> None:
        m = MutableAntichain()
        for t in range(100):
            m.update(t, 1)
        for t in range(100):
            assert m.update(t, -1) == ([(t, -1), (t + 1, 1)] if t < 99 else [(t, -1)])
        assert m.is_empty()

    @staticmethod
    def _check_batches(batches: list[list[tuple[Time, int]]]) -> None:
        m = MutableAntichain()
        counts: Counter[Time] = Counter()
        old = set[Time]()
        for batch in batches:
            changes = m.update_iter(batch)
            for t, d in batch:
                counts[t] += d
            new = b_min(t for t, c in counts.items() if c > 0)
            assert set(m.frontier().elements()) == new
            expected = {(t, -1) for t in old - new} | {(t, 1) for t in new - old}
            assert set(changes) == expected and len(changes) == len(expected)
            assert [sort_key(t) for t, _ in changes] == sorted(sort_key(t) for t, _ in changes)
            assert m.is_empty() == (not new)
            for t, _ in batch:
                assert m.count_for(t) == counts[t]
                assert m.less_equal(t) == any(b_le(f, t) for f in new)
                assert m.less_than(t) == any(b_lt(f, t) for f in new)
            old = new

    @SETTINGS
    @given(st.lists(st.lists(st.tuples(times, deltas), max_size=6), max_size=12))
    def test_update_iter_mixed_matches_brute(self, batches: list[list[tuple[Time, int]]]) -> None:
        self._check_batches(batches)

    @SETTINGS
    @given(
        st.lists(
            st.lists(st.tuples(st.integers(0, 12), st.integers(-2, 3)), max_size=6),
            max_size=20,
        )
    )
    def test_update_iter_ints_matches_brute(self, batches: list[list[tuple[Time, int]]]) -> None:
        self._check_batches(batches)

    @FEW
    @given(
        st.lists(
            st.lists(
                st.tuples(
                    st.builds(Keyed, st.sampled_from(KEYS), st.integers(0, 6)), st.integers(-1, 2)
                ),
                max_size=6,
            ),
            max_size=15,
        )
    )
    def test_update_iter_keyed_matches_brute(self, batches: list[list[tuple[Time, int]]]) -> None:
        self._check_batches(batches)

    @FEW
    @given(st.lists(st.tuples(times, st.integers(1, 2)), max_size=10))
    def test_add_then_remove_everything(self, updates: list[tuple[Time, int]]) -> None:
        m = MutableAntichain()
        m.update_iter(updates)
        assert set(m.frontier().elements()) == b_min(t for t, _ in updates)
        m.update_iter((t, -d) for t, d in reversed(updates))
        assert m.is_empty() and m.frontier().is_empty()
        assert m._partial == {} and set(m._total) == {None}
