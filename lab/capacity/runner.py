"""The capacity lab's tasks: one (target, policy) pair per task, in worker processes, results in task order.

A task searches the policy at its best on one target under the main SLO (refining its knobs in a full run),
then, for the frontier chart, searches that best setting under each extra TTFT bound, and in a full run probes
it at fractions of the capacity so the TTFT-against-load curve has points below the knee. Every
search of a task shares one `Searcher`, so no (setting, load) is simulated twice. Tasks are independent and
deterministic: `run_tasks` gives the same results whatever `jobs` is; only wall times differ.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from engine.executor.presets import CostPreset, preset_named
from lab.capacity.knobs import Knobs, settings_of
from lab.capacity.probe import Probe, Slo, verdict
from lab.capacity.search import Capacity, Searcher, best_capacity
from lab.capacity.targets import TargetSpec, target_of

# Fractions of the capacity at which a full run adds points to the TTFT-against-load curve.
CURVE_FRACTIONS = (0.5,)


@dataclass(frozen=True, slots=True)
class Task:
    """One (target, policy) pair and how to search it; picklable."""

    spec: TargetSpec
    policy: str
    preset: str
    slo: Slo
    frontier: tuple[float, ...] = ()
    quick: bool = False


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One probe of the best setting: offered req/s, TTFT p99 (raw and net of idle prefill), ITL p99, verdict."""

    load: float
    offered_rps: float
    ttft_p99_s: float | None
    ttft_excess_p99_s: float | None
    itl_p99_s: float | None
    held: bool | None
    cut_short: str | None


@dataclass(frozen=True)
class Result:
    """A task's outcome: the capacity under the main SLO, the capacity under each frontier bound (with its
    setting), the best setting's curve, and what it cost."""

    task: Task
    what: str
    load_unit: str
    main: Capacity
    frontier: tuple[tuple[float, float | None, Knobs | None], ...]
    curve: tuple[CurvePoint, ...]
    runs: int
    wall_seconds: float


@cache
def _preset(name: str) -> CostPreset:
    return preset_named(name)


def run_task(task: Task) -> Result:
    """Search one pair (module docstring)."""
    started = time.perf_counter()
    target = target_of(task.spec)
    searcher = Searcher(target, task.policy, _preset(task.preset), quick=task.quick)
    grid = settings_of(task.policy, task.quick)
    main = best_capacity(searcher, grid, task.slo, refine=not task.quick)
    frontier: list[tuple[float, float | None, Knobs | None]] = [
        (task.slo.ttft_p99_s, main.capacity_rps if main.capacity > 0 else 0.0, main.knobs)
    ]
    # The other bounds with the main bound's best setting (what a reader tuned for S gets under another S);
    # stricter bounds first, since the main search's probes already decide most of their loads.
    for bound in sorted(set(task.frontier) - {task.slo.ttft_p99_s}):
        start = main.capacity or None
        found = best_capacity(
            searcher, [main.knobs or grid[0]], Slo(bound, task.slo.itl_p99_s), goodput=False, hint=start
        )
        frontier.append((bound, found.capacity_rps if found.capacity > 0 else 0.0, found.knobs))
    if main.knobs is not None and main.capacity > 0 and not task.quick:
        for fraction in CURVE_FRACTIONS:
            searcher.probe(main.knobs, main.capacity * fraction, task.slo)
    curve = tuple(_point(target.offered_rps, probe, task.slo) for probe in searcher.curve(main.knobs or ()))
    return Result(
        task=task,
        what=target.what,
        load_unit=target.load_unit,
        main=main,
        frontier=tuple(sorted(frontier)),
        curve=curve,
        runs=searcher.runs,
        wall_seconds=time.perf_counter() - started,
    )


def _point(offered, probe: Probe, slo: Slo) -> CurvePoint:
    rps = offered(probe.load)
    return CurvePoint(
        load=probe.load,
        offered_rps=rps if rps is not None else probe.offered_rps,
        ttft_p99_s=probe.ttft_p99_s,
        ttft_excess_p99_s=probe.ttft_excess_p99_s,
        itl_p99_s=probe.itl_p99_s,
        held=verdict(probe, slo),
        cut_short=probe.cut_short,
    )


class Interrupted(Exception):
    """The run was interrupted (SIGINT or SIGTERM) before every task finished; `results` holds the tasks that
    did finish, in task order."""

    def __init__(self, results: list[Result], total: int) -> None:
        super().__init__(f"interrupted after {len(results)} of {total} tasks")
        self.results = results
        self.total = total


def _ignore_interrupts() -> None:
    # A worker leaves the interrupt to the parent, which keeps what finished and then ends the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_indexed(item: tuple[int, Task]) -> tuple[int, Result]:
    return item[0], run_task(item[1])


def run_tasks(tasks: Sequence[Task], jobs: int = 1) -> list[Result]:
    """Every task; results in the order of `tasks` whatever `jobs` is. A KeyboardInterrupt (SIGINT, or SIGTERM
    where the caller maps it so) ends the workers and raises `Interrupted` with the tasks that finished."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    done: dict[int, Result] = {}
    try:
        if jobs == 1 or len(tasks) <= 1:
            for index, task in enumerate(tasks):
                done[index] = run_task(task)
        else:
            order = run_order(tasks)
            # spawn, not fork: a forked worker can inherit a lock held by another thread of the parent.
            context = multiprocessing.get_context("spawn")
            with context.Pool(min(jobs, len(tasks)), initializer=_ignore_interrupts) as pool:  # exit: terminate
                for index, result in pool.imap_unordered(_run_indexed, [(i, tasks[i]) for i in order], chunksize=1):
                    done[index] = result
    except KeyboardInterrupt:
        raise Interrupted([done[i] for i in sorted(done)], len(tasks)) from None
    return [done[i] for i in range(len(tasks))]


def run_order(tasks: Sequence[Task]) -> list[int]:
    """Task indices in the order they run: workload by workload, the costliest workload first, the costliest
    task of a workload first. Whole workloads finish together, so an interrupted run still has whole rows; and
    the longest tasks start early, so the workers stay busy to the end. Results are put back in task order."""
    rows: dict[TargetSpec, float] = {}
    first: dict[TargetSpec, int] = {}
    for index, task in enumerate(tasks):
        rows[task.spec] = rows.get(task.spec, 0.0) + _cost_guess(task)
        first.setdefault(task.spec, index)
    return sorted(
        range(len(tasks)), key=lambda i: (-rows[tasks[i].spec], first[tasks[i].spec], -_cost_guess(tasks[i]), i)
    )


def _cost_guess(task: Task) -> float:
    """Rough relative cost of a task: grid size times how long its target's runs are."""
    heavy = {"long-osl": 4.0, "kv-pressure": 2.5, "osl-variance": 2.0}
    weight = 3.0 if task.spec.kind == "trace" else heavy.get(task.spec.name, 1.0)
    return weight * len(settings_of(task.policy, task.quick)) * (1 + len(task.frontier))
