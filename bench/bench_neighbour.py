"""What a busy neighbour on the other CPU costs the engine on this machine, with nothing shared but the machine.

The control plane's round-rate goal (issue 13: 32 subscribers cost the engine under 5%) asks that the work of
serving subscribers, done in another process on another CPU, not slow the engine. This bench measures the
floor under that goal on the machine it runs on: the lockstep simulator (8 ranks, the loop `serve`'s child
process runs) pinned to CPU 0, and on CPU 1, in alternating windows, nothing, a pure-Python arithmetic loop
(no memory traffic to speak of) or a numpy loop walking 64 MB (a cache-hungry neighbour). Nothing is shared
between the two processes: no lock, no pipe, no memory. If the engine slows anyway, the CPUs share hardware
(sibling hyper-threads of one host core, or the host's scheduling of the virtual CPUs), and any work the
control plane does on the other CPU costs the engine that much, whatever the software does.

    .venv/bin/python -m bench.bench_neighbour      # prints and writes bench/results/neighbour.md
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from bench.bench_tracing import bench_args, load_average, workload_of
from control.host.backends import loads_of
from engine.drivers.lockstep import LockstepDriver

RESULTS = Path(__file__).parent / "results" / "neighbour.md"
ENGINE_CPU, NEIGHBOUR_CPU = 0, 1
KINDS = ("none", "arithmetic loop", "64 MB numpy walk")


def arithmetic(stop: Any) -> None:
    """A neighbour that only computes: a Python loop on small ints."""
    os.sched_setaffinity(0, {NEIGHBOUR_CPU})
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def memory_walk(stop: Any) -> None:
    """A neighbour that streams through 64 MB (more than the last-level cache) again and again."""
    os.sched_setaffinity(0, {NEIGHBOUR_CPU})
    import numpy as np

    block = np.ones(8_000_000)
    while not stop.is_set():
        block += 1.0


NEIGHBOURS = {KINDS[1]: arithmetic, KINDS[2]: memory_walk}


class Engine:
    """The 8-rank lockstep simulator stepping a closed-loop workload in this process, pinned."""

    def __init__(self, ranks: int) -> None:
        os.sched_setaffinity(0, {ENGINE_CPU})
        args = bench_args(ranks)
        self.ranks = ranks
        self.driver = LockstepDriver(args)
        self.workload = workload_of(args)
        self.latest = None

    def window(self, seconds: float) -> tuple[float, float]:
        """Rounds per wall second and CPU microseconds per round over one window."""
        rounds, wall, cpu = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - wall < seconds:
            outcomes, _ = self.driver.step_with(self.workload, loads_of(self.latest, self.ranks))
            self.latest = outcomes[0].record or self.latest
            rounds += 1
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        return rounds / wall, cpu / rounds * 1e6


def measure(ranks: int, windows: int, seconds: float) -> dict[str, list[tuple[float, float]]]:
    """Alternating windows with each neighbour kind; the neighbour starts before its window and stops after."""
    engine = Engine(ranks)
    engine.window(1.0)  # warm-up
    context = mp.get_context("fork")
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    for _ in range(windows):
        for kind in KINDS:
            stop, process = context.Event(), None
            if kind in NEIGHBOURS:
                process = context.Process(target=NEIGHBOURS[kind], args=(stop,), daemon=True)
                process.start()
                time.sleep(0.3)  # running before the window opens
            results[kind].append(engine.window(seconds))
            if process is not None:
                stop.set()
                process.join()
    return results


def report(results: dict[str, list[tuple[float, float]]], options: argparse.Namespace, loads: tuple[str, str]) -> str:
    base_rate = statistics.median(rate for rate, _ in results[KINDS[0]])
    base_cpu = statistics.median(cpu for _, cpu in results[KINDS[0]])
    lines = [
        "# A busy neighbour CPU and the engine's round rate",
        "",
        f"Command: `.venv/bin/python -m bench.bench_neighbour --windows {options.windows} "
        f"--seconds {options.seconds:g}`",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}. The lockstep "
        f"simulator ({options.ranks} ranks, the loop `serve`'s simulator process runs, closed loop) pinned to CPU "
        f"{ENGINE_CPU}; on CPU {NEIGHBOUR_CPU}, per window, nothing or one neighbour process sharing nothing with "
        f"it. {options.windows} windows of {options.seconds:g} s per kind, the kinds alternating; medians. "
        f"Load average before: {loads[0]}; after: {loads[1]}.",
        "",
        "| neighbour on the other CPU | rounds/s (median) | ratio to none | engine CPU per round | vs none "
        "| windows (rounds/s) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for kind in KINDS:
        rates = [rate for rate, _ in results[kind]]
        cpu = statistics.median(c for _, c in results[kind])
        lines.append(
            f"| {kind} | {statistics.median(rates):,.0f} | {statistics.median(rates) / base_rate:.3f} | "
            f"{cpu:,.1f} us | {cpu / base_cpu - 1:+.1%} | {', '.join(f'{r:,.0f}' for r in rates)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--windows", type=int, default=12, help="windows per neighbour kind")
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds per window")
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        raise SystemExit("needs two CPUs: one for the engine, one for its neighbour")
    before = load_average()
    results = measure(options.ranks, options.windows, options.seconds)
    text = report(results, options, (before, load_average()))
    print(text)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(text)


if __name__ == "__main__":
    main()
