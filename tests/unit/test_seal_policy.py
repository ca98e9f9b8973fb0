"""Seal policies: the pure rule on a simulated clock (event time and clock in, seals out),
and their configuration (file, line, key in every error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.config import SealPolicy, SubstreamConfig, load_config
from substreams.errors import ConfigError
from substreams.streams.policy import PolicySeal, SealClock

TUMBLING = SubstreamConfig("w", "clicks", "tumbling", field="ts", size_ms=1000)
SESSION = SubstreamConfig("s", "clicks", "session", field="ts", key="user", gap_ms=100)
EPOCH = SubstreamConfig("e", "clicks", "epoch", field="epoch")


def test_a_window_is_sealed_once_event_time_passes_its_end_plus_the_lateness() -> None:
    clock = SealClock(TUMBLING, SealPolicy(lateness_ms=500), now_ms=0)
    assert clock.published(200, now_ms=0) is None
    assert clock.published(1_200, now_ms=1) is None  # window 0 ends at 1000: 1000+500 > 1200
    assert clock.published(1_499, now_ms=2) is None
    assert clock.published(1_500, now_ms=3) == PolicySeal("time", 0)
    assert clock.published(1_400, now_ms=4) is None  # an older event time moves nothing
    assert clock.published(4_600, now_ms=5) == PolicySeal("time", 3)  # 1, 2, 3 at once


def test_idleness_seals_up_to_the_clock_minus_the_lateness_and_repeats() -> None:
    clock = SealClock(TUMBLING, SealPolicy(lateness_ms=200, idle_ms=1_000), now_ms=10_000)
    assert clock.idle(10_999) is None
    assert clock.idle(11_000) == PolicySeal("time", 9)  # 11000-200 = 10800: windows <= 9
    assert clock.idle(11_500) is None  # not idle for idle_ms since the last idle seal
    assert clock.idle(12_300) == PolicySeal("time", 11)
    clock.published(12_350, now_ms=12_400)  # a record: idle counts again from here
    assert clock.idle(13_300) is None
    assert clock.watermark == 12_150


def test_sessions_get_keyed_seals_and_epochs_time_seals() -> None:
    s = SealClock(SESSION, SealPolicy(lateness_ms=50), now_ms=0)
    assert s.published(1_000, now_ms=0) == PolicySeal("keys", 949)  # = watermark(950)
    e = SealClock(EPOCH, SealPolicy(lateness_ms=2), now_ms=0)
    assert e.published(3, now_ms=0) is None
    assert e.published(7, now_ms=0) == PolicySeal("time", 4)


def test_no_time_seal_below_the_first_record_but_idleness_seals_before_any() -> None:
    clock = SealClock(TUMBLING, SealPolicy(lateness_ms=0), now_ms=0)
    assert clock.published(5_100, now_ms=0) is None  # windows 0..4 are not this source's
    assert clock.published(6_000, now_ms=0) == PolicySeal("time", 5)
    quiet = SealClock(TUMBLING, SealPolicy(lateness_ms=0, idle_ms=100), now_ms=0)
    assert quiet.idle(7_000) == PolicySeal("time", 6)


def test_per_key_has_no_event_time() -> None:
    with pytest.raises(ValueError, match="per_key"):
        SealClock(SubstreamConfig("k", "clicks", "per_key", key="user"), SealPolicy(), 0)


steps = st.lists(
    st.tuples(st.booleans(), st.integers(0, 5_000), st.integers(0, 3_000)), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(
    steps=steps,
    lateness=st.integers(0, 2_000),
    idle=st.none() | st.integers(1, 2_000),
    size=st.integers(1, 1_500),
)
def test_the_policy_keeps_its_promise(
    steps: list[tuple[bool, int, int]], lateness: int, idle: int | None, size: int
) -> None:
    """Seals only rise; a record the rule lets through (event time >= the watermark) is
    never at a sealed window; and every window from the first record's on that ends at or
    before high - lateness is sealed."""
    sub = SubstreamConfig("w", "clicks", "tumbling", field="ts", size_ms=size)
    clock = SealClock(sub, SealPolicy(lateness_ms=lateness, idle_ms=idle), now_ms=0)
    now = 0
    high: int | None = None
    first: int | None = None
    sealed: int | None = None
    for is_record, event_ms, dt in steps:
        now += dt
        if is_record:
            if clock.watermark is not None and event_ms < clock.watermark:
                continue  # late: the publisher's rule (raise / dead letter) takes it
            if sealed is not None:
                assert event_ms // size > sealed, "an on-time record in a sealed window"
            out = clock.published(event_ms, now)
            high = event_ms if high is None else max(high, event_ms)
            first = event_ms // size if first is None else first
        else:
            out = clock.idle(now)
        if out is not None:
            assert out.kind == "time"
            assert sealed is None or out.upto > sealed
            sealed = out.upto
        if high is not None and first is not None:
            done = (high - lateness) // size - 1
            if done >= first:
                assert sealed is not None and sealed >= done


# -- configuration -------------------------------------------------------------------------

SCHEMA = {
    "type": "record", "name": "Event", "namespace": "t",
    "fields": [{"name": "user", "type": "string"}, {"name": "ts", "type": "long"},
               {"name": "epoch", "type": "long"}],
}


def write(tmp_path: Path, substream: str) -> Path:
    (tmp_path / "event.avsc").write_text(json.dumps(SCHEMA))
    path = tmp_path / "substreams.yaml"
    path.write_text(
        "streams:\n  - name: events\n    schema: event.avsc\n    order_key: ts\n"
        "substreams:\n  - name: w\n    stream: events\n" + substream
    )
    return path


def test_manual_is_the_default_and_a_policy_loads(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "    kind: epoch\n    field: epoch\n")).substreams[0].seal \
        is None
    manual = "    kind: epoch\n    field: epoch\n    seal: manual\n"
    assert load_config(write(tmp_path, manual)).substreams[0].seal is None
    text = (
        "    kind: tumbling\n    size_ms: 1000\n"
        "    seal: {lateness_ms: 500, idle_ms: 2000, late: dead_letter}\n"
    )
    assert load_config(write(tmp_path, text)).substreams[0].seal == SealPolicy(
        lateness_ms=500, idle_ms=2000, late="dead_letter"
    )


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        ("    kind: tumbling\n    size_ms: 10\n    seal: auto\n", 10, "substreams[0].seal",
         "'auto' is not allowed; allowed: manual, or a mapping with lateness_ms, idle_ms, late"),
        ("    kind: tumbling\n    size_ms: 10\n    seal: {lateness_ms: -1}\n", 10,
         "substreams[0].seal.lateness_ms", "-1 is out of range; must be >= 0"),
        ("    kind: tumbling\n    size_ms: 10\n    seal: {lateness: 5}\n", 10,
         "substreams[0].seal.lateness", "unknown key 'lateness'"),
        ("    kind: tumbling\n    size_ms: 10\n    seal: {late: drop}\n", 10,
         "substreams[0].seal.late", "'drop' is not allowed; allowed: raise, dead_letter"),
        ("    kind: per_key\n    key: user\n    seal: {lateness_ms: 5}\n", 10,
         "substreams[0].seal", "per_key times have none"),
        ("    kind: epoch\n    field: epoch\n    seal:\n      idle_ms: 100\n", 11,
         "substreams[0].seal.idle_ms", "epoch numbers are not clock times"),
    ],
)
def test_bad_policies_name_file_line_and_key(
    tmp_path: Path, text: str, line: int, key: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert (err.file, err.line, err.key) == (str(path), line, key)
    assert message in str(err)
    assert str(err).startswith(f"{path}:{line}: {key}: ")
