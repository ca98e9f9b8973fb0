"""Kafka client settings in one place, so every producer and consumer agrees on them.

Why explicit ``assign()`` everywhere and no consumer groups: every reader of ours keeps its
positions in its own state, written atomically with what it produced (the acker's checkpoint,
Spark's offset log, a subscriber's control position), so a group's committed offsets would be
a second, disagreeing truth, and a rebalance would move partitions behind the reader's back.

Why ``read_committed``: publishers write in transactions (that is how a second publisher gets
fenced), and readers must never see an aborted write.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from substreams.config import Config, KafkaConfig, SecurityConfig
from substreams.errors import BrokerError
from substreams.kafka import security, write
from substreams.kafka.clock import Deadline, retry
from substreams.kafka.embedded import read_state

ENV_BOOTSTRAP = "SUBSTREAMS_BOOTSTRAP"

log = logging.getLogger(__name__)

RDKAFKA_LOG = logging.getLogger("substreams.kafka.librdkafka")
"""Where librdkafka's own log lines go (its errors: ``log_level`` 3).  Why not its default,
stderr: a service's output must be its logs, formatted and filterable, not raw
``%3|...|FAIL|rdkafka#producer-1|`` lines (a broker going away printed them in every
process).  librdkafka queues them; they are emitted from the client's own poll/flush."""


def resolve_bootstrap(config: Config | None = None, override: str | None = None) -> str:
    """The bootstrap servers to use: an explicit override, ``$SUBSTREAMS_BOOTSTRAP``, the
    config's ``kafka.bootstrap``, and for ``embedded`` the broker recorded by `broker start`."""
    wanted = (
        override
        or os.environ.get(ENV_BOOTSTRAP)
        or (config.kafka.bootstrap if config else "embedded")
    )
    if wanted == "embedded":
        state = read_state()
        if state is None:
            raise BrokerError(
                "kafka.bootstrap is 'embedded' but no embedded broker is running; start one "
                "with `substreams broker start` (or set SUBSTREAMS_BOOTSTRAP=host:port)"
            )
        wanted = state.bootstrap
    if config is not None and config.kafka.security is not None:
        check_login(wanted, config.kafka.security)
    return wanted


LOGIN_PROBE_S = 5.0
"""How long :func:`check_login` waits for the broker's answer before letting the client go
on (a broker that does not answer is the caller's usual error, not a login problem)."""

_LOGGED_IN: set[tuple[str, SecurityConfig]] = set()


def check_login(bootstrap: str, sec: SecurityConfig) -> None:
    """Fail fast, in one line naming the user and the broker, when the broker refuses the
    login (a wrong password, an unknown user) or the TLS handshake (a CA that did not sign
    the broker's certificate).  Why: librdkafka treats both as transient, so every client
    would retry them quietly until its own timeout -- a publisher that hangs, a CLI command
    that says "timed out" after 30 s.  Once per process, broker and block (at most
    :data:`LOGIN_PROBE_S`)."""
    if (bootstrap, sec) in _LOGGED_IN:
        return
    errors: list[KafkaError] = []
    probe = AdminClient({
        "bootstrap.servers": bootstrap, "log_level": 0, "error_cb": errors.append,
        **security.rdkafka_settings(sec),
    })
    deadline = Deadline(LOGIN_PROBE_S)
    while not deadline.passed:
        try:
            probe.list_topics(timeout=0.5)
        except KafkaException:
            probe.poll(0)
        else:
            _LOGGED_IN.add((bootstrap, sec))
            return
        for err in errors:
            if err.code() == KafkaError._AUTHENTICATION:
                raise BrokerError(
                    f"Kafka at {bootstrap} refused user '{sec.username}': authentication "
                    f"failed ({sec.sasl_mechanism}); check kafka.security's password "
                    f"({_password_source(sec)}) and that the user exists"
                )
            if err.code() == KafkaError._SSL:
                who = f"user '{sec.username}'" if sec.sasl else sec.protocol
                raise BrokerError(
                    f"TLS with Kafka at {bootstrap} failed ({who}): "
                    f"{_ssl_reason(err.str())}; check kafka.security.ca_file "
                    f"({sec.ca_file or 'the system CAs'})"
                )
    # no answer at all: the broker is down or far, which the client's own calls report;
    # probing again at every later client of this process would only add the wait
    _LOGGED_IN.add((bootstrap, sec))


