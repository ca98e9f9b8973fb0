"""`substreams submit`: run a Spark job with this package and a substreams config.

It calls the ``spark-submit`` shipped inside the pyspark package (no Spark install needed),
with ``$SUBSTREAMS_CONFIG`` pointing at the config, executors running this interpreter
(local masters) and, for cluster masters, the package zipped into ``--py-files`` so workers
without it installed can import it.

The job ends with ``submit`` (issue 43: a killed ``submit`` orphaned a driver that kept
committing).  Why a parent that forwards rather than ``exec``: ``submit`` keeps a temporary
package zip to remove and a failed job's output to summarise, so it stays, and:

- spark-submit runs in a process group of its own (its JVM, the Python driver and Spark's
  Python workers all inherit it); SIGTERM, SIGINT or SIGHUP of ``submit`` is forwarded to
  that group as SIGTERM, and what still runs ``KILL_AFTER_S`` later is SIGKILLed;
- a SIGKILLed ``submit`` cannot forward anything, so the kernel does: spark-submit's JVM
  is started with ``PR_SET_PDEATHSIG`` = SIGKILL (kept across its exec), and the Python
  driver asks for SIGTERM when the JVM dies (:mod:`substreams.spark.lifecycle`); Spark's
  Python workers end when the JVM's pipes close.

Output: the job's stdout passes through; of its stderr only the Python log lines (the
runner's progress, warnings, the job's own logging) reach the terminal, the rest -- the
JVM's log, stack traces -- goes to a log file.  A failed job's first line is its error (the
driver writes it for us: stream, field, value), then where the full log is.  ``--verbose``
passes everything through.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

import click

from substreams.cli.options import config_option
from substreams.config import load_config
from substreams.errors import SubstreamsError
from substreams.spark.lifecycle import (
    ENV_DIE_WITH_PARENT,
    ENV_ERROR_FILE,
    set_parent_death_signal,
)

ENV_CONFIG = "SUBSTREAMS_CONFIG"
KILL_AFTER_S = 15.0
"""How long a forwarded SIGTERM has before the job's process group is SIGKILLed."""
SHOWN = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (?!py4j)"
)
"""A Python log line (the format of :mod:`substreams.spark.log`): shown on the terminal."""

DEFAULT_CONF = {
    # Stopping a query mid-batch overflows the default thread stack in Spark's
    # StreamExecution.isInterruptionException (a recursive regex on the task-kill message).
    "spark.driver.extraJavaOptions": "-Xss16m",
    "spark.ui.showConsoleProgress": "false",
}


def spark_submit_path() -> Path:
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    if not path.exists():
        raise SubstreamsError(f"spark-submit not found in the pyspark package ({path})")
    return path


def package_zip(directory: Path) -> Path:
    """The ``substreams`` package as a zip for ``--py-files``: its modules and package data
    (the ``.avsc`` schemas: zipimport serves them to ``importlib.resources``), without
    bytecode caches (they would be stale or for another interpreter)."""
    root = Path(__file__).resolve().parents[1]
    target = directory / "substreams.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zf.write(path, path.relative_to(root.parent).as_posix())
    return target


