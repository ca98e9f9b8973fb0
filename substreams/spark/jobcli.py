"""The command line every example job shares (``python jobs/x.py`` or ``substreams submit``).

Why one helper: a job is an operator plus where it reads and writes; the flags (config,
substream, output, checkpoint, once) are the same for all of them, and ``substreams
submit`` passes the config through ``$SUBSTREAMS_CONFIG``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import click

from substreams.config import Config, load_config
from substreams.errors import SubstreamsError
from substreams.spark.log import driver_logging
from substreams.spark.operator import EpochOperator

ENV_CONFIG = "SUBSTREAMS_CONFIG"

OperatorFactory = Callable[[Config, str], EpochOperator]
"""(config, input substream) -> operator."""


def job_command(
    name: str,
    factory: OperatorFactory,
    substream: str,
    output: str | None,
) -> click.Command:
    """A click command running ``factory(...)`` with :func:`substreams.spark.run`."""

    def command(
        config_path: str | None,
        substream: str,
        output: str | None,
        checkpoint: str | None,
        query_name: str,
        trigger: str,
        once: bool,
        bootstrap: str | None,
        metrics_port: int | None,
        read: str,
    ) -> None:
        from substreams.spark.lifecycle import die_with_parent, record_user_error
        from substreams.spark.runner import run

        die_with_parent()
        driver_logging()
        path = config_path or os.environ.get(ENV_CONFIG) or "substreams.yaml"
        try:
            config = load_config(path)
            operator = factory(config, substream)
        except BaseException as exc:
            record_user_error(exc)  # `run` records its own
            if isinstance(exc, SubstreamsError):
                raise click.ClickException(str(exc)) from exc
            raise
        try:
            run(
                operator,
                config,
                substream,
                output or None,
                checkpoint=checkpoint,
                trigger=trigger,
                once=once,
                bootstrap=bootstrap,
                query_name=query_name,
                metrics_port=metrics_port,
                read=read,
            )
        except SubstreamsError as exc:
            raise click.ClickException(str(exc)) from exc

    for option in reversed(_job_options(name, substream, output)):
        command = option(command)
    return click.command(name, context_settings={"help_option_names": ["-h", "--help"]})(command)


def _job_options(
    name: str, substream: str, output: str | None
) -> list[Callable[[Callable[..., None]], Callable[..., None]]]:
    """The flags every job takes, in ``--help`` order; the defaults are the job's own."""
    return [
        click.option(
            "-c",
            "--config",
            "config_path",
            default=None,
            help=f"substreams.yaml (default: ${ENV_CONFIG}, else ./substreams.yaml).",
        ),
        click.option("--substream", default=substream, show_default=True, help="Input substream."),
        click.option("--output", default=output, show_default=True, help="Output stream."),
        click.option("--checkpoint", default=None, help="Spark checkpoint directory."),
        click.option(
            "--query-name",
            default=name,
            show_default=True,
            help="Identifies the query across restarts (checkpoint, output source id).",
        ),
        click.option("--trigger", default="100 milliseconds", show_default=True),
        click.option("--once", is_flag=True, help="Process what is complete now, then stop."),
        click.option("--bootstrap", default=None, help="Kafka bootstrap servers override."),
        click.option(
            "--metrics-port",
            type=click.IntRange(0, 65535),
            default=None,
            help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics.",
        ),
        click.option(
            "--read",
            type=click.Choice(["jvm", "python"]),
            default="jvm",
            show_default=True,
            help="Who reads the records: Spark's Kafka source + from_avro, or Python tasks.",
        ),
    ]


def main(command: click.Command, argv: Sequence[str] | None = None) -> None:
    command.main(
        args=list(argv) if argv is not None else None, prog_name=command.name, standalone_mode=True
    )