def _password_source(sec: SecurityConfig) -> str:
    if sec.password_env is not None:
        return f"${sec.password_env}"
    return str(sec.password_file)


def _ssl_reason(text: str) -> str:
    """librdkafka's SSL error without its ``sasl_ssl://host:port/bootstrap: `` prefix."""
    return text.split(": ", 1)[-1]


def _extra(config: Config | None) -> dict[str, Any]:
    """What the config adds to every client: ``kafka.security`` in librdkafka's keys, then
    ``kafka.client`` as written."""
    if config is None:
        return {}
    return {**security.rdkafka_settings(config.kafka.security), **config.kafka.client}


def producer(
    bootstrap: str,
    config: Config | None = None,
    *,
    transactional_id: str | None = None,
    **overrides: Any,
) -> Producer:
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "log_level": 3,
        "logger": RDKAFKA_LOG,
    }
    counter: TxnRetryCounter | None = None
    if transactional_id:
        settings["transactional.id"] = transactional_id
        settings["transaction.timeout.ms"] = TRANSACTION_TIMEOUT_MS
        counts_in = os.environ.get(ENV_COUNT_TXN_RETRIES)
        if counts_in and not Path(counts_in).is_dir():
            _warn_not_a_folder(counts_in)
        elif counts_in:
            counter = TxnRetryCounter(transactional_id, Path(counts_in))
            settings.update(debug="eos", log_level=7, logger=counter)
    settings.update(_extra(config))
    settings.update(overrides)
    return Producer(settings) if counter is None else CountedProducer(settings, counter)


class CountedProducer(Producer):  # type: ignore[misc]  # confluent-kafka is untyped here
    """A transactional producer whose CONCURRENT_TRANSACTIONS retries are counted (only
    while :func:`counting_txn_retries` is on): it carries its counter, so that a writer can
    say when it waits for a commit (:func:`committing`)."""

    def __init__(self, settings: dict[str, Any], counter: TxnRetryCounter) -> None:
        super().__init__(settings)
        self.txn_counter = counter


@contextlib.contextmanager
def committing(producer: Producer) -> Iterator[None]:
    """Around a writer's commit (its delivery flush, last writes and ``commit_transaction``):
    with retries counted, the refusals its commit waited for are counted apart
    (:attr:`TxnRetryCounter.commit_waits`); otherwise nothing."""
    counter: TxnRetryCounter | None = getattr(producer, "txn_counter", None)
    if counter is None:
        yield
        return
    producer.poll(0)  # the log lines of before the commit, counted as such
    counter.commit_begins()
    try:
        yield
    finally:
        producer.poll(0)
        counter.commit_ends()


ENV_COUNT_TXN_RETRIES = "SUBSTREAMS_COUNT_TXN_RETRIES"
"""A folder: when set, every transactional producer of every process that inherits it
counts its CONCURRENT_TRANSACTIONS retries there (:class:`TxnRetryCounter`).  For
benchmarks; unset in production, where the debug log it needs would cost for nothing."""



@functools.cache
def _warn_not_a_folder(value: str) -> None:
    """Once per value: the benches set the variable to a folder; a user's ``=1`` is ignored
    with a warning rather than failing every transactional producer."""
    log.warning("%s=%r is not an existing folder: CONCURRENT_TRANSACTIONS retries are not "
                "counted (the benches set it themselves)", ENV_COUNT_TXN_RETRIES, value)


CONCURRENT_TRANSACTIONS = "another concurrent operation on the same transaction"
"""librdkafka's text of the broker's CONCURRENT_TRANSACTIONS error (code 51)."""


