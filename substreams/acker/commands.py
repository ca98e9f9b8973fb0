"""The acker command protocol (seed 003, Materialize's compute protocol) written down as types.

Commands travel controller -> acker on ``acker.command_topic``, responses acker -> controller on
``acker.response_topic``; both topics have one partition, so each direction is delivered in
order.  Every command carries ``(controller, nonce, seq)``: the nonce names the session a Hello
started (commands of an older nonce are stale), the seq makes a re-delivered command a
recognisable duplicate.  Responses carry the ``(controller, nonce, seq)`` they answer.

This module only maps the Avro records of ``substreams/avro/command.avsc`` and
``response.avsc`` to frozen dataclasses and back; what the commands *mean* lives in
:mod:`.history` and :mod:`.handler`.  It also parses times typed on a command line.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from substreams.control.messages import OffsetRange
from substreams.errors import ProtocolError, SubstreamsError
from substreams.frontier import Keyed, Time, time_from_wire, time_to_wire
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec

NS = "substreams."
_U64 = 1 << 64


class Stage(enum.Enum):
    """The protocol stages of a controller session, in the order they must be passed."""

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


@dataclass(frozen=True, slots=True)
class PeekRow:
    """One time of a substream as the acker sees it."""

    time: Time
    state: str  # "OPEN" | "COMPLETE"
    xor: int
    """Unsigned 64-bit XOR state (0 once every record sent was received)."""
    records: int
    unsealed_sources: tuple[str, ...]
    first_seen_ms: int
    sealed_at_ms: int | None = None
    ranges: tuple[OffsetRange, ...] = ()


@dataclass(frozen=True, slots=True)
class PeekResponse:
    """``rows`` on success, else ``error`` set, else ``canceled``."""

    uuid: str
    substream: str
    rows: tuple[PeekRow, ...] = ()
    error: str | None = None
    canceled: bool = False


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
    stage: Stage
    substreams: tuple[SubstreamStatus, ...]
    acks: tuple[AcksPartition, ...]
    configured: tuple[str, ...] = ()


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


# --- wire form ------------------------------------------------------------------------------


def to_signed64(x: int) -> int:
    """An unsigned 64-bit value as Avro's signed long."""
    x %= _U64
    return x - _U64 if x >= 1 << 63 else x


def to_unsigned64(x: int) -> int:
    return x % _U64


def _unwrap(value: Any) -> Any:
    """A nullable union's value: with record names on, fastavro gives records as (name, value)."""
    return value[1] if isinstance(value, tuple) else value


def _times(ts: Sequence[Time]) -> list[Any]:
    return [time_to_wire(t) for t in ts]


def _times_from(ts: Sequence[Mapping[str, Any]]) -> tuple[Time, ...]:
    return tuple(time_from_wire(t) for t in ts)


def command_body_to_wire(body: CommandBody) -> tuple[str, dict[str, Any]]:
    match body:
        case Hello(version):
            return NS + "Hello", {"version": version}
        case CreateInstance():
            return NS + "CreateInstance", {}
        case InitializationComplete():
            return NS + "InitializationComplete", {}
        case ConfigureSubstreams(subs):
            return NS + "ConfigureSubstreams", {"substreams": list(subs)}
        case AllowCompaction(sub, frontier):
            return NS + "AllowCompaction", {"substream": sub, "frontier": _times(frontier)}
        case Peek(uuid, sub, t):
            return NS + "Peek", {
                "uuid": uuid,
                "substream": sub,
                "time": None if t is None else time_to_wire(t),
            }
        case CancelPeek(uuid):
            return NS + "CancelPeek", {"uuid": uuid}
        case StatusRequest():
            return NS + "Status", {}
    raise TypeError(f"not a command body: {body!r}")


def command_body_from_wire(name: str, d: Mapping[str, Any]) -> CommandBody:
    short = name.removeprefix(NS)
    if short == "Hello":
        return Hello(int(d.get("version", 1)))
    if short == "CreateInstance":
        return CreateInstance()
    if short == "InitializationComplete":
        return InitializationComplete()
    if short == "ConfigureSubstreams":
        return ConfigureSubstreams(tuple(d["substreams"]))
    if short == "AllowCompaction":
        return AllowCompaction(d["substream"], _times_from(d["frontier"]))
    if short == "Peek":
        t = _unwrap(d.get("time"))
        return Peek(d["uuid"], d["substream"], None if t is None else time_from_wire(t))
    if short == "CancelPeek":
        return CancelPeek(d["uuid"])
    if short == "Status":
        return StatusRequest()
    raise ProtocolError(f"unknown acker command type {name!r}")


def _row_to_wire(r: PeekRow) -> dict[str, Any]:
    return {
        "time": time_to_wire(r.time),
        "state": r.state,
        "xor": to_signed64(r.xor),
        "records": r.records,
        "unsealed_sources": list(r.unsealed_sources),
        "first_seen_ms": r.first_seen_ms,
        "sealed_at_ms": r.sealed_at_ms,
        "ranges": [x.to_wire() for x in r.ranges],
    }


