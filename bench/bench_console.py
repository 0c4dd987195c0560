"""The console's cost: CPU share and achieved refresh rate at 8 and 64 ranks under a 1 kHz record stream.

Three processes per configuration, so that each one's CPU time is its own:

- a server: the real `Controller` and control plane (`ControlPlane`) on a loopback port, fed by a
  backend that replays a seeded simulator run's round records at a fixed rate (renumbered, stamped with
  the wall clock), so the stream is 1 kHz whatever the machine can simulate;
- the console, `python -m console --target ...`, in a pseudo-terminal of 250x70 (history strips on every
  rank, the heatmap under a small group, alerts computed every frame), exactly as a user runs
  it (the terminal output is read and thrown away). Its CPU time comes from /proc; its refresh rate is
  the number of frames it wrote, counted by the synchronized-output brackets Textual puts around each
  frame (this harness answers the terminal's capability query so that Textual uses them);
- the console headless (`App.run_test`) in a child process, which also reports what the app itself
  counted: states drawn, records received and records the server dropped for it.

    .venv/bin/python -m bench.bench_console            # prints and writes bench/results/console.md
    .venv/bin/python -m bench.bench_console --cost     # CPU per record read and per frame drawn, in process
    .venv/bin/python -m bench.bench_console --read-cost --seconds 5   # the gRPC client alone, per record
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fcntl
import io
import json
import os
import platform
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "console.md"
GOAL_CPU = 0.40
GOAL_HZ = 10.0
SIZE = (250, 70)  # wide and tall: every rank's history strip, the heatmap under few ranks, the alerts pane
SYNC_START = b"\x1b[?2026h"
SYNC_QUERY = b"\x1b[?2026$p"
SYNC_REPLY = b"\x1b[?2026;2$y"  # "recognised": Textual then brackets every frame
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- the server ------------------------------------------------------------------------------------


class ReplayBackend:
    """A `Backend` that publishes a recorded run's records at `hz`, renumbered and freshly stamped."""

    def __init__(self, records: list, hz: float) -> None:
        self.records = records
        self.hz = hz
        self.dp_size = len(records[0].rows)
        self.feeder = None
        self.published = 0
        self._started = 0.0
        self._stopping = False

    def start(self) -> None:
        self._started = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._started

    def poll(self):  # -> control.host.backends.Polled
        from control.host.backends import Polled

        polled = Polled(stopped=self._stopping)
        due = min(int(self.now() * self.hz), self.published + 64)  # never a burst bigger than 64 ms
        wall = time.time_ns()
        while self.published < due:
            source = self.records[self.published % len(self.records)]
            polled.records.append(dataclasses.replace(
                source, round=self.published, unix_nanos=wall, clock=self.published / self.hz
            ))
            self.published += 1
        return polled

    def submit(self, rank: int, spec: object) -> None:
        raise RuntimeError("the replay backend takes no requests")

    def abort(self, rank: int, rid: str) -> None:
        """Nothing runs, so nothing to abort."""

    def propose(self, epoch: int, delay: object) -> None:
        """Replayed records cannot adopt a config; the benchmark never proposes one."""

    def request_stop(self) -> None:
        self._stopping = True

    def records_dropped(self) -> int:
        return 0

    def close(self) -> None:
        """Nothing to release."""


async def serve(ranks: int, hz: float) -> None:
    """Run the server until SIGTERM; prints `READY HOST:PORT` once it listens."""
    from console.sample import sample_args, sample_engine_records
    from control.host.controller import Controller
    from control.plane.grpc_server import ControlPlane, PlaneOptions

    backend = ReplayBackend(sample_engine_records(ranks, 400), hz)
    controller = Controller(sample_args(ranks), backend, stop_when_idle=False)
    controller.start()
    plane = ControlPlane(controller, PlaneOptions(port=0), out=io.StringIO())
    await plane.start()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, controller.request_stop)
    print(f"READY {plane.target}", flush=True)
    started = time.perf_counter()
    await controller.run(poll_interval_s=0.0005)
    elapsed = time.perf_counter() - started
    await plane.stop()
    print(json.dumps({"published": backend.published, "seconds": elapsed}), flush=True)