def build_command(
    job: Path,
    master: str,
    conf: Sequence[str],
    job_args: Sequence[str],
    py_files: Path | None,
    jvm_read: bool = False,
    progress: Callable[[str], None] = lambda line: click.echo(line, err=True),
) -> list[str]:
    """The spark-submit command line.  ``jvm_read`` adds the connector and ``spark-avro``:
    their cached jars to ``--jars`` (merged with a ``--conf spark.jars=...`` of the user's),
    or, when the user names packages, to ``--packages`` merged with their
    ``--conf spark.jars.packages=...`` (spark-submit would otherwise ignore either setting
    in favour of the option)."""
    cmd = [str(spark_submit_path()), "--master", master, "--name", job.stem]
    settings = dict(DEFAULT_CONF)
    for item in conf:
        if "=" not in item:
            raise SubstreamsError(f"--conf expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        settings[key] = value
    if jvm_read:
        from substreams.spark.connector import JARS, PACKAGES, kafka_connector_conf

        added = kafka_connector_conf(
            settings.pop(PACKAGES, None), progress, settings.pop(JARS, None)
        )
        options = {JARS: "--jars", PACKAGES: "--packages"}
        for key, value in added.items():
            cmd += [options[key], value]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    if py_files is not None:
        cmd += ["--py-files", str(py_files)]
    return [*cmd, str(job), *job_args]


@click.command("submit", context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", help="Extra Spark settings.")
@click.option(
    "--kafka-connector/--no-kafka-connector",
    default=True,
    show_default=True,
    help='Add Spark\'s own Kafka connector (format("kafka")) and spark-avro to --jars, '
    "resolved once per machine (fetched with Maven, needs `mvn`; cached): the JVM read path "
    "of substreams.spark.run needs them.",
)
@click.option("--dry-run", is_flag=True, help="Print the spark-submit command, do not run it.")
@click.option("-v", "--verbose", is_flag=True,
              help="Show the job's whole stderr (Spark's JVM log too); by default only its "
              "Python log lines, the rest going to the log file named on failure.")
@click.argument("job", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def command(
    config_path: str,
    master: str,
    conf: tuple[str, ...],
    kafka_connector: bool,
    dry_run: bool,
    verbose: bool,
    job: Path,
    job_args: tuple[str, ...],
) -> None:
    """Run JOB.py with spark-submit; arguments after `--` go to the job.  The job ends
    with this command (SIGTERM/SIGINT are forwarded to its process group; a SIGKILL of it
    kills the job too); a failed job prints its error first, then where its full log is."""
    config = load_config(config_path)  # fail here, with file:line, not inside Spark
    env = dict(os.environ)
    env[ENV_CONFIG] = str(config.path)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env[ENV_DIE_WITH_PARENT] = str(int(signal.SIGTERM))
    with tempfile.TemporaryDirectory(prefix="substreams-submit-") as tmp:
        zipped = None if master.startswith("local") else package_zip(Path(tmp))
        cmd = build_command(job.resolve(), master, conf, job_args, zipped, kafka_connector)
        if dry_run:
            click.echo(" ".join(cmd))
            return
        error_file = Path(tmp) / "error"
        env[ENV_ERROR_FILE] = str(error_file)
        log_path = _log_path(job)
        code, lines = run_job(cmd, env, log_path, verbose)
        if code != 0:
            error = error_file.read_text().strip() if error_file.exists() else ""
            _fail(code, error, log_path, lines)
    if code != 0:
        raise SystemExit(code)


def _log_path(job: Path) -> Path:
    """Where the job's full output goes: ``$SUBSTREAMS_HOME/logs`` (default
    ``~/.substreams/logs``), one file per run."""
    home = Path(os.environ.get("SUBSTREAMS_HOME", Path.home() / ".substreams"))
    folder = home / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return folder / f"submit-{job.stem}-{stamp}-{os.getpid()}.log"


def _fail(code: int, error: str, log_path: Path, lines: int) -> None:
    """A failed job's summary: its error first (or the last error line of its log)."""
    if not error:
        error = _last_error(log_path) or f"the job exited with code {code}"
    click.secho(f"error: {error}", fg="red", err=True)
    click.echo(f"the job failed (exit code {code}); its full output ({lines} lines): "
               f"{log_path}", err=True)


_ERROR_LINE = re.compile(r"(?:^|\s)([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def _last_error(log_path: Path) -> str:
    """The last ``SomethingError: message`` line of the log (a job that died before it
    could write its error: an import error, a crash in Spark)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    found = ""
    for line in text.splitlines():
        m = _ERROR_LINE.search(line)
        if m and not line.startswith(("\tat ", "    at ")):
            found = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}"
    return found


def _start_group() -> None:
    """In the child, before exec: its own process group, and SIGKILL when ``submit``
    dies (the module doc)."""
    os.setpgid(0, 0)
    set_parent_death_signal(signal.SIGKILL)


def run_job(
    cmd: Sequence[str], env: dict[str, str], log_path: Path, verbose: bool = False
) -> tuple[int, int]:
    """Run ``cmd`` as the job (module doc); its exit code and how many lines it wrote to
    stderr.  Signals to this process end the job's process group."""
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            list(cmd), env=env, stderr=subprocess.PIPE, text=True, errors="replace",
            bufsize=1, preexec_fn=_start_group,  # setpgid + prctl only
        )
        assert proc.stderr is not None
        counted = [0]
        reader = threading.Thread(
            target=_copy_stderr, args=(proc.stderr, log, verbose, counted), daemon=True
        )
        reader.start()
        stopping: list[float] = []

        def forward(signum: int, frame: FrameType | None) -> None:
            if not stopping:
                stopping.append(time.monotonic())
                click.echo(f"submit: signal {signal.Signals(signum).name}: stopping the job "
                           f"(SIGKILL in {KILL_AFTER_S:.0f} s)", err=True)
            _signal_group(proc.pid, signal.SIGTERM)

        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        old = {s: signal.signal(s, forward) for s in handled} if _main_thread() else {}
        try:
            while True:
                try:
                    code = proc.wait(0.2)
                    break
                except subprocess.TimeoutExpired:
                    if stopping and time.monotonic() - stopping[0] > KILL_AFTER_S:
                        _signal_group(proc.pid, signal.SIGKILL)
        finally:
            _signal_group(proc.pid, signal.SIGKILL)  # whatever of the job is left
            for s, h in old.items():
                signal.signal(s, h)
            reader.join(5)
    return code, counted[0]


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _copy_stderr(stream: IO[str], log: IO[str], verbose: bool, counted: list[int]) -> None:
    """Every line to the log file; Python log lines (or all, ``verbose``) to stderr."""
    for line in stream:
        counted[0] += 1
        log.write(line)
        log.flush()
        if verbose or SHOWN.match(line):
            sys.stderr.write(line)
            sys.stderr.flush()
