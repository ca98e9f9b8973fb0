"""The command handler's completed times (for peeks) taken from its service's commits equal
what reading the control topics back gives (the path they replaced, issue #16 session 10):
same times, same fields, same order and the same eviction at ``keep_completed``, across a
restart whose new handler backfills the earlier completions from the topic."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from substreams.acker.handler import CommandHandler
from substreams.acker.service import AckerService
from substreams.app import Application
from substreams.config import Config
from tests.conftest import ConfigFactory

FAST = {"heartbeat_ms": 200, "flush_ms": 2}


def _serve_until(config: Config, done: Any, keep: int) -> CommandHandler:
    """Run an acker with a handler in a thread until ``done(handler)``; the handler."""
    service = Application(config).acker(keep_completed=keep)
    handler = service.command_handler
    assert isinstance(handler, CommandHandler)
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not done(handler) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(20)  # run() closes the service and its handler
    return handler


def test_fed_completions_equal_the_control_topics(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    keep = 25
    with Application(config).publisher(stream, "a") as pub:

        def publish(lo: int, hi: int) -> None:
            for t in range(lo, hi):
                pub.publish_many([{"user": "x", "url": f"/{t}/{k}", "ts": t} for k in range(3)])
                pub.seal(sub, t)

        publish(0, 20)
        first = _serve_until(config, lambda h: 19 in h.completed[sub], keep)
        assert first._fed and not first._backfill  # fed from its service
        publish(20, 40)  # the restarted acker's handler: 0-19 from the topic, then fed
        fed = _serve_until(config, lambda h: 39 in h.completed[sub], keep)
    assert not fed._backfill
    # the reference: a handler whose service writes none of the topics reads them all
    ref = CommandHandler(config, None, "reference", keep_completed=keep)
    real = AckerService(config, name="reference-view")
    stub = SimpleNamespace(
        control_topics={}, committed_notes=[], state=SimpleNamespace(commands=None),
        view=real.view,
    )
    try:
        deadline = time.monotonic() + 30
        while 39 not in ref.completed[sub] and time.monotonic() < deadline:
            ref(stub)  # type: ignore[arg-type]
            time.sleep(0.05)
        assert not ref._fed
    finally:
        ref.close()
    def fields(handler: CommandHandler) -> list[tuple[Any, ...]]:
        return [(t, c.records, c.sealed_at_ms, c.ranges) for t, c in handler.completed[sub].items()]

    assert fields(fed) == fields(ref)
    assert list(fed.completed[sub]) == list(range(40 - keep, 40))
    assert all(c.records == 3 and c.ranges for c in fed.completed[sub].values())