def start_server(ranks: int, hz: float) -> tuple[subprocess.Popen, str]:
    """The server process and the target it listens on."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_console", "--serve", str(ranks), "--hz", str(hz)],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline() if process.stdout else ""
    if not line.startswith("READY "):
        process.kill()
        raise RuntimeError(f"the bench server did not start: {line!r}")
    return process, line.split()[1]


def stop_server(process: subprocess.Popen) -> dict:
    """SIGTERM, then its closing figures."""
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    return json.loads(out.strip().splitlines()[-1]) if out.strip() else {}


# -- the console in a pseudo-terminal --------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def run_in_pty(target: str, warmup_s: float, seconds: float, size: tuple[int, int] = SIZE) -> dict:
    """`python -m console --target` in a SIZE pty: CPU share and frames written per second."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor"}
    process = subprocess.Popen(
        [sys.executable, "-m", "console", "--target", target],
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
    )
    os.close(slave)
    frames = 0
    measuring = False
    cpu0 = wall0 = 0.0
    started = time.perf_counter()
    tail = b""
    try:
        while True:
            now = time.perf_counter()
            if not measuring and now - started >= warmup_s:
                measuring, cpu0, wall0, frames = True, cpu_seconds(process.pid), now, 0
            if measuring and now - wall0 >= seconds:
                cpu1, wall1 = cpu_seconds(process.pid), now
                break
            ready, _, _ = select.select([master], [], [], 0.05)
            if not ready:
                continue
            data = os.read(master, 1 << 16)
            chunk = tail + data
            if SYNC_QUERY in chunk:
                os.write(master, SYNC_REPLY)
            frames += chunk.count(SYNC_START) - tail.count(SYNC_START)
            tail = chunk[-16:]
    finally:
        os.write(master, b"q")
        try:
            deadline = time.perf_counter() + 10
            while process.poll() is None and time.perf_counter() < deadline:
                if select.select([master], [], [], 0.05)[0]:
                    try:
                        os.read(master, 1 << 16)
                    except OSError:
                        break
            if process.poll() is None:
                process.kill()
        finally:
            os.close(master)
    wall = wall1 - wall0
    return {"cpu_share": (cpu1 - cpu0) / wall, "frames_per_s": frames / wall, "seconds": wall}


# -- the console headless --------------------------------------------------------------------------


async def watch_headless(target: str, warmup_s: float, seconds: float, size: tuple[int, int] = SIZE) -> dict:
    """The app under `run_test`: its own counts of states drawn, records received and dropped."""
    from console.app import ConsoleApp
    from console.endpoint import Endpoint
    from console.source import GrpcSource

    app = ConsoleApp(GrpcSource(Endpoint(target)))
    async with app.run_test(size=size):
        await asyncio.sleep(warmup_s)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        frames0, records0, dropped0 = app.frames, app.store.records_seen, app.store.dropped
        await asyncio.sleep(seconds)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        frames1, records1, dropped1 = app.frames, app.store.records_seen, app.store.dropped
        ranks = app.store.dp_size
    wall = wall1 - wall0
    return {
        "cpu_share": (cpu1 - cpu0) / wall,
        "states_per_s": (frames1 - frames0) / wall,
        "records_per_s": (records1 - records0) / wall,
        "dropped": dropped1 - dropped0,
        "ranks_seen": ranks,
        "seconds": wall,
    }


