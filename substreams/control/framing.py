"""Encoding ``EpochComplete``/``EpochsComplete`` control records field by field: the acker's
hot path.

Why not fastavro: the acker writes one signed ``EpochComplete`` per terminated time, and at
one record per epoch fastavro's walk of the record, its ``body`` union and every nested
``Time`` per call dominated the acker's CPU; concatenating the fields' encodings is several
times cheaper (``substreams bench framing`` keeps checking that it pays).  Avro's binary
encoding of a record is the concatenation of its fields', a union is its branch index then
the value, and an array is blocks (count, items) ended by a zero count, so the encoding is
written here directly.  It is byte-identical to fastavro's (a property test holds it to that); every
other body still goes through fastavro.  ``EpochsComplete`` (a run of completions in one
record) reuses the same pieces: with batched completions fastavro would again walk every
nested ``Time`` of every epoch (:func:`substreams.control.chain._unsigned`).
"""

from __future__ import annotations

from substreams.control.messages import (
    Completion,
    ControlRecord,
    EpochComplete,
    EpochsComplete,
    OffsetRange,
)
from substreams.frontier import Time
from substreams.streams.framing import (
    _INT_TIME_HEAD,
    _INT_TIME_TAIL,
    avro_array,
    avro_string,
    avro_time,
    zigzag_long,
)
from substreams.streams.schemas import raw_schema

_ZERO = b"\x00"  # an empty bytes value; a null union branch; an array's end
_ONE_ITEM = b"\x02"  # an array block of one item (zig-zag 1)


def _body_branch(name: str) -> bytes:
    """The union index of the ``body`` branch ``name`` (``substreams/avro/control.avsc``)."""
    body = next(f for f in raw_schema("control")["fields"] if f["name"] == "body")
    names = [branch["name"] for branch in body["type"]]
    return zigzag_long(names.index(name))


_EPOCH_COMPLETE = _body_branch("EpochComplete")
_EPOCHS_COMPLETE = _body_branch("EpochsComplete")


def encode_range(r: OffsetRange) -> bytes:
    return avro_string(r.stream) + zigzag_long(r.partition) + zigzag_long(r.start) + zigzag_long(
        r.end
    )


def _header(record: ControlRecord, branch: bytes) -> bytes:
    """The fields before the body, with an empty digest, then the body's union branch."""
    return b"".join(
        (
            avro_string(record.writer),
            zigzag_long(record.seq),
            zigzag_long(len(record.prev_digest)),
            record.prev_digest,
            _ZERO,  # digest: empty bytes
            zigzag_long(record.written_at_ms),
            branch,
        )
    )


def _until(until: Time | None) -> bytes:
    # ["null", Time]: branch 0 or 1 (zig-zag 0 / 2)
    return _ZERO if until is None else b"\x02" + avro_time(until)


def _lower(updates: tuple[tuple[Time, int], ...]) -> bytes:
    return avro_array([avro_time(t) + zigzag_long(d) for t, d in updates])


def encode_unsigned_epoch_complete(record: ControlRecord) -> bytes:
    """The Avro encoding of ``record`` (an ``EpochComplete``) with an empty digest."""
    body = record.body
    assert isinstance(body, EpochComplete)
    return b"".join(
        (
            _header(record, _EPOCH_COMPLETE),
            avro_string(body.substream),
            avro_time(body.time),
            avro_array([encode_range(r) for r in body.ranges]),
            zigzag_long(body.records),
            zigzag_long(body.sealed_at_ms),
            _lower(body.lower_updates),
            _until(body.until),
        )
    )


def _completion(c: Completion) -> bytes:
    return b"".join(
        (
            avro_time(c.time),
            avro_array([encode_range(r) for r in c.ranges]),
            zigzag_long(c.records),
            zigzag_long(c.sealed_at_ms),
            _until(c.until),
        )
    )


def _completions(epochs: tuple[Completion, ...]) -> list[bytes]:
    """``_completion`` of each, with the acker's common shape (an int time, one range, no
    until) written in one join and the encodings a run repeats (a stream's name, the seal
    time) computed once per record: at one record per time this was a third of the
    acker's remaining CPU per time."""
    out: list[bytes] = []
    strings: dict[str, bytes] = {}
    longs: dict[int, bytes] = {}
    for c in epochs:
        t, rs = c.time, c.ranges
        if type(t) is not int or c.until is not None or len(rs) != 1:
            out.append(_completion(c))
            continue
        r = rs[0]
        stream = strings.get(r.stream)
        if stream is None:
            stream = strings[r.stream] = avro_string(r.stream)
        sealed = longs.get(c.sealed_at_ms)
        if sealed is None:
            sealed = longs[c.sealed_at_ms] = zigzag_long(c.sealed_at_ms)
        out.append(b"".join((
            _INT_TIME_HEAD, zigzag_long(t), _INT_TIME_TAIL,
            _ONE_ITEM, stream, zigzag_long(r.partition), zigzag_long(r.start),
            zigzag_long(r.end), _ZERO,  # the ranges array: one block of one range, end
            zigzag_long(c.records), sealed, _ZERO,  # until: null
        )))
    return out


def encode_unsigned_epochs_complete(record: ControlRecord) -> bytes:
    """The Avro encoding of ``record`` (an ``EpochsComplete``) with an empty digest."""
    body = record.body
    assert isinstance(body, EpochsComplete)
    return b"".join(
        (
            _header(record, _EPOCHS_COMPLETE),
            avro_string(body.substream),
            avro_array(_completions(body.epochs)),
            _lower(body.lower_updates),
        )
    )


def encode_unsigned(record: ControlRecord) -> bytes | None:
    """The hand framing of ``record`` with an empty digest, None for a body without one."""
    body = record.body
    if isinstance(body, EpochComplete):
        return encode_unsigned_epoch_complete(record)
    if isinstance(body, EpochsComplete):
        return encode_unsigned_epochs_complete(record)
    return None
