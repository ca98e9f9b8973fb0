"""``substreams config check``'s late-for-one warning: exact (a property against the seal
policy's own rule), and printed by the command with exit code 0."""

from __future__ import annotations

import functools
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.cli.config_cmd import command
from substreams.config import Config, SealPolicy, SubstreamConfig
from substreams.config.advice import late_for_one
from substreams.config.loader import load_config_text
from substreams.streams.policy import SealClock

SCHEMA = Path(__file__).resolve().parents[1] / "sim" / "record.avsc"


def config_of(a: str, b: str) -> Config:
    text = (
        "streams:\n"
        f"  - {{name: orders, schema: {SCHEMA.name}, order_key: k, partitions: 1}}\n"
        "substreams:\n"
        f"  - {{name: a, stream: orders, field: ts, {a}}}\n"
        f"  - {{name: b, stream: orders, field: ts, {b}}}\n"
    )
    return load_config_text(text, SCHEMA.with_name("advice.yaml"))


WINDOW = "kind: tumbling, size_ms: 10000, seal: {lateness_ms: 0, late: dead_letter}"
SESSIONS = "kind: session, key: key, gap_ms: 30000, seal: {lateness_ms: 2000, late: raise}"


def test_a_session_lateness_below_a_windows_size_is_warned_with_its_consequence() -> None:
    # both ways: a record just past a window's end is late for it and on time for the
    # sessions too (1..2000 ms behind)
    window_late, warning = late_for_one(config_of(WINDOW, SESSIONS))
    assert window_late.startswith(
        "stream 'orders': a record 1..2000 ms of event time behind the latest can be late for "
        "substream 'a'")
    assert "kept out of 'a' only and dead-lettered naming it" in window_late
    assert warning.startswith(
        "stream 'orders': a record 2001..9999 ms of event time behind the latest can be late "
        "for substream 'b' (session, gap 30000 ms, lateness_ms 2000, late: raise) and on "
        "time for 'a' (tumbling, 10000 ms windows, lateness_ms 0, late: dead_letter)")
    assert "refused whole and 'a' loses it too" in warning
    assert "lateness_ms of at least 9999" in warning


def test_equal_policies_and_nested_windows_are_not_warned() -> None:
    assert late_for_one(config_of(WINDOW, WINDOW)) == []
    manual = "kind: session, key: key, gap_ms: 5"
    assert late_for_one(config_of(WINDOW, manual)) == []  # sealed by hand: nothing to say
    ten = "kind: tumbling, size_ms: 10, seal: {lateness_ms: 0}"
    five = "kind: tumbling, size_ms: 5, seal: {lateness_ms: 0}"
    # late for the 10 ms windows => late for the 5 ms ones; not the other way round
    assert [w.split(" (")[0] for w in late_for_one(config_of(ten, five))] == [
        "stream 'orders': a record 1..9 ms of event time behind the latest can be late for "
        "substream 'b'"
    ]


def test_config_check_prints_the_warning_and_succeeds(tmp_path: Path) -> None:
    path = tmp_path / "orders.yaml"
    path.write_text(
        "streams:\n"
        f"  - {{name: orders, schema: {SCHEMA}, order_key: k, partitions: 1}}\n"
        "substreams:\n"
        f"  - {{name: revenue, stream: orders, field: ts, {WINDOW}}}\n"
        f"  - {{name: sessions, stream: orders, field: ts, {SESSIONS}}}\n"
    )
    res = CliRunner().invoke(command, ["check", "-c", str(path)])
    assert res.exit_code == 0, res.output
    assert f"warning: {path}: stream 'orders': a record 2001..9999 ms" in res.stderr
    assert "ok (1 streams, 2 substreams" in res.stdout


POLICY = st.tuples(
    st.sampled_from(["tumbling", "hopping", "session"]),
    st.sampled_from([1, 2, 3, 5, 10]),
    st.sampled_from([0, 1, 4, 7]),
)


def _yaml(kind: str, width: int, lateness: int) -> str:
    shape = {"tumbling": f"size_ms: {width}", "hopping": f"size_ms: {2 * width}, "
             f"slide_ms: {width}", "session": f"key: key, gap_ms: {width}"}[kind]
    return f"kind: {kind}, {shape}, seal: {{lateness_ms: {lateness}}}"


@functools.cache
def _late_sets(sub: SubstreamConfig, policy: SealPolicy) -> frozenset[tuple[int, int]]:
    """Every (event time, highest event time written) where a record is late for ``sub``,
    by the policy's own clock (its first record at 0), over two periods of every width."""
    late = set()
    for high in range(0, 80):
        clock = SealClock(sub, policy, 0)
        clock.published(0, 0)
        seal = clock.published(high, 0)
        sealed = seal.upto if seal is not None else clock.sealed
        for e in range(0, high + 1):
            t = e if sub.kind == "session" else e // (sub.pane_ms or 1)
            if sealed is not None and t <= sealed:
                late.add((e, high))
    return frozenset(late)


@settings(max_examples=200, deadline=None)
@given(a=POLICY, b=POLICY)
def test_the_warning_is_given_exactly_when_a_record_can_be_late_for_one_only(
    a: tuple[str, int, int], b: tuple[str, int, int]
) -> None:
    config = config_of(_yaml(*a), _yaml(*b))
    sa, sb = config.substreams
    assert sa.seal is not None and sb.seal is not None
    late_a, late_b = _late_sets(sa, sa.seal), _late_sets(sb, sb.seal)
    warned = {w.split("late for substream '")[1][0] for w in late_for_one(config)}
    assert ("a" in warned) == bool(late_a - late_b)
    assert ("b" in warned) == bool(late_b - late_a)
