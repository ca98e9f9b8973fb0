"""The producer side of punctuations: REGISTER, SEAL and UNREGISTER into every partition.

Why every partition, every time: a consumer task knows that a time is over in its partitions
only once every producer has said so *in each of them* (punctuations travel in-band, ordered
with the data), so a seal costs P x Q messages for P producers and Q partitions -- the
baseline's price that the acker avoids.  Why inside the publisher's transaction: the hook
hands its punctuations to the publisher, which writes them into the open transaction after
the records written so far (a SEAL at the seal, REGISTER with the first commit, UNREGISTER
with the last), so in every partition a SEAL follows every record the producer wrote before
it and is visible exactly with them.
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterable, Mapping, Sequence

from substreams.control.traffic import PUNCTUATION_WRITTEN, TRAFFIC
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.punctuation.aligner import Punctuation, PunctuationKind
from substreams.streams.publisher import Ending, Publisher, PublishHook, Write
from substreams.streams.records import SentRecord
from substreams.streams.schemas import protocol_codec

REGISTER: PunctuationKind = "REGISTER"
SEAL: PunctuationKind = "SEAL"
UNREGISTER: PunctuationKind = "UNREGISTER"


class PunctuationHook(PublishHook):
    """Rides along a publisher for its substreams whose mechanism is ``punctuations``."""

    wants_send = False
    wants_delivery = False

    def __init__(self, publisher: Publisher, substreams: Iterable[str]) -> None:
        self.substreams = list(substreams)
        self.stream = publisher.stream
        self.source = publisher.source_id
        self.partitions = publisher.partitions
        # single-object encoded: readers tell a punctuation from data by its fingerprint
        self.codec = protocol_codec("punctuation")
        self._pending: list[Write] = []
        """Written by the next commit (the REGISTERs: the publisher's first, before any
        record)."""
        for name in self.substreams:
            self._pending += self._all(REGISTER, name, None)

    def sent(self, records: Sequence[SentRecord]) -> None:
        """Nothing to do per record: punctuations only mark ends."""

    def delivered(
        self,
        records: Sequence[SentRecord],
        partitions: Sequence[int],
        offsets: Sequence[int],
        times: Mapping[str, Sequence[Time]],
    ) -> None:
        """Nothing to do per record: punctuations only mark ends."""

    def register(self, publisher: Publisher, substream: str, start: Time | None) -> None:
        """Re-register with a start time: this producer writes no time that is not ``>= start``
        any more (a late joiner then does not hold back times the others already sealed).
        The REGISTER goes in a transaction of its own, after the records written so far."""
        self._check(substream)
        publisher.flush()
        self._pending += self._all(REGISTER, substream, start)
        publisher.commit()

    def seal(self, substream: str, time: Time, every_key: bool) -> Sequence[Write]:
        """SEAL ``time`` into every partition, in the open transaction: after the records
        written so far, committed with them.  A keyed seal is refused: a punctuation names
        one time, and the aligner has no "every key" form (per_key substreams with
        punctuations are sealed key by key)."""
        if every_key:
            raise SubstreamsError(
                f"substream '{substream}' uses punctuations: seal each key with seal(); keyed "
                "seals (every key up to a time) need mechanism: acker"
            )
        self._check(substream)
        return self._all(SEAL, substream, time)

    def before_commit(self, last: bool) -> Sequence[Write]:
        """The pending REGISTERs; with ``last``, UNREGISTER: this producer no longer holds
        back any time (after its last records, in every partition)."""
        if last:
            for name in self.substreams:
                self._pending += self._all(UNREGISTER, name, None)
        out, self._pending = self._pending, []
        return out

    def ended(self, how: Ending) -> None:
        """Nothing to announce (punctuations travel in-band) nor to undo: punctuations
        written in a dropped transaction vanish with it, and no UNREGISTER is written (an
        aborted producer still holds its times back)."""
        if how == "aborted":
            self._pending = []

    def _check(self, substream: str) -> None:
        if substream not in self.substreams:
            raise SubstreamsError(
                f"substream '{substream}' is not tracked by punctuations "
                f"(punctuation substreams here: {', '.join(self.substreams) or 'none'})"
            )

    def _all(self, kind: PunctuationKind, substream: str, time: Time | None) -> list[Write]:
        """One punctuation into every partition of the stream."""
        value = self.codec.encode_single(
            Punctuation(
                kind, self.source, substream, time, -1, sent_at_ms=int(_time.time() * 1000)
            ).to_wire()
        )
        TRAFFIC.add(PUNCTUATION_WRITTEN, substream, self.partitions)
        return [Write(self.stream, value, p) for p in range(self.partitions)]


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