class TxnRetryCounter:
    """Counts the requests the transaction coordinator refused with CONCURRENT_TRANSACTIONS
    (librdkafka retries each after a fixed ~20 ms), read from librdkafka's ``eos`` debug log;
    forwards its errors to :data:`RDKAFKA_LOG` as the default ``log_level`` 3 would.

    Why the log and not ``statistics.interval.ms``: its JSON counts requests per broker
    (``brokers[].req.AddPartitionsToTxn``) but not their errors, and ``txretries`` /
    ``txerrs`` count produce requests only; a refused registration is one more
    AddPartitionsToTxn there, the same as a transaction that registered partitions twice.
    One refused AddPartitionsToTxn logs a line per partition: lines after one "Registering
    partitions" count once.  The count is kept in ``folder/<pid>.json`` ({transactional id:
    [retries, commit waits]}), rewritten on each retry, so a process that is killed still
    reports."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.retries = 0
        self.commit_waits = 0
        """Of ``retries``: those a commit waited for -- refused during the writer's commit,
        or refused before it and not yet retried successfully when it began.  The others
        delayed no commit: a transaction that began right after the previous commit and
        registered before its own commit (the next records of a steady source)."""
        self._folder = folder
        self._request_open = False
        self._unregistered = False
        """A refused registration not yet followed by a successful one."""
        self._committing = False
        self._key = f"{name}|{next(_SERIAL)}"  # a producer that reuses an id counts apart
        self.save()

    def log(self, level: int, msg: str, *args: object) -> None:
        """The ``logging.Logger.log`` that confluent-kafka calls (from poll/flush)."""
        if self.feed(msg % args if args else msg):
            self.save()
        if level >= logging.ERROR:
            RDKAFKA_LOG.log(level, msg, *args)

    def feed(self, line: str) -> bool:
        """Reads one log line; did it count a retry?"""
        if "Registering partitions with transaction" in line:
            self._request_open = True
            return False
        if "registered with transaction" in line:
            self._unregistered = False
            return False
        if CONCURRENT_TRANSACTIONS not in line:
            return False
        if "AddPartitionsToTxn response" in line:
            if not self._request_open:
                return False  # another partition of a request already counted
            self._request_open = False
        self.retries += 1
        if self._committing:
            self.commit_waits += 1
        self._unregistered = True
        return True

    def commit_begins(self) -> None:
        """The writer's commit starts: a refused registration still pending delays it."""
        self._committing = True
        if self._unregistered:
            self.commit_waits += 1
            self.save()

    def commit_ends(self) -> None:
        self._committing = False

    def save(self) -> None:
        with _COUNTS_LOCK:
            path = self._folder / f"{os.getpid()}.json"
            try:
                counts = json.loads(path.read_text())
            except (OSError, ValueError):
                counts = {}
            counts[self._key] = [self.retries, self.commit_waits]
            with tempfile.NamedTemporaryFile("w", dir=self._folder, delete=False) as f:
                json.dump(counts, f)
            os.replace(f.name, path)


_COUNTS_LOCK = threading.Lock()
_SERIAL = itertools.count()


def txn_retries(folder: Path, *, commit_waits: bool = False) -> dict[str, int]:
    """The CONCURRENT_TRANSACTIONS retries counted in ``folder``, per transactional id,
    summed over processes (and over producers that reused an id); with ``commit_waits``,
    only those a commit waited for (:attr:`TxnRetryCounter.commit_waits`)."""
    total: dict[str, int] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            counts = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for key, pair in counts.items():
            name = key.rsplit("|", 1)[0]
            total[name] = total.get(name, 0) + int(pair[1 if commit_waits else 0])
    return total


