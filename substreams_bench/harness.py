"""What every benchmark shares: a broker, throw-away configs, percentiles, and the outputs.

Why one harness: each benchmark measures its baselines in the same run on the same broker,
and reports the same way (a rich table, ``DIR/<name>.json``, ``DIR/<name>.png``), so that
results from different runs and machines can be compared field by field.  Targets are
data, not prose: each carries the measured value, the limit and whether it was met, and
a missed target stays in the table as "no" -- it is never tuned away.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from substreams.config import Config, load_config
from substreams.errors import SubstreamsError
from substreams.kafka import client
from substreams.kafka.embedded import KAFKA_VERSION, KafkaCluster
from substreams.kafka.topics import ensure_topics

# The record every benchmark writes: the epoch number (the substream; called ``batch``
# because the Spark source reserves the column name ``epoch``), an event time (the
# stream's order key) and an opaque body that fixes the record size.
BENCH_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "BenchRecord",
    "namespace": "substreams.bench",
    "fields": [
        {"name": "ts", "type": "long"},
        {"name": "batch", "type": "long"},
        {"name": "body", "type": "string"},
    ],
}
BODY_BYTES = 100

T = TypeVar("T")


class BenchError(SubstreamsError):
    """A benchmark that cannot run (missing integration, broker trouble)."""


# --- statistics ------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values.

    Nearest rank on purpose: p99 of 100 samples is the 99th sample, a value that was
    actually observed, not an interpolation that no run ever produced.
    """
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-int(q * len(ordered)) // 100)))
    return ordered[rank - 1]


def cpu_ticks(stat: str) -> int:
    """utime + stime (fields 14 and 15, every thread included) of a ``/proc/<pid>/stat``
    line, in clock ticks.  The command name (field 2) may hold spaces and parentheses, so
    fields are counted after its last ``)``."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def process_cpu_ticks(pid: int) -> int:
    """CPU clock ticks of process ``pid`` so far (``/proc``: Linux only); 0 when gone."""
    try:
        return cpu_ticks(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0


JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
"""How HotSpot's JIT compiler threads are named in ``/proc/<pid>/task/<tid>/comm`` (15
characters at most)."""


def jit_cpu_ticks(pid: int) -> dict[int, int]:
    """CPU clock ticks so far of each JIT compiler thread of JVM ``pid``, by thread id.

    Why apart: every benchmark configuration starts a fresh broker JVM, whose compilers are
    still compiling Kafka's hot paths while the configuration runs: on this 2-core machine
    they took about half of the broker's CPU over a 300 000-record line, and still ~40 % on
    the fifth such line.  A deployed broker is warm; its compilers are idle."""
    out: dict[int, int] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            if (task / "comm").read_text().strip().startswith(JIT_THREADS):
                out[int(task.name)] = cpu_ticks((task / "stat").read_text())
        except (OSError, ValueError):
            continue  # the thread ended between the listing and the read
    return out


def jit_ticks_between(before: Mapping[int, int], after: Mapping[int, int]) -> int:
    """The compiler threads' ticks from ``before`` to ``after``.  A thread that ended in
    between (HotSpot starts and stops compiler threads on demand) is missed: the JIT share
    is a lower bound, never charged to the rest."""
    return sum(max(0, t - before.get(tid, 0)) for tid, t in after.items())


WARMUP_S = 15.0
"""How long a latency configuration's own workload runs, discarded, before it is timed
(full runs; quick runs warm up for a second).  Why: each configuration gets a fresh broker
JVM (:meth:`BenchContext.reset`), cold: on this machine the seal -> ``EpochComplete`` p50
fell from 26 to 14 ms between its first 150 seals and its seals 300-450 as the broker's JIT
compilers caught up.  A deployed broker is warm."""


def warmup_s(quick: bool) -> float:
    return 1.0 if quick else WARMUP_S


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


# --- results ---------------------------------------------------------------------------


@dataclass
class Target:
    """One acceptance target: ``met`` is None when it could not be measured."""

    name: str
    limit: str
    value: str
    met: bool | None


@dataclass
class Column:
    key: str
    header: str
    fmt: str = "{}"


TXN_RETRIES = Column(
    "txn_retries", "CONCURRENT TRANSACTIONS retries: pub a commit waited for/pub/other"
)
"""The column of :func:`txn_retry_fields`: a transaction coordinator's refusals, each a fixed
~20 ms librdkafka retry; on the seal path only those a publisher's commit waited for."""


