"""The embedded Apache Kafka: one or three KRaft nodes (combined broker + controller) on
127.0.0.1, run from Maven-resolved jars with the machine's Java 17.

Why this and not a download or Docker: these machines reach Maven Central but neither
downloads.apache.org nor a Docker engine; ``kafka_2.13`` plus the SLF4J->Log4j2 binding (which
the distribution adds and the POM does not; without it the broker logs nothing) is the whole
broker.  The jars are resolved once into ``jvm.cache_home()``.

Layout under the cluster's home (``$SUBSTREAMS_HOME/kafka-<n>`` for ``broker start``, a
temporary folder for tests)::

    cluster.json            cluster id, node ids and ports (fixed at the first start: the
                            controller quorum is addressed by them)
    node-<id>/server.properties, data/ (the log dirs), logs/server.log, pid

Invariants:

* Data lives on disk: stopping and starting a cluster (or one node) keeps every topic and
  offset.  A node's storage is formatted exactly once (``data/meta.properties`` marks it).
* Every node of a cluster has the same cluster id and the same ``controller.quorum.voters``;
  a cluster is ready when each node's PLAINTEXT port answers and the cluster metadata lists
  every node (a 3-node cluster waits for a quorum majority before any node serves).
* Nodes run in their own session, so a terminal's Ctrl-C reaches our process (which then
  stops its clients before the broker), not the broker first.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from confluent_kafka.admin import AdminClient

from substreams import jvm
from substreams.config.model import SecurityConfig
from substreams.errors import BrokerError
from substreams.kafka import security, tls
from substreams.kafka.clock import Deadline

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
KAFKA_ARTIFACTS = (
    f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
    # kafka_2.13 4.1 depends on slf4j-api 1.7, whose Log4j2 binding is log4j-slf4j-impl.
    "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3",
)
STATE_FILE = "broker.json"

# Heap per node: the broker's own guidance is 1-6 GB for production; on a 2-core machine the
# page cache does the work and 1 GB (768 MB each for three nodes) leaves room for Spark.
HEAP = {1: "1g", 3: "768m"}
QUORUM_LOST_GRACE_S = 3.0
"""How long :meth:`KafkaCluster.stop` lets nodes run on once a majority has exited."""
JVM_OPTS = [
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]

LOG4J2 = """\
status = warn
appender.f.type = RollingFile
appender.f.name = F
appender.f.fileName = ${sys:kafka.logs.dir}/server.log
appender.f.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.f.layout.type = PatternLayout
appender.f.layout.pattern = [%d] %p %m (%c)%n
appender.f.policies.type = Policies
appender.f.policies.size.type = SizeBasedTriggeringPolicy
appender.f.policies.size.size = 50MB
appender.f.strategy.type = DefaultRolloverStrategy
appender.f.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.f.ref = F
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def substreams_home() -> Path:
    """Folder for the embedded broker's data, state and logs (``$SUBSTREAMS_HOME`` or
    ~/.substreams)."""
    return Path(os.environ.get("SUBSTREAMS_HOME", Path.home() / ".substreams"))


def kafka_classpath(progress: jvm.Progress | None = None) -> str:
    """The ``-cp`` value for Apache Kafka, resolving the jars on first use."""
    libs = jvm.resolve_classpath(
        f"kafka-{KAFKA_VERSION}", KAFKA_ARTIFACTS, progress or jvm.stderr_progress
    )
    return str(libs / "*")


