"""The capacity lab's frontier charts as PNG files (matplotlib, Agg): one per workload, two panels.

- left: TTFT p99 (net of idle prefill) against offered load, a line per policy through the probes of its best
  setting that ran to the end; probes cut short (certainly over the bound) are crosses on the top edge; the
  bound is a dashed line, each policy's capacity a dotted vertical.
- right: capacity against the TTFT bound (the frontier bounds of the run), a line per policy.

Titled SIMULATED with the preset; no software version in the PNG metadata, so the same results give the same
bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from lab.capacity.runner import Result
from lab.charts import STYLE, save

_EDGE = 1.15


def frontier_chart(label: str, row: Mapping[str, Result], preset_name: str, path: Path) -> Path:
    """The workload's two-panel chart (module docstring); returns `path`."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.2), dpi=100)
    slo = next(iter(row.values())).main.slo
    finite = [
        p.ttft_excess_p99_s
        for result in row.values()
        for p in result.curve
        if p.ttft_excess_p99_s is not None and math.isfinite(p.ttft_excess_p99_s) and p.cut_short is None
    ]
    top = max([slo.ttft_p99_s * 2, *finite]) * _EDGE
    for policy, result in row.items():
        color, marker = STYLE.get(policy, ("black", "x"))
        done = [p for p in result.curve if p.cut_short is None and p.ttft_excess_p99_s is not None]
        xs = [p.offered_rps for p in done]
        ys = [min(p.ttft_excess_p99_s, top) for p in done]  # type: ignore[type-var]
        if xs:
            left.plot(xs, ys, marker=marker, color=color, label=policy, linewidth=1.2, markersize=5)
        cut = [p.offered_rps for p in result.curve if p.cut_short is not None]
        if cut:
            left.scatter(cut, [top] * len(cut), marker="x", color=color, s=25)
        if result.main.capacity_rps:
            left.axvline(result.main.capacity_rps, color=color, linestyle=":", linewidth=0.8)
        bounds = [(b, rps) for b, rps, _ in result.frontier if rps is not None]
        if bounds:
            right.plot(*zip(*bounds, strict=True), marker=marker, color=color, label=policy, linewidth=1.2)
    left.axhline(slo.ttft_p99_s, color="grey", linestyle="--", linewidth=1)
    left.set_ylim(0, top * 1.02)
    left.set_xlabel("offered load (req/s)")
    left.set_ylabel("TTFT p99 net of idle prefill (s)")
    left.set_title("TTFT p99 against load (x: run cut short, over the bound)", fontsize=9)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7, loc="upper left")
    right.set_xlabel("TTFT p99 bound (s)")
    right.set_ylabel("capacity (req/s)")
    right.set_ylim(bottom=0)
    right.set_title(f"capacity against the TTFT bound (ITL p99 <= {slo.itl_p99_s:g} s)", fontsize=9)
    right.grid(True, alpha=0.3)
    fig.suptitle(f"{label}: SIMULATED on {preset_name}", fontsize=10)
    fig.tight_layout()
    return save(fig, path)
