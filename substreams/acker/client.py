"""The controller side of the command protocol (what the CLI and jobs use to talk to an acker).

A client is one controller session: a random controller id and nonce, commands numbered from
0, responses read from the response topic and filtered by (controller, nonce).  Where it starts
reading responses: the response topic's high watermark *before* the Hello is sent, so no answer
to us can be missed and older responses of other sessions are not read at all.

A sharded acker (``acker.shards`` > 1) answers a Hello or a Status once per shard, each for
what it owns, and a peek from the shard that owns the substream: :meth:`AckerClient.status_all`
waits for every shard (at most the timeout) and merges what came, naming the shards that did
not answer, so a caller never takes a fraction of the substreams for the whole.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition

from substreams.acker.commands import (
    Command,
    CommandBody,
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
    merge_statuses,
)
from substreams.acker.protocol import segment_partition
from substreams.config import Config
from substreams.errors import ProtocolError, SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.clock import Deadline
from substreams.kafka.read import Reader
from substreams.kafka.topics import ensure_topics


class AckerUnavailableError(SubstreamsError):
    """No acker answered in time (none is running, or it is a standby)."""


class CommandRejectedError(SubstreamsError):
    """The acker answered a command with Rejected (out of stage, unknown substream...)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Answers:
    """The answers to one command by the ackers that were asked (by acker name), and the
    ones that did not answer within the timeout."""

    responses: dict[str, Response]
    missing: tuple[str, ...]


@dataclass(frozen=True)
class ShardStatus:
    """A status merged from every shard that answered (:func:`merge_statuses`)."""

    status: StatusResponse
    answered: tuple[str, ...]
    missing: tuple[str, ...]


class AckerClient:
    """One controller session with the acker of ``config``.  Use as a context manager."""

    def __init__(
        self,
        config: Config,
        bootstrap: str | None = None,
        *,
        controller: str | None = None,
        timeout: float = 5.0,
        shards: int | None = None,
        name: str | None = None,
    ) -> None:
        self.config = config
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.shards = shards or config.acker.shards
        self.base = name or config.acker.name
        """The acker's name (its shards' are ``<name>.shard<i>of<N>``)."""
        self.ackers = tuple(
            config.acker.shard_name(i, self.shards, name) for i in range(self.shards)
        )
        """The name of every shard that answers (one name without sharding)."""
        self._any_name = self.shards == 1 and name is None
        """One acker whose name was not given: whichever answers is it (as before shards)."""
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
        deadline = Deadline(limit)
        polled = False  # a zero (or passed) timeout still reads what already arrived
        while True:
            for i, resp in enumerate(self.inbox):
                if resp.seq == seq:
                    self.acker = resp.acker
                    return self.inbox.pop(i)
            if polled and deadline.passed:
                break
            self.inbox += self.poll(deadline.left(cap=0.1))
            polled = True
        raise self._unavailable(limit, self.ackers)

    def _unavailable(self, limit: float, names: Sequence[str]) -> AckerUnavailableError:
        if len(names) == 1 and not self._any_name:
            who = f"acker '{names[0]}' did not answer"
        elif len(names) > 1:
            who = f"no acker answered (asked: {', '.join(names)})"
        else:
            who = "no acker answered"
        return AckerUnavailableError(
            f"{who} within {limit:g} s on topic '{self.command_topic}'; "
            "is `substreams acker run` running?"
        )

    def wait_all(
        self, seq: int, ackers: Sequence[str] | None = None, timeout: float | None = None
    ) -> Answers:
        """The answers to command ``seq`` of each of ``ackers`` (default: every shard),
        waiting until all answered or the timeout passed.  Raises
        :class:`AckerUnavailableError` when none answered."""
        names = tuple(self.ackers if ackers is None else ackers)
        limit = self.timeout if timeout is None else timeout
        deadline = Deadline(limit)
        got: dict[str, Response] = {}
        polled = False  # a zero (or passed) timeout still reads what already arrived
        while True:
            keep: list[Response] = []
            for resp in self.inbox:
                who = names[0] if self._any_name and len(names) == 1 else resp.acker
                if resp.seq != seq:
                    keep.append(resp)
                elif who in names and who not in got:
                    got[who] = resp
                # else: an answer to seq from an acker not asked (another layout's): dropped
            self.inbox = keep
            if len(got) == len(names) or (polled and deadline.passed):
                break
            self.inbox += self.poll(deadline.left(cap=0.1))
            polled = True
        if not got:
            raise self._unavailable(limit, names)
        if len(names) == 1:
            self.acker = got[names[0]].acker
        return Answers(got, tuple(n for n in names if n not in got))

    def owner(self, substream: str) -> str | None:
        """The shard that answers peeks of ``substream`` (None: no acker tracks it; any
        shard answers with the error)."""
        if not any(s.name == substream and s.mechanism == "acker"
                   for s in self.config.substreams):
            return None
        home = segment_partition(substream, self.config.acker.acks_partitions)
        return self.ackers[home % self.shards]

    # -- the session ---------------------------------------------------------------------

    def connect_all(self, timeout: float | None = None) -> ShardStatus:
        """Hello, CreateInstance, InitializationComplete; every shard's status of the Hello,
        merged."""
        hello = self.send(Hello())
        self.send(CreateInstance())
        self.send(InitializationComplete())
        return self._merged(self.wait_all(hello.seq, timeout=timeout))

    def connect(self, timeout: float | None = None) -> StatusResponse:
        """:meth:`connect_all`'s merged status (of the shards that answered)."""
        return self.connect_all(timeout).status

    def status_all(
        self, timeout: float | None = None, ackers: Sequence[str] | None = None
    ) -> ShardStatus:
        """Every shard's status (or ``ackers``'), merged."""
        seq = self.send(StatusRequest()).seq
        return self._merged(self.wait_all(seq, ackers, timeout=timeout))

    def status(self, timeout: float | None = None) -> StatusResponse:
        return self.status_all(timeout).status

    def _merged(self, answers: Answers) -> ShardStatus:
        names = tuple(n for n in self.ackers if n in answers.responses)
        if not names:  # a single acker known by whichever name answered
            names = tuple(answers.responses)
        statuses = [self._status_of(answers.responses[n]) for n in names]
        return ShardStatus(merge_statuses(statuses), names, answers.missing)

    def peek(
        self, substream: str, time: Time | None = None, timeout: float | None = None
    ) -> PeekResponse:
        """The peek, answered by the shard that owns ``substream``."""
        cmd = self.send(Peek(uuid.uuid4().hex, substream, time))
        owner = self.owner(substream)
        if owner is None:
            resp = self.wait(cmd.seq, timeout)
        else:
            resp = self.wait_all(cmd.seq, (owner,), timeout).responses[owner]
        if isinstance(resp.body, Rejected):
            raise CommandRejectedError(f"acker '{resp.acker}': {resp.body.reason}")
        if not isinstance(resp.body, PeekResponse):
            raise ProtocolError(f"acker answered a Peek with {type(resp.body).__name__}")
        return resp.body

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
        """Let go of the session (its commands were flushed as sent): a fatal producer
        error is logged, and the reader is closed either way."""
        try:
            client.flush_at_close(self._producer, f"controller '{self.controller}'", 5)
            self._producer.close()
        finally:
            self._reader.close()

    def __enter__(self) -> AckerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
