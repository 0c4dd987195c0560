"""The lab's charts as PNG files (matplotlib, Agg backend: no display needed).

- `throughput_chart`: one point per policy, output tokens/s against TTFT p99 (the trade every policy makes);
  the oracle's decode throughput is drawn as a line when it is within the chart's range, else named in the
  caption.
- `spread_chart`: per-rank prefill progress spread over simulated time, a small panel per policy (the
  mixed-state feedback loop shows as a spread that keeps growing or never returns to 0).

Every chart is titled SIMULATED with the preset's name. The PNG metadata carries no software version or
date, so the same cells give the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

# The backend must be chosen before pyplot is imported: no display on a server or in CI.
matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib import ticker

from lab.phase import thin_series
from lab.report import GATE, reference_cell
from lab.runner import Cell

# Fixed PNG metadata: no "Software" version string, so the files do not change with matplotlib upgrades.
_METADATA = {"Software": None}
SERIES_POINTS = 600


# One look per policy, the same in every chart (the capacity charts too); the gate stands out.
STYLE: dict[str, tuple[str, str]] = {
    "ungated": ("tab:gray", "o"),
    "gate": ("tab:red", "*"),
    "local-interval": ("tab:brown", "v"),
    "sglang-delayer": ("tab:blue", "s"),
    "atom-coalescer": ("tab:green", "D"),
    "vllm-cadence": ("tab:purple", "^"),
    "trtllm-balance": ("tab:orange", "P"),
}


def throughput_chart(name: str, cells: Sequence[Cell], preset_name: str, path: Path) -> Path:
    """Output tokens/s against TTFT p99, one point per policy (legend, not labels: points often coincide); both
    axes start at 0 so that small differences look small, unless TTFT p99 spans more than 10x (log x axis).
    Returns `path`."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    top = 0.0
    for cell in cells:
        s = cell.summary
        if s.output_tokens_per_s is None or s.ttft_p99_s is None:
            continue
        color, marker = STYLE.get(cell.spec.policy, ("black", "x"))
        gate = cell.spec.policy == GATE
        ax.scatter(
            s.ttft_p99_s,
            s.output_tokens_per_s,
            s=140 if gate else 50,
            marker=marker,
            color=color,
            label=cell.spec.policy,
            zorder=4 if gate else 3,
            alpha=0.85,
        )
        top = max(top, s.output_tokens_per_s)
    oracle = reference_cell(cells).oracle.decode_tokens_per_s if cells else 0.0
    caption = "oracle decode bound: " + (f"{oracle:.0f} tok/s" if oracle else "none (no decode)")
    if 0 < oracle <= 2 * top:
        ax.axhline(oracle, color="grey", linestyle="--", linewidth=1, label="oracle decode bound")
        top = max(top, oracle)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ttfts = [c.summary.ttft_p99_s for c in cells if c.summary.ttft_p99_s and c.summary.output_tokens_per_s]
    if ttfts and max(ttfts) > 10 * min(ttfts):
        # TTFT p99 can span 0.1 s to minutes across policies: a log axis keeps the fast ones apart.
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_xlabel("TTFT p99 (s, log scale)")
    else:
        ax.set_xlim(0, max(ttfts, default=1.0) * 1.15)
        ax.set_xlabel("TTFT p99 (s)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{name}: SIMULATED on {preset_name}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.text(0.01, 0.01, caption, fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return save(fig, path)


def spread_chart(name: str, cells: Sequence[Cell], preset_name: str, path: Path) -> Path:
    """Per-rank progress spread (chunks) over simulated time, one small panel per policy (lines of policies
    that stay in phase would hide each other on one axis); returns `path`."""
    columns = min(4, max(1, len(cells)))
    rows = -(-len(cells) // columns) if cells else 1
    fig, axes = plt.subplots(
        rows, columns, figsize=(2.2 * columns, 1.6 * rows + 0.6), dpi=100, sharex=True, sharey=True, squeeze=False
    )
    top = max((cell.phase.max_spread_chunks for cell in cells), default=0.0)
    for index, ax in enumerate(axes.flat):
        if index >= len(cells):
            ax.set_visible(False)
            continue
        cell = cells[index]
        series = thin_series(cell.phase.series, SERIES_POINTS) if cell.phase.series else ()
        if series:
            times, spreads = zip(*series, strict=True)
            ax.step(times, spreads, where="post", color=STYLE.get(cell.spec.policy, ("black", ""))[0])
        ax.set_title(f"{cell.spec.policy} (max {cell.phase.max_spread_chunks:.1f})", fontsize=7)
        ax.set_ylim(-0.1, max(1.0, top * 1.15))
        ax.tick_params(labelsize=6)
        ax.grid(True, alpha=0.3)
    fig.supxlabel("simulated time (s)", fontsize=7)
    fig.supylabel("spread (chunks)", fontsize=7)
    fig.suptitle(f"{name}: per-rank prefill progress spread, SIMULATED on {preset_name}", fontsize=8)
    fig.tight_layout()
    return save(fig, path)


def save(fig: plt.Figure, path: Path) -> Path:
    """Write `fig` as a PNG with fixed metadata (same figure, same bytes) and close it; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata=_METADATA)
    plt.close(fig)
    return path
