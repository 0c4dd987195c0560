"""How fast the simulator runs: the `scattered` scenario, 8 ranks, 100k rounds, gate on.

Steps the lockstep driver through `run_sim` on the virtual clock and reports wall seconds and rounds
per second (the target: 100k rounds in under a minute on a 2-core machine), then the run's summary.
The summary is SIMULATED: a cost model's figures for the named preset, not a measurement of hardware.

    .venv/bin/python -m bench.bench_sim_speed            # prints and writes bench/results/sim_speed.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

from engine.executor.presets import preset_named
from engine.metrics import Summary
from lab.scenarios import scenario
from lab.simrun import SimExtra, run_sim

RESULTS = Path(__file__).parent / "results" / "sim_speed.md"
GOAL_S = 60.0
GATE = {"prefill_attempt_interval": 8, "prefill_any_attempt_interval": 32}


def measure(rounds: int, seed: int) -> tuple[Summary, SimExtra]:
    """One run of `scattered` bounded by `rounds` only (its Poisson arrivals never end)."""
    sc = scenario("scattered", seed=seed)
    return run_sim(sc.server_args(**GATE), sc.workload(), rounds=rounds)


def _fmt(value: float | int | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def report(rounds: int, seed: int, summary: Summary, extra: SimExtra, command: str) -> str:
    """The markdown written to `RESULTS`."""
    preset = preset_named(extra.preset)
    verdict = "meets" if extra.wall_seconds < GOAL_S else "misses"
    lines = [
        "# Simulator speed: scattered, 8 ranks",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}.",
        f"Run: scenario `scattered` (seed {seed}), gate A={GATE['prefill_attempt_interval']} "
        f"K={GATE['prefill_any_attempt_interval']}, preset `{preset.name}`, {rounds} rounds.",
        "",
        "| rounds | wall s | rounds/s | rank-rounds/s |",
        "| ---: | ---: | ---: | ---: |",
        f"| {extra.rounds} | {extra.wall_seconds:.1f} | {extra.rounds_per_second:.0f} | "
        f"{extra.rounds_per_second * 8:.0f} |",
        "",
        f"{extra.rounds} rounds in {extra.wall_seconds:.1f} s: {verdict} the < {GOAL_S:.0f} s goal.",
        "",
        f"## SIMULATED summary ({preset.name}: {preset.hardware}; {preset.model})",
        "",
        "Cost-model figures on the virtual clock, not measurements of that hardware.",
        "",
        "| metric | value |",
        "| --- | ---: |",
        f"| simulated seconds | {extra.sim_seconds:.1f} |",
        f"| requests submitted / finished | {summary.requests_submitted} / {summary.requests_finished} |",
        f"| output tokens/s | {_fmt(summary.output_tokens_per_s, digits=0)} |",
        f"| TTFT p50 / p99 (ms) | {_fmt(summary.ttft_p50_s, 1e3)} / {_fmt(summary.ttft_p99_s, 1e3)} |",
        f"| ITL p50 / p99 (ms) | {_fmt(summary.itl_p50_s, 1e3)} / {_fmt(summary.itl_p99_s, 1e3)} |",
        f"| extend rounds (share of busy rounds) | {summary.extend_rounds} "
        f"({_fmt(summary.extend_round_share, 100)}%) |",
        f"| mean ranks extending per extend round | {_fmt(summary.mean_ranks_extending, digits=2)} |",
        f"| windows opened by ANY / ALL | {summary.windows_any} / {summary.windows_all} |",
        f"| gate wait max / p99 (rounds) | {summary.gate_wait_max_rounds} / "
        f"{_fmt(summary.gate_wait_p99_rounds, digits=0)} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run, print, and write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only; leave the results file alone")
    options = parser.parse_args(argv)
    summary, extra = measure(options.rounds, options.seed)
    command = ".venv/bin/python -m bench.bench_sim_speed" + "".join(
        f" {arg}" for arg in (argv if argv is not None else sys.argv[1:])
    )
    text = report(options.rounds, options.seed, summary, extra, command)
    print(f"wall {extra.wall_seconds:.1f} s, {extra.rounds_per_second:.0f} rounds/s ({extra.rounds} rounds, 8 ranks)")
    print(f"SIMULATED ({extra.preset}): {summary.as_dict()}")
    if not options.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
