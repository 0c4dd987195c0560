"""`prefill-gate serve` as a user runs it: flags, bad input, Ctrl-C, a rank that dies (issue 4)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVE = [sys.executable, "-m", "control.cli", "serve", "--port", "0"]
GATE = ["--enable-dp-attention", "--prefill-attempt-interval", "4", "--prefill-any-attempt-interval", "16"]
SIM_PROCS = ["--collective-timeout-s", "300", "--executor", "sim", "--processes", "--dp-size", "3", *GATE]


def run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(SERVE + args, capture_output=True, text=True, timeout=timeout)


def test_help_lists_the_flags():  # rule C1
    result = run(["--help"])
    assert result.returncode == 0
    for flag in (
        "--prefill-attempt-interval",
        "--prefill-any-attempt-interval",
        "--dp-size",
        "--rounds",
        "--duration",
        "--pace",
        "--executor",
        "--watch-send-budget",
    ):
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prefill-attempt-interval", "4"], "--prefill-any-attempt-interval"),
        (["--prefill-attempt-interval", "8", "--prefill-any-attempt-interval", "4"], "must be >="),
        (
            [
                "--prefill-attempt-interval",
                "2",
                "--prefill-any-attempt-interval",
                "4",
                "--prefill-decode-interval",
                "3",
            ],
            "cannot be combined",
        ),
        (["--executor", "sim", "--sim-preset", "nope"], "unknown sim preset 'nope'"),
        (["--dp-size", "4096", "--max-num-seqs", "4096", "--model-experts", "4096"], "more rank processes"),
        (["--executor", "sim", "--arrival", "trace"], "--trace FILE"),
        (["--executor", "sim", "--rounds", "-3"], "--rounds must be > 0"),
        (["--executor", "sim", "--pace", "0"], "--pace must be > 0"),
        (["--executor", "sim", "--disaggregation-mode", "decode"], "needs a prefill peer"),
        (["--executor", "sim", "--watch-send-budget", "-5"], "--watch-send-budget must be an integer in [0, "),
    ],
)
def test_bad_flags_exit_nonzero_with_a_message_and_no_traceback(argv, message):  # rules C2, C4
    result = run(argv)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_trace_line_is_named(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 0.0, "prompt_len": 10, "output_len": 2}\n{"t": 0.1, "prompt_len": "x"}\n')
    result = run(["--executor", "sim", "--arrival", "trace", "--trace", str(trace)])
    assert result.returncode != 0 and "t.jsonl:2:" in result.stderr and "Traceback" not in result.stderr


def test_sim_run_completes_every_request_and_prints_a_summary():
    result = run(
        [
            *("--executor", "sim", "--dp-size", "4"),
            *GATE,
            "--requests",
            "60",
            "--rate",
            "30",
            "--no-progress",
        ]
    )
    assert result.returncode == 0, result.stderr
    assert "requests finished 60/60" in result.stdout
    for label in ("output tokens/s", "TTFT p50", "ITL  p50", "rounds on the extend path", "windows opened by ANY"):
        assert label in result.stdout
    assert "SIMULATED" in result.stdout


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0); it is gone for our purposes once reaped or defunct
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return False


def start_serving() -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        SERVE + SIM_PROCS + ["--keep-serving", "--arrival", "poisson", "--rate", "50", "--requests", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    deadline = time.monotonic() + 60
    while "started" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
    assert "rank processes: pids" in line, line
    pids = [int(p) for p in line.split("pids")[1].split()]
    proc.stdout.readline()  # one progress line: rounds are flowing
    return proc, pids


def test_ctrl_c_stops_every_rank_and_exits_zero():
    proc, pids = start_serving()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopping" in out and "summary" in out
    assert not [pid for pid in pids if alive(pid)]
    accounted(out)


def test_a_killed_rank_ends_the_run_nonzero_with_no_orphans():
    proc, pids = start_serving()
    victim = pids[1]
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - started < 60  # promptly: well before the 300 s collective timeout
    assert "rank" in err and "failed" in err
    assert not [pid for pid in pids if alive(pid)]
    accounted(out)  # the summary still accounts for every request, what the crash cut short included


def accounted(summary: str) -> int:
    """Check that a summary accounts for every submitted request; returns how many were cut off."""
    counts = re.search(r"requests finished (\d+)/(\d+) \(aborted (\d+), refused (\d+), cut off (\d+)\)", summary)
    assert counts is not None, summary
    finished, submitted, aborted, refused, cut_off = map(int, counts.groups())
    assert submitted == finished + aborted + refused + cut_off, summary
    return cut_off


def test_torch_executor_four_ranks_complete_every_request():  # issue 4: serve --dp-size 4 on CPU, gate on
    result = run(
        [
            *("--dp-size", "4"),
            *GATE,
            "--requests",
            "120",
            "--rate",
            "30",
            "--prompt-len",
            "48",
            "--prompt-len-max",
            "160",
            "--output-len",
            "16",
            "--output-len-max",
            "64",
            "--kv-pages",
            "256",
            "--max-num-seqs",
            "64",
            "--chunked-prefill-size",
            "128",
            "--no-progress",
        ],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert "requests finished 120/120" in result.stdout
    rounds = int(result.stdout.split("rounds ")[1].split()[0])
    assert rounds >= 100  # arrivals spread over time: many rounds (how many depends on this machine's speed)
    assert "SIMULATED" not in result.stdout


def test_calibrate_refuses_too_few_rounds():
    result = subprocess.run(
        [sys.executable, "-m", "control.cli", "calibrate", "--rounds", "10"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "--rounds must be >= 50" in result.stderr and "Traceback" not in result.stderr


def test_a_second_ctrl_c_stops_at_once():
    proc = subprocess.Popen(
        # Paced slowly (a round takes ~0.5 s of wall time), so the second signal comes before the agreed
        # stop round: two signals sent back to back may reach the process as one.
        [
            *SERVE,
            *("--executor", "sim", "--dp-size", "2", "--enable-dp-attention", "--pace", "0.05"),
            *("--keep-serving", "--requests", "0", "--rate", "50"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = [proc.stdout.readline(), proc.stdout.readline()]
    assert "round" in "".join(seen)  # the plane's address, then progress
    proc.send_signal(signal.SIGINT)
    while "stopping" not in seen[-1]:  # the first signal was handled: the agreed stop is on its way
        seen.append(proc.stdout.readline())
        assert seen[-1], "serve ended before it said it was stopping"
    proc.send_signal(signal.SIGINT)  # kill, do not wait for the agreed stop round
    out, err = proc.communicate(timeout=30)
    assert "Traceback" not in err
    # A kill is no clean stop: the run says so and ends non-zero, every request still accounted for.
    assert proc.returncode == 1 and "error: the engine was killed without an agreed stop" in err, err
    assert "summary" in out and "cut off" in out
