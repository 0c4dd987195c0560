"""`make demo`: a simulated 8-rank engine with the gate on, paced to real time, and the console on it.

The engine runs as `prefill-gate serve` in a child process; the console runs in this terminal and the
engine stops when the console quits. Without a terminal (a pipe, CI) the demo prints a few snapshots
from `prefill-gate ctl` instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

SERVE_FLAGS = [
    "--executor", "sim", "--dp-size", "8", "--enable-dp-attention",
    "--prefill-attempt-interval", "8", "--prefill-any-attempt-interval", "32",
    "--max-num-seqs", "512", "--kv-pages", "1024", "--page-size", "64",
    "--arrival", "poisson", "--rate", "6", "--requests", "0", "--routing", "skewed", "--skew", "3",
    "--prompt-len", "256", "--prompt-len-max", "3072", "--output-len", "64", "--output-len-max", "768",
    "--pace", "1", "--keep-serving", "--no-progress",
]  # fmt: skip


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, server: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until the server accepts connections; raises if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the demo engine exited early (code {server.returncode})")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit("the demo engine did not start listening in time")


def main() -> int:
    """Start the engine, attach the console (or print snapshots), stop the engine."""
    from control.cli import main as cli
    from engine.drivers.lifeline import die_with_parent

    port = free_port()
    target = f"127.0.0.1:{port}"
    log = open(os.devnull, "wb")  # noqa: SIM115 - lives as long as the child
    demo_pid = os.getpid()
    server = subprocess.Popen(
        [sys.executable, "-m", "control.cli", "serve", "--port", str(port), *SERVE_FLAGS],
        stdout=log,
        stderr=subprocess.PIPE,
        # If the demo dies without its finally (a closed terminal), the engine gets SIGTERM and drains.
        preexec_fn=lambda: die_with_parent(demo_pid),  # the demo has one thread here: preexec_fn is safe
    )
    try:
        wait_for_port(port, server)
        if sys.stdin.isatty() and sys.stdout.isatty():
            return cli(["console", "--target", target])
        print(f"no terminal: showing the engine at {target} through `prefill-gate ctl` for a few seconds")
        for _ in range(3):
            time.sleep(2)
            cli(["ctl", "--target", target, "snapshot"])
        return 0
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
