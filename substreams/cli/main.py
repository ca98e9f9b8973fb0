"""The `substreams` command.

Each sub-command lives in its own module of this package and exports ``command`` (a click
command or group); they are discovered from ``COMMANDS`` so that adding one touches no other
file.  Commands of optional parts (``substreams bench``, package ``substreams_bench``) come
from the ``substreams.commands`` entry points, so this package never imports them; one whose
extra is not installed answers with a one-line error saying how to get it.  User mistakes
(bad config, no broker, fenced publisher...) are `SubstreamsError`s and print one
``error:`` line with exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys
from importlib.metadata import entry_points
from typing import Any

import click
from confluent_kafka import KafkaException

from substreams.errors import SubstreamsError

COMMANDS = (
    "broker", "topics", "config", "demo", "verify", "control", "align", "acker", "submit", "tail",
    "ui", "spark_cluster",
)


class _Main(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SubstreamsError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(2)
        except KafkaException as exc:
            click.secho(f"error: Kafka: {exc.args[0]}", fg="red", err=True)
            sys.exit(2)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="substreams")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="WARNING",
    show_default=True,
    help="What the services log to stderr (evictions, recoveries and retries are WARNING).",
)
def cli(log_level: str) -> None:
    """Substream management on Kafka: punctuations, the trAcker acker, frontiers and
    firm-bound epoch notifications for Python and PySpark."""
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _register() -> None:
    for name in COMMANDS:
        module_name = f"substreams.cli.{name}_cmd"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        cli.add_command(module.command)
    for entry in entry_points(group="substreams.commands"):
        try:
            cli.add_command(entry.load(), entry.name)
        except ImportError as exc:
            cli.add_command(_unavailable(entry.name, str(exc)))


def _unavailable(name: str, reason: str) -> click.Command:
    """A stand-in for a command whose optional dependencies are missing: any use of it,
    ``--help`` included, prints why and exits 2."""

    def fail(args: tuple[str, ...]) -> None:
        click.secho(f"error: substreams {name}: {reason}", fg="red", err=True)
        sys.exit(2)

    return click.Command(
        name,
        callback=fail,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        add_help_option=False,
        context_settings={"ignore_unknown_options": True},
        help=f"(unavailable: {reason})",
    )


_register()


def main() -> None:
    cli(prog_name="substreams")


if __name__ == "__main__":
    main()
