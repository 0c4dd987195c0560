"""gate-autotune against the gate at its best static (A, K) and every peer at its best, from `lab capacity --json`.

    prefill-gate lab capacity --quick --trace ../shared/traces/*.{csv,jsonl} --json capacity.json
    python bench/bench_autotune_capacity.py capacity.json [more.json ...]   # later files win per (workload, policy)

Prints one markdown table row per workload: the best static gate's capacity and knobs, gate-autotune's
capacity and its ratio to it, the best peer (any other policy at its best) and the ratio to that. The figures
are the capacity lab's: SIMULATED on the preset the run used.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

AUTOTUNE = "gate-autotune"


def load(paths: list[str]) -> dict[tuple[str, str], dict]:
    """(workload, policy) -> the capacity lab's record; later files replace earlier ones."""
    out: dict[tuple[str, str], dict] = {}
    for path in paths:
        for record in json.loads(Path(path).read_text()):
            out[(record["workload"], record["policy"])] = record
    return out


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x"


def rps(record: dict | None) -> str:
    if record is None or not record.get("capacity_rps"):
        return "0 (none held)" if record is not None else "-"
    return f"{record['capacity_rps']:.2f}"


def knobs(record: dict | None) -> str:
    if record is None or not record.get("knobs"):
        return ""
    return " (" + " ".join(f"{k}={v:g}" for k, v in sorted(record["knobs"].items())) + ")"


def table(records: dict[tuple[str, str], dict]) -> list[str]:
    """The comparison, one row per workload that has a gate-autotune record."""
    lines = [
        "| workload | gate at its best | gate-autotune | / best static | best peer | / best peer |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    workloads = list(dict.fromkeys(w for w, p in records if p == AUTOTUNE))
    for workload in workloads:
        tuned = records[(workload, AUTOTUNE)]
        gate = records.get((workload, "gate"))
        peers = [r for (w, p), r in records.items() if w == workload and p not in (AUTOTUNE, "gate")]
        best = max(peers, key=lambda r: r.get("capacity_rps") or 0.0, default=None)
        lines.append(
            f"| {workload} | {rps(gate)}{knobs(gate)} | {rps(tuned)} | "
            f"{ratio(tuned.get('capacity_rps'), gate and gate.get('capacity_rps'))} | "
            f"{rps(best)}{' ' + best['policy'] if best else ''}{knobs(best)} | "
            f"{ratio(tuned.get('capacity_rps'), best and best.get('capacity_rps'))} |"
        )
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print("\n".join(table(load(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
