"""`substreams broker start|stop|status`: the embedded Tansu broker."""

from __future__ import annotations

import time

import click

from substreams.kafka import embedded


@click.group("broker")
def command() -> None:
    """Run the embedded Kafka-protocol broker (Tansu, memory-only) on 127.0.0.1."""


@command.command()
@click.option(
    "--port", type=click.IntRange(1, 65535), default=None, help="Port (default: a free one)."
)
def start(port: int | None) -> None:
    """Start the broker in the background and record its address."""
    state, started = embedded.start_recorded(port)
    if started:
        click.echo(f"broker started on {state.bootstrap} (pid {state.pid}, log {state.log})")
    else:
        click.echo(f"a broker already runs on {state.bootstrap} (pid {state.pid})")


@command.command()
def stop() -> None:
    """Stop the recorded broker (its topics are lost: it keeps them in memory)."""
    state = embedded.stop_recorded()
    if state is None:
        click.echo("no embedded broker is running")
    else:
        click.echo(f"broker on {state.bootstrap} (pid {state.pid}) stopped")


@command.command()
def status() -> None:
    """Say whether the recorded broker runs and answers Kafka requests."""
    state = embedded.read_state()
    if state is None:
        click.echo("no embedded broker is running")
        raise SystemExit(1)
    answers = embedded.broker_answers(state.bootstrap)
    up = time.time() - state.started_at
    click.echo(
        f"broker on {state.bootstrap} (pid {state.pid}, up {up:.0f} s): "
        + ("answering" if answers else "NOT answering")
    )
    raise SystemExit(0 if answers else 1)
