"""`substreams submit` is its job's parent: no process of the job outlives a SIGTERM or
a SIGKILL of it, and a failed job's first line is the user's error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ConfigFactory
from tests.spark import submit_job
from tests.spark.jobs import ROOT

pytestmark = pytest.mark.spark

JOB = Path(submit_job.__file__)


def submit(config_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "substreams", "submit", "-c", str(config_path),
            "--master", "local[1]", "--no-kafka-connector",
            "--conf", "spark.ui.enabled=false", str(JOB), *args]


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_no_job_process_outlives_submit(
    how: signal.Signals, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config([{"name": "clicks", "partitions": 1}], create=False)
    pids = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(submit(config.path, "hold", str(pids)), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not pids.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
        driver, jvm, pgid = map(int, pids.read_text().split())
        assert pgid != os.getpgid(proc.pid)  # the job runs in a group of its own
        assert alive(driver) and alive(jvm) and len(group_members(pgid)) >= 2
        os.kill(proc.pid, how)
        deadline = time.monotonic() + 60
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert group_members(pgid) == [], f"survivors after {how.name}: {group_members(pgid)}"
        assert not alive(driver) and not alive(jvm)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if pids.exists():
            for pid in group_members(int(pids.read_text().split()[2])):
                os.kill(pid, signal.SIGKILL)


def test_a_failed_jobs_first_line_is_the_users_error(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config([{"name": "clicks", "partitions": 1}], create=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable,
           "SUBSTREAMS_HOME": str(tmp_path / "home")}
    done = subprocess.run(submit(config.path, "fail"), env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    assert lines[0] == f"error: {submit_job.ERROR}", done.stderr[-3000:]
    assert lines[1].startswith("the job failed (exit code 1); its full output (")
    log = Path(lines[1].rsplit(": ", 1)[1])
    full = log.read_text()
    assert "Traceback" in full and len(full.splitlines()) > 20  # kept, not shown
    assert len(lines) == 2
