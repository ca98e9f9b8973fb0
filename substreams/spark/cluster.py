"""A Spark standalone cluster on one machine: a master and N workers from the PySpark install.

Why: ``local[n]`` runs every task in the driver's JVM, so it cannot show what a cluster does
to a job (tasks on other JVMs, a worker lost mid-stream, executors re-launched); Docker is not
available here.  PySpark ships ``bin/spark-class`` and the standalone ``Master``/``Worker``
classes, so a real cluster needs nothing but Java 17.

Layout under the cluster's home (``$SUBSTREAMS_HOME/spark-cluster`` for ``substreams
spark-cluster start``, a temporary folder in tests)::

    cluster.json     master port, web UI ports and worker pids (fixed at the first start)
    master.log, worker-<i>.log, worker-<i>/  (each worker's scratch and executor logs)

Invariants:

* The cluster is ready when the master's ``/json`` status lists every started worker ALIVE.
* Executors run this interpreter (``PYSPARK_PYTHON``), so they import the same packages as
  the driver; jobs submitted with ``substreams submit --master spark://...`` get the
  package zip too (``--py-files``) and need nothing installed on the workers.
* Processes run in their own sessions, so a terminal's Ctrl-C does not kill the cluster
  under a job; :meth:`SparkCluster.stop` (or ``substreams spark-cluster stop``) does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from substreams.errors import SubstreamsError
from substreams.kafka.clock import SYSTEM, wait_until
from substreams.kafka.embedded import free_port, pid_alive, substreams_home

log = logging.getLogger(__name__)

STATE_FILE = "cluster.json"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class ClusterError(SubstreamsError):
    """The standalone cluster could not be started, reached or stopped."""


def spark_home() -> Path:
    """PySpark's own folder: it holds ``bin/spark-class`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).parent


def cluster_home(home: Path | None = None) -> Path:
    return (home or substreams_home()) / "spark-cluster"


@dataclass
class ClusterState:
    home: str
    master_port: int
    master_ui_port: int
    worker_ui_ports: list[int]
    cores: int
    memory: str
    master_pid: int | None = None
    worker_pids: dict[str, int] = field(default_factory=dict)
    """Worker index (as a string: JSON keys) -> pid."""

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"


def _alive(pid: int | None) -> bool:
    return pid is not None and pid_alive(pid)


class SparkCluster:
    """One master and ``workers`` workers (``cores`` and ``memory`` each) on 127.0.0.1."""

    def __init__(
        self, home: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
    ) -> None:
        self.home = home
        self.home.mkdir(parents=True, exist_ok=True)
        state = self._read()
        if state is None:
            state = ClusterState(
                str(home), free_port(), free_port(), [free_port() for _ in range(workers)],
                cores, memory,
            )
        self.state = state

    # -- state -------------------------------------------------------------------------------

    def _read(self) -> ClusterState | None:
        path = self.home / STATE_FILE
        if not path.exists():
            return None
        try:
            return ClusterState(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:
            raise ClusterError(f"{path}: not a cluster state file ({exc})") from exc

    def _write(self) -> None:
        tmp = self.home / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self.state), indent=2))
        tmp.replace(self.home / STATE_FILE)

    @property
    def url(self) -> str:
        return self.state.url

    @property
    def workers(self) -> int:
        return len(self.state.worker_ui_ports)

    # -- processes ---------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
            # No daemon scripts: the processes are ours, in the foreground of their sessions.
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def _spawn(self, args: list[str], log_name: str) -> int:
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with (self.home / log_name).open("ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self._env(), start_new_session=True, cwd=self.home,
            )
        return proc.pid

    def start_master(self) -> None:
        if _alive(self.state.master_pid):
            return
        self.state.master_pid = self._spawn(
            [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.state.master_port),
             "--webui-port", str(self.state.master_ui_port)],
            "master.log",
        )
        self._write()
        log.info("spark master starting on %s (pid %d)", self.url, self.state.master_pid)

    def start_worker(self, index: int) -> None:
        """Start worker ``index`` (0-based) unless it runs."""
        if not 0 <= index < self.workers:
            raise ClusterError(f"worker {index}: the cluster has workers 0..{self.workers - 1}")
        if _alive(self.state.worker_pids.get(str(index))):
            return
        work = self.home / f"worker-{index}"
        work.mkdir(exist_ok=True)
        pid = self._spawn(
            [WORKER_CLASS, "--host", "127.0.0.1", "--cores", str(self.state.cores),
             "--memory", self.state.memory, "--webui-port",
             str(self.state.worker_ui_ports[index]), "--work-dir", str(work), self.url],
            f"worker-{index}.log",
        )
        self.state.worker_pids[str(index)] = pid
        self._write()
        log.info("spark worker %d starting (pid %d)", index, pid)

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and the executors it launched (a lost machine)."""
        if not 0 <= index < self.workers:
            raise ClusterError(f"worker {index}: the cluster has workers 0..{self.workers - 1}")
        pid = self.state.worker_pids.get(str(index))
        if pid is None or not _alive(pid):
            raise ClusterError(f"worker {index} is not running")
        os.killpg(pid, signal.SIGKILL)  # its own session: the executors it forked go too
        self._reap(pid, 10)
        log.warning("spark worker %d (pid %d) killed", index, pid)

    def status(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), or None if it does not answer."""
        url = f"http://127.0.0.1:{self.state.master_ui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                data: dict[str, Any] = json.loads(resp.read())
                return data
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        status = self.status()
        if status is None:
            return 0
        return sum(1 for w in status.get("workers", ()) if w.get("state") == "ALIVE")

    def wait_ready(self, workers: int | None = None, timeout: float = 90.0) -> None:
        """Until the master lists ``workers`` (default: all) ALIVE workers."""
        want = self.workers if workers is None else workers
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _alive(self.state.master_pid):
                raise ClusterError(f"the spark master exited; see {self.home / 'master.log'}")
            if self.alive_workers() >= want:
                return
            time.sleep(0.5)
        raise ClusterError(
            f"spark cluster at {self.url}: {self.alive_workers()} of {want} workers alive "
            f"after {timeout:.0f} s; see the logs in {self.home}"
        )

    def start(self, timeout: float = 90.0) -> SparkCluster:
        """Start the master and every worker; return once all are registered."""
        began = time.monotonic()
        self.start_master()
        for i in range(self.workers):
            self.start_worker(i)
        self.wait_ready(timeout=timeout)
        log.info("spark cluster %s ready with %d workers in %.1f s", self.url, self.workers,
                 time.monotonic() - began)
        return self

    def _reap(self, pid: int, timeout: float) -> bool:
        def gone() -> bool:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return not _alive(pid)

        return wait_until(SYSTEM, gone, timeout, 0.1)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop workers, then the master (SIGTERM, then SIGKILL after ``timeout``)."""
        pids = [*self.state.worker_pids.values(), self.state.master_pid]
        for pid in pids:
            if pid is not None and _alive(pid):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGTERM)
        for pid in pids:
            if pid is not None and _alive(pid) and not self._reap(pid, timeout):
                os.killpg(pid, signal.SIGKILL)
                self._reap(pid, 5)
        self.state.master_pid = None
        self.state.worker_pids = {}
        self._write()
        log.info("spark cluster %s stopped", self.url)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
