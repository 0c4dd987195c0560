"""Round records through GateTelemetry.WatchRounds, and what subscribers cost the engine.

The server side is what `prefill-gate serve --executor sim` runs: the lockstep simulator (unpaced, as
fast as it goes) in a thread of the controller process, the controller and the gRPC server on its event
loop. The subscribers are real gRPC clients in another process (one channel each, LOSSLESS_BOUNDED,
gRPC's default channel options), so their own Python does not share the server's CPU time slice.

1. Records/s delivered to each of 1 and 8 subscribers at 8 and 64 ranks, with the engine's rounds/s in
   the same window, the records each subscriber lost to its bounded queue (dropped_before), and how old a
   record was when it arrived (wall clock now - unix_nanos).
2. The engine's rounds/s with 0 and with 4 subscribers attached, alternating phases in one run (0, 4, 0,
   4, ...), so that both see the same machine; the ratio of the means is the subscribers' cost.

    .venv/bin/python -m bench.bench_watch            # prints and writes bench/results/watch.md
"""

from __future__ import annotations

import argparse
import asyncio
import io
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import grpc

from control.host.backends import SimBackend
from control.host.controller import Controller
from control.plane.grpc_server import ControlPlane, PlaneOptions
from engine.config import ServerArgs
from prefill_gate.v1 import telemetry_pb2, telemetry_pb2_grpc
from workloads import ClosedLoop, Uniform, Workload

RESULTS = Path(__file__).parent / "results" / "watch.md"
NOTES = [
    "## Reading the figures",
    "",
    "- The simulator's ranks run in a Python thread of the controller process, so the engine and the gRPC",
    "  server share one interpreter lock: what subscribers cost the engine here is the server loop's CPU share",
    "  plus lock hand-offs (and, on 2 CPUs, the subscriber process's CPU). With `ProcessBackend` the ranks are",
    "  processes of their own and only the controller's loop pays.",
    "- The engine never waits for a subscriber: whatever a subscriber cannot take, its bounded queue drops and",
    "  counts (dropped). A stalled reader costs nothing (tests/test_grpc_watch.py checks that side by side);",
    "  the ratio above is the price of serving readers that do keep up.",
    "- One stream delivers at most one record per write completion, and with the simulator thread holding the",
    "  interpreter lock the loop thread waits up to the 5 ms switch interval to run each completion: that, not",
    "  CPU (see the loop's CPU share), bounds records/s per subscriber at 8 ranks. A shorter switch interval",
    "  trades the other way (measured once at 8 ranks, 1 subscriber: `sys.setswitchinterval(0.001)` gave the",
    "  subscriber 1,881 instead of 842 records/s and cost the engine 2,535 instead of 3,950 rounds/s); the",
    "  default keeps the engine first.",
    "- Lag of hundreds of ms where subscribers fall behind is HTTP/2 buffering with gRPC's default receive",
    "  window (BDP probing): a client that wants fresh records keeps its window small",
    "  (`control.plane.ctl.FRESH_STREAM_OPTIONS`, as `ctl watch` does) and asks for LATEST_ONLY if the newest will do.",
]


def bench_args(ranks: int) -> ServerArgs:
    """A gated group with attention DP, sized so that every rank keeps a decode batch busy."""
    return ServerArgs(
        executor="sim",
        dp_size=ranks,
        enable_dp_attention=True,
        max_num_seqs=16 * ranks,
        chunked_prefill_size=512,
        page_size=16,
        kv_pages=2048,
        prefill_attempt_interval=4,
        prefill_any_attempt_interval=16,
        seed=3,
    )


def bench_workload(ranks: int) -> Workload:
    """A closed loop of 6 clients per rank, never ending; lengths vary so that finishes do not come in waves."""
    return Workload(ClosedLoop(6 * ranks), dp_size=ranks, prompt=Uniform(128, 384), output=Uniform(32, 96), seed=3)


# -- the subscriber process ------------------------------------------------------------------------


@dataclass
class Received:
    """One subscriber's window: records, records its queue dropped, arrival lag of each record (s)."""

    records: int
    dropped: int
    lags: list[float]
    seconds: float


def subscribe(target: str, count: int, warmup_s: float, window_s: float, results: mp.Queue) -> None:
    """Process body: `count` subscribers read for warmup + window seconds; report the window and the
    process's CPU share over it."""
    results.put(asyncio.run(_subscribe(target, count, warmup_s, window_s)))


