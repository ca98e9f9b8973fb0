"""`substreams verify`: check the hash chains of the control topics (exit 1 on a break)."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from substreams.cli.options import bootstrap_option, config_option
from substreams.config import load_config
from substreams.control.verify import TopicReport, verify_config


def _table(reports: list[TopicReport]) -> Table:
    table = Table(title="control topics")
    table.add_column("topic", overflow="fold")
    table.add_column("records", justify="right")
    table.add_column("writer: last seq", overflow="fold")
    table.add_column("status", overflow="fold")
    for r in reports:
        seqs = "\n".join(f"{w}: {s}" for w, s in sorted(r.last_seq.items())) or "-"
        status = "[green]OK[/]" if r.broken is None else (
            f"[red]BROKEN at offset {r.broken.offset}: {r.broken.kind}[/]"
        )
        for brk, decision in r.resumed:
            status += (
                f"\n[yellow]break at offset {brk.offset} ({brk.kind}) resumed by "
                f"'{decision.operator}': {decision.reason}[/]"
            )
        if r.start_offset:
            status += f" (from offset {r.start_offset}: earlier records deleted by retention)"
        table.add_row(r.topic, str(r.records), seqs, status)
    return table


@click.command("verify")
@config_option
@bootstrap_option
@click.option("--substream", "substreams", multiple=True, metavar="NAME",
              help="Verify only this substream's control topic (repeatable).")
def command(config_path: str, bootstrap: str | None, substreams: tuple[str, ...]) -> None:
    """Walk every control topic from offset 0 and check each writer's hash chain.

    Reports per topic the records, writers and last seq, or the FIRST break: its offset,
    writer and why (undecodable record, seq gap or duplicate, prev_digest mismatch, digest
    mismatch = modified).  Breaks an operator accepted (`substreams control resume`) are
    listed as RESUMED and do not count.  Exit code 0 when all chains hold, 1 when one is
    broken.
    """
    config = load_config(config_path)
    reports = verify_config(config, substreams or None, bootstrap)
    Console(file=sys.stdout, soft_wrap=False).print(_table(reports))
    for r in reports:
        for brk, decision in r.resumed:
            click.echo(
                f"RESUMED {r.topic} offset {brk.offset} writer {brk.writer}: {brk.kind}: "
                f"accepted by '{decision.operator}': {decision.reason}"
            )
    broken = [r for r in reports if r.broken is not None]
    for r in broken:
        assert r.broken is not None
        click.echo(
            f"BROKEN {r.topic} offset {r.broken.offset} writer {r.broken.writer}: "
            f"{r.broken.kind}: {r.broken.detail}"
        )
    click.echo(f"{len(reports) - len(broken)} of {len(reports)} control topics OK")
    if broken:
        sys.exit(1)
