"""Spark integration: the ``substreams`` streaming source and sink, and the epoch operator API.

``run(operator, config, substream, output_stream)`` runs an :class:`EpochOperator` (or a
plain function; an :class:`ArrowEpochOperator` gets each epoch as a ``pyarrow.Table``) over
the completed epochs of a substream on the executors (firm bound,
consistent order, exactly-once output); ``on_notification`` reaches the driver once per
epoch.  :func:`substreams.spark.testing.run_operator` runs an operator without Spark or
Kafka.  PySpark is imported lazily so that ``import substreams.spark`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from substreams.spark.operator import (
    ArrowEpochOperator,
    EpochInfo,
    EpochNote,
    EpochOperator,
    FunctionOperator,
    Row,
)

if TYPE_CHECKING:
    from substreams.spark.runner import run as run
    from substreams.spark.session import session as session

__all__ = [
    "ArrowEpochOperator", "EpochInfo", "EpochNote", "EpochOperator", "FunctionOperator",
    "Row", "run", "session",
]


def __getattr__(name: str) -> Any:
    if name == "run":
        from substreams.spark.runner import run

        return run
    if name == "session":
        from substreams.spark.session import session

        return session
    raise AttributeError(name)
