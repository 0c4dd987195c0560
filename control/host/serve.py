"""`prefill-gate serve`: the controller, the engine (rank processes or the simulator) and a workload.

Prints a live one-line progress, ends with a summary, and turns Ctrl-C (or SIGTERM) into an agreed
stop: every rank stops after the same round, the processes exit, and the command exits 0. A second
Ctrl-C kills the ranks at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import TextIO

from control.host.agent import agent_main
from control.host.backends import Backend, ProcessBackend
from control.host.controller import Controller
from control.host.nodes import NodePlan, cluster_driver, node_plan
from control.host.sim_child import SimProcessBackend
from control.telemetry.telemetry_cli import rank_observer_spec
from control.telemetry.trace_status import TraceStatus, summary_lines, trace_status
from engine.config import ServerArgs
from engine.drivers.procs import RankFailure
from engine.metrics import Summary
from workloads import (
    ClosedLoop,
    Fixed,
    OnOff,
    Poisson,
    Skewed,
    TraceData,
    Uniform,
    Workload,
    load_trace_file,
    trace_workload,
)
from workloads.prefix_cache import DEFAULT_CACHE_BLOCKS
from workloads.traces import DEFAULT_TRACE_ROUTER, router_named, trace_window
from workloads.traces import ROUTERS as NAMED_ROUTERS

ROUTERS = (*NAMED_ROUTERS, "skewed")
ARRIVALS = ("poisson", "bursts", "closed", "trace", "none")
DEFAULT_REQUESTS = 200  # synthetic arrivals; a trace replays its whole window

# Extra servers (gRPC, metrics) attach here: each gets the controller and returns a stop coroutine.
Attachment = Callable[[Controller, argparse.Namespace], Awaitable[Callable[[], Awaitable[None]]]]


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """Flags that bound the run and describe its workload."""
    run = parser.add_argument_group("run")
    run.add_argument("--rounds", type=int, default=None, help="stop every rank after this many rounds")
    run.add_argument("--duration", type=float, default=None, help="stop after this many engine-clock seconds")
    run.add_argument("--pace", type=float, default=None, help="sim only: run virtual time at this x wall time")
    run.add_argument(
        "--processes",
        action="store_true",
        help="sim only: run every rank in its own process over a real gloo group (the torch executor always does)",
    )
    run.add_argument("--no-progress", action="store_true", help="do not print the live progress line")
    run.add_argument("--keep-serving", action="store_true", help="keep running when the workload is done")
    load = parser.add_argument_group("workload")
    load.add_argument(
        "--arrival", choices=ARRIVALS, default=None, help="arrival process (default: trace with --trace, else poisson)"
    )
    load.add_argument("--rate", type=float, default=20.0, help="requests/s (poisson, and while on for bursts)")
    load.add_argument("--on-s", type=float, default=0.2, help="bursts: seconds on")
    load.add_argument("--off-s", type=float, default=2.0, help="bursts: seconds off")
    load.add_argument("--concurrency", type=int, default=16, help="closed loop: clients")
    load.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help="replay a trace: Azure LLM 2023 CSV, Mooncake FAST'25 JSONL or prefill-gate JSONL "
        "{t, prompt_len, output_len, [rank], [prefix_hit]}; the format is detected",
    )
    load.add_argument("--trace-speed", type=float, default=1.0, help="trace: arrivals this many times faster")
    load.add_argument("--trace-start", type=float, default=0.0, help="trace: window start, in trace seconds")
    load.add_argument(
        "--trace-duration", type=float, default=None, help="trace: window length in trace seconds (default: to the end)"
    )
    load.add_argument(
        "--prefix-cache-blocks",
        type=int,
        default=DEFAULT_CACHE_BLOCKS,
        help="trace with prefix blocks (Mooncake): per-rank LRU cache of that many 512-token blocks (0: off)",
    )
    load.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"requests in all (0: unbounded; default {DEFAULT_REQUESTS}, or the whole trace window)",
    )
    load.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (fixed)")
    load.add_argument("--prompt-len-max", type=int, default=None, help="prompt tokens uniform up to this")
    load.add_argument("--output-len", type=int, default=32, help="output tokens (fixed)")
    load.add_argument("--output-len-max", type=int, default=None, help="output tokens uniform up to this")
    load.add_argument(
        "--router",
        "--routing",
        dest="routing",
        choices=ROUTERS,
        default=None,
        help=f"how requests pick a rank (default: {DEFAULT_TRACE_ROUTER} for a trace, else round-robin); "
        "prefix-affinity is SGLang's cache-aware router over the ranks' prefix caches",
    )
    load.add_argument("--skew", type=float, default=4.0, help="skewed routing: rank 0 gets this x traffic")
    load.add_argument("--prefix-hit-prob", type=float, default=0.0, help="share of prompts with a storage hit")


def load_trace_arg(ns: argparse.Namespace) -> TraceData | None:
    """The trace `--trace` names, read and checked (TraceError, a ValueError, on a malformed file)."""
    if ns.trace is None:
        if ns.arrival == "trace":
            raise ValueError("--arrival trace needs --trace FILE")
        for flag, value, default in (
            ("--trace-speed", ns.trace_speed, 1.0),
            ("--trace-start", ns.trace_start, 0.0),
            ("--trace-duration", ns.trace_duration, None),
        ):
            if value != default:
                raise ValueError(f"{flag} needs --trace FILE")
        return None
    if ns.arrival not in (None, "trace"):
        raise ValueError(f"--trace replays the file's arrivals; it cannot be combined with --arrival {ns.arrival}")
    return load_trace_file(ns.trace)


def build_workload(ns: argparse.Namespace, args: ServerArgs, trace: TraceData | None = None) -> Workload | None:
    """The workload the flags describe; raises ValueError with the flag in the message."""
    requests = DEFAULT_REQUESTS if ns.requests is None and ns.trace is None else (ns.requests or 0)
    if requests < 0:
        raise ValueError(f"--requests must be >= 0, got {requests}")
    if ns.prefix_cache_blocks < 0:
        raise ValueError(f"--prefix-cache-blocks must be >= 0, got {ns.prefix_cache_blocks}")
    if ns.trace is not None:
        data = trace if trace is not None else load_trace_file(ns.trace)
        if ns.routing == "skewed":
            known = ", ".join(NAMED_ROUTERS)
            raise ValueError(f"--router skewed is for synthetic arrivals; a trace takes one of {known}")
        return trace_workload(
            data,
            speed=ns.trace_speed,
            start=ns.trace_start,
            duration=ns.trace_duration,
            router=ns.routing or DEFAULT_TRACE_ROUTER,
            dp_size=args.dp_size,
            seed=args.seed,
            # The torch executor has no storage tier to serve a cached prefix from (RequestSpec.prefix_hit).
            cache_blocks=ns.prefix_cache_blocks if args.executor == "sim" else 0,
            limit=requests or None,
            token_ids=args.executor == "torch",
            vocab=args.model_vocab,
        )
    arrival = ns.arrival or "poisson"
    if arrival == "none":
        return None
    if arrival == "poisson":
        arrivals = Poisson(ns.rate)
    elif arrival == "bursts":
        arrivals = OnOff(rate=ns.rate, on_s=ns.on_s, off_s=ns.off_s)
    else:
        arrivals = ClosedLoop(ns.concurrency)
    routing = ns.routing or "round-robin"
    router = Skewed(weight=ns.skew, rank=0) if routing == "skewed" else router_named(routing)
    prompt = Uniform(ns.prompt_len, ns.prompt_len_max) if ns.prompt_len_max else Fixed(ns.prompt_len)
    output = Uniform(ns.output_len, ns.output_len_max) if ns.output_len_max else Fixed(ns.output_len)
    return Workload(
        arrivals,
        dp_size=args.dp_size,
        prompt=prompt,
        output=output,
        router=router,
        seed=args.seed,
        limit=requests or None,
        prefix_hit_prob=ns.prefix_hit_prob,
        token_ids=args.executor == "torch",
        vocab=args.model_vocab,
    )


def describe_trace(ns: argparse.Namespace, data: TraceData, args: ServerArgs) -> str:
    """What `serve` prints before replaying a trace: what it is, which part of it runs how, and how many of
    its requests no rank's pool could ever hold (they will be refused)."""
    end = "the end" if ns.trace_duration is None else f"{ns.trace_start + ns.trace_duration:g} s"
    lines = [
        f"trace {data.describe()}",
        f"  replaying trace seconds {ns.trace_start:g} to {end} at {ns.trace_speed:g}x, "
        f"router {ns.routing or DEFAULT_TRACE_ROUTER}",
    ]
    if data.block_tokens and (args.executor != "sim" or ns.prefix_cache_blocks == 0):
        why = "--prefix-cache-blocks is 0" if args.executor == "sim" else "the torch executor has no storage tier"
        lines.append(f"  note: the trace's prefix blocks give no hits here: {why}")
    capacity = args.kv_pages * args.page_size
    window = trace_window(data, speed=ns.trace_speed, start=ns.trace_start, duration=ns.trace_duration)
    too_long = sum(1 for a in window if (a.prompt_len or 0) + (a.output_len or 0) > capacity)
    if too_long:
        lines.append(
            f"  note: {too_long} of the window's {len(window)} requests need more than a rank's pool of "
            f"{capacity:,} tokens (--kv-pages x --page-size) and will be refused; raise --kv-pages to run them"
        )
    return "\n".join(lines)


