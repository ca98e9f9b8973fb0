"""Options shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

config_option = click.option(
    "-c",
    "--config",
    "config_path",
    default="substreams.yaml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The substreams YAML configuration.",
)

bootstrap_option = click.option(
    "--bootstrap",
    default=None,
    metavar="HOST:PORT",
    help="Kafka bootstrap servers; overrides kafka.bootstrap and $SUBSTREAMS_BOOTSTRAP.",
)
