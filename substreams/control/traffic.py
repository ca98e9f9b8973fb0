"""Service-message accounting: how much control traffic each mechanism costs.

Why counters in-process (and not broker metrics): the cost that matters in seed 001 is the
number of service messages *delivered to processes* — a punctuation read by n consumer tasks
costs n — which only the processes themselves see.  Tests and benchmarks read and reset
these counters; they are cheap enough to stay on in production.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

# Kinds of service messages.
PUNCTUATION_WRITTEN = "punctuation_written"  # one per (punctuation, partition) written
PUNCTUATION_READ = "punctuation_read"  # one per punctuation delivered to a consumer task
CONTROL_WRITTEN = "control_written"  # one per control record written
CONTROL_READ = "control_read"  # one per control record delivered to a subscriber
ACK_SENT = "ack_sent"  # one per message on the acks topic (after local aggregation)
ACK_REPORTS = "ack_reports"  # SND/RCV reports before aggregation (what no aggregation would send)


class Traffic:
    """Thread-safe counters keyed by (kind, substream)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, kind: str, substream: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(kind, substream)] += n

    def get(self, kind: str, substream: str | None = None) -> int:
        with self._lock:
            if substream is not None:
                return self._counts[(kind, substream)]
            return sum(v for (k, _), v in self._counts.items() if k == kind)

    def snapshot(self) -> Mapping[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


TRAFFIC = Traffic()