@contextlib.contextmanager
def counting_txn_retries() -> Iterator[Path]:
    """Count the CONCURRENT_TRANSACTIONS retries of every transactional producer created
    inside, in this process and in the processes it starts; yields the folder for
    :func:`txn_retries`."""
    before = os.environ.get(ENV_COUNT_TXN_RETRIES)
    with tempfile.TemporaryDirectory(prefix="txn-retries-") as folder:
        os.environ[ENV_COUNT_TXN_RETRIES] = folder
        try:
            yield Path(folder)
        finally:
            if before is None:
                os.environ.pop(ENV_COUNT_TXN_RETRIES, None)
            else:
                os.environ[ENV_COUNT_TXN_RETRIES] = before


def consumer(bootstrap: str, config: Config | None = None, **overrides: Any) -> Consumer:
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        # A group id is required by librdkafka even with assign(); it is never joined.
        "group.id": f"substreams-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 10,
        "log_level": 3,
        "logger": RDKAFKA_LOG,
    }
    settings.update(_extra(config))
    settings.update(overrides)
    return Consumer(settings)


def admin(bootstrap: str, config: Config | None = None) -> AdminClient:
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap, "log_level": 3, "logger": RDKAFKA_LOG,
    }
    settings.update(_extra(config))
    return AdminClient(settings)


TRANSACTION_TIMEOUT_MS = 90_000
"""``transaction.timeout.ms`` of every transactional writer: how long a writer that died
inside a transaction can hold the last stable offset of every partition it wrote (every
``read_committed`` reader stops there) when nobody fences it.  The acker fences a silent
source's open transaction after ``acker.source_timeout_ms`` (docs/design.md, "Silence and
open transactions"), so this is the worst case only for writers the acker does not fence:
untracked publishers, another program's producer, a never-evicted Spark driver.  Why not
shorter: it must outlast :data:`COMMIT_PATIENCE_S`, or the coordinator aborts a transaction
whose writer is still waiting a broker outage out to commit it."""

COMMIT_PATIENCE_S = 75.0
"""How long a transactional writer waits out a broker outage before giving up on a commit:
a whole-cluster restart (~20-50 s here), and below :data:`TRANSACTION_TIMEOUT_MS` so that
its coordinator does not abort the transaction under it (a retried commit would then fail
as abortable)."""


def commit_timeout(config: Config | None) -> float:
    """One commit call's timeout in seconds: ``kafka.commit_timeout_ms`` (30 s without a
    config)."""
    return (config.kafka.commit_timeout_ms if config else KafkaConfig.commit_timeout_ms) / 1000


def commit_transaction(
    producer: Producer,
    what: str,
    patience: float = COMMIT_PATIENCE_S,
    call_timeout: float = KafkaConfig.commit_timeout_ms / 1000,
) -> None:
    """Deliver everything and commit the open transaction, waiting out a broker outage.

    Why here and only here: a ``commit_transaction`` that timed out is *still in progress*
    (librdkafka marks the error retriable) -- it may yet commit, so it must be called again,
    never aborted (an abort is refused with ``_CONFLICT`` and the outcome stays unknown).
    Every other error is raised: abortable ones for the caller to abort, fatal ones (a
    fenced producer) for it to stop.  ``call_timeout`` (``kafka.commit_timeout_ms``, see
    :func:`commit_timeout`) bounds one call."""
    retry(
        lambda deadline: producer.commit_transaction(deadline.left(1.0, call_timeout)),
        transient,
        patience,
        on_retry=lambda exc: log.warning(
            "%s: commit still in progress (%s); calling it again", what, exc.args[0]
        ),
    )


def flush_producer(producer: Producer, what: str, patience: float = COMMIT_PATIENCE_S) -> None:
    """Wait until every produced message is delivered (delivery callbacks served), through
    a broker outage of up to ``patience`` seconds; a ``BrokerError`` after that.  A fatal
    error (a fence) is raised as its ``KafkaException`` (:func:`write.flush`)."""
    deadline = Deadline(patience)
    while left := write.flush(producer, deadline.left(1.0, 30.0)):
        if deadline.passed:
            raise BrokerError(f"{what}: {left} messages not delivered within {patience:.0f} s")
        log.warning("%s: %d messages not delivered yet; waiting on", what, left)


