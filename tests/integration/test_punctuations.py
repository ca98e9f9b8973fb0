"""Punctuations on a real broker: 3+ producers x 4 partitions, firm/soft bound, order, leaving
and late producers, the aligner service's control records, traffic counts, the CLI, and the
aligner's restart from its checkpoint after a SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Producer

from substreams.app import Application
from substreams.config import Config, load_config
from substreams.control.io import read_control
from substreams.control.messages import EpochComplete, FrontierSnapshot
from substreams.control.ranges import read_ranges
from substreams.control.traffic import PUNCTUATION_READ, PUNCTUATION_WRITTEN, TRAFFIC
from substreams.punctuation.aligner import Event, Late, Released, Terminated
from substreams.punctuation.hook import register
from substreams.punctuation.reader import PunctuatedReader
from substreams.punctuation.service import PunctuationAligner
from substreams.streams.deadletter import REASON_LATE, UndeliveredError
from substreams.streams.publisher import Publisher
from tests.conftest import ConfigFactory, read_dead_letters
from tests.unit.test_dead_letters import FlakyProducer

P, Q, SIZE = 3, 4, 1000
ROOT = Path(__file__).resolve().parents[2]


def example_substream() -> dict[str, Any]:
    """The example config's ``clicks_1s_punct``, as make_config wants it."""
    sub = load_config(ROOT / "substreams.yaml").substream("clicks_1s_punct")
    return {
        "name": "win",
        "stream": "clicks",
        "kind": sub.kind,
        "field": sub.field,
        "size_ms": sub.size_ms,
        "mechanism": sub.mechanism,
        "bound": sub.bound,
        "ordered": sub.ordered,
    }


def setup(
    make_config: ConfigFactory, acker: dict[str, Any] | None = None, **overrides: Any
) -> tuple[Config, str, str]:
    config = make_config(
        [{"name": "clicks", "partitions": Q}], [{**example_substream(), **overrides}], acker=acker
    )
    return config, config.streams[0].name, config.substreams[0].name


def publishers(config: Config, stream: str, n: int = P, first: int = 0) -> list[Publisher]:
    return [
        Application(config).publisher(stream, f"src-{i}", batch_size=7)
        for i in range(first, first + n)
    ]


def workload(
    pubs: list[Publisher],
    sub: str,
    windows: Iterable[int],
    rng: random.Random,
    per: int = 8,
    seal: bool = True,
) -> Counter[Any]:
    """Each producer writes ``per``-ish records per window then seals it; producers' steps are
    interleaved randomly.  Returns the records sent per window."""
    scripts: list[list[tuple[str, int]]] = []
    for _ in pubs:
        script: list[tuple[str, int]] = []
        for w in windows:
            script += [("record", w)] * rng.randrange(1, per + 1)
            if seal:
                script.append(("seal", w))
        scripts.append(script)
    sent: Counter[Any] = Counter()
    last = [0] * len(pubs)
    while any(scripts):
        i = rng.choice([i for i, s in enumerate(scripts) if s])
        kind, w = scripts[i].pop(0)
        if kind == "seal":
            pubs[i].seal(sub, w)
        else:
            last[i] = max(last[i] + 1, w * SIZE)
            payload = {"user": f"u{i}", "url": "/", "ts": last[i]}
            pubs[i].publish(payload, partition=rng.randrange(Q))
            sent[w] += 1
    for p in pubs:
        p.flush()
    return sent


def read_until(
    reader: PunctuatedReader, done: Callable[[list[Event]], bool], timeout: float = 30.0
) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + timeout
    while not done(events):
        assert time.monotonic() < deadline, f"gave up; got {events[-5:]}"
        events += reader.poll(0.2)
    return events


def terminated(events: list[Event]) -> list[Any]:
    return [ev.time for ev in events if isinstance(ev, Terminated)]


def check_firm(events: list[Event], sent: Counter[Any]) -> None:
    """Every record of w delivered before Terminated(w), none after; nothing lost."""
    over: set[Any] = set()
    released: Counter[Any] = Counter()
    for ev in events:
        if isinstance(ev, Released):
            t = next(iter(ev.entry.times.values()))
            assert t not in over, f"record of {t} after its termination"
            released[t] += 1
        elif isinstance(ev, Terminated):
            assert released[ev.time] == sent[ev.time] == ev.records
            over.add(ev.time)
    assert not [ev for ev in events if isinstance(ev, Late)]


