"""What tracing costs the round rate: the lockstep simulator (8 ranks) with tracing off, at the default
sample rate and at 100%, side by side in one run, exporting to a local OTLP/gRPC receiver; then the
same three for a group of rank processes.

The simulator is the harshest case: its rank-round costs ~30 us of Python, so a per-round cost that is
invisible beside a real forward (milliseconds) shows here. Each configuration runs a closed-loop workload
through the real controller (`serve`'s code path: rank observers, root and request spans) for a fixed
wall window after a warm-up; the configurations alternate, repeated, and the median rate is reported.
The receiver runs in its own process, as a collector would.

    .venv/bin/python -m bench.bench_tracing            # prints and writes bench/results/tracing.md
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from control.host.backends import Backend, ProcessBackend, SimBackend
from control.host.controller import Controller
from control.telemetry.telemetry_cli import (
    DEFAULT_SAMPLE_RATE,
    add_telemetry_args,
    attach_telemetry,
    rank_observer_spec,
    trace_spans_dropped,
)
from engine.config import ServerArgs
from workloads import ClosedLoop, Fixed, Workload

RESULTS = Path(__file__).parent / "results" / "tracing.md"
CONFIGS = (("off", None), ("default", DEFAULT_SAMPLE_RATE), ("100%", 1.0))
WARMUP_ROUNDS = 200
Results = dict[str, list[dict]]
BackendFactory = Callable[[ServerArgs, argparse.Namespace, str], Backend]


def receiver_main(port_out: Any, stop: Any, counts: Any) -> None:
    """A local OTLP/gRPC trace receiver (opentelemetry-proto's TraceService) that counts spans."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            spans = sum(len(s.spans) for rs in request.resource_spans for s in rs.scope_spans)
            with counts.get_lock():
                counts.value += spans
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port_out.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    stop.wait()
    server.stop(0)


def bench_args(ranks: int) -> ServerArgs:
    """The simulated deployment: default preset, gate A=4 / K=16."""
    return ServerArgs(
        executor="sim",
        dp_size=ranks,
        enable_dp_attention=True,
        max_num_seqs=64 * ranks,
        prefill_attempt_interval=4,
        prefill_any_attempt_interval=16,
        seed=7,
    )


def telemetry_ns(endpoint: str, rate: float | None) -> argparse.Namespace:
    """serve's telemetry flags for one configuration (rate None: tracing off)."""
    parser = argparse.ArgumentParser()
    add_telemetry_args(parser)
    # Traces only: the metrics are not what is measured here.
    argv = [] if rate is None else ["--otlp-endpoint", endpoint, "--trace-sample-rate", str(rate)]
    ns = parser.parse_args([*argv, "--no-otlp-metrics"])
    ns.rounds = None
    return ns


async def measure(backend: Backend, args: ServerArgs, ns: argparse.Namespace, run_id: str, window_s: float) -> dict:
    """Rounds per wall and per CPU second of one controller run over the window, and what tracing did."""
    controller = Controller(args, backend, run_id=run_id, stop_when_idle=False)
    await asyncio.get_running_loop().run_in_executor(None, controller.start)
    stop = await attach_telemetry(controller, ns)
    runner = asyncio.create_task(controller.run())
    try:
        while controller.latest is None or controller.latest.round < WARMUP_ROUNDS:
            await asyncio.sleep(0.05)
        first = controller.latest.round
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.sleep(window_s)
        rounds = controller.latest.round - first
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        tracer = next((s for s in getattr(controller.backend, "sinks", []) if hasattr(s, "traced_rounds")), None)
        traced = tracer.traced_rounds / (controller.latest.round + 1) if tracer is not None else 0.0
        dropped = trace_spans_dropped(controller)
        controller.request_stop()
        await runner
    finally:
        await stop()
    return {"rate": rounds / elapsed, "cpu_rate": rounds / cpu, "traced_share": traced, "dropped": dropped}


def sim_backend(args: ServerArgs, ns: argparse.Namespace, run_id: str) -> Backend:
    """The lockstep simulator with a closed loop of 8 clients per rank."""
    spec = rank_observer_spec(ns, run_id, args.dp_size)
    observer, kwargs = spec if spec is not None else (None, None)
    workload = Workload(
        ClosedLoop(8 * args.dp_size), dp_size=args.dp_size, prompt=Fixed(512), output=Fixed(64), seed=args.seed
    )
    return SimBackend(args, workload, observer=observer, observer_kwargs=kwargs)


def process_backend(args: ServerArgs, ns: argparse.Namespace, run_id: str) -> Backend:
    """Rank processes over gloo (sim executor: the round is the real loop and collective, the forward is modelled)."""
    spec = rank_observer_spec(ns, run_id, args.dp_size)
    observer, kwargs = spec if spec is not None else (None, None)
    workload = Workload(
        ClosedLoop(8 * args.dp_size), dp_size=args.dp_size, prompt=Fixed(512), output=Fixed(64), seed=args.seed
    )
    return ProcessBackend(args, workload, observer=observer, observer_kwargs=kwargs)


def run_section(make: BackendFactory, args: ServerArgs, endpoint: str, repeats: int, window_s: float) -> Results:
    """Every configuration `repeats` times, alternating; results by configuration name."""
    results: Results = {name: [] for name, _ in CONFIGS}
    for repeat in range(repeats):
        for name, rate in CONFIGS:
            ns = telemetry_ns(endpoint, rate)
            run_id = f"bench-{make.__name__}-{name}-{repeat}"
            result = asyncio.run(measure(make(args, ns, run_id), args, ns, run_id, window_s))
            results[name].append(result)
            print(f"{make.__name__} {name:>8} #{repeat}: {result['rate']:,.0f} rounds/s", file=sys.stderr, flush=True)
    return results


def table(results: Results, cpu: bool) -> list[str]:
    """One markdown table: medians, ratios to off, each run, traced share, drops."""
    off = statistics.median(r["rate"] for r in results["off"])
    cpu_off = statistics.median(r["cpu_rate"] for r in results["off"])
    head = "| tracing | rounds/s | ratio to off |"
    rule = "| --- | ---: | ---: |"
    if cpu:
        head += " rounds per CPU-s | ratio to off | CPU per round vs off |"
        rule += " ---: | ---: | ---: |"
    lines = [head + " runs (rounds/s) | traced share | spans dropped |", rule + " --- | ---: | ---: |"]
    for name, _ in CONFIGS:
        runs = results[name]
        rate = statistics.median(r["rate"] for r in runs)
        label = name if name != "default" else f"default ({DEFAULT_SAMPLE_RATE:g})"
        line = f"| {label} | {rate:,.0f} | {rate / off:.3f} |"
        if cpu:
            cpu_rate = statistics.median(r["cpu_rate"] for r in runs)
            extra_us = (1 / cpu_rate - 1 / cpu_off) * 1e6
            line += f" {cpu_rate:,.0f} | {cpu_rate / cpu_off:.3f} | {extra_us:+.1f} us |"
        each = ", ".join(f"{r['rate']:,.0f}" for r in runs)
        share = statistics.median(r["traced_share"] for r in runs)
        line += f" {each} | {share:.1%} | {max(r['dropped'] for r in runs):,} |"
        lines.append(line)
    return lines


def report(sim: Results, procs: Results | None, options: argparse.Namespace, received: int, command: str) -> str:
    """The markdown report (also printed)."""
    args = bench_args(options.ranks)
    lines = [
        "# Tracing overhead: round rate with tracing off, at the default sample rate, and at 100%",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}, shared with "
        "other work (wall rates move with it). A local OTLP/gRPC receiver in its own process; traces only. "
        f"Gate A={args.prefill_attempt_interval} K={args.prefill_any_attempt_interval}, closed loop of 8 clients "
        f"per rank, prompts 512, outputs 64. Each run: rounds in a {options.seconds:g} s wall window after "
        f"{WARMUP_ROUNDS} rounds of warm-up; configurations alternate, {options.repeats} repeats, medians shown. "
        "Traced share: rounds the sampling rules picked (always-traced rounds plus the ratio).",
        "",
        f"## Lockstep simulator, {options.ranks} ranks (`SimBackend`, preset {args.sim_preset})",
        "",
        "The harshest case: a simulated rank-round is ~30 us of Python, and the ranks, the controller and the "
        "span exporter share one process. Rounds per CPU-s divides by that process's CPU time, which other "
        "tenants of the machine do not inflate; CPU per round vs off is the tracing cost per round, all ranks.",
        "",
        *table(sim, cpu=True),
    ]
    if procs is not None:
        lines += [
            "",
            f"## Rank processes, {options.process_ranks} ranks over gloo (`ProcessBackend`, sim executor)",
            "",
            "One process per rank as in a real deployment; the round is the rank loop and its all-gather "
            "(the forward is modelled, so a real forward would make tracing's share smaller still).",
            "",
            *table(procs, cpu=False),
        ]
    lines += [
        "",
        f"Spans the receiver got in all: {received:,}.",
        "",
        "Reading: tracing costs per round, not per token: phase marks on every rank (~1.5 us), the sampling "
        "decision (once per round and process), and for each traced round ~4 spans per rank to build and "
        "encode (the OTLP encoder takes ~30-40 us a span, on the exporter thread). In the simulator all of it "
        "lands in one process beside ~30 us rank-rounds; with rank processes each rank pays its own share in "
        "its own process, and the rate moves within the machine's noise at the default rate.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="simulated ranks")
    parser.add_argument("--process-ranks", type=int, default=3, help="rank processes (0: skip that section)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured window per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    port_out, stop, counts = ctx.Queue(), ctx.Event(), ctx.Value("q", 0)
    receiver = ctx.Process(target=receiver_main, args=(port_out, stop, counts), daemon=True)
    receiver.start()
    endpoint = f"http://127.0.0.1:{port_out.get(timeout=60)}"
    try:
        sim = run_section(sim_backend, bench_args(options.ranks), endpoint, options.repeats, options.seconds)
        procs = None
        if options.process_ranks:
            args = bench_args(options.process_ranks)
            procs = run_section(process_backend, args, endpoint, options.repeats, options.seconds)
    finally:
        stop.set()
        receiver.join(10)
    command = " ".join([".venv/bin/python -m bench.bench_tracing", *sys.argv[1:]])
    text = report(sim, procs, options, counts.value, command)
    print(text)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(text)


if __name__ == "__main__":
    main()
