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

from control.host.backends import Backend, ProcessBackend, SimBackend
from control.host.controller import Controller
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
    RoundRobin,
    ShortestQueue,
    Skewed,
    Trace,
    Uniform,
    Workload,
    load_trace,
)

ROUTERS = ("round-robin", "shortest-queue", "skewed")
ARRIVALS = ("poisson", "bursts", "closed", "trace", "none")

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
    load.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="arrival process")
    load.add_argument("--rate", type=float, default=20.0, help="requests/s (poisson, and while on for bursts)")
    load.add_argument("--on-s", type=float, default=0.2, help="bursts: seconds on")
    load.add_argument("--off-s", type=float, default=2.0, help="bursts: seconds off")
    load.add_argument("--concurrency", type=int, default=16, help="closed loop: clients")
    load.add_argument("--trace", default=None, help="JSONL trace of {t, prompt_len, output_len, [rank], [prefix_hit]}")
    load.add_argument("--requests", type=int, default=200, help="requests in all (0: unbounded)")
    load.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (fixed)")
    load.add_argument("--prompt-len-max", type=int, default=None, help="prompt tokens uniform up to this")
    load.add_argument("--output-len", type=int, default=32, help="output tokens (fixed)")
    load.add_argument("--output-len-max", type=int, default=None, help="output tokens uniform up to this")
    load.add_argument("--routing", choices=ROUTERS, default="round-robin", help="how requests pick a rank")
    load.add_argument("--skew", type=float, default=4.0, help="skewed routing: rank 0 gets this x traffic")
    load.add_argument("--prefix-hit-prob", type=float, default=0.0, help="share of prompts with a storage hit")


def build_workload(ns: argparse.Namespace, args: ServerArgs) -> Workload | None:
    """The workload the flags describe; raises ValueError with the flag in the message."""
    if ns.arrival == "none":
        return None
    if ns.arrival == "poisson":
        arrivals = Poisson(ns.rate)
    elif ns.arrival == "bursts":
        arrivals = OnOff(rate=ns.rate, on_s=ns.on_s, off_s=ns.off_s)
    elif ns.arrival == "closed":
        arrivals = ClosedLoop(ns.concurrency)
    else:
        if not ns.trace:
            raise ValueError("--arrival trace needs --trace FILE")
        arrivals = Trace(load_trace(ns.trace))
    routers = {"round-robin": RoundRobin(), "shortest-queue": ShortestQueue(), "skewed": Skewed(weight=ns.skew, rank=0)}
    prompt = Uniform(ns.prompt_len, ns.prompt_len_max) if ns.prompt_len_max else Fixed(ns.prompt_len)
    output = Uniform(ns.output_len, ns.output_len_max) if ns.output_len_max else Fixed(ns.output_len)
    if ns.requests < 0:
        raise ValueError(f"--requests must be >= 0, got {ns.requests}")
    return Workload(
        arrivals,
        dp_size=args.dp_size,
        prompt=prompt,
        output=output,
        router=routers[ns.routing],
        seed=args.seed,
        limit=ns.requests or None,
        prefix_hit_prob=ns.prefix_hit_prob,
        token_ids=args.executor == "torch",
        vocab=args.model_vocab,
    )


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


def build_backend(args: ServerArgs, workload: Workload | None, ns: argparse.Namespace, run_id: str) -> Backend:
    """Rank processes for the torch executor, the lockstep simulator for `--executor sim`."""
    spec = rank_observer_spec(ns, run_id, args.dp_size)  # None: tracing off, no observer at all
    observer, observer_kwargs = spec if spec is not None else (None, None)
    if args.executor == "sim" and not ns.processes:
        return SimBackend(
            args, workload, pace=ns.pace, max_rounds=ns.rounds, observer=observer, observer_kwargs=observer_kwargs
        )
    if ns.pace is not None:
        raise ValueError("--pace applies to the in-process simulator only (--executor sim without --processes)")
    return ProcessBackend(args, workload, max_rounds=ns.rounds, observer=observer, observer_kwargs=observer_kwargs)


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
            f"refused {summary.requests_refused})",
            f"  output tokens/s {tps}",
            f"  TTFT p50 {ms(summary.ttft_p50_s)}  p99 {ms(summary.ttft_p99_s)}",
            f"  ITL  p50 {ms(summary.itl_p50_s)}  p99 {ms(summary.itl_p99_s)}",
            f"  rounds on the extend path {share(summary.extend_round_share)}  "
            f"ranks extending per extend round {summary.mean_ranks_extending or 0:.2f}",
            f"  windows opened by ANY {summary.windows_any}  by ALL {summary.windows_all}  "
            f"gate wait p99 {summary.gate_wait_p99_rounds or 0:.0f} rounds",
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
        workload = build_workload(ns, args)
        backend = build_backend(args, workload, ns, run_id)
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
        print(f"\nerror: {exc}", file=sys.stderr, flush=True)
        if exc.detail and os.environ.get("PREFILL_GATE_DEBUG"):
            print(exc.detail, file=sys.stderr, flush=True)  # the rank's traceback, for developers
        return 1
