"""`substreams spark-cluster start|stop|status|kill-worker|start-worker`: a Spark standalone
cluster on this machine (master + workers from the PySpark install; see
:mod:`substreams.spark.cluster`)."""

from __future__ import annotations

import click

from substreams.spark.cluster import ClusterError, SparkCluster, cluster_home


@click.group("spark-cluster", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Run a Spark standalone cluster (one master, N workers) on 127.0.0.1.

    Jobs then run there with `substreams submit --master spark://127.0.0.1:PORT ...` (the
    URL is printed by `start` and `status`).  State and logs live under
    $SUBSTREAMS_HOME/spark-cluster."""


def _cluster() -> SparkCluster:
    home = cluster_home()
    if not (home / "cluster.json").exists():
        raise ClusterError("no spark cluster was started here; run `substreams spark-cluster "
                           "start` first")
    return SparkCluster(home)


@command.command()
@click.option("--workers", type=click.IntRange(1, 8), default=2, show_default=True,
              help="How many workers (first start only: kept across restarts).")
@click.option("--cores", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Cores each worker offers.")
@click.option("--memory", default="1g", show_default=True,
              help="Memory each worker offers to executors (Spark's syntax: 512m, 1g...).")
def start(workers: int, cores: int, memory: str) -> None:
    """Start the master and the workers in the background; wait until all are registered."""
    cluster = SparkCluster(cluster_home(), workers=workers, cores=cores, memory=memory)
    click.echo(f"starting spark cluster {cluster.url} with {cluster.workers} workers ...")
    cluster.start()
    click.echo(f"spark cluster ready: {cluster.url} (web UI http://127.0.0.1:"
               f"{cluster.state.master_ui_port}, logs in {cluster.home})")


@command.command()
def stop() -> None:
    """Stop the workers and the master."""
    cluster = _cluster()
    cluster.stop()
    click.echo(f"spark cluster {cluster.url} stopped")


@command.command()
def status() -> None:
    """The master's URL and its workers."""
    cluster = _cluster()
    info = cluster.status()
    if info is None:
        click.echo(f"spark cluster {cluster.url}: master NOT answering")
        raise SystemExit(1)
    click.echo(f"spark cluster {cluster.url}: {info.get('status', '?')}")
    for w in info.get("workers", ()):
        click.echo(f"  worker {w.get('id')}: {w.get('state')}, {w.get('cores')} cores, "
                   f"{w.get('memory')} MB")
    for app in info.get("activeapps", ()):
        click.echo(f"  application {app.get('id')}: {app.get('name')} ({app.get('state')})")


@command.command("kill-worker")
@click.argument("index", type=int)
def kill_worker(index: int) -> None:
    """SIGKILL worker INDEX (0-based) and its executors: a lost machine."""
    _cluster().kill_worker(index)
    click.echo(f"worker {index} killed")


@command.command("start-worker")
@click.argument("index", type=int)
def start_worker(index: int) -> None:
    """Start worker INDEX again and wait until the master lists it."""
    cluster = _cluster()
    cluster.start_worker(index)
    cluster.wait_ready()
    click.echo(f"worker {index} running")
