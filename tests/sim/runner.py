"""Many schedules: seeds over worker processes, the summary, the minimal trace of a failure.

Why processes: a schedule is pure CPU and independent of the others; the results are
per seed, so the order of the workers does not change what is reported (the first failing
seed is the lowest one)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from tests.sim.sim import BUGS, KNOWN_ISSUE, UNREACHABLE, minimal, run_schedule, trace

TARGET_SCHEDULES = 10_000
TARGET_SECONDS = 120.0


@dataclass
class Outcome:
    seed: int
    violations: list[str]
    faults: int
    stats: dict[str, int]
    cpu: float = 0.0
    """The schedule's CPU seconds (in its worker)."""


@dataclass
class Run:
    """What a batch of schedules found."""

    bugs: frozenset[str]
    schedules: int = 0
    seconds: float = 0.0
    failing: list[Outcome] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    cpu: float = 0.0
    """CPU seconds of the schedules, summed over the workers."""


def _one(job: tuple[int, frozenset[str], bool]) -> Outcome:
    seed, bugs, idle_zombies = job
    began = time.process_time()
    r = run_schedule(seed, bugs, idle_zombies=idle_zombies)
    return Outcome(seed, r.violations, r.faults, r.stats, time.process_time() - began)


def _outcomes(jobs: list[tuple[int, frozenset[str], bool]], workers: int) -> Iterator[Outcome]:
    if workers <= 1 or len(jobs) < 8:
        for job in jobs:
            yield _one(job)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        yield from pool.imap(_one, jobs, chunksize=max(1, min(32, len(jobs) // (8 * workers))))


def run_seeds(seeds: Iterable[int], bugs: frozenset[str] = frozenset(), *, workers: int = 1,
              stop_at_first: bool = False, idle_zombies: bool = False) -> Run:
    """Run the schedules of ``seeds`` (in seed order; ``stop_at_first``: until one fails)."""
    run = Run(bugs)
    began = time.perf_counter()
    jobs = [(s, bugs, idle_zombies) for s in seeds]
    outcomes = _outcomes(jobs, workers)
    try:
        for out in outcomes:
            run.schedules += 1
            run.cpu += out.cpu
            for k, v in out.stats.items():
                run.stats[k] = run.stats.get(k, 0) + v
            if out.violations:
                run.failing.append(out)
                if stop_at_first:
                    break
    finally:
        close = getattr(outcomes, "close", None)
        if close is not None:
            close()  # ends the pool at once when stopped early
    run.seconds = time.perf_counter() - began
    return run


def describe_failure(out: Outcome, bugs: frozenset[str], idle_zombies: bool = False) -> list[str]:
    """The failing seed: its violations, then the shortest run that still fails the same
    check (fewest faults carried out) as a trace, and how to replay both."""
    full = run_schedule(out.seed, bugs, idle_zombies=idle_zombies)
    short = minimal(out.seed, bugs, full, idle_zombies)
    limit = short.stats.get("fault_limit", full.faults)
    switches = "".join(f" --bug {b}" for b in sorted(bugs))
    lines = [f"  seed {out.seed}: {len(out.violations)} violation(s)"]
    lines += [f"    {v}" for v in out.violations[:5]]
    lines.append(f"  minimal trace: {limit} of its {full.faults} faults carried out "
                 f"(replay: python -m tests.sim --seed {out.seed} --schedules 1{switches} "
                 f"--faults {limit} --trace); it fails with: {short.violations[0]}")
    lines += ["    " + line for line in trace(short)]
    return lines


def summary_line(run: Run) -> str:
    rate = run.schedules / run.seconds if run.seconds else 0.0
    per = 1000 * run.cpu / run.schedules if run.schedules else 0.0
    return (f"{run.schedules} schedules in {run.seconds:.1f} s ({rate:.0f}/s; CPU "
            f"{run.cpu:.1f} s, {per:.1f} ms per schedule): "
            f"{len(run.failing)} with violations"
            + (f", first failing seed {run.failing[0].seed}" if run.failing else ""))


__all__ = ["BUGS", "KNOWN_ISSUE", "TARGET_SCHEDULES", "TARGET_SECONDS", "UNREACHABLE", "Outcome",
           "Run", "describe_failure", "run_seeds", "summary_line"]
