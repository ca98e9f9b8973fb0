"""`substreams demo`: the end-to-end run on the embedded defaults.

Starts the embedded broker, creates the config's topics, runs the acker, publishes a
generated click workload (with a progress bar) sealing each window as its event time
passes, and runs a Spark job that prints every epoch notification as it arrives (epoch,
record count, latency from seal).  Everything shuts down cleanly, also on Ctrl-C.
"""

from __future__ import annotations

import click

from substreams.cli.options import bootstrap_option, config_option


@click.command("demo")
@config_option
@bootstrap_option
@click.option(
    "--records", default=2000, show_default=True, type=click.IntRange(1), help="Clicks to publish."
)
@click.option("--users", default=20, show_default=True, type=click.IntRange(1), help="Users.")
@click.option(
    "--seconds",
    default=8.0,
    show_default=True,
    type=click.FloatRange(0.5),
    help="Event time the workload spans (the wall clock: windows close while Spark runs).",
)
@click.option(
    "--substream",
    default=None,
    help="A tumbling substream of the config (default: the first acker-tracked one).",
)
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
def command(
    config_path: str,
    bootstrap: str | None,
    records: int,
    users: int,
    seconds: float,
    substream: str | None,
    master: str,
) -> None:
    """Run the end-to-end demo: broker, acker, workload, and a Spark job printing epochs."""
    from substreams.spark.demo import run_demo

    report = run_demo(
        config_path,
        records,
        users=users,
        seconds=seconds,
        substream=substream,
        bootstrap=bootstrap,
        master=master,
    )
    if not report.complete and not report.interrupted:
        raise SystemExit(1)
