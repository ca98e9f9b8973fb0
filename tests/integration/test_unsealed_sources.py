"""A live source that never seals: registered and heartbeating, so never silent, it holds
every window of its substreams back.  ``acker sources`` (and the checkpoint it reads) says
which time it holds and for how long; with ``acker.unsealed_timeout_ms`` it is evicted on
the record like a silent source, and the held windows are notified in order with the
sealing source's records; without it, it is not evicted and the windows wait."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from prometheus_client import REGISTRY

from substreams import metrics
from substreams.acker.service import latest_state
from substreams.acker.state import SourceLiveness, source_liveness
from substreams.app import Application
from substreams.config import Config
from substreams.errors import PublisherFencedError
from substreams.streams.deadletter import REASON_TERMINATED
from substreams.streams.publisher import Publisher
from substreams.ui.model import DashboardModel
from tests.applied import acks_applied
from tests.conftest import ConfigFactory, follow_notifications, read_dead_letters
from tests.integration.test_acker import acker, check_exactly_once, notifications
from tests.integration.test_publisher_crashes import EPOCH, committed
from tests.integration.test_source_liveness import ROOT, evictions

SOURCE_TIMEOUT_MS = 3000
UNSEALED_MS = 2000
LIVENESS = {"heartbeat_ms": 200, "source_heartbeat_ms": 300,
            "source_timeout_ms": SOURCE_TIMEOUT_MS}


def row(config: Config, source: str) -> SourceLiveness:
    """``source`` as ``acker sources`` lists it (from the latest checkpoint)."""
    found = latest_state(config)
    assert found is not None
    state, written_ms = found
    [r] = [r for r in source_liveness(state, written_ms, SOURCE_TIMEOUT_MS) if r.source == source]
    return r


def held_ms(r: SourceLiveness) -> int:
    assert r.held is not None
    return int(time.time() * 1000) - r.held.since_ms


def wait_held(config: Config, source: str, timeout: float = 15.0) -> SourceLiveness:
    """``source``'s row once it holds a time (the acker may not have checkpointed yet)."""
    deadline = time.monotonic() + timeout
    while True:
        found = latest_state(config)
        holding = found is not None and any(h.source == source for h in found[0].holds)
        if holding or time.monotonic() > deadline:
            return row(config, source)
        time.sleep(0.2)


def write_and_seal(live: Publisher, sub: str, epochs: range) -> None:
    for e in epochs:
        live.publish({"user": "l", "url": f"/live{e}", "ts": e})
        live.seal(sub, e)


def test_a_never_sealing_source_is_shown_holding_and_not_evicted_by_default(
    make_config: ConfigFactory,
) -> None:
    config = make_config([{"name": "clicks", "partitions": 2}], [EPOCH], acker=LIVENESS)
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config) as a, Application(config).publisher(stream, "live") as live:
        holder = Application(config).publisher(stream, "holder")  # registers, heartbeats
        write_and_seal(live, sub, range(3))
        first = wait_held(config, "holder")
        first_ms = held_ms(first)
        assert first.held is not None and (first.held.substream, first.held.time) == (sub, 0)
        assert first.status == "live"
        time.sleep(1.5)
        second = row(config, "holder")
        second_ms = held_ms(second)
        assert second.held == first.held  # the same time, held since the same moment
        assert second_ms >= first_ms + 1500 - 100  # so for longer and longer
        assert row(config, "live").held is None  # it sealed all it wrote
        gauge = {"writer": a.service.name, "substream": sub}
        assert REGISTRY.get_sample_value(
            "substreams_source_oldest_unsealed_age_seconds", {**gauge, "source": "holder"}
        ) >= 1.0
        assert REGISTRY.get_sample_value(
            "substreams_source_oldest_unsealed_age_seconds", {**gauge, "source": "live"}
        ) == 0.0
        board = DashboardModel(config)  # the dashboard's Sources table: the same facts
        board.start()
        try:
            deadline = time.monotonic() + 10
            while True:
                shown = {r["source"]: r for r in board.snapshot().get("sources", ())}
                if shown.get("holder", {}).get("holds") or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            board.close()
        holds = shown["holder"]["holds"]
        assert (holds["substream"], holds["time"]) == (sub, "0"), holds
        # The same hold; its start moves later only by an acker's own stall, which is excused
        # (liveness: a slow acker step does not count against a source; seen under CI load).
        assert first.held.since_ms <= holds["since_ms"] <= first.held.since_ms + 5_000, holds
        assert shown["live"]["holds"] is None
        listed = subprocess.run(
            [sys.executable, "-m", "substreams", "acker", "sources", "-c", str(config.path)],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "COLUMNS": "250"},  # rich truncates cells to fit 80
        )
        assert listed.returncode == 0, listed.stderr
        assert "holds" in listed.stdout and "for" in listed.stdout
        [line] = [x for x in listed.stdout.splitlines() if "holder" in x]
        assert re.search(r"│ 0 +│ \d+\.\d s", line), listed.stdout  # holds 0, for N s
        # Held past the silence timeout plus the unsealed timeout the other test sets:
        time.sleep(max(0.0, (SOURCE_TIMEOUT_MS + UNSEALED_MS + 1000 - held_ms(second)) / 1000))
        acks_applied(config)  # and the acker has read (and judged) past that moment
        assert evictions(config, sub) == [] and notifications(config, sub) == []
        assert row(config, "holder").status == "live"
        holder.close()  # it leaves: the windows it held close
        got = check_exactly_once(config, sub, committed(config, stream), {0, 1, 2})
    assert [n.records for n in got] == [1, 1, 1]
    assert evictions(config, sub) == []


def test_with_the_unsealed_timeout_it_is_evicted_and_the_held_windows_notified(
    make_config: ConfigFactory,
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}], [EPOCH],
        acker={**LIVENESS, "unsealed_timeout_ms": UNSEALED_MS},
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config) as a, Application(config).publisher(stream, "live") as live:
        holder = Application(config).publisher(stream, "holder")
        write_and_seal(live, sub, range(3))
        began = time.monotonic()
        held = wait_held(config, "holder")
        assert held.held is not None and held.held.time == 0
        follow_notifications(config, sub, 3, UNSEALED_MS / 1000 + 15)
        waited = time.monotonic() - began
        got = check_exactly_once(config, sub, committed(config, stream), {0, 1, 2})
        assert [n.records for n in got] == [1, 1, 1]  # exactly the live source's records
        [ev] = evictions(config, sub)
        assert ev.source == "holder" and f"held {sub} time 0 unsealed for" in ev.reason
        assert metrics.counter_value(
            metrics.EVICTIONS, writer=a.service.name, reason="unsealed"
        ) == 1
        assert row(config, "holder").status == "evicted"
        # Evicted (fenced) while alive: it learns so at its next commit, and writes nothing.
        with pytest.raises(PublisherFencedError):
            holder.close()
        # Started again, it writes at a time already notified: not in the window, and not
        # silently lost either -- its report is dead-lettered as late.
        with Application(config).publisher(stream, "holder") as again:
            again.publish({"user": "h", "url": "/late", "ts": 1})
        deadline = time.monotonic() + 10
        while a.service.dead_letters < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert UNSEALED_MS / 1000 - 0.5 < waited < UNSEALED_MS / 1000 + 10, waited
    [letter] = [d for d in read_dead_letters(config) if d.source == "holder"]
    assert letter.reason == REASON_TERMINATED and "time 1" in letter.detail
    assert len(notifications(config, sub)) == 3
