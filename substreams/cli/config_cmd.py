"""`substreams config check`: validate a configuration file."""

from __future__ import annotations

import click

from substreams.cli.options import config_option
from substreams.config import load_config
from substreams.config.advice import late_for_one


@click.group("config")
def command() -> None:
    """Inspect substreams configuration files."""


@command.command()
@config_option
def check(config_path: str) -> None:
    """Validate FILE; errors name the file, line, key, bad value and allowed values.
    Warnings (on stderr, exit code 0) name choices that work but surprise."""
    config = load_config(config_path)
    for warning in late_for_one(config):
        click.echo(f"warning: {config_path}: {warning}", err=True)
    click.echo(
        f"{config_path}: ok ({len(config.streams)} streams, {len(config.substreams)} substreams, "
        f"{len(config.stages)} stages, {len(config.topics())} topics)"
    )
