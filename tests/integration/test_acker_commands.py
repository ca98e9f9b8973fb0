"""The acker command protocol and `substreams acker ...` on a real broker: sessions, duplicates,
stale commands, peeks, history replay after a restart, and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from confluent_kafka import TopicPartition

from substreams.acker.client import AckerClient, AckerUnavailableError
from substreams.acker.commands import (
    AllowCompaction,
    CancelPeek,
    ConfigureSubstreams,
    CreateInstance,
    Frontiers,
    Hello,
    InitializationComplete,
    Peek,
    PeekResponse,
    Rejected,
    Response,
    StatusRequest,
    StatusResponse,
    decode_response,
)
from substreams.acker.handler import CommandHandler
from substreams.app import Application
from substreams.cli.main import cli
from substreams.config import Config
from substreams.kafka import client
from tests.conftest import ConfigFactory

FAST = {"heartbeat_ms": 200, "flush_ms": 2}
T = TypeVar("T")


def tumbling(make_config: ConfigFactory) -> Config:
    return make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "win", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
        acker=FAST,
    )


@contextmanager
def running_acker(config: Config, **handler_options: Any) -> Iterator[CommandHandler]:
    """An AckerService with the command handler, in a thread; stopped cleanly on exit."""
    service = Application(config).acker(**handler_options)
    handler = service.command_handler
    assert isinstance(handler, CommandHandler)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.run(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        stop.set()
        thread.join(20)  # run() closes the service and its handler
    if errors:
        raise errors[0]


def eventually(probe: Callable[[], T | None], timeout: float = 15.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def all_responses(config: Config) -> list[Response]:
    """Every response on the (per-test) response topic."""
    consumer = client.consumer(config.kafka.bootstrap, config, **{"enable.partition.eof": True})
    consumer.assign([TopicPartition(config.acker.response_topic, 0, 0)])
    out: list[Response] = []
    try:
        while True:
            msgs = consumer.consume(500, 2.0)
            if not msgs:
                return out
            for m in msgs:
                if m.error() is None:
                    out.append(decode_response(m.value(), m.headers()))
            if any(m.error() is not None for m in msgs):
                return out
    finally:
        consumer.close()


def no_answer(ctl: AckerClient, seq: int) -> bool:
    try:
        ctl.wait(seq, timeout=0.5)
    except AckerUnavailableError:
        return True
    return False


def test_status_and_epochs_show_an_unsealed_open_time(
    make_config: ConfigFactory, tmp_path: Any
) -> None:
    config = tumbling(make_config)
    stream, sub = config.streams[0].name, config.substreams[0].name
    runner = CliRunner()
    args = ["-c", str(config.path), "--timeout", "10"]
    with running_acker(config), Application(config).publisher(stream, "src-a") as pub:
        for ts in (100, 200, 300):
            pub.publish({"user": "u", "url": "/", "ts": ts})
        pub.flush()
        with AckerClient(config) as ctl:
            ctl.connect(timeout=10)

            def one_open() -> StatusResponse | None:
                st = ctl.status()
                return st if st.substreams[0].open_times == 1 else None

            st = eventually(one_open)
        assert st.substreams[0].substream == sub
        result = runner.invoke(cli, ["acker", "status", *args])
        assert result.exit_code == 0, result.output
        assert sub in result.output and "acks topic" in result.output
        result = runner.invoke(cli, ["acker", "status", *args, "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        [row] = doc["substreams"]
        assert row["substream"] == sub and row["open_times"] == 1
        assert doc["missing"] == [] and doc["acks"] and doc["acker"] == config.acker.name
        result = runner.invoke(cli, ["acker", "epochs", *args])
        assert result.exit_code == 0, result.output
        line = next(ln for ln in result.output.splitlines() if sub[:8] in ln)
        cells = [c.strip() for c in line.split("│")][1:-1]
        # time 0: its 3 committed records are accounted for (XOR zero: each SND met its
        # RCV on delivery) but the time stays open because src-a has not sealed it
        assert cells[1] == "0" and cells[2] == "0" * 16 and cells[3] == "3"
        assert cells[4] == "src-a"

        # sealing completes window 0; a peek of it then answers from the completed times
        pub.seal(sub, 0)
        with AckerClient(config) as ctl:
            ctl.connect(timeout=10)

            def complete() -> PeekResponse | None:
                r = ctl.peek(sub, 0)
                return r if r.rows and r.rows[0].state == "COMPLETE" and r.rows[0].ranges else None

            done = eventually(complete)
        assert done.rows[0].records == 3 and done.rows[0].ranges[0].stream == stream
        result = runner.invoke(cli, ["acker", "peek", *args, "--substream", sub, "--time", "0"])
        assert result.exit_code == 0, result.output
        assert "COMPLETE" in result.output
        result = runner.invoke(cli, ["acker", "epochs", *args])
        assert "no open times" in result.output


def test_hello_duplicates_and_stale_nonces(make_config: ConfigFactory) -> None:
    config = tumbling(make_config)
    with running_acker(config), AckerClient(config, controller="ctl-a") as ctl:
        hello = ctl.send(Hello())
        reply = ctl.wait(hello.seq, timeout=10)
        assert isinstance(reply.body, StatusResponse) and reply.nonce == ctl.nonce
        assert reply.body.stage.value == "CREATION"
        # a computation command before CreateInstance is rejected, not dropped silently
        early = ctl.send(ConfigureSubstreams((config.substreams[0].name,)))
        rejected = ctl.wait(early.seq)
        assert isinstance(rejected.body, Rejected) and "CREATION" in rejected.body.reason
        ctl.send(CreateInstance())
        ctl.send(InitializationComplete())
        first = ctl.send(StatusRequest())
        assert isinstance(ctl.wait(first.seq).body, StatusResponse)
        # re-delivery of the same (controller, seq): ignored
        ctl.send(StatusRequest(), seq=first.seq)
        later = ctl.send(StatusRequest())
        assert ctl.wait(later.seq).body.stage.value == "COMPUTATION"  # type: ignore[union-attr]
        # a new Hello replaces the session; commands of the old nonce are stale
        old_nonce = ctl.nonce
        ctl.nonce = uuid.uuid4().hex
        ctl.seq = -1
        assert isinstance(ctl.wait(ctl.send(Hello()).seq).body, StatusResponse)
        stale = ctl.send(StatusRequest(), nonce=old_nonce, seq=99)
        probe = ctl.send(StatusRequest())
        assert ctl.wait(probe.seq).body.stage.value == "CREATION"  # type: ignore[union-attr]
    answers = [(r.nonce, r.seq) for r in all_responses(config) if r.controller == "ctl-a"]
    assert answers.count((old_nonce, first.seq)) == 1
    assert (old_nonce, stale.seq) not in answers


def test_peeks_unknown_substream_cancel_and_stale_cancel(make_config: ConfigFactory) -> None:
    config = tumbling(make_config)
    sub = config.substreams[0].name
    with running_acker(config), AckerClient(config) as ctl:
        ctl.connect(timeout=10)
        unknown = ctl.peek("no-such-substream")
        assert unknown.error is not None and "no-such-substream" in unknown.error
        assert sub in unknown.error  # names what the acker does track
        answered = ctl.peek(sub)
        assert answered.error is None and answered.rows == ()
        cancel = ctl.send(CancelPeek(answered.uuid))  # stale: already answered
        assert no_answer(ctl, cancel.seq)
        assert isinstance(ctl.status(), StatusResponse)  # and the acker goes on

    # a peek sent during initialization is deferred; canceling it answers "canceled"
    with running_acker(config), AckerClient(config) as ctl:
        ctl.wait(ctl.send(Hello()).seq, timeout=10)
        ctl.send(CreateInstance())
        pending = ctl.send(Peek("p-1", sub))
        cancel = ctl.send(CancelPeek("p-1"))
        got = ctl.wait(pending.seq)  # the peek is answered: canceled
        assert isinstance(got.body, PeekResponse) and got.body.canceled
        init = ctl.send(InitializationComplete())
        status = ctl.send(StatusRequest())
        ctl.wait(status.seq)
        # nothing else: no rows for the canceled peek, no answer to CancelPeek itself
        assert no_answer(ctl, pending.seq) and no_answer(ctl, cancel.seq)
        assert no_answer(ctl, init.seq)


def test_restarted_acker_replays_the_command_history(make_config: ConfigFactory) -> None:
    config = tumbling(make_config)
    sub = config.substreams[0].name
    with AckerClient(config, controller="job") as ctl:
        with running_acker(config):
            ctl.connect(timeout=10)
            configure = ctl.send(ConfigureSubstreams((sub,)))
            ctl.send(AllowCompaction(sub, (5,)))
            st = ctl.status()
            assert st.configured == (sub,) and st.substreams[0].since == (5,)
            assert any(isinstance(r.body, Frontiers) for r in ctl.inbox)
        # while no acker runs: a peek that the next acker owes an answer
        owed = ctl.send(Peek("owed", sub, 7))
        ctl.inbox.clear()
        with running_acker(config) as handler:
            # the session survived (no new Hello): the owed peek is answered...
            reply = ctl.wait(owed.seq, timeout=15)
            assert isinstance(reply.body, PeekResponse) and reply.body.uuid == "owed"
            # ...the configuration and compaction frontier were restored...
            st = ctl.status()
            assert st.configured == (sub,) and st.substreams[0].since == (5,)
            assert any(isinstance(r.body, Frontiers) for r in ctl.inbox)
            compacted = ctl.peek(sub, 3)
            assert compacted.error is not None and "compacted" in compacted.error
            # ...and a re-delivered old command is still a duplicate
            redelivered = ctl.send(ConfigureSubstreams(()), seq=configure.seq)
            assert no_answer(ctl, redelivered.seq)
            assert ctl.status().configured == (sub,)
            assert len(handler.history.commands) < handler.commands_seen + 10
    owed_answers = [r for r in all_responses(config) if r.seq == owed.seq and r.nonce == ctl.nonce]
    assert len(owed_answers) == 1


def _cli_env(config: Config) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(client.ENV_BOOTSTRAP, None)
    return env


def test_cli_without_an_acker_is_one_error_line(make_config: ConfigFactory) -> None:
    config = tumbling(make_config)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "substreams",
            "acker",
            "status",
            "-c",
            str(config.path),
            "--timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=_cli_env(config),
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no acker answered within 1 s" in lines[0] and "acker run" in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_acker_run_serves_commands_and_stops_cleanly_on_sigterm(
    make_config: ConfigFactory,
) -> None:
    config = tumbling(make_config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "substreams", "acker", "run", "-c", str(config.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_cli_env(config),
    )
    try:
        with AckerClient(config) as ctl:
            st = ctl.connect(timeout=30)
        assert [s.substream for s in st.substreams] == [config.substreams[0].name]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.splitlines()[0].startswith(f"acker '{config.acker.name}' active")
    assert "stopped after 0 notifications" in out
    assert "Traceback" not in err


@pytest.mark.parametrize("text", ["x", "a@", "1,b"])
def test_cli_rejects_malformed_times(text: str, make_config: ConfigFactory) -> None:
    config = tumbling(make_config)
    result = CliRunner().invoke(
        cli, ["acker", "peek", "-c", str(config.path), "-s", config.substreams[0].name, "-t", text]
    )
    assert result.exit_code == 2 and "cannot read time" in result.output


def test_restarted_handler_starts_from_the_checkpointed_history_not_offset_0(
    make_config: ConfigFactory,
) -> None:
    """The reduced command history rides in the acker's checkpoint: a restarted handler
    replays it and the commands after it, not the command topic from offset 0."""
    from substreams.acker.service import latest_state

    config = tumbling(make_config)
    sub = config.substreams[0].name
    with AckerClient(config, controller="job") as ctl:
        with running_acker(config, capture_interval_ms=0) as first:
            ctl.connect(timeout=10)
            ctl.send(ConfigureSubstreams((sub,)))
            ctl.send(AllowCompaction(sub, (5,)))
            for _ in range(5):
                ctl.status()
            sent = first.commands_seen

            def saved_position() -> int | None:
                found = latest_state(config)
                commands = None if found is None else found[0].commands
                return None if commands is None or commands["position"] < sent else 1

            eventually(saved_position)
        assert first.replayed_from == 0  # its first start had nothing saved
        with running_acker(config) as handler:
            st = ctl.status()
            assert st.configured == (sub,) and st.substreams[0].since == (5,)
            assert handler.replayed_from >= sent > 0
            assert handler.replayed < sent


def test_a_manual_publisher_with_max_open_ms_is_seen_without_flushing(
    make_config: ConfigFactory,
) -> None:
    """The held window nobody showed (issue 43): a manual publisher's records below
    ``batch_size``, neither flushed nor sealed, sit in its open transaction -- invisible to
    the acker (it reads committed acks) and to readers.  With ``max_open_ms`` the ticker
    commits them: the acker shows the open time with its records and who holds it, and a
    reader reads them, while the caller goes on without flushing; each record once."""
    from substreams.streams.listener import Listener
    from substreams.streams.records import Entry

    config = tumbling(make_config)
    stream, sub = config.streams[0].name, config.substreams[0].name
    runner = CliRunner()
    args = ["-c", str(config.path), "--timeout", "10"]
    app = Application(config)
    with running_acker(config), app.publisher(stream, "src-m", max_open_ms=200) as pub:
        for ts in (100, 200, 300):
            pub.publish({"user": "u", "url": "/", "ts": ts})
        with AckerClient(config) as ctl:
            ctl.connect(timeout=10)
            eventually(lambda: ctl.status().substreams[0].open_times == 1 or None)

        def epochs_row() -> list[str] | None:
            out = runner.invoke(cli, ["acker", "epochs", *args]).output
            line = next((ln for ln in out.splitlines() if sub[:8] in ln), None)
            cells = None if line is None else [c.strip() for c in line.split("│")][1:-1]
            return cells if cells and cells[3] == "3" else None

        cells = eventually(epochs_row)
        assert cells[1] == "0" and cells[4] == "src-m"  # time 0, 3 records, held by src-m
        with Listener(config, stream) as listener:
            seen = [e.payload["ts"] for e in listener.entries(idle_timeout=0.5)
                    if isinstance(e, Entry)]
        assert seen == [100, 200, 300]
        pub.publish({"user": "u", "url": "/", "ts": 400})  # a later record: a new transaction
        pub.seal(sub, 0)
    with Listener(config, stream) as listener:
        assert [e.payload["ts"] for e in listener.entries(idle_timeout=0.5)
                if isinstance(e, Entry)] == [100, 200, 300, 400]


def test_max_open_ms_must_be_a_positive_number_of_milliseconds(
    make_config: ConfigFactory,
) -> None:
    from substreams.errors import SubstreamsError

    config = tumbling(make_config)
    with pytest.raises(SubstreamsError, match=r"max_open_ms must be a positive number.*not 0"):
        Application(config).publisher(config.streams[0].name, "src", max_open_ms=0)
