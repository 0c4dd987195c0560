"""`prefill-gate serve --trace`: the production traces replayed as a user runs them (issue 11, item 1)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from control.cli import build_parser, main
from control.host.serve import build_workload, describe_trace, load_trace_arg
from engine.config import ServerArgs
from tests.test_traces import AZURE, MOONCAKE, needs_shared

SERVE = [sys.executable, "-m", "control.cli", "serve", "--port", "0", "--no-progress", "--executor", "sim"]
GATE = ["--enable-dp-attention", "--prefill-attempt-interval", "8", "--prefill-any-attempt-interval", "32"]


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(SERVE + args, capture_output=True, text=True, timeout=timeout)


def run_here(args: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`serve` in this process (the checks that end before the engine starts): exit code, stdout, stderr."""
    code = main(SERVE[3:] + args)
    out, err = capfd.readouterr()
    return code, out, err


@needs_shared
def test_mooncake_window_shows_prefix_hits_in_the_summary():  # the must-show, on a short window
    result = run(["--dp-size", "8", *GATE, "--trace", str(MOONCAKE), "--trace-speed", "0.5", "--trace-duration", "12"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "(mooncake-jsonl): 12,031 requests" in out and "router prefix-affinity" in out
    finished = re.search(r"requests finished (\d+)/(\d+) \(aborted 0, refused (\d+)\)", out)
    hits = re.search(r"prefix hits (\d+)/(\d+) requests  ([\d,]+) of ([\d,]+) prompt tokens \(([\d.]+)%\)", out)
    assert finished and hits, out
    assert int(finished[1]) + int(finished[3]) == int(finished[2]) == int(hits[2]) > 20  # the whole window
    # Prompts longer than a rank's default pool (65,536 tokens) are refused, as the opening note said.
    note = re.search(r"note: (\d+) of the window's (\d+) requests need more than a rank's pool", out)
    assert (int(note[1]), int(note[2])) == (int(finished[3]), int(finished[2])) if note else finished[3] == "0"
    assert int(hits[1]) > 0 and 0 < float(hits[5]) < 100
    assert "SIMULATED" in out


@needs_shared
def test_azure_window_is_built_from_the_flags():
    parser, _ = build_parser()
    flags = ["--trace-start", "60", "--trace-duration", "10", "--trace-speed", "2", "--router", "shortest-queue"]
    ns = parser.parse_args(["serve", "--executor", "sim", "--dp-size", "4", "--trace", str(AZURE), *flags])
    args = ServerArgs.from_cli_args(ns)
    data = load_trace_arg(ns)
    assert data is not None and data.format == "azure-csv"
    workload = build_workload(ns, args, data)
    assert workload is not None and workload.bounded and workload.prefix_caches is None  # no blocks: no caches
    due = workload.due(5.0, [0, 0, 0, 0])
    assert len(due) > 20 and all(spec.arrival <= 5.0 and spec.prefix_hit == 0 for _, spec in due)
    window = [a for a in data.arrivals if 60 <= a.time < 70]
    assert [spec.prompt_len for _, spec in due] == [a.prompt_len for a in window]  # 10 trace seconds in 5
    assert workload.done


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("bad.csv", "TIMESTAMP,Tokens\n", ":1: unknown trace format"),
        (
            "late.jsonl",
            "\n".join(
                json.dumps({"timestamp": t, "input_length": 9, "output_length": 1, "hash_ids": [0]}) for t in (5, 4)
            ),
            ":2: timestamp 4 ms is before",
        ),
    ],
)
def test_malformed_trace_ends_with_one_line(tmp_path: Path, capfd, name: str, text: str, where: str):
    path = tmp_path / name
    path.write_text(text)
    code, _, err = run_here(["--dp-size", "2", "--trace", str(path)], capfd)
    assert code == 2 and err.strip().count("\n") == 0 and f"{path}{where}" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace-speed", "2"], "--trace-speed needs --trace FILE"),
        (["--trace-duration", "5"], "--trace-duration needs --trace FILE"),
        (["--trace", "x.jsonl", "--arrival", "poisson"], "cannot be combined with --arrival poisson"),
        (["--router", "prefix-affinity", "--requests", "-1"], "--requests must be >= 0"),
    ],
)
def test_bad_trace_flags_are_refused(capfd, argv: list[str], message: str):
    code, _, err = run_here(["--dp-size", "2", *argv], capfd)
    assert code == 2 and message in err


def test_opening_lines_say_when_hits_are_off_and_what_will_be_refused(tmp_path: Path):
    lines = [
        json.dumps({"timestamp": t, "input_length": n, "output_length": 2, "hash_ids": [0]})
        for t, n in ((0, 500), (5, 300))
    ]
    lines.append(json.dumps({"timestamp": 9, "input_length": 5000, "output_length": 2, "hash_ids": list(range(10))}))
    path = tmp_path / "tiny.jsonl"
    path.write_text("\n".join(lines) + "\n")
    parser, _ = build_parser()
    flags = ["--dp-size", "2", "--trace", str(path), "--prefix-cache-blocks", "0", "--kv-pages", "64"]
    ns = parser.parse_args(["serve", "--executor", "sim", *flags])
    args = ServerArgs.from_cli_args(ns)
    data = load_trace_arg(ns)
    assert data is not None
    text = describe_trace(ns, data, args)
    assert "give no hits here: --prefix-cache-blocks is 0" in text
    assert "1 of the window's 3 requests need more than a rank's pool of 1,024 tokens" in text  # 64 pages x 16
