"""Fuzzed bytes on the services' input topics, on a real broker: each undecodable message
goes to the dead-letter topic with the reason, and the service goes on serving.

The messages are valid ones with bytes changed, inserted, dropped or cut (what reaches the
semantic checks), plus random bytes; which of them are undecodable is decided with the
decoders themselves, and every one of those must be dead-lettered.
"""

from __future__ import annotations

import itertools
import logging
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from confluent_kafka import Message, Producer

from substreams.acker.client import AckerClient
from substreams.acker.commands import (
    AllowCompaction,
    Command,
    Peek,
    command_headers,
    decode_command,
    encode_command,
)
from substreams.acker.protocol import (
    AckEntry,
    AckMessage,
    AckReport,
    Register,
    ack_headers,
    decode_ack,
    encode_ack,
)
from substreams.acker.table import SOURCE
from substreams.app import Application
from substreams.errors import DecodeError
from substreams.frontier import Keyed
from substreams.punctuation.aligner import Punctuation
from substreams.punctuation.service import PunctuationAligner
from substreams.streams.deadletter import (
    REASON_FOREIGN,
    REASON_UNDECODABLE,
    REASON_UNKNOWN_SCHEMA,
)
from substreams.streams.framing import EnvelopeEncoder
from substreams.streams.listener import PunctuationEntry, StreamDecoder
from substreams.streams.schemas import protocol_codec
from tests.conftest import CLICK_SCHEMA, ConfigFactory, read_dead_letters

FAST = {"heartbeat_ms": 200, "flush_ms": 2}
FUZZED = 40


def mutate(rng: random.Random, sample: bytes) -> bytes:
    """``sample`` with 1-3 random edits, or (one in eight) random bytes."""
    if rng.random() < 0.125:
        return rng.randbytes(rng.randrange(0, 60))
    raw = bytearray(sample)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(raw) + 1)
        how = rng.choice(["truncate", "set", "insert", "drop"])
        if how == "truncate":
            raw = raw[:at]
        elif how == "set" and at < len(raw):
            raw[at] = rng.randrange(256)
        elif how == "insert":
            raw[at:at] = rng.randbytes(rng.randint(1, 4))
        elif at < len(raw):
            del raw[at]
    return bytes(raw)


def undecodable(decode: Callable[[], object]) -> bool:
    try:
        decode()
    except DecodeError:
        return True
    return False


def produce_all(
    bootstrap: str, topic: str, values: Sequence[tuple[bytes, list[tuple[str, bytes]] | None]]
) -> list[int]:
    """Produce ``values`` to partition 0 of ``topic``; their offsets, in order."""
    producer = Producer({"bootstrap.servers": bootstrap})
    offsets: dict[int, int] = {}

    def delivered(i: int) -> Callable[[Any, Message], None]:
        def cb(err: Any, msg: Message) -> None:
            assert err is None, err
            offsets[i] = msg.offset()

        return cb

    for i, (value, headers) in enumerate(values):
        producer.produce(topic, value, partition=0, headers=headers, on_delivery=delivered(i))
    assert producer.flush(30) == 0
    return [offsets[i] for i in range(len(values))]


