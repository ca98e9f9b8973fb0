"""The acker command protocol (after Materialize's compute protocol) written down as types.

Commands travel controller -> acker on ``acker.command_topic``, responses acker -> controller on
``acker.response_topic``; both topics have one partition, so each direction is delivered in
order.  Every command carries ``(controller, nonce, seq)``: the nonce names the session a Hello
started (commands of an older nonce are stale), the seq makes a re-delivered command a
recognisable duplicate.  Responses carry the ``(controller, nonce, seq)`` they answer.

With several acker shards every shard reads every command and answers it for what it owns
(its substreams, its acks partitions), under its own name in ``Response.acker``; a controller
waits for the shards it needs and merges their answers (:func:`merge_statuses`).

This module only maps the Avro records of ``substreams/avro/command.avsc`` and
``response.avsc`` to frozen dataclasses and back; what the commands *mean* lives in
:mod:`.history` and :mod:`.handler`.  It also parses times typed on a command line.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, TypeVar

from substreams.control.messages import OffsetRange, protocol_converter
from substreams.errors import ProtocolError, SubstreamsError
from substreams.frontier import Keyed, Time
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec
from substreams.streams.wire import Adapter, Converter

_U64 = 1 << 64


class SessionPhase(enum.Enum):
    """The phases of a controller session, in the order they must be passed (a command
    protocol term; not a Python stage, :class:`substreams.acker.stage.Stage`)."""

    CREATION = "CREATION"
    INITIALIZATION = "INITIALIZATION"
    COMPUTATION = "COMPUTATION"


# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Starts a session with the envelope's nonce (which must be fresh: a nonce the acker saw
    replaced is stale for good); answered with a :class:`StatusResponse`."""

    version: int = 1


@dataclass(frozen=True, slots=True)
class CreateInstance:
    pass


@dataclass(frozen=True, slots=True)
class InitializationComplete:
    pass


@dataclass(frozen=True, slots=True)
class ConfigureSubstreams:
    """The substreams this controller follows: answered by :class:`Frontiers` for each, again
    whenever they change (the last ConfigureSubstreams of any controller wins)."""

    substreams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AllowCompaction:
    """Times not beyond ``frontier`` may be forgotten; the frontier never moves back."""

    substream: str
    frontier: tuple[Time, ...]


@dataclass(frozen=True, slots=True)
class Peek:
    """Every open time of ``substream`` (``time`` None) or one time, open or complete."""

    uuid: str
    substream: str
    time: Time | None = None


@dataclass(frozen=True, slots=True)
class CancelPeek:
    """Answers the pending peek with ``canceled`` (under the Peek's seq); no-op if answered."""

    uuid: str


@dataclass(frozen=True, slots=True)
class StatusRequest:
    pass


CommandBody = (
    Hello
    | CreateInstance
    | InitializationComplete
    | ConfigureSubstreams
    | AllowCompaction
    | Peek
    | CancelPeek
    | StatusRequest
)


@dataclass(frozen=True, slots=True)
class Command:
    """One command with its envelope."""

    controller: str
    nonce: str
    seq: int
    body: CommandBody
    sent_at_ms: int = 0


# --- responses ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frontiers:
    substream: str
    lower: tuple[Time, ...]
    upper: tuple[Time, ...]


U64 = Adapter(lambda x: to_signed64(x), lambda x: to_unsigned64(int(x)))
"""An unsigned 64-bit value (an XOR state) on a signed Avro long."""


@dataclass(frozen=True, slots=True)
class PeekRow:
    """One time of a substream as the acker sees it."""

    time: Time
    state: str  # "OPEN" | "COMPLETE"
    xor: Annotated[int, U64]
    """Unsigned 64-bit XOR state (0 once every record sent was received)."""
    records: int
    unsealed_sources: tuple[str, ...]
    first_seen_ms: int
    sealed_at_ms: int | None = None
    ranges: tuple[OffsetRange, ...] = ()


@dataclass(frozen=True, slots=True)
class PeekRows:
    rows: tuple[PeekRow, ...] = ()


@dataclass(frozen=True, slots=True)
class PeekError:
    message: str


@dataclass(frozen=True, slots=True)
class PeekCanceled:
    pass


PeekResult = PeekRows | PeekError | PeekCanceled


@dataclass(frozen=True, slots=True)
class PeekResponse:
    """The rows of a peek, or why there are none (an error, or a CancelPeek)."""

    uuid: str
    substream: str
    result: PeekResult = PeekRows()

    @property
    def rows(self) -> tuple[PeekRow, ...]:
        return self.result.rows if isinstance(self.result, PeekRows) else ()

    @property
    def error(self) -> str | None:
        return self.result.message if isinstance(self.result, PeekError) else None

    @property
    def canceled(self) -> bool:
        return isinstance(self.result, PeekCanceled)


@dataclass(frozen=True, slots=True)
class SubstreamStatus:
    substream: str
    lower: tuple[Time, ...]
    upper: tuple[Time, ...]
    open_times: int
    since: tuple[Time, ...] | None = None
    last_notification: tuple[Time, int] | None = None


@dataclass(frozen=True, slots=True)
class AcksPartition:
    partition: int
    offset: int
    lag: int | None = None


