"""The options of the ``substreams`` Spark source, validated once on the driver."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from substreams.config import load_config
from substreams.errors import SubstreamsError
from substreams.kafka import client

Mode = Literal["firm", "soft"]
Starting = Literal["earliest", "latest"]


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise SubstreamsError(f"substreams source: option '{name}' must be true or false, not {raw!r}")


@dataclass(frozen=True)
class SourceOptions:
    """Everything a reader needs, as plain picklable values (the config is re-read from
    ``config_path`` where needed: Spark workers on other hosts see the same file)."""

    config_path: str
    substream: str
    stream: str
    mode: Mode
    bootstrap: str
    control_topic: str
    partitions: int
    starting: Starting = "earliest"
    markers: bool = False
    """Firm mode: also emit one notification row per epoch after its records (so that an
    epoch without records is still seen).  Soft mode always emits them."""
    max_tasks: int = 2
    verify: bool = True
    """Firm mode: fail when an epoch's rows differ in number from its EpochComplete."""

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceOptions:
        path = options.get("config")
        if not path:
            raise SubstreamsError(
                "substreams source: option 'config' (path of substreams.yaml) is required"
            )
        name = options.get("substream")
        if not name:
            raise SubstreamsError("substreams source: option 'substream' is required")
        config = load_config(path)
        sub = config.substream(name)
        stream = config.stream(options.get("stream") or sub.stream)
        mode = options.get("mode") or sub.bound
        if mode not in ("firm", "soft"):
            raise SubstreamsError(
                f"substreams source: option 'mode' must be firm or soft, not {mode!r}"
            )
        starting = options.get("starting", "earliest")
        if starting not in ("earliest", "latest"):
            raise SubstreamsError(
                f"substreams source: option 'starting' must be earliest or latest, not {starting!r}"
            )
        try:
            max_tasks = int(options.get("maxTasks", "2"))
        except ValueError as exc:
            raise SubstreamsError(
                "substreams source: option 'maxTasks' must be an integer"
            ) from exc
        return SourceOptions(
            config_path=str(config.path),
            substream=sub.name,
            stream=stream.name,
            mode=cast(Mode, mode),
            bootstrap=client.resolve_bootstrap(config, options.get("bootstrap")),
            control_topic=config.acker.control_topic(sub.name),
            partitions=stream.partitions,
            starting=cast(Starting, starting),
            markers=_flag(options, "markers", False),
            max_tasks=max(1, max_tasks),
            verify=_flag(options, "verify", True),
        )
