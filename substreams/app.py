"""The composition root: which hook tracks each mechanism, chosen in one place, and every
service (acker, aligner, stage) built from the same configuration and broker.

Why a root and not a registry: a :class:`~substreams.streams.publisher.Publisher` lives below
the mechanisms that track its records (the acker, punctuations), so it cannot import them;
the first version had them register into a global dict on a string import, which made the
answer to "what tracks this publisher?" depend on what happened to be imported.  Here the
answer is a value (:data:`Mechanisms`) given to every publisher this application builds;
tests choose another (:data:`DIRECT`) by building another application, not by patching.

Layering: this module sits above ``acker`` and ``punctuation`` and below ``spark`` and
``cli`` (and the benchmarks, package ``substreams_bench``), which build their publishers
and services through it.  A stage's output and a Spark write unit are STAGE writers put
together in one place below it (:func:`~substreams.acker.tracker.stage_writer`); Spark units get
theirs from :meth:`Application.stage_writer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from substreams.acker.tracker import Tracker, source_tracker, stage_writer
from substreams.config import Config, SealPolicy
from substreams.control.direct import DirectProgress
from substreams.control.notifications import Notifications
from substreams.control.subscriber import Start
from substreams.kafka import client
from substreams.kafka.clock import SYSTEM, Clock
from substreams.punctuation.hook import PunctuationHook
from substreams.streams.deadletter import write_late_record
from substreams.streams.evolution import register_stream
from substreams.streams.publisher import (
    Mechanisms,
    ProducerFactory,
    Publisher,
    SchemaRegistrar,
)

if TYPE_CHECKING:  # the services are imported when built: a publisher needs none of them
    from substreams.acker.service import AckerService
    from substreams.acker.stage import Stage, Transform
    from substreams.punctuation.aligner import Terminated
    from substreams.punctuation.service import PunctuationAligner

__all__ = ["DIRECT", "TRACKED", "UNTRACKED", "Application", "Mechanisms", "never_evicted"]

TRACKED: Mechanisms = MappingProxyType(
    {"acker": source_tracker, "punctuations": PunctuationHook}
)
"""Production: the acker's tracker (reports, seals, heartbeats), in-band punctuations."""

DIRECT: Mechanisms = MappingProxyType(
    {"acker": DirectProgress, "punctuations": DirectProgress}
)
"""One source that writes its own control records (tests and demos without an acker)."""

UNTRACKED: Mechanisms = MappingProxyType({})
"""No mechanism: records only (the untracked baseline of the benchmarks)."""


def never_evicted(mechanisms: Mechanisms) -> Mechanisms:
    """``mechanisms`` with the acker told never to evict the source for silence.

    Why: eviction is the right answer to a dead source whose substreams would otherwise
    wait forever, but not to a source whose seal is the only thing holding back times that
    other writers already filled in part -- a Spark query's driver seals an output time
    after its tasks committed, so evicting a crashed driver would let the time terminate
    with the tasks that happened to commit.  Such a source waits to be restarted (or is
    evicted by hand: ``substreams acker evict-source``)."""
    if mechanisms.get("acker") is not source_tracker:
        return mechanisms
    return MappingProxyType(
        {**mechanisms, "acker": partial(source_tracker, evict_when_silent=False)}
    )


