"""The producer side of punctuations: REGISTER, SEAL and UNREGISTER into every partition.

Why every partition, every time: a consumer task knows that a time is over in its partitions
only once every producer has said so *in each of them* (punctuations travel in-band, ordered
with the data), so a seal costs P x Q messages for P producers and Q partitions -- the
baseline's price that the acker avoids.  Why inside the publisher's transaction: the
publisher commits its records first (``Publisher.seal`` flushes), then the punctuations are
committed, so in every partition a SEAL follows every record the producer wrote before it.
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterable

from substreams.control.traffic import PUNCTUATION_WRITTEN, TRAFFIC
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.punctuation.aligner import Punctuation, PunctuationKind
from substreams.streams.publisher import Publisher, PublishHook
from substreams.streams.records import SentRecord
from substreams.streams.schemas import protocol_codec


class PunctuationHook(PublishHook):
    """Rides along a publisher for its substreams whose mechanism is ``punctuations``."""

    wants_delivery = False

    def __init__(self, publisher: Publisher, substreams: Iterable[str]) -> None:
        self.substreams = list(substreams)
        self.codec = protocol_codec("punctuation")
        for name in self.substreams:
            self._write_all(publisher, "REGISTER", name, None)
        publisher.flush()

    def on_send(self, record: SentRecord) -> None:
        """Nothing to do per record: punctuations only mark ends."""

    def on_delivered(self, record: SentRecord, offset: int) -> None:
        """Nothing to do per record: punctuations only mark ends."""

    def register(self, publisher: Publisher, substream: str, start: Time | None) -> None:
        """Re-register with a start time: this producer writes no time that is not ``>= start``
        any more (a late joiner then does not hold back times the others already sealed)."""
        self._check(substream)
        publisher.flush()
        self._write_all(publisher, "REGISTER", substream, start)
        publisher.flush()

    def seal(self, publisher: Publisher, substream: str, time: Time) -> None:
        """SEAL ``time`` into every partition, in the open transaction: after the records
        written so far, committed with them."""
        self._check(substream)
        self._write_all(publisher, "SEAL", substream, time)

    def seal_keys(self, publisher: Publisher, substream: str, upto: int) -> None:
        """Refused: a punctuation names one time, and the aligner has no "every key" form
        (per_key substreams with punctuations are sealed key by key)."""
        raise SubstreamsError(
            f"substream '{substream}' uses punctuations: seal each key with seal(); keyed "
            "seals (every key up to a time) need mechanism: acker"
        )

    def before_commit(self, publisher: Publisher) -> None:
        """Nothing to add to the transaction."""

    def on_commit(self, publisher: Publisher) -> None:
        """Nothing to announce: punctuations travel in-band."""

    def close(self, publisher: Publisher) -> None:
        """UNREGISTER: this producer no longer holds back any time."""
        for name in self.substreams:
            self._write_all(publisher, "UNREGISTER", name, None)
        publisher.flush()

    def abort(self, publisher: Publisher) -> None:
        """Nothing to undo: punctuations written in the dropped transaction vanish with it,
        and no UNREGISTER is written (an aborted producer still holds its times back)."""

    def _check(self, substream: str) -> None:
        if substream not in self.substreams:
            raise SubstreamsError(
                f"substream '{substream}' is not tracked by punctuations "
                f"(punctuation substreams here: {', '.join(self.substreams) or 'none'})"
            )

    def _write_all(
        self, publisher: Publisher, kind: PunctuationKind, substream: str, time: Time | None
    ) -> None:
        headers = publisher.punctuation_headers()
        value = self.codec.encode(
            Punctuation(
                kind, publisher.source_id, substream, time, -1, sent_at_ms=int(_time.time() * 1000)
            ).to_wire()
        )
        for partition in range(publisher.partitions):
            publisher.produce_service(value, partition, headers)
        TRAFFIC.add(PUNCTUATION_WRITTEN, substream, publisher.partitions)


def hook_of(publisher: Publisher, substream: str) -> PunctuationHook:
    """The punctuation hook of ``publisher`` for ``substream`` (to re-register it with a
    start time): the publisher's own, not a registry beside it."""
    hook = publisher.hook_for(substream)
    if not isinstance(hook, PunctuationHook):
        raise SubstreamsError(
            f"the publisher of stream '{publisher.stream}' does not track substream "
            f"'{substream}' with punctuations"
        )
    return hook


def register(publisher: Publisher, substream: str, start: Time | None) -> None:
    """Announce that ``publisher`` joins ``substream`` at ``start`` (see ``PunctuationHook``)."""
    hook_of(publisher, substream).register(publisher, substream, start)
