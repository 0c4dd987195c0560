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
        f"BOUNDED watch). Terminal {size[0]}x{size[1]}; each figure over {seconds:g} s after a warm-up.",
        f"Goal: 64 ranks at {GOAL_HZ:g} Hz under {GOAL_CPU:.0%} of one core, with history (strips, heatmap) and "
        "alerts on, and no records dropped at a 1 kHz stream on an idle machine.",
        "",
        "| ranks | stream (server) | console CPU, terminal | frames/s written | console CPU, headless "
        "| states drawn/s | CPU ms per state | records received/s | records dropped | goal |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- |",
    ]
    for row in rows:
        terminal, headless = row["terminal"], row["headless"]
        met = terminal["cpu_share"] < GOAL_CPU and terminal["frames_per_s"] >= GOAL_HZ * 0.9
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
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--headless", default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.serve is not None:
        asyncio.run(serve(ns.serve, ns.hz))
        return 0
    if ns.headless is not None:
        print(json.dumps(asyncio.run(watch_headless(ns.headless, ns.warmup, ns.seconds, ns.size))), flush=True)
        return 0
    load_before = os.getloadavg()[0]
    rows = [measure(ranks, ns.hz, ns.warmup, ns.seconds, ns.size) for ranks in ns.ranks]
    load_after = os.getloadavg()[0]
    command = ".venv/bin/python -m bench.bench_console " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(rows, command.strip(), ns.hz, ns.seconds, (load_before, load_after), ns.size)
    print(text)
    if not ns.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
