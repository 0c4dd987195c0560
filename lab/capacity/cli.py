"""`prefill-gate lab capacity`: goodput capacity per workload and policy, every policy at its best.

    prefill-gate lab capacity [--scenarios NAME ...] [--trace FILE ...] [--policies NAME ...]
                              [--slo-ttft-p99 S] [--slo-itl-p99 S] [--preset P] [--quick] [--jobs N]
                              [--json FILE] [--out DIR] [--frontier S ...] [--seed N] [--no-charts]

A full run on the default preset writes `<out>/lab.md`; any other run writes `<out>/lab/capacity-<preset>.md`
(`-quick` added for `--quick`), so a smoke run never replaces the measurement. Every run also writes its
records as `<out>/lab/capacity-<preset>[-quick].json` (the report of the default preset shows the headline of
every other full preset run found there) and, unless `--no-charts`, one PNG per workload under
`<out>/lab/capacity-<preset>[-quick]/`. Bad input ends with a one-line error and exit status 2, never a
traceback, before any run starts. A run interrupted by SIGINT or SIGTERM still writes its report and records
for the pairs that finished, labelled PARTIAL, and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.executor import presets
from engine.executor.presets import DEFAULT_PRESET, CostPreset, RankWork, preset_named, preset_names
from lab.autotune import LAB_POLICIES
from lab.capacity.probe import Slo
from lab.capacity.report import by_workload, records, render
from lab.capacity.runner import Interrupted, Result, Task, run_tasks
from lab.capacity.targets import scenario_specs, trace_specs
from lab.runner import default_jobs
from lab.scenarios import scenario_names

PROG = "prefill-gate lab capacity"
REPORT = "lab.md"
FULL_FRONTIER = (1.0, 2.0, 4.0)


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    """The capacity lab's options on `parser`."""
    parser.add_argument(
        "--scenarios",
        nargs="*",
        default=list(scenario_names()),
        metavar="NAME",
        help=f"scenario shapes (default all: {', '.join(scenario_names())}); give none to run traces only",
    )
    parser.add_argument(
        "--trace", nargs="+", default=[], metavar="FILE", help="trace files (Azure CSV, Mooncake JSONL)"
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        default=list(LAB_POLICIES),
        metavar="NAME",
        help=f"policies (default all: {', '.join(LAB_POLICIES)})",
    )
    default = Slo()
    parser.add_argument(
        "--slo-ttft-p99",
        type=float,
        default=default.ttft_p99_s,
        metavar="S",
        help=f"TTFT p99 bound net of idle prefill, s (default {default.ttft_p99_s:g})",
    )
    parser.add_argument(
        "--slo-itl-p99",
        type=float,
        default=default.itl_p99_s,
        metavar="S",
        help=f"ITL p99 bound, s (default {default.itl_p99_s:g}: one extend round of the default preset and a decode)",
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, help=f"simulator cost preset (default {DEFAULT_PRESET})")
    parser.add_argument("--quick", action="store_true", help="shorter runs, smaller grids (a smoke run, < 5 min)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="worker processes (default: up to 2)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the records to FILE")
    parser.add_argument("--out", default="bench/results", help="directory of lab.md and lab/ (default bench/results)")
    parser.add_argument(
        "--frontier",
        nargs="*",
        type=float,
        default=None,
        metavar="S",
        help="extra TTFT bounds for the capacity-against-SLO chart (default 1 2 4; --quick: none)",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")


def _names(values: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for value in values:
        for name in value.split(","):
            if name.strip() and name.strip() not in out:
                out.append(name.strip())
    return tuple(out)


def tasks_of(ns: argparse.Namespace) -> tuple[list[Task], CostPreset]:
    """The tasks the options describe; ValueError (one line) on bad input."""
    for flag, value in (("--slo-ttft-p99", ns.slo_ttft_p99), ("--slo-itl-p99", ns.slo_itl_p99)):
        if not value > 0 or value != value or value == float("inf"):
            raise ValueError(f"{flag} must be a finite number of seconds > 0, got {value}")
    if ns.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {ns.jobs}")
    frontier = _frontier(ns)
    preset = preset_named(ns.preset)
    policies = _names(ns.policies)
    for policy in policies:
        if policy not in LAB_POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known policies: {', '.join(LAB_POLICIES)}")
    specs = scenario_specs(_names(ns.scenarios), ns.seed, ns.quick)
    for path in ns.trace:
        if not Path(path).is_file():
            raise ValueError(f"trace file {path!r} does not exist")
    specs += trace_specs(tuple(ns.trace), ns.seed, ns.quick)
    if not specs or not policies:
        raise ValueError("need at least one workload (a scenario or a --trace) and one policy")
    if ns.json is not None and not Path(ns.json).resolve().parent.is_dir():
        raise ValueError(f"--json: directory of {ns.json!r} does not exist")
    slo = Slo(ns.slo_ttft_p99, ns.slo_itl_p99)
    tasks = [Task(spec, policy, ns.preset, slo, frontier, ns.quick) for spec in specs for policy in policies]
    return tasks, preset


def _frontier(ns: argparse.Namespace) -> tuple[float, ...]:
    values = ns.frontier if ns.frontier is not None else ([] if ns.quick else list(FULL_FRONTIER))
    for value in values:
        if not value > 0 or value == float("inf"):
            raise ValueError(f"--frontier bounds must be finite seconds > 0, got {value}")
    return tuple(sorted(set(values)))


def _stem(ns: argparse.Namespace, preset: CostPreset) -> str:
    return f"capacity-{Path(preset.name).name}" + ("-quick" if ns.quick else "")


def command_of(ns: argparse.Namespace) -> str:
    """The command that reproduces the report (options that change it; defaults left out)."""
    parts = [PROG]
    if _names(ns.scenarios) != scenario_names():
        parts += ["--scenarios", *_names(ns.scenarios)]
    if ns.trace:
        parts += ["--trace", *ns.trace]
    if _names(ns.policies) != tuple(LAB_POLICIES):
        parts += ["--policies", *_names(ns.policies)]
    for flag, value, default in (
        ("--slo-ttft-p99", ns.slo_ttft_p99, Slo().ttft_p99_s),
        ("--slo-itl-p99", ns.slo_itl_p99, Slo().itl_p99_s),
        ("--preset", ns.preset, DEFAULT_PRESET),
        ("--seed", ns.seed, 0),
    ):
        if value != default:
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if ns.quick:
        parts.append("--quick")
    if ns.frontier is not None:
        parts += ["--frontier", *(f"{v:g}" for v in ns.frontier)]
    return " ".join(parts)


def steepness(preset: CostPreset) -> float:
    """How many all-decode rounds one round costs when one rank extends a 1k prompt while seven decode 64
    sequences of 2k context (the extend path's price, the quantity the gate exists for)."""
    decoding = RankWork(64, 0, 64 * 2048)
    extend = preset.work_seconds((RankWork(0, 1024, 0), *(decoding,) * 7))
    return extend / preset.work_seconds((decoding,) * 8)


def preset_notes(names: Sequence[str]) -> list[str]:
    """One line per preset: how steep its extend penalty is, by the registry's measure (`lone_prompt_ratio`,
    which names the mildest and the steepest preset) and under a decode load (`steepness`)."""
    marks = {presets.MILDEST_PRESET: " (the mildest preset)", presets.STEEPEST_PRESET: " (the steepest preset)"}
    return [
        f"- `{name}`: a lone 1k prompt costs {presets.lone_prompt_ratio(preset_named(name)):.1f} decode ticks"
        f"{marks.get(name, '')}; beside 64 decoding sequences per rank it makes the round "
        f"{steepness(preset_named(name)):.1f}x an all-decode round"
        for name in names
        if name in preset_names()
    ]


def _other_runs(lab_dir: Path, this: str, own: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """This run's records first, then every other preset's run found beside it (a full run over a quick one;
    a quick one is labelled so)."""
    runs: dict[str, list[dict[str, Any]]] = {this: own}
    found: dict[str, tuple[bool, list[dict[str, Any]]]] = {}
    for path in sorted(lab_dir.glob("capacity-*.json")):
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not (isinstance(loaded, list) and loaded and isinstance(loaded[0], dict) and "preset" in loaded[0]):
            continue
        preset, quick = str(loaded[0]["preset"]), bool(loaded[0].get("quick"))
        if preset != this and (preset not in found or found[preset][0]):
            found[preset] = (quick, loaded)
    for preset, (quick, loaded) in sorted(found.items()):
        runs[f"{preset} (quick)" if quick else preset] = loaded
    return runs


def _cpu_seconds() -> float:
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def run_note(ns: argparse.Namespace, results: Sequence[Result], wall: float, load: float) -> str:
    """Wall time and machine: the only part of the report that changes between identical runs."""
    runs = sum(result.runs for result in results)
    return (
        f"\n## Run\n\nWall time: {wall:.0f} s ({wall / 60:.1f} min) for {len(results)} (workload, policy) pairs and "
        f"{runs} simulated runs; {_cpu_seconds():.0f} CPU seconds in all; {ns.jobs} worker process(es) on "
        f"{os.cpu_count()} CPUs ({platform.machine()}, Python {platform.python_version()}); load average "
        f"{load:.1f} at the start (the machine was shared with other developers' work).\n"
    )


def capacity_main(ns: argparse.Namespace) -> int:
    """Run the capacity lab; 0 on success, 2 on bad input (one line on stderr)."""
    try:
        tasks, preset = tasks_of(ns)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    lone = preset.work_seconds(presets.LONE_1K)
    if ns.slo_itl_p99 < lone:
        print(
            f"{PROG}: note: the ITL bound {ns.slo_itl_p99:g} s is below one extend round on {preset.name} (one rank "
            f"extending a lone 1k prompt: {lone:.2f} s), so a load holds only while under 1% of gaps meet an extend "
            "round; capacities will measure how rarely a policy can extend at all",
            file=sys.stderr,
        )
    out = Path(ns.out)
    stem = _stem(ns, preset)
    lab_dir = out / "lab"
    load = os.getloadavg()[0]
    started = time.perf_counter()
    interrupted: Interrupted | None = None
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM ends the run as SIGINT does
    try:
        results = run_tasks(tasks, ns.jobs)
    except Interrupted as stop:
        interrupted, results = stop, stop.results
    finally:
        signal.signal(signal.SIGTERM, previous)
    wall = time.perf_counter() - started
    if interrupted is not None and not results:
        print(f"{PROG}: interrupted before any pair finished; nothing written", file=sys.stderr)
        return 130
    own = records(results, preset.name)
    lab_dir.mkdir(parents=True, exist_ok=True)
    (lab_dir / f"{stem}.json").write_text(json.dumps(own, indent=1) + "\n", encoding="utf-8")
    if ns.json is not None:
        Path(ns.json).write_text(json.dumps(own, indent=1) + "\n", encoding="utf-8")
    main_report = not ns.quick and ns.preset == DEFAULT_PRESET
    target = out / REPORT if main_report else lab_dir / f"{stem}.md"
    chart_paths: dict[str, str] = {}
    if not ns.no_charts:
        from lab.capacity import charts  # matplotlib: imported only when a chart is drawn

        for label, row in by_workload(results).items():
            path = charts.frontier_chart(label, row, preset.name, lab_dir / stem / f"{label}.png")
            chart_paths[label] = str(path.relative_to(target.parent))
    others = _other_runs(lab_dir, preset.name, own) if main_report else {}
    text = render(
        results,
        preset,
        command_of(ns),
        tasks[0].slo,
        quick=ns.quick,
        charts=chart_paths,
        other_presets=others if len(others) > 1 else None,
        preset_notes=preset_notes([name.split(" ")[0] for name in others]),
        partial=None if interrupted is None else (len(results), interrupted.total),
        policies=list(dict.fromkeys(task.policy for task in tasks)),
    )
    note = run_note(ns, results, wall, load)
    target.write_text(text + note, encoding="utf-8")
    print(text)
    print(note.strip(), file=sys.stderr)
    if interrupted is not None:
        print(f"{PROG}: {interrupted}; the report and records are PARTIAL", file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lab.capacity`: the same options as `prefill-gate lab capacity`."""
    parser = argparse.ArgumentParser(prog=PROG, description="Goodput capacity per workload and policy (simulated).")
    add_capacity_arguments(parser)
    return capacity_main(parser.parse_args(argv))
