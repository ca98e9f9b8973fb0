"""No drift between publishers and ackers (issue 43, item 4), on the real broker and acker:
a publisher whose configuration names a substream its acker does not serve is refused at
start, naming the acker and what to do, in both orders of deploying a new substream."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from substreams.acker.served import AckerDriftError
from substreams.acker.service import latest_state
from substreams.app import Application
from substreams.config import Config, load_config
from tests.conftest import ConfigFactory, read_dead_letters
from tests.integration.test_acker import FAST, acker, wait_notifications


def old_and_new(make_config: ConfigFactory, tmp_path: Path) -> tuple[Config, Config]:
    """``new``: stream clicks with tumbling substreams ``w`` and ``v``; ``old``: the same
    names without ``v`` (what ran before ``v`` was added)."""
    new = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "field": "ts", "size_ms": 100},
         {"name": "v", "stream": "clicks", "kind": "tumbling", "field": "ts", "size_ms": 100}],
        acker=FAST,
    )
    doc = yaml.safe_load(new.path.read_text())
    doc["substreams"] = doc["substreams"][:1]
    old_path = new.path.with_name(f"old-{new.path.name}")
    old_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_config(old_path), new


def wait_served(config: Config, substream: str, timeout: float = 20.0) -> None:
    """Until the acker's latest checkpoint serves ``substream`` (its first step writes one)."""
    deadline = time.monotonic() + timeout
    while True:
        found = latest_state(config)
        if found is not None and substream in found[0].tables:
            return
        assert time.monotonic() < deadline, f"the acker never served {substream}"
        time.sleep(0.05)


def publish_and_seal(config: Config, base: int = 0) -> None:
    """Two records in window ``base // 100`` and one in the next, both sealed, as ``web``."""
    stream = config.streams[0].name
    w, v = (s.name for s in config.substreams)
    with Application(config).publisher(stream, "web") as pub:
        for ts in (base + 10, base + 20, base + 110):
            pub.publish({"user": "u", "url": "/", "ts": ts})
        pub.seal(w, base // 100 + 1)
        pub.seal(v, base // 100 + 1)


def counts(config: Config, substream: str, n: int) -> dict[object, int]:
    return {note.time: note.records for note in wait_notifications(config, substream, n)}


def test_new_substream_deployed_to_the_acker_first_is_served(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    old, new = old_and_new(make_config, tmp_path)
    w, v = (s.name for s in new.substreams)
    with acker(old):
        wait_served(old, w)
    with acker(new):  # the acker restarted with the new substream first
        wait_served(new, v)
        publish_and_seal(new)
        assert [n.records for n in wait_notifications(new, v, 2)] == [2, 1]
        assert [n.records for n in wait_notifications(new, w, 2)] == [2, 1]
    assert not [d for d in read_dead_letters(new) if d.reason == "unknown_substream"]


def test_a_publisher_deployed_before_its_acker_is_refused_until_the_acker_serves_it(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    old, new = old_and_new(make_config, tmp_path)
    w, v = (s.name for s in new.substreams)
    stream = new.streams[0].name
    with acker(old):
        wait_served(old, w)
        with pytest.raises(AckerDriftError) as refused:
            Application(new).publisher(stream, "web")
        message = str(refused.value)
        assert f"substream '{v}' is not served by acker '{new.acker.name}'" in message
        assert f"serves: {w}" in message
        assert f"substreams acker run -c {new.path}" in message
        # refused before anything was written: the same source starts with the old config
        with Application(old).publisher(stream, "web") as pub:
            pub.publish({"user": "u", "url": "/", "ts": 5})
            pub.seal(w, 0)
        assert counts(old, w, 1) == {0: 1}
    with acker(new):  # then the acker is restarted with the new configuration
        wait_served(new, v)
        publish_and_seal(new, base=100)
        assert counts(new, v, 2) == {1: 2, 2: 1}
        assert counts(new, w, 3) == {0: 1, 1: 2, 2: 1}
    assert not [d for d in read_dead_letters(new) if d.reason == "unknown_substream"]