def test_firm_bound_and_order_three_producers_four_partitions(make_config: ConfigFactory) -> None:
    config, stream, sub = setup(make_config)
    rng = random.Random(1)
    pubs = publishers(config, stream)
    sent = workload(pubs, sub, range(4), rng)
    with PunctuatedReader(config, sub) as reader:
        events = read_until(reader, lambda evs: len(terminated(evs)) == 4)
    assert terminated(events) == [0, 1, 2, 3]
    check_firm(events, sent)
    for p in pubs:
        p.close()


def test_firm_holds_later_records_until_earlier_time_terminates(make_config: ConfigFactory) -> None:
    config, stream, sub = setup(make_config)
    rng = random.Random(2)
    pubs = publishers(config, stream)
    sent = workload(pubs, sub, [0], rng, seal=False)
    with PunctuatedReader(config, sub) as reader:
        events = read_until(
            reader, lambda evs: sum(isinstance(e, Released) for e in evs) == sent[0]
        )
        sent += workload(pubs, sub, [1], rng, seal=False)
        events += read_until(reader, lambda evs: reader.aligner.held() == sent[1])
        events += reader.poll(0.5)
        # time 0 is known and open: no record of 1 may pass
        assert sum(isinstance(e, Released) for e in events) == sent[0]
        assert not terminated(events)
        for p in pubs:
            p.seal(sub, 0)
        events += read_until(reader, lambda evs: 0 in terminated(evs))
    check_firm(events, sent)
    after = events[next(i for i, e in enumerate(events) if isinstance(e, Terminated)) :]
    assert sum(isinstance(e, Released) for e in after) == sent[1]
    assert reader.aligner.held() == 0
    for p in pubs:
        p.close()


def test_soft_bound_releases_before_alignment(make_config: ConfigFactory) -> None:
    config, stream, sub = setup(make_config, bound="soft")
    rng = random.Random(3)
    pubs = publishers(config, stream)
    sent = workload(pubs, sub, [0, 1], rng, seal=False)
    with PunctuatedReader(config, sub) as reader:
        events = read_until(
            reader, lambda evs: sum(isinstance(e, Released) for e in evs) == sent.total()
        )
        assert not terminated(events)  # released although nothing is aligned yet
        for p in pubs:
            p.seal(sub, 1)
        events += read_until(reader, lambda evs: len(terminated(evs)) == 2)
    assert terminated(events) == [0, 1]
    for p in pubs:
        p.close()


def test_producer_leaving_does_not_block(make_config: ConfigFactory) -> None:
    config, stream, sub = setup(make_config)
    rng = random.Random(4)
    pubs = publishers(config, stream)
    sent = workload(pubs[:2], sub, [0], rng)
    leaver = pubs[2]
    leaver.publish({"user": "x", "url": "/", "ts": 10}, partition=1)
    sent[0] += 1
    with PunctuatedReader(config, sub) as reader:
        events = read_until(reader, lambda evs: reader.caught_up)
        events += reader.poll(0.5)
        assert not terminated(events)  # src-2 has not sealed 0
        leaver.close()  # UNREGISTER in every partition
        events += read_until(reader, lambda evs: terminated(evs) == [0])
    check_firm(events, sent)
    for p in pubs[:2]:
        p.close()


def test_latecomer_registering_with_a_start_time_does_not_hold_back_earlier_times(
    make_config: ConfigFactory,
) -> None:
    config, stream, sub = setup(make_config)
    rng = random.Random(9)
    pubs = publishers(config, stream)
    sent = workload(pubs, sub, [0], rng, seal=False)
    late = Application(config).publisher(
        stream, "latecomer"
    )  # REGISTER with no start: blocks time 0
    register(late, sub, 1)  # ...until it says it only writes times >= 1
    for p in pubs:
        p.seal(sub, 0)
    with PunctuatedReader(config, sub) as reader:
        events = read_until(reader, lambda evs: terminated(evs) == [0])
        late.publish({"user": "late", "url": "/", "ts": 1500}, partition=0)
        late.flush()
        more = read_until(reader, lambda evs: any(isinstance(e, Released) for e in evs))
        assert [e.entry.source for e in more if isinstance(e, Released)] == ["latecomer"]
        events += more
    check_firm(events, sent)
    assert reader.aligner.producers()["latecomer"] == 1
    for p in [*pubs, late]:
        p.close()


