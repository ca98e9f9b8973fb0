"""`substreams broker start|stop|status|kill|start-node`: the embedded Apache Kafka."""

from __future__ import annotations

import time

import click

from substreams.kafka import embedded


@click.group("broker")
def command() -> None:
    """Run the embedded Apache Kafka (KRaft, 1 or 3 nodes) on 127.0.0.1.

    Its jars are fetched once with Maven; its data lives under $SUBSTREAMS_HOME
    (~/.substreams), so a stop and a start keep every topic."""


def _recorded() -> embedded.BrokerState:
    state = embedded.read_state()
    if state is None:
        click.echo("no embedded broker is running")
        raise SystemExit(1)
    return state


@command.command()
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port of node 1 (node N gets port+N-1); default: free ports, kept across restarts.",
)
@click.option(
    "--nodes",
    type=click.Choice(["1", "3"]),
    default="1",
    show_default=True,
    help="1 node, or 3 (replication factor 3, min.insync.replicas=2).",
)
@click.option(
    "--secure",
    is_flag=True,
    help="SASL_SSL only (SCRAM-SHA-512 users, a throwaway CA) and ACLs enforced (nothing "
    "is allowed without one, except to the super user 'admin'); prints the kafka.security "
    "block that logs in as admin.",
)
def start(port: int | None, nodes: str, secure: bool) -> None:
    """Start the broker(s) in the background, wait until they serve, record the address."""
    state, started = embedded.start_recorded(
        port, int(nodes), progress=click.echo, secure=secure
    )
    if started:
        click.echo(
            f"broker started on {state.bootstrap} ({state.nodes} node(s), "
            f"{'SASL_SSL, ACLs enforced' if state.secure else 'PLAINTEXT'}, data and logs "
            f"in {state.home})"
        )
    else:
        click.echo(f"a broker already runs on {state.bootstrap}")
    if state.secure:
        admin = state.cluster().admin_security
        assert admin is not None
        click.echo("log in as the super user with this block in substreams.yaml (the "
                   "password stays in its file):")
        click.echo(f"kafka:\n  bootstrap: {state.bootstrap}\n  security:")
        for key in ("protocol", "sasl_mechanism", "username", "password_file", "ca_file"):
            click.echo(f"    {key}: {getattr(admin, key)}")


@command.command()
def stop() -> None:
    """Stop the recorded broker (its data stays on disk for the next start)."""
    state = embedded.stop_recorded()
    if state is None:
        click.echo("no embedded broker is running")
    else:
        click.echo(f"broker on {state.bootstrap} stopped (data kept in {state.home})")


@command.command()
def status() -> None:
    """Say which nodes run and whether the cluster answers Kafka requests."""
    state = _recorded()
    cluster = state.cluster()
    answers = embedded.broker_answers(state.bootstrap, sec=cluster.admin_security)
    up = time.time() - state.started_at
    for node in cluster.nodes:
        pid = cluster.pid(node.node_id)
        click.echo(
            f"node {node.node_id}: 127.0.0.1:{node.port} "
            + (f"pid {pid}" if pid else "NOT running")
        )
    click.echo(
        f"broker on {state.bootstrap} (up {up:.0f} s): "
        + ("answering" if answers else "NOT answering")
    )
    raise SystemExit(0 if answers else 1)


@command.command()
@click.argument("node", type=int)
def kill(node: int) -> None:
    """SIGKILL node NODE of the running cluster (a crash, for failure drills)."""
    _recorded().cluster().kill(node)
    click.echo(f"node {node} killed")


@command.command("start-node")
@click.argument("node", type=int)
def start_node(node: int) -> None:
    """Start node NODE of the running cluster again and wait until it serves."""
    cluster = _recorded().cluster(progress=click.echo)
    cluster.start_node(node)
    cluster.wait_ready([node])
    click.echo(f"node {node} serves on 127.0.0.1:{cluster.node(node).port}")
