"""The controller side of the command protocol (what the CLI and jobs use to talk to an acker).

A client is one controller session: a random controller id and nonce, commands numbered from
0, responses read from the response topic and filtered by (controller, nonce).  Where it starts
reading responses: the response topic's high watermark *before* the Hello is sent, so no answer
to us can be missed and older responses of other sessions are not read at all.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from confluent_kafka import TopicPartition

from substreams.acker.commands import (
    AllowCompaction,
    CancelPeek,
    Command,
    CommandBody,
    ConfigureSubstreams,
    CreateInstance,
    Hello,
    InitializationComplete,
    Peek,
    PeekResponse,
    Rejected,
    Response,
    StatusRequest,
    StatusResponse,
    command_headers,
    decode_response,
    encode_command,
)
from substreams.config import Config
from substreams.errors import ProtocolError, SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.read import Reader
from substreams.kafka.topics import ensure_topics


class AckerUnavailableError(SubstreamsError):
    """No acker answered in time (none is running, or it is a standby)."""


class CommandRejectedError(SubstreamsError):
    """The acker answered a command with Rejected (out of stage, unknown substream...)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class AckerClient:
    """One controller session with the acker of ``config``.  Use as a context manager."""

    def __init__(
        self,
        config: Config,
        bootstrap: str | None = None,
        *,
        controller: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.config = config
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.controller = controller or f"ctl-{uuid.uuid4().hex[:12]}"
        self.nonce = uuid.uuid4().hex
        self.timeout = timeout
        self.seq = -1
        self.acker: str | None = None
        self.inbox: list[Response] = []
        """Responses to this session not consumed by a wait (e.g. unsolicited Frontiers)."""
        acker = config.acker
        self.command_topic = acker.command_topic
        self.response_topic = acker.response_topic
        ensure_topics(
            client.admin(self.bootstrap, config),
            [config.topic_spec(self.command_topic), config.topic_spec(self.response_topic)],
        )
        fast: dict[str, Any] = {"linger.ms": 0}
        self._producer = client.producer(self.bootstrap, config, **fast)
        self._reader = Reader(self.bootstrap, config, name=f"responses '{self.response_topic}'")
        _, high = self._reader.watermarks(self.response_topic, 0)
        self._reader.assign([TopicPartition(self.response_topic, 0, max(0, high))])

    # -- raw protocol --------------------------------------------------------------------

    def send(
        self, body: CommandBody, *, seq: int | None = None, nonce: str | None = None
    ) -> Command:
        """Send one command (``seq``/``nonce`` overrides exist to re-deliver or to test)."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        cmd = Command(self.controller, nonce or self.nonce, seq, body, _now_ms())
        self._producer.produce(
            self.command_topic, value=encode_command(cmd), partition=0, headers=command_headers()
        )
        self._producer.flush(10)
        return cmd

    def poll(self, timeout: float = 0.1) -> list[Response]:
        """Responses addressed to this session that arrived since the last poll."""
        out: list[Response] = []
        for msg in self._reader.poll(timeout, 500):
            try:
                resp = decode_response(msg.value() or b"", msg.headers())
            except ProtocolError:
                continue
            if resp.controller == self.controller and resp.nonce == self.nonce:
                out.append(resp)
        return out

    def wait(self, seq: int, timeout: float | None = None) -> Response:
        """The response to command ``seq``; other responses go to :attr:`inbox`."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            for i, resp in enumerate(self.inbox):
                if resp.seq == seq:
                    self.acker = resp.acker
                    return self.inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.inbox += self.poll(min(0.1, left))
        raise AckerUnavailableError(
            f"no acker answered within {limit:g} s on topic '{self.command_topic}'; "
            "is `substreams acker run` running?"
        )

    # -- the session ---------------------------------------------------------------------

    def connect(self, timeout: float | None = None) -> StatusResponse:
        """Hello, CreateInstance, InitializationComplete; returns the Hello's status."""
        hello = self.send(Hello())
        self.send(CreateInstance())
        self.send(InitializationComplete())
        return self._status_of(self.wait(hello.seq, timeout))

    def status(self, timeout: float | None = None) -> StatusResponse:
        return self._status_of(self.wait(self.send(StatusRequest()).seq, timeout))

    def peek(
        self, substream: str, time: Time | None = None, timeout: float | None = None
    ) -> PeekResponse:
        cmd = self.send(Peek(uuid.uuid4().hex, substream, time))
        resp = self.wait(cmd.seq, timeout)
        if isinstance(resp.body, Rejected):
            raise CommandRejectedError(f"acker '{resp.acker}': {resp.body.reason}")
        if not isinstance(resp.body, PeekResponse):
            raise ProtocolError(f"acker answered a Peek with {type(resp.body).__name__}")
        return resp.body

    def configure(self, substreams: Sequence[str]) -> Command:
        return self.send(ConfigureSubstreams(tuple(substreams)))

    def allow_compaction(self, substream: str, frontier: Sequence[Time]) -> Command:
        return self.send(AllowCompaction(substream, tuple(frontier)))

    def cancel_peek(self, peek_uuid: str) -> Command:
        return self.send(CancelPeek(peek_uuid))

    def acks_lag(self, status: StatusResponse) -> dict[int, int]:
        """Per acks partition: messages not yet applied (high watermark minus the acker's
        position; with transactional writers the count includes commit markers)."""
        lags: dict[int, int] = {}
        for a in status.acks:
            _, high = self._reader.watermarks(self.config.acker.acks_topic, a.partition)
            lags[a.partition] = max(0, high - a.offset)
        return lags

    @staticmethod
    def _status_of(resp: Response) -> StatusResponse:
        if isinstance(resp.body, Rejected):
            raise CommandRejectedError(f"acker '{resp.acker}': {resp.body.reason}")
        if not isinstance(resp.body, StatusResponse):
            raise ProtocolError(f"acker answered with {type(resp.body).__name__}, not a status")
        return resp.body

    def close(self) -> None:
        self._producer.flush(5)
        self._producer.close()
        self._reader.close()

    def __enter__(self) -> AckerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
