"""`substreams dead-letters list|show|replay`: read the dead-letter topic back.

Every service writes what it cannot use to ``acker.dead_letter_topic``
(:mod:`substreams.streams.deadletter`); this command lists those letters (filtered by
reason, stream, substream and when they were written), decodes one with its stream's
schemas, and replays the records they hold -- as they are, or fixed -- through a
publisher of the stream, exactly once, for the times still open
(:mod:`substreams.dead_letters`).  ``substreams dead-letters -c FILE`` alone lists.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from substreams.cli.options import bootstrap_option, config_option
from substreams.config import Config, load_config
from substreams.streams.letters import (
    Decision,
    LetterFilter,
    StoredLetter,
    parse_id,
    record_identity,
    replayed_identities,
)

_HELP = {"help_option_names": ["-h", "--help"]}
FAILED = frozenset({"notified", "not_a_record", "no_payload", "refused", "unknown_substream"})
"""Outcomes of a replay that leave a selected record unpublished (exit code 1)."""


def _progress(line: str) -> None:
    click.echo(line, err=True)


def _filter_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--reason", "reasons", multiple=True, metavar="REASON",
                      help="Only letters with this reason (repeatable): malformed, "
                      "late_record, terminated_time, unknown_substream, ..."),
        click.option("--stream", "streams", multiple=True, metavar="STREAM",
                     help="Only letters of records read from (or bound for) this stream's "
                     "topic (repeatable)."),
        click.option("--substream", "substreams", multiple=True, metavar="NAME",
                     help="Only letters that name this substream (repeatable)."),
        click.option("--since", default=None, metavar="WHEN",
                     help="Only letters written at or after WHEN: epoch ms, an ISO date/time "
                     "or a duration ago (15m, 2h, 7d)."),
        click.option("--until", default=None, metavar="WHEN",
                     help="Only letters written before WHEN (same forms as --since)."),
    ]):
        f = option(f)
    return f


def _letter_filter(reasons: tuple[str, ...], streams: tuple[str, ...],
                   substreams: tuple[str, ...], since: str | None,
                   until: str | None) -> LetterFilter:
    from substreams.dead_letters import parse_when

    return LetterFilter(
        frozenset(reasons), frozenset(streams), frozenset(substreams),
        None if since is None else parse_when(since),
        None if until is None else parse_when(until),
    )


def _when(ms: int) -> str:
    if ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def _where(stored: StoredLetter) -> str:
    letter = stored.letter
    if letter is None:
        return "-"
    return f"{letter.topic}[{letter.partition}]@{letter.offset}"


@click.group("dead-letters", invoke_without_command=True, context_settings=_HELP)
@config_option
@bootstrap_option
@click.pass_context
def command(ctx: click.Context, config_path: str, bootstrap: str | None) -> None:
    """Read the dead-letter topic: list letters, show one decoded, replay the records they
    hold.  Without a sub-command: list every letter."""
    ctx.ensure_object(dict)
    ctx.obj.update(config_path=config_path, bootstrap=bootstrap)
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_command)


def _config(ctx: click.Context, config_path: str | None, bootstrap: str | None
            ) -> tuple[Config, str | None]:
    """The config and bootstrap given to the sub-command, or else to the group."""
    parent = ctx.obj or {}
    path = config_path or parent.get("config_path") or "substreams.yaml"
    return load_config(path), bootstrap or parent.get("bootstrap")


_sub_config = click.option("-c", "--config", "config_path", default=None,
                           type=click.Path(dir_okay=False),
                           help="The substreams YAML configuration (default: the group's "
                           "-c, else substreams.yaml).")


@command.command("list", context_settings=_HELP)
@_sub_config
@bootstrap_option
@_filter_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per letter.")
@click.pass_context
def list_command(
    ctx: click.Context,
    config_path: str | None = None,
    bootstrap: str | None = None,
    reasons: tuple[str, ...] = (),
    streams: tuple[str, ...] = (),
    substreams: tuple[str, ...] = (),
    since: str | None = None,
    until: str | None = None,
    as_json: bool = False,
) -> None:
    """List dead letters, oldest first: id (partition:offset in the dead-letter topic),
    when written, reason, where the record was read (topic[partition]@offset; -1: it never
    got one), source, detail; a letter already replayed says so."""
    from substreams.dead_letters import letter_json, read_letters

    config, boot = _config(ctx, config_path, bootstrap)
    chosen = _letter_filter(reasons, streams, substreams, since, until)
    letters = list(read_letters(config, boot, since_ms=chosen.since_ms, progress=_progress))
    replayed = replayed_identities(letters)
    shown = 0
    for stored in letters:
        if not chosen.matches(stored):
            continue
        shown += 1
        by = replayed.get(record_identity(stored)) if stored.letter is not None else None
        if as_json:
            click.echo(json.dumps(letter_json(stored, replayed=by), separators=(",", ":")))
            continue
        letter = stored.letter
        if letter is None:
            click.echo(f"{stored.id}  {_when(stored.timestamp_ms)}  unreadable  {stored.error}")
            continue
        state = f"  [replayed: {by}]" if by else ""
        source = letter.source or "-"
        click.echo(
            f"{stored.id}  {_when(stored.timestamp_ms)}  {letter.reason}  {_where(stored)}  "
            f"source={source}  by={letter.service}{state}  {letter.detail}"
        )
    if not as_json:
        click.echo(f"{shown} dead letter(s) of {sum(not s.is_marker for s in letters)} in "
                   f"'{config.acker.dead_letter_topic}'", err=True)


@command.command("show", context_settings=_HELP)
@click.argument("letter_id", metavar="ID")
@_sub_config
@bootstrap_option
@click.option("--json", "as_json", is_flag=True, help="The letter as one JSON object.")
@click.pass_context
def show_command(ctx: click.Context, letter_id: str, config_path: str | None,
                 bootstrap: str | None, as_json: bool) -> None:
    """Show the letter ID (PARTITION:OFFSET as `list` prints it, or OFFSET) with its raw
    bytes decoded where they can be: a stream's record with its writer schema (the schema
    registry topic has every one the stream used), a late record's payload (JSON), an
    acker message; else why not, and the bytes (base64).  A letter whose record was
    replayed names the replay's marker (replayed_by); a marker (replay history, not a
    letter) names the record and the letter it replayed."""
    from substreams.dead_letters import LetterDecoder, find_letter, letter_json, read_letters

    config, boot = _config(ctx, config_path, bootstrap)
    partition, offset = parse_id(letter_id)
    stored = find_letter(config, partition, offset, boot)
    decoded = LetterDecoder(config, boot).decode(stored)
    by = None
    if stored.letter is not None and not stored.is_marker:
        # a replay's marker comes after the letter it read: from the letter's time on
        later = read_letters(config, boot, since_ms=stored.timestamp_ms, progress=_progress)
        by = replayed_identities(later).get(record_identity(stored))
    doc = letter_json(stored, decoded, replayed=by)
    if as_json:
        click.echo(json.dumps(doc, separators=(",", ":")))
        return
    for key, value in doc.items():
        if key == "decoded":
            continue
        click.echo(f"{key:>10}: {value}")
    click.echo(f"{'decoded':>10}: {decoded.kind}" + (f" ({decoded.error})" if decoded.error
                                                     else ""))
    if decoded.value is not None:
        click.echo(json.dumps(doc["decoded"]["value"], indent=2, sort_keys=True))


@command.command("replay", context_settings=_HELP)
@_sub_config
@bootstrap_option
@_filter_options
@click.option("--id", "ids", multiple=True, metavar="ID",
              help="Only these letters (repeatable; PARTITION:OFFSET or OFFSET).")
@click.option("--fixed", "fixed_path", default=None, metavar="FILE.jsonl",
              type=click.Path(exists=True, dir_okay=False),
              help='Replacement payloads, one JSON object a line: {"id": "P:O", "payload": '
              "{...}} (for letters whose bytes do not decode, or hold a wrong value).")
@click.option("--dry-run", is_flag=True, help="Say what would be done; publish nothing.")
@click.option("--commit-every", type=click.IntRange(min=1), default=500, show_default=True,
              help="Records per transaction (each with its replayed marker).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per letter.")
@click.pass_context
def replay_command(
    ctx: click.Context,
    config_path: str | None,
    bootstrap: str | None,
    reasons: tuple[str, ...],
    streams: tuple[str, ...],
    substreams: tuple[str, ...],
    since: str | None,
    until: str | None,
    ids: tuple[str, ...],
    fixed_path: str | None,
    dry_run: bool,
    commit_every: int,
    as_json: bool,
) -> None:
    """Republish the records the selected letters hold, through a publisher of their
    stream (source `dead-letters.replay`), exactly once: a record already replayed (by
    this or an earlier, maybe killed, run; or held by another letter) is skipped, and one
    whose time in any substream of its stream was already notified is not republished
    (the line says which).  Prints one line per letter; exit code 1 if any selected letter
    was not republished for a reason other than an earlier replay."""
    from substreams.dead_letters import (
        fence_replays,
        load_fixed,
        plan_replay,
        read_letters,
    )
    from substreams.dead_letters import replay as run_replay

    config, boot = _config(ctx, config_path, bootstrap)
    chosen_filter = _letter_filter(reasons, streams, substreams, since, until)
    wanted = {parse_id(i) for i in ids}
    fixed = load_fixed(fixed_path) if fixed_path else {}
    fixed = {f"{p}:{o}": v for k, v in fixed.items() for p, o in [parse_id(k)]}
    if not dry_run:
        fence_replays(config, boot)  # before reading: a killed replay's markers are settled
    letters = list(read_letters(config, boot, progress=_progress))
    chosen = [s for s in letters if chosen_filter.matches(s)
              and (not wanted or (s.partition, s.offset) in wanted)]
    missing = wanted - {(s.partition, s.offset) for s in chosen}
    if missing:
        names = ", ".join(f"{p}:{o}" for p, o in sorted(missing))
        raise click.ClickException(
            f"no such letter in '{config.acker.dead_letter_topic}' (or not selected): {names}"
        )
    decisions = plan_replay(config, letters, chosen, fixed, boot)
    failed = 0

    def report(d: Decision, outcome: str, line: str) -> None:
        nonlocal failed
        if outcome in FAILED:
            failed += 1
        if as_json:
            click.echo(json.dumps({"id": d.stored.id, "record": d.identity, "outcome": outcome,
                                   "message": line}, separators=(",", ":")))
        else:
            click.echo(f"{d.stored.id}  {outcome}  {line}")

    if dry_run:
        for d in decisions:
            report(d, d.outcome, d.message)
        return
    done = run_replay(config, decisions, bootstrap=boot, commit_every=commit_every,
                      progress=_progress, report=report)
    click.echo(f"republished {done} of {len(chosen)} selected letter(s)", err=True)
    if failed:
        sys.exit(1)