def _row_from_wire(d: Mapping[str, Any]) -> PeekRow:
    return PeekRow(
        time_from_wire(d["time"]),
        str(d["state"]),
        to_unsigned64(int(d["xor"])),
        int(d["records"]),
        tuple(d["unsealed_sources"]),
        int(d["first_seen_ms"]),
        _unwrap(d.get("sealed_at_ms")),
        tuple(OffsetRange.from_wire(x) for x in d.get("ranges", ())),
    )


def _status_sub_to_wire(s: SubstreamStatus) -> dict[str, Any]:
    last = s.last_notification
    return {
        "substream": s.substream,
        "lower": _times(s.lower),
        "upper": _times(s.upper),
        "open_times": s.open_times,
        "since": None if s.since is None else _times(s.since),
        "last_notification": None
        if last is None
        else {
            "time": time_to_wire(last[0]),
            "at_ms": last[1],
        },
    }


def _status_sub_from_wire(d: Mapping[str, Any]) -> SubstreamStatus:
    last = _unwrap(d.get("last_notification"))
    since = d.get("since")
    return SubstreamStatus(
        d["substream"],
        _times_from(d["lower"]),
        _times_from(d["upper"]),
        int(d["open_times"]),
        None if since is None else _times_from(since),
        None if last is None else (time_from_wire(last["time"]), int(last["at_ms"])),
    )


def response_body_to_wire(body: ResponseBody) -> tuple[str, dict[str, Any]]:
    if isinstance(body, Frontiers):
        return NS + "Frontiers", {
            "substream": body.substream,
            "lower": _times(body.lower),
            "upper": _times(body.upper),
        }
    if isinstance(body, PeekResponse):
        result: tuple[str, dict[str, Any]]
        if body.canceled:
            result = (NS + "PeekCanceled", {})
        elif body.error is not None:
            result = (NS + "PeekError", {"message": body.error})
        else:
            result = (NS + "PeekRows", {"rows": [_row_to_wire(r) for r in body.rows]})
        return NS + "PeekResponse", {
            "uuid": body.uuid,
            "substream": body.substream,
            "result": result,
        }
    if isinstance(body, StatusResponse):
        return NS + "StatusResponse", {
            "stage": body.stage.value,
            "substreams": [_status_sub_to_wire(s) for s in body.substreams],
            "acks": [
                {"partition": a.partition, "offset": a.offset, "lag": a.lag} for a in body.acks
            ],
            "configured": list(body.configured),
        }
    return NS + "Rejected", {"reason": body.reason}


def response_body_from_wire(name: str, d: Mapping[str, Any]) -> ResponseBody:
    short = name.removeprefix(NS)
    if short == "Frontiers":
        return Frontiers(d["substream"], _times_from(d["lower"]), _times_from(d["upper"]))
    if short == "PeekResponse":
        kind, value = d["result"]
        kind = kind.removeprefix(NS)
        if kind == "PeekRows":
            rows = tuple(_row_from_wire(r) for r in value["rows"])
            return PeekResponse(d["uuid"], d["substream"], rows=rows)
        if kind == "PeekError":
            return PeekResponse(d["uuid"], d["substream"], error=str(value["message"]))
        return PeekResponse(d["uuid"], d["substream"], canceled=True)
    if short == "StatusResponse":
        return StatusResponse(
            Stage(d["stage"]),
            tuple(_status_sub_from_wire(s) for s in d["substreams"]),
            tuple(
                AcksPartition(int(a["partition"]), int(a["offset"]), a.get("lag"))
                for a in d["acks"]
            ),
            tuple(d.get("configured", ())),
        )
    if short == "Rejected":
        return Rejected(str(d["reason"]))
    raise ProtocolError(f"unknown acker response type {name!r}")


def encode_command(cmd: Command) -> bytes:
    return protocol_codec("command").encode(
        {
            "controller": cmd.controller,
            "nonce": cmd.nonce,
            "seq": cmd.seq,
            "sent_at_ms": cmd.sent_at_ms,
            "body": command_body_to_wire(cmd.body),
        }
    )


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
    name, body = d["body"]
    return Command(
        d["controller"],
        d["nonce"],
        int(d["seq"]),
        command_body_from_wire(name, body),
        int(d["sent_at_ms"]),
    )


def decode_command(value: bytes, headers: Sequence[tuple[str, bytes]] | None = None) -> Command:
    """A command from its bytes (and the message headers, whose fingerprint is checked)."""
    return _decode("command", value, headers, _command)


def encode_response(resp: Response) -> bytes:
    return protocol_codec("response").encode(
        {
            "acker": resp.acker,
            "controller": resp.controller,
            "nonce": resp.nonce,
            "seq": resp.seq,
            "sent_at_ms": resp.sent_at_ms,
            "body": response_body_to_wire(resp.body),
        }
    )


def _response(d: dict[str, Any]) -> Response:
    name, body = d["body"]
    return Response(
        d["acker"],
        d["controller"],
        d["nonce"],
        int(d["seq"]),
        response_body_from_wire(name, body),
        int(d["sent_at_ms"]),
    )


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
