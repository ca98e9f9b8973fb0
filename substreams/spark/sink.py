"""The driver's side of a Spark query's output: the seals, once per batch.

The results are written by the executors (:mod:`substreams.spark.executor`, one
transactional writer per task); the driver holds the query's one SOURCE publisher of the
output stream (its source id derives from the query name, so a restarted driver fences the
crashed one).  Once every task of a batch committed, the driver writes the batch's seals and
a commit marker ``{source, batch_id}`` on the stream's commit topic
(``_substreams.commits.<stream>``) in ONE transaction.  A replayed batch at or below the
last committed marker (read once from the commit topic, then tracked) was sealed before:
its tasks skip their writes and the driver writes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

from substreams.app import TRACKED, Application, Mechanisms, never_evicted
from substreams.config import Config
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.read import drain
from substreams.kafka.topics import ensure_topics
from substreams.spark.executor import commit_topic

UNLIMITED = 1 << 31


log = logging.getLogger(__name__)


def ensure_commit_topic(config: Config, stream: str, bootstrap: str) -> None:
    """Create the stream's commit topic (batch and unit markers; one partition) if missing.
    Idempotent: the driver's sink and the streaming sink's start-up both need it."""
    ensure_topics(
        client.admin(bootstrap, config),
        [(commit_topic(stream), 1)],
        config.kafka.replication_factor,
    )


def read_commits(
    bootstrap: str, config: Config, stream: str, timeout: float = 30.0
) -> dict[str, int]:
    """The last committed batch id per source of ``stream``'s commit topic: read to the end
    of the topic or raise (:func:`substreams.kafka.read.drain`), never a partial answer --
    the exactly-once decision rests on it."""
    out: dict[str, int] = {}
    for msg in drain(bootstrap, config, commit_topic(stream), timeout=timeout):
        marker = json.loads(msg.value() or b"{}")
        source = str(marker["source"])
        out[source] = max(out.get(source, -1), int(marker["batch_id"]))
    return out


class BatchSink:
    """Seals each batch's output times once, after its tasks committed their results."""

    def __init__(
        self,
        config: Config,
        stream: str,
        source_id: str,
        bootstrap: str,
        mechanisms: Mechanisms = TRACKED,
    ) -> None:
        self.config = config
        self.stream = stream
        self.source_id = source_id
        self.bootstrap = bootstrap
        ensure_commit_topic(config, stream, bootstrap)
        # Never evicted for silence: a crashed driver must hold back the output times its
        # tasks wrote in part until it is restarted and seals them (docs/design.md).
        # Manual seals only, whatever the output substreams' seal policies: the driver seals
        # an output time once every task committed its part, never by its own clock.
        self.publisher = Application(config, bootstrap, never_evicted(mechanisms)).publisher(
            stream, source_id, batch_size=UNLIMITED,
            seal_policies=dict.fromkeys(
                (s.name for s in config.substreams_of(stream)), None
            ),
        )
        # After init_transactions (which fenced any zombie): nothing of it can commit later.
        self.committed = read_commits(bootstrap, config, stream).get(source_id, -1)
        log.info("sink '%s' of stream '%s': last committed batch %d (read from '%s')",
                 source_id, stream, self.committed, commit_topic(stream))
        self.output_substreams = [s.name for s in config.substreams_of(stream)]

    def seal(self, batch_id: int, seals: Sequence[Mapping[str, Time]]) -> bool:
        """Seal ``seals`` (in order) with the marker of ``batch_id`` in one transaction,
        unless ``batch_id`` is already committed.  True if written now."""
        if batch_id <= self.committed:
            log.warning("sink '%s': batch %d is a replay (batch %d was committed): its "
                        "results and seals are written already", self.source_id, batch_id,
                        self.committed)
            return False
        pub = self.publisher
        for times in seals:
            for substream, t in times.items():
                pub.seal(substream, t, commit=False)
        self._marker(batch_id)
        pub.flush()
        self.committed = batch_id
        return True

    def _marker(self, batch_id: int) -> None:
        # The marker shares the results' transaction: both become visible, or neither.
        self.publisher.produce_aside(
            commit_topic(self.stream),
            json.dumps({"source": self.source_id, "batch_id": batch_id}).encode(),
            key=self.source_id.encode(),
        )

    def close(self) -> None:
        self.publisher.close()
