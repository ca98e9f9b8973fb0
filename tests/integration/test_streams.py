"""Typed streams on a real broker: publish/listen, starting points, fencing, schema checks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from confluent_kafka import TopicPartition

from substreams.app import Application
from substreams.errors import (
    OrderKeyRegressionError,
    PublisherAlreadyAcquiredError,
    PublisherFencedError,
    SchemaMismatchError,
)
from substreams.streams.listener import Listener
from tests.conftest import CLICK_SCHEMA, ConfigFactory


def clicks(n: int, start: int = 0, users: int = 5) -> list[dict[str, object]]:
    return [{"user": f"u{i % users}", "url": f"/p{i}", "ts": start + i} for i in range(n)]


def read_all(listener: Listener, idle: float = 0.5) -> list:
    return [e for e in listener.entries(idle_timeout=idle)]


def test_multi_partition_round_trip_keeps_per_partition_order(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks", "partitions": 4}])
    stream = config.streams[0].name
    with Application(config).publisher(stream, "src-a", batch_size=37) as pub:
        sent = [pub.publish(c, key=str(c["user"])) for c in clicks(200, users=16)]
    assert len({r.partition for r in sent}) == 4
    with Listener(config, stream) as listener:
        got = read_all(listener)
        assert listener.state == "caught_up"
    assert sorted(e.payload["ts"] for e in got) == list(range(200))
    assert Counter(e.partition for e in got) == Counter(r.partition for r in sent)
    for p in range(4):
        ks = [e.order_key for e in got if e.partition == p]
        assert ks == sorted(ks)
        # the same key always lands in the same partition
    users_by_partition = {e.payload["user"]: e.partition for e in got}
    assert all(users_by_partition[e.payload["user"]] == e.partition for e in got)
    assert {e.source for e in got} == {"src-a"}


def test_listener_from_index_and_stop_after_n(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks", "partitions": 1}])
    stream = config.streams[0].name
    with Application(config).publisher(stream, "src") as pub:
        for c in clicks(50):
            pub.publish(c)
    with Listener(config, stream, from_index=10, max_entries=5) as listener:
        got = list(listener)
        assert listener.finished
    # transaction markers take offsets too, so compare against what index 10 holds
    with Listener(config, stream) as everything:
        all_entries = read_all(everything)
    expected = [e for e in all_entries if e.index >= 10][:5]
    assert [e.payload for e in got] == [e.payload for e in expected]


def test_listener_from_order_key_until_order_key(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks", "partitions": 3}])
    stream = config.streams[0].name
    with Application(config).publisher(stream, "src", batch_size=10) as pub:
        for c in clicks(300, start=1000):
            pub.publish(c)
    with Listener(config, stream, from_order_key=1150, until_order_key=1199) as listener:
        got = list(listener)
    assert sorted(e.order_key for e in got) == list(range(1150, 1200))


def test_listener_reports_behind_then_caught_up(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks", "partitions": 2}])
    stream = config.streams[0].name
    with Application(config).publisher(stream, "src") as pub:
        for c in clicks(20):
            pub.publish(c)
    with Listener(config, stream) as listener:
        assert listener.state == "behind"
        got = read_all(listener, idle=0.3)
        assert len(got) == 20 and listener.state == "caught_up"
        with Application(config).publisher(stream, "src2") as pub:
            pub.publish({"user": "x", "url": "/", "ts": 99})
        entry = listener.poll(5.0)
        assert entry is not None and entry.payload["user"] == "x"


def test_a_zero_timeout_still_reads_what_is_buffered(make_config: ConfigFactory) -> None:
    """``poll(0.0)`` fetches once, as confluent-kafka's ``poll(0)`` does: a record already
    fetched is returned, not None; and a reader at its end is at its end with a zero timeout."""
    from substreams.kafka.read import Reader

    config = make_config([{"name": "clicks", "partitions": 1}])
    stream = config.streams[0].name
    with Application(config).publisher(stream, "src", batch_size=10) as pub:
        for c in clicks(10):
            pub.publish(c)
    with Listener(config, stream) as listener:
        first = listener.poll(30.0)  # the fetch that brings the whole transaction
        assert first is not None and first.payload["ts"] == 0
        second = listener.poll(0.0)
        assert second is not None and second.payload["ts"] == 1
    with Reader(config.kafka.bootstrap, config, name=stream) as reader:
        reader.assign([TopicPartition(stream, 0, 0)])
        assert len(list(reader.iter_to_end(30.0))) == 10
        assert list(reader.iter_to_end(0.0)) == []  # caught up: no timeout error


def test_second_publisher_in_process_is_refused(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks"}])
    stream = config.streams[0].name
    with Application(config).publisher(stream, "only"):
        with pytest.raises(PublisherAlreadyAcquiredError, match="already acquired"):
            Application(config).publisher(stream, "only")
        Application(config).publisher(stream, "other").close()  # another source id is fine
    Application(config).publisher(stream, "only").close()  # released on close


def test_publisher_in_another_process_fences_this_one(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks"}])
    stream = config.streams[0].name
    pub = Application(config).publisher(stream, "shared")
    pub.publish({"user": "a", "url": "/", "ts": 1})
    pub.flush()
    script = textwrap.dedent(
        f"""
        from substreams.config import load_config
        from substreams.app import Application
        cfg = load_config({str(config.path)!r})
        with Application(cfg).publisher({stream!r}, "shared") as p:
            p.publish({{"user": "b", "url": "/", "ts": 2}})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    with pytest.raises(PublisherFencedError, match="fenced"):
        pub.publish({"user": "a", "url": "/", "ts": 3})
        pub.flush()
    pub.abort()
    with Listener(config, stream) as listener:
        got = [e.payload["user"] for e in read_all(listener)]
    assert got == ["a", "b"]  # the fenced write never became visible


