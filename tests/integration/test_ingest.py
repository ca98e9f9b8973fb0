"""A stream over an existing topic written by a plain confluent-kafka producer
(``substreams ingest``): exact windows through SIGKILLs, bad and late records dead-lettered
with their input offsets, instances splitting the partitions."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from substreams.config import Config, TopicSpec
from substreams.ingest import Ingest, source_id
from substreams.kafka import client
from substreams.kafka.topics import ensure_topics
from substreams.streams.deadletter import REASON_LATE
from substreams.streams.foreign import REASON_MISFIT, REASON_NOT_JSON
from tests.conftest import ConfigFactory, read_dead_letters
from tests.integration.test_acker import FAST, acker, check_exactly_once, wait_notifications

SIZE = 100
LATENESS = 50
ROOT = Path(__file__).resolve().parents[2]


def foreign_config(
    make_config: ConfigFactory, partitions: int = 4, *, idle_ms: int | None = None,
    fmt: str = "json", extra: dict[str, Any] | None = None,
) -> Config:
    """A stream ``clicks`` over a new topic ``legacy-<uuid>`` of ``partitions`` partitions,
    with 100 ms tumbling windows sealed by policy (lateness 50 ms, late: dead_letter)."""
    topic = f"legacy-{uuid.uuid4().hex[:8]}"
    seal: dict[str, Any] = {"lateness_ms": LATENESS, "late": "dead_letter"}
    if idle_ms is not None:
        seal["idle_ms"] = idle_ms
    config = make_config(
        [{"name": "clicks", "partitions": partitions, "order_key": None,
          "source": {"topic": topic, "format": fmt, **(extra or {})}}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "field": "ts",
          "size_ms": SIZE, "seal": seal}],
        acker=FAST,
    )
    ensure_topics(client.admin(config.kafka.bootstrap), [TopicSpec(topic, partitions)])
    return config


def plain_producer(config: Config) -> Producer:
    """What another team's service would use: no transactions, no envelope."""
    return Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 5})


def topic_of(config: Config) -> str:
    source = config.streams[0].source
    assert source is not None
    return source.topic


def plan(partitions: int, per_partition: int, seed: int) -> list[tuple[int, int, str]]:
    """(partition, ts, url) in production order: each partition's event times out of order
    by up to 30 ms (< the 50 ms lateness: none is late), partitions interleaved."""
    rng = random.Random(seed)
    out = []
    for i in range(per_partition):
        for p in range(partitions):
            out.append((p, max(0, i * 2 - rng.randint(0, 30)), f"/{p}/{i}"))
    return out


