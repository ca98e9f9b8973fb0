"""`substreams topics create`: every topic the configuration needs, idempotently."""

from __future__ import annotations

import click

from substreams.cli.options import bootstrap_option, config_option
from substreams.config import load_config
from substreams.kafka import client
from substreams.kafka.topics import ensure_topics, policy
from substreams.streams.evolution import register_stream


@click.group("topics")
def command() -> None:
    """Manage the Kafka topics of a configuration."""


@command.command()
@config_option
@bootstrap_option
def create(config_path: str, bootstrap: str | None) -> None:
    """Create the data, control, acks, command, response and dead-letter topics.

    Each kind of topic gets its replication factor, min.insync.replicas and retention from
    the config. Existing topics are never changed: each setting that differs from what the
    config wants is printed as a `differs` line.
    """
    config = load_config(config_path)
    server = client.resolve_bootstrap(config, bootstrap)
    report = ensure_topics(
        client.admin(server, config),
        config.topics(),
        config.kafka.replication_factor,
        log_differences=False,  # printed below
    )
    width = max((len(n) for n in report.wanted), default=0)
    for name in report.created:
        click.echo(f"created  {name:<{width}}  {policy(report.wanted[name])}")
    for name in report.existing:
        click.echo(f"exists   {name:<{width}}  {policy(report.wanted[name])}")
    for diff in report.differences:
        click.echo(f"differs  {diff}")
    for name, why in report.unchecked.items():
        click.echo(f"unchecked {name}: its settings could not be read ({why})")
    if report.differences:
        n = len(report.differences)
        what = "1 setting differs" if n == 1 else f"{n} settings differ"
        click.echo(
            f"{what} from the config, left unchanged: `topics create` never alters an existing"
            " topic (kafka-configs.sh --alter changes a setting, kafka-reassign-partitions.sh"
            " the replication factor)"
        )
    click.echo(f"{len(report.created)} created, {len(report.existing)} already existed on {server}")
    # Each stream's schema joins its history (refused, naming the field, if incompatible).
    for stream in config.streams:
        fp = register_stream(config, stream.name, server)
        click.echo(f"schema   {stream.name:<{width}}  {stream.schema_path} (fingerprint {fp})")
