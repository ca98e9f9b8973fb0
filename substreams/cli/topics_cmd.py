"""`substreams topics create`: every topic the configuration needs, idempotently."""

from __future__ import annotations

import click

from substreams.cli.options import bootstrap_option, config_option
from substreams.config import load_config
from substreams.kafka import client
from substreams.kafka.topics import ensure_topics


@click.group("topics")
def command() -> None:
    """Manage the Kafka topics of a configuration."""


@command.command()
@config_option
@bootstrap_option
def create(config_path: str, bootstrap: str | None) -> None:
    """Create the data, control, acks, command, response and dead-letter topics."""
    config = load_config(config_path)
    server = client.resolve_bootstrap(config, bootstrap)
    report = ensure_topics(
        client.admin(server, config), config.topics(), config.kafka.replication_factor
    )
    for name in report.created:
        click.echo(f"created  {name}")
    for name in report.existing:
        click.echo(f"exists   {name}")
    click.echo(f"{len(report.created)} created, {len(report.existing)} already existed on {server}")
