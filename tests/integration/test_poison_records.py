"""Every reader survives a bad record (issue 43): foreign JSON bytes, a truncated record and a
record of an unregistered schema fingerprint, written by a plain Kafka producer between good
records, are dead-lettered by each reader -- a listener's tail (CLI and HTTP), the firm
notifications with their records, a stage -- with their topic, partition, offset, reason and
raw bytes, and every good record is read exactly once.  ``on_bad_record: fail`` stops the
reader with an error naming topic, partition and offset."""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from confluent_kafka import Producer

from substreams import metrics
from substreams.acker.stage import Stage
from substreams.app import Application
from substreams.config import Config
from substreams.errors import BadRecordError
from substreams.kafka.read import drain
from substreams.streams.listener import Listener
from substreams.streams.records import Entry
from substreams.streams.schemas import SINGLE_OBJECT_MARKER
from substreams.ui.server import serve
from tests.conftest import ConfigFactory, follow_notifications, read_dead_letters
from tests.integration.test_acker import FAST, acker
from tests.integration.test_cli import run

FOREIGN = b'{"order_id": 17, "amount": 9.5, "customer": "c-3"}'


def click(ts: int) -> dict[str, Any]:
    return {"user": f"u{ts}", "url": f"/p{ts}", "ts": ts}


@dataclass
class Poisoned:
    goods: list[int]
    """The ``ts`` of every good record, in order."""
    bad: dict[int, str]
    """Offset (partition 0) -> the reason a reader must give."""
    raw: dict[int, bytes]