def test_late_producer_record_goes_to_dead_letter(make_config: ConfigFactory) -> None:
    config, stream, sub = setup(make_config)
    rng = random.Random(5)
    pubs = publishers(config, stream)
    workload(pubs, sub, [0], rng)
    with PunctuationAligner(config, sub) as service:
        deadline = time.monotonic() + 30
        while service.tracker.completed < 1:
            assert time.monotonic() < deadline
            service.step()
        with Application(config).publisher(stream, "latecomer") as late:
            late.publish({"user": "late", "url": "/", "ts": 500}, partition=2)
        # its dead letter cannot be delivered: the step raises before a checkpoint
        service._letters._producer = cast(Producer, FlakyProducer(failures=2))
        checkpoints = service.checkpoints
        with pytest.raises(UndeliveredError):
            while time.monotonic() < deadline:
                service.step()
        assert service.late == 1 and service.checkpoints == checkpoints
        service._letters._producer = None  # the broker again: the next step delivers it
        service.step()
        assert service._letters.pending == 0
    [letter] = read_dead_letters(config)  # the one format of every service
    assert (letter.service, letter.reason) == (f"aligner.{sub}", REASON_LATE)
    assert (letter.topic, letter.partition, letter.source) == (stream, 2, "latecomer")
    assert "terminated" in letter.detail and letter.offset >= 0
    assert json.loads(letter.raw) == {"user": "late", "url": "/", "ts": 500}
    for p in pubs:
        p.close()


def epoch_completes(config: Config, sub: str) -> list[EpochComplete]:
    recs = read_control(config.kafka.bootstrap, config.acker.control_topic(sub), config)
    return [r.body for _, r in recs if isinstance(r.body, EpochComplete)]


