"""`substreams tail STREAM`: decode a stream in the terminal."""

from __future__ import annotations

import click

from substreams.acker.commands import format_time
from substreams.cli.options import bootstrap_option, config_option, stop_on_signals
from substreams.config import load_config
from substreams.streams.tail import json_line, open_listener, tail


@click.command("tail")
@click.argument("stream")
@config_option
@bootstrap_option
@click.option("--from-index", type=int, default=None, metavar="N",
              help="Start at this index (offset) in every partition (default: 0).")
@click.option("--from-order-key", type=int, default=None, metavar="K",
              help="Start at the first entry whose order key is >= K (per partition).")
@click.option("-f", "--follow", is_flag=True, help="Keep waiting for new entries (Ctrl-C stops).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def command(
    stream: str,
    config_path: str,
    bootstrap: str | None,
    from_index: int | None,
    from_order_key: int | None,
    follow: bool,
    as_json: bool,
) -> None:
    """Print the entries of STREAM, decoded (old records in the current schema's shape),
    up to its end or, with --follow, as they arrive.  The same lines come from the
    dashboard's /tail/STREAM endpoint (`substreams ui`).  A record that does not decode
    (foreign bytes, an unknown schema, truncated) is dead-lettered and passed over, and
    the count is said on stderr at the end; under the stream's `on_bad_record: fail` it
    stops the tail (exit code 2) naming its partition and offset."""
    if from_index is not None and from_order_key is not None:
        raise click.UsageError("give --from-index or --from-order-key, not both")
    config = load_config(config_path)
    listener = open_listener(
        config, stream, from_index=from_index, from_order_key=from_order_key, bootstrap=bootstrap
    )
    try:
        with stop_on_signals() as stop:
            for entry in tail(listener, follow=follow, stop=stop):
                if as_json:
                    click.echo(json_line(entry))
                else:
                    times = " ".join(f"{k}@{format_time(t)}" for k, t in entry.times.items())
                    click.echo(
                        f"{entry.partition}:{entry.index} key={entry.order_key} "
                        f"source={entry.source} {times} {dict(entry.payload)}"
                    )
    finally:
        listener.close()
    if listener.dead_lettered:
        click.echo(
            f"{listener.dead_lettered} undecodable record(s) of '{stream}' dead-lettered to "
            f"'{config.acker.dead_letter_topic}' (not printed)", err=True,
        )