def poison(config: Config, plan: Iterable[int | str], seal: str | None = None,
           seal_after: Mapping[int, int] | None = None) -> Poisoned:
    """Write ``plan`` into partition 0 of the config's first stream, in order: an int is a
    good record with that ``ts`` (each committed on its own, so a bad record lands between
    good ones), ``"json"`` foreign JSON bytes, ``"truncated"`` a good record's bytes cut
    short, ``"unregistered"`` a single-object record whose fingerprint no schema has.
    ``seal_after``: after the good record ``ts``, seal window ``w`` of ``seal``."""
    stream = config.streams[0].name
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    template: bytes | None = None
    out = Poisoned([], {}, {})
    reasons = {"json": "foreign_bytes", "truncated": "undecodable",
               "unregistered": "unknown_schema"}
    with Application(config).publisher(stream, "web") as pub:
        for step in plan:
            if isinstance(step, int):
                pub.publish(click(step), partition=0)
                pub.commit()
                out.goods.append(step)
                if seal is not None and seal_after and step in seal_after:
                    pub.seal(seal, seal_after[step])
                if template is None:
                    template = next(iter(drain(config.kafka.bootstrap, config, stream))).value()
                continue
            assert template is not None, "a good record first: its bytes make the bad ones"
            value = {
                "json": FOREIGN,
                "truncated": template[: len(template) // 2],
                "unregistered": SINGLE_OBJECT_MARKER + b"\x5a" * 8 + template[10:],
            }[step]
            offsets: list[int] = []
            producer.produce(stream, value, partition=0, on_delivery=partial(_offset, offsets))
            producer.flush(10)
            out.bad[offsets[0]] = reasons[step]
            out.raw[offsets[0]] = value
    return out


def _offset(into: list[int], err: object, msg: Any) -> None:
    into.append(msg.offset())


PLAN: list[int | str] = [1, "json", 2, "truncated", "unregistered", 3, 4, "json", 5]
"""Three runs of bad records (one of two): every kind, between good ones."""


def letters_of(config: Config, service: str) -> list[tuple[int, str, bytes]]:
    return sorted((d.offset, d.reason, d.raw) for d in read_dead_letters(config)
                  if d.service == service and d.topic == config.streams[0].name)


def expected(p: Poisoned) -> list[tuple[int, str, bytes]]:
    return sorted((o, r, p.raw[o]) for o, r in p.bad.items())


def test_listener_dead_letters_each_kind_logs_a_run_once_and_reads_every_good_record(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="substreams.streams.badrecords")
    config = make_config([{"name": "clicks", "partitions": 1}])
    stream = config.streams[0].name
    p = poison(config, PLAN)
    before = {r: metrics.counter_value(metrics.DEAD_LETTERS, writer=f"listener:{stream}",
                                       reason=r) for r in set(p.bad.values())}
    with Listener(config, stream) as listener:
        got = [e for e in listener.entries(idle_timeout=0.5) if isinstance(e, Entry)]
        assert listener.dead_lettered == len(p.bad)
    assert [e.payload["ts"] for e in got] == p.goods  # each once, in order
    assert letters_of(config, f"listener:{stream}") == expected(p)
    for r in set(p.bad.values()):
        n = sum(1 for v in p.bad.values() if v == r)
        assert metrics.counter_value(metrics.DEAD_LETTERS, writer=f"listener:{stream}",
                                     reason=r) == before[r] + n
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 3, warned  # three runs, four bad records: a line per run
    first = min(p.bad)
    assert f"{stream}[0]@{first} (foreign_bytes" in warned[0]
    ended = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("run of 2 undecodable records" in m for m in ended), ended


def test_tail_cli_and_http_skip_and_dead_letter_bad_records(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks", "partitions": 1}])
    stream = config.streams[0].name
    p = poison(config, PLAN)

    out = run("tail", stream, "-c", str(config.path), "--json")
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["payload"]["ts"] for line in out.stdout.splitlines()] == p.goods
    assert f"{len(p.bad)} undecodable record(s) of '{stream}' dead-lettered" in out.stderr
    assert letters_of(config, f"tail:{stream}") == expected(p)

    server = serve(config, port=0)
    try:
        with urllib.request.urlopen(f"{server.url}tail/{stream}", timeout=30) as resp:
            lines = [json.loads(line) for line in resp.read().splitlines()]
    finally:
        server.stop()
    assert [d["payload"]["ts"] for d in lines] == p.goods
    assert letters_of(config, f"ui.tail:{stream}") == expected(p)  # once per reader run


def test_notifications_with_records_count_unreadable_and_read_every_good_record(
    make_config: ConfigFactory,
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "field": "ts", "size_ms": 100}],
        acker=FAST,
    )
    sub = config.substreams[0].name
    plan: list[int | str] = [5, "json", 20, "truncated", "unregistered", 40, 60, 120,
                             "json", 130, 250]
    with acker(config):
        p = poison(config, plan, seal=sub, seal_after={60: 0, 130: 1, 250: 2})
        with Application(config).notifications(sub, from_="beginning", records=True,
                                                idle_timeout=20) as notes:
            got = []
            for note in notes:
                got.append(note)
                if len(got) == 3:
                    break
    assert [n.time for n in got] == [0, 1, 2]
    assert [[e.payload["ts"] for e in n.entries] for n in got] == [[5, 20, 40, 60],
                                                                    [120, 130], [250]]
    assert [n.records for n in got] == [4, 2, 1]  # the acker never saw a foreign record
    assert [n.unreadable for n in got] == [3, 1, 0]
    assert letters_of(config, f"notifications:{sub}") == expected(p)


def test_a_stage_dead_letters_bad_records_exactly_once_across_restarts(
    make_config: ConfigFactory,
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1}, {"name": "out", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        [{"name": "copy", "input": "clicks", "output": "out"}],
    )
    name, out = config.stages[0].name, config.streams[1].name
    p = poison(config, PLAN)

    def same(entry: Entry) -> Iterable[Mapping[str, Any]]:
        return [entry.payload]

    for expect in ((len(p.goods), len(p.bad)), (0, 0)):  # the restart resumes past them
        with Stage(config, name, same) as stage:
            stage.run_until_idle(1.0)
            assert (stage.processed, stage.dead_letters) == expect
    with Listener(config, out) as copied:
        assert sorted(e.payload["ts"] for e in copied.entries(0.5)
                      if isinstance(e, Entry)) == p.goods
    assert letters_of(config, f"stage.{name}") == expected(p)


