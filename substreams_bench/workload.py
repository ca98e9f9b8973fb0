"""Workload pieces shared by the benchmarks: many publishers at once, records, clean-up.

Why threads to open and seal publishers: each publisher is a transactional producer whose
``init_transactions`` and commits wait on the broker with the GIL released, so P of them
in threads behave like P producer processes that seal "at the same moment" (a timer firing
everywhere), which is what the paper's latency numbers measure.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from substreams.app import TRACKED, Application, Mechanisms
from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.streams.publisher import Publisher
from substreams_bench.harness import BenchError, body, release_clients

T = TypeVar("T")

_POOL_SIZE = 16


def parallel(items: Sequence[T], call: Callable[[T], Any]) -> None:
    """Run ``call`` on every item in threads; the first exception is re-raised."""
    if len(items) <= 1:
        for item in items:
            call(item)
        return
    with ThreadPoolExecutor(min(_POOL_SIZE, len(items))) as pool:
        for fut in [pool.submit(call, item) for item in items]:
            fut.result()


def open_publishers(
    config: Config,
    stream: str,
    source_ids: Iterable[str],
    bootstrap: str,
    *,
    mechanisms: Mechanisms = TRACKED,
    batch_size: int = 500,
) -> list[Publisher]:
    """Publishers for ``source_ids`` on ``stream``, opened in parallel, in order."""
    app = Application(config, bootstrap, mechanisms)
    ids = list(source_ids)
    out: list[Publisher | None] = [None] * len(ids)
    lock = threading.Lock()

    def make(i: int) -> None:
        pub = app.publisher(stream, ids[i], batch_size=batch_size)
        with lock:
            out[i] = pub

    try:
        parallel(list(range(len(ids))), make)
    except BaseException:
        close_all([p for p in out if p is not None], abort=True)
        raise
    return [p for p in out if p is not None]


def close_all(publishers: Sequence[Publisher], abort: bool = False) -> None:
    """Close publishers in parallel and let their producers go before the broker does (a
    librdkafka client that outlives its broker logs connection errors forever)."""
    parallel(list(publishers), (lambda p: p.abort()) if abort else (lambda p: p.close()))
    release_clients()


def record(ts: int, epoch: int, size: int | None = None) -> dict[str, Any]:
    return {"ts": ts, "batch": epoch, "body": body() if size is None else body(size)}


@contextlib.contextmanager
def acker_process(config: Config, bootstrap: str, timeout: float = 60.0) -> Iterator[int]:
    """Run ``substreams acker run`` as its own process (as deployed: the acker is a service,
    and in a separate process it does not share the GIL with the benchmark's publishers).
    Yields its pid once it has written its first checkpoint; stops it with SIGTERM."""
    from substreams.acker.service import checkpoint_topic
    from substreams.control.io import read_control

    log_path = config.path.with_suffix(".acker.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "substreams",
                "acker",
                "run",
                "-c",
                str(config.path),
                "--bootstrap",
                bootstrap,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        topic = checkpoint_topic(config)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-800:]
                raise BenchError(f"the acker process exited with {proc.returncode}: {tail}")
            with contextlib.suppress(SubstreamsError):
                if read_control(bootstrap, topic, config):
                    break
            if time.monotonic() > deadline:
                raise BenchError(f"the acker process did not start within {timeout:.0f} s")
            time.sleep(0.2)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
