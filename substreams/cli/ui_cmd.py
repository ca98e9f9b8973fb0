"""`substreams ui`: the live dashboard on 127.0.0.1."""

from __future__ import annotations

import click

from substreams.cli.options import bootstrap_option, config_option, stop_on_signals
from substreams.config import load_config


@click.command("ui")
@config_option
@bootstrap_option
@click.option("--port", type=click.IntRange(0, 65535), default=8642, show_default=True,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; the page has no authentication, keep it local.")
def command(config_path: str, bootstrap: str | None, port: int, host: str) -> None:
    """Serve a live dashboard: per substream its frontier, open times with their XOR state
    and the sources that have not sealed, the latest notifications with their latency, and
    the sources' liveness, updated as the control topics move.  /tail/STREAM serves a
    stream as JSON lines (like `substreams tail --json`) for tools without a Kafka client.
    Stops on Ctrl-C."""
    from substreams.ui.server import serve

    config = load_config(config_path)
    with stop_on_signals() as stop:
        try:
            server = serve(config, host=host, port=port, bootstrap=bootstrap)
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        click.echo(f"dashboard on {server.url} (Ctrl-C to stop)", err=True)
        stop.wait()
        server.stop()
