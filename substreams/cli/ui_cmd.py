"""`substreams ui`: the live dashboard on 127.0.0.1."""

from __future__ import annotations

import ipaddress

import click

from substreams.cli.options import bootstrap_option, config_option, stop_on_signals
from substreams.config import load_config

EXPOSED = (
    "the config's topic, substream, source and acker names, frontiers and notifications, and "
    "every record of every stream (/tail/STREAM, read with the config's Kafka credentials; "
    "the credentials themselves are never shown)"
)


def loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("ui")
@config_option
@bootstrap_option
@click.option("--port", type=click.IntRange(0, 65535), default=8642, show_default=True,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; the page has no authentication, keep it local "
              "(any other than a loopback address needs --expose).")
@click.option("--expose", is_flag=True,
              help="Allow --host to be reachable from other machines: every page, and "
              "every record of every stream through /tail, for anyone who reaches it.")
def command(config_path: str, bootstrap: str | None, port: int, host: str,
            expose: bool) -> None:
    """Serve a live dashboard: per substream its frontier, open times with their XOR state
    and the sources that have not sealed, the latest notifications with their latency, and
    the sources' liveness, updated as the control topics move.  /tail/STREAM serves a
    stream as JSON lines (like `substreams tail --json`) for tools without a Kafka client.
    Stops on Ctrl-C."""
    from substreams.ui.server import serve

    if not loopback(host) and not expose:
        raise click.UsageError(
            f"--host {host} would serve, without authentication, to anyone who can reach "
            f"it: {EXPOSED}; add --expose to do so"
        )
    config = load_config(config_path)
    with stop_on_signals() as stop:
        try:
            server = serve(config, host=host, port=port, bootstrap=bootstrap)
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        click.echo(f"dashboard on {server.url} (Ctrl-C to stop)", err=True)
        if not loopback(host):
            click.echo(f"exposed beyond this machine, without authentication: {EXPOSED}",
                       err=True)
        stop.wait()
        server.stop()
