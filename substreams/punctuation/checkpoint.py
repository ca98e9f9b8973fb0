"""The punctuation aligner's checkpoint: where it stands, as one document (pure, no I/O).

Why: without it a restarted aligner replays its whole control topic and re-reads its data
topic from the start, so every start is slower than the last.  The aligner service writes a
checkpoint in the same transaction as every control record it writes (and on its heartbeat
when it has read on), on its own checkpoint topic
(``<control prefix>__aligner.<substream>``), so the latest checkpoint describes exactly
what the control topic holds: a restart loads it and reads the data topic from its
positions, nothing from offset 0.

What it holds:

- ``positions``: per data partition, the next offset to read (every message before it was
  applied to ``aligner`` and ``tracker``);
- ``aligner``: :meth:`~substreams.punctuation.aligner.Aligner.to_state` (producers, seals,
  open times with their ranges, terminated times);
- ``tracker``: the control topic's frontiers
  (:meth:`~substreams.control.progress.ProgressTracker.to_state`);
- ``announced``: times a run without a checkpoint had announced and this run has not
  re-derived yet (empty once a run started from a checkpoint: they are in ``aligner``);
- ``control_seq``: the aligner's next chain seq on the control topic after the
  transaction that carries the checkpoint: at start-up the chain head must be there, else
  something wrote the control topic without a checkpoint (an older aligner) and the
  checkpoint is not used;
- ``dead_from``: a dead-letter-topic offset at or before every dead letter of a record
  past ``positions`` (the first such one the aligner knows, else the offset after the last
  dead letter it knows): read from there, a restart does not dead-letter a record twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from substreams.control.messages import Checkpoint
from substreams.errors import ProtocolError
from substreams.frontier import Time, time_from_wire, time_to_wire

VERSION = 1


@dataclass
class AlignerCheckpoint:
    positions: dict[int, int]
    aligner: dict[str, Any]
    tracker: dict[str, Any]
    control_seq: int
    dead_from: int = 0
    announced: list[Time] = field(default_factory=list)

    def to_body(self) -> Checkpoint:
        """The control-protocol ``Checkpoint`` (its offsets are the data topic's)."""
        doc = {
            "version": VERSION,
            "aligner": self.aligner,
            "tracker": self.tracker,
            "control_seq": self.control_seq,
            "dead_from": self.dead_from,
            "announced": [time_to_wire(t) for t in self.announced],
        }
        offsets = tuple(sorted(self.positions.items()))
        return Checkpoint(offsets, json.dumps(doc, sort_keys=True).encode())

    @classmethod
    def from_body(cls, body: Checkpoint) -> AlignerCheckpoint:
        try:
            doc: Mapping[str, Any] = json.loads(body.state)
            if doc.get("version") != VERSION:
                raise ProtocolError(
                    f"aligner checkpoint version {doc.get('version')!r}; this aligner reads "
                    f"version {VERSION}"
                )
            return cls(
                {int(p): int(o) for p, o in body.acks_offsets},
                dict(doc["aligner"]),
                dict(doc["tracker"]),
                int(doc["control_seq"]),
                int(doc["dead_from"]),
                [time_from_wire(t) for t in doc["announced"]],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"aligner checkpoint is malformed: {exc!r}") from exc
