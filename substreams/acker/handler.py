"""The acker side of the command protocol: reads commands, answers on the response topic.

Built with its service (:meth:`substreams.app.Application.acker`, as
``AckerService.command_handler``) and called once per service step, so commands are served by
the thread that owns the acker's state (no locking) and cost two non-blocking polls when
idle.  On its first call it rebuilds the command state through a
:class:`~substreams.acker.history.CommandHistory`: from the reduced history the acker's latest
checkpoint holds (:meth:`CommandHandler.capture`, at most every ``capture_interval_ms``) and the
commands after it -- or, without one, by replaying the command topic from offset 0 --
answering only what the response topic shows as not yet answered (commands sent while no
acker ran, peeks a crashed incarnation still owed), then sends the configured substreams'
Frontiers.

With several acker shards every shard runs a handler (``owned``: its substreams).  Each reads
the whole command topic, so every shard's sessions, configuration and compaction frontiers
are the same; each answers Hello and Status for what it owns, peeks of its own substreams
only (another shard's are ignored: that shard answers), and pushes the Frontiers of its own
configured substreams.  Answers carry the shard's name (``Response.acker``): a controller
knows which shards answered, and a restarted shard skips only its own earlier answers.

Completed times are kept for peeks (read from the substreams' control topics: their
``EpochComplete`` records) until an AllowCompaction lets the acker forget them, as Materialize
keeps arrangement history until its ``since`` advances (and at most ``keep_completed`` per
substream, so an acker nobody compacts stays bounded).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, Message, TopicPartition

from substreams.acker.commands import (
    AcksPartition,
    AllowCompaction,
    CancelPeek,
    Command,
    ConfigureSubstreams,
    Frontiers,
    Hello,
    InitializationComplete,
    Peek,
    PeekCanceled,
    PeekError,
    PeekResponse,
    PeekRow,
    PeekRows,
    Rejected,
    Response,
    ResponseBody,
    SessionPhase,
    StatusRequest,
    StatusResponse,
    SubstreamStatus,
    decode_command,
    decode_response,
    encode_command,
    encode_response,
    response_headers,
)
from substreams.acker.history import CommandHistory, OutcomeKind
from substreams.config import Config
from substreams.control.follower import LOG, ControlFollower
from substreams.control.io import ResumeLookup
from substreams.control.messages import (
    Completion,
    ControlBody,
    EpochComplete,
    EpochsComplete,
)
from substreams.control.progress import event_time
from substreams.control.writers import WriterCheck
from substreams.errors import BrokerError, ProtocolError
from substreams.frontier import Time, sort_key
from substreams.kafka import client
from substreams.kafka.clock import SYSTEM, Clock
from substreams.kafka.read import Reader
from substreams.kafka.topics import ensure_topics
from substreams.kafka.write import produce
from substreams.streams.deadletter import REASON_MALFORMED, DeadLetterWriter, UndeliveredError

if TYPE_CHECKING:
    from substreams.acker.service import AckerService
    from substreams.acker.state import AckerView

log = logging.getLogger(__name__)


Done = Completion | EpochComplete
"""A kept completed time: the notification itself (its ``records``, ``sealed_at_ms`` and
``ranges`` are what a peek shows), not a copy of its fields per time."""


def tracked_substreams(config: Config) -> list[str]:
    """The substreams an acker of this config tracks (mechanism ``acker``)."""
    return [s.name for s in config.substreams if s.mechanism == "acker"]


class CommandHandler:
    """Serves the command topic for one acker.  Call it with the service once per step."""

    def __init__(
        self,
        config: Config,
        bootstrap: str | None = None,
        name: str | None = None,
        *,
        frontier_interval_ms: int = 50,
        reduce_every: int = 1000,
        keep_idle_sessions: int = 64,
        keep_completed: int = 10_000,
        capture_interval_ms: int = 1000,
        owned: Iterable[str] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.config = config
        self.clock = clock  # the service's: a SimClock in tests
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.name = name or config.acker.name
        self.substreams = tracked_substreams(config)
        mine = None if owned is None else set(owned)
        self.history = CommandHistory(
            self.substreams, keep_idle_sessions=keep_idle_sessions, owned=mine
        )
        self.frontier_interval = frontier_interval_ms / 1000.0
        self.reduce_every = reduce_every
        self.keep_completed = keep_completed
        self.completed: dict[str, dict[Time, Done]] = {s: {} for s in self.substreams}
        self.commands_seen = 0
        self.dead_letters = 0
        self.capture_interval = capture_interval_ms / 1000.0
        self._last_capture = 0.0
        self._position = 0  # the next command-topic offset to read (what a capture covers)
        self._saved_replay = False
        self.replayed_from = 0
        """The command-topic offset start-up replayed from (0 without a saved history)."""
        self.replayed = 0
        """How many commands of the command topic start-up replayed."""
        self._responses_from = 0
        self._started = False
        self._answered: set[tuple[str, str, int]] | None = None
        self._since_reduce = 0
        self._sent_frontiers: dict[str, tuple[tuple[Time, ...], tuple[Time, ...]]] = {}
        self._last_push = 0.0
        self._commands: Reader | None = None
        self._control: ControlFollower | None = None
        self._topic_sub = {config.acker.control_topic(s): s for s in self.substreams
                           if mine is None or s in mine}
        """The control topics read for completed times: this shard's substreams' only."""
        self._backfill: dict[str, int] = {}
        """The service's own control topics still read from the topic at start-up: their end
        offset then (records there are the service's, committed before this handler ran)."""
        self._fed: set[str] = set()
        """Control topics whose completions come from the service's commits (not read)."""
        self._pending: dict[str, list[tuple[str, ControlBody]]] = {}
        """Fed completions of a topic still being backfilled, kept in order until it ends."""
        fast: dict[str, Any] = {"linger.ms": 0}
        self._producer = client.producer(self.bootstrap, config, **fast)
        self._letters = DeadLetterWriter(config, f"{self.name}.commands", producer=self._producer)
        self._closed = False

    # -- life cycle ----------------------------------------------------------------------

    def __call__(self, service: AckerService) -> None:
        view = _LazyView(service.view)
        if not self._started:
            self._start(view, service.state.commands, set(service.control_topics.values()))
        assert self._commands is not None
        self._take_committed(service)
        self._poll_control()
        for msg in self._commands.poll(0, 500):
            cmd = self._decode(msg)
            if cmd is not None:
                self._handle(cmd, view)
        due = self.clock.monotonic() - self._last_push >= self.frontier_interval
        if due and self.history.state.configured is not None:
            self._push_frontiers(view, force=False)
        self._producer.poll(0)
        if self.clock.monotonic() - self._last_capture >= self.capture_interval:
            try:
                service.state.commands = self.capture()
            except UndeliveredError as exc:  # the checkpoint keeps the previous capture
                log.warning("command handler: %s; history not captured", exc)

    def capture(self) -> dict[str, Any]:
        """What the acker's next checkpoint keeps of the command side: the reduced history,
        the command-topic position it covers, and the response-topic offset from which a
        restarted handler must look for answers.  Why that offset is safe: it is the high
        watermark *now*, and every response to a command past the position is produced
        later.  The dead letters and responses sent so far are flushed first, so that a
        command the history counts as handled has its dead letter or its answer on the topic
        (:class:`UndeliveredError` if a dead letter is not)."""
        self._last_capture = self.clock.monotonic()
        self._letters.flush(5.0)
        self.history.reduce()
        self._since_reduce = 0
        self._producer.flush(5)
        topic = self.config.acker.response_topic
        assert self._commands is not None
        try:
            _, high = self._commands.watermarks(topic, 0, timeout=2.0)
            self._responses_from = max(0, int(high))
        except (BrokerError, KafkaException) as exc:
            # The response topic's leader is away (a broker down): an older watermark is as
            # safe (a restart reads a little more of the topic), a dead acker is not.
            log.warning("command handler: response topic '%s' watermark not available (%s); "
                        "keeping %d", topic, exc, self._responses_from)
        return {
            "acker": self.name,
            "position": self._position,
            "responses_from": self._responses_from,
            "commands": [
                base64.b64encode(encode_command(c)).decode() for c in self.history.commands
            ],
        }

    def _start(
        self, view: _LazyView, saved: dict[str, Any] | None, own: set[str] | None = None
    ) -> None:
        """Replay the command topic as if live, but send only the responses that the response
        topic does not already hold (so a command sent while no acker ran is answered once,
        and nothing a previous incarnation answered is answered twice).

        With ``saved`` (the :meth:`capture` in the acker's latest checkpoint) the replay is
        bounded: its reduced history first (answering only peeks still owed), then the
        command topic from the saved position, the response topic from the saved offset.
        Without it (no checkpoint yet, or one written before handlers captured anything),
        both topics are read from offset 0.

        ``own``: the control topics the calling service writes.  Their completions are read
        from the topic only up to its end now, then taken from the service's commits
        (:meth:`_take_committed`): why, decoding every ``EpochsComplete`` its own service
        had just encoded would make the handler one of the acker's largest costs at
        granularity 1.  Topics the service does not write (a handler without a service of
        its own) are read."""
        acker = self.config.acker
        position, responses_from, kept, answered_as = self._saved_history(saved)
        self._responses_from = responses_from
        ensure_topics(
            client.admin(self.bootstrap, self.config),
            [
                self.config.topic_spec(acker.command_topic),
                self.config.topic_spec(acker.response_topic),
            ],
        )
        began = self.clock.monotonic()
        answered = self._answered_since(responses_from, answered_as)
        self._follow_control(own or set())
        replayed = self._replay(kept, position, answered, view)
        self.history.reduce()
        self._started = True
        self.replayed_from, self.replayed = position, replayed
        log.info(
            "acker '%s' command handler recovery in %.3f s: %s, then replayed %d commands of "
            "'%s' from offset %d (%d kept after reduction); %d responses of '%s' read from "
            "offset %d to skip what was already answered",
            self.name, self.clock.monotonic() - began,
            "no saved history" if saved is None
            else f"{len(kept)} commands of the reduced history in the checkpoint",
            replayed, acker.command_topic, position, len(self.history.commands), len(answered),
            acker.response_topic, responses_from,
        )
        controller = self.history.state.configured_by()
        if controller is not None:
            self._sent_frontiers.clear()
            self._push_frontiers(view, force=True)

    def _saved_history(
        self, saved: dict[str, Any] | None
    ) -> tuple[int, int, list[Command], set[str] | None]:
        """What a :meth:`capture` holds: the command-topic position, the response-topic
        offset, the reduced history, and whose answers count as ours (None: anyone's).
        Without one: both topics from offset 0, only this handler's answers."""
        if saved is None:
            return 0, 0, [], {self.name}
        # Whose answers count as ours: this shard's, and those of the acker that captured
        # the history (a predecessor after a change of layout).  A history without the name
        # was captured when one handler served every command.
        by = saved.get("acker")
        answered_as = None if by is None else {self.name, str(by)}
        try:
            position, responses_from = int(saved["position"]), int(saved["responses_from"])
            kept = [decode_command(base64.b64decode(c)) for c in saved["commands"]]
        except (KeyError, TypeError, ValueError, ProtocolError) as exc:
            raise ProtocolError(f"acker checkpoint: command history unreadable: {exc}") from exc
        return position, responses_from, kept, answered_as

    def _answered_since(
        self, offset: int, answered_as: set[str] | None
    ) -> set[tuple[str, str, int]]:
        """The (controller, nonce, seq) of every command the response topic answers from
        ``offset`` on (by an acker of ``answered_as``; None: by any)."""
        answered: set[tuple[str, str, int]] = set()
        responses = self._tail(self.config.acker.response_topic, offset)
        try:
            for msg in responses.iter_to_end():
                try:
                    resp = decode_response(msg.value() or b"", msg.headers())
                except ProtocolError as exc:  # not an answer: nothing to skip for it
                    log.warning("command handler: response topic offset %d passed over: %s",
                                msg.offset(), exc)
                    continue
                if answered_as is None or resp.acker in answered_as:
                    answered.add((resp.controller, resp.nonce, resp.seq))
        finally:
            responses.close()
        return answered

    def _follow_control(self, own: set[str]) -> None:
        """Follow this shard's control topics from their recent tail (completed times for
        peeks); those in ``own`` are read only up to their end now, then fed by the
        service's commits (see :meth:`_start`)."""
        # A bad record is logged and counted, never a stop: the acker keeps serving.
        self._control = ControlFollower(
            self.bootstrap, self.config, name="command handler: control", on_bad=LOG,
            resume=ResumeLookup(self.bootstrap, self.config),
            writers=WriterCheck.of(self.config, also=(self.name,)),
        )
        starts = {t: self._recent(self._control.reader, t) for t in self._topic_sub}
        self._control.assign(starts)
        self._fed = {t for t in self._topic_sub if t in own}
        ends = {t: int(self._control.reader.watermarks(t, 0)[1]) for t in self._fed}
        self._backfill = {t: end for t, end in ends.items() if end > starts[t]}
        self._pending = {t: [] for t in self._fed}
        self._end_backfills()

    def _replay(
        self, kept: list[Command], position: int, answered: set[tuple[str, str, int]],
        view: _LazyView,
    ) -> int:
        """Handle the saved history, then the command topic from ``position`` to its end,
        answering only what ``answered`` lacks; how many commands of the topic it read.
        The command topic stays open for the live commands after it."""
        self._commands = self._tail(self.config.acker.command_topic, position)
        self._position = position
        self._answered = answered
        replayed = 0
        try:
            self._saved_replay = True
            for saved_cmd in kept:
                self._handle(saved_cmd, view)
            self._saved_replay = False
            for msg in self._commands.iter_to_end():
                cmd = self._decode(msg)
                if cmd is not None:
                    self._handle(cmd, view)
                    replayed += 1
        finally:
            self._answered = None
            self._saved_replay = False
        return replayed

    def close(self) -> None:
        """Flush the answers and close the clients (once: later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        if self._commands is not None:
            self._commands.close()
        if self._control is not None:
            self._control.close()
        self._commands = self._control = None
        self._producer.flush(5)
        self._producer.close()

    def _tail(self, topic: str, offset: int = 0) -> Reader:
        return Reader(
            self.bootstrap, self.config, [TopicPartition(topic, 0, offset)],
            name=f"command handler: {topic}",
        )

    def _recent(self, reader: Reader, topic: str) -> int:
        """Where to read a control topic for the completed times peeks may ask about: the
        last ``keep_completed`` ones at most are kept, so the topic's tail is enough (three
        offsets per completion cover snapshots, updates and transaction markers)."""
        low, high = reader.watermarks(topic, 0)
        return max(0, int(low), int(high) - 3 * self.keep_completed)

    def _decode(self, msg: Message) -> Command | None:
        self._position = msg.offset() + 1
        try:
            return decode_command(msg.value() or b"", msg.headers())
        except ProtocolError as exc:
            # Dead-lettered when read, also on a replay after a restart: at least once, as
            # the acker's own dead letters (same topic/partition/offset: easy to de-duplicate).
            self._letters.write_message(msg, REASON_MALFORMED, str(exc))
            self.dead_letters += 1
            return None

    # -- commands ------------------------------------------------------------------------

    def _handle(self, cmd: Command, view: _LazyView) -> None:
        self.commands_seen += 1
        canceling = None
        if isinstance(cmd.body, CancelPeek):
            canceling = self.history.state.peeks.get(cmd.body.uuid)
        outcome = self.history.push(cmd)
        self._since_reduce += 1
        if self._since_reduce >= self.reduce_every:
            self.history.reduce()
            self._since_reduce = 0
        body = cmd.body
        if outcome.kind in (OutcomeKind.DUPLICATE, OutcomeKind.STALE):
            log.debug("ignored %s from %s: %s", type(body).__name__, cmd.controller, outcome.reason)
            return
        if outcome.kind is OutcomeKind.REJECTED:
            if isinstance(body, Peek):
                self._reply(cmd, PeekResponse(body.uuid, body.substream, PeekError(outcome.reason)))
            else:
                self._reply(cmd, Rejected(outcome.reason))
            return
        if outcome.kind is OutcomeKind.IGNORED:
            return
        if outcome.canceled is not None and canceling is not None:
            # the answer to the Peek itself (its seq): the controller waits for that one
            peek = canceling.command
            sub = peek.body.substream if isinstance(peek.body, Peek) else ""
            self._reply(peek, PeekResponse(outcome.canceled, sub, PeekCanceled()))
            return
        session = self.history.state.session_of(cmd)
        assert session is not None
        computing = session.stage is SessionPhase.COMPUTATION
        if isinstance(body, Hello | StatusRequest):
            self._reply(cmd, self._status(view.get(), session.stage))
        elif isinstance(body, InitializationComplete):
            self._answer_owed(cmd.controller, view)
        elif isinstance(body, ConfigureSubstreams) and computing:
            self._sent_frontiers.clear()
            self._push_frontiers(view, force=True)
        elif isinstance(body, AllowCompaction):
            self._compact(body.substream)
        elif isinstance(body, Peek) and computing:
            self._answer_peek(self.history.state.peeks[body.uuid].command, view)

    def _answer_owed(self, controller: str, view: _LazyView) -> None:
        """Responses deferred during initialization (or owed by a previous incarnation)."""
        for kept in list(self.history.state.peeks.values()):
            if kept.command.controller == controller:
                self._answer_peek(kept.command, view)
        if self.history.state.configured_by() == controller:
            self._sent_frontiers.clear()
            self._push_frontiers(view, force=True)

    def _reply(self, cmd: Command, body: ResponseBody, seq: int | None = None) -> None:
        self._send(
            Response(
                self.name,
                cmd.controller,
                cmd.nonce,
                cmd.seq if seq is None else seq,
                body,
                self.clock.now_ms(),
            )
        )

    def _send(self, resp: Response) -> None:
        done = self._answered  # not None while replaying
        if done is not None and (resp.seq < 0 or (resp.controller, resp.nonce, resp.seq) in done):
            return
        if self._saved_replay and not isinstance(resp.body, PeekResponse):
            return  # the saved history was answered, but for peeks still owed
        produce(self._producer, self.config.acker.response_topic, encode_response(resp),
                partition=0, headers=response_headers())

    # -- status, frontiers ---------------------------------------------------------------

    def _status(self, view: AckerView, stage: SessionPhase) -> StatusResponse:
        state = self.history.state
        subs = []
        for name in sorted(view.substreams):
            sv = view.substreams[name]
            since = state.since_of(name)
            subs.append(
                SubstreamStatus(
                    name,
                    sv.lower.elements(),
                    sv.upper.elements(),
                    len(sv.open_times),
                    None if since is None else since.elements(),
                    view.last_notification.get(name),
                )
            )
        lag = view.acks_lag or {}
        acks = tuple(AcksPartition(p, o, lag.get(p)) for p, o in sorted(view.acks_offsets.items()))
        return StatusResponse(stage, tuple(subs), acks, state.configured_substreams())

    def _push_frontiers(self, view: _LazyView, *, force: bool) -> None:
        """Frontiers of the configured substreams to the controller that configured them."""
        self._last_push = self.clock.monotonic()
        state = self.history.state
        controller = state.configured_by()
        session = state.sessions.get(controller or "")
        if session is None or session.stage is not SessionPhase.COMPUTATION:
            return
        v = view.get()
        for name in state.configured_substreams():
            sv = v.substreams.get(name)
            if sv is None:
                continue
            now = (sv.lower.elements(), sv.upper.elements())
            if force or self._sent_frontiers.get(name) != now:
                self._sent_frontiers[name] = now
                self._send(
                    Response(
                        self.name,
                        session.controller,
                        session.nonce,
                        -1,
                        Frontiers(name, *now),
                        self.clock.now_ms(),
                    )
                )

    # -- peeks ---------------------------------------------------------------------------

    def _answer_peek(self, cmd: Command, view: _LazyView) -> None:
        body = cmd.body
        assert isinstance(body, Peek)
        self.history.answered(body.uuid)
        self._reply(cmd, self._peek(body, view.get()))

    def _peek(self, peek: Peek, view: AckerView) -> PeekResponse:
        sub = view.substreams.get(peek.substream)
        if sub is None:
            return PeekResponse(
                peek.uuid,
                peek.substream,
                PeekError(f"acker '{self.name}' tracks no substream {peek.substream!r}"),
            )
        open_rows = {
            o.time: PeekRow(
                o.time, "OPEN", o.xor, o.records, tuple(sorted(o.unsealed_sources)), o.first_seen_ms
            )
            for o in sub.open_times
        }
        if peek.time is None:
            rows = tuple(open_rows[t] for t in sorted(open_rows, key=sort_key))
            return PeekResponse(peek.uuid, peek.substream, PeekRows(rows))
        t = peek.time
        if t in open_rows:
            return PeekResponse(peek.uuid, peek.substream, PeekRows((open_rows[t],)))
        if self.history.state.is_compacted(peek.substream, t):
            since = self.history.state.since_of(peek.substream)
            shown = " ".join(str(x) for x in since or ())
            return PeekResponse(
                peek.uuid,
                peek.substream,
                PeekError(
                    f"time {t!r} of substream {peek.substream!r} was compacted "
                    f"(the compaction frontier is {{{shown}}})"
                ),
            )
        done = self.completed.get(peek.substream, {}).get(t)
        seen = event_time(t) if sub.keyed_floor else t  # what the frontiers are made of
        if done is None and (sub.lower.less_equal(seen) or not sub.upper.covers(seen)):
            return PeekResponse(peek.uuid, peek.substream, PeekRows(()))  # not seen yet
        row = PeekRow(
            t,
            "COMPLETE",
            0,
            0 if done is None else done.records,
            (),
            0,
            None if done is None else done.sealed_at_ms,
            () if done is None else done.ranges,
        )
        return PeekResponse(peek.uuid, peek.substream, PeekRows((row,)))

    def _poll_control(self) -> None:
        """Keep the completed times of the tracked substreams (from their EpochCompletes)
        that the service does not feed (:meth:`_take_committed`)."""
        assert self._control is not None
        if not self._backfill and len(self._fed) == len(self._topic_sub):
            return  # every topic is fed: nothing to read
        for msg in self._control.reader.poll(0, 1000):
            topic = msg.topic()
            end = self._backfill.get(topic)
            if topic in self._fed and (end is None or msg.offset() >= end):
                continue  # the service's own, fed (the topic is paused from here on)
            followed = self._control.take_one(msg)
            sub = self._topic_sub.get(topic)
            if followed is not None and sub is not None:
                self._keep(sub, _notes(followed.record.body))
        if self._backfill:
            self._end_backfills()

    def _end_backfills(self) -> None:
        """The fed topics read up to their start-up end: stop fetching them and keep what the
        service committed meanwhile, in order."""
        assert self._control is not None
        parts = [TopicPartition(t, 0) for t in self._backfill]
        for tp in self._control.reader.consumer.position(parts):
            if tp.offset >= self._backfill[tp.topic]:
                del self._backfill[tp.topic]
        # backfilled now, or nothing to read from the start: stop fetching, keep in order
        for topic in [t for t in self._pending if t not in self._backfill]:
            self._control.reader.consumer.pause([TopicPartition(topic, 0)])
            for sub, body in self._pending.pop(topic):
                self._keep(sub, _notes(body))

    def _take_committed(self, service: AckerService) -> None:
        """Keep the completions the service committed in its last step (on a topic still
        being backfilled: once its backfill ends, so that the kept order is the topic's)."""
        for topic, sub, body in service.committed_notes:
            if topic not in self._fed or sub not in self.completed:
                continue
            pending = self._pending.get(topic)
            if topic in self._backfill and pending is not None:
                pending.append((sub, body))
            else:
                self._keep(sub, _notes(body))

    def _keep(self, sub: str, notes: Sequence[EpochComplete | Completion]) -> None:
        """Keep ``notes`` (in order) but the compacted ones, then the newest
        ``keep_completed`` (bounded even without AllowCompaction).  Why from the end and
        trimmed once: a backlog completes hundreds of times per record, and keeping each
        then evicting the oldest one by one (``next(iter(kept))`` walks over the deleted
        slots at the dict's front) cost more than the acker's own work per time.  The same
        result as one by one, since a time is never announced twice."""
        kept = self.completed[sub]
        compacted = self.history.state.is_compacted
        keep = self.keep_completed
        picked: list[EpochComplete | Completion] = []
        for note in reversed(notes):
            if not compacted(sub, note.time):
                picked.append(note)
                if len(picked) >= keep:
                    break
        for note in reversed(picked):
            kept[note.time] = note  # immutable, and has the fields a peek reads
        excess = len(kept) - keep
        if excess > 0:
            for t in list(islice(kept, excess)):
                del kept[t]

    def _compact(self, substream: str) -> None:
        kept = self.completed.get(substream, {})
        for t in [t for t in kept if self.history.state.is_compacted(substream, t)]:
            del kept[t]


def _notes(body: ControlBody) -> Sequence[EpochComplete | Completion]:
    """The completions one control body carries (what
    :func:`~substreams.control.messages.completions` yields, without
    an ``EpochComplete`` built per epoch: a peek reads only the per-time fields)."""
    if isinstance(body, EpochsComplete):
        return body.epochs
    if isinstance(body, EpochComplete):
        return (body,)
    return ()


class _LazyView:
    """The service's view, built at most once per step and only when needed."""

    def __init__(self, make: Callable[[], AckerView]) -> None:
        self._make = make
        self._view: AckerView | None = None

    def get(self) -> AckerView:
        if self._view is None:
            self._view = self._make()
        return self._view
