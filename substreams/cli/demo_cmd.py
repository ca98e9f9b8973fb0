"""`substreams demo`: the end-to-end run on the embedded defaults.

Until the Spark job exists this is a typed publish/listen round trip: start the embedded
broker, create the config's topics, publish generated clicks, read them back, and say what
happened.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from substreams.cli.options import bootstrap_option, config_option
from substreams.config import load_config
from substreams.kafka import client
from substreams.kafka.embedded import EmbeddedBroker
from substreams.kafka.topics import ensure_topics
from substreams.streams.listener import Listener
from substreams.streams.publisher import Publisher


@click.command("demo")
@config_option
@bootstrap_option
@click.option(
    "--records", default=2000, show_default=True, type=click.IntRange(1), help="Records to publish."
)
@click.option(
    "--users", default=20, show_default=True, type=click.IntRange(1), help="Distinct users."
)
def command(config_path: str, bootstrap: str | None, records: int, users: int) -> None:
    """Run the demo: broker, topics, a generated workload, and what came back."""
    console = Console()
    config = load_config(config_path)
    stream = config.streams[0]
    with contextlib.ExitStack() as stack:
        if bootstrap is None and config.kafka.bootstrap == "embedded":
            broker = stack.enter_context(EmbeddedBroker())
            server = broker.bootstrap
            console.print(f"[bold]broker[/] embedded Tansu on {server}")
        else:
            server = client.resolve_bootstrap(config, bootstrap)
            console.print(f"[bold]broker[/] {server}")
        report = ensure_topics(
            client.admin(server, config), config.topics(), config.kafka.replication_factor
        )
        console.print(
            f"[bold]topics[/] {len(report.created)} created, {len(report.existing)} existed"
        )
        rng = random.Random(7)
        t0 = time.perf_counter()
        with (
            Publisher(config, stream.name, "demo", bootstrap=server) as pub,
            Progress(console=console) as bar,
        ):
            task = bar.add_task(f"publishing to {stream.name}", total=records)
            ts = 1_700_000_000_000
            for _ in range(records):
                ts += rng.randint(0, 20)
                user = f"user{rng.randrange(users)}"
                pub.publish({"user": user, "url": f"/page/{rng.randrange(50)}", "ts": ts}, key=user)
                bar.advance(task)
        published = time.perf_counter() - t0
        with Listener(config, stream.name, bootstrap=server) as listener:
            got = list(listener.entries(idle_timeout=1.0))
        per_partition = Counter(e.partition for e in got)
        table = Table(title=f"stream {stream.name}: read back")
        table.add_column("partition", justify="right")
        table.add_column("entries", justify="right")
        for p in sorted(per_partition):
            table.add_row(str(p), str(per_partition[p]))
        console.print(table)
        ok = len(got) == records
        console.print(
            f"published {records} records in {published:.2f} s, read back {len(got)}: "
            + ("[green]round trip ok[/]" if ok else "[red]MISSING RECORDS[/]")
        )
        if not ok:
            raise SystemExit(1)
