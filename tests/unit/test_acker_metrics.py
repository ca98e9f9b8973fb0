"""The grouped notification metrics equal prometheus_client's observe per time."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY

from substreams import metrics


def _samples(writer: str, sub: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for family in REGISTRY.collect():
        if family.name not in (
            "substreams_seal_to_notification_seconds", "substreams_notifications"
        ):
            continue
        for s in family.samples:
            if s.labels.get("writer") == writer and s.labels.get("substream") == sub:
                out[(s.name, s.labels.get("le", ""))] = s.value
    return out


@pytest.mark.parametrize("seed", range(5))
def test_grouped_observe_equals_per_time(seed: int) -> None:
    rng = random.Random(seed)
    now = 1_700_000_000_000
    stamps = [rng.choice([0, -5, now, now - 3, now - 250, now - 4000, now + 7])
              for _ in range(rng.randrange(0, 300))]
    stamps += [now - rng.randrange(0, 20_000) for _ in range(50)]
    rng.shuffle(stamps)
    metrics.observe_notifications("grouped", f"s{seed}", stamps, now)
    reference = metrics.NOTIFICATION_LATENCY.labels("reference", f"s{seed}")
    for sealed in stamps:  # what observe_notifications stands for: observe per time
        if sealed > 0:
            reference.observe(max(0.0, (now - sealed) / 1000.0))
    metrics.NOTIFICATIONS.labels("reference", f"s{seed}").inc(len(stamps))
    got, want = _samples("grouped", f"s{seed}"), _samples("reference", f"s{seed}")
    assert got.keys() == want.keys() and got
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
