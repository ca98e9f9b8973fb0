"""``bench throughput``'s ratios: a tracked line is compared with the untracked line of as
many records (a rate over 2 000 records holds more fixed time than one over 10 000)."""

from __future__ import annotations

from typing import Any

from substreams_bench.throughput import ACKER_MANY, QUIX, RAW_TXN, UNTRACKED_MANY, targets


def _row(line: str, g: int | None, records: int, rate: float) -> dict[str, Any]:
    return {
        "line": line, "granularity": g, "records": records, "records_per_s": rate,
        "vs_raw": rate / 100.0,
    }


def test_g1_is_compared_with_the_untracked_line_of_as_many_records() -> None:
    rows = [
        _row("raw", None, 10000, 100.0),
        _row("untracked publisher", None, 10000, 40.0),
        _row(UNTRACKED_MANY, None, 10000, 50.0),
        _row("untracked publisher", None, 2000, 10.0),
        _row(UNTRACKED_MANY, None, 2000, 20.0),
        _row("acker", 1, 2000, 9.0),
        _row("acker", 100, 10000, 38.0),
        _row(ACKER_MANY, 1, 2000, 15.0),
        _row(ACKER_MANY, 100, 10000, 49.0),
    ]
    got = {t.name: t.value for t in targets(rows)}
    assert got["#16 acker publish g=1 vs untracked publish (same records)"] == "90.0%"
    assert got["#16 acker publish_many g=1 vs untracked publish_many (same records)"] == "75.0%"
    assert got["#16 acker publish g=100 vs untracked publish (same records)"] == "95.0%"
    assert got["#16 acker publish_many g=100 vs untracked publish_many (same records)"] == "98.0%"
    # the untracked lines against raw still use the most records
    assert got["#16 untracked publish vs raw"] == "40.0%"
    assert got["#16 untracked publish_many vs raw"] == "50.0%"


def test_a_missing_baseline_is_reported_not_guessed() -> None:
    rows = [
        _row("raw", None, 10000, 100.0),
        _row("untracked publisher", None, 10000, 40.0),
        _row(UNTRACKED_MANY, None, 10000, 50.0),
        _row("acker", 1, 2000, 9.0),
    ]
    got = {t.name: t.value for t in targets(rows)}
    assert got["#16 acker publish g=1 vs untracked publish (same records)"] == "did not finish"


def test_fair_baselines_compare_equal_record_counts() -> None:
    rows = [
        _row("raw", None, 10000, 100.0),
        _row(RAW_TXN, None, 10000, 60.0),
        _row(QUIX, None, 10000, 45.0) | {"error": None},
        _row("untracked publisher", None, 10000, 40.0),
        _row(UNTRACKED_MANY, None, 10000, 50.0),
        _row(QUIX, None, 2000, 10.0) | {"error": None},
        _row("acker", 1, 2000, 9.0),
        _row(ACKER_MANY, 100, 10000, 49.0),
    ]
    got = {t.name: (t.value, t.met) for t in targets(rows)}
    assert got["untracked publish_many vs raw transactional"] == ("83.3%", True)
    assert got["untracked publish vs raw transactional"] == ("66.7%", None)  # reported
    assert got[f"acker g=1 vs {QUIX} (2,000 records)"] == ("90.0%", False)
    assert got[f"{ACKER_MANY} g=100 vs {QUIX} (10,000 records)"] == ("108.9%", True)


def test_quix_not_run_is_a_reason_not_a_miss() -> None:
    rows = [
        _row("raw", None, 10000, 100.0),
        _row(QUIX, None, 10000, 0.0) | {"records_per_s": None, "error": "not run: no network"},
        _row("acker", 100, 10000, 38.0),
    ]
    got = {t.name: (t.value, t.met) for t in targets(rows)}
    assert got[f"acker g=100 vs {QUIX} (10,000 records)"] == ("not run: no network", None)
