"""`substreams config check`: validate a configuration file."""

from __future__ import annotations

import click

from substreams.cli.options import config_option
from substreams.config import load_config


@click.group("config")
def command() -> None:
    """Inspect substreams configuration files."""


@command.command()
@config_option
def check(config_path: str) -> None:
    """Validate FILE; errors name the file, line, key, bad value and allowed values."""
    config = load_config(config_path)
    click.echo(
        f"{config_path}: ok ({len(config.streams)} streams, {len(config.substreams)} substreams, "
        f"{len(config.stages)} stages, {len(config.topics())} topics)"
    )