def check_run_args(ns: argparse.Namespace, args: ServerArgs) -> None:
    """Refuse run bounds and roles that could only end in a silent, useless run."""
    for flag, value in (("--rounds", ns.rounds), ("--duration", ns.duration), ("--pace", ns.pace)):
        if value is not None and not value > 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    if args.disaggregation_mode == "decode":
        raise ValueError(
            "--disaggregation-mode decode needs a prefill peer to hand it prompts, which `serve` does not run: "
            "its requests could never finish"
        )


def build_backend(
    args: ServerArgs, workload: Workload | None, ns: argparse.Namespace, run_id: str, nodes: NodePlan | None = None
) -> Backend:
    """Rank processes for the torch executor, the lockstep simulator (in a child process of its own, so
    that the control plane's streams never take the engine's interpreter lock) for `--executor sim`; with
    `nodes`, node 0's ranks and a link to every other node's agent."""
    spec = rank_observer_spec(ns, run_id, args.dp_size)  # None: tracing off, no observer at all
    observer, observer_kwargs = spec if spec is not None else (None, None)
    if args.executor == "sim" and not ns.processes:
        return SimProcessBackend(
            args, workload, pace=ns.pace, max_rounds=ns.rounds, observer=observer, observer_kwargs=observer_kwargs
        )
    if ns.pace is not None:
        raise ValueError("--pace applies to the in-process simulator only (--executor sim without --processes)")
    driver = None
    if nodes is not None:
        driver = cluster_driver(
            args, nodes, ns, run_id, max_rounds=ns.rounds, observer=observer, observer_kwargs=observer_kwargs
        )
    return ProcessBackend(
        args,
        workload,
        max_rounds=ns.rounds,
        observer=observer,
        observer_kwargs=observer_kwargs,
        vote_log_dir=getattr(ns, "vote_log_dir", None),
        driver=driver,
    )


