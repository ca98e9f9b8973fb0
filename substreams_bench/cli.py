"""`substreams bench <traffic|latency|throughput|spark|acker|soak|recovery|framing|keyed> [--quick]
[--out DIR]` and `substreams bench report [--out DIR] [--page FILE]`.

Each benchmark runs its baselines in the same run on the same broker (an embedded one
unless ``--bootstrap``/``$SUBSTREAMS_BOOTSTRAP`` names another), prints a table with a
"target met" column, and writes ``DIR/<name>.json`` and ``DIR/<name>.png``; ``report``
rebuilds the tables and plots of the results page from those JSON files.

The core package finds this command through the ``substreams.commands`` entry point and
never imports it; importing it without the ``bench`` extra raises the ImportError the core
shows as its one-line "how to get it".
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
import time
from pathlib import Path

if importlib.util.find_spec("matplotlib") is None:
    raise ImportError(
        "the benchmarks need the 'bench' extra: pip install 'substreams[bench]' "
        "(from a clone: pip install -e '.[bench]', or ./run bench)"
    )

import click
from rich.console import Console

from substreams.cli.options import bootstrap_option
from substreams_bench.harness import (
    BenchError,
    bench_context,
    parse_settings,
    render_table,
    render_targets,
    write_outputs,
)

BENCHES = (
    "traffic", "latency", "throughput", "spark", "acker", "recovery", "soak", "framing",
    "keyed", "foreign",
)


@click.command("bench")
@click.argument("name", type=click.Choice((*BENCHES, "report")))
@click.option(
    "--quick", is_flag=True, help="CI-sized run (under two minutes); still runs 32x32 traffic."
)
@click.option(
    "--out",
    "out_dir",
    default="bench/results",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for <name>.json and <name>.png (report: where it reads them).",
)
@click.option(
    "--page",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="report only: replace this page's marked sections (bench/README.md) instead of "
    "printing the tables.",
)
@click.option(
    "--grid",
    "grid",
    multiple=True,
    metavar="PxQxSxK|PxQ",
    help="traffic: run these configurations (producers x partitions x stages x substreams) "
    "instead of the built-in grid; latency: these producers x partitions (each granularity; "
    "no seal-policy lines); repeatable.",
)
@click.option(
    "--mechanism",
    type=click.Choice(["acker", "punctuations"]),
    default=None,
    help="latency, throughput: run this mechanism's lines only (default: both; throughput's "
    "baselines always run).",
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=0.1),
    default=None,
    help="soak only: how long the sustained workload runs (default 30; 1 with --quick).",
)
@click.option(
    "--sample-s",
    "sample_s",
    type=click.FloatRange(min=1.0),
    default=None,
    help="soak only: seconds between samples (default 30; 5 with --quick).",
)
@click.option(
    "--records",
    type=click.IntRange(min=500),
    default=None,
    help="spark only: records of part (a)'s backlog, a multiple of 500 (default 5,000,000; "
    "20,000 with --quick).",
)
@click.option(
    "--part",
    type=click.Choice(["a", "b"]),
    default=None,
    help="spark only: run part (a) (backlog throughput) or part (b) (seal -> operator "
    "latency) alone (default: both).",
)
@click.option(
    "--smoke",
    is_flag=True,
    help="spark only, implies --quick: check that every query runs and every output is "
    "written, not the rates: part (a)'s queries one after another in one child JVM, part (b) "
    "with 2 epochs, one measured (the test suite's run).",
)
@click.option(
    "--keys",
    "keys",
    default=None,
    metavar="K[,K...]",
    help="keyed only: the numbers of open sessions to run (default 1000,10000,100000; "
    "1000,5000 with --quick), e.g. --keys 1000000.",
)
@click.option(
    "--broker-setting",
    "broker_setting",
    multiple=True,
    metavar="KEY=VALUE",
    help="A property over the embedded broker's defaults (server.properties form, e.g. "
    "num.io.threads=8), for every broker the run starts; repeatable.",
)
@bootstrap_option
def command(
    name: str,
    quick: bool,
    out_dir: Path,
    grid: tuple[str, ...],
    mechanism: str | None,
    minutes: float | None,
    sample_s: float | None,
    records: int | None,
    part: str | None,
    smoke: bool,
    keys: str | None,
    page: Path | None,
    broker_setting: tuple[str, ...],
    bootstrap: str | None,
) -> None:
    """Run one benchmark and write its JSON result and PNG plot; or, with NAME ``report``,
    rebuild the results page's tables and plots from the JSON results in ``--out``."""
    if name == "report":
        _report(out_dir, page)
        return
    if page is not None:
        raise BenchError("--page applies to 'bench report' only")
    # A wide table also when piped (CI logs, README), where rich would assume 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 150)
    if grid and name not in ("traffic", "latency"):
        raise BenchError(f"--grid applies to 'bench traffic|latency' only, not to 'bench {name}'")
    dims = [_parse_grid(g, 4 if name == "traffic" else 2) for g in grid]
    settings = parse_settings(broker_setting)
    if mechanism and name not in ("latency", "throughput"):
        raise BenchError(
            f"--mechanism applies to 'bench latency|throughput' only, not to 'bench {name}'"
        )
    if (minutes is not None or sample_s is not None) and name != "soak":
        raise BenchError(f"--minutes/--sample-s apply to 'bench soak' only, not to 'bench {name}'")
    if records is not None and name != "spark":
        raise BenchError(f"--records applies to 'bench spark' only, not to 'bench {name}'")
    if part is not None and name != "spark":
        raise BenchError(f"--part applies to 'bench spark' only, not to 'bench {name}'")
    if keys is not None and name != "keyed":
        raise BenchError(f"--keys applies to 'bench keyed' only, not to 'bench {name}'")
    try:
        key_grid = [int(k.replace("_", "")) for k in keys.split(",")] if keys else None
    except ValueError as exc:
        raise BenchError(f"--keys: {keys!r} is not a comma-separated list of numbers") from exc
    if smoke and name != "spark":
        raise BenchError(f"--smoke applies to 'bench spark' only, not to 'bench {name}'")
    quick = quick or smoke
    module = importlib.import_module(f"substreams_bench.{name}")
    # SIGTERM unwinds like Ctrl-C, so the embedded broker and the acker process stop too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    t0 = time.perf_counter()
    needs_broker = getattr(module, "NEEDS_BROKER", True)
    with bench_context(
        quick, bootstrap, console, needs_broker=needs_broker, broker_settings=settings
    ) as ctx:
        ctx.grid = dims or None
        ctx.mechanism = mechanism
        ctx.minutes, ctx.sample_s = minutes, sample_s
        ctx.records = records
        ctx.part = part
        ctx.smoke = smoke
        ctx.keys = key_grid
        where = f"on {ctx.bootstrap}" if needs_broker else "(no broker needed)"
        console.print(f"[bold]bench {name}[/]{' (quick)' if quick else ''} {where}")
        result = module.run(ctx)
    result.duration_s = time.perf_counter() - t0
    console.print(render_table(result))
    if result.targets:
        console.print(render_targets(result))
    for note in result.notes:
        console.print(f"[dim]note:[/] {note}")
    json_path, png_path = write_outputs(result, out_dir, module.plot)
    console.print(f"wrote {json_path} and {png_path} ({result.duration_s:.1f} s)")


def _report(out_dir: Path, page: Path | None) -> None:
    from substreams_bench.report import build

    if not sorted(out_dir.glob("*.json")):
        raise BenchError(f"no results in {out_dir}: run a benchmark with --out {out_dir} first")
    text, plots = build(out_dir, page)
    if page is None:
        click.echo(text)
    else:
        click.echo(f"updated {page} and {len(plots)} plot(s) in {out_dir}")


def _parse_grid(text: str, size: int) -> tuple[int, ...]:
    parts = text.lower().replace("\u00d7", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != size or min(dims) < 1:
        shape, example = ("PxQxSxK", "2x2x1x3") if size == 4 else ("PxQ", "4x4")
        raise BenchError(
            f"--grid {text!r}: expected {shape} with {size} positive integers, e.g. {example}"
        )
    return dims
