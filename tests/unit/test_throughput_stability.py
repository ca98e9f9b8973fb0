"""``bench throughput``'s own stability: the median and spread of a line's runs, the rule
that marks a line too short to compare (its ratios and targets are then not measured), the
broker-CPU peer target, and reading CPU time from ``/proc/<pid>/stat``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from substreams_bench.harness import cpu_ticks, jit_cpu_ticks, jit_ticks_between
from substreams_bench.throughput import (
    ACKER_MANY,
    MAX_SPREAD,
    MIN_RUN_S,
    OVER_100,
    QUIX,
    TOO_SHORT,
    UNTRACKED_MANY,
    Run,
    _row,
    compare,
    cpu_target,
    fixed_part,
    spread,
    targets,
    too_short,
)


def test_spread_is_the_range_over_the_median() -> None:
    assert spread([90.0, 100.0, 120.0]) == pytest.approx(0.3)
    assert spread([100.0]) is None  # one run has no spread


def test_a_row_is_the_median_run_with_its_spread_and_cpu_per_1k() -> None:
    runs = [Run(2.0, 0.4, 0.1, 1.0), Run(2.5, 0.6, 0.4, 1.2), Run(1.6, 0.5, 0.2, 0.9)]
    row = _row("acker", 1, 10000, runs, None)
    assert row["seconds"] == 2.0 and row["records_per_s"] == 5000.0
    assert row["spread"] == pytest.approx((6250 - 4000) / 5000, abs=1e-4)
    assert row["broker_cpu_ms_per_1k"] == 50.0  # median 0.5 s over 10 000 records
    assert row["broker_jit_ms_per_1k"] == 20.0  # median 0.2 s
    assert row["broker_warm_ms_per_1k"] == 30.0  # median of 0.3, 0.2, 0.3 s without JIT
    assert row["client_cpu_ms_per_1k"] == 100.0
    assert row["too_short"] is not None  # spread 45 % > 20 %


def test_without_the_broker_pid_the_broker_cpu_is_not_measured() -> None:
    row = _row("raw", None, 10000, [Run(2.0, None, None, 1.0), Run(2.0, None, None, 1.0)], None)
    assert row["broker_cpu_ms_per_1k"] is None and row["client_cpu_ms_per_1k"] == 100.0
    assert row["broker_warm_ms_per_1k"] is None


def test_too_short_by_run_time_or_by_spread() -> None:
    assert too_short(MIN_RUN_S * 2, MAX_SPREAD / 2) is None
    assert "median run" in (too_short(MIN_RUN_S / 2, 0.0) or "")
    assert "spread" in (too_short(MIN_RUN_S * 2, MAX_SPREAD * 2) or "")


def test_fixed_part_is_fitted_from_two_record_counts() -> None:
    # 0.2 s fixed + records / 50 000 per s
    assert fixed_part(2000, 0.2 + 0.04, 10000, 0.2 + 0.2) == pytest.approx(0.2)


def _line(line: str, g: int | None, records: int, rate: float, **kw: Any) -> dict[str, Any]:
    return {"line": line, "granularity": g, "records": records, "records_per_s": rate,
            "complete": True, "error": None, "too_short": None, **kw}


def test_a_short_line_is_not_compared_and_its_targets_are_not_measured() -> None:
    short = "median run 0.31 s < 1 s"
    rows = [
        _line("raw", None, 10000, 100.0, too_short=short),
        _line(UNTRACKED_MANY, None, 2000, 10.0, too_short=short),
        _line(ACKER_MANY, 1, 2000, 16.0, too_short=short),
    ]
    assert compare(rows[2], rows[1], capped=True) == TOO_SHORT
    got = {t.name: (t.value, t.met) for t in targets(rows)}
    name = "#16 acker publish_many g=1 vs untracked publish_many (same records)"
    assert got[name] == (f"not measured: {TOO_SHORT}", None)
    assert all(not v.endswith("%") or met is None for v, met in got.values())


def test_a_tracked_line_over_100_percent_of_untracked_is_noise_not_a_result() -> None:
    rows = [
        _line("raw", None, 10000, 100.0),
        _line(UNTRACKED_MANY, None, 10000, 40.0),
        _line(ACKER_MANY, 100, 10000, 41.0),
    ]
    assert compare(rows[2], rows[1], capped=True) == OVER_100
    assert compare(rows[0], rows[1]) == 2.5  # a baseline above the untracked line is fine
    got = {t.name: (t.value, t.met) for t in targets(rows)}
    name = "#16 acker publish_many g=100 vs untracked publish_many (same records)"
    assert got[name] == (f"not measured: {OVER_100}", None)


def test_broker_cpu_against_the_quix_peer_leaves_the_jit_compilers_out() -> None:
    quix = _line(QUIX, None, 10000, 50.0, broker_cpu_ms_per_1k=40.0, broker_warm_ms_per_1k=20.0)
    ours = _line(ACKER_MANY, 100, 10000, 40.0, broker_cpu_ms_per_1k=90.0,
                 broker_warm_ms_per_1k=29.0)
    t = cpu_target("cpu", ours, quix)
    assert (t.value, t.met) == (
        "1.45x (29.0 vs 20.0 ms/1k without the JIT compilers; with them 2.25x)", True
    )
    t = cpu_target("cpu", ours | {"broker_warm_ms_per_1k": 31.0}, quix)
    assert t.met is False
    t = cpu_target("cpu", ours | {"too_short": "median run 0.2 s < 1 s"}, quix)
    assert (t.value, t.met) == (f"not measured: {TOO_SHORT}", None)
    t = cpu_target("cpu", ours | {"broker_warm_ms_per_1k": None}, quix)
    assert t.met is None and t.value.startswith("not measured")
    t = cpu_target("cpu", ours, quix | {"error": "not run: no network", "records_per_s": None})
    assert (t.value, t.met) == ("not run: no network", None)


def test_cpu_targets_cover_both_apis_at_g1_and_g100() -> None:
    rows = [
        _line(QUIX, None, 10000, 50.0, broker_warm_ms_per_1k=20.0),
        _line(QUIX, None, 2000, 50.0, broker_warm_ms_per_1k=25.0),
        *(_line(line, g, 2000 if g == 1 else 10000, 40.0, broker_warm_ms_per_1k=30.0)
          for line in ("acker", ACKER_MANY) for g in (1, 100)),
    ]
    got = {t.name: t.met for t in targets(rows) if t.name.startswith("broker CPU")}
    assert got == {
        f"broker CPU/record: {ACKER_MANY} g=1 vs {QUIX} (2,000 records)": True,
        f"broker CPU/record: {ACKER_MANY} g=100 vs {QUIX} (10,000 records)": True,
        f"broker CPU/record: acker g=1 vs {QUIX} (2,000 records)": True,
        f"broker CPU/record: acker g=100 vs {QUIX} (10,000 records)": True,
    }


def test_cpu_ticks_reads_utime_and_stime_after_the_command_name() -> None:
    # the command name may hold spaces and a ')' of its own
    stat = "4242 (java (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 731 269 0 0 20 0 60 0"
    assert cpu_ticks(stat) == 731 + 269


def test_cpu_ticks_of_this_process_grows_with_its_work() -> None:
    path = Path(f"/proc/{os.getpid()}/stat")  # the benchmark runs on Linux
    before = cpu_ticks(path.read_text())
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    assert cpu_ticks(path.read_text()) > before


def test_jit_ticks_count_each_compiler_thread_from_its_own_start() -> None:
    before = {10: 100, 11: 50, 12: 7}
    after = {10: 130, 11: 50, 13: 9}  # 12 ended (HotSpot stops idle compilers), 13 started
    assert jit_ticks_between(before, after) == 30 + 0 + 9
    assert jit_ticks_between(after, before) == 7  # a thread id reused: never negative


def test_a_python_process_has_no_jit_compiler_threads() -> None:
    assert jit_cpu_ticks(os.getpid()) == {}
    assert jit_cpu_ticks(2**22 + 12345) == {}  # no such process