def format_summary(summary: Summary, simulated: bool, tracing: TraceStatus | None = None) -> str:
    """The closing summary, a few lines (and tracing's, when it was on)."""

    def ms(value: float | None) -> str:
        return f"{value * 1e3:.1f} ms" if value is not None else "-"

    def share(value: float | None) -> str:
        return f"{value:.1%}" if value is not None else "-"

    label = " (SIMULATED: virtual clock of the cost model)" if simulated else ""
    tps = f"{summary.output_tokens_per_s:,.1f}" if summary.output_tokens_per_s is not None else "-"
    return "\n".join(
        [
            f"summary{label}",
            f"  rounds {summary.rounds}  elapsed {summary.elapsed_s:.2f} s  requests finished "
            f"{summary.requests_finished}/{summary.requests_submitted} (aborted {summary.requests_aborted}, "
            f"refused {summary.requests_refused}, cut off {summary.requests_cut_off})",
            f"  output tokens/s {tps}",
            f"  TTFT p50 {ms(summary.ttft_p50_s)}  p99 {ms(summary.ttft_p99_s)}",
            f"  ITL  p50 {ms(summary.itl_p50_s)}  p99 {ms(summary.itl_p99_s)}",
            f"  rounds on the extend path {share(summary.extend_round_share)}  "
            f"ranks extending per extend round {summary.mean_ranks_extending or 0:.2f}",
            f"  windows opened by ANY {summary.windows_any}  by ALL {summary.windows_all}  "
            f"gate wait p99 {summary.gate_wait_p99_rounds or 0:.0f} rounds",
            f"  prefix hits {summary.prefix_hit_requests}/{summary.requests_submitted} requests  "
            f"{summary.prefix_hit_tokens:,} of {summary.prompt_tokens:,} prompt tokens "
            f"({share(summary.prefix_hit_share)}) served from cache",
            *(summary_lines(tracing) if tracing is not None else []),
        ]
    )


