"""The `substreams` command.

Each sub-command lives in its own module of this package and exports ``command`` (a click
command or group); they are named in ``COMMANDS`` so that adding one touches no other file.
Commands of optional parts (``substreams bench``, package ``substreams_bench``) come from the
``substreams.commands`` entry points, so this package never imports them; one whose extra is
not installed answers with a one-line error saying how to get it.  User mistakes (bad
config, no broker, fenced publisher...) are `SubstreamsError`s and print one ``error:`` line
with exit code 2, never a traceback.

Why lazily (click's lazy group): a launch imports only the module of the command it runs --
the services and tests start hundreds of ``substreams`` processes, and importing every
command's dependencies cost each about 0.1 CPU-s.  ``--help`` still loads them all to list
each with its short help.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from typing import TYPE_CHECKING, Any

import click
from confluent_kafka import KafkaException

from substreams.errors import SubstreamsError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

COMMANDS = (
    "broker", "topics", "config", "demo", "verify", "control", "align", "acker", "submit", "tail",
    "ui", "spark_cluster", "dead_letters", "acls", "ingest",
)
"""Modules ``substreams.cli.<name>_cmd``; the command's name is the module's with ``-`` for
``_``."""


class _Main(click.Group):
    """The root group: loads a command's module when that command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_builtin(), *(e.name for e in _entries())})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            loaded = _load(cmd_name)
            if loaded is not None:
                self.add_command(loaded, cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SubstreamsError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(2)
        except KafkaException as exc:
            click.secho(f"error: Kafka: {exc.args[0]}", fg="red", err=True)
            sys.exit(2)


def _builtin() -> list[str]:
    """The names of the commands of ``COMMANDS`` whose module exists."""
    names = [name.replace("_", "-") for name in COMMANDS]
    return [name for name in names if _module_of(name) is not None]


def _module_of(cmd_name: str) -> str | None:
    """The module of built-in command ``cmd_name``, if it is one and the module exists."""
    name = cmd_name.replace("-", "_")
    if "_" in cmd_name or name not in COMMANDS:
        return None
    module_name = f"substreams.cli.{name}_cmd"
    return module_name if importlib.util.find_spec(module_name) is not None else None


def _entries() -> list[EntryPoint]:
    """The optional parts' commands (read from the installed packages' metadata: only when
    a name is not built in, or for ``--help``)."""
    from importlib.metadata import entry_points

    return list(entry_points(group="substreams.commands"))


def _load(cmd_name: str) -> click.Command | None:
    """The command named ``cmd_name``, its module imported now; None if there is none."""
    module_name = _module_of(cmd_name)
    if module_name is not None:
        command: click.Command = importlib.import_module(module_name).command
        return command
    for entry in _entries():
        if entry.name == cmd_name:
            try:
                loaded: click.Command = entry.load()
            except ImportError as exc:
                return _unavailable(entry.name, str(exc))
            return loaded
    return None


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



def main() -> None:
    cli(prog_name="substreams")


if __name__ == "__main__":
    main()
