"""`substreams acker run|status|epochs|peek`: run the acker and inspect it over its command
protocol (the CLI is a controller like any other: it says Hello and reads responses).

With several shards every shard serves the command protocol for what it owns: status and
epochs ask them all and merge the answers, a peek asks the substream's shard, and a shard
that does not answer within ``--timeout`` is named (exit code 2) after what the others
answered, never left out silently."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from substreams.acker.client import AckerClient, ShardStatus
from substreams.acker.commands import (
    PeekResponse,
    PeekRow,
    format_time,
    format_times,
    parse_time,
)
from substreams.cli.options import (
    bootstrap_option,
    config_option,
    metrics_port_option,
    serve_metrics,
    stop_on_signals,
)
from substreams.config import Config, load_config
from substreams.errors import SubstreamsError
from substreams.frontier import Time, time_to_wire

if TYPE_CHECKING:
    from substreams.acker.state import SourceLiveness

timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the acker's answer.",
)


shards_option = click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=None,
    help="How many shards the acker runs as (default: acker.shards of the config); every "
    "shard is asked.",
)


class TimeParam(click.ParamType[Time]):
    """A logical time: 5, 1,2 (a tuple) or key@5 / key@1,2 (keyed)."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Time:
        if not isinstance(value, str):
            return value  # type: ignore[no-any-return]
        try:
            return parse_time(value)
        except SubstreamsError as exc:
            self.fail(str(exc), param, ctx)


@click.group("acker")
def command() -> None:
    """Run the acker service and inspect it (status, open epochs, peeks)."""


def _age(at_ms: int) -> str:
    if at_ms <= 0:
        return "-"
    s = max(0.0, time.time() - at_ms / 1000.0)
    return f"{s * 1000:.0f} ms ago" if s < 1 else f"{s:.1f} s ago"


def _held_for(since_ms: int) -> str:
    """How long since ``since_ms``, as a duration (the "for" of a hold)."""
    s = max(0.0, time.time() - since_ms / 1000.0)
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"


def _holds(row: SourceLiveness) -> str:
    """The time a source holds back; with its substream when it is in several."""
    if row.held is None:
        return "-"
    at = format_time(row.held.time)
    return at if len(row.substreams) == 1 else f"{at} ({row.held.substream})"


def _hex(x: int) -> str:
    return f"{x:016x}"


# -- run ---------------------------------------------------------------------------------------


@command.command()
@config_option
@bootstrap_option
@click.option("--standby", is_flag=True, help="Wait until the active acker stops, then take over.")
@click.option("--name", default=None, help="Acker name (default: acker.name of the config).")
@click.option(
    "--shard",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Which shard this process is: it owns the acks partitions p with p % shards == shard.",
)
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=None,
    help="How many shards share the acks partitions (default: acker.shards of the config).",
)
@click.option(
    "--from-shards",
    type=click.IntRange(min=1),
    default=None,
    help="The layout changes: take this shard's partitions over from the shards of the "
    "previous layout of this many shards (fenced and retired on the way).",
)
@click.option(
    "--every",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Print a line every N notifications.",
)
@metrics_port_option
def run(
    config_path: str,
    bootstrap: str | None,
    standby: bool,
    name: str | None,
    shard: int,
    shards: int | None,
    from_shards: int | None,
    every: int,
    metrics_port: int | None,
) -> None:
    """Run the acker until Ctrl-C or SIGTERM (a clean stop: the last transaction commits).

    With several shards, run one process per shard (``--shard i``), each with its own
    ``--standby`` if wanted; each serves the command protocol for its own substreams."""
    from substreams.acker.service import AckerService, relax_gc
    from substreams.app import Application

    config = load_config(config_path)
    relax_gc()  # this process is the acker's own
    printed = [0]

    def progress(svc: AckerService) -> None:
        if svc.notifications // every > printed[0]:
            printed[0] = svc.notifications // every
            last = max(
                ((s, v) for s, v in svc.state.last_notification.items() if v is not None),
                key=lambda sv: sv[1][1],
                default=None,
            )
            detail = f"; last {last[0]}@{format_time(last[1][0])}" if last else ""
            click.echo(f"{svc.notifications} notifications{detail}")

    try:
        # Every shard answers commands for what it owns, under its own name.
        service = Application(config, bootstrap).acker(
            name=name, standby=standby, shard=shard, shards=shards, from_shards=from_shards,
            on_step=progress,
        )
    except SubstreamsError as exc:
        raise click.UsageError(str(exc)) from exc
    serve_metrics(metrics_port)
    subs = ", ".join(service.segments) or "(none)"
    mode = "standby (takes over when the active acker stops)" if standby else "active"
    click.echo(
        f"acker '{service.name}' {mode} on {service.bootstrap}: tracking {subs}; "
        f"commands on '{config.acker.command_topic}'"
    )
    with stop_on_signals() as stop:
        service.run(stop)  # closes the service and its command handler
    click.echo(f"acker '{service.name}' stopped after {service.notifications} notifications")