def txn_retry_fields(folder: Path) -> dict[str, Any]:
    """Row fields from the counts ``client.counting_txn_retries`` left in ``folder``: the
    publishers' retries a commit waited for (the seal path), all the publishers' retries,
    and everyone else's (the acker's, control writers')."""
    counts = client.txn_retries(folder)
    waits = client.txn_retries(folder, commit_waits=True)
    pub = sum(n for name, n in counts.items() if name.startswith("substreams.pub."))
    pub_waits = sum(n for name, n in waits.items() if name.startswith("substreams.pub."))
    other = sum(counts.values()) - pub
    return {
        "txn_retries": f"{pub_waits}/{pub}/{other}",
        "txn_retries_publishers": pub,
        "txn_retries_publishers_commit_waited": pub_waits,
        "txn_retries_other": other,
        "txn_retries_by_id": dict(sorted(counts.items())),
    }


@dataclass
class BenchResult:
    """Everything one benchmark run produced; ``rows`` are the JSON per configuration."""

    name: str
    quick: bool
    command: str
    broker: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "quick": self.quick,
            "command": self.command,
            "broker": self.broker,
            "commit": code_commit(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
            "duration_s": round(self.duration_s, 2),
            "machine": machine_info(),
            "rows": self.rows,
            "columns": [asdict(c) for c in self.columns],
            "targets": [asdict(t) for t in self.targets],
            "all_targets_met": all(t.met for t in self.targets if t.met is not None),
            "notes": self.notes,
        }


    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BenchResult:
        """A result read back from its ``<name>.json`` (for ``bench report``)."""
        return cls(
            name=doc["name"],
            quick=doc.get("quick", False),
            command=doc.get("command", ""),
            broker=doc.get("broker", ""),
            rows=doc.get("rows", []),
            columns=[Column(**c) for c in doc.get("columns", [])],
            targets=[Target(**t) for t in doc.get("targets", [])],
            notes=doc.get("notes", []),
            duration_s=doc.get("duration_s", 0.0),
        )