@dataclass(frozen=True)
class Application:
    """A configuration, a broker and the mechanisms: what every publisher is built from."""

    config: Config
    bootstrap: str | None = None
    """Overrides ``kafka.bootstrap`` (and ``$SUBSTREAMS_BOOTSTRAP``) for every client."""
    mechanisms: Mechanisms = field(default_factory=lambda: TRACKED)
    clock: Clock = SYSTEM
    """Where the services read time (a :class:`~substreams.kafka.clock.SimClock` in tests)."""
    producers: ProducerFactory = client.producer
    """What the publishers write through: the real client, or
    :class:`~substreams.kafka.memproducer.MemoryProducers` over the in-memory log."""
    schemas: SchemaRegistrar = register_stream
    """Where the publishers register their streams' schemas (the schema topic)."""

    def publisher(
        self,
        stream: str,
        source_id: str,
        *,
        batch_size: int = 500,
        bootstrap: str | None = None,
        producer_overrides: Mapping[str, Any] | None = None,
        seal_policies: Mapping[str, SealPolicy | None] | None = None,
        max_open_ms: int | None = None,
    ) -> Publisher:
        """A publisher of ``stream`` as ``source_id``, tracked by this application's
        mechanisms (see :class:`~substreams.streams.publisher.Publisher`, also for
        ``max_open_ms``: a time bound on an open transaction's records).
        ``seal_policies`` replaces the configured seal policy of the named substreams for
        this publisher (None: manual); late records under ``late: dead_letter`` go to the
        dead-letter topic (:func:`~substreams.streams.deadletter.write_late_record`).

        Refused (:class:`~substreams.acker.served.AckerDriftError`) before it registers
        when the stream has an acker substream that the acker serving it does not serve
        (its latest checkpoint says which: see :mod:`substreams.acker.served`)."""
        self._check_served(stream, bootstrap)
        return Publisher(
            self.config,
            stream,
            source_id,
            bootstrap=bootstrap or self.bootstrap,
            batch_size=batch_size,
            mechanisms=self.mechanisms,
            producer_overrides=producer_overrides,
            seal_policies=seal_policies,
            late_writer=write_late_record,
            producers=self.producers,
            schemas=self.schemas,
            clock=self.clock,
            max_open_ms=max_open_ms,
        )

    def _check_served(self, stream: str, bootstrap: str | None) -> None:
        """The drift check, for a publisher the acker tracks on a real broker (an
        in-memory log has no acker checkpoint to read; its tests build their own)."""
        if self.mechanisms.get("acker") is None or self.producers is not client.producer:
            return
        subs = [s.name for s in self.config.substreams_of(stream) if s.mechanism == "acker"]
        if subs:
            from substreams.acker.served import check_served

            server = client.resolve_bootstrap(self.config, bootstrap or self.bootstrap)
            check_served(self.config, server, stream, subs)

    def acker(
        self,
        *,
        name: str | None = None,
        standby: bool = False,
        shard: int = 0,
        shards: int | None = None,
        from_shards: int | None = None,
        max_batch: int = 5000,
        commands: bool = True,
        on_step: Callable[[AckerService], None] | None = None,
        **command_options: Any,
    ) -> AckerService:
        """The acker service (one shard of it with ``shards``; see
        :class:`~substreams.acker.service.AckerService`) with, unless ``commands`` is False,
        its command handler: every shard answers commands for the substreams it owns,
        under its own name (``command_options``: the
        :class:`~substreams.acker.handler.CommandHandler`'s keyword options).  ``on_step``
        is called after each step (``substreams acker run``'s progress lines).  The
        service owns the handler: :meth:`AckerService.close` closes both."""
        from substreams.acker.handler import CommandHandler
        from substreams.acker.service import AckerService

        if command_options and not commands:
            raise TypeError(f"command handler options without commands: {command_options}")

        def handler(service: AckerService) -> CommandHandler:
            return CommandHandler(
                self.config, service.bootstrap, service.name, owned=service.segments,
                clock=service.clock, **command_options,
            )

        return AckerService(
            self.config, self.bootstrap, name, standby=standby, shard=shard, shards=shards,
            from_shards=from_shards, max_batch=max_batch,
            commands=handler if commands else None, on_step=on_step, clock=self.clock,
        )

    def stage_writer(
        self, stream: str, source_id: str, substreams: list[str], *, batch_size: int
    ) -> tuple[Publisher, Tracker | None]:
        """A writer the acker tracks as a STAGE, for a Spark write unit: its publisher
        (fencing every earlier attempt of ``source_id``) and its tracker over
        ``substreams`` (:func:`~substreams.acker.tracker.stage_writer`, which a Python
        stage's output uses too)."""
        return stage_writer(
            self.config, stream, source_id, substreams, bootstrap=self.bootstrap,
            batch_size=batch_size,
        )

    def aligner(
        self, substream: str, *, on_terminated: Callable[[Terminated], None] | None = None
    ) -> PunctuationAligner:
        """The punctuation aligner of ``substream`` (``mechanism: punctuations``)."""
        from substreams.punctuation.service import PunctuationAligner

        return PunctuationAligner(
            self.config, substream, bootstrap=self.bootstrap, on_terminated=on_terminated
        )

    def stage(self, name: str, transform: Transform, **options: Any) -> Stage:
        """The configured stage ``name`` running ``transform`` (see
        :class:`~substreams.acker.stage.Stage` for ``options``)."""
        from substreams.acker.stage import Stage

        return Stage(self.config, name, transform, bootstrap=self.bootstrap, **options)

    def notifications(
        self,
        substream: str,
        *,
        from_: Start = "latest_snapshot",
        records: bool = False,
        idle_timeout: float | None = None,
    ) -> Notifications:
        """The completed times of ``substream`` as typed notes, in notification order
        (see :class:`~substreams.control.notifications.Notifications`); ``records=True``:
        each note carries its time's records (``note.entries``, a firm read)."""
        return Notifications(
            self.config, substream, from_=from_, records=records, bootstrap=self.bootstrap,
            idle_timeout=idle_timeout,
        )
