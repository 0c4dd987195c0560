"""What tracing costs the round rate: the in-process simulator (8 ranks) with tracing off, at the default
sampling and at 100%, side by side in one run, exporting to a local OTLP/gRPC receiver; then the same
three for a group of rank processes; then the span exporter's own capacity.

The simulator is the harshest case: its rank-round costs ~30 us of Python, so a per-round cost that is
invisible beside a real forward (milliseconds) shows here. Each configuration runs a closed-loop workload
through the real controller (`serve`'s code path: `build_backend`, rank observers, root and request
spans) for a fixed wall window after a warm-up; the configurations alternate, repeated, and the median
rate is reported. The receiver runs in its own process, as a collector would, and counts what it got.
Backends are built by `serve`'s own `build_backend`, so the bench follows wherever `serve` runs the
simulator (in the controller's process, or in a child process of its own): the CPU figures count this
process and its children (less the receiver's), and the report names the backend measured.

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

from control.host.backends import Backend, loads_of
from control.host.controller import Controller
from control.host.serve import build_backend
from control.telemetry.otlp_wire import KIND_INTERNAL, SpanData, producer
from control.telemetry.telemetry_cli import (
    DEFAULT_SAMPLE_RATE,
    DEFAULT_WINDOW_SAMPLE_RATE,
    add_telemetry_args,
    attach_telemetry,
)
from control.telemetry.trace_export import (
    DropCounter,
    OtlpSender,
    ShipperConfig,
    SpanShipper,
    close_shared,
    parse_otlp_endpoint,
)
from control.telemetry.trace_status import trace_status
from control.telemetry.tracing import forget_run, new_span_id, rank_observer, rank_resource
from engine.config import ServerArgs
from engine.drivers.lockstep import LockstepDriver
from workloads import ClosedLoop, Fixed, Workload

RESULTS = Path(__file__).parent / "results" / "tracing.md"
# (name, --trace-sample-rate, --trace-window-sample-rate); None: tracing off.
CONFIGS = (
    ("off", None, None),
    ("default", DEFAULT_SAMPLE_RATE, DEFAULT_WINDOW_SAMPLE_RATE),
    ("100%", 1.0, 1.0),
)
# The paired section's configurations: also both rates 0, where nothing is traced (the decisions and the
# hooks alone, what every round pays), and the default sampling as the code before the telemetry issue's
# last change ran it (`PREVIOUS`), side by side with today's.
PREVIOUS = "previous"
PAIRED = (CONFIGS[1], (PREVIOUS, *CONFIGS[1][1:]), ("rates 0", 0.0, 0.0), CONFIGS[2])
# What `PREVIOUS` ran differently: the simulated ranks decided every rule themselves (now the controller
# traces the rounds only a rule picks, `leave_rule_rounds_to_controller`), and spans left every 1 s (now 5 s).
PREVIOUS_BATCH_S = 1.0
# The per-rank paired variant (each rank's own hooks, as in a rank process): at the defaults and both rates 0.
PER_RANK = (CONFIGS[1], ("rates 0", 0.0, 0.0))
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


def telemetry_ns(endpoint: str, rate: float | None, window: float | None, processes: bool) -> argparse.Namespace:
    """serve's telemetry and run flags for one configuration (rate None: tracing off)."""
    parser = argparse.ArgumentParser()
    add_telemetry_args(parser)
    # Traces only: the metrics are not what is measured here.
    argv = [] if rate is None else ["--otlp-endpoint", endpoint, "--trace-sample-rate", str(rate)]
    if window is not None:
        argv += ["--trace-window-sample-rate", str(window)]
    ns = parser.parse_args([*argv, "--no-otlp-metrics"])
    ns.rounds, ns.pace, ns.processes = None, None, processes
    return ns


TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of one live process (/proc, Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def tree_cpu_s(exclude: set[int]) -> float:
    """CPU seconds (user + system) of this process and its live descendants, less the `exclude`d
    processes' subtrees: the controller, and the simulator wherever `serve` put it (/proc, Linux)."""
    parent_of: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parent_of[int(entry)] = int(fields[1])
        ticks[int(entry)] = int(fields[11]) + int(fields[12])  # utime, stime
    own = os.getpid()
    total = 0
    for pid in ticks:
        ancestor = pid
        while ancestor not in (own, 0, 1) and ancestor not in exclude:
            ancestor = parent_of.get(ancestor, 0)
        if ancestor == own and pid not in exclude:
            total += ticks[pid]
    return total / TICKS


async def measure(
    backend: Backend, args: ServerArgs, ns: argparse.Namespace, run_id: str, window_s: float, exclude: set[int]
) -> dict:
    """Rounds per wall and per CPU second of one controller run over the window, and what tracing did."""
    controller = Controller(args, backend, run_id=run_id, stop_when_idle=False)
    await asyncio.get_running_loop().run_in_executor(None, controller.start)
    engine = getattr(backend, "pid", None) or os.getpid()  # the process stepping the simulated ranks
    stop = await attach_telemetry(controller, ns)
    runner = asyncio.create_task(controller.run())
    try:
        while controller.latest is None or controller.latest.round < WARMUP_ROUNDS:
            await asyncio.sleep(0.05)
        first = controller.latest.round
        started, cpu, engine_cpu = time.perf_counter(), tree_cpu_s(exclude), process_cpu_s(engine)
        await asyncio.sleep(window_s)
        rounds = controller.latest.round - first
        elapsed, cpu = time.perf_counter() - started, tree_cpu_s(exclude) - cpu
        engine_cpu = process_cpu_s(engine) - engine_cpu
        controller.request_stop()
        await runner
    finally:
        await stop()  # flushes and closes the exporters: the counts below are final
    status = trace_status(controller)
    return {
        "rate": rounds / elapsed,
        "cpu_rate": rounds / cpu,
        "engine_cpu_rate": rounds / engine_cpu,
        "traced_share": status.traced_share or 0.0,
        "dropped": status.spans_dropped,
        # Every rank's count final (its exporter drained before it reported); trivially so with tracing off.
        "final": status.ranks_final or not status.enabled,
        "untraced_requests": status.requests_untraced,
        "backend": type(backend).__name__,
    }


def workload_of(args: ServerArgs) -> Workload:
    """A closed loop of 8 clients per rank, prompts 512, outputs 64."""
    return Workload(
        ClosedLoop(8 * args.dp_size), dp_size=args.dp_size, prompt=Fixed(512), output=Fixed(64), seed=args.seed
    )


def run_section(
    args: ServerArgs, processes: bool, endpoint: str, repeats: int, window_s: float, received: Any, receiver: int
) -> Results:
    """Every configuration `repeats` times, alternating; results by configuration name."""
    results: Results = {name: [] for name, _, _ in CONFIGS}
    label = "processes" if processes else "simulator"
    for repeat in range(repeats):
        for name, rate, window in CONFIGS:
            ns = telemetry_ns(endpoint, rate, window, processes)
            run_id = f"bench-{label}-{name}-{repeat}"
            before = received.value
            backend = build_backend(args, workload_of(args), ns, run_id)  # serve's own choice of backend
            result = asyncio.run(measure(backend, args, ns, run_id, window_s, {receiver}))
            result["received"] = received.value - before
            results[name].append(result)
            print(
                f"{label} {name:>8} #{repeat}: {result['rate']:,.0f} rounds/s, traced {result['traced_share']:.1%}, "
                f"dropped {result['dropped']:,}",
                file=sys.stderr,
                flush=True,
            )
    return results


def paired_overhead(
    endpoint: str,
    ranks: int,
    rate: float,
    window: float,
    pairs: int,
    block: int,
    per_rank: bool = False,
    previous: bool = False,
) -> dict:
    """What tracing costs the simulator's own process, measured so that both the machine's other tenants
    and the workload's own variation cancel out: two identical lockstep groups (in this process, as
    `SimBackend` steps them; same arguments, same seeded workload, so the same rounds: the simulator is
    deterministic and tracing only observes), one with its ranks' observers attached, one without, step
    the same `block` rounds one after the other, `pairs` times (which goes first alternates). The main
    thread's CPU time of the traced group's block (the ranks' hooks, spans built, phases timed) less the
    untraced group's for the same rounds is the hooks' cost in that block. The exporter's thread and
    gRPC's work whenever spans are queued; all CPU time of this process outside the main thread is
    charged to tracing, per traced round (an upper bound: nothing else runs here).

    The cost per round is the mean of the blocks' differences, not their median: at the default rates a
    round is traced about once in 170, so most 100-round blocks hold no traced round and some hold one
    or two, and the median of such a skewed mixture is a block with no traced round (or one), not the
    cost per round. The median is kept beside it (`hooks_median_us`). (Before: one group, attached and
    detached every block, its traced blocks against the next untraced block: different rounds, whose
    own CPU time varies by ~15% from block to block, which drowned a few-us cost in noise.)

    `per_rank`: each rank's observer built as a rank process builds its own (`rank_observer` in a process
    with no other rank's sampler: each rank its own `RoundSampler`), so the driver finds no group observer
    and every rank calls its observer's two hooks itself, as `serve --processes` ranks do; the figures are
    also given per rank-round. Otherwise the ranks leave the rules' rounds to the controller, as in
    `serve`'s simulator process (the controller's work is in another process, and not counted here);
    `previous`: they decide every rule, and spans leave every `PREVIOUS_BATCH_S`, as before that change."""
    args = bench_args(ranks)
    run_id = f"bench-paired-{'rank-' if per_rank else ''}{rate:g}-{window:g}"
    traced_group, untraced_group = LockstepDriver(args), LockstepDriver(args)
    kwargs: dict[str, Any] = {"endpoint": endpoint, "run_id": run_id, "sample_rate": rate, "window_sample_rate": window}
    if previous:
        kwargs["schedule_delay_s"] = PREVIOUS_BATCH_S
    tracers = []
    for engine in traced_group.engines:
        if per_rank:
            forget_run(run_id)  # a rank process's own: no sampler of another rank to share
        tracers.append(rank_observer(engine, **kwargs))
        if not per_rank and not previous:  # as in `serve`'s simulator process: the rules' rounds are the controller's
            tracers[-1].leave_rule_rounds_to_controller()
        engine.observer = tracers[-1]
        if per_rank:  # no group observer to arm the timers
            engine.timer = tracers[-1].timer
    groups = {traced_group: [workload_of(args), None], untraced_group: [workload_of(args), None]}

    def steps(driver: LockstepDriver, count: int) -> float:
        workload, latest = groups[driver]
        started = time.thread_time()
        for _ in range(count):
            outcomes, _ = driver.step_with(workload, loads_of(latest, ranks))
            latest = outcomes[0].record or latest
        groups[driver][1] = latest
        return time.thread_time() - started

    for driver in groups:
        steps(driver, WARMUP_ROUNDS)
    differences, off_blocks, traced_rounds = [], [], 0
    main, process = time.thread_time(), time.process_time()
    for pair in range(pairs):
        if pair % 2:
            untraced = steps(untraced_group, block)
            traced = steps(traced_group, block)
        else:
            traced = steps(traced_group, block)
            untraced = steps(untraced_group, block)
        differences.append(traced - untraced)
        off_blocks.append(untraced)
        traced_rounds += block
    if (traced_group.observer is None) != per_rank:  # the path measured is the one named
        raise RuntimeError(f"the driver {'used' if per_rank else 'did not use'} a group observer")
    tracers[0].flush()  # the exporter's work for the traced blocks is done, and counted below
    others = (time.process_time() - process) - (time.thread_time() - main)  # every thread but this one
    forget_run(run_id)
    close_shared(parse_otlp_endpoint(endpoint))  # no idle exporter left to count against the next one
    off = statistics.median(off_blocks) / block
    hooks = statistics.fmean(differences) / block
    exporter = others / traced_rounds
    return {
        "off_us": off * 1e6,
        "hooks_us": hooks * 1e6,
        "hooks_median_us": statistics.median(differences) / block * 1e6,
        # The mean's standard error: how far the hooks' figure may be off by chance.
        "hooks_se_us": statistics.stdev(differences) / len(differences) ** 0.5 / block * 1e6,
        "exporter_us": exporter * 1e6,
        "overhead": (hooks + exporter) / off,
        "spans": sum(tracer.counter.offered for tracer in tracers),
        "dropped": sum(tracer.dropped for tracer in tracers),
        "ranks": ranks,
        # Per rank-round: the group's figures over its ranks (every rank steps in this one main thread).
        "rank_off_us": off / ranks * 1e6,
        "rank_hooks_us": hooks / ranks * 1e6,
        "rank_exporter_us": exporter / ranks * 1e6,
    }


def rank_tree(round_: int, rank: int) -> list[SpanData]:
    """The 4 spans a traced rank exports for one round, with the tracer's attributes."""
    start = time.time_ns()
    own = new_span_id()
    attributes = {
        "gate.rank": rank,
        "gate.round": round_,
        "gate.point": "ALL",
        "gate.open": True,
        "gate.counter": 3,
        "gate.want_prefill": True,
        "gate.has_decode_work": True,
        "gate.occupancy": 0.4375,
        "gate.config_epoch": 0,
    }
    children = (
        ("plan", {"gate.batch_size": 8, "gate.num_extends": 1, "gate.prefill_tokens": 512}),
        ("all-gather", {"gate.lockstep": True}),
        ("forward", {"gate.dispatch": "NORMAL"}),
    )
    spans = [
        SpanData(round_, own, 7, "gate.round", KIND_INTERNAL, start, start + 30_000, attributes, parent_remote=True)
    ]
    spans += [
        SpanData(round_, new_span_id(), own, name, KIND_INTERNAL, start, start + 10_000, a) for name, a in children
    ]
    return spans


def exporter_capacity(endpoint: str, seconds: float) -> dict:
    """Spans per second one shipper delivers while a producer keeps its queue full, and the CPU the
    exporter (its thread and gRPC's) spends per span: the process's CPU time less the producer's."""
    target = parse_otlp_endpoint(endpoint)  # its loss line names the section: its queue is kept full on purpose
    shipper = SpanShipper(OtlpSender(target), ShipperConfig(max_queue_spans=65536), f"{target.url} (capacity section)")
    who = producer(rank_resource("bench-capacity", 0, 8), "prefill_gate.tracing", "bench")
    counter = DropCounter()
    trees = [rank_tree(r + 1, r % 8) for r in range(2048)]  # built once: the exporter is what is measured
    started, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    index = 0
    while time.perf_counter() - started < seconds:
        if shipper.offer(trees[index % len(trees)], who, counter):
            index += 1
        else:
            time.sleep(0.002)  # full: let the exporter drain
    exported = counter.exported
    elapsed = time.perf_counter() - started
    exporter_cpu = (time.process_time() - cpu) - (time.thread_time() - own)
    shipper.close(5.0)
    return {
        "spans_per_s": exported / elapsed,
        "exporter_us_per_span": exporter_cpu / max(exported, 1) * 1e6,
        "exported": exported,
    }


def table(results: Results, engine: str) -> list[str]:
    """One markdown table: medians, ratios to off, CPU per round (median and best run), each run, traced
    share, drops. `engine`: what the first CPU column measures (the simulator's process, or the controller's)."""
    off = statistics.median(r["rate"] for r in results["off"])
    lines = [
        f"| tracing | rounds/s | ratio to off | {engine}: CPU per round | vs off | best run vs off "
        "| all processes: CPU per round | vs off | best run vs off | runs (rounds/s) | traced share "
        "| spans dropped | spans received |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for name, _, _ in CONFIGS:
        runs = results[name]
        rate = statistics.median(r["rate"] for r in runs)
        line = f"| {config_label(name)} | {rate:,.0f} | {rate / off:.3f} |"
        for key in ("engine_cpu_rate", "cpu_rate"):
            per_round = 1e6 / statistics.median(r[key] for r in runs)
            per_round_off = 1e6 / statistics.median(r[key] for r in results["off"])
            best = 1e6 / max(r[key] for r in runs)  # the run least disturbed by the machine's other tenants
            best_off = 1e6 / max(r[key] for r in results["off"])
            line += f" {per_round:,.1f} us | {per_round / per_round_off - 1:+.1%} | {best / best_off - 1:+.1%} |"
        each = ", ".join(f"{r['rate']:,.0f}" for r in runs)
        share = statistics.median(r["traced_share"] for r in runs)
        dropped = f"{sum(r['dropped'] for r in runs):,}"
        unfinished = sum(not r["final"] for r in runs)
        if unfinished:
            dropped += f" (not final in {unfinished} run{'s' if unfinished > 1 else ''})"
        line += f" {each} | {share:.1%} | {dropped} | {sum(r['received'] for r in runs):,} |"
        lines.append(line)
    return lines


def report(
    sim: Results,
    procs: Results | None,
    paired: dict[str, dict],
    capacity: dict | None,
    options: argparse.Namespace,
    command: str,
    loads: tuple[str, str] = ("?", "?"),
    per_rank: dict[str, dict] | None = None,
) -> str:
    """The markdown report (also printed); `loads`: the load average before and after the run; `per_rank`:
    the paired section's per-rank variant (`paired_overhead(per_rank=True)`), by configuration."""
    args = bench_args(options.ranks)
    backend = sim["off"][0]["backend"]
    where = "a child process of the controller's" if backend == "SimProcessBackend" else "the controller's process"
    lines = [
        "# Tracing overhead: round rate with tracing off, at the default sampling, and at 100%",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}, shared with "
        "other developers' builds and tests while this ran (wall rates move with them; ratios are measured side "
        "by side, configurations alternating). A local OTLP/gRPC receiver in its own process; traces only. "
        f"Gate A={args.prefill_attempt_interval} K={args.prefill_any_attempt_interval}, closed loop of 8 clients "
        f"per rank, prompts 512, outputs 64. Each run: rounds in a {options.seconds:g} s wall window after "
        f"{WARMUP_ROUNDS} rounds of warm-up; {options.repeats} repeats, medians shown. Default sampling: "
        f"`--trace-sample-rate {DEFAULT_SAMPLE_RATE:g} --trace-window-sample-rate {DEFAULT_WINDOW_SAMPLE_RATE:g}`. "
        "Traced share: rounds the sampling rules picked over rounds the controller saw. Spans dropped: not "
        "confirmed delivered (queue full, collector error, no answer), summed over the repeats, counted after "
        "each run's exporters flushed (\"not final\": some rank's exporter had not drained when it reported, "
        "so spans it lost later are missing from the figure); spans received: what the receiver got in "
        "those runs.",
        "",
        f"Load average (1, 5, 15 min) before the run: {loads[0]}; after it: {loads[1]}.",
        "",
        f"## Lockstep simulator, {options.ranks} ranks (`serve --executor sim`, preset {args.sim_preset})",
        "",
        f"Backend: `{backend}` (the simulated ranks step in {where}). The harshest case: a simulated rank-round "
        "is ~30 us of Python, and the ranks share one interpreter with their span exporter. CPU per round "
        "(medians) divides CPU time by rounds, which other tenants of the machine inflate far less than wall "
        "time: the simulator's process (its ranks and their exporter: what bounds its round rate), and all "
        "processes (the controller's tree, the receiver's excluded; it includes the controller's root and "
        "request spans and, with the simulator in a child, the controller's polling, which runs whether or "
        "not rounds do). Best run vs off: the lowest CPU per round of each configuration's runs against off's "
        "lowest; the machine's other tenants only ever add to CPU per round (shared caches, a busy sibling "
        "hyper-thread), so the least disturbed runs are the closest to what tracing itself costs.",
        "",
        *table(sim, "simulator's process"),
    ]
    if procs is not None:
        lines += [
            "",
            f"## Rank processes, {options.process_ranks} ranks over gloo (`serve --executor sim --processes`)",
            "",
            "One process per rank as in a real deployment; the round is the rank loop and its all-gather "
            "(the forward is modelled, so a real forward would make tracing's share smaller still). The first "
            "CPU column is the controller's process (root and request spans, their exporter); all processes "
            "adds the rank processes.",
            "",
            *table(procs, "controller's process"),
        ]
    if paired:
        lines += [
            "",
            f"## Paired: the simulator's own process, traced and untraced blocks side by side ({options.ranks} ranks)",
            "",
            "Two identical lockstep groups stepped in the bench's process (same arguments and seeded workload, "
            "so the same rounds: the simulator is deterministic and tracing only observes), one with its rank "
            f"observers attached, one without, each stepping the same {options.block} rounds one after the "
            f"other (which goes first alternates), {options.pairs} pairs per configuration, after "
            f"{WARMUP_ROUNDS} rounds of warm-up. The two blocks of a pair run the same rounds under the same "
            "load from the machine's other tenants, so their difference in the main thread's CPU time is what "
            "the ranks' hooks cost in that block (decisions, clock reads, phase marks, spans built). The ranks "
            "are observed as in `serve`'s simulator process: they trace the rounds a rate picks and leave the "
            "rounds only a rule picks (config, watermark) to the controller, in another process (the row 'as "
            "before': the ranks deciding every rule, batches every 1 s). Hooks per "
            "round: the **mean** of the pairs' differences (± its standard error); the median is shown beside "
            "it but is not the cost: at the default rates most blocks hold no traced round and a few hold one "
            "or two, and the median of that skewed mixture is a block without (or with one) traced round. "
            "Every CPU second of the process outside the main thread (the exporter's thread encoding and "
            "sending, gRPC's threads) is added, per traced round, as tracing's too. The figure the Build "
            "bounds (3%) is the last column.",
            "",
            "| tracing | untraced round: CPU | hooks per round (mean ± se) | hooks: median of blocks "
            "| exporter per round | spans offered | spans dropped | cost of tracing |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, result in paired.items():
            lines.append(
                f"| {config_label(name)} | {result['off_us']:,.1f} us | {result['hooks_us']:,.1f} "
                f"± {result['hooks_se_us']:,.1f} us | {result['hooks_median_us']:,.1f} us | "
                f"{result['exporter_us']:,.1f} us | {result['spans']:,} | {result['dropped']:,} | "
                f"**{result['overhead']:+.1%}** |"
            )
    if per_rank:
        lines += per_rank_table(per_rank, procs, options)
    if capacity is not None:
        need = 2000 * options.ranks * 4 + 2000
        lines += [
            "",
            "## Exporter capacity",
            "",
            f"One shipper kept full by a producer of 4-span rank trees for {options.seconds:g} s (encoding on the "
            f"exporter's thread, OTLP/gRPC to the receiver): **{capacity['spans_per_s']:,.0f} spans/s** delivered, "
            f"{capacity['exporter_us_per_span']:.1f} us of the exporter's CPU per span (its thread and gRPC's). "
            f"Tracing every round of {options.ranks} ranks at 2,000 rounds/s needs {need:,} spans/s in one "
            "process, and the simulator's own rounds need that process's interpreter too (one GIL).",
        ]
    return "\n".join(lines) + "\n"


def config_label(name: str) -> str:
    """A configuration's row label: its rates spelled out."""
    if name == "default":
        return f"default ({DEFAULT_SAMPLE_RATE:g}, windows {DEFAULT_WINDOW_SAMPLE_RATE:g})"
    if name == PREVIOUS:
        return (
            f"default as before ({DEFAULT_SAMPLE_RATE:g}, windows {DEFAULT_WINDOW_SAMPLE_RATE:g}; the ranks deciding "
            f"every rule, batches every {PREVIOUS_BATCH_S:g} s; today's candidate check and span ids)"
        )
    if name == "rates 0":
        return "both rates 0 (nothing traced: decisions and hooks)"
    return name


def per_rank_table(per_rank: dict[str, dict], procs: Results | None, options: argparse.Namespace) -> list[str]:
    """The paired section's per-rank variant: what one rank pays per round for tracing, as a rank process
    does, over the round time of the rank processes measured in the same run."""
    ranks = next(iter(per_rank.values()))["ranks"]
    round_s = None
    if procs is not None:
        offs = [r["rate"] for r in procs["off"]]
        round_s = 1 / statistics.median(offs)
        round_text = f"{round_s * 1e6:,.0f} us"
        span = f"off runs {min(offs):,.0f}-{max(offs):,.0f} rounds/s"
    lines = [
        "",
        f"### Per rank, as in a rank process ({ranks} ranks, no group tracer)",
        "",
        f"The same pairing ({options.pairs} pairs of {options.block}-round blocks) on twin lockstep groups of "
        f"{ranks} ranks whose observers are built as a rank process builds its own (`rank_observer` with no "
        "other rank's sampler in the process: each rank its own `RoundSampler`, as `serve --processes` has "
        "it), so the driver finds no group observer and every rank calls its own observer's two hooks "
        "(`fill_row` before the gather, `round_done` after it), deciding the round itself; the bench checks "
        "that the traced group's driver used no group observer. Hooks: the mean of the pairs' "
        "main-thread CPU differences; exporter: this process's CPU outside the main thread per traced round "
        "(here one shipper serves the ranks, a rank process has its own); both divided by the ranks, so per "
        'rank-round. Not included: `run_round`\'s `lap("gather")`, a no-op on an untimed round, which the '
        "lockstep driver does not call. Rank processes: tracing's share of a rank's round is that paired "
        "per-rank cost over the rank-process round time the rank-process section measured in this run (its "
        "off rate's median, 1 / rounds per second): a cost measured in one process over a round time "
        "measured in another setting, not a measured slowdown of the rank processes.",
        "",
        "| tracing | untraced rank-round: CPU | hooks per rank-round | exporter per rank-round "
        "| cost per rank-round | spans offered | spans dropped | rank-process round (off) "
        "| rank processes: tracing's share of a rank's round |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, result in per_rank.items():
        cost_us = result["rank_hooks_us"] + result["rank_exporter_us"]
        if round_s is None:
            share = "n/a (no rank-process section)"
            round_cell = "n/a"
        else:
            share = f"**{cost_us / (round_s * 1e6):+.2%}**"
            round_cell = f"{round_text} ({span})"
        lines.append(
            f"| {config_label(name)} | {result['rank_off_us']:,.2f} us | {result['rank_hooks_us']:,.2f} us | "
            f"{result['rank_exporter_us']:,.2f} us | {cost_us:,.2f} us | {result['spans']:,} | "
            f"{result['dropped']:,} | {round_cell} | {share} |"
        )
    return lines


def load_average() -> str:
    """The machine's load average over 1, 5 and 15 minutes, as `uptime` shows it (/proc, Linux)."""
    with open("/proc/loadavg") as loadavg:
        return ", ".join(loadavg.read().split()[:3])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="simulated ranks")
    parser.add_argument("--process-ranks", type=int, default=3, help="rank processes (0: skip that section)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured window per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-capacity", action="store_true", help="skip the exporter capacity section")
    parser.add_argument("--pairs", type=int, default=200, help="traced/untraced block pairs (0: skip that section)")
    parser.add_argument("--block", type=int, default=100, help="rounds per block of the paired section")
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    port_out, stop, counts = ctx.Queue(), ctx.Event(), ctx.Value("q", 0)
    receiver = ctx.Process(target=receiver_main, args=(port_out, stop, counts), daemon=True)
    receiver.start()
    before = load_average()
    endpoint = f"http://127.0.0.1:{port_out.get(timeout=60)}"
    try:
        pid = receiver.pid or 0
        sim = run_section(bench_args(options.ranks), False, endpoint, options.repeats, options.seconds, counts, pid)
        procs = None
        if options.process_ranks:
            args = bench_args(options.process_ranks)
            procs = run_section(args, True, endpoint, options.repeats, options.seconds, counts, pid)
        paired: dict[str, dict] = {}
        per_rank: dict[str, dict] = {}
        if options.pairs:
            for name, rate, window in PAIRED:
                assert rate is not None and window is not None
                paired[name] = paired_overhead(
                    endpoint, options.ranks, rate, window, options.pairs, options.block, previous=name == PREVIOUS
                )
                print(f"paired {name}: {paired[name]['overhead']:+.1%}", file=sys.stderr, flush=True)
            for name, rate, window in PER_RANK:
                assert rate is not None and window is not None
                ranks = options.process_ranks or options.ranks  # the rank processes' group, where it ran
                result = paired_overhead(endpoint, ranks, rate, window, options.pairs, options.block, per_rank=True)
                per_rank[name] = result
                cost = result["rank_hooks_us"] + result["rank_exporter_us"]
                print(f"paired per rank {name}: {cost:.2f} us per rank-round", file=sys.stderr, flush=True)
        capacity = None if options.no_capacity else exporter_capacity(endpoint, options.seconds)
    finally:
        stop.set()
        receiver.join(10)
    command = " ".join([".venv/bin/python -m bench.bench_tracing", *(sys.argv[1:] if argv is None else argv)])
    text = report(sim, procs, paired, capacity, options, command, (before, load_average()), per_rank)
    print(text)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(text)


if __name__ == "__main__":
    main()
