"""Progress tracking with Timely Dataflow semantics.

* :mod:`~substreams.frontier.time` -- logical times (``int``, product-ordered
  ``tuple[int, ...]``, per-key :class:`Keyed`) and their partial order.
* :class:`Antichain` / :class:`UpperAntichain` -- lower and upper frontiers.
* :class:`ChangeBatch` -- consolidated ``(time, delta)`` progress updates.
* :class:`MutableAntichain` -- counts per time plus their frontier, reporting changes.
"""

from substreams.frontier.antichain import Antichain, UpperAntichain
from substreams.frontier.change_batch import ChangeBatch
from substreams.frontier.mutable import MutableAntichain
from substreams.frontier.time import (
    Keyed,
    Time,
    WireTime,
    less_equal,
    less_than,
    sort_key,
    time_from_wire,
    time_to_wire,
)

__all__ = [
    "Antichain",
    "ChangeBatch",
    "Keyed",
    "MutableAntichain",
    "Time",
    "UpperAntichain",
    "WireTime",
    "less_equal",
    "less_than",
    "sort_key",
    "time_from_wire",
    "time_to_wire",
]
