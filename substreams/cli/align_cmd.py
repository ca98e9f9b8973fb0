"""`substreams align`: run the punctuation aligner of one substream until Ctrl-C."""

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
from substreams.punctuation.aligner import Terminated


@click.command("align")
@config_option
@bootstrap_option
@click.option("--substream", "substream", required=True, metavar="NAME",
              help="A substream with mechanism: punctuations.")
@click.option("-v", "--verbose", is_flag=True, help="Print a line per terminated time.")
@metrics_port_option
def command(
    config_path: str, bootstrap: str | None, substream: str, verbose: bool,
    metrics_port: int | None,
) -> None:
    """Align the punctuations of SUBSTREAM and write its control topic (EpochComplete per
    terminated time), so subscribers and Spark jobs follow it as they follow the acker.
    Stops cleanly on Ctrl-C."""
    from substreams.app import Application

    config = load_config(config_path)
    def report(ev: Terminated) -> None:
        ranges = " ".join(f"{r.partition}:[{r.start},{r.end})" for r in ev.ranges) or "-"
        click.echo(f"terminated {ev.time!r} records={ev.records} ranges={ranges}")

    aligner = Application(config, bootstrap).aligner(
        substream, on_terminated=report if verbose else None
    )
    serve_metrics(metrics_port)
    click.echo(f"aligning '{substream}' -> {aligner.topic} (Ctrl-C to stop)", err=True)
    try:
        with stop_on_signals() as stop:
            aligner.run(stop)
    finally:
        aligner.close()
    click.echo(
        f"stopped: {aligner.tracker.completed} times complete, {aligner.late} late records",
        err=True,
    )
