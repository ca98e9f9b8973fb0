"""A record at a time its own publisher sealed is refused before anything is written.

Every substream kind and seal form, through ``publish`` and ``publish_many`` (a batch with one
late record is refused whole), under both mechanisms, on a real broker: afterwards the data
topic holds exactly the records that were accepted, and the publisher goes on.  Without the
refusal the late record is written after its substream's notification and its report is
dead-lettered by the acker: in no substream at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from substreams.app import Application
from substreams.errors import SealedTimeError
from substreams.frontier import Keyed
from substreams.streams.listener import Listener
from substreams.streams.publisher import Publisher
from tests.conftest import ConfigFactory
from tests.integration.test_streams import read_all


def click(ts: int, url: str, user: str = "u") -> dict[str, Any]:
    return {"user": user, "url": url, "ts": ts}


Seal = Callable[[Publisher, str], None]

CASES: dict[str, tuple[dict[str, Any], Seal, dict[str, Any], dict[str, Any]]] = {
    # kind: (substream, seal, a late record, a record still allowed)
    "epoch": (
        {"kind": "epoch", "field": "ts"},
        lambda p, s: p.seal(s, 10),
        click(10, "/late"), click(11, "/ok"),
    ),
    "tumbling, a window that had records": (
        {"kind": "tumbling", "field": "ts", "size_ms": 100},
        lambda p, s: p.seal(s, 0),
        click(99, "/late"), click(100, "/ok"),
    ),
    "tumbling, a sealed window that never opened": (
        {"kind": "tumbling", "field": "ts", "size_ms": 100},
        lambda p, s: p.seal(s, 5),  # windows 1..5 had no record
        click(350, "/late"), click(600, "/ok"),
    ),
    "per_key, seal(Keyed)": (
        {"kind": "per_key", "key": "user"},
        lambda p, s: p.seal(s, Keyed("u", 0)),
        click(20, "/late", user="u"), click(20, "/ok", user="v"),
    ),
    "per_key, seal_keys": (
        {"kind": "per_key", "key": "user"},
        lambda p, s: p.seal_keys(s, 0),
        click(20, "/late", user="v"), click(20, "/late2", user="w"),
    ),
    "session, seal(Keyed)": (
        {"kind": "session", "key": "user", "field": "ts", "gap_ms": 5},
        lambda p, s: p.seal(s, Keyed("u", 30)),
        click(30, "/late", user="u"), click(30, "/ok", user="v"),
    ),
    "session, watermark": (
        {"kind": "session", "key": "user", "field": "ts", "gap_ms": 5},
        lambda p, s: p.watermark(31, commit=True),  # seals every key up to 30
        click(30, "/late", user="v"), click(31, "/ok", user="v"),
    ),
}


@pytest.mark.parametrize(
    ("case", "mechanism"),
    [(c, "acker") for c in CASES]
    # sessions and keyed seals are the acker's only (punctuations refuse them)
    + [(c, "punctuations") for c in CASES if not c.startswith("session") and "keys" not in c],
)
def test_a_record_at_a_sealed_time_is_refused_and_nothing_is_written(
    make_config: ConfigFactory, case: str, mechanism: str
) -> None:
    fields, seal, late, ok = CASES[case]
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "mechanism": mechanism, **fields}],
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    with Application(config).publisher(stream, "src") as pub:
        pub.publish(click(10, "/first"))
        seal(pub, sub)
        with pytest.raises(SealedTimeError, match=f"substream '{sub}'"):
            pub.publish(late, check_order=False)
        with pytest.raises(SealedTimeError):
            pub.publish_many([ok, late, ok], check_order=False)
        if ok["url"] == "/ok":
            pub.publish(ok, check_order=False)
    with Listener(config, stream) as listener:
        urls = sorted(e.payload["url"] for e in read_all(listener))
    assert urls == sorted(["/first"] + (["/ok"] if ok["url"] == "/ok" else []))
