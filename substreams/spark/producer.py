"""A click producer for deployments (docker-compose's ``producer`` service).

Publishes generated clicks in real event time to the stream of a tumbling substream,
forever or for ``--records``; the substream's seal policy (else one without lateness, idle
after a second) seals each window as the event time leaves it, and the acker turns the
seals into notifications that a Spark job (e.g. ``jobs/windowed_counts.py``) consumes.

    python -m substreams.spark.producer -c jobs/substreams.cluster.yaml --rate 200
"""

from __future__ import annotations

import random
import signal
import time
from types import FrameType

import click

from substreams.app import Application
from substreams.config import SealPolicy, load_config
from substreams.spark.demo import _pick_substream


@click.command("producer", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-c", "--config", "config_path", default="substreams.yaml", show_default=True)
@click.option("--substream", default=None, help="Tumbling substream to seal (default: the first).")
@click.option("--rate", default=100.0, show_default=True, help="Clicks per second.")
@click.option("--records", default=0, show_default=True, help="Stop after N clicks (0: never).")
@click.option("--users", default=50, show_default=True)
@click.option("--source", default="producer", show_default=True, help="Publisher source id.")
@click.option("--bootstrap", default=None)
def main(
    config_path: str,
    substream: str | None,
    rate: float,
    records: int,
    users: int,
    source: str,
    bootstrap: str | None,
) -> None:
    """Publish clicks until stopped (SIGTERM/Ctrl-C: a clean stop); windows are sealed by
    the seal policy."""
    config = load_config(config_path)
    sub = _pick_substream(config, substream)
    assert sub.size_ms is not None
    stopping = False

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    rng = random.Random()
    sent = 0
    window: int | None = None
    policy = {sub.name: sub.seal or SealPolicy(lateness_ms=0, idle_ms=1000)}
    app = Application(config, bootstrap)
    with app.publisher(sub.stream, source, batch_size=100, seal_policies=policy) as pub:
        try:
            while not stopping and (records == 0 or sent < records):
                ts = int(time.time() * 1000)
                if window is not None and ts // sub.size_ms > window:
                    click.echo(f"window {window} left ({sent} clicks so far)")
                window = ts // sub.size_ms
                user = f"user{rng.randrange(users)}"
                pub.publish({"user": user, "url": f"/page/{rng.randrange(50)}", "ts": ts}, key=user)
                sent += 1
                time.sleep(1.0 / rate)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
