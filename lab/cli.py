"""`prefill-gate lab`: the policy lab at each scenario's nominal load (one table per scenario), and its
`capacity` subcommand (`lab.capacity.cli`), which writes the lab's main report.

    prefill-gate lab capacity [...]                 # goodput capacity: bench/results/lab.md
    prefill-gate lab [--scenarios ...] [--policies ...] [--preset P] [--sweep --ttft-p99-max S]
                     [--out bench/results] [--scale X] [--jobs N]

The fixed-load view writes `<out>/lab/fixed-load.md` and PNG charts under `<out>/lab/`: every policy at one
setting on the same requests, with the oracle bound. With `--sweep` it runs the gate alone over a grid of
intervals instead and writes `<out>/lab/sweep.md`. Bad input (an unknown scenario, policy or preset, a sweep
without its bound) ends with a one-line error and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from engine.executor.presets import DEFAULT_PRESET, CostPreset
from engine.policies.registry import DEFAULT_LOCAL_INTERVAL
from lab.autotune import LAB_POLICIES
from lab.capacity.cli import add_capacity_arguments, capacity_main
from lab.report import render_report
from lab.runner import (
    DEFAULT_ANY_INTERVAL,
    DEFAULT_ATTEMPT_INTERVAL,
    PHASE_SCENARIOS,
    Cell,
    LabConfig,
    check_names,
    default_jobs,
    group_by_scenario,
    run_cells,
)
from lab.scenarios import scenario_names
from lab.sweep import DEFAULT_ANY_GRID, DEFAULT_ATTEMPT_GRID, grid, render_sweep, sweep_specs

PROG = "prefill-gate lab"
CHART_DIR = "lab"
REPORT_NAME = "fixed-load.md"
SWEEP_NAME = "sweep.md"


def add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    """The lab's options on `parser`."""
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=list(scenario_names()),
        metavar="NAME",
        help=f"scenarios to run (space or comma separated; default all: {', '.join(scenario_names())})",
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        default=list(LAB_POLICIES),
        metavar="NAME",
        help=f"policies to run (default all: {', '.join(LAB_POLICIES)}); the oracle bound row is always shown",
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, help="simulator cost preset (name or a calibrated .json)")
    parser.add_argument("--seed", type=int, default=0, help="scenario seed (default 0)")
    parser.add_argument("--scale", type=float, default=1.0, help="run length scale of every scenario (default 1.0)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="worker processes (default: up to 2)")
    parser.add_argument("--out", default="bench/results", help="directory for lab.md and lab/*.png")
    parser.add_argument(
        "--attempt-interval", type=int, default=DEFAULT_ATTEMPT_INTERVAL, help="the gate row's A (default 8)"
    )
    parser.add_argument("--any-interval", type=int, default=DEFAULT_ANY_INTERVAL, help="the gate row's K (default 32)")
    parser.add_argument(
        "--local-interval", type=int, default=DEFAULT_LOCAL_INTERVAL, help="the local-interval row's N (default 4)"
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="instead of the policy table, search the gate's (A, K) per scenario and write lab/sweep.md",
    )
    parser.add_argument(
        "--ttft-p99-max",
        nargs="+",
        type=float,
        default=None,
        metavar="S",
        help="the sweep's TTFT p99 bound(s) in seconds (several: one pick per bound, one grid run)",
    )
    parser.add_argument(
        "--sweep-attempt",
        nargs="+",
        type=int,
        default=list(DEFAULT_ATTEMPT_GRID),
        metavar="A",
        help="the sweep's A values (default 2 4 8 16)",
    )
    parser.add_argument(
        "--sweep-any",
        nargs="+",
        type=int,
        default=list(DEFAULT_ANY_GRID),
        metavar="K",
        help="the sweep's K values (default 4 8 16 32 64); only K >= A is run",
    )
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")


def add_lab_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `lab` on the top-level CLI's subparsers; returns its parser."""
    parser = subparsers.add_parser(
        "lab",
        help="the policy lab (simulated): `lab capacity` writes bench/results/lab.md; plain `lab` the fixed-load view",
        description="The policy lab: `lab capacity` finds every policy's goodput capacity per workload, each at its "
        "best knobs (bench/results/lab.md); plain `lab` runs the gate and its public peers at each scenario's nominal "
        "load on the same simulated requests, one table per scenario, with the oracle bound, charts, and optionally "
        "a sweep of the gate's intervals (bench/results/lab/fixed-load.md).",
    )
    add_lab_arguments(parser)
    add_capacity_subparser(parser)
    return parser


def add_capacity_subparser(parser: argparse.ArgumentParser) -> None:
    """`capacity` under the lab's parser (optional: plain `lab` keeps the fixed-load view)."""
    sub = parser.add_subparsers(dest="lab_command", metavar="{capacity}")
    capacity = sub.add_parser(
        "capacity",
        help="goodput capacity per workload and policy, every policy at its best (writes bench/results/lab.md)",
        description="Goodput capacity: per workload and policy the highest load at which the TTFT and ITL p99 "
        "bounds hold and nothing backlogs, found by bisection, with every policy's knobs swept to its best.",
    )
    add_capacity_arguments(capacity)


def _names(values: Sequence[str]) -> tuple[str, ...]:
    """Space- or comma-separated names, in order, without duplicates."""
    out: list[str] = []
    for value in values:
        for name in value.split(","):
            if name.strip() and name.strip() not in out:
                out.append(name.strip())
    return tuple(out)


def config_of(ns: argparse.Namespace) -> tuple[LabConfig, CostPreset]:
    """The lab configuration the options describe; ValueError on bad input."""
    config = LabConfig(
        scenarios=_names(ns.scenarios),
        policies=_names(ns.policies),
        preset=ns.preset,
        seed=ns.seed,
        scale=ns.scale,
        attempt_interval=ns.attempt_interval,
        any_interval=ns.any_interval,
        local_interval=ns.local_interval,
    )
    if not config.scenarios or not config.policies:
        raise ValueError("need at least one scenario and one policy")
    if not ns.scale > 0:
        raise ValueError(f"--scale must be > 0, got {ns.scale}")
    if ns.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {ns.jobs}")
    if min(ns.attempt_interval, ns.any_interval, ns.local_interval) < 1 or ns.any_interval < ns.attempt_interval:
        raise ValueError(
            f"need 1 <= --attempt-interval <= --any-interval and --local-interval >= 1, got "
            f"{ns.attempt_interval}, {ns.any_interval}, {ns.local_interval}"
        )
    if ns.sweep and ns.ttft_p99_max is None:
        raise ValueError("--sweep needs --ttft-p99-max S (the TTFT p99 bound in seconds)")
    if ns.ttft_p99_max is not None and not ns.sweep:
        raise ValueError("--ttft-p99-max is the sweep's bound: add --sweep")
    if ns.ttft_p99_max is not None and not all(bound > 0 for bound in ns.ttft_p99_max):
        raise ValueError(f"--ttft-p99-max must be > 0, got {' '.join(f'{b:g}' for b in ns.ttft_p99_max)}")
    if ns.sweep:
        grid(ns.sweep_attempt, ns.sweep_any)
    return config, check_names(config.scenarios, config.policies, config.preset)


def command_of(ns: argparse.Namespace) -> str:
    """The command line that reproduces this report's content (options that change it, defaults left out)."""
    parts = [PROG]
    if _names(ns.scenarios) != scenario_names():
        parts += ["--scenarios", *_names(ns.scenarios)]
    if _names(ns.policies) != tuple(LAB_POLICIES) and not ns.sweep:
        parts += ["--policies", *_names(ns.policies)]
    for flag, value, default in (
        ("--preset", ns.preset, DEFAULT_PRESET),
        ("--seed", ns.seed, 0),
        ("--scale", ns.scale, 1.0),
        ("--attempt-interval", ns.attempt_interval, DEFAULT_ATTEMPT_INTERVAL),
        ("--any-interval", ns.any_interval, DEFAULT_ANY_INTERVAL),
        ("--local-interval", ns.local_interval, DEFAULT_LOCAL_INTERVAL),
    ):
        if value != default:
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if ns.no_charts and not ns.sweep:
        parts.append("--no-charts")
    if ns.sweep:
        parts += ["--sweep", "--ttft-p99-max", *(f"{bound:g}" for bound in ns.ttft_p99_max)]
        if tuple(ns.sweep_attempt) != DEFAULT_ATTEMPT_GRID:
            parts += ["--sweep-attempt", *map(str, ns.sweep_attempt)]
        if tuple(ns.sweep_any) != DEFAULT_ANY_GRID:
            parts += ["--sweep-any", *map(str, ns.sweep_any)]
    return " ".join(parts)


def settings_of(config: LabConfig) -> str:
    """The policies' knobs as the report states them."""
    return (
        f"gate A={config.attempt_interval}, K={config.any_interval}; local-interval N={config.local_interval}; "
        "peers at their sources' defaults (sglang-delayer max_delay_passes=30; atom-coalescer TARGET_FILL 0.9, "
        "STALL_TICKS 10, PARTIAL_MAX_TICKS 100, TTFT_MAX_TICKS 200; vllm-cadence interval 2; trtllm-balance "
        "timeout_iters=50, batching_wait_iters=10); see each module's docstring in engine/policies/; "
        "gate-autotune: the gate from A=8, K=32, moved by the tuner to TTFT p99 <= 2 s, ITL p99 <= 0.2 s "
        "(docs/autotune.md)"
    )


def _write_charts(groups: dict[str, list[Cell]], preset: CostPreset, out: Path) -> dict[str, str]:
    """Charts per scenario; keys `scenario:kind`, values paths relative to `out/lab` (where the report lives)."""
    from lab import charts  # matplotlib: imported only when a chart is drawn

    written: dict[str, str] = {}
    for name, cells in groups.items():
        target = out / CHART_DIR / f"{name}.png"
        charts.throughput_chart(name, cells, preset.name, target)
        written[f"{name}:throughput"] = target.name
        if name in PHASE_SCENARIOS:
            target = out / CHART_DIR / f"{name}-spread.png"
            charts.spread_chart(name, cells, preset.name, target)
            written[f"{name}:spread"] = target.name
    return written


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished workers."""
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def _run_note(ns: argparse.Namespace, cells: int, wall: float, load: float) -> str:
    """How long the run took, on what: kept out of the report body so the tables stay identical run to run."""
    return (
        f"\n## Run\n\nWall time: {wall:.0f} s for {cells} cells; {_cpu_seconds():.0f} CPU seconds in all; "
        f"{ns.jobs} worker process(es) on {os.cpu_count()} CPUs ({platform.machine()}, Python "
        f"{platform.python_version()}), load average {load:.1f} at the start (the machine is shared). "
        "Wall and CPU times are the only figures that change between runs.\n"
    )


def lab_main(ns: argparse.Namespace) -> int:
    """Run the lab (or the sweep, or the capacity lab) the options describe; 0 on success, 2 on bad input."""
    if getattr(ns, "lab_command", None) == "capacity":
        return capacity_main(ns)
    try:
        config, preset = config_of(ns)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    out = Path(ns.out)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    if ns.sweep:
        specs = sweep_specs(config, grid(ns.sweep_attempt, ns.sweep_any))
        groups = group_by_scenario(run_cells(specs, ns.jobs), config.scenarios)
        report = render_sweep(groups, ns.ttft_p99_max, preset.name, command_of(ns))
        target = out / CHART_DIR / SWEEP_NAME
    else:
        groups = group_by_scenario(run_cells(config.specs(), ns.jobs), config.scenarios)
        chart_paths = {} if ns.no_charts else _write_charts(groups, preset, out)
        report = render_report(groups, preset, command_of(ns), settings_of(config), chart_paths)
        target = out / CHART_DIR / REPORT_NAME
    wall = time.perf_counter() - started
    print(report)
    run_note = _run_note(ns, sum(len(cells) for cells in groups.values()), wall, load)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(report + run_note, encoding="utf-8")
    print(run_note.strip(), file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lab`: the same options as `prefill-gate lab`."""
    parser = argparse.ArgumentParser(prog=PROG, description="The policy lab (see prefill-gate lab --help).")
    add_lab_arguments(parser)
    add_capacity_subparser(parser)
    return lab_main(parser.parse_args(argv))
