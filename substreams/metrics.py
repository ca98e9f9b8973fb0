"""Prometheus metrics of the long-running components (acker, aligner, stages, Spark runner).

Why one module low in the layering: every component records into the same process-wide
registry (``prometheus_client``'s default), so a process running several of them (a demo, a
test) exposes one ``/metrics`` page, and each component only needs ``from substreams import
metrics``.  Names follow the Prometheus conventions: a ``substreams_`` prefix, base units
(seconds), ``_total`` on counters (added by the client library), labels for the dimensions
(``writer``/``substream``, ``topic``/``partition``), never one metric per substream.

Values that are expensive or unsafe to read from the scrape thread (open times live in the
service's own dicts) are refreshed by the service's loop through :class:`Periodic`, at most
once a second; ages are computed at scrape time from the recorded timestamps.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

# Seal -> notification latency: the paper reports 1.5-4 ms, our benchmarks tens to hundreds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0)

NOTIFICATIONS = Counter(
    "substreams_notifications",
    "Substream times announced complete (EpochComplete written) by a progress writer.",
    ["writer", "substream"],
)
NOTIFICATION_LATENCY = Histogram(
    "substreams_seal_to_notification_seconds",
    "From the last seal covering a time to its EpochComplete being written.",
    ["writer", "substream"],
    buckets=LATENCY_BUCKETS,
)
OPEN_TIMES = Gauge(
    "substreams_open_times",
    "Times of a substream seen but not yet complete.",
    ["writer", "substream"],
)
OLDEST_OPEN_AGE = Gauge(
    "substreams_oldest_open_time_age_seconds",
    "Age of the oldest open time of a substream (0 when none is open).",
    ["writer", "substream"],
)
DEAD_LETTERS = Counter(
    "substreams_dead_letters",
    "Messages a service could not apply and wrote to the dead-letter topic.",
    ["writer", "reason"],
)
CONTROL_BAD_RECORDS = Counter(
    "substreams_control_bad_records",
    "Control-topic records a follower passed over (undecodable, a broken hash chain, or "
    "written by a writer the config does not trust on that topic: foreign_writer), each also "
    "logged with its topic, partition and offset.",
    ["reader", "topic", "kind"],
)
EVICTIONS = Counter(
    "substreams_source_evictions",
    "Sources the acker evicted, by reason: silent (too long), blocker (its open transaction "
    "held an acks partition), unsealed (held a time unsealed for acker.unsealed_timeout_ms), "
    "operator (evict-source).",
    ["writer", "reason"],
)
OLDEST_UNSEALED_AGE = Gauge(
    "substreams_source_oldest_unsealed_age_seconds",
    "How long a registered source has held the oldest open time of a substream that it has "
    "not sealed (0 when it holds none).  One series per (substream, source) registered there, "
    "removed when the source leaves or is evicted.",
    ["writer", "substream", "source"],
)
RESTARTS = Counter(
    "substreams_restarts",
    "Times a component resumed from its durable state: a process restarted, a recovery after "
    "a failed transaction, a standby taking over, a Spark query restarted from its checkpoint.",
    ["component", "name"],
)
REWINDS = Counter(
    "substreams_rewinds",
    "Micro-batches replayed after a restart (a batch id at or below one already handled).",
    ["component", "name"],
)
INPUT_LAG = Gauge(
    "substreams_input_lag_records",
    "Records of an input partition not yet consumed (high watermark minus position).",
    ["component", "name", "topic", "partition"],
)
RECORDS = Counter(
    "substreams_records",
    "Records a component consumed (direction=in) or produced (direction=out).",
    ["component", "name", "direction"],
)
EPOCHS_HANDLED = Counter(
    "substreams_spark_epochs",
    "Completed epochs a Spark query handed to its operator (on_epoch calls).",
    ["query", "substream"],
)
EPOCH_LATENCY = Histogram(
    "substreams_seal_to_operator_seconds",
    "From the last seal covering an epoch to the Spark operator's on_epoch call.",
    ["query", "substream"],
    buckets=LATENCY_BUCKETS,
)
SERVICE_MESSAGES = Counter(
    "substreams_service_messages",
    "Service messages by kind (punctuations, control records, acks): the trAcker paper's traffic.",
    ["kind", "substream"],
)


def counter_value(counter: Counter, **labels: str) -> float:
    """The current value of one labelled counter (0 when it was never incremented)."""
    name = f"{counter._name}_total"
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def label_values(counter: Counter, label: str, **match: str) -> dict[str, float]:
    """Values of ``counter`` summed by ``label`` over the children matching ``match``."""
    out: dict[str, float] = {}
    for family in counter.collect():
        for s in family.samples:
            if not s.name.endswith("_total"):
                continue
            if all(s.labels.get(k) == v for k, v in match.items()):
                key = s.labels[label]
                out[key] = out.get(key, 0.0) + s.value
    return out


class OpenTimes:
    """The open-times gauges of one progress writer: the age of the oldest open time is
    computed at scrape time from the first-seen timestamp the service last recorded."""

    def __init__(self, writer: str) -> None:
        self.writer = writer
        self._first_seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def update(self, substream: str, open_count: int, oldest_first_seen_ms: int | None) -> None:
        OPEN_TIMES.labels(self.writer, substream).set(open_count)
        with self._lock:
            new = substream not in self._first_seen
            self._first_seen[substream] = (
                0.0 if oldest_first_seen_ms is None else oldest_first_seen_ms / 1000.0
            )
        if new:
            OLDEST_OPEN_AGE.labels(self.writer, substream).set_function(
                lambda: self._age(substream)
            )

    def _age(self, substream: str) -> float:
        with self._lock:
            first = self._first_seen.get(substream, 0.0)
        return 0.0 if first <= 0 else max(0.0, time.time() - first)


class UnsealedAges:
    """The oldest-unsealed-age gauges of one acker: like :class:`OpenTimes`, the age is
    computed at scrape time from the hold's start the service last recorded."""

    def __init__(self, writer: str) -> None:
        self.writer = writer
        self._since: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def update(self, registered: Iterable[tuple[str, str]], holds: Iterable[Any]) -> None:
        """``registered``: every (substream, source) the acker waits for; ``holds``: the
        :class:`~substreams.acker.state.Hold` s (``substream``, ``source``, ``since_ms``)."""
        since = dict.fromkeys(registered, 0.0)
        for h in holds:
            since[(h.substream, h.source)] = h.since_ms / 1000.0
        with self._lock:
            new = since.keys() - self._since.keys()
            gone = self._since.keys() - since.keys()
            self._since = since
        for sub, source in gone:
            with contextlib.suppress(KeyError):
                OLDEST_UNSEALED_AGE.remove(self.writer, sub, source)
        for key in new:
            OLDEST_UNSEALED_AGE.labels(self.writer, *key).set_function(partial(self._age, key))

    def _age(self, key: tuple[str, str]) -> float:
        with self._lock:
            since = self._since.get(key, 0.0)
        return 0.0 if since <= 0 else max(0.0, time.time() - since)