# -- inspection --------------------------------------------------------------------------------


def _session(
    config: Config, bootstrap: str | None, timeout: float, shards: int | None
) -> tuple[AckerClient, ShardStatus]:
    """A controller session (Hello, CreateInstance, InitializationComplete) and the status
    of every shard that answered its Hello."""
    ctl = AckerClient(config, bootstrap, timeout=timeout, shards=shards)
    try:
        status = ctl.connect_all()
    except BaseException:
        ctl.close()
        raise
    return ctl, status


def _missing(ctl: AckerClient, missing: tuple[str, ...], timeout: float) -> None:
    """Say which shards did not answer and what is therefore not shown (exit code 2)."""
    if not missing:
        return
    config = ctl.config
    parts = []
    for name in missing:
        shard = ctl.ackers.index(name)
        subs = [s.name for s in config.substreams if ctl.owner(s.name) == name]
        acks = [p for p in range(config.acker.acks_partitions) if p % ctl.shards == shard]
        parts.append(f"shard {shard} ('{name}': substreams {', '.join(subs) or '(none)'}; "
                     f"acks partitions {', '.join(map(str, acks))})")
    raise SubstreamsError(
        f"{len(missing)} of {ctl.shards} acker shards did not answer within {timeout:g} s, "
        f"so what they own is not shown above: {'; '.join(parts)}; is `substreams acker run "
        "--shard I` running for each?"
    )


@command.command()
@config_option
@bootstrap_option
@timeout_option
@shards_option
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object (times in their wire form) instead of tables.")
def status(
    config_path: str, bootstrap: str | None, timeout: float, shards: int | None, as_json: bool
) -> None:
    """Frontiers, open times, acks lag and the last notification of every substream (every
    shard is asked; the answers are merged)."""
    ctl, hello = _session(load_config(config_path), bootstrap, timeout, shards)
    with ctl:
        t0 = time.monotonic()
        # A shard silent to the Hello is not waited for again (a second full timeout).
        merged = ctl.status_all(ackers=hello.answered)
        missing = tuple(n for n in ctl.ackers if n not in merged.answered)
        rtt = (time.monotonic() - t0) * 1000
        st = merged.status
        lags = ctl.acks_lag(st)
    if as_json:
        click.echo(json.dumps(_status_json(ctl, merged, missing, rtt, lags)))
        _missing(ctl, missing, timeout)
        return
    console = Console()
    sharded = ctl.shards > 1
    if sharded:
        title = (f"acker '{ctl.base}': {len(merged.answered)} of "
                 f"{ctl.shards} shards answered in {rtt:.0f} ms")
    else:
        title = f"acker '{ctl.acker}' (answered in {rtt:.0f} ms)"
    table = Table(title=title)
    cols = ("substream", *(("shard",) if sharded else ()), "lower", "upper", "open times",
            "compacted to", "last notification")
    for col in cols:
        table.add_column(col, justify="right" if col == "open times" else "left")
    for s in st.substreams:
        last = "-"
        if s.last_notification is not None:
            t, at = s.last_notification
            last = f"{format_time(t)} ({_age(at)})"
        since = "-" if s.since is None else format_times(s.since)
        owner = ctl.owner(s.substream)
        table.add_row(
            s.substream,
            *((str(ctl.ackers.index(owner)) if owner else "?",) if sharded else ()),
            format_times(s.lower),
            format_times(s.upper),
            str(s.open_times),
            since,
            last,
        )
    console.print(table)
    acks = Table(title="acks topic")
    for col in ("partition", "next offset", "lag"):
        acks.add_column(col, justify="right")
    for a in st.acks:
        acks.add_row(str(a.partition), str(a.offset), str(lags.get(a.partition, "?")))
    if not st.acks:
        acks.add_row("-", "nothing read yet", "-")
    console.print(acks)
    if st.configured:
        console.print(f"configured by a controller: {', '.join(st.configured)}")
    _missing(ctl, missing, timeout)


