"""Java and Maven: the two programs the embedded Apache Kafka and Spark's Kafka connector need.

Why Maven and not a download of Kafka's tarball: these machines reach Maven Central (and not
downloads.apache.org), and ``mvn`` resolves a jar together with everything it depends on
into a folder, checks the checksums and caches what it fetched in ``~/.m2``.

Invariants:

* A resolved folder is complete or absent: jars are copied into a temporary sibling and the
  folder is renamed into place only after ``mvn`` succeeded, so a run cut short (Ctrl-C,
  a lost network) never leaves half a classpath that a later start would trust.
* Two processes resolving the same folder at once (the test session and a benchmark) wait
  for each other on a lock file instead of racing on the rename.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from substreams.errors import BrokerError

log = logging.getLogger(__name__)

JAVA_MIN = 17

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cache_home() -> Path:
    """Where resolved jars live: ``$SUBSTREAMS_CACHE`` or ``~/.cache/substreams`` -- outside
    the repository and outside ``$SUBSTREAMS_HOME`` (a test's home is thrown away; the 40 MB
    of Kafka jars should not be fetched again for every test session)."""
    return Path(os.environ.get("SUBSTREAMS_CACHE", Path.home() / ".cache" / "substreams"))


def java() -> str:
    """The ``java`` to run (``$JAVA_HOME/bin/java`` first), checked to be Java 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    exe = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not exe or not Path(exe).exists():
        raise BrokerError(
            "Java 17 or newer is needed to run Apache Kafka and Spark and none was found; "
            "install it (Debian: `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME"
        )
    out = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=30)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0_x" style
        major = int(match.group(2))
    if major < JAVA_MIN:
        raise BrokerError(
            f"{exe} is Java {major or '?'}; Apache Kafka 4 needs Java {JAVA_MIN} or newer "
            "(Debian: `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME)"
        )
    return exe


def mvn() -> str:
    exe = shutil.which("mvn")
    if exe is None:
        raise BrokerError(
            "Maven (`mvn`) is needed once to fetch Apache Kafka's jars and none was found; "
            "install it (Debian: `apt-get install maven`)"
        )
    return exe


def _pom(dependencies: Sequence[str]) -> str:
    deps = []
    for coords in dependencies:
        group, artifact, version = coords.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>substreams</groupId><artifactId>resolve</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>"
    )


def _run_mvn(args: list[str], cwd: Path, what: str, progress: Progress) -> None:
    """Run ``mvn -B`` and pass one line per fetched artifact to ``progress``."""
    cmd = [mvn(), "-B", "--no-transfer-progress", *args]
    log.info("resolving %s: %s", what, " ".join(cmd))
    progress(f"resolving {what} with Maven (once; cached afterwards) ...")
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    tail: list[str] = []
    copied = 0
    for line in proc.stdout:
        tail = [*tail[-30:], line.rstrip()]
        if "Copying " in line:
            copied += 1
            if copied % 10 == 0:
                progress(f"  {copied} jars ...")
    if proc.wait() != 0:
        detail = "\n".join(t for t in tail if "ERROR" in t) or "\n".join(tail[-10:])
        raise BrokerError(f"Maven could not resolve {what}:\n{detail}")


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Held by one process at a time (an exclusive ``flock`` on ``path``, created): what
    builds a folder of the shared cache waits here instead of racing on its rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def resolve_classpath(
    name: str, dependencies: Sequence[str], progress: Progress = stderr_progress
) -> Path:
    """A folder holding ``dependencies`` (``group:artifact:version``) and their runtime
    dependencies, resolved once into ``cache_home()/name``."""
    dest = cache_home() / name
    if dest.is_dir():
        return dest
    with file_lock(dest.parent / f".{name}.lock"):
        if dest.is_dir():  # another process finished while we waited
            return dest
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{name}-") as tmp:
            work = Path(tmp)
            (work / "pom.xml").write_text(_pom(dependencies))
            _run_mvn(
                [
                    "dependency:copy-dependencies",
                    "-DincludeScope=runtime",
                    f"-DoutputDirectory={work / 'libs'}",
                ],
                work,
                name,
                progress,
            )
            (work / "libs").rename(dest)
    progress(f"resolved {name} into {dest}")
    return dest


def fetch_artifact(coords: str, progress: Progress = stderr_progress) -> None:
    """Make sure ``group:artifact:version`` and its dependencies are in ``~/.m2`` (where
    Spark's Ivy resolution of ``spark.jars.packages`` looks first)."""
    group, artifact, version = coords.split(":")
    local = Path.home() / ".m2" / "repository" / group.replace(".", "/") / artifact / version
    if (local / f"{artifact}-{version}.jar").exists():
        return
    with tempfile.TemporaryDirectory(prefix="substreams-mvn-") as tmp:
        # The plugin version is pinned: Maven 3.8's default maven-dependency-plugin (2.8)
        # also resolves the artifact's test-scoped dependencies (for Spark's Kafka
        # connector: Kafka, ZooKeeper, Mockito, test jars that are not served -> failure).
        _run_mvn(
            [
                "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:get",
                f"-Dartifact={coords}",
                "-Dtransitive=true",
            ],
            Path(tmp),
            coords,
            progress,
        )
