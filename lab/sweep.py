"""`--sweep`: the gate's intervals (A, K) searched per scenario under a TTFT p99 bound.

The grid is every (A, K) of the given values with K >= A (C2 refuses K < A). The pick for a scenario is
the highest output tokens/s among the cells whose TTFT p99 meets the bound. In an open-loop scenario every
interval pair delivers the offered load, so throughputs differ by simulation noise only; cells within
`TIE` of the best throughput therefore count as equal, and the tie goes to the lowest share of rounds on the
extend path (the decode capacity the intervals keep in reserve for more load: the gate's purpose), then the
lower TTFT p99, then the smaller (A, K). When no cell meets the bound the pick is None and the report says
so, naming the cell with the lowest TTFT p99. Several bounds can be given: the grid runs once.

`pick_best` and `render_sweep` are pure; `sweep_specs` only lists the cells for `runner.run_cells`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lab.runner import Cell, CellSpec, LabConfig

DEFAULT_ATTEMPT_GRID: tuple[int, ...] = (2, 4, 8, 16)
DEFAULT_ANY_GRID: tuple[int, ...] = (4, 8, 16, 32, 64)
# Throughputs within this fraction of the best are ties (open loops deliver the offered load whatever A, K).
TIE = 0.005


def grid(attempts: Iterable[int], anys: Iterable[int]) -> list[tuple[int, int]]:
    """Every (A, K) with K >= A, sorted; ValueError on an interval below 1 or an empty grid."""
    attempts, anys = sorted(set(attempts)), sorted(set(anys))
    if any(value < 1 for value in (*attempts, *anys)):
        raise ValueError("sweep intervals must be integers >= 1")
    pairs = [(a, k) for a in attempts for k in anys if k >= a]
    if not pairs:
        raise ValueError(f"no (A, K) with K >= A in attempt intervals {attempts} and any intervals {anys}")
    return pairs


def sweep_specs(config: LabConfig, pairs: Sequence[tuple[int, int]]) -> list[CellSpec]:
    """The gate's cells for every scenario of `config` and every pair, scenario-major."""
    return [
        CellSpec(
            scenario=name,
            policy="gate",
            preset=config.preset,
            seed=config.seed,
            scale=config.scale,
            attempt_interval=a,
            any_interval=k,
            local_interval=config.local_interval,
        )
        for name in config.scenarios
        for a, k in pairs
    ]


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One (A, K) cell of the sweep, reduced to what the pick reads."""

    attempt: int
    any: int
    tokens_per_s: float | None
    ttft_p99_s: float | None
    extend_share: float | None

    @classmethod
    def of(cls, cell: Cell) -> SweepPoint:
        """The point of a sweep cell."""
        s = cell.summary
        a, k = cell.spec.attempt_interval, cell.spec.any_interval
        return cls(a, k, s.output_tokens_per_s, s.ttft_p99_s, s.extend_round_share)

    @property
    def key(self) -> tuple[int, int]:
        """(A, K)."""
        return (self.attempt, self.any)


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


def meets(point: SweepPoint, ttft_p99_max: float) -> bool:
    """Whether the point has throughput and its TTFT p99 is within the bound."""
    return point.tokens_per_s is not None and point.ttft_p99_s is not None and point.ttft_p99_s <= ttft_p99_max


def pick_best(points: Sequence[SweepPoint], ttft_p99_max: float, tie: float = TIE) -> SweepPoint | None:
    """The best point under the bound (module docstring), or None when no point meets it."""
    eligible = [point for point in points if meets(point, ttft_p99_max)]
    if not eligible:
        return None
    top = max(point.tokens_per_s or 0.0 for point in eligible)
    near = [point for point in eligible if (point.tokens_per_s or 0.0) >= top * (1 - tie)]
    return min(near, key=lambda p: (_or_inf(p.extend_share), _or_inf(p.ttft_p99_s), p.attempt, p.any))


def _fmt(point: SweepPoint) -> str:
    tok = "-" if point.tokens_per_s is None else f"{point.tokens_per_s:.0f}"
    ttft = "-" if point.ttft_p99_s is None else f"{point.ttft_p99_s:.2f}"
    share = "-" if point.extend_share is None else f"{point.extend_share:.1%}"
    return f"{tok} / {ttft} / {share}"


def sweep_table(points: Sequence[SweepPoint], picks: Sequence[SweepPoint | None]) -> str:
    """Rows A, columns K; each cell `tok/s / TTFT p99 s / extend share`, bold where some bound picked it."""
    attempts = sorted({p.attempt for p in points})
    anys = sorted({p.any for p in points})
    by_key = {p.key: p for p in points}
    picked = {p.key for p in picks if p is not None}
    lines = ["| A \\ K | " + " | ".join(str(k) for k in anys) + " |", "| ---: |" + " ---: |" * len(anys)]
    for a in attempts:
        row = []
        for k in anys:
            point = by_key.get((a, k))
            if point is None:
                row.append("")
            else:
                row.append(f"**{_fmt(point)}**" if point.key in picked else _fmt(point))
        lines.append(f"| {a} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _pick_text(points: Sequence[SweepPoint], best: SweepPoint | None) -> list[str]:
    """The summary row's cells for one bound."""
    if best is None:
        closest = min(points, key=lambda p: (_or_inf(p.ttft_p99_s), p.attempt, p.any))
        ttft = "-" if closest.ttft_p99_s is None else f"{closest.ttft_p99_s:.2f}"
        return [f"none meets it (lowest TTFT p99 {ttft} s, at ({closest.attempt}, {closest.any}))", "-", "-", "-"]
    return [f"({best.attempt}, {best.any})", *_fmt(best).split(" / ")]


def render_sweep(
    groups: Mapping[str, Sequence[Cell]], bounds: Sequence[float], preset_name: str, command: str | None = None
) -> str:
    """The sweep's markdown: per bound the pick of every scenario (or that none meets it), then each grid."""
    lines = [f"# Sweep: the gate's intervals (A, K) per scenario (SIMULATED, preset {preset_name})", ""]
    if command:
        lines += [f"Command: `{command}` (`.venv/bin/python -m lab` takes the same options).", ""]
    lines += [
        "Every figure is SIMULATED (the lockstep simulator with the preset above), not a measurement of hardware. "
        "Best = highest output tok/s among the cells meeting the TTFT p99 bound; throughputs within "
        f"{TIE:.1%} of it tie, and the tie goes to the lowest share of rounds on the extend path, then the lowest "
        "TTFT p99, then the smaller (A, K). Cells: output tok/s / TTFT p99 s / extend share; bold = picked under "
        "some bound.",
    ]
    points = {name: [SweepPoint.of(cell) for cell in cells] for name, cells in groups.items() if cells}
    picks = {name: [pick_best(pts, bound) for bound in bounds] for name, pts in points.items()}
    for index, bound in enumerate(bounds):
        lines += [
            "",
            f"## Best (A, K) under TTFT p99 <= {bound:g} s",
            "",
            "| scenario | best (A, K) | output tok/s | TTFT p99 s | extend share |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for name, pts in points.items():
            lines.append("| " + " | ".join([name, *_pick_text(pts, picks[name][index])]) + " |")
    lines += ["", "## Grids"]
    for name, pts in points.items():
        lines += ["", f"### {name}", "", sweep_table(pts, picks[name])]
    return "\n".join(lines) + "\n"