def closers(rows: list[tuple[int, int, str]], partitions: int) -> list[tuple[int, int, str]]:
    """A record per partition just far enough ahead to seal every window of ``rows`` (and
    no later one: a sealed window without records would be announced, empty)."""
    ts = (max(t for _, t, _ in rows) // SIZE + 1) * SIZE + LATENESS
    return [(p, ts, f"/{p}/closer") for p in range(partitions)]


def produce(producer: Producer, topic: str, rows: list[tuple[int, int, str]],
            pause_every: int = 0, pause_s: float = 0.0) -> None:
    for n, (p, ts, url) in enumerate(rows):
        value = json.dumps({"user": f"u{n % 5}", "url": url, "ts": ts}).encode()
        producer.produce(topic, value, key=url.encode(), partition=p)
        if pause_every and n % pause_every == pause_every - 1:
            producer.flush(10)
            time.sleep(pause_s)
    producer.flush(30)


def truth(rows: list[tuple[int, int, str]]) -> dict[int, list[tuple[str, str]]]:
    sent: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for p, ts, url in rows:
        sent[ts // SIZE].append((source_id(p), url))
    return sent


def spawn_ingest(config: Config, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "substreams.cli.main", "--log-level", "INFO", "ingest",
         "-c", str(config.path), "--stream", config.streams[0].name, "--progress", "0.5",
         *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def wait_progress(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until the ingest process says it wrote records (a progress line); whether it
    did within ``timeout``.  Its stderr is read on to the end by a thread (never blocks it)."""
    said = threading.Event()
    assert proc.stderr is not None
    stderr = proc.stderr

    def follow() -> None:
        for raw in stderr:
            line = raw.decode(errors="replace")
            if line.startswith("read ") and " written 0 " not in line:
                said.set()

    threading.Thread(target=follow, daemon=True).start()
    return said.wait(timeout)


@contextmanager
def running(ingest: Ingest) -> Iterator[Ingest]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            ingest.run(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield ingest
    finally:
        stop.set()
        thread.join(30)
    if errors:
        raise errors[0]


def test_sigkilled_ingest_gives_exact_windows_of_a_plain_json_topic(
    make_config: ConfigFactory,
) -> None:
    """A plain producer writes JSON while the ingest process is SIGKILLed three times at
    random moments and restarted: every window is notified once, in order, with exactly
    the records the producer wrote into it, and the stream holds each record once."""
    config = foreign_config(make_config)
    topic, sub = topic_of(config), config.substreams[0].name
    rows = plan(4, 150, seed=3)
    rng = random.Random(7)
    producer = plain_producer(config)
    kills = 0
    with acker(config):
        writer = threading.Thread(target=produce, args=(producer, topic, rows, 10, 0.25))
        writer.start()  # ~15 s of writes
        mid_stream = 0
        for _ in range(3):
            proc = spawn_ingest(config)
            # killed once it has written records, at a random moment of its loop (reading,
            # writing, committing), while the producer still writes
            said = wait_progress(proc, timeout=30)
            time.sleep(rng.uniform(0.0, 0.4))
            writing = writer.is_alive()
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
            mid_stream += writing and said
        writer.join(60)
        produce(producer, topic, closers(rows, 4))
        last = spawn_ingest(config)
        try:
            sent = truth(rows)
            got = check_exactly_once(config, sub, sent, set(sent))
        finally:
            last.send_signal(signal.SIGTERM)
            _, err = last.communicate(timeout=30)
        assert last.returncode == 0, err.decode()[-2000:]
    assert kills == 3 and mid_stream == 3
    assert sum(n.records for n in got) == len(rows)
    assert b"read " in err  # progress lines


def test_ingest_of_a_stream_without_source_is_a_one_line_error(
    make_config: ConfigFactory,
) -> None:
    from click.testing import CliRunner

    from substreams.cli.main import cli

    config = make_config([{"name": "clicks"}], create=False)
    got = CliRunner().invoke(cli, ["ingest", "-c", str(config.path), "--stream",
                                   config.streams[0].name])
    assert got.exit_code == 2
    assert "has no source topic to follow" in got.output
    assert "Traceback" not in got.output


def test_bad_and_late_records_are_dead_lettered_with_their_offsets(
    make_config: ConfigFactory,
) -> None:
    """Not JSON, a payload that does not fit the schema, and a record after its window was
    sealed: each dead-lettered with the topic, partition and offset it has in the foreign
    topic (the late one naming the substream it missed); the ingest never stops and the
    windows hold exactly the good, on-time records."""
    config = foreign_config(make_config, partitions=1)
    topic, sub = topic_of(config), config.substreams[0].name
    producer = plain_producer(config)
    values: list[bytes] = []
    for i in range(30):
        values.append(json.dumps({"user": "u", "url": f"/{i}", "ts": i * 10}).encode())
    values.append(b"\x00\x01 not json")                                          # offset 30
    values.append(json.dumps({"user": 7, "url": "/misfit", "ts": 301}).encode())  # 31
    values.append(json.dumps({"user": "u", "url": "/late", "ts": 5}).encode())    # 32: late
    values.append(json.dumps({"user": "u", "url": "/notime"}).encode())           # 33
    values.append(json.dumps({"user": "u", "url": "/closer", "ts": 350}).encode())
    for v in values:
        producer.produce(topic, v, partition=0)
    producer.flush(30)
    with acker(config), Ingest(config, config.streams[0].name) as ingest:
        deadline = time.monotonic() + 30
        while ingest.counts().records < len(values) and time.monotonic() < deadline:
            ingest.step(0.1)
        counts = ingest.counts()
        notes = wait_notifications(config, sub, 3)
    assert counts.records == len(values)
    assert counts.bad == 3 and counts.late == {sub: 1}
    assert [(n.time, n.records) for n in notes] == [(0, 10), (1, 10), (2, 10)]
    letters = {d.offset: d for d in read_dead_letters(config) if d.topic == topic}
    assert sorted(letters) == [30, 31, 32, 33]
    assert letters[30].reason == REASON_NOT_JSON and letters[30].raw == values[30]
    assert letters[31].reason == REASON_MISFIT and "user" in letters[31].detail
    assert letters[32].reason == REASON_LATE and letters[32].substreams == (sub,)
    assert letters[33].reason == REASON_MISFIT
    assert all(d.partition == 0 for d in letters.values())


def test_two_instances_split_the_partitions(make_config: ConfigFactory) -> None:
    """Instance 0 of 2 follows partitions 0 and 2, instance 1 partitions 1 and 3; together
    they give the exact windows, and instance 0 alone seals nothing until instance 1 has
    followed its partitions once (or windows would close without them)."""
    config = foreign_config(make_config)
    topic, sub = topic_of(config), config.substreams[0].name
    rows = plan(4, 60, seed=11)
    producer = plain_producer(config)
    produce(producer, topic, rows + closers(rows, 4))
    stream = config.streams[0].name
    with acker(config):
        first = Ingest(config, stream, instance=0, instances=2)
        assert first.partitions == [0, 2]
        with running(first):
            deadline = time.monotonic() + 20
            while first.counts().records < 2 * 61 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert first.counts().records == 2 * 61
            assert not first.sealing  # partitions 1 and 3 never followed yet
            second = Ingest(config, stream, instance=1, instances=2)
            assert second.partitions == [1, 3]
            with running(second):
                sent = truth(rows)
                check_exactly_once(config, sub, sent, set(sent))


def test_confluent_avro_topic_across_two_schema_ids(make_config: ConfigFactory) -> None:
    """confluent-kafka's own AvroSerializer (registering through its SchemaRegistryClient)
    writes the Schema Registry wire format with two writer schemas -- the second reorders
    the fields and adds one with a default -- and the ingest resolves both ids into the
    stream's schema: exact windows; a record of an id the registry does not know is
    dead-lettered with its offset.  The registry is a double (tests/registry_double.py says
    why no real one runs here)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from substreams.streams.foreign import REASON_UNKNOWN_ID, confluent_frame
    from tests.conftest import CLICK_SCHEMA
    from tests.registry_double import registry_double

    v2 = {**CLICK_SCHEMA, "fields": [
        {"name": "ts", "type": "long"}, {"name": "url", "type": "string"},
        {"name": "user", "type": "string"},
        {"name": "referrer", "type": ["null", "string"], "default": None}]}
    with registry_double() as url:
        config = foreign_config(make_config, partitions=2, fmt="confluent-avro",
                                extra={"registry_url": url})
        topic, sub = topic_of(config), config.substreams[0].name
        registry = SchemaRegistryClient({"url": url})
        ctx = SerializationContext(topic, MessageField.VALUE)
        one = AvroSerializer(registry, json.dumps(CLICK_SCHEMA))
        two = AvroSerializer(registry, json.dumps(v2))
        producer = plain_producer(config)
        rows = plan(2, 40, seed=5)
        for i, (p, ts, u) in enumerate(rows):
            if i < len(rows) // 2:
                value = one({"user": f"u{i % 5}", "url": u, "ts": ts}, ctx)
            else:
                value = two({"user": f"u{i % 5}", "url": u, "ts": ts, "referrer": "x"}, ctx)
            assert value is not None and value[0] == 0
            producer.produce(topic, value, partition=p)
        producer.flush(30)
        ids = {int.from_bytes(v[1:5], "big") for v in (
            one({"user": "a", "url": "/", "ts": 0}, ctx),
            two({"user": "a", "url": "/", "ts": 0, "referrer": None}, ctx)) if v}
        assert len(ids) == 2  # two schema ids in the topic
        producer.produce(topic, confluent_frame(999, b"\x00"), partition=0)  # offset 40
        producer.flush(30)
        for p, ts, u in closers(rows, 2):
            producer.produce(topic, one({"user": "c", "url": u, "ts": ts}, ctx), partition=p)
        producer.flush(30)
        with acker(config), running(Ingest(config, config.streams[0].name)):
            sent = truth(rows)
            check_exactly_once(config, sub, sent, set(sent))
    letters = [d for d in read_dead_letters(config) if d.topic == topic]
    assert [(d.reason, d.partition, d.offset) for d in letters] == [(REASON_UNKNOWN_ID, 0, 40)]


def test_a_replaced_ingest_is_fenced(make_config: ConfigFactory) -> None:
    """A second process following the same partitions fences the first: the first's next
    commit raises PublisherFencedError (it writes nothing more), the second goes on from the
    committed offsets and the windows stay exact."""
    import pytest

    from substreams.errors import PublisherFencedError

    config = foreign_config(make_config, partitions=2)
    topic, sub = topic_of(config), config.substreams[0].name
    rows = plan(2, 60, seed=2)
    producer = plain_producer(config)
    produce(producer, topic, rows[:60])
    stream = config.streams[0].name
    with acker(config):
        old = Ingest(config, stream)
        deadline = time.monotonic() + 20
        while old.counts().records < 60 and time.monotonic() < deadline:
            old.step(0.1)
        old.flush()
        new = spawn_ingest(config)  # another process: its publishers fence these
        try:
            produce(producer, topic, rows[60:])
            assert wait_progress(new, timeout=60)  # started (fenced the old), wrote records
            produce(producer, topic, closers(rows, 2))  # the old one reads, cannot commit
            with pytest.raises(PublisherFencedError):
                for _ in range(400):
                    old.step(0.05)
                    old.flush()
            old.close()
            sent = truth(rows)
            check_exactly_once(config, sub, sent, set(sent))
        finally:
            new.send_signal(signal.SIGTERM)
            new.wait(30)


def test_quiet_partitions_seal_by_idleness_once_read_to_their_end(
    make_config: ConfigFactory,
) -> None:
    """No closing record: partition 0 gets a burst of clicks at the clock's event times,
    partition 1 nothing at all.  Each partition, read to its end and quiet for idle_ms,
    seals up to the clock on its own, so the burst's windows close with exactly its
    records, and nothing was late."""
    config = foreign_config(make_config, partitions=2, idle_ms=300)
    topic, sub = topic_of(config), config.substreams[0].name
    producer = plain_producer(config)
    now = int(time.time() * 1000)
    rows = [(0, now - 400 + i * 10, f"/0/{i}") for i in range(30)]
    produce(producer, topic, rows)
    sent = truth(rows)
    with acker(config), running(Ingest(config, config.streams[0].name)) as ingest:
        deadline = time.monotonic() + 30
        notes = wait_notifications(config, sub, len(sent))
        while not set(sent) <= {n.time for n in notes} and time.monotonic() < deadline:
            notes = wait_notifications(config, sub, len(notes) + 1, timeout=2)
        assert ingest.counts().late == {}
    times = [n.time for n in notes]
    assert len(times) == len(set(times)) and sorted(times) == times
    # the burst's windows with exactly its records; an idle seal's own time is announced
    # empty (a seal of a time without records opens it)
    assert {n.time: n.records for n in notes if n.records} == {
        w: len(v) for w, v in sent.items()}


def test_avro_single_object_topic(make_config: ConfigFactory) -> None:
    """A producer writing Avro single-object encoding of the stream's schema (no envelope):
    exact windows; a JSON record among them is dead-lettered as not single-object."""
    from substreams.streams.foreign import REASON_NOT_AVRO
    from substreams.streams.schemas import Codec

    config = foreign_config(make_config, partitions=2, fmt="avro")
    topic, sub = topic_of(config), config.substreams[0].name
    codec = Codec(config.streams[0].schema)
    producer = plain_producer(config)
    rows = plan(2, 40, seed=9)
    for i, (p, ts, u) in enumerate(rows + closers(rows, 2)):
        if i == 10:
            producer.produce(topic, b'{"user": "j", "url": "/", "ts": 1}', partition=p)
        producer.produce(topic, codec.encode_single({"user": f"u{i % 5}", "url": u, "ts": ts}),
                         partition=p)
    producer.flush(30)
    with acker(config), running(Ingest(config, config.streams[0].name)):
        sent = truth(rows)
        check_exactly_once(config, sub, sent, set(sent))
    letters = [d for d in read_dead_letters(config) if d.topic == topic]
    assert [(d.reason, d.partition, d.offset) for d in letters] == [(REASON_NOT_AVRO, 0, 5)]
