"""The acker: the trAcker algorithm (FlameStream, DEBS'22) as a Kafka service.

Every record carries a random 64-bit tracking id.  Processes report SND(x) when they emit x
and RCV(x) when x is done with (by the stage that consumed it, or by its writer on delivery
when the stream is terminal), XOR-aggregated per (substream, time) and flushed to the acks
topic in the writers' own transactions (:mod:`~substreams.acker.tracker`, one for
publishers, stages and Spark write units, aggregating with :mod:`~substreams.acker.agent`;
the messages and their encoding are :mod:`~substreams.acker.protocol`).  The service
(:mod:`~substreams.acker.service`) keeps an XOR table per segment and time
(:mod:`~substreams.acker.table`); a time terminates when every registered source sealed it,
its XOR is zero and every earlier open time terminated, and its ``EpochComplete`` is written
to the substream's control topic in one transaction with the acker's checkpoint
(:mod:`~substreams.acker.state`), so a restarted, standby or fencing acker continues exactly
once.
"""

from substreams.acker.agent import TrackingAgent
from substreams.acker.service import AckerFencedError, AckerService, checkpoint_topic
from substreams.acker.stage import Stage
from substreams.acker.state import AckerView, OpenTime, SubstreamView
from substreams.acker.table import Segment, SegmentTable, acker_segments

__all__ = [
    "AckerFencedError",
    "AckerService",
    "AckerView",
    "OpenTime",
    "Segment",
    "SegmentTable",
    "Stage",
    "SubstreamView",
    "TrackingAgent",
    "acker_segments",
    "checkpoint_topic",
]