def _status_json(
    ctl: AckerClient, merged: ShardStatus, missing: tuple[str, ...], rtt_ms: float,
    lags: dict[int, int],
) -> dict[str, Any]:
    """``acker status --json``: what the tables show, for scripts."""
    st = merged.status

    def times(ts: Any) -> Any:
        return None if ts is None else [time_to_wire(t) for t in ts]

    subs = []
    for s in st.substreams:
        owner = ctl.owner(s.substream)
        last = None
        if s.last_notification is not None:
            last = {"time": time_to_wire(s.last_notification[0]),
                    "at_ms": s.last_notification[1]}
        subs.append({
            "substream": s.substream,
            "shard": ctl.ackers.index(owner) if owner else None,
            "lower": times(s.lower), "upper": times(s.upper),
            "open_times": s.open_times, "compacted_to": times(s.since),
            "last_notification": last,
        })
    return {
        "acker": ctl.base, "shards": ctl.shards, "stage": str(st.stage.value)
        if hasattr(st.stage, "value") else str(st.stage),
        "answered": list(merged.answered), "missing": list(missing),
        "answered_in_ms": round(rtt_ms, 1), "substreams": subs,
        "acks": [{"partition": a.partition, "next_offset": a.offset,
                  "lag": lags.get(a.partition)} for a in st.acks],
        "configured": list(st.configured),
    }


def _rows_table(title: str, rows: list[tuple[str, PeekRow]], show_state: bool) -> Table:
    table = Table(title=title)
    cols = [
        "substream",
        "time",
        *(["state"] if show_state else []),
        "xor",
        "records",
        "unsealed sources",
        "first seen",
    ]
    for col in cols:
        if col == "xor":
            table.add_column(col, min_width=16, no_wrap=True)
        else:
            table.add_column(col, justify="right" if col == "records" else "left")
    for sub, r in rows:
        sealed = ", ".join(r.unsealed_sources) or "-"
        state = [r.state] if show_state else []
        table.add_row(
            sub,
            format_time(r.time),
            *state,
            _hex(r.xor),
            str(r.records),
            sealed,
            _age(r.first_seen_ms),
        )
    return table


def _peek(ctl: AckerClient, substream: str, t: Time | None) -> PeekResponse:
    resp = ctl.peek(substream, t)
    if resp.error is not None:
        raise SubstreamsError(f"acker '{ctl.acker}': {resp.error}")
    return resp


@command.command()
@config_option
@bootstrap_option
@timeout_option
@shards_option
@click.option("--substream", "-s", default=None, help="Only this substream (default: all).")
def epochs(
    config_path: str, bootstrap: str | None, timeout: float, shards: int | None,
    substream: str | None,
) -> None:
    """The open times: their XOR state, record counts and the sources that have not sealed
    (each substream's from the shard that owns it)."""
    config = load_config(config_path)
    if substream is not None:
        config.substream(substream)  # a ConfigError naming the known ones
    ctl, merged = _session(config, bootstrap, timeout, shards)
    names = [substream] if substream else [s.substream for s in merged.status.substreams]
    rows: list[tuple[str, PeekRow]] = []
    with ctl:
        for name in names:
            rows += [(name, r) for r in _peek(ctl, name, None).rows]
    if not rows:
        click.echo("no open times: every substream is complete up to its frontier")
    else:
        Console().print(_rows_table(f"open times ({len(rows)})", rows, show_state=False))
    if substream is None:
        _missing(ctl, merged.missing, timeout)


@command.command()
@config_option
@bootstrap_option
@timeout_option
@shards_option
@click.option("--substream", "-s", required=True, help="The substream to peek at.")
@click.option(
    "--time",
    "-t",
    "at",
    type=TimeParam(),
    default=None,
    help="One time: 5, 1,2 or key@5 (default: every open time).",
)
def peek(
    config_path: str, bootstrap: str | None, timeout: float, shards: int | None,
    substream: str, at: Time | None,
) -> None:
    """The acker's state of one substream (asked of the shard that owns it): its open times,
    or one time (open or complete)."""
    config = load_config(config_path)
    config.substream(substream)  # a ConfigError naming the known ones
    ctl, _ = _session(config, bootstrap, timeout, shards)
    with ctl:
        resp = _peek(ctl, substream, at)
    if not resp.rows:
        what = f"time {format_time(at)}" if at is not None else "open times"
        click.echo(f"{substream}: no {what} known to the acker (not seen yet)")
        return
    console = Console()
    console.print(_rows_table(f"peek {substream}", [(substream, r) for r in resp.rows], True))
    for r in resp.rows:
        if r.state == "COMPLETE" and r.ranges:
            spans = ", ".join(f"{x.stream}[{x.partition}] {x.start}..{x.end}" for x in r.ranges)
            console.print(f"{format_time(r.time)}: {spans}")


