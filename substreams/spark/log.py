"""Where substreams logs in a Spark job: its driver (a job's command line) and the Python
workers Spark starts (tasks, the source's planner)."""

from __future__ import annotations

import logging
import os

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

LOG_LEVEL_ENV = "SUBSTREAMS_SPARK_LOG"
"""Log level of substreams in Spark's Python workers (default INFO); ``DEBUG`` shows each
micro-batch's per-phase timings (Kafka client set-up, first fetch, operator, commit)."""


def worker_logging() -> None:
    """Log to stderr in a Python worker Spark started (a task, or the source's planner):
    Spark forwards its stderr to the executor's log; a worker has no handler otherwise.
    The level comes from ``$SUBSTREAMS_SPARK_LOG`` (workers inherit the JVM's env)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    level = os.environ.get(LOG_LEVEL_ENV, "").upper()
    if level in ("DEBUG", "INFO", "WARNING", "ERROR"):
        logging.getLogger("substreams").setLevel(level)


def driver_logging() -> None:
    """The runner's progress ("batch N: started", "batch N: K epochs") on stderr, without
    py4j's chatter."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("py4j").setLevel(logging.WARNING)