@dataclass(frozen=True, slots=True)
class StatusResponse:
    stage: SessionPhase
    substreams: tuple[SubstreamStatus, ...]
    acks: tuple[AcksPartition, ...]
    configured: tuple[str, ...] = ()


_STAGES = list(SessionPhase)


def merge_statuses(answers: Sequence[StatusResponse]) -> StatusResponse:
    """One status of a sharded acker from its shards' answers: each answers for the
    substreams and acks partitions it owns, so the parts are disjoint and are put side by
    side (sorted by substream, by partition).  Every shard reads the same command topic, so
    their sessions agree; while one lags behind the others, the least advanced stage is the
    one every shard has reached.  A substream or partition answered twice (two layouts
    running during a change of ``shards``) keeps its first answer."""
    if not answers:
        raise ValueError("no status to merge")
    subs: dict[str, SubstreamStatus] = {}
    acks: dict[int, AcksPartition] = {}
    configured: tuple[str, ...] = ()
    for st in answers:
        for s in st.substreams:
            subs.setdefault(s.substream, s)
        for a in st.acks:
            acks.setdefault(a.partition, a)
        configured = configured or st.configured
    stage = min((st.stage for st in answers), key=_STAGES.index)
    return StatusResponse(
        stage,
        tuple(subs[k] for k in sorted(subs)),
        tuple(acks[p] for p in sorted(acks)),
        configured,
    )


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str


ResponseBody = Frontiers | PeekResponse | StatusResponse | Rejected


@dataclass(frozen=True, slots=True)
class Response:
    """One response with its envelope; ``seq`` is the answered command's (-1: unsolicited)."""

    acker: str
    controller: str
    nonce: str
    seq: int
    body: ResponseBody
    sent_at_ms: int = 0


# --- wire form: one converter (substreams.streams.wire) -------------------------------------


def to_signed64(x: int) -> int:
    """An unsigned 64-bit value as Avro's signed long."""
    x %= _U64
    return x - _U64 if x >= 1 << 63 else x


def to_unsigned64(x: int) -> int:
    return x % _U64


@cache
def _converter(schema: str) -> Converter:
    return protocol_converter(schema, names={"Status": StatusRequest})


def encode_command(cmd: Command) -> bytes:
    conv = _converter("command")
    return protocol_codec("command").encode(conv.root_encoder(Command)(cmd))


T = TypeVar("T")


def _decode(
    schema: str,
    value: bytes,
    headers: Sequence[tuple[str, bytes]] | None,
    build: Callable[[dict[str, Any]], T],
) -> T:
    """``build`` applied to the decoded record; :class:`ProtocolError` (and nothing else) for
    any bytes that are not one."""
    fp = dict(headers or ()).get(HEADER_FINGERPRINT)
    try:
        return build(protocol_codec(schema).decode(value, fp))
    except ProtocolError:
        raise
    except SubstreamsError as exc:
        raise ProtocolError(str(exc)) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"{schema} message is malformed: {exc}") from exc


def _command(d: dict[str, Any]) -> Command:
    conv = _converter("command")
    cmd: Command = conv.root_decoder(Command)(d)
    return cmd


def decode_command(value: bytes, headers: Sequence[tuple[str, bytes]] | None = None) -> Command:
    """A command from its bytes (and the message headers, whose fingerprint is checked)."""
    return _decode("command", value, headers, _command)


def encode_response(resp: Response) -> bytes:
    conv = _converter("response")
    return protocol_codec("response").encode(conv.root_encoder(Response)(resp))


def _response(d: dict[str, Any]) -> Response:
    conv = _converter("response")
    resp: Response = conv.root_decoder(Response)(d)
    return resp


def decode_response(value: bytes, headers: Sequence[tuple[str, bytes]] | None = None) -> Response:
    return _decode("response", value, headers, _response)


def command_headers() -> list[tuple[str, bytes]]:
    return protocol_codec("command").headers()


def response_headers() -> list[tuple[str, bytes]]:
    return protocol_codec("response").headers()


# --- times on a command line ----------------------------------------------------------------


def parse_time(text: str) -> Time:
    """``"5"`` -> 5, ``"1,2"`` -> (1, 2), ``"alice@7"`` -> Keyed("alice", 7),
    ``"alice@1,2"`` -> Keyed("alice", (1, 2))."""
    raw = text.strip()
    key: str | None = None
    if "@" in raw:
        key, raw = raw.rsplit("@", 1)
    try:
        if "," in raw:
            inner: int | tuple[int, ...] = tuple(int(p) for p in raw.split(",") if p.strip())
        else:
            inner = int(raw)
    except ValueError:
        raise SubstreamsError(
            f"cannot read time {text!r}: use an int (5), a tuple (1,2) or key@time (alice@5)"
        ) from None
    return inner if key is None else Keyed(key, inner)


def format_time(t: Time) -> str:
    """The inverse of :func:`parse_time`."""
    if isinstance(t, Keyed):
        return f"{t.key}@{format_time(t.time)}"
    if isinstance(t, tuple):
        return ",".join(str(c) for c in t)
    return str(t)


def format_times(ts: Sequence[Time]) -> str:
    """An antichain for humans: ``{1}``, ``{}`` (empty: everything complete)."""
    return "{" + " ".join(format_time(t) for t in ts) + "}"