def run_headless(target: str, warmup_s: float, seconds: float, size: tuple[int, int] = SIZE) -> dict:
    """`watch_headless` in a child process, so its CPU time is the console's alone."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_console", "--headless", target,
         "--warmup", str(warmup_s), "--seconds", str(seconds), "--size", f"{size[0]}x{size[1]}"],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


# -- the console's own cost, in process ------------------------------------------------------------


class _FedSource:
    """A live source that delivers nothing itself: the cost harness hands records to the store."""

    live = True
    admin = None
    name = "cost harness"

    async def run(self, sink, limit=None) -> None:
        from console.state import Link

        sink.status(Link.LIVE, "streaming from the cost harness")
        await asyncio.Event().wait()

    async def close(self) -> None:
        """Nothing to close."""


async def console_cost(ranks: int, size: tuple[int, int], records_n: int = 3000, frames_n: int = 40,
                       hz: float = 1000.0, fps: float = GOAL_HZ) -> dict:
    """CPU time the console spends per record read and per frame drawn, measured in this process.

    CPU time (not wall time) is what a starved process still reports truly: on a shared machine the
    work takes longer, not more CPU. A record is read as the gRPC client hands it over (parsed from its
    wire bytes, then stored); a frame is a full state built and drawn, encoded for the terminal as a
    real run would (only the write is skipped). The share a stream of `hz` records and `fps` frames a
    second needs is then hz x record + fps x frame.
    """
    from textual._compositor import CompositorUpdate

    from console.app import ConsoleApp
    from console.sample import sample_records
    from prefill_gate.v1 import types_pb2 as pb

    wire = [message.SerializeToString() for message in sample_records(ranks, 400)]
    app = ConsoleApp(_FedSource(), tick_hz=0.01)  # the harness draws, not the app's timer
    encoded: list[int] = []

    def display(screen, renderable) -> None:  # the terminal encoding of each frame, not written
        if isinstance(renderable, CompositorUpdate):
            encoded.append(len(renderable.render_segments(app.console)))

    app._display = display  # type: ignore[method-assign]
    published = 0

    def read(count: int) -> None:
        nonlocal published
        for _ in range(count):
            message = pb.RoundRecord.FromString(wire[published % len(wire)])
            message.round = published
            message.unix_nanos = 1_000_000_000 + int(published * 1e9 / hz)
            app.store.record(message)
            published += 1

    async with app.run_test(size=size) as pilot:
        read(600)  # history to draw from, caches warm
        app.refresh_now()
        await pilot.pause()
        cpu0 = time.process_time()
        read(records_n)
        record_ms = (time.process_time() - cpu0) / records_n * 1e3
        per_frame = int(hz / fps)
        frame_cpu = 0.0
        encoded.clear()
        for _ in range(frames_n):
            read(per_frame)
            cpu0 = time.process_time()
            app.refresh_now()
            await pilot.pause()
            await asyncio.sleep(0.04)  # the screen's update timer paints on a later turn; sleeping costs no CPU
            frame_cpu += time.process_time() - cpu0
        frame_ms = frame_cpu / frames_n * 1e3
    return {
        "ranks": ranks, "size": size, "record_ms": record_ms, "frame_ms": frame_ms,
        "frames_painted": len(encoded), "frames_n": frames_n,
        "share": (hz * record_ms + fps * frame_ms) / 1e3, "hz": hz, "fps": fps,
    }


async def read_cost(ranks: int, hz: float, seconds: float, batch: int) -> dict:
    """CPU time the console's gRPC client alone spends per record of a `hz` stream: the console's own
    endpoint and WatchRounds call (LOSSLESS_BOUNDED, up to `batch` records per message as the console
    asks, or one), every record parsed, nothing stored or drawn.
    CPU time of this whole process (the gRPC library's threads included), over `seconds` after a warm-up."""
    from console.endpoint import Endpoint
    from console.source import WATCH_BATCH_DELAY_MS, unbatch
    from prefill_gate.v1 import telemetry_pb2

    process, target = start_server(ranks, hz)
    endpoint = Endpoint(target)
    try:
        call = endpoint.telemetry().WatchRounds(telemetry_pb2.WatchRoundsRequest(
            mode=telemetry_pb2.WATCH_MODE_LOSSLESS_BOUNDED, max_batch=batch, max_batch_delay_ms=WATCH_BATCH_DELAY_MS))
        received, messages, started, cpu0, first, first_message = 0, 0, 0.0, 0.0, 0, 0
        async for message in call:
            received += len(unbatch(message))
            messages += 1
            if not started and received >= int(hz):  # a second of warm-up
                started, cpu0, first, first_message = time.perf_counter(), time.process_time(), received, messages
            elif started and time.perf_counter() - started >= seconds:
                break
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - started
        call.cancel()
    finally:
        await endpoint.close()
        stop_server(process)
    count = received - first
    return {"ranks": ranks, "batch": batch, "per_s": count / wall, "messages_per_s": (messages - first_message) / wall,
            "record_ms": cpu / count * 1e3, "share": cpu / wall}


def cost_report(rows: list[dict], command: str, load: tuple[float, float]) -> str:
    """The markdown table of `--cost` runs."""
    lines = [
        f"Command: `{command}` (1-minute load average {load[0]:.1f} before, {load[1]:.1f} after)",
        "",
        "| terminal | ranks | CPU ms per record read | CPU ms per frame drawn | frames painted | "
        "CPU share needed at 1 kHz + 10 frames/s | goal (< 40%) |",
        "| :--- | ---: | ---: | ---: | ---: | ---: | :--- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['size'][0]}x{row['size'][1]} | {row['ranks']} | {row['record_ms']:.3f} | {row['frame_ms']:.1f} "
            f"| {row['frames_painted']}/{row['frames_n']} | {row['share']:.0%} "
            f"| {'met' if row['share'] < GOAL_CPU else 'MISSED'} |"
        )
    return "\n".join(lines) + "\n"


# -- the report ------------------------------------------------------------------------------------


def measure(ranks: int, hz: float, warmup_s: float, seconds: float, size: tuple[int, int] = SIZE) -> dict:
    """Both console modes against one server."""
    server, target = start_server(ranks, hz)
    try:
        terminal = run_in_pty(target, warmup_s, seconds, size)
        headless = run_headless(target, warmup_s, seconds, size)
    finally:
        served = stop_server(server)
    rate = served["published"] / served["seconds"] if served.get("seconds") else 0.0
    return {"ranks": ranks, "size": size, "server_hz": rate, "terminal": terminal, "headless": headless}


def report(rows: list[dict], command: str, hz: float, seconds: float, load: tuple[float, float],
           size: tuple[int, int] = SIZE) -> str:
    """The markdown written to bench/results/console.md."""
    lines = [
        "# Console: CPU share and refresh rate under a 1 kHz stream",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; 1-minute load average {load[0]:.1f} before, {load[1]:.1f} after "
        "(the machine is shared: other work competes for the same two cores).",
        f"Stream: a seeded simulator run's records replayed by the real control plane at {hz:g} Hz (LOSSLESS_"
        "BOUNDED watch, in the batches the console asks for: `console.source.WATCH_BATCH`). "
        f"Terminal {size[0]}x{size[1]}; each figure over {seconds:g} s after a warm-up.",
        f"Goal: 64 ranks at {GOAL_HZ:g} Hz under {GOAL_CPU:.0%} of one core, with history (strips, heatmap) and "
        "alerts on, and no records dropped at a 1 kHz stream on an idle machine.",
        "",
        "| ranks | stream (server) | console CPU, terminal | frames/s written | console CPU, headless "
        "| states drawn/s | CPU ms per state | records received/s | records dropped | goal |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- |",
    ]
    for row in rows:
        terminal, headless = row["terminal"], row["headless"]
        # Every part of the goal: the share, the refresh rate and every record read (a starved console
        # spends little CPU because it falls behind: that is not the goal met).
        met = terminal["cpu_share"] < GOAL_CPU and terminal["frames_per_s"] >= GOAL_HZ * 0.9 \
            and headless["dropped"] == 0
        lines.append(
            f"| {row['ranks']} | {row['server_hz']:,.0f} rec/s | {terminal['cpu_share']:.1%} "
            f"| {terminal['frames_per_s']:.1f} | {headless['cpu_share']:.1%} | {headless['states_per_s']:.1f} "
            f"| {per_state(headless)} | {headless['records_per_s']:,.0f} | {headless['dropped']:,} "
            f"| {'met' if met else 'MISSED'} |"
        )
    lines += [
        "",
        "CPU share is CPU seconds (user + system, every thread of the console process: Textual, the gRPC",
        "client's threads) per wall second; 100% is one core. \"frames/s written\" counts the frames the",
        "console wrote to the terminal; \"states drawn/s\" counts the app's ticks that built and handed a",
        "new state to the widgets. A frame is written only when something on screen changed, and the",
        "tick caps both at 10 per second. Records dropped are records the server's bounded queue dropped",
        "for this console (the header's \"dropped\" counter): a console that does not get the CPU to read",
        "every record falls behind, and the server drops the oldest for it rather than let it go stale;",
        "on a loaded machine (see the load average) that shows up here first.",
        "",
    ]
    return "\n".join(lines)


def per_state(headless: dict) -> str:
    """CPU milliseconds per state drawn: the cost that stays comparable when the machine starves the console."""
    states = headless["states_per_s"]
    return f"{headless['cpu_share'] / states * 1e3:.0f}" if states else "-"


def parse_size(text: str) -> tuple[int, int]:
    """`250x70` as (columns, lines)."""
    width, _, height = text.partition("x")
    return int(width), int(height)


def main(argv: list[str] | None = None) -> int:
    """Entry: the orchestrator by default; `--serve` and `--headless` are its child processes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--hz", type=float, default=1000.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--size", type=parse_size, default=SIZE, help="terminal COLUMNSxLINES (default 250x70)")
    parser.add_argument("--cost", action="store_true",
                        help="in-process CPU time per record read and per frame drawn (prints only)")
    parser.add_argument("--read-cost", action="store_true",
                        help="CPU time of the gRPC client alone per record of the stream (prints only)")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--headless", default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.serve is not None:
        asyncio.run(serve(ns.serve, ns.hz))
        return 0
    if ns.headless is not None:
        print(json.dumps(asyncio.run(watch_headless(ns.headless, ns.warmup, ns.seconds, ns.size))), flush=True)
        return 0
    command = ".venv/bin/python -m bench.bench_console " + " ".join(argv if argv is not None else sys.argv[1:])
    if ns.cost:
        load_before = os.getloadavg()[0]
        costs = [asyncio.run(console_cost(ranks, ns.size)) for ranks in ns.ranks]
        print(cost_report(costs, command.strip(), (load_before, os.getloadavg()[0])))
        return 0
    if ns.read_cost:
        load_before = os.getloadavg()[0]
        from console.source import WATCH_BATCH

        for ranks in ns.ranks:
            for batch in (1, WATCH_BATCH):  # one record per message, then the console's batches
                row = asyncio.run(read_cost(ranks, ns.hz, ns.seconds, batch))
                print(f"{ranks} ranks, max_batch {batch}: {row['per_s']:,.0f} records/s read in "
                      f"{row['messages_per_s']:,.0f} messages/s, {row['record_ms']:.3f} CPU ms per record, "
                      f"{row['share']:.0%} of a core")
        print(f"1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
        return 0
    load_before = os.getloadavg()[0]
    rows = [measure(ranks, ns.hz, ns.warmup, ns.seconds, ns.size) for ranks in ns.ranks]
    load_after = os.getloadavg()[0]
    text = report(rows, command.strip(), ns.hz, ns.seconds, (load_before, load_after), ns.size)
    print(text)
    if not ns.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