def test_on_bad_record_fail_names_topic_partition_and_offset(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1, "on_bad_record": "fail"}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "field": "ts", "size_ms": 100}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config):
        p = poison(config, [5, "truncated", 20], seal=sub, seal_after={20: 0})
        (offset,) = p.bad
        where = f"{stream}[0]@{offset} (undecodable)"
        with Listener(config, stream) as listener, pytest.raises(BadRecordError) as err:
            list(listener.entries(idle_timeout=0.5))
        assert where in str(err.value)
        assert (err.value.topic, err.value.partition, err.value.offset) == (stream, 0, offset)

        with Application(config).notifications(sub, from_="beginning", records=True,
                                                idle_timeout=20) as notes, \
                pytest.raises(BadRecordError, match=rf"{stream}\[0\]@{offset}"):
            list(notes)

    out = run("tail", stream, "-c", str(config.path))
    assert out.returncode == 2 and where in out.stderr and "Traceback" not in out.stderr
    assert out.stdout.splitlines()[0].startswith("0:0 ")  # the record before it was printed

    server = serve(config, port=0)
    try:
        with urllib.request.urlopen(f"{server.url}tail/{stream}", timeout=30) as resp:
            lines = [json.loads(line) for line in resp.read().splitlines()]
    finally:
        server.stop()
    assert lines[0]["payload"]["ts"] == 5 and where in lines[-1]["error"]
    assert letters_of(config, f"tail:{stream}") == []  # fail writes no letter


def _punctuated(make_config: ConfigFactory, on_bad_record: str) -> Config:
    return make_config(
        [{"name": "clicks", "partitions": 1, "on_bad_record": on_bad_record}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "field": "ts", "size_ms": 100,
          "mechanism": "punctuations"}],
    )


def test_the_punctuation_aligner_dead_letters_bad_records_as_every_reader(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The aligner follows ``on_bad_record`` through the shared handler: every reader's
    reasons (not ``malformed``), a log line per run of bad records (not per record), each
    letter once across a restart, and every window announced with its good records."""
    from substreams.punctuation.service import PunctuationAligner

    caplog.set_level(logging.INFO, logger="substreams.streams.badrecords")
    config = _punctuated(make_config, "dead_letter")
    sub = config.substreams[0].name
    plan: list[int | str] = [1, "json", 2, "truncated", "unregistered", 130, 140, "json", 150]
    p = poison(config, plan, seal=sub, seal_after={2: 0, 150: 1})
    with PunctuationAligner(config, sub) as aligner:
        while aligner.tracker.completed < 2 or aligner.malformed < len(p.bad):
            aligner.step()
        assert aligner.malformed == len(p.bad)
    assert letters_of(config, f"aligner.{sub}") == expected(p)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and r.name == "substreams.streams.badrecords"]
    assert len(warned) == 3, warned  # three runs, four bad records: a line per run
    assert f"aligner.{sub}: undecodable record at {config.streams[0].name}[0]@{min(p.bad)}" \
        in warned[0]
    with PunctuationAligner(config, sub) as again:  # from its checkpoint: nothing twice
        again.step()
        while not again.reader.caught_up:
            again.step()
        assert again.malformed == 0  # those re-read past its checkpoint are not sent again
    assert letters_of(config, f"aligner.{sub}") == expected(p)
    notes = follow_notifications(config, sub, 2)
    assert {n.time: n.records for n in notes} == {0: 2, 1: 3}


def test_the_punctuation_aligner_under_on_bad_record_fail_names_where(
    make_config: ConfigFactory,
) -> None:
    from substreams.punctuation.service import PunctuationAligner

    config = _punctuated(make_config, "fail")
    stream, sub = config.streams[0].name, config.substreams[0].name
    p = poison(config, [1, "unregistered", 2], seal=sub, seal_after={2: 0})
    (offset,) = p.bad
    with PunctuationAligner(config, sub) as aligner, \
            pytest.raises(BadRecordError, match=rf"{stream}\[0\]@{offset} \(unknown_schema\)"):
        for _ in range(100):
            aligner.step()
    assert letters_of(config, f"aligner.{sub}") == []  # fail writes no letter