def code_commit() -> str | None:
    """The commit of the checkout that ran (``-dirty`` with local changes), so that a result
    names the code it measured; None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_1m": round(load[0], 2),
    }


def render_table(result: BenchResult) -> Table:
    table = Table(title=f"bench {result.name}" + (" (quick)" if result.quick else ""))
    for col in result.columns:
        table.add_column(col.header, justify="right")
    for row in result.rows:
        cells = []
        for col in result.columns:
            value = row.get(col.key)
            if isinstance(value, bool):
                cells.append("yes" if value else "[red]no[/]")
            elif isinstance(value, str):  # a reason in place of a number
                cells.append(value)
            else:
                cells.append("-" if value is None else col.fmt.format(value))
        table.add_row(*cells)
    return table


def render_targets(result: BenchResult) -> Table:
    table = Table(title="targets")
    table.add_column("target", justify="left")
    table.add_column("limit", justify="left")
    table.add_column("measured", justify="left")
    table.add_column("target met", justify="center")
    for t in result.targets:
        met = "n/a" if t.met is None else ("[green]yes[/]" if t.met else "[red]no[/]")
        table.add_row(t.name, t.limit, t.value, met)
    return table


def write_outputs(
    result: BenchResult, out_dir: Path, plot: Callable[[BenchResult, Path], None]
) -> tuple[Path, Path]:
    """Write ``<name>.json`` and ``<name>.png`` into ``out_dir`` (created if missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{result.name}.json"
    png_path = out_dir / f"{result.name}.png"
    json_path.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    plot(result, png_path)
    return json_path, png_path


# --- the run context ---------------------------------------------------------------------


class BenchContext:
    """The broker, a scratch folder for configs, and the progress display of one run."""

    def __init__(
        self,
        bootstrap: str,
        workdir: Path,
        quick: bool,
        console: Console,
        progress: Progress,
        broker: KafkaCluster | None = None,
        broker_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.broker_settings = dict(broker_settings or {})
        """Properties over the embedded broker's defaults (``--broker-setting``), for every
        broker this run starts."""
        self.broker = broker
        """The embedded broker this run started (restarted by :meth:`reset`), else None."""
        self.workdir = workdir
        self.quick = quick
        self.console = console
        self.progress = progress
        self.label = "bench"
        self.grid: list[tuple[int, ...]] | None = None
        """Configurations given on the command line (``--grid``), replacing the defaults."""
        self.mechanism: str | None = None
        """Only this mechanism's lines (``--mechanism``; latency only), else both."""
        self.minutes: float | None = None
        """How long to run (``--minutes``; soak only), else the benchmark's default."""
        self.sample_s: float | None = None
        """Seconds between samples (``--sample-s``; soak only), else the default."""
        self.records: int | None = None
        self.keys: list[int] | None = None
        """bench keyed: the numbers of open sessions to run (``--keys``)."""
        """Records of the backlog (``--records``; spark only), else the benchmark's default."""
        self.part: str | None = None
        """Only this part, ``a`` or ``b`` (``--part``; spark only), else both."""
        self.smoke = False
        """Check the outputs, not the rates (``--smoke``; spark only): fewer JVMs and
        epochs, so that a test can afford the whole run."""
        self._topics: set[str] = set()
        self._schema = workdir / "bench_record.avsc"
        self._schema.write_text(json.dumps(BENCH_SCHEMA))

    def config(
        self,
        streams: Sequence[tuple[str, int]],
        substreams: Sequence[dict[str, Any]] = (),
        stages: Sequence[dict[str, Any]] = (),
        acker: dict[str, Any] | None = None,
    ) -> Config:
        """A fresh config whose every topic name is unique to this call, topics created.

        Fresh topics per configuration keep counts exact: reading a topic back sees only
        this configuration's messages.
        """
        suffix = uuid.uuid4().hex[:8]
        ren = {name: f"b.{name}.{suffix}" for name, _ in streams}
        doc: dict[str, Any] = {
            "kafka": {"bootstrap": self.bootstrap},
            "streams": [
                {
                    "name": ren[name],
                    "schema": self._schema.name,
                    "partitions": parts,
                    "order_key": "ts",
                }
                for name, parts in streams
            ],
            "substreams": [
                {**s, "name": f"{s['name']}.{suffix}", "stream": ren[s["stream"]]}
                for s in substreams
            ],
            "stages": [
                {
                    **s,
                    "name": f"{s['name']}.{suffix}",
                    "input": ren[s["input"]],
                    "output": ren[s["output"]],
                }
                for s in stages
            ],
            "acker": {
                "name": f"bench-acker.{suffix}",
                "acks_topic": f"_b.acks.{suffix}",
                "control_topic_prefix": f"_b.control.{suffix}.",
                "command_topic": f"_b.commands.{suffix}",
                "response_topic": f"_b.responses.{suffix}",
                "dead_letter_topic": f"_b.dlq.{suffix}",
                # a bench's publisher may write its own control records (DIRECT)
                "trusted_writers": ["direct.*"],
                **(acker or {}),
            },
        }
        path = self.workdir / f"bench-{suffix}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        config = load_config(path)
        self.topics(config.topics())
        # the acker creates its own checkpoint topic: <control prefix>__acker.<name>
        self._topics.add(f"{config.acker.control_topic_prefix}__acker.{config.acker.name}")
        return config

    def topics(self, topics: Sequence[tuple[str, int]]) -> None:
        """Create ``topics`` (name, partitions); they are deleted again by :meth:`cleanup`."""
        ensure_topics(client.admin(self.bootstrap), topics)
        self._topics.update(name for name, _ in topics)

    @property
    def broker_label(self) -> str:
        """What ``BenchResult.broker`` records: the address, or that it was embedded."""
        if self.broker is None:
            return self.bootstrap
        return f"embedded Apache Kafka {KAFKA_VERSION}, fresh for every configuration"

    def reset(self) -> None:
        """Give the next configuration a broker no earlier configuration has used.

        Why: no configuration should pay for the log segments, transaction state and
        page cache that earlier ones left (on Tansu that cost was measured: 32x32 seal ->
        EpochComplete p50 21 ms fresh, 37 ms after one more configuration; deleting topics
        did not undo it).  So the embedded Apache Kafka is replaced by a new one in a new
        folder (5-10 s); a broker named with ``--bootstrap`` cannot be, and only loses the
        finished configuration's topics (:meth:`cleanup`).  Callers must have let go of
        their Kafka clients.
        """
        if self.broker is None:
            self.cleanup()
            return
        release_clients()
        self.broker.stop()
        shutil.rmtree(self.broker.home, ignore_errors=True)
        self.broker = KafkaCluster(
            self.workdir / f"kafka-{uuid.uuid4().hex[:8]}",
            self.broker.size,
            settings=self.broker_settings,
        ).start()
        self.bootstrap = self.broker.bootstrap
        self._topics = set()

    def cleanup(self) -> None:
        """Delete the topics of the finished configuration (a best effort: on a shared
        broker, a configuration must not pay for the ones before it)."""
        wanted, self._topics = self._topics, set()
        admin = client.admin(self.bootstrap)
        with contextlib.suppress(Exception):  # best effort: a leftover costs speed only
            existing = set(admin.list_topics(timeout=10).topics)
            doomed = sorted(wanted & existing)
            if doomed:
                for fut in admin.delete_topics(doomed, operation_timeout=30).values():
                    with contextlib.suppress(Exception):
                        fut.result()

    def track(self, items: Sequence[T], describe: Callable[[T], str]) -> Iterator[T]:
        """Yield ``items`` with a progress bar that names the item being run; each item
        after the first starts on a fresh broker (:meth:`reset`)."""
        task_id = self.progress.add_task(self.label, total=len(items))
        try:
            for i, item in enumerate(items):
                if i:
                    self.reset()
                self.progress.update(task_id, description=f"{self.label}: {describe(item)}")
                yield item
                self.progress.advance(task_id)
        finally:
            self.progress.remove_task(task_id)

    def log(self, text: str) -> None:
        self.progress.console.print(text)


def parse_settings(items: tuple[str, ...], option: str = "--broker-setting") -> dict[str, str]:
    """``KEY=VALUE`` option values as a property map; a malformed one is a usage error."""
    settings: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise BenchError(
                f"{option} {item!r}: expected KEY=VALUE, e.g. num.io.threads=8"
            )
        settings[key.strip()] = value.strip()
    return settings


@contextlib.contextmanager
def bench_context(
    quick: bool,
    bootstrap: str | None = None,
    console: Console | None = None,
    *,
    needs_broker: bool = True,
    broker_settings: Mapping[str, str] | None = None,
    nodes: int = 1,
) -> Iterator[BenchContext]:
    """Start the embedded broker (unless ``bootstrap`` or ``$SUBSTREAMS_BOOTSTRAP`` names
    one, or the benchmark needs none) and a scratch folder; everything is cleaned up on
    exit.  ``broker_settings`` and ``nodes`` shape the embedded broker; a named one cannot
    take them (a ``UsageError``)."""
    console = console or Console()
    wanted = bootstrap or os.environ.get(client.ENV_BOOTSTRAP) or (None if needs_broker else "-")
    with contextlib.ExitStack() as stack:
        broker: KafkaCluster | None = None
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ss-bench-")))
        if wanted and wanted != "-" and (broker_settings or nodes != 1):
            raise BenchError(
                f"--broker-setting shapes the embedded broker; {wanted} is not one"
            )
        if wanted:
            server = wanted
        else:
            broker = KafkaCluster(workdir / "kafka", nodes, settings=broker_settings).start()
            server = broker.bootstrap
        holder: list[BenchContext] = []

        def stop_broker() -> None:
            current = holder[0].broker if holder else broker  # reset() replaces it
            if current is not None:
                current.stop()

        # The broker of the last configuration stops last...
        stack.callback(stop_broker)
        # ...after the Kafka clients left for the garbage collector are gone.
        stack.callback(release_clients)
        progress = stack.enter_context(
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
                disable=not console.is_terminal and "PYTEST_CURRENT_TEST" in os.environ,
            )
        )
        ctx = BenchContext(server, workdir, quick, console, progress, broker, broker_settings)
        holder.append(ctx)
        yield ctx


def release_clients() -> None:
    """Collect Kafka clients that are only waiting for the garbage collector: a librdkafka
    client that outlives its broker logs connection errors forever."""
    gc.collect()


def command_line() -> str:
    args = sys.argv[1:]
    return "substreams " + " ".join(args) if args else "substreams bench"


def body(size: int = BODY_BYTES) -> str:
    return "x" * size


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write (110 dpi PNG) and release a matplotlib figure of a benchmark."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def loglog_axes(ax: Any, xlabel: str, ylabel: str, title: str, legend_size: int = 8) -> None:
    """The benchmarks' common panel: log-log scales, labels, a light grid, a legend."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend_size)


def titled(title: str, result: BenchResult) -> str:
    return title + (" (quick)" if result.quick else "")