def cluster_settings(nodes: int) -> dict[str, str]:
    """Broker settings common to every node, from ``cluster.env`` (the file docker-compose.yml
    reads too); a single node cannot replicate, so ``nodes=1`` brings every factor to 1."""
    text = resources.files("substreams.kafka").joinpath("cluster.env").read_text()
    settings: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        settings[key.removeprefix("KAFKA_").lower().replace("_", ".")] = value
    if nodes == 1:
        for key in settings:
            if key.endswith(("replication.factor", "min.isr")) or key == "min.insync.replicas":
                settings[key] = "1"
    return settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    """True when nothing listens on ``port`` (SO_REUSEADDR as the JVM sets it, so that
    connections of a stopped node lingering in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def broker_answers(
    bootstrap: str, timeout: float = 1.0, sec: SecurityConfig | None = None
) -> bool:
    """True when a Kafka Metadata request to ``bootstrap`` succeeds."""
    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "log_level": 0, **security.rdkafka_settings(sec)}
    )
    try:
        admin.list_topics(timeout=timeout)
        return True
    except Exception:
        return False


def _live_node_ids(
    bootstrap: str, timeout: float = 2.0, sec: SecurityConfig | None = None
) -> set[int]:
    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "log_level": 0, **security.rdkafka_settings(sec)}
    )
    try:
        meta = admin.list_topics(timeout=timeout)
    except Exception:
        return set()
    return {int(b) for b in meta.brokers}


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie child counts as dead)."""
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


@dataclass(frozen=True)
class Node:
    """One KRaft node's fixed identity: its id and the two ports it listens on."""

    node_id: int
    port: int
    controller_port: int


