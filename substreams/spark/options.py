"""The options of the ``substreams`` Spark source, validated once on the driver.

Why the parsed :class:`Config` rides in :class:`SourceOptions` (and so in every pickled
reader) instead of the file's path: a task on another host need not see the file, and the
YAML and ``.avsc`` files are read and validated once, where the query starts.  A job that
already holds its Config passes it as the ``configPickle`` option (:func:`ship_config`:
Spark options are strings), so not even the driver re-reads the file; ``config`` (a path) is
for code that has only the path.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from substreams.config import Config, load_config
from substreams.errors import SubstreamsError
from substreams.kafka import client

Mode = Literal["firm", "soft"]
Read = Literal["python", "notes"]
Starting = Literal["earliest", "latest"]


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise SubstreamsError(f"substreams source: option '{name}' must be true or false, not {raw!r}")


def _positive(options: Mapping[str, str], name: str) -> int | None:
    """An optional option that must be a positive integer (a read limit)."""
    raw = options.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise SubstreamsError(
            f"substreams source: option '{name}' must be a positive integer, not {raw!r}"
        )
    return value


MAX_EPOCHS = "maxEpochsPerTrigger"
MAX_RECORDS = "maxRecordsPerTrigger"


CONFIG_PICKLE = "configPickle"
"""The option carrying a validated :class:`Config` (:func:`ship_config`)."""


def ship_config(config: Config) -> str:
    """``config`` as the value of the :data:`CONFIG_PICKLE` option: pickled, then base64
    (Spark options are strings).  The source unpickles it, so pass only a Config of your
    own job (like everything Spark ships to Python workers, it is trusted code).  Spark
    shows the value redacted in query plans (checked with ``explain``), which matters since
    ``kafka.client`` may hold credentials."""
    return base64.b64encode(pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)).decode()


def _config(options: Mapping[str, str]) -> Config:
    shipped = options.get(CONFIG_PICKLE)
    if shipped:
        try:
            config = pickle.loads(base64.b64decode(shipped))
        except Exception as exc:  # anything unpicklable means "not what ship_config made"
            raise SubstreamsError(
                f"substreams source: option '{CONFIG_PICKLE}' is not a shipped config: {exc}"
            ) from exc
        if not isinstance(config, Config):
            raise SubstreamsError(
                f"substreams source: option '{CONFIG_PICKLE}' holds a {type(config).__name__},"
                " not a Config"
            )
        return config
    path = options.get("config")
    if not path:
        raise SubstreamsError(
            "substreams source: option 'config' (path of substreams.yaml) is required"
        )
    return load_config(path)


@dataclass(frozen=True)
class SourceOptions:
    """Everything a reader needs, as picklable values: the validated config itself travels
    to the tasks, which never read the YAML file."""

    config: Config
    substream: str
    stream: str
    mode: Mode
    bootstrap: str
    control_topic: str
    partitions: int
    starting: Starting = "earliest"
    markers: bool = False
    """Firm mode: also emit one notification row per epoch after its records (so that an
    epoch without records is still seen).  Soft mode always emits them."""
    max_tasks: int = 2
    verify: bool = True
    """Firm mode: fail when an epoch's rows differ in number from its EpochComplete."""
    max_epochs: int | None = None
    """Firm mode: at most this many epochs per micro-batch (``maxEpochsPerTrigger``)."""
    max_records: int | None = None
    """Firm mode: at most this many records per micro-batch (``maxRecordsPerTrigger``),
    except that a batch always takes at least one epoch (see :mod:`substreams.spark.limits`)."""
    arrow: bool = True
    """Firm mode: read tasks yield one Arrow batch per epoch (option ``arrow``, default
    true); false yields a tuple per row, the path before the columnar one (same rows; kept
    to compare the two in ``bench spark`` and as a fallback)."""
    read: Read = "python"
    """Firm mode: ``python`` (option ``read``, the default) reads each epoch's records in
    the read task; ``notes`` yields only the notification rows, each with the epoch's data
    ranges in a ``note`` column, for a caller that reads the records itself (the JVM path
    of :func:`substreams.spark.run`, :mod:`substreams.spark.jvm_read`)."""

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceOptions:
        config = _config(options)
        name = options.get("substream")
        if not name:
            raise SubstreamsError("substreams source: option 'substream' is required")
        sub = config.substream(name)
        stream = config.stream(options.get("stream") or sub.stream)
        mode = options.get("mode") or sub.bound
        if mode not in ("firm", "soft"):
            raise SubstreamsError(
                f"substreams source: option 'mode' must be firm or soft, not {mode!r}"
            )
        starting = options.get("starting", "earliest")
        if starting not in ("earliest", "latest"):
            raise SubstreamsError(
                f"substreams source: option 'starting' must be earliest or latest, not {starting!r}"
            )
        try:
            max_tasks = int(options.get("maxTasks", "2"))
        except ValueError as exc:
            raise SubstreamsError(
                "substreams source: option 'maxTasks' must be an integer"
            ) from exc
        max_epochs = _positive(options, MAX_EPOCHS)
        max_records = _positive(options, MAX_RECORDS)
        if mode == "soft" and (max_epochs is not None or max_records is not None):
            raise SubstreamsError(
                f"substreams source: options '{MAX_EPOCHS}' and '{MAX_RECORDS}' apply to firm "
                "mode only (a soft batch is not made of whole epochs); remove them or use "
                "mode firm"
            )
        read = options.get("read", "python")
        if read not in ("python", "notes") or (read == "notes" and mode != "firm"):
            raise SubstreamsError(
                f"substreams source: option 'read' must be python or notes (firm mode only), "
                f"not {read!r}"
            )
        return SourceOptions(
            config=config,
            substream=sub.name,
            stream=stream.name,
            mode=cast(Mode, mode),
            bootstrap=client.resolve_bootstrap(config, options.get("bootstrap")),
            control_topic=config.acker.control_topic(sub.name),
            partitions=stream.partitions,
            starting=cast(Starting, starting),
            markers=_flag(options, "markers", False),
            max_tasks=max(1, max_tasks),
            verify=_flag(options, "verify", True),
            max_epochs=max_epochs,
            max_records=max_records,
            arrow=_flag(options, "arrow", True),
            read=cast(Read, read),
        )