def run_service(
    service: PunctuationAligner, until: Callable[[], bool], timeout: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline
        service.step()


def test_service_epoch_complete_ranges_hold_exactly_each_time(make_config: ConfigFactory) -> None:
    config, stream, sub = setup(make_config, acker={"snapshot_every": 2})
    rng = random.Random(6)
    pubs = publishers(config, stream)
    sent_records: list[Any] = []
    sent = workload(pubs, sub, range(3), rng)
    with PunctuationAligner(config, sub) as service:
        run_service(service, lambda: service.tracker.completed == 3)
    completes = epoch_completes(config, sub)
    assert [c.time for c in completes] == [0, 1, 2]
    for c in completes:
        got = read_ranges(config.kafka.bootstrap, config, c.ranges, sub, c.time)
        assert len(got) == c.records == sent[c.time]
        assert all(e.payload["ts"] // SIZE == c.time for e in got)
        sent_records += got
    assert len({(e.partition, e.index) for e in sent_records}) == sent.total()
    # the snapshot after the 2nd completion tells a late subscriber where time 2 starts
    [snap] = [
        r.body
        for _, r in read_control(config.kafka.bootstrap, config.acker.control_topic(sub), config)
        if isinstance(r.body, FrontierSnapshot)
    ]
    data_from = {r.partition: r.start for r in snap.data_from}
    assert all(data_from[r.partition] <= r.start for r in completes[2].ranges)
    assert list(snap.lower) == [] or all(t >= 2 for t in snap.lower)  # type: ignore[operator]

    # restart: nothing is announced twice, new times continue the chain
    more = workload(pubs, sub, [3], rng)
    with PunctuationAligner(config, sub) as again:
        run_service(again, lambda: again.tracker.completed == 4)
        for _ in range(5):
            again.step(0.1)
    completes = epoch_completes(config, sub)
    assert [c.time for c in completes] == [0, 1, 2, 3]
    assert completes[3].records == more[3]
    for p in pubs:
        p.close()


def test_traffic_is_p_times_q_per_seal_written_and_per_task_read(
    make_config: ConfigFactory,
) -> None:
    config, stream, sub = setup(make_config)
    rng = random.Random(7)
    pubs = publishers(config, stream)
    assert TRAFFIC.get(PUNCTUATION_WRITTEN, sub) == P * Q  # REGISTER
    before = TRAFFIC.get(PUNCTUATION_WRITTEN, sub)
    workload(pubs, sub, range(3), rng)
    assert TRAFFIC.get(PUNCTUATION_WRITTEN, sub) - before == 3 * P * Q
    read_before = TRAFFIC.get(PUNCTUATION_READ, sub)
    tasks = [PunctuatedReader(config, sub, partitions=part) for part in ([0, 1, 2], [3])]
    try:
        for task in tasks:
            events = read_until(task, lambda evs: len(terminated(evs)) == 3)
            assert terminated(events) == [0, 1, 2]
            events += task.poll(0.3)
            # REGISTER + 3 SEALs from each producer in each of this task's partitions
            assert task.punctuations_read == 4 * P * len(task.partitions)
    finally:
        for task in tasks:
            task.close()
    assert TRAFFIC.get(PUNCTUATION_READ, sub) - read_before == 4 * P * Q
    for p in pubs:
        p.close()
    assert TRAFFIC.get(PUNCTUATION_WRITTEN, sub) - before == 4 * P * Q  # + UNREGISTER


def test_align_cli_runs_until_interrupted(make_config: ConfigFactory) -> None:
    config, stream, sub = setup(make_config)
    pubs = publishers(config, stream, n=1)
    workload(pubs, sub, [0, 1], random.Random(8))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "substreams",
            "align",
            "-c",
            str(config.path),
            "--substream",
            sub,
            "--verbose",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert lines[0].startswith("terminated 0 records=") and lines[1].startswith("terminated 1")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped: 2 times complete" in err
    pubs[0].close()


def test_align_cli_refuses_an_acker_substream(make_config: ConfigFactory) -> None:
    config, _, sub = setup(make_config, mechanism="acker")
    result = subprocess.run(
        [sys.executable, "-m", "substreams", "align", "-c", str(config.path), "--substream", sub],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"substream '{sub}' is tracked by the acker" in result.stderr


@pytest.mark.parametrize("name", ["clicks_1s_punct"])
def test_example_config_defines_a_punctuation_substream(name: str) -> None:
    sub = load_config(ROOT / "substreams.yaml").substream(name)
    assert (sub.mechanism, sub.kind, sub.bound, sub.ordered) == (
        "punctuations",
        "tumbling",
        "firm",
        True,
    )


class AlignProcess:
    """One `substreams align` process, its log in a file."""

    def __init__(self, config: Config, sub: str, log: Path) -> None:
        self.log = log
        self.handle = log.open("ab")
        cmd = [sys.executable, "-m", "substreams", "--log-level", "INFO", "align", "-c",
               str(config.path), "--substream", sub]
        self.proc = subprocess.Popen(cmd, stdout=self.handle, stderr=subprocess.STDOUT, cwd=ROOT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.handle.close()


def test_a_sigkilled_aligner_restarts_from_its_checkpoint_exactly_once(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    """The aligner is SIGKILLed twice while producers write and seal windows; each restart
    continues from its checkpoint (not from offset 0), and every window is announced exactly
    once, in order, with exactly its records."""
    import threading

    from substreams.control.verify import verify_config

    # A long heartbeat: between two, only the checkpoints written with the notifications
    # tell a restart where it stands (one written apart from them would be stale by then).
    config, stream, sub = setup(make_config, acker={"heartbeat_ms": 2000, "snapshot_every": 5})
    windows = 36
    rng = random.Random(11)
    pubs = publishers(config, stream)
    sent: Counter[Any] = Counter()
    errors: list[BaseException] = []

    def announced() -> list[Any]:
        return [c.time for c in epoch_completes(config, sub)]

    def produce() -> None:
        """At most 8 windows ahead of the aligner: the stream is still going at each kill,
        however slowly a loaded machine runs the aligner."""
        try:
            for w in range(windows):
                sent.update(workload(pubs, sub, [w], rng, per=4))
                deadline = time.monotonic() + 60
                while w - len(announced()) > 8 and time.monotonic() < deadline:
                    time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, announced()
            time.sleep(0.01)

    runs = [AlignProcess(config, sub, tmp_path / "align0.log")]
    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    try:
        for i, at in enumerate((6, 16)):
            wait_for(lambda at=at: len(announced()) >= at)  # type: ignore[misc]
            runs[-1].kill()  # just after a notification: no last commit
            assert len(announced()) < windows  # mid-stream
            runs.append(AlignProcess(config, sub, tmp_path / f"align{i + 1}.log"))
            wait_for(lambda: "recovery in" in runs[-1].text())
        writer.join(120)
        assert not errors, errors
        wait_for(lambda: len(announced()) >= windows)
        time.sleep(1.0)  # anything announced twice would be there by now
    finally:
        for run in runs:
            if run.proc.poll() is None:
                run.kill()
        for p in pubs:
            p.close()
    completes = epoch_completes(config, sub)
    assert [c.time for c in completes] == list(range(windows))  # once each, in order
    for c in completes:
        assert c.records == sent[c.time], c
        got = read_ranges(config.kafka.bootstrap, config, c.ranges, sub, c.time)
        assert len(got) == c.records and all(e.payload["ts"] // SIZE == c.time for e in got)
    # nothing read twice as if late (a restart that re-read what its checkpoint had applied
    # would dead-letter those records)
    assert [x for x in read_dead_letters(config) if x.service == f"aligner.{sub}"] == []
    for run in runs[1:]:  # the restarts continued from a checkpoint, mid-stream
        text = run.text()
        assert "recovery in" in text and "checkpoint of" in text, text[-2000:]
        assert "no checkpoint" not in text
    assert all(r.ok for r in verify_config(config)), [r.broken for r in verify_config(config)]
