"""Service-message accounting: how much control traffic each mechanism costs.

Why counters in-process (and not broker metrics): the cost that matters in the trAcker paper is the
number of service messages *delivered to processes* — a punctuation read by n consumer tasks
costs n — which only the processes themselves see.  The counts live in the Prometheus
counter ``substreams_service_messages_total{kind, substream}`` (so a scrape sees them);
:class:`Traffic` is the reading side tests and benchmarks use, including ``reset`` between
runs (which a long-running process never calls: Prometheus counters only go up).
"""

from __future__ import annotations

from collections.abc import Mapping

from substreams.metrics import SERVICE_MESSAGES, counter_value, label_values

# Kinds of service messages.
PUNCTUATION_WRITTEN = "punctuation_written"  # one per (punctuation, partition) written
PUNCTUATION_READ = "punctuation_read"  # one per punctuation delivered to a consumer task
CONTROL_WRITTEN = "control_written"  # one per control record written
CONTROL_READ = "control_read"  # one per control record delivered to a subscriber
ACK_SENT = "ack_sent"  # one per message on the acks topic (after local aggregation)
ACK_REPORTS = "ack_reports"  # SND/RCV reports before aggregation (what no aggregation would send)


class Traffic:
    """Counters keyed by (kind, substream), kept in :data:`SERVICE_MESSAGES`."""

    def add(self, kind: str, substream: str, n: int = 1) -> None:
        SERVICE_MESSAGES.labels(kind, substream).inc(n)

    def get(self, kind: str, substream: str | None = None) -> int:
        if substream is not None:
            return int(counter_value(SERVICE_MESSAGES, kind=kind, substream=substream))
        return int(sum(label_values(SERVICE_MESSAGES, "substream", kind=kind).values()))

    def snapshot(self) -> Mapping[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for family in SERVICE_MESSAGES.collect():
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[(s.labels["kind"], s.labels["substream"])] = int(s.value)
        return out

    def reset(self) -> None:
        SERVICE_MESSAGES.clear()


TRAFFIC = Traffic()