async def run_serve(
    controller: Controller,
    ns: argparse.Namespace,
    attachments: list[Attachment] = (),  # type: ignore[assignment]
    out: TextIO = sys.stdout,
) -> int:
    """Start the engine and what is attached, pump until stopped; returns the exit code."""
    loop = asyncio.get_running_loop()
    interrupts = 0

    def on_signal() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            print("\nstopping: every rank stops after the same round (Ctrl-C again to kill)", file=out, flush=True)
            controller.request_stop()
        else:
            controller.kill()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    # From this (the main) thread: the kernel ties each rank's parent-death signal to the thread that
    # spawned it, and an executor thread could end before the ranks do.
    controller.start()
    pids = getattr(controller.backend, "pids", None)
    if pids:
        print(f"started {len(pids)} rank processes: pids {' '.join(map(str, pids))}", file=out, flush=True)
    try:
        stops = [await attach(controller, ns) for attach in attachments]
    except (OSError, ValueError):
        controller.backend.close()  # a busy port must not leave rank processes behind
        raise
    progress = None
    if not ns.no_progress:
        progress = asyncio.create_task(_progress(controller, out))
    try:
        await controller.run()
    finally:
        if progress is not None:
            progress.cancel()
        for stop in stops:
            await stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    summary = format_summary(controller.summary(), controller.args.executor == "sim", trace_status(controller))
    print("\n" + summary, file=out, flush=True)
    if controller.failure:  # a kill (a second Ctrl-C) is no agreed stop: what it cut off is not a success
        print(f"\nerror: {controller.failure}", file=sys.stderr, flush=True)
        return 1
    return 0


async def _progress(controller: Controller, out: TextIO) -> None:
    tty = out.isatty()
    while True:
        await asyncio.sleep(0.5)
        line = controller.progress_line()
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=out, flush=True)


def serve_main(ns: argparse.Namespace, parser: argparse.ArgumentParser, attachments: list[Attachment]) -> int:
    """Entry of `prefill-gate serve` after parsing."""
    run_id = uuid.uuid4().hex[:12]  # the ranks derive every round's trace id from it
    try:
        args = ServerArgs.from_cli_args(ns)
        check_run_args(ns, args)
        nodes, args = node_plan(ns, args)
        if nodes is not None and not nodes.is_controller:
            return agent_main(ns, args, nodes)
        trace = load_trace_arg(ns)
        if trace is not None:
            print(describe_trace(ns, trace, args), flush=True)
        workload = build_workload(ns, args, trace)
        backend = build_backend(args, workload, ns, run_id, nodes)
    except (ValueError, OSError) as exc:
        # The whole usage of ~50 flags would bury the one line that matters.
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    controller = Controller(args, backend, run_id=run_id, duration=ns.duration, stop_when_idle=not ns.keep_serving)
    try:
        return asyncio.run(run_serve(controller, ns, attachments))
    except (OSError, ValueError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    except RankFailure as exc:
        backend.close()
        # What the run did before it failed, every request accounted for (cut off included).
        print("\n" + format_summary(controller.summary(), args.executor == "sim"), flush=True)
        print(f"\nerror: {exc}", file=sys.stderr, flush=True)
        if exc.detail and os.environ.get("PREFILL_GATE_DEBUG"):
            print(exc.detail, file=sys.stderr, flush=True)  # the rank's traceback, for developers
        return 1