def flush_at_close(producer: Producer, what: str, timeout: float) -> int:
    """:func:`write.flush` for a close that lets go and must not raise: a fatal error found
    during it (a fence: another instance holds the id) is logged, not raised -- the caller
    is done with the producer, and a fenced one has nothing left to deliver.  The messages
    still queued (0 after a fatal error)."""
    try:
        return write.flush(producer, timeout)
    except KafkaException as exc:
        log.warning("%s: closing after a fatal error: %s", what, exc.args[0] if exc.args else exc)
        return 0


MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        # A new leader after a broker failure, before its high watermark caught up (seen in
        # the leader-kill drill), and librdkafka's view of a partition during the move.
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._UNKNOWN_PARTITION,
    }
)
"""Errors of a partition that is being created or whose leader moves: they pass."""


def transient(exc: Exception, also: frozenset[int] = frozenset()) -> bool:
    """Is ``exc`` a Kafka error that passes (librdkafka calls it retriable, or its code is
    one of ``also``)?"""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in also)


def watermarks(
    consumer: Consumer, topic: str, partition: int, timeout: float = 30.0
) -> tuple[int, int]:
    """(low, high) offsets of a partition, asked of its leader (never cached).

    Retries retriable errors until ``timeout``: right after a topic is created, or while a
    leader moves, the broker answers NOT_LEADER_FOR_PARTITION for a moment (seen on
    Apache Kafka 4.1 under load)."""
    tp = TopicPartition(topic, partition)
    try:
        low, high = retry(
            lambda _: consumer.get_watermark_offsets(
                tp, timeout=max(1.0, min(10.0, timeout)), cached=False
            ),
            lambda exc: transient(exc, MOVING),
            timeout,
            pause=0.1,
        )
    except KafkaException as exc:
        if not transient(exc, MOVING):
            raise
        raise BrokerError(
            f"no offsets for {topic}[{partition}] within {timeout:.0f} s: {exc.args[0]}"
        ) from exc
    return int(low), int(high)


def end_offsets(
    admin: AdminClient, topic: str, partitions: list[int], *, committed: bool,
    timeout: float = 10.0,
) -> dict[int, int]:
    """Each partition's end as a reader of that isolation sees it: ``committed`` gives the
    last stable offset (the first offset of the oldest open transaction; what a
    ``read_committed`` reader can reach), otherwise the high watermark (every write,
    committed, aborted or still open).  One request for all partitions.  Raises
    ``KafkaException`` (e.g. during a broker outage): a caller that cannot tell must not
    guess."""
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    return _list_offsets(admin, topic, partitions, OffsetSpec.latest(), level, timeout)


def start_offsets(
    admin: AdminClient, topic: str, partitions: list[int], timeout: float = 10.0
) -> dict[int, int]:
    """Each partition's log start (past 0 once retention or ``delete_records`` removed its
    head), in one request: no consumer needed, unlike :func:`watermarks`."""
    return _list_offsets(
        admin, topic, partitions, OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED,
        timeout,
    )


def _list_offsets(
    admin: AdminClient, topic: str, partitions: list[int], spec: OffsetSpec,
    level: IsolationLevel, timeout: float,
) -> dict[int, int]:
    futures = admin.list_offsets(
        {TopicPartition(topic, p): spec for p in partitions},
        isolation_level=level, request_timeout=timeout,
    )
    return {tp.partition: int(f.result().offset) for tp, f in futures.items()}


def fence(bootstrap: str, config: Config | None, transactional_id: str) -> None:
    """Fence ``transactional_id``: its current producer's open transaction is aborted and
    its next transactional call fails (Kafka's producer epoch bump)."""
    fencer = producer(bootstrap, config, transactional_id=transactional_id)
    fencer.init_transactions(30)
    fencer.flush(1)

