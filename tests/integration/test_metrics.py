"""Prometheus metrics scraped over HTTP from a running acker (and the traffic counters)."""

from __future__ import annotations

import time
import urllib.request

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from substreams import metrics
from substreams.acker.protocol import ack_headers
from substreams.acker.service import AckerService
from substreams.app import Application
from substreams.control.traffic import Traffic
from tests.conftest import ConfigFactory
from tests.integration.test_acker import FAST, acker, wait_notifications


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the /metrics page: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def sample(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, **labels: str
) -> float | None:
    """The value of the one sample named ``metric`` whose labels include ``labels``."""
    found = [v for (n, ls), v in samples.items() if n == metric and set(labels.items()) <= ls]
    return found[0] if len(found) == 1 else None


def test_acker_metrics_are_scraped_over_http(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "w", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub, name = config.streams[0].name, config.substreams[0].name, config.acker.name
    port = metrics.serve(0)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    producer.produce(config.acker.acks_topic, b"\x00garbage", headers=ack_headers())
    producer.flush(10)
    with acker(config), Application(config).publisher(stream, "src") as pub:
        for t in range(3):
            pub.publish({"user": "u", "url": f"/{t}", "ts": t})
            pub.seal(sub, t)
        pub.publish({"user": "u", "url": "/open", "ts": 3})  # epoch 3 stays open
        pub.flush()
        assert len(wait_notifications(config, sub, 3)) == 3
        # Until the acker shows the open epoch and has read every report: the publisher is
        # still up and its latest report can land just after a scrape (seen under load).
        deadline = time.monotonic() + 20
        while True:
            got = scrape(port)
            opened = sample(got, "substreams_open_times", writer=name, substream=sub)
            lag = sample(got, "substreams_input_lag_records", component="acker", name=name,
                         topic=config.acker.acks_topic, partition="0")
            if (opened == 1 and lag == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert sample(got, "substreams_notifications_total", writer=name, substream=sub) == 3
    assert sample(got, "substreams_seal_to_notification_seconds_count", writer=name,
                  substream=sub) == 3
    assert opened == 1
    age = sample(got, "substreams_oldest_open_time_age_seconds", writer=name, substream=sub)
    assert age is not None and age > 0
    assert sample(got, "substreams_dead_letters_total", writer=name, reason="malformed") == 1
    assert lag == 0
    restarts = {"component": "acker", "name": name}
    assert metrics.counter_value(metrics.RESTARTS, **restarts) == 0
    again = AckerService(config)  # resumes from the first one's checkpoint
    again.start()
    again.close()
    assert metrics.counter_value(metrics.RESTARTS, **restarts) == 1


def test_traffic_reads_back_the_prometheus_counter() -> None:
    traffic = Traffic()
    traffic.add("kind_a", "sub_x", 3)
    traffic.add("kind_a", "sub_y")
    assert traffic.get("kind_a", "sub_x") == 3
    assert traffic.get("kind_a") == 4
    assert traffic.get("kind_b", "sub_x") == 0
    assert metrics.counter_value(metrics.SERVICE_MESSAGES, kind="kind_a", substream="sub_y") == 1
    traffic.reset()
    assert traffic.get("kind_a") == 0


def test_oldest_open_age_is_computed_at_scrape_time() -> None:
    gauges = metrics.OpenTimes("writer-age-test")
    gauges.update("s", 2, int(time.time() * 1000) - 5000)
    first = metrics.REGISTRY.get_sample_value(
        "substreams_oldest_open_time_age_seconds", {"writer": "writer-age-test", "substream": "s"}
    )
    assert first is not None and first >= 5.0
    gauges.update("s", 0, None)
    assert metrics.REGISTRY.get_sample_value(
        "substreams_oldest_open_time_age_seconds", {"writer": "writer-age-test", "substream": "s"}
    ) == 0.0
    assert metrics.REGISTRY.get_sample_value(
        "substreams_open_times", {"writer": "writer-age-test", "substream": "s"}
    ) == 0.0


def test_stage_counts_records_in_and_out_and_its_input_lag(make_config: ConfigFactory) -> None:
    from substreams.acker.stage import Stage
    from substreams.streams.records import Entry

    config = make_config(
        [{"name": "clicks", "partitions": 2}, {"name": "out", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        [{"name": "dup", "input": "clicks", "output": "out"}],
        acker=FAST,
    )
    stream, stage_name = config.streams[0].name, config.stages[0].name

    def twice(entry: Entry) -> list[dict[str, object]]:
        return [dict(entry.payload), dict(entry.payload)]

    with Application(config).publisher(stream, "src") as pub:
        for ts in range(5):
            pub.publish({"user": "u", "url": f"/{ts}", "ts": ts})
    with Stage(config, stage_name, twice) as stage:
        assert stage.run_until_idle(1.5) == 5
    labels = {"component": "stage", "name": stage_name}
    assert metrics.counter_value(metrics.RECORDS, **labels, direction="in") == 5
    assert metrics.counter_value(metrics.RECORDS, **labels, direction="out") == 10
    lags = {
        p: metrics.REGISTRY.get_sample_value(
            "substreams_input_lag_records", {**labels, "topic": stream, "partition": str(p)}
        )
        for p in (0, 1)
    }
    assert lags == {0: 0.0, 1: 0.0}


def test_spark_handler_counts_epochs_latency_and_rewinds() -> None:
    from substreams.spark.operator import EpochInfo, EpochOperator
    from substreams.spark.runner import EpochBatchHandler

    class Nothing(EpochOperator):
        def on_epoch(self, epoch: object, rows: list[object]) -> list[object]:
            return []

    handler = EpochBatchHandler(Nothing(), None, None, "spark.q-metrics", "unused")
    handler.substream, handler.query_name = "sub", "q-metrics"
    sealed = int(time.time() * 1000) - 2000

    def batch(batch_id: int) -> None:
        handler.handle(batch_id, [EpochInfo(t, t, sealed, 0) for t in (1, 2)])

    batch(0)
    batch(1)
    batch(1)  # Spark replays the batch it had not committed
    q = {"query": "q-metrics", "substream": "sub"}
    assert metrics.counter_value(metrics.EPOCHS_HANDLED, **q) == 6
    assert metrics.counter_value(
        metrics.REWINDS, component="spark", name="q-metrics"
    ) == 1
    count = metrics.REGISTRY.get_sample_value("substreams_seal_to_operator_seconds_count", q)
    total = metrics.REGISTRY.get_sample_value("substreams_seal_to_operator_seconds_sum", q)
    assert count == 6 and total is not None and total >= 6 * 2.0


def test_acker_run_metrics_port_is_scraped(make_config: ConfigFactory) -> None:
    """`substreams acker run --metrics-port 0` as an operator runs it, scraped over HTTP."""
    from tests.integration.test_cli import serving

    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "w", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    args = ("acker", "run", "-c", str(config.path), "--metrics-port", "0")
    with serving(*args) as (_, line):
        assert line.startswith("metrics on http://127.0.0.1:"), line
        port = int(line.split(":")[2].split("/")[0])
        with Application(config).publisher(stream, "src") as pub:
            pub.publish({"user": "u", "url": "/", "ts": 0})
            pub.seal(sub, 0)
        assert len(wait_notifications(config, sub, 1)) == 1
        deadline = time.monotonic() + 20
        value = None
        while value != 1 and time.monotonic() < deadline:
            value = sample(scrape(port), "substreams_notifications_total", substream=sub)
            time.sleep(0.2)
        assert value == 1
