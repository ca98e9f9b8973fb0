"""`substreams control ...`: operator decisions recorded on the control topics."""

from __future__ import annotations

import getpass

import click

from substreams.cli.options import bootstrap_option, config_option
from substreams.config import load_config
from substreams.control.verify import record_resume
from substreams.errors import SubstreamsError


@click.group("control")
def command() -> None:
    """Operator decisions about control topics, recorded on the topics themselves."""


@command.command("resume")
@config_option
@bootstrap_option
@click.option("--substream", metavar="NAME", help="The control topic of this substream.")
@click.option("--topic", metavar="TOPIC", help="A control topic by name (e.g. an acker's own).")
@click.option("--offset", type=click.IntRange(min=0), required=True,
              help="The offset of the break, as readers and `substreams verify` name it.")
@click.option("--reason", required=True, help="Why the record is acceptable (recorded).")
@click.option("--operator", default=None, metavar="NAME",
              help="Who decides (recorded; default: the login name).")
def resume(
    config_path: str,
    bootstrap: str | None,
    substream: str | None,
    topic: str | None,
    offset: int,
    reason: str,
    operator: str | None,
) -> None:
    """Accept the broken hash chain at OFFSET and let readers continue past it.

    A reader stops at a broken chain and names the offset; after checking the record there
    (e.g. with `substreams verify`), this writes a ChainResume control record -- hash-chained
    in the operator's own chain -- that accepts exactly that record (writer, seq and digest
    pinned).  Readers that meet the break then take the record as the writer's new chain
    head, log the decision and go on.  Refused unless OFFSET is a break no one accepted yet.
    """
    config = load_config(config_path)
    if (substream is None) == (topic is None):
        raise SubstreamsError("give exactly one of --substream NAME or --topic TOPIC")
    name = topic if topic is not None else config.acker.control_topic(
        config.substream(str(substream)).name
    )
    at, decision = record_resume(
        config, name, offset, reason, operator or getpass.getuser(), bootstrap
    )
    click.echo(
        f"resumed: control topic '{name}' offset {offset} (writer '{decision.writer}', seq "
        f"{decision.seq}) accepted by '{decision.operator}'; decision recorded at offset {at}"
    )
