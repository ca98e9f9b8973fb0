"""``pip install .`` (a wheel, not an editable install) works: the package with its schemas
(package data) in a fresh venv, run from outside the repository, publishes and reads back
records with the acker tracking them, and its installed ``substreams acker run`` turns the
seal into an epoch notification.

Why the fresh venv borrows the dependencies (a ``.pth`` naming this interpreter's
site-packages) instead of installing them: downloading PySpark and friends would take minutes
and the network; what is under test is our wheel.  The venv's own site-packages comes first
on ``sys.path``, so ``import substreams`` finds the wheel, never the checkout (asserted).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from substreams.control.io import read_control
from substreams.control.messages import EpochComplete, completions
from tests.conftest import ConfigFactory

REPO = Path(__file__).resolve().parents[2]

JOB = textwrap.dedent(
    """
    import json, sys
    from importlib import resources
    from pathlib import Path

    import substreams
    from substreams.app import Application
    from substreams.config import load_config
    from substreams.streams.listener import Listener

    home = Path(substreams.__file__).resolve().parent
    assert Path(sys.prefix).resolve() in home.parents, home  # the wheel, not the checkout
    folder = resources.files("substreams") / "avro"
    schemas = sorted(f.name for f in folder.iterdir() if f.name.endswith(".avsc"))
    config = load_config(sys.argv[1])
    stream, sub = config.streams[0].name, config.substreams[0].name
    with Application(config).publisher(stream, "wheel") as pub:  # acker-tracked
        for i in range(5):
            pub.publish({"user": f"u{i % 2}", "url": "/", "ts": 100 * i}, key=f"u{i % 2}")
        pub.seal(sub, 0)
    with Listener(config, stream) as listener:
        got = [e.payload for e in listener.entries(idle_timeout=1.0) if hasattr(e, "payload")]
    print(json.dumps({"home": str(home), "schemas": schemas, "records": got}))
    """
)


def _env() -> dict[str, str]:
    """The environment without what would point Python at the checkout or the test venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _site_dirs() -> list[str]:
    """This interpreter's site-packages (where the dependencies are installed)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel built from this checkout (``pip wheel .``)."""
    base = tmp_path_factory.mktemp("install")
    # Built from a copy of what the wheel is made of: setuptools writes build/ and
    # *.egg-info next to pyproject.toml, which must not land in the checkout.
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "substreams", source / "substreams", ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = base / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(wheels)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("substreams-*.whl")
    env_dir = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
    ).stdout.strip()
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    # Only now: with this interpreter's packages visible, pip would find the checkout's
    # (editable) substreams of the same version already installed and skip the wheel.
    (Path(site) / "_borrowed_dependencies.pth").write_text("\n".join(_site_dirs()) + "\n")
    return env_dir


def test_the_wheel_runs_a_job_outside_the_repository(
    venv: Path, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    cli = venv / "bin" / "substreams"
    helped = subprocess.run(
        [str(cli), "--help"], cwd=outside, env=_env(), capture_output=True, text=True
    )
    assert helped.returncode == 0 and "submit" in helped.stdout, helped.stderr
    log = tmp_path / "acker.log"
    with log.open("wb") as out:
        acker = subprocess.Popen(
            [str(cli), "acker", "run", "-c", str(config.path)],
            cwd=outside,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        job = subprocess.run(
            [str(venv / "bin" / "python"), "-c", JOB, str(config.path)],
            cwd=outside,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert job.returncode == 0, job.stderr[-3000:]
        result = json.loads(job.stdout.strip().splitlines()[-1])
        assert Path(result["home"]).is_relative_to(venv)
        assert {f"{n}.avsc" for n in ("envelope", "control", "ack", "time")} <= set(
            result["schemas"]
        )
        assert sorted(r["ts"] for r in result["records"]) == [0, 100, 200, 300, 400]
        w = config.substreams[0].name
        topic = config.acker.control_topic(w)
        deadline = time.monotonic() + 60
        notes: list[EpochComplete] = []
        while not notes:
            assert acker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no notification:\n" + log.read_text()[-3000:]
            notes = [
                n
                for _, r in read_control(config.kafka.bootstrap, topic)
                for n in completions(r.body)
                if n.substream == w
            ]
            time.sleep(0.3)
        assert (notes[0].time, notes[0].records) == (0, 5)
    finally:
        if acker.poll() is None:
            os.killpg(acker.pid, signal.SIGTERM)
        acker.wait(30)
