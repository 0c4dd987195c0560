"""Write bench/results/gpu.md from one run of `bench/gpu/check.sh` (its pytest JUnit XML and figures).

python bench/gpu/report.py --junit J.xml --figures F.jsonl --gpus gpus.txt --deep-ep TEXT \
    --versions TEXT --seconds N --pytest-status S --out bench/results/gpu.md
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(junit: Path) -> list[tuple[str, str, str]]:
    """(test, passed/failed/skipped, message) for each test case of the JUnit file."""
    if not junit.is_file():
        return []
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                status = "skipped" if tag == "skipped" else "failed"
                message = (found.get("message") or "").splitlines()[0][:200] if found.get("message") else ""
        out.append((case.get("name", "?"), status, message))
    return out


def figures(path: Path) -> list[dict]:
    """The figures the tests recorded, one JSON object per line."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def render(ns: argparse.Namespace) -> str:
    """The report's markdown."""
    gpus = Path(ns.gpus).read_text().strip().splitlines() if Path(ns.gpus).is_file() else []
    lines = [
        "# GPU check (bench/gpu/check.sh)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} in {ns.seconds} s; "
        f"pytest exit status {ns.pytest_status}.",
        "",
        "Command: `bash bench/gpu/check.sh`",
        "",
        f"- {len(gpus)} GPU(s): " + ("; ".join(gpus) if gpus else "none listed"),
        f"- {ns.versions}",
        f"- deep_ep: {ns.deep_ep}",
        "",
        "| check | result | note |",
        "| --- | --- | --- |",
    ]
    cases = outcomes(Path(ns.junit))
    lines += [f"| {name} | {status} | {message} |" for name, status, message in cases]
    if not cases:
        lines.append("| (no test ran: see the pytest log) | failed | |")
    lines += ["", "## Measured", ""]
    measured = figures(Path(ns.figures))
    if not measured:
        lines.append("Nothing was measured.")
    for item in measured:
        check = item.pop("check")
        lines.append(f"- {check}: " + ", ".join(f"{key} {value}" for key, value in item.items()))
    lines += [
        "",
        "token_agreement compares the torch executor on CUDA (bfloat16) with the CPU float64 reference, token",
        "by token: the CUDA path is not expected to match it bit for bit (engine/executor/model.py).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--junit", required=True)
    parser.add_argument("--figures", required=True)
    parser.add_argument("--gpus", required=True)
    parser.add_argument("--deep-ep", default="unknown")
    parser.add_argument("--versions", default="torch version unknown", help="torch, CUDA and NCCL versions")
    parser.add_argument("--seconds", type=int, default=0)
    parser.add_argument("--pytest-status", type=int, default=0)
    parser.add_argument("--out", required=True)
    ns = parser.parse_args(argv)
    Path(ns.out).write_text(render(ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
