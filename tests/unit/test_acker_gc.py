"""A started acker collects young garbage less often (issue #16 session 9), never more."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from substreams.acker.service import GC_GEN0_THRESHOLD, relax_gc


@pytest.fixture(autouse=True)
def restore_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_raises_only_the_youngest_generation() -> None:
    gc.set_threshold(700, 10, 10)
    relax_gc()
    assert gc.get_threshold() == (GC_GEN0_THRESHOLD, 10, 10)


def test_never_lowers_a_higher_threshold_nor_enables_a_disabled_collector() -> None:
    gc.set_threshold(10 * GC_GEN0_THRESHOLD, 5, 5)
    relax_gc()
    assert gc.get_threshold() == (10 * GC_GEN0_THRESHOLD, 5, 5)
    gc.set_threshold(0, 10, 10)  # threshold 0: automatic collection off
    relax_gc()
    assert gc.get_threshold() == (0, 10, 10)
