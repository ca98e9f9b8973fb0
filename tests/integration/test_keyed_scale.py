"""An acker holding many open sessions, SIGKILLed while it writes its changelog.

The acker's state is written as it changes (a delta per transaction, snapshots in chunks
over several transactions: substreams.acker.changelog); this drives a real ``substreams
acker run`` process through 20,000 open sessions -- a state of several snapshot chunks --
killing it at random points of applying them, then closes every session with one keyed
seal: each session is notified exactly once, with its records, and no record the acker
wrote exceeds the 256 KB bound.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

from substreams.acker.changelog import is_changelog, read_header
from substreams.acker.protocol import (
    AckEntry,
    AckMessage,
    AckReport,
    Register,
    SealEntry,
    ack_headers,
    encode_ack,
)
from substreams.acker.service import checkpoint_topic
from substreams.control.io import read_control
from substreams.control.messages import Checkpoint, OffsetRange
from substreams.frontier import Keyed
from substreams.kafka import client
from substreams.kafka.write import produce
from tests.conftest import ConfigFactory
from tests.integration.test_acker import notifications, verify_chains

KEYS = 20_000


def test_sigkilled_acker_holding_many_open_sessions_notifies_each_once(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "sess", "stream": "clicks", "kind": "session", "key": "user",
          "field": "ts", "gap_ms": 30_000}],
        acker={"heartbeat_ms": 100, "source_timeout_ms": 600_000},
    )
    sub = config.substreams[0].name
    settings: dict[str, object] = {"linger.ms": 20}
    producer = client.producer(config.kafka.bootstrap, config, **settings)  # type: ignore[arg-type]
    seq = 0

    def send(body: object) -> None:
        nonlocal seq
        seq += 1
        produce(producer, config.acker.acks_topic,
                encode_ack(AckMessage("src", seq, 0, body, "inc")),  # type: ignore[arg-type]
                partition=0, headers=ack_headers())

    # Two records per key, in 20 messages of 2,000 entries (a publisher's agent's flushes).
    send(Register((sub,), writer="src-writer"))
    entries: list[AckEntry] = []
    for r in range(2):
        for k in range(KEYS):
            at = r * KEYS + k
            entries.append(AckEntry(sub, Keyed(f"user-{k:06d}", 1_000 + 100 * r), 0, 1, 2,
                                    (OffsetRange("clicks", 0, at, at + 1),)))
            if len(entries) == 2_000:
                send(AckReport(tuple(entries), ()))
                entries = []
    producer.flush(60)

    log_path = tmp_path / "acker.log"
    cmd = [sys.executable, "-m", "substreams", "--log-level", "INFO", "acker", "run", "-c",
           str(config.path)]
    rng = random.Random(5)
    with log_path.open("ab") as log:
        for _ in range(4):  # killed at random points while it applies and checkpoints
            since = log_path.stat().st_size
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 60
            while b"' started in " not in log_path.read_bytes()[since:]:
                assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
                time.sleep(0.05)
            time.sleep(rng.uniform(0.2, 2.0))
            proc.kill()
            proc.wait(10)
        send(AckReport((), (SealEntry(sub, 10**12, 1, True),)))  # closes every session
        producer.flush(30)
        since = log_path.stat().st_size
        final = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            got = notifications(config, sub)
            while len(got) < KEYS and time.monotonic() < deadline:
                time.sleep(1.0)
                got = notifications(config, sub)
        finally:
            final.terminate()
            final.wait(30)
    text = log_path.read_text(errors="replace")
    assert "changelog from snapshot" in text, text[-3000:]  # a restart restored a changelog
    keys = [n.time.key for n in got if isinstance(n.time, Keyed)]
    assert len(keys) == len(got) == KEYS, (len(got), text[-3000:])
    assert len(set(keys)) == KEYS, "each session exactly once"
    for n in got:  # each with its two records, nothing else
        assert n.records == 2 and isinstance(n.until, Keyed), n
        k = int(n.time.key.removeprefix("user-"))  # type: ignore[union-attr]
        assert n.ranges == (OffsetRange("clicks", 0, k, KEYS + k + 1),), n  # its 2 records' hull
    # every record the acker wrote is within the bound, and its state went as a changelog
    sizes: list[int] = []
    chunks = 0
    for _, rec in read_control(config.kafka.bootstrap, checkpoint_topic(config), config):
        if isinstance(rec.body, Checkpoint):
            assert is_changelog(rec.body.state)
            sizes.append(len(rec.body.state))
            h = read_header(rec.body.state)
            chunks += h.kind == "snap"
    assert max(sizes) <= 256_000 and chunks >= 2, (max(sizes), chunks)
    verify_chains(config, [checkpoint_topic(config), config.acker.control_topic(sub)])
