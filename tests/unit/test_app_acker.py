"""The composition root builds the acker service with its command handler: the handler is
the shard's (its name, its substreams), takes the handler options, is owned and closed by
the service, and cannot be swapped by assigning an attribute.  No broker: nothing here
connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from substreams.acker.handler import CommandHandler
from substreams.app import Application
from substreams.config import Config
from substreams.config.loader import load_config_text
from substreams.kafka.clock import SimClock


def sharded(tmp_path: Path) -> Config:
    (tmp_path / "c.avsc").write_text(
        '{"type":"record","name":"C","fields":[{"name":"ts","type":"long"}]}'
    )
    subs = ", ".join(
        f"{{name: s{i}, stream: c, kind: epoch, field: ts, mechanism: acker}}" for i in range(8)
    )
    text = (
        "kafka: {bootstrap: 'localhost:1'}\n"
        "streams: [{name: c, schema: c.avsc, order_key: ts}]\n"
        f"substreams: [{subs}]\n"
        "acker: {acks_partitions: 2, shards: 2}\n"
    )
    return load_config_text(text, tmp_path / "substreams.yaml")


def test_the_acker_is_built_with_its_shard_s_command_handler(tmp_path: Path) -> None:
    config = sharded(tmp_path)
    clock = SimClock()
    service = Application(config, clock=clock).acker(shard=1, keep_completed=7)
    handler = service.command_handler
    try:
        assert isinstance(handler, CommandHandler)
        assert handler.name == service.name == f"{config.acker.name}.shard1of2"
        assert handler.keep_completed == 7
        # it follows the control topics of this shard's substreams only
        assert set(handler._topic_sub.values()) == set(service.segments)
        assert 0 < len(service.segments) < 8
        assert service.clock is clock and handler.clock is clock  # one time base
        with pytest.raises(AttributeError):
            service.command_handler = handler  # type: ignore[misc]
    finally:
        service.close()
    assert service.command_handler is None and handler._closed
    handler.close()  # once closed, closing again does nothing


def test_an_acker_without_commands_takes_no_handler_options(tmp_path: Path) -> None:
    app = Application(sharded(tmp_path))
    service = app.acker(commands=False)
    assert service.command_handler is None
    service.close()
    with pytest.raises(TypeError, match="keep_completed"):
        app.acker(commands=False, keep_completed=7)