# -- sources -----------------------------------------------------------------------------------


@command.command()
@config_option
@bootstrap_option
@click.option("--name", default=None, help="Acker name (default: acker.name of the config).")
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=None,
    help="How many shards the acker runs as (default: acker.shards of the config); every "
    "shard's sources are listed, with the shard that tracks them.",
)
def sources(config_path: str, bootstrap: str | None, name: str | None, shards: int | None
            ) -> None:
    """List the sources the acker knows, with their liveness and the oldest time each live
    one has not sealed ("holds", "for": since when it holds it back), from each shard's
    latest checkpoint, at most acker.heartbeat_ms old."""
    from substreams.acker.service import latest_state
    from substreams.acker.state import source_liveness

    config = load_config(config_path)
    n = shards or config.acker.shards
    base = name or config.acker.name
    table = Table(title=f"sources of acker '{base}'" + (f" ({n} shards)" if n > 1 else ""))
    for col in (("shard",) if n > 1 else ()) + (
        "source", "incarnation", "role", "substreams", "last heard", "state", "holds", "for"
    ):
        # names and verdicts stay whole on a narrow terminal; the rest gives way
        table.add_column(col, no_wrap=col in ("source", "state", "for"))
    timeout = config.acker.source_timeout_ms
    written: list[str] = []
    held = Table(title="open transactions holding acks partitions (sources behind them are "
                 "not judged silent)")
    for col in ("acks partition", "held at offset", "open transaction of", "since", "verdict"):
        held.add_column(col)
    for shard in range(n):
        shard_name = config.acker.shard_name(shard, n, base)
        found = latest_state(config, bootstrap, shard_name)
        if found is None:
            raise SubstreamsError(
                f"acker '{shard_name}' has written no checkpoint yet; is it running?"
            )
        state, written_ms = found
        written.append(f"{shard_name} {_age(written_ms)}")
        for row in source_liveness(state, written_ms, timeout):
            table.add_row(
                *((str(shard),) if n > 1 else ()),
                row.source,
                row.incarnation,
                ",".join(row.roles) or "-",
                ", ".join(row.substreams) or "-",
                _age(row.last_seen_ms),
                row.status,
                _holds(row),
                "-" if row.held is None else _held_for(row.held.since_ms),
            )
        for b in state.blockers:
            held.add_row(str(b.partition), str(b.offset), b.holder(),
                         _age(b.since_ms), b.verdict)
    Console().print(table)
    if held.row_count:
        Console().print(held)
    unsealed = config.acker.unsealed_timeout_ms
    click.echo(
        f"checkpoint written: {'; '.join(written)}; evicted after {timeout} ms of silence"
        + ("" if unsealed is None else f" or {unsealed} ms holding a time unsealed")
        + ", but 'kept' sources (a Spark query's driver), which only evict-source evicts"
    )


@command.command("evict-source")
@config_option
@bootstrap_option
@click.argument("source")
@click.option("--reason", default="operator", show_default=True, help="Recorded with it.")
def evict_source(config_path: str, bootstrap: str | None, source: str, reason: str) -> None:
    """Evict SOURCE now: the acker fences it and stops waiting for its seals (what it
    committed stays tracked; a SourceEvicted record goes on the control topics)."""
    from substreams.acker.protocol import AckMessage, Evict, ack_headers, encode_ack
    from substreams.kafka import client

    config = load_config(config_path)
    server = client.resolve_bootstrap(config, bootstrap)
    producer = client.producer(server, config)
    msg = AckMessage("operator", -1, int(time.time() * 1000), Evict(source, reason))
    # Every acks partition: the source may write to several (one per segment partition),
    # and the shard owning each evicts it there, after what it wrote there before.
    for partition in range(config.acker.acks_partitions):
        producer.produce(
            config.acker.acks_topic, encode_ack(msg), partition=partition, headers=ack_headers()
        )
    if producer.flush(10):
        raise SubstreamsError(f"could not write the eviction to '{config.acker.acks_topic}'")
    click.echo(f"eviction of '{source}' sent to the acker (see `substreams acker sources`)")
