"""`substreams dead-letters list|show|replay` against a real broker: letters listed and
filtered, one decoded with its stream's schema, records replayed exactly once for the
times still open -- also when a replay is SIGKILLed halfway and run again."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from substreams.app import Application
from substreams.cli.main import cli
from substreams.config import Config
from substreams.control.notes import EpochNote
from substreams.kafka import client
from substreams.streams.deadletter import (
    REASON_MALFORMED,
    DeadLetter,
    DeadLetterWriter,
    late_letter,
)
from substreams.streams.letters import REASON_REPLAYED
from substreams.streams.listener import Listener
from substreams.streams.records import Entry
from tests.conftest import ConfigFactory, read_dead_letters
from tests.integration.test_acker import FAST, acker
from tests.integration.test_cli import REPO
from tests.integration.test_seal_policy import SCHEMA, Events, collect


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), prog_name="substreams")
    return result


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def configure(make_config: ConfigFactory, tmp_path: Path, seal: Any) -> tuple[Config, str, str]:
    (tmp_path / "event.avsc").write_text(json.dumps(SCHEMA))
    config = make_config(
        [{"name": "events", "partitions": 2, "schema": "event.avsc", "order_key": "seq"}],
        [{"name": "w", "stream": "events", "kind": "tumbling", "field": "ts", "size_ms": 100,
          "seal": seal}],
        acker=FAST,
    )
    return config, config.streams[0].name, config.substreams[0].name


def stream_ts(config: Config, stream: str) -> Counter[int]:
    with Listener(config, stream) as listener:
        return Counter(int(e.payload["ts"]) for e in listener.entries(idle_timeout=0.5)
                       if isinstance(e, Entry))


def write_letters(config: Config, letters: list[DeadLetter]) -> None:
    writer = DeadLetterWriter(config, "test")
    for letter in letters:
        writer.write(letter)
    writer.flush()
    writer.close()


def test_list_filters_and_show_decodes_with_the_streams_schema(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config, stream, sub = configure(make_config, tmp_path,
                                    {"lateness_ms": 100, "late": "dead_letter"})
    ev = Events()
    with Application(config).publisher(stream, "web") as pub:
        for ts in (10, 250):  # 250 seals window 0
            pub.publish(ev(ts), key="k1")
        assert pub.publish(ev(40), key="k1").dead_lettered
    with Listener(config, stream) as listener:  # a real record's bytes, as a reader saw them
        first = next(e for e in listener.entries(idle_timeout=0.5) if isinstance(e, Entry))
    raw = _raw_at(config, stream, first.partition, first.index)
    write_letters(config, [
        DeadLetter("reader", REASON_MALFORMED, stream, first.partition, first.index, raw,
                   "test: a record a reader could not use"),
        DeadLetter("reader", REASON_MALFORMED, stream, 1, 77, b'{"order_id": 1', "foreign"),
    ])
    path = str(config.path)

    every = invoke("dead-letters", "-c", path)  # the group alone lists
    assert every.exit_code == 0, every.output
    assert "late_record" in every.output and "malformed" in every.output
    listed = json_lines(invoke("dead-letters", "list", "-c", path, "--json").output)
    assert [d["reason"] for d in listed] == ["late_record", "malformed", "malformed"]
    late = invoke("dead-letters", "list", "-c", path, "--json", "--reason", "late_record",
                  "--substream", sub).output
    [one] = json_lines(late)
    assert one["topic"] == stream and one["offset"] == -1 and one["source"] == "web"
    assert json.loads(__import__("base64").b64decode(one["raw"]))["ts"] == 40
    assert json_lines(invoke("dead-letters", "list", "-c", path, "--json", "--substream",
                             "nope").output) == []
    assert len(json_lines(invoke("dead-letters", "list", "-c", path, "--json", "--since",
                                 "1h", "--stream", stream).output)) == 3
    assert json_lines(invoke("dead-letters", "list", "-c", path, "--json",
                             "--until", "1h").output) == []

    shown = json.loads(invoke("dead-letters", "show", listed[1]["id"], "-c", path,
                              "--json").output)
    assert shown["decoded"]["kind"] == "record"
    assert shown["decoded"]["value"]["payload"] == {"user": "u", "ts": 10, "seq": 1}
    assert shown["decoded"]["value"]["source"] == "web"
    late_shown = json.loads(invoke("dead-letters", "show", one["id"], "-c", path,
                                   "--json").output)
    assert late_shown["decoded"] == {"kind": "json",
                                     "value": {"user": "u", "ts": 40, "seq": 3}}
    foreign = invoke("dead-letters", "show", listed[2]["id"], "-c", path)
    assert foreign.exit_code == 0 and "decoded: raw" in foreign.output
    missing = invoke("dead-letters", "show", "0:999", "-c", path)
    assert missing.exit_code == 2
    assert f"no dead letter at '{config.acker.dead_letter_topic}'[0]@999" in missing.output


def until_time(config: Config, sub: str, t: int) -> EpochNote:
    with Application(config).notifications(sub, from_="beginning", records=True,
                                           idle_timeout=30) as notes:
        for note in notes:
            if note.time == t:
                return note
    raise AssertionError(f"no notification of time {t}")


def _raw_at(config: Config, topic: str, partition: int, offset: int) -> bytes:
    from substreams.kafka.read import record_at

    msg = record_at(client.resolve_bootstrap(config), config, topic, partition, offset)
    assert msg is not None
    return msg.value() or b""


def test_replay_publishes_open_times_once_and_names_notified_ones(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config, stream, sub = configure(make_config, tmp_path,
                                    {"lateness_ms": 100, "late": "dead_letter"})
    path = str(config.path)
    ev = Events()
    app = Application(config)
    with acker(config), app.publisher(stream, "web") as pub:
        for ts in (10, 250):
            pub.publish(ev(ts))
        assert pub.publish(ev(40)).dead_lettered  # window 0: sealed, and soon notified
        pub.flush()
        assert [n.time for n in collect(config, sub, 1)] == [0]
        # a record for window 50, still open: dead-lettered by a reader, say, as JSON
        write_letters(config, [late_letter("test", stream, 1, -1, "other",
                                           {"user": "v", "ts": 5000, "seq": 99}, "test")])
        # and the same undecodable record dead-lettered by two readers: replayed once, fixed
        bad = [DeadLetter(r, REASON_MALFORMED, stream, 0, 5, b"\x00garbage", "test")
               for r in ("tail", "spark")]
        write_letters(config, bad)
        letters = json_lines(invoke("dead-letters", "list", "-c", path, "--json").output)
        ids = [d["id"] for d in letters]
        fixed = tmp_path / "fixed.jsonl"
        fixed.write_text(json.dumps({"id": ids[2], "payload": {"user": "fx", "ts": 5010,
                                                               "seq": 100}}) + "\n")

        dry = invoke("dead-letters", "replay", "-c", path, "--dry-run", "--json",
                     "--fixed", str(fixed))
        assert [d["outcome"] for d in json_lines(dry.output)] == [
            "notified", "replay", "replay", "duplicate"]
        assert stream_ts(config, stream)[5000] == 0  # a dry run publishes nothing

        first = invoke("dead-letters", "replay", "-c", path, "--json", "--fixed", str(fixed))
        assert first.exit_code == 1, first.output  # the notified one was not republished
        got = {d["id"]: d for d in json_lines(first.output)}
        assert got[ids[0]]["outcome"] == "notified"
        assert f"substream '{sub}' time 0 already notified" in got[ids[0]]["message"]
        assert got[ids[1]]["outcome"] == "republished"
        assert got[ids[2]]["outcome"] == "republished"
        assert got[ids[3]]["outcome"] == "duplicate"

        again = invoke("dead-letters", "replay", "-c", path, "--json", "--fixed", str(fixed),
                       "--id", ids[1], "--id", ids[2], "--id", ids[3])
        assert again.exit_code == 0, again.output
        assert {d["outcome"] for d in json_lines(again.output)} == {"replayed"}
        counts = stream_ts(config, stream)
        assert counts[5000] == 1 and counts[5010] == 1 and counts[40] == 0
        listing = invoke("dead-letters", "list", "-c", path).output
        assert listing.count("[replayed:") == 3  # both letters of the fixed record say so
        # the markers are replay history, not letters: not listed, not counted
        assert "4 dead letter(s) of 4 in" in listing
        assert len(json_lines(invoke("dead-letters", "list", "-c", path, "--json").output)) == 4
        assert json_lines(invoke("dead-letters", "list", "-c", path, "--json", "--reason",
                                 REASON_REPLAYED).output) == []
        shown = json.loads(invoke("dead-letters", "show", ids[1], "-c", path, "--json").output)
        marker_id = shown["replayed_by"]
        marker = json.loads(invoke("dead-letters", "show", marker_id, "-c", path,
                                   "--json").output)
        assert marker["decoded"]["kind"] == "replay_marker"
        assert marker["decoded"]["value"]["letter"] == ids[1]
        assert "replayed_by" not in json.loads(invoke("dead-letters", "show", ids[0], "-c",
                                                      path, "--json").output)

        pub.seal(sub, 50)  # the open window ends: its notification holds the replayed ones
        w50 = until_time(config, sub, 50)
    assert sorted(e.payload["ts"] for e in w50.entries) == [5000, 5010]
    every = read_dead_letters(config, markers=True)
    assert len([d for d in every if d.reason == REASON_REPLAYED]) == 2
    assert [d.reason for d in read_dead_letters(config)] == [
        "late_record", "late_record", "malformed", "malformed"]


def test_a_replay_killed_halfway_and_run_again_publishes_each_record_once(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config, stream, _ = configure(make_config, tmp_path, "manual")
    n = 3000
    producer = client.producer(client.resolve_bootstrap(config), config)
    for i in range(n):
        letter = late_letter("test", stream, i % 2, -1, "web",
                             {"user": f"u{i}", "ts": 1000 + i, "seq": i}, "test")
        producer.produce(config.acker.dead_letter_topic, letter.to_json(), partition=0)
    producer.flush(30)
    cmd = [sys.executable, "-m", "substreams", "dead-letters", "replay", "-c",
           str(config.path), "--commit-every", "100"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    committed = 0
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "replay: committed" in line:
            committed = int(line.split("committed ")[1].split()[0])
            break
        assert line, "the replay ended without committing"
    os.kill(proc.pid, signal.SIGKILL)  # inside a later transaction, records and markers open
    proc.wait(30)
    before = stream_ts(config, stream)
    assert committed <= sum(before.values()) < n  # killed halfway: some, not all
    assert set(before.values()) == {1}

    rerun = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    after = stream_ts(config, stream)
    assert after == Counter({1000 + i: 1 for i in range(n)})
    outcomes = Counter(line.split()[1] for line in rerun.stdout.splitlines())
    assert outcomes == {"replayed": sum(before.values()),
                        "republished": n - sum(before.values())}


def test_a_record_late_for_one_substream_is_replayed_into_that_one_only(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    """A record late for 'a' (10 ms windows, no lateness) and on time for 'b' (1 s windows)
    is written to 'b' and dead-lettered naming 'a'.  Replayed while 'a's window is still
    open (another source holds it), it goes into 'a' only: each substream's notification
    holds it once (republished whole, 'b' held it twice)."""
    (tmp_path / "event.avsc").write_text(json.dumps(SCHEMA))
    config = make_config(
        [{"name": "events", "partitions": 2, "schema": "event.avsc", "order_key": "seq"}],
        [{"name": "a", "stream": "events", "kind": "tumbling", "field": "ts", "size_ms": 100,
          "seal": {"lateness_ms": 0, "late": "dead_letter"}},
         {"name": "b", "stream": "events", "kind": "tumbling", "field": "ts", "size_ms": 1000,
          "seal": {"lateness_ms": 0, "late": "dead_letter"}}],
        acker=FAST,
    )
    stream = config.streams[0].name
    a, b = config.substreams[0].name, config.substreams[1].name
    path = str(config.path)
    ev = Events()
    app = Application(config)
    with acker(config):
        with app.publisher(stream, "other") as other:
            other.publish(ev(20))  # window a:0 stays open until 'other' moves on
            other.flush()
            with app.publisher(stream, "web") as web:
                web.publish(ev(10))
                web.publish(ev(250))  # 'web' seals a:0 and a:1; b:0 stays open
                kept = web.publish(ev(40))  # late for 'a' only
                assert not kept.dead_lettered and set(kept.times) == {b}
                web.flush()

                [letter] = json_lines(invoke("dead-letters", "list", "-c", path,
                                             "--json").output)
                assert letter["substreams"] == [a]
                dry = json_lines(invoke("dead-letters", "replay", "-c", path, "--dry-run",
                                        "--json").output)
                assert [d["outcome"] for d in dry] == ["replay"]
                assert f"for substream(s) '{a}' only" in dry[0]["message"]
                done = invoke("dead-letters", "replay", "-c", path, "--json")
                assert done.exit_code == 0, done.output
                assert [d["outcome"] for d in json_lines(done.output)] == ["republished"]
                again = invoke("dead-letters", "replay", "-c", path, "--json")
                assert [d["outcome"] for d in json_lines(again.output)] == ["replayed"]
                web.publish(ev(2500))  # seals 'a' below 25 and b:0, b:1
            other.publish(ev(2600))
        a0 = until_time(config, a, 0)
        b0 = until_time(config, b, 0)
    assert sorted(e.payload["ts"] for e in a0.entries) == [10, 20, 40]
    assert sorted(e.payload["ts"] for e in b0.entries) == [10, 20, 40, 250]
    assert a0.records == 3 and b0.records == 4
    assert stream_ts(config, stream)[40] == 2  # on the stream twice: once for 'b', once for 'a'


def test_replay_of_hopping_records_checks_their_panes(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    """A hopping substream (300 ms windows every 100 ms) is tracked by 100 ms panes: the
    acker notifies panes, a record's time is its pane.  A letter whose pane is closed --
    notified, or below a notified pane though never announced itself -- is refused (the
    acker would dead-letter its report as terminated_time); one whose pane is open is
    republished and its pane's notification holds it."""
    (tmp_path / "event.avsc").write_text(json.dumps(SCHEMA))
    config = make_config(
        [{"name": "events", "partitions": 1, "schema": "event.avsc", "order_key": "seq"}],
        [{"name": "h", "stream": "events", "kind": "hopping", "field": "ts", "size_ms": 300,
          "slide_ms": 100, "seal": {"lateness_ms": 0, "late": "dead_letter"}}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    path = str(config.path)
    ev = Events()
    with acker(config), Application(config).publisher(stream, "web") as pub:
        for ts in (10, 150, 550):  # panes 0, 1, 5: the policy seals panes up to 4
            pub.publish(ev(ts))
        pub.flush()
        assert until_time(config, sub, 4).time == 4
        assert pub.publish(ev(120)).dead_lettered  # pane 1: notified
        assert pub.publish(ev(250)).dead_lettered  # pane 2: empty, below notified pane 4
        pub.flush()
        # pane 6 is open: nobody sealed it (a record dead-lettered by a reader, say)
        write_letters(config, [late_letter("test", stream, 0, -1, "other",
                                           {"user": "v", "ts": 640, "seq": 99}, "test")])
        out = {json.loads(base64.b64decode(d["raw"]))["ts"]: d for d in json_lines(
            invoke("dead-letters", "list", "-c", path, "--json").output)}
        done = {d["id"]: d for d in json_lines(invoke("dead-letters", "replay", "-c", path,
                                                      "--json").output)}
        assert done[out[120]["id"]]["outcome"] == "notified"
        assert f"substream '{sub}' pane 1 (windows -1..1)" in done[out[120]["id"]]["message"]
        assert done[out[250]["id"]]["outcome"] == "notified"
        assert done[out[640]["id"]]["outcome"] == "republished"
        pub.publish(ev(900))  # seals panes up to 8
        pub.flush()
        pane6 = until_time(config, sub, 6)
    assert [e.payload["ts"] for e in pane6.entries] == [640]
    assert [d for d in read_dead_letters(config) if d.reason == "terminated_time"] == []
