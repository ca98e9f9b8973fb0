"""`substreams bench framing`: does hand framing still pay where we keep it?

The protocol is written once as types with one converter (:mod:`substreams.streams.wire`);
hand framing is kept only on two hot paths, and only while this benchmark shows it pays:
the acker's ``EpochComplete`` (``control/framing.py``, one per notified epoch) and the
publisher's data envelope (``streams/framing.py``, one per record).  Each is timed against
the converter + fastavro encoding of the same value (the baseline, same run, same process),
and both encodings are checked byte-identical first.  No broker is needed.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from substreams.control.framing import encode_unsigned_epoch_complete
from substreams.control.messages import ControlRecord, EpochComplete, OffsetRange, record_to_wire
from substreams.frontier import Keyed, Time
from substreams.streams.framing import EnvelopeEncoder
from substreams.streams.records import times_to_wire
from substreams.streams.schemas import Codec, envelope_schema, protocol_codec
from substreams_bench.harness import (
    BenchContext,
    BenchResult,
    Column,
    Target,
    command_line,
    save_figure,
    titled,
)

NEEDS_BROKER = False
MIN_SPEEDUP = 1.5
"""Below this, the hand framing is not worth its code: go back to the converter."""
CLICK: dict[str, Any] = {
    "type": "record",
    "name": "Click",
    "namespace": "substreams.demo",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "url", "type": "string"},
        {"name": "ts", "type": "long"},
    ],
}
"""The payload every run of this benchmark has framed: the demo's click record
(``avro/click.avsc``, a user's schema and not package data), kept here so that an install
without the repository runs the benchmark too."""


def _per_call_us(fn: Callable[[], Any], quick: bool) -> float:
    number = 2_000 if quick else 20_000
    best = min(timeit.repeat(fn, number=number, repeat=3 if quick else 5))
    return best / number * 1e6


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult("framing", ctx.quick, command_line(), "none (no broker needed)")
    result.columns = [
        Column("path", "hot path"),
        Column("hand_us", "hand framing µs", "{:.2f}"),
        Column("converter_us", "converter + fastavro µs", "{:.2f}"),
        Column("speedup", "speedup", "{:.2f}x"),
    ]
    control = protocol_codec("control")
    record = ControlRecord(
        "acker.main", 41, b"p" * 32, b"", 1_700_000_000_000,
        EpochComplete("clicks-per-minute", 1234, (OffsetRange("clicks", 0, 10, 20),
                                                   OffsetRange("clicks", 1, 7, 9)),
                      12, 1_700_000_000_000, ((1234, -1), (1235, 1)), None),
    )
    session = ControlRecord(
        "acker.main", 42, b"p" * 32, b"", 1_700_000_000_000,
        EpochComplete("sessions", Keyed("user-7", 1000), (OffsetRange("clicks", 3, 1, 4),),
                      3, 1_700_000_000_000, (), Keyed("user-7", 1900)),
    )
    click = dict(CLICK)
    envelope = Codec(envelope_schema(click), "envelope")
    encoder = EnvelopeEncoder(click, "publisher-1")
    payload = {"user": "u-17", "url": "/checkout", "ts": 1_700_000_000_123}
    times: dict[str, Time] = {"per-minute": 28_333_335,
                              "sessions": Keyed("u-17", 1_700_000_000_123)}

    def envelope_baseline() -> bytes:
        return envelope.encode_single({"order_key": 5, "tracking_id": -9,
                                       "source": "publisher-1",
                                       "times": times_to_wire(times), "payload": payload})

    cases: list[tuple[str, Callable[[], bytes], Callable[[], bytes]]] = [
        ("acker: EpochComplete", lambda: encode_unsigned_epoch_complete(record),
         lambda: control.encode(record_to_wire(record))),
        ("acker: session EpochComplete", lambda: encode_unsigned_epoch_complete(session),
         lambda: control.encode(record_to_wire(session))),
        ("publisher: data envelope", lambda: encoder.encode(5, -9, times, payload),
         envelope_baseline),
    ]
    for path, hand, baseline in cases:
        if hand() != baseline():
            raise AssertionError(f"bench framing: {path}: hand framing differs from fastavro")
        hand_us, conv_us = _per_call_us(hand, ctx.quick), _per_call_us(baseline, ctx.quick)
        speedup = conv_us / hand_us
        result.rows.append({"path": path, "hand_us": hand_us, "converter_us": conv_us,
                            "speedup": speedup})
        result.targets.append(Target(f"{path}: hand framing pays", f">= {MIN_SPEEDUP}x",
                                     f"{speedup:.2f}x", speedup >= MIN_SPEEDUP))
    result.notes.append("best of several timeit repeats in one process; both encodings are "
                        "checked byte-identical before timing")
    return result


def plot(result: BenchResult, path: Path) -> None:
    """A bar per hot path: hand framing beside converter + fastavro."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["path"] for r in result.rows]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [r["hand_us"] for r in result.rows], 0.4, label="hand framing")
    ax.bar([x + 0.2 for x in xs], [r["converter_us"] for r in result.rows], 0.4,
           label="converter + fastavro")
    ax.set_xticks(list(xs), names, fontsize=7)
    ax.set_ylabel("µs per record")
    fig.suptitle(titled("framing", result))
    ax.legend()
    save_figure(fig, path)
