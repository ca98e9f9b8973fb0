"""Tailing a stream for people and for tools without a Kafka client.

Why one module for the terminal and HTTP: ``substreams tail`` and the dashboard's
``/tail/STREAM`` endpoint must print the same thing — one JSON object per entry, the
envelope's fields plus the decoded payload — so a script can switch between them.  Bytes
in a payload are base64 text (JSON has no bytes).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.frontier import time_to_wire
from substreams.streams.listener import Listener
from substreams.streams.records import Entry

IDLE_S = 0.5
"""Without ``follow``: stop once every partition was read to its end and nothing came for
this long (a transaction committing right then still makes it)."""


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def entry_json(entry: Entry) -> dict[str, Any]:
    """One entry as a JSON-able dict (times in their wire form)."""
    return {
        "stream": entry.stream,
        "partition": entry.partition,
        "index": entry.index,
        "order_key": entry.order_key,
        "source": entry.source,
        "times": {k: time_to_wire(t) for k, t in entry.times.items()},
        "payload": _plain(dict(entry.payload)),
    }


def json_line(entry: Entry) -> str:
    return json.dumps(entry_json(entry), separators=(",", ":"), sort_keys=False)


def open_listener(
    config: Config,
    stream: str,
    *,
    from_index: int | None = None,
    from_order_key: int | None = None,
    bootstrap: str | None = None,
    reader: str = "tail",
) -> Listener:
    """A listener for ``stream`` from an index (default 0) or an order key; a record it
    cannot decode is dead-lettered and passed over (or stops it, under ``on_bad_record:
    fail``), its letters written as ``reader``."""
    config.stream(stream)  # a ConfigError naming the known streams
    if from_index is not None and from_index < 0:
        raise SubstreamsError(f"--from-index must be >= 0, got {from_index}")
    return Listener(
        config, stream, from_index=from_index, from_order_key=from_order_key, bootstrap=bootstrap,
        reader=reader,
    )


def tail(
    listener: Listener, *, follow: bool, stop: threading.Event | None = None
) -> Iterator[Entry]:
    """The listener's entries; without ``follow`` up to the end of the stream, with it until
    ``stop`` is set."""
    stop = stop or threading.Event()
    idle_since: float | None = None
    while not stop.is_set():
        entry = listener.poll(0.2)
        if isinstance(entry, Entry):
            idle_since = None
            yield entry
            continue
        if follow or listener.state != "caught_up":
            continue
        idle_since = idle_since or time.monotonic()
        if time.monotonic() - idle_since >= IDLE_S:
            return