def observe_notification(writer: str, substream: str, sealed_at_ms: int, now_ms: int) -> None:
    """Count one notification and its seal->notification latency (when the seal is known)."""
    observe_notifications(writer, substream, (sealed_at_ms,), now_ms)


def observe_notifications(
    writer: str, substream: str, sealed_at_ms: Iterable[int], now_ms: int
) -> None:
    """:func:`observe_notification` for several notifications of one substream: the metric
    children are looked up once, and the histogram is updated once per distinct seal stamp.
    Why: at one record per time the acker completes thousands of times a step, and a lookup
    and an ``observe`` per time would be a visible share of its CPU; a seal covers every
    time below it, so the times a step completes share a few stamps."""
    latency = NOTIFICATION_LATENCY.labels(writer, substream)
    n = 0
    for sealed, count in Tally(sealed_at_ms).items():
        n += count
        if sealed > 0:  # a seal time of 0 or less is unknown: counted, not timed
            _observe_n(latency, max(0.0, (now_ms - sealed) / 1000.0), count)
    NOTIFICATIONS.labels(writer, substream).inc(n)


def _observe_n(child: Any, amount: float, n: int) -> None:
    """``child.observe(amount)`` ``n`` times, in one update when the histogram child has the
    fields prometheus_client's ``Histogram.observe`` itself updates (it has no weighted
    observe); else one by one.  ``tests/unit/test_acker_metrics.py`` holds the two equal."""
    buckets = getattr(child, "_buckets", None)
    bounds = getattr(child, "_upper_bounds", None)
    total = getattr(child, "_sum", None)
    if buckets is None or bounds is None or total is None:
        for _ in range(n):
            child.observe(amount)
        return
    total.inc(amount * n)
    buckets[bisect_left(bounds, amount)].inc(n)


def record_lag(component: str, name: str, lags: Mapping[tuple[str, int], int]) -> None:
    """Set the lag gauge of every (topic, partition) in ``lags`` (from
    :meth:`substreams.kafka.read.Reader.lag`)."""
    for (topic, partition), lag in lags.items():
        INPUT_LAG.labels(component, name, topic, str(partition)).set(lag)


class Periodic:
    """True at most once per ``seconds``: how loops throttle their gauge refreshes."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds
        self._last = float("-inf")

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


# Process-wide like the registry it serves: a second server on the same address would fail to bind.
_SERVED: dict[tuple[str, int], Any] = {}
_SERVED_LOCK = threading.Lock()


def serve(port: int, host: str = "127.0.0.1") -> int:
    """Expose the registry on ``http://host:port/metrics`` from a daemon thread (once per
    address); returns the port (the chosen one when ``port`` is 0)."""
    with _SERVED_LOCK:
        if port and (host, port) in _SERVED:
            return port
        server, _thread = start_http_server(port, addr=host)
        actual = int(server.server_address[1])
        _SERVED[(host, actual)] = server
    log.info("metrics on http://%s:%d/metrics", host, actual)
    return actual


def first_seen_min(values: Iterable[int]) -> int | None:
    """The smallest positive first-seen timestamp, or None."""
    return min((v for v in values if v > 0), default=None)
