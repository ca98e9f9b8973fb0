"""`substreams submit`: run a Spark job with this package and a substreams config.

It calls the ``spark-submit`` shipped inside the pyspark package (no Spark install needed),
with ``$SUBSTREAMS_CONFIG`` pointing at the config, executors running this interpreter
(local masters) and, for cluster masters, the package zipped into ``--py-files`` so workers
without it installed can import it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from substreams.cli.options import config_option
from substreams.config import load_config
from substreams.errors import SubstreamsError

ENV_CONFIG = "SUBSTREAMS_CONFIG"

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
@click.argument("job", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def command(
    config_path: str,
    master: str,
    conf: tuple[str, ...],
    kafka_connector: bool,
    dry_run: bool,
    job: Path,
    job_args: tuple[str, ...],
) -> None:
    """Run JOB.py with spark-submit; arguments after `--` go to the job."""
    config = load_config(config_path)  # fail here, with file:line, not inside Spark
    env = dict(os.environ)
    env[ENV_CONFIG] = str(config.path)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="substreams-submit-") as tmp:
        zipped = None if master.startswith("local") else package_zip(Path(tmp))
        cmd = build_command(job.resolve(), master, conf, job_args, zipped, kafka_connector)
        if dry_run:
            click.echo(" ".join(cmd))
            return
        try:
            code = subprocess.call(cmd, env=env)
        except KeyboardInterrupt:
            code = 130
    if code != 0:
        raise SystemExit(code)