async def _subscribe(target: str, count: int, warmup_s: float, window_s: float) -> tuple[list[Received], float]:
    start = time.monotonic() + warmup_s
    end = start + window_s

    async def cpu_share() -> float:
        await asyncio.sleep(warmup_s)
        cpu = time.process_time()
        await asyncio.sleep(window_s)
        return (time.process_time() - cpu) / window_s

    async def one() -> Received:
        seen = Received(0, 0, [], window_s)
        async with grpc.aio.insecure_channel(target) as channel:
            stream = telemetry_pb2_grpc.GateTelemetryStub(channel).WatchRounds(telemetry_pb2.WatchRoundsRequest())
            while (now := time.monotonic()) < end:
                record = await stream.read()
                if record is grpc.aio.EOF:
                    break
                if now >= start:
                    seen.records += 1
                    seen.dropped += record.dropped_before
                    if seen.records % 16 == 0:
                        seen.lags.append(time.time() - record.unix_nanos / 1e9)
            stream.cancel()
        return seen

    share = asyncio.create_task(cpu_share())
    received = list(await asyncio.gather(*(one() for _ in range(count))))
    return received, await share


# -- the server side ---------------------------------------------------------------------------------


class Server:
    """Controller + unpaced simulator + control plane on port 0, in this process."""

    def __init__(self, ranks: int) -> None:
        args = bench_args(ranks)
        self.controller = Controller(args, SimBackend(args, bench_workload(ranks)), stop_when_idle=False)
        self.plane = ControlPlane(self.controller, PlaneOptions(port=0), out=io.StringIO())
        self.run: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Server:
        self.controller.start()
        await self.plane.start()
        self.run = asyncio.create_task(self.controller.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.plane.stop()
        if self.run is not None:
            await self.run

    def round(self) -> int:
        latest = self.controller.latest
        return latest.round if latest is not None else 0

    async def rate(self, seconds: float) -> tuple[float, float]:
        """Engine rounds/s over the next `seconds`, and the CPU share of the server's loop thread."""
        r0, t0, cpu = self.round(), time.monotonic(), time.thread_time()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - t0
        return (self.round() - r0) / elapsed, (time.thread_time() - cpu) / elapsed


@dataclass
class Window:
    """One measured window with subscribers attached."""

    engine: float  # rounds/s
    loop_cpu: float  # the server's loop thread
    client_cpu: float  # the subscriber process
    received: list[Received]


async def with_subscribers(server: Server, count: int, warmup_s: float, window_s: float) -> Window:
    """The engine and `count` subscribers (reading in another process) over one window."""
    context = mp.get_context("spawn")
    results: mp.Queue = context.Queue()
    process = context.Process(target=subscribe, args=(server.plane.target, count, warmup_s, window_s, results))
    process.start()
    # The client's clock starts after its imports; the window here is the middle of its window.
    await asyncio.sleep(warmup_s + 0.5)
    engine, loop_cpu = await server.rate(window_s - 0.5)
    received, client_cpu = await asyncio.get_running_loop().run_in_executor(None, results.get)
    process.join()
    return Window(engine, loop_cpu, client_cpu, received)


def lag_ms(received: list[Received], q: float) -> float:
    lags = sorted(lag for r in received for lag in r.lags)
    return 1e3 * lags[min(len(lags) - 1, int(q * len(lags)))] if lags else float("nan")


async def throughput(ranks: int, counts: tuple[int, ...], warmup_s: float, window_s: float) -> list[str]:
    rows = []
    async with Server(ranks) as server:
        await server.rate(1.0)  # the closed loop fills the batches
        for count in counts:
            window = await with_subscribers(server, count, warmup_s, window_s)
            received = window.received
            per = [r.records / r.seconds for r in received]
            delivered = sum(r.records for r in received)
            dropped = sum(r.dropped for r in received)
            rows.append(
                f"| {ranks} | {count} | {window.engine:,.0f} | {statistics.mean(per):,.0f} | {min(per):,.0f} | "
                f"{sum(per):,.0f} | {dropped / max(1, delivered + dropped):.1%} | "
                f"{lag_ms(received, 0.5):.0f} | {lag_ms(received, 0.99):.0f} | {window.loop_cpu:.0%} | "
                f"{window.client_cpu:.0%} |"
            )
            print(rows[-1], flush=True)
    return rows


def toggled(target: str, count: int, conn: Connection) -> None:
    """Process body: `count` subscribers that read while switched on ("on"/"off"/"quit" on `conn`)."""
    asyncio.run(_toggled(target, count, conn))


async def _toggled(target: str, count: int, conn: Connection) -> None:
    channels = [grpc.aio.insecure_channel(target) for _ in range(count)]

    async def read(channel: grpc.aio.Channel) -> None:
        async for _ in telemetry_pb2_grpc.GateTelemetryStub(channel).WatchRounds(telemetry_pb2.WatchRoundsRequest()):
            pass

    readers: list[asyncio.Task[None]] = []
    while (command := await asyncio.to_thread(conn.recv)) != "quit":
        if command == "on":
            readers = [asyncio.create_task(read(channel)) for channel in channels]
        else:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        conn.send(command)
    for channel in channels:
        await channel.close()


async def engine_cost(ranks: int, pairs: int, window_s: float) -> tuple[list[float], list[float]]:
    """Engine rounds/s in alternating windows without and with 4 subscribers (one long-lived client process
    switched on and off, so no process start falls into a window)."""
    without, with_four = [], []
    context = mp.get_context("spawn")
    here, there = context.Pipe()
    async with Server(ranks) as server:
        client = context.Process(target=toggled, args=(server.plane.target, 4, there))
        client.start()

        async def switch(command: str) -> None:
            await asyncio.to_thread(here.send, command)
            await asyncio.to_thread(here.recv)

        await server.rate(1.5)  # the closed loop fills the batches; the client imports meanwhile
        for _ in range(pairs):
            without.append((await server.rate(window_s))[0])
            await switch("on")
            await asyncio.sleep(0.3)  # the streams are open and flowing
            with_four.append((await server.rate(window_s))[0])
            await switch("off")
            await asyncio.sleep(0.3)
        await asyncio.to_thread(here.send, "quit")
        await asyncio.to_thread(client.join)
    return without, with_four


async def main(ns: argparse.Namespace) -> str:
    lines = [
        "# WatchRounds throughput and what subscribers cost the engine",
        "",
        f"Command: `.venv/bin/python -m bench.bench_watch{' --quick' if ns.quick else ''}`",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}; load average {os.getloadavg()[0]:.1f} when it started (the machine is shared: "
        "read the ratios, not the last digit).",
        "Server: `SimBackend` (sim executor, unpaced: the engine runs as fast as the CPU lets it) in a thread of "
        "the controller process, gRPC server on the controller's loop. Workload: a closed loop of 6 clients per rank, "
        "prompts of 128-384 tokens, outputs of 32-96 (uniform), gate A=4 K=16. Subscribers: another process, "
        "one channel each, LOSSLESS_BOUNDED with the default queue (1024), gRPC default channel options.",
        "",
        "## Records/s through WatchRounds",
        "",
        "engine = the engine's rounds/s in the same window; per subscriber = records/s each received (mean, "
        "slowest); dropped = records the subscribers' bounded queues dropped / records published to them; "
        "lag = wall time from rank 0's publish to the client's read (p50, p99).",
        "",
        "| ranks | subscribers | engine rounds/s | per subscriber | slowest | all subscribers | dropped | "
        "lag p50 ms | lag p99 ms | server loop CPU | subscriber process CPU |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for ranks in (8, 64):
        lines += await throughput(ranks, (1, 8), ns.warmup, ns.window)
    lines += [
        "",
        "## Engine rounds/s with 0 and 4 subscribers, side by side",
        "",
        f"Alternating windows of {ns.pair_window:g} s in one run per group size (0, 4, 0, 4, ...); the 4 subscribers "
        "live in one client process started before the first window and switched on and off between windows.",
        "",
        "| ranks | window pairs | 0 subscribers (mean rounds/s) | 4 subscribers (mean rounds/s) | ratio of means | "
        "ratio per pair (median, min-max) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for ranks in (8, 64):
        without, with_four = await engine_cost(ranks, ns.pairs, ns.pair_window)
        ratios = [w / o for o, w in zip(without, with_four, strict=True)]
        lines.append(
            f"| {ranks} | {ns.pairs} | {statistics.mean(without):,.0f} | {statistics.mean(with_four):,.0f} | "
            f"{statistics.mean(with_four) / statistics.mean(without):.2f} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
        print(lines[-1], flush=True)
    lines += ["", *NOTES]
    return "\n".join(lines) + "\n"


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=3.0, help="seconds measured per configuration")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds subscribers read before measuring")
    parser.add_argument("--pairs", type=int, default=10, help="0/4-subscriber window pairs per group size")
    parser.add_argument("--pair-window", type=float, default=1.5, help="seconds of each 0/4-subscriber window")
    parser.add_argument("--quick", action="store_true", help="short windows (a smoke run; not written)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the report goes")
    ns = parser.parse_args()
    if ns.quick:
        ns.window, ns.warmup, ns.pairs = 1.5, 1.0, 2
    report = asyncio.run(main(ns))
    if not ns.quick:
        ns.out.write_text(report)
        print(f"wrote {ns.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