def test_acker_process_dead_letters_fuzzed_acks_and_commands(make_config: ConfigFactory) -> None:
    """A real ``substreams acker run`` process (acker + command handler)."""
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker={**FAST, "acks_partitions": 1},
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    rng = random.Random(14)
    acks = [
        encode_ack(
            AckMessage("fz", 3, 9, AckReport((AckEntry("x", Keyed("k", 2), 7, 1, 1, ()),)), "i")
        ),
        encode_ack(AckMessage("fz", 1, 5, Register(("y", "z"), SOURCE, "tx"), "i")),
    ]
    commands = [
        encode_command(Command("fz", "n", 3, Peek("u", "x", Keyed("k", (1, 2))), 7)),
        encode_command(Command("fz", "n", 4, AllowCompaction("x", (5, 6)), 8)),
    ]
    fuzzed_acks = [(mutate(rng, rng.choice(acks)), ack_headers()) for _ in range(FUZZED)]
    fuzzed_cmds = [(mutate(rng, rng.choice(commands)), command_headers()) for _ in range(FUZZED)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "substreams", "--log-level", "INFO", "acker", "run",
         "-c", str(config.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with AckerClient(config) as ctl:
            ctl.connect(timeout=30)
        ack_offsets = produce_all(config.kafka.bootstrap, config.acker.acks_topic, fuzzed_acks)
        cmd_offsets = produce_all(config.kafka.bootstrap, config.acker.command_topic, fuzzed_cmds)
        # the acker still tracks real sources
        with Application(config).publisher(stream, "a") as pub:
            pub.publish({"user": "x", "url": "/1", "ts": 1})
            pub.seal(sub, 1)
        bad_acks = {
            o for o, (v, h) in zip(ack_offsets, fuzzed_acks, strict=True)
            if undecodable(lambda v=v, h=h: decode_ack(v, h))
        }
        bad_cmds = {
            o for o, (v, h) in zip(cmd_offsets, fuzzed_cmds, strict=True)
            if undecodable(lambda v=v, h=h: decode_command(v, h))
        }
        assert len(bad_acks) > FUZZED // 2 and len(bad_cmds) > FUZZED // 2
        wanted = {(config.acker.acks_topic, o) for o in bad_acks} | {
            (config.acker.command_topic, o) for o in bad_cmds
        }
        deadline = time.monotonic() + 30
        letters: dict[tuple[str, int], Any] = {}
        while not wanted <= letters.keys() and time.monotonic() < deadline:
            time.sleep(0.3)
            letters = {
                (d.topic, d.offset): d for d in read_dead_letters(config) if d.reason == "malformed"
            }
        assert wanted <= letters.keys()
        for topic, offset in wanted:
            letter = letters[(topic, offset)]
            assert letter.detail  # the reason, from the decoder
            source = fuzzed_acks if topic == config.acker.acks_topic else fuzzed_cmds
            offsets = ack_offsets if topic == config.acker.acks_topic else cmd_offsets
            assert letter.raw == source[offsets.index(offset)][0]
        with AckerClient(config) as ctl:  # still serving commands after the fuzz
            st = ctl.connect(timeout=30)
        [status] = [s for s in st.substreams if s.substream == sub]
        assert status.last_notification is not None and status.last_notification[0] == 1
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    # the process's own account (--log-level INFO): start, recovery, the command handler's
    # replay, each dead letter
    name = config.acker.name
    assert f"acker '{name}' starting" in err
    assert f"acker '{name}' recovery: no checkpoint" in err
    assert f"acker '{name}' started in" in err
    assert f"acker '{name}' command handler recovery in" in err
    assert err.count("dead letter: malformed") >= len(wanted)


def test_aligner_dead_letters_fuzzed_data_records(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="substreams.punctuation")
    caplog.set_level(logging.INFO, logger="substreams.streams.deadletter")
    caplog.set_level(logging.INFO, logger="substreams.streams.badrecords")
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "win", "stream": "clicks", "kind": "tumbling", "field": "ts", "size_ms": 1000,
          "mechanism": "punctuations", "bound": "firm", "ordered": True}],
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    rng = random.Random(41)
    envelope = EnvelopeEncoder(CLICK_SCHEMA, "fz").encode(
        5, 77, {sub: 0, "w": (1, 2)}, {"user": "u", "url": "/", "ts": 5}
    )
    punct = protocol_codec("punctuation").encode_single(
        Punctuation("SEAL", "fz", "other", Keyed("k", 3), 0).to_wire()
    )
    # single-object encoded, no headers: a mutated prefix is an unknown or missing writer
    # schema (malformed, as an unknown fingerprint header was)
    fuzzed: list[tuple[bytes, list[tuple[str, bytes]] | None]] = [
        (mutate(rng, envelope if i % 2 else punct), None) for i in range(FUZZED)
    ]
    with Application(config).publisher(stream, "a") as pub:
        pub.publish({"user": "x", "url": "/1", "ts": 10}, partition=0)
        pub.flush()
        offsets = produce_all(config.kafka.bootstrap, stream, fuzzed)
        pub.publish({"user": "x", "url": "/2", "ts": 20}, partition=0)
        pub.seal(sub, 0)
    decoder = StreamDecoder(config, stream)

    def decode(value: bytes, headers: list[tuple[str, bytes]] | None) -> object:
        entry = decoder.decode(Message(topic=stream, partition=0, value=value, headers=headers))
        if isinstance(entry, PunctuationEntry):
            return Punctuation.from_wire(entry.fields, 0)
        return entry

    bad = {
        o for o, (v, h) in zip(offsets, fuzzed, strict=True)
        if undecodable(lambda v=v, h=h: decode(v, h))
    }
    assert len(bad) > FUZZED // 2
    with PunctuationAligner(config, sub) as service:
        deadline = time.monotonic() + 30
        while service.tracker.completed < 1 or service.malformed < len(bad):
            assert time.monotonic() < deadline
            service.step()
    letters = read_dead_letters(config)  # reasons as every reader's (streams/badrecords.py)
    assert {d.reason for d in letters} <= {REASON_FOREIGN, REASON_UNKNOWN_SCHEMA,
                                           REASON_UNDECODABLE}
    assert {d.offset for d in letters} == bad and len(letters) == len(bad)
    raw = dict(zip(offsets, (v for v, _ in fuzzed), strict=True))
    for d in letters:  # the acker's format: service, where, the decoder's reason, the bytes
        assert (d.service, d.topic, d.partition) == (f"aligner.{sub}", stream, 0) and d.detail
        assert d.raw == raw[d.offset]
    said = [r.getMessage() for r in caplog.records if r.name == "substreams.punctuation.service"]
    assert any(f"aligner '{sub}' starting" in m for m in said)
    assert any(f"aligner '{sub}' recovery in" in m and "re-reading data topic" in m for m in said)
    # logged once per run of consecutive bad records (and its count), not once per letter
    runs = [len(list(group)) for is_bad, group in
            itertools.groupby(o in bad for o in offsets) if is_bad]
    wrote = [r for r in caplog.records if r.name in ("substreams.streams.deadletter",
                                                     "substreams.streams.badrecords")]
    assert sum(r.levelname == "WARNING" for r in wrote) == len(runs)
    summed = [r.getMessage() for r in wrote if r.levelname == "INFO"]
    assert sorted(int(m.split("run of ")[1].split()[0]) for m in summed) == sorted(
        n for n in runs if n > 1)