def test_order_key_regression_raises_before_writing(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks"}])
    stream = config.streams[0].name
    with Application(config).publisher(stream, "src") as pub:
        pub.publish({"user": "a", "url": "/", "ts": 10})
        with pytest.raises(OrderKeyRegressionError, match="ts=9 is below the previous 10"):
            pub.publish({"user": "a", "url": "/", "ts": 9})
        pub.publish({"user": "a", "url": "/", "ts": 10})  # equal keys are fine
    with Listener(config, stream) as listener:
        assert [e.order_key for e in read_all(listener)] == [10, 10]


def test_reader_refuses_unknown_schema_fingerprint(make_config: ConfigFactory, tmp_path) -> None:
    writer_cfg = make_config([{"name": "clicks"}])
    stream = writer_cfg.streams[0].name
    with Application(writer_cfg).publisher(stream, "src") as pub:
        pub.publish({"user": "a", "url": "/", "ts": 1})
    # A reader whose schema for the same topic has one more field.
    import dataclasses

    other = dict(CLICK_SCHEMA, fields=[*CLICK_SCHEMA["fields"], {"name": "extra", "type": "int"}])
    sc = dataclasses.replace(writer_cfg.streams[0], schema=other, on_bad_record="fail")
    reader_cfg = dataclasses.replace(writer_cfg, streams=(sc,))
    with Listener(reader_cfg, stream) as listener, pytest.raises(SchemaMismatchError) as err:
        read_all(listener)
    assert "fingerprint" in str(err.value) and f"{stream}[0]@0 (undecodable)" in str(err.value)
    # a registered writer schema this reader cannot resolve: undecodable.  The default,
    # on_bad_record: dead_letter -- refused (not decoded into garbage), passed over
    reader_cfg = dataclasses.replace(
        writer_cfg, streams=(dataclasses.replace(sc, on_bad_record="dead_letter"),))
    with Listener(reader_cfg, stream) as listener:
        assert list(listener.entries(idle_timeout=0.5)) == []
        assert listener.dead_lettered == 1


def test_payload_not_matching_schema_is_a_clear_error(make_config: ConfigFactory) -> None:
    from substreams.errors import SubstreamsError

    config = make_config([{"name": "clicks"}])
    with (
        Application(config).publisher(config.streams[0].name, "src") as pub,
        pytest.raises(SubstreamsError, match="does not match schema"),
    ):
        pub.publish({"user": 5, "url": "/", "ts": 1})


def test_read_ranges_waits_while_records_arrive_and_fails_on_a_stall(
    make_config: ConfigFactory,
) -> None:
    """``read_ranges``' timeout bounds a stall, not the read: a range whose records keep
    arriving is read in full although the whole read takes longer than the timeout, and a
    range past the end of its partition fails naming the partition and where it stopped."""
    import threading
    import time

    from substreams.control.messages import OffsetRange
    from substreams.control.ranges import read_ranges
    from substreams.errors import SubstreamsError

    config = make_config([{"name": "clicks", "partitions": 1}])
    stream = config.streams[0].name
    app = Application(config)
    n, pause, timeout = 16, 0.6, 5.0
    # One record per transaction: each takes at least one offset (two with its commit
    # marker), so the range [0, end) ends inside the trickle, ~(n - 2) pauses after it began.
    end = 2 * n - 4
    opened = threading.Event()

    def trickle() -> None:
        with app.publisher(stream, "src", batch_size=1) as pub:
            opened.set()
            for c in clicks(n):
                pub.publish(c)
                time.sleep(pause)

    writer = threading.Thread(target=trickle)
    writer.start()
    try:
        assert opened.wait(120)
        started = time.monotonic()
        got = read_ranges(
            config.kafka.bootstrap, config, [OffsetRange(stream, 0, 0, end)], timeout=timeout
        )
        took = time.monotonic() - started
    finally:
        writer.join()
    with Listener(config, stream) as listener:
        expected = [e.payload["ts"] for e in read_all(listener) if e.index < end]
    assert len(expected) >= end // 2
    assert took > timeout  # the read outlasted its timeout ...
    assert [e.payload["ts"] for e in got] == expected  # ... and got every record in range

    with pytest.raises(SubstreamsError, match=rf"no progress for 1.0 s: {stream}\[0\]<"):
        read_ranges(
            config.kafka.bootstrap, config, [OffsetRange(stream, 0, 0, 1000)], timeout=1.0
        )