class KafkaCluster:
    """One or three Apache Kafka nodes sharing ``home``; a context manager for tests."""

    def __init__(
        self,
        home: Path,
        nodes: int = 1,
        port: int | None = None,
        progress: jvm.Progress | None = None,
        settings: Mapping[str, str] | None = None,
        secure: bool = False,
    ) -> None:
        """``settings``: broker properties over ``cluster.env``'s (the benchmarks measure
        what a setting moves; nothing else passes any).  ``secure``: clients reach the
        brokers over SASL_SSL only (SCRAM-SHA-512, a throwaway CA: :mod:`tls`), and the
        ``StandardAuthorizer`` refuses what no ACL allows (:meth:`_secure_properties`)."""
        if nodes not in (1, 3):
            raise BrokerError(f"--nodes must be 1 or 3, not {nodes}")
        self.home = home
        self.size = nodes
        self._first_port = port
        self._progress = progress or jvm.stderr_progress
        self._settings = dict(settings or {})
        self.secure = secure
        self.credentials: tls.Credentials | None = None
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self.nodes: list[Node] = []
        self.cluster_id = ""

    # --- layout ------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def node(self, node_id: int) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        ids = ", ".join(str(n.node_id) for n in self.nodes)
        raise BrokerError(f"no node {node_id} in this cluster (nodes: {ids})")

    def node_dir(self, node_id: int) -> Path:
        return self.home / f"node-{node_id}"

    def log_path(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "logs" / "server.log"

    def _load_or_plan(self) -> None:
        """Read ``cluster.json``, or choose the cluster id and ports of a new cluster."""
        meta = self.home / "cluster.json"
        if meta.exists():
            data = json.loads(meta.read_text())
            self.cluster_id = data["cluster_id"]
            self.nodes = [Node(**n) for n in data["nodes"]]
            if len(self.nodes) != self.size:
                raise BrokerError(
                    f"{self.home} holds a {len(self.nodes)}-node cluster, not {self.size} nodes"
                )
            if bool(data.get("secure", False)) != self.secure:
                was = "a secured" if data.get("secure") else "a plaintext"
                raise BrokerError(
                    f"{self.home} holds {was} cluster; remove it to start the other kind"
                )
            return
        self.home.mkdir(parents=True, exist_ok=True)
        # Kafka's cluster ids are 16 random bytes in URL-safe base64 without padding.
        self.cluster_id = urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        ports: list[int] = []
        for i in range(2 * self.size):
            wanted = self._first_port + i if self._first_port and i < self.size else None
            if wanted is not None and not _port_free(wanted):
                raise BrokerError(f"port {wanted} is in use; choose another --port")
            p = wanted or free_port()
            while p in ports:
                p = free_port()
            ports.append(p)
        self.nodes = [
            Node(node_id=i + 1, port=ports[i], controller_port=ports[self.size + i])
            for i in range(self.size)
        ]
        meta.write_text(
            json.dumps(
                {
                    "cluster_id": self.cluster_id,
                    "kafka_version": KAFKA_VERSION,
                    "secure": self.secure,
                    "nodes": [asdict(n) for n in self.nodes],
                },
                indent=2,
            )
        )

    def _properties(self, node: Node) -> dict[str, str]:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        client = "SASL_SSL" if self.secure else "PLAINTEXT"
        return {
            **cluster_settings(self.size),
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{client}://127.0.0.1:{node.port},"
            f"CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"{client}://127.0.0.1:{node.port}",
            "log.dirs": str(self.node_dir(node.node_id) / "data"),
            **(self._secure_properties() if self.secure else {}),
            **self._settings,
        }

    def _secure_properties(self) -> dict[str, str]:
        """Clients and brokers talk SASL_SSL with SCRAM-SHA-512; the controller listener
        (127.0.0.1 only, brokers and controllers among themselves) SASL_PLAINTEXT with PLAIN
        -- KRaft controllers cannot use SCRAM, whose credentials live in the metadata they
        serve.  Every request needs an ACL except the super user's (``admin``: the brokers,
        the controllers, the operator)."""
        creds = self._creds()
        admin, secret = tls.ADMIN, creds.admin_password()
        store = creds.store_password()
        return {
            "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                f'{security.SCRAM_MODULE} required username="{admin}" password="{secret}";',
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config":
                f'{security.PLAIN_MODULE} required username="{admin}" password="{secret}" '
                f'user_{admin}="{secret}";',
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(creds.keystore),
            "ssl.keystore.password": store,
            "ssl.key.password": store,
            "ssl.truststore.type": "PEM",  # a broker is a client of the others
            "ssl.truststore.location": str(creds.ca_pem),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{admin}",
        }

    def add_user(self, name: str, password: str) -> None:
        """Create (or change the password of) SCRAM-SHA-512 user ``name``, as the super user;
        what ``kafka-configs --alter --add-config SCRAM-SHA-512=...`` does."""
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0,
                             **security.rdkafka_settings(self.admin_security)})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        futures = admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(name, info, password.encode())]
        )
        for future in futures.values():
            future.result(30)

    def _creds(self) -> tls.Credentials:
        if self.credentials is None:
            self.credentials = tls.ensure_credentials(self.home)
        return self.credentials

    @property
    def admin_security(self) -> SecurityConfig | None:
        """The super user's ``kafka.security`` block (None for a PLAINTEXT cluster): what
        ``broker start --secure`` prints and the readiness check uses."""
        if not self.secure:
            return None
        creds = self._creds()
        return SecurityConfig(
            protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", username=tls.ADMIN,
            password_file=str(creds.admin_password_file), ca_file=str(creds.ca_pem),
        )

    def prepare(self) -> None:
        """Write each node's files and format the storage of those never formatted."""
        self._load_or_plan()
        classpath = kafka_classpath(self._progress)
        formats: list[tuple[int, subprocess.Popen[bytes]]] = []
        for node in self.nodes:
            d = self.node_dir(node.node_id)
            (d / "logs").mkdir(parents=True, exist_ok=True)
            props = self._properties(node)
            path = d / "server.properties"
            if self.secure:  # it holds the super user's and the keystore's passwords
                path.touch(mode=0o600)
                path.chmod(0o600)
            path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            (d / "log4j2.properties").write_text(LOG4J2)
            if not (d / "data" / "meta.properties").exists():
                # With static controller.quorum.voters, `format` takes no quorum flag.
                cmd = [
                    jvm.java(),
                    "-cp",
                    classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={self.cluster_id}",
                    "-c",
                    str(d / "server.properties"),
                ]
                if self.secure:  # the super user exists before any broker logs in as it
                    secret = self._creds().admin_password()
                    cmd += ["--add-scram", f"SCRAM-SHA-512=[name={tls.ADMIN},password={secret}]"]
                formats.append(
                    (
                        node.node_id,
                        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
                    )
                )
        for node_id, proc in formats:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise BrokerError(
                    f"formatting the storage of node {node_id} failed: "
                    f"{out.decode(errors='replace').strip()[-500:]}"
                )

    # --- processes -----------------------------------------------------------------------

    def pid(self, node_id: int) -> int | None:
        """The node's process id if it runs (from its pid file: works across processes)."""
        try:
            pid = int((self.node_dir(node_id) / "pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def start_node(self, node_id: int) -> None:
        """Start one node (no wait); a node already running is left alone."""
        node = self.node(node_id)
        if self.pid(node_id) is not None:
            return
        for port in (node.port, node.controller_port):
            if not _port_free(port):
                raise BrokerError(
                    f"port {port} of node {node_id} is taken by another program; "
                    f"stop it or remove {self.home} to start a new cluster on other ports"
                )
        d = self.node_dir(node_id)
        cmd = [
            jvm.java(),
            f"-Xms{HEAP[self.size]}",
            f"-Xmx{HEAP[self.size]}",
            *JVM_OPTS,
            f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={d / 'logs'}",
            "-cp",
            kafka_classpath(self._progress),
            "kafka.Kafka",
            str(d / "server.properties"),
        ]
        with open(d / "logs" / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._procs[node_id] = proc
        (d / "pid").write_text(str(proc.pid))
        log.info("kafka node %d starting (pid %d, port %d)", node_id, proc.pid, node.port)

    def wait_ready(self, node_ids: list[int] | None = None, timeout: float = 90.0) -> None:
        """Wait until each of ``node_ids`` (default: all) serves and is in the cluster
        metadata; a node that exits meanwhile is an error naming its log."""
        wanted = set(node_ids or [n.node_id for n in self.nodes])
        deadline = Deadline(timeout)
        while True:
            for node_id in wanted:
                if self.pid(node_id) is None:
                    raise BrokerError(
                        f"Kafka node {node_id} exited at start; see {self.log_path(node_id)}"
                    )
            live = set()
            for node_id in wanted:
                live |= _live_node_ids(
                    f"127.0.0.1:{self.node(node_id).port}", 1.0, self.admin_security
                )
            if wanted <= live:
                return
            if deadline.passed:
                raise BrokerError(
                    f"Kafka nodes {sorted(wanted - live)} did not serve within {timeout:.0f} s; "
                    f"see {self.home}/node-*/logs/server.log"
                )
            time.sleep(0.2)

    def start(self, timeout: float = 90.0) -> KafkaCluster:
        t0 = time.monotonic()
        self.prepare()
        for node in self.nodes:
            self.start_node(node.node_id)
        self.wait_ready(timeout=timeout)
        log.info("kafka cluster ready on %s in %.1f s", self.bootstrap, time.monotonic() - t0)
        return self

    def kill(self, node_id: int) -> None:
        """SIGKILL one node: what a crashed machine looks like to the rest of the cluster."""
        pid = self.pid(node_id)
        if pid is None:
            raise BrokerError(f"Kafka node {node_id} is not running")
        os.kill(pid, signal.SIGKILL)
        self._reap(node_id, pid, 10.0)

    def _reap(self, node_id: int, pid: int, timeout: float) -> bool:
        proc = self._procs.get(node_id)
        deadline = Deadline(timeout)
        while True:  # the deadline after a look: a process already gone is reaped at once
            if proc is not None and proc.pid == pid:
                try:
                    proc.wait(0.05)
                except subprocess.TimeoutExpired:
                    pass
                else:
                    del self._procs[node_id]
                    return True
            elif not pid_alive(pid):
                return True
            else:
                time.sleep(0.05)
            if deadline.passed:
                return False

    def stop(self, timeout: float = 30.0, quorum_lost_grace: float = QUORUM_LOST_GRACE_S) -> None:
        """SIGTERM every node at once (a controlled shutdown of one waits on the others),
        SIGKILL what still runs after ``timeout``.  Once a majority of the nodes has exited,
        the others get ``quorum_lost_grace`` more at most: a KRaft node's controlled shutdown
        needs the controller quorum, so the last node of a cluster stopping as a whole logs
        "Did not receive fetch request from the majority of the voters" and would wait out
        the whole ``timeout`` (30 s of every 3-node teardown).  Its data is on disk either way;
        the next start recovers the unflushed log tail as after any crash."""
        pending = {
            n.node_id: pid for n in self.nodes if (pid := self.pid(n.node_id)) is not None
        }
        for pid in pending.values():
            os.kill(pid, signal.SIGTERM)
        majority = len(self.nodes) // 2 + 1
        deadline = Deadline(timeout)
        quorum_lost = False
        while pending and not deadline.passed:
            for node_id, pid in list(pending.items()):
                if self._reap(node_id, pid, 0.05):
                    del pending[node_id]
            if not quorum_lost and pending and len(self.nodes) - len(pending) >= majority:
                quorum_lost = True
                deadline.shorten(quorum_lost_grace)
        for node_id, pid in pending.items():
            log.info("kafka node %d did not stop within its grace: SIGKILL", node_id)
            os.kill(pid, signal.SIGKILL)
            self._reap(node_id, pid, 10.0)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the recorded, detached cluster used by `substreams broker ...` ----------------------


@dataclass(frozen=True)
class BrokerState:
    """What `broker start` records so that later commands can find (and stop) the cluster."""

    home: str
    nodes: int
    bootstrap: str
    started_at: float
    secure: bool = False

    def cluster(self, progress: jvm.Progress | None = None) -> KafkaCluster:
        c = KafkaCluster(Path(self.home), self.nodes, progress=progress, secure=self.secure)
        c._load_or_plan()
        return c


def cluster_home(nodes: int, home: Path | None = None, secure: bool = False) -> Path:
    return (home or substreams_home()) / (f"kafka-{nodes}" + ("-secure" if secure else ""))


def read_state(home: Path | None = None) -> BrokerState | None:
    """The recorded cluster if any of its nodes still runs, else None (a stale file goes)."""
    path = (home or substreams_home()) / STATE_FILE
    try:
        state = BrokerState(**json.loads(path.read_text()))
        cluster = state.cluster()
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if all(cluster.pid(n.node_id) is None for n in cluster.nodes):
        path.unlink(missing_ok=True)
        return None
    return state


def start_recorded(
    port: int | None = None,
    nodes: int = 1,
    home: Path | None = None,
    progress: Callable[[str], None] | None = None,
    secure: bool = False,
) -> tuple[BrokerState, bool]:
    """Start a detached cluster and record it; returns (state, started_now)."""
    home = home or substreams_home()
    existing = read_state(home)
    if existing is not None:
        if existing.nodes != nodes or existing.secure != secure:
            kind = "secured " if existing.secure else ""
            raise BrokerError(
                f"a {existing.nodes}-node {kind}cluster already runs on {existing.bootstrap}; "
                "`substreams broker stop` it first"
            )
        return existing, False
    cluster = KafkaCluster(
        cluster_home(nodes, home, secure), nodes, port=port, progress=progress, secure=secure
    )
    cluster.start()
    state = BrokerState(
        home=str(cluster.home), nodes=nodes, bootstrap=cluster.bootstrap, started_at=time.time(),
        secure=secure,
    )
    (home / STATE_FILE).write_text(json.dumps(asdict(state)))
    return state, True


def stop_recorded(home: Path | None = None, timeout: float = 30.0) -> BrokerState | None:
    """Stop the recorded cluster (its data stays on disk); None when none ran."""
    home = home or substreams_home()
    state = read_state(home)
    if state is None:
        return None
    state.cluster().stop(timeout)
    (home / STATE_FILE).unlink(missing_ok=True)
    return state
