"""Exactly-once output of a Spark query to a configured stream.

Decision: the output is written by one transactional :class:`Publisher` per query (its
source id derives from the query name, so a restarted query fences the crashed one) and each
micro-batch's results go into ONE Kafka transaction together with a commit marker
``{source, batch_id}`` on the stream's commit topic (``_substreams.commits.<stream>``).
Spark replays a batch after a crash with the same id and the same input rows; before writing,
the sink looks up the last committed batch id of its source (read once from the commit topic,
then tracked): a batch at or below it is skipped, so every epoch's results appear exactly
once.  Seals are repeated for a skipped batch (a crash may have hit between the commit and
the seals); sealing a time twice is harmless.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from substreams.app import TRACKED, Application, Mechanisms
from substreams.config import Config
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.read import drain
from substreams.kafka.topics import ensure_topics

Row = dict[str, Any]
UNLIMITED = 1 << 31


log = logging.getLogger(__name__)


def commit_topic(stream: str) -> str:
    return f"_substreams.commits.{stream}"


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
    """Writes each batch's results once, then seals the given output times."""

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
        ensure_topics(
            client.admin(bootstrap, config),
            [(commit_topic(stream), 1)],
            config.kafka.replication_factor,
        )
        self.publisher = Application(config, bootstrap, mechanisms).publisher(
            stream, source_id, batch_size=UNLIMITED
        )
        # After init_transactions (which fenced any zombie): nothing of it can commit later.
        self.committed = read_commits(bootstrap, config, stream).get(source_id, -1)
        log.info("sink '%s' of stream '%s': last committed batch %d (read from '%s')",
                 source_id, stream, self.committed, commit_topic(stream))
        self.output_substreams = [s.name for s in config.substreams_of(stream)]

    def write(
        self,
        batch_id: int,
        results: Iterable[tuple[Row, str | None]],
        seals: Sequence[Mapping[str, Time]],
    ) -> bool:
        """Publish ``results`` (row, key) and the commit marker in one transaction, unless
        ``batch_id`` is already committed; then apply ``seals`` in order.  True if written."""
        written = batch_id > self.committed
        if not written:
            log.warning("sink '%s': batch %d is a replay (batch %d was committed): results "
                        "skipped, seals repeated", self.source_id, batch_id, self.committed)
        if written:
            pub = self.publisher
            for row, key in results:
                pub.publish(row, key=key)
            self._marker(batch_id)
            pub.flush()
            self.committed = batch_id
        for times in seals:
            for substream, t in times.items():
                self.publisher.seal(substream, t)
        return written

    def _marker(self, batch_id: int) -> None:
        # The marker shares the results' transaction: both become visible, or neither.
        self.publisher.produce_aside(
            commit_topic(self.stream),
            json.dumps({"source": self.source_id, "batch_id": batch_id}).encode(),
            key=self.source_id.encode(),
        )

    def close(self) -> None:
        self.publisher.close()
