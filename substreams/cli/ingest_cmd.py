"""`substreams ingest`: follow a stream's source topic (an existing topic written by any
producer) into the tracked stream, exactly once, until Ctrl-C."""

from __future__ import annotations

import click

from substreams.cli.options import (
    bootstrap_option,
    config_option,
    metrics_port_option,
    serve_metrics,
    stop_on_signals,
)
from substreams.config import load_config


@click.command("ingest")
@config_option
@bootstrap_option
@click.option("--stream", "stream", required=True, metavar="NAME",
              help="A stream with a `source:` (the existing topic it follows).")
@click.option("--instance", default=0, show_default=True, type=click.IntRange(min=0),
              help="Which instance this is: it follows the partitions p with "
                   "p % instances == instance.")
@click.option("--instances", default=1, show_default=True, type=click.IntRange(min=1),
              help="How many instances split the topic's partitions.")
@click.option("--progress", "every", default=5.0, show_default=True, metavar="SECONDS",
              type=click.FloatRange(min=0.1), help="Print a progress line this often.")
@metrics_port_option
def command(
    config_path: str, bootstrap: str | None, stream: str, instance: int, instances: int,
    every: float, metrics_port: int | None,
) -> None:
    """Copy the records of STREAM's source topic into STREAM, exactly once: each input
    partition is a source of the stream whose transactions hold its records, their acker
    reports, its seals (the substreams' `seal:` policies, per input partition) and its input
    offset. Bad records (not JSON, not fitting the schema, unknown schema ids) and late ones
    go to the dead-letter topic with their topic, partition and offset. Several instances
    split the partitions (--instances N --instance I). Stops cleanly on Ctrl-C; a SIGKILL
    loses nothing: a restart resumes at the committed offsets with the seals it promised."""
    from substreams.ingest import Counts, Ingest

    config = load_config(config_path)
    ingest = Ingest(config, stream, instance=instance, instances=instances, bootstrap=bootstrap)
    serve_metrics(metrics_port)
    click.echo(
        f"ingest '{stream}': following '{ingest.topic}' partitions {ingest.partitions} "
        f"from offsets {ingest.positions()} (Ctrl-C to stop)", err=True,
    )

    def progress(c: Counts) -> None:
        late = ", ".join(f"{k}={v}" for k, v in sorted(c.late.items())) or "0"
        lag = sum(ingest.lag().values())
        click.echo(f"read {c.records} written {c.written} bad {c.bad} late {late} "
                   f"commits {c.commits} lag {lag}", err=True)

    with stop_on_signals() as stop:
        ingest.run(stop, progress, every)
    progress(ingest.counts())
    click.echo("stopped (a pause: the sources stay registered; a restart resumes)", err=True)
