"""Options shared by several commands."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

config_option = click.option(
    "-c",
    "--config",
    "config_path",
    default="substreams.yaml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The substreams YAML configuration.",
)

bootstrap_option = click.option(
    "--bootstrap",
    default=None,
    metavar="HOST:PORT",
    help="Kafka bootstrap servers; overrides kafka.bootstrap and $SUBSTREAMS_BOOTSTRAP.",
)

metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="PORT",
    help="Serve Prometheus metrics on http://127.0.0.1:PORT/metrics.",
)


def serve_metrics(port: int | None) -> None:
    """Start the metrics endpoint when ``--metrics-port`` was given, and say where."""
    if port is None:
        return
    from substreams import metrics

    try:
        actual = metrics.serve(port)
    except OSError as exc:
        raise click.ClickException(f"--metrics-port {port}: {exc.strerror}") from exc
    click.echo(f"metrics on http://127.0.0.1:{actual}/metrics", err=True)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event that SIGINT/SIGTERM set while the block runs, instead of raising (so a
    service finishes its step and closes cleanly); the previous handlers come back after."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)
