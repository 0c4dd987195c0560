"""The lab's tables and ratios, as markdown. Pure: cells in, text out (no I/O, no clocks, no wall times).

One table per scenario: a row per policy and the oracle bound row, a column per PEERS.md metric. Under it,
the gate's row as ratios to the best peer and to the oracle bound, per metric and direction-aware: the
best peer of a metric is the highest value where higher is better (throughput, ranks per extend round) and
the lowest where lower is better (latencies, extend share, extend rounds over the bound, waits). A ratio is
always gate / other; the verdict says which side it favours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from engine.executor.presets import CostPreset
from lab.runner import PHASE_SCENARIOS, Cell
from lab.scenarios import scenario

GATE = "gate"
# Ratios within this of 1 count as a tie: simulated noise between policies is about this size.
TIE = 0.005


class Better(Enum):
    """Which way a metric improves."""

    HIGHER = "higher"
    LOWER = "lower"


@dataclass(frozen=True, slots=True)
class Metric:
    """A table column: how to read it from a cell, which way is better, how to print it."""

    key: str
    label: str
    better: Better
    value: Callable[[Cell], float | None]
    fmt: Callable[[float], str]


def _two(value: float) -> str:
    return f"{value:.2f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


METRICS: tuple[Metric, ...] = (
    Metric("tok_s", "output tok/s", Better.HIGHER, lambda c: c.summary.output_tokens_per_s, lambda v: f"{v:.0f}"),
    Metric("ttft_p50", "TTFT p50 s", Better.LOWER, lambda c: c.summary.ttft_p50_s, _two),
    Metric("ttft_p99", "TTFT p99 s", Better.LOWER, lambda c: c.summary.ttft_p99_s, _two),
    Metric("itl_p50", "ITL p50 ms", Better.LOWER, lambda c: c.summary.itl_p50_s, _ms),
    Metric("itl_p99", "ITL p99 ms", Better.LOWER, lambda c: c.summary.itl_p99_s, _ms),
    Metric("extend_share", "extend share", Better.LOWER, lambda c: c.summary.extend_round_share, lambda v: f"{v:.1%}"),
    Metric(
        "ranks_extending",
        "ranks / extend round",
        Better.HIGHER,
        lambda c: c.summary.mean_ranks_extending,
        _two,
    ),
    Metric("extend_over_oracle", "extend rounds / oracle", Better.LOWER, lambda c: c.extend_over_oracle, _two),
    Metric("wait_max", "max wait s", Better.LOWER, lambda c: c.summary.gate_wait_max_s, _two),
)
METRIC_BY_KEY: Mapping[str, Metric] = {metric.key: metric for metric in METRICS}


@dataclass(frozen=True, slots=True)
class Comparison:
    """The gate's value of one metric against another (best peer or the oracle bound)."""

    metric: str
    gate: float | None
    other: float | None
    other_name: str | None
    ratio: float | None  # gate / other; None when either is missing or other is 0
    verdict: str  # "better", "worse", "tie" or "n/a" (from the gate's side)
    place: int | None = None  # the gate's place among every policy with a value (1 = best; ties share)
    of: int = 0  # how many policies have a value


def verdict(gate: float | None, other: float | None, better: Better, tie: float = TIE) -> str:
    """Whether `gate` is better, worse or tied with `other` for a metric improving in direction `better`."""
    if gate is None or other is None:
        return "n/a"
    if gate == other or (other != 0 and abs(gate / other - 1) <= tie):
        return "tie"
    gate_wins = gate > other if better is Better.HIGHER else gate < other
    return "better" if gate_wins else "worse"


def compare(metric: Metric, gate: float | None, other: float | None, other_name: str | None) -> Comparison:
    """`gate` against `other` on `metric` (direction-aware verdict, plain ratio gate / other)."""
    ratio = gate / other if gate is not None and other else None
    return Comparison(metric.key, gate, other, other_name, ratio, verdict(gate, other, metric.better))


def best_of(values: Mapping[str, float | None], better: Better) -> tuple[str, float] | None:
    """The best (name, value) of `values`, ignoring missing ones; ties go to the first in order."""
    present = [(name, value) for name, value in values.items() if value is not None]
    if not present:
        return None
    pick = max if better is Better.HIGHER else min
    return pick(present, key=lambda item: item[1])


def gate_vs_best_peer(cells: Sequence[Cell]) -> list[Comparison]:
    """Per metric, the gate's cell against the best of the other policies' cells (empty without a gate)."""
    gate = next((cell for cell in cells if cell.spec.policy == GATE), None)
    if gate is None:
        return []
    peers = [cell for cell in cells if cell.spec.policy != GATE]
    out = []
    for metric in METRICS:
        best = best_of({cell.spec.policy: metric.value(cell) for cell in peers}, metric.better)
        name, value = best if best is not None else (None, None)
        values = [v for v in (metric.value(cell) for cell in cells) if v is not None]
        place = place_of(metric.value(gate), values, metric.better)
        out.append(dataclasses.replace(compare(metric, metric.value(gate), value, name), place=place, of=len(values)))
    return out


def place_of(value: float | None, values: Sequence[float], better: Better) -> int | None:
    """1 + how many of `values` are strictly better than `value` (None when `value` is missing)."""
    if value is None:
        return None
    if better is Better.HIGHER:
        return 1 + sum(other > value for other in values)
    return 1 + sum(other < value for other in values)


def oracle_values(cell: Cell) -> dict[str, float | None]:
    """The oracle bound row's values, on `cell`'s run (metrics the bound does not define are None)."""
    return {
        "tok_s": cell.oracle.decode_tokens_per_s or None,
        "ranks_extending": cell.oracle.mean_ranks_extending,
        "extend_over_oracle": 1.0 if cell.oracle.extend_rounds else None,
    }


def gate_vs_oracle(cells: Sequence[Cell]) -> list[Comparison]:
    """The gate's throughput, ranks per extend round and extend rounds against its own run's oracle bound."""
    gate = next((cell for cell in cells if cell.spec.policy == GATE), None)
    if gate is None:
        return []
    bound = oracle_values(gate)
    return [
        compare(METRIC_BY_KEY[key], METRIC_BY_KEY[key].value(gate), bound[key], "oracle")
        for key in ("tok_s", "ranks_extending", "extend_over_oracle")
    ]


def reference_cell(cells: Sequence[Cell]) -> Cell:
    """The run the oracle row is computed on: the gate's if present, else the first policy's."""
    return next((cell for cell in cells if cell.spec.policy == GATE), cells[0])


def same_requests(cells: Sequence[Cell]) -> bool:
    """Whether every policy was offered the same requests: the shortest run's list is a prefix of every other
    (an open loop; runs differ only in the arrivals of their last round, which ends at a different moment)."""
    shortest = min(cells, key=lambda cell: cell.requests)
    size = shortest.requests
    return all(
        cell.request_list[:size] == shortest.request_list and cell.arrivals[:size] == shortest.arrivals[:size]
        for cell in cells
    )


# -- markdown -----------------------------------------------------------------------------------------------


def _cell_text(metric: Metric, value: float | None) -> str:
    return "-" if value is None else metric.fmt(value)


def scenario_table(cells: Sequence[Cell]) -> str:
    """The scenario's markdown table: a row per policy, then the oracle bound row."""
    header = ["policy", *(metric.label for metric in METRICS), "finished / submitted", "waiting at end"]
    align = ["---", *("---:" for _ in METRICS), "---:", "---:"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    for cell in cells:
        values = [_cell_text(metric, metric.value(cell)) for metric in METRICS]
        wait = f"{values[-1]} ({cell.summary.gate_wait_max_rounds})"
        extend = f"{values[-2]} ({cell.summary.extend_rounds})"
        done = f"{cell.summary.requests_finished} / {cell.summary.requests_submitted}"
        row = [cell.spec.policy, *values[:-2], extend, wait, done, str(cell.waiting_at_end)]
        lines.append("| " + " | ".join(row) + " |")
    ref = reference_cell(cells)
    bound = oracle_values(ref)
    values = [_cell_text(metric, bound.get(metric.key)) for metric in METRICS]
    values[-2] = f"{values[-2]} ({ref.oracle.extend_rounds})"
    lines.append("| " + " | ".join([f"*oracle bound* ({ref.spec.policy}'s run)", *values, "-", "-"]) + " |")
    return "\n".join(lines)


def _ratio_text(comparison: Comparison) -> str:
    metric = METRIC_BY_KEY[comparison.metric]
    if comparison.verdict == "n/a":
        return f"{metric.label}: n/a"
    ratio = f"{comparison.ratio:.2f}x" if comparison.ratio is not None else "no ratio (the other is 0)"
    gate = _cell_text(metric, comparison.gate)
    other = _cell_text(metric, comparison.other)
    place = f"; place {comparison.place} of {comparison.of}" if comparison.place is not None else ""
    return f"{metric.label}: {ratio} ({gate} vs {other}, {comparison.other_name}; {comparison.verdict}{place})"


def ratio_lines(cells: Sequence[Cell]) -> list[str]:
    """The gate's row as ratios to the best peer and to the oracle bound (markdown bullets)."""
    peer = gate_vs_best_peer(cells)
    if not peer:
        return ["The gate is not among the policies run: no ratios."]
    oracle = gate_vs_oracle(cells)
    wins = sum(c.verdict == "better" for c in peer)
    losses = sum(c.verdict == "worse" for c in peer)
    ties = sum(c.verdict == "tie" for c in peer)
    return [
        f"Gate / best peer (per metric, direction-aware; better {wins}, worse {losses}, tie {ties}):",
        *(f"- {_ratio_text(c)}" for c in peer),
        "",
        "Gate / oracle bound (on the gate's own run):",
        *(f"- {_ratio_text(c)}" for c in oracle),
    ]


def phase_table(cells: Sequence[Cell]) -> str:
    """Per-rank prefill progress of every policy (the mixed-state feedback loop's measure)."""
    lines = [
        "| policy | prompt tok/s | max spread (chunks) | final spread (chunks) | out-of-phase rounds |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for cell in cells:
        phase = cell.phase
        elapsed = cell.summary.elapsed_s
        rate = f"{sum(phase.tokens_per_rank) / elapsed:.0f}" if elapsed > 0 else "-"
        share = phase.out_of_phase_share
        oop = f"{phase.out_of_phase_rounds} / {phase.extend_rounds}" + (f" ({share:.1%})" if share is not None else "")
        lines.append(
            f"| {cell.spec.policy} | {rate} | {phase.max_spread_chunks:.2f} | {phase.final_spread_chunks:.2f} | {oop} |"
        )
    return "\n".join(lines)


def preset_lines(preset: CostPreset) -> list[str]:
    """Who the preset stands for and where its figures come from."""
    return [
        f"Preset `{preset.name}`: {preset.hardware}; {preset.model}.",
        f"Sources: {preset.source}.",
    ]


def _load_note(cells: Sequence[Cell]) -> str:
    ref = reference_cell(cells)
    if same_requests(cells):
        low, high = min(cell.requests for cell in cells), max(cell.requests for cell in cells)
        count = f"{low}" if low == high else f"{low}-{high} (the runs' last rounds end at different moments)"
        offered = ref.offered_output_tokens / ref.sim_seconds if ref.sim_seconds > 0 else 0.0
        return (
            f"Every policy was offered the same requests, {count}, asking for {offered:.0f} output tok/s over the "
            "run: where the group can decode more, throughput is capped by the load and the latency columns "
            "discriminate."
        )
    counts = ", ".join(f"{cell.spec.policy} {cell.requests}" for cell in cells)
    return (
        f"Closed loop: completions drive arrivals, so each policy ran its own requests ({counts}); "
        "each policy's extend rounds are over the bound of its own run."
    )


def _stop_notes(cells: Sequence[Cell]) -> list[str]:
    """A warning for every run that ended before the scenario's duration (the round cap: a policy that spins)."""
    return [
        f"**Warning:** {cell.spec.policy} stopped at the round cap ({cell.rounds} rounds, {cell.sim_seconds:.0f} "
        "simulated seconds), not at the scenario's duration."
        for cell in cells
        if cell.stopped_by == "rounds"
    ]


def scenario_section(name: str, cells: Sequence[Cell], preset: CostPreset, charts: Mapping[str, str]) -> str:
    """One scenario: what it is, its table, the gate's ratios, its charts (paths relative to the report)."""
    sc = scenario(name, seed=cells[0].spec.seed, scale=cells[0].spec.scale)
    parts = [
        f"## {name} (SIMULATED, {preset.name})",
        "",
        f"{sc.what}; tests {sc.tests} (source: {sc.source}). {sc.duration_s:g} simulated seconds, seed {sc.seed}.",
        _load_note(cells),
        *_stop_notes(cells),
        "",
        scenario_table(cells),
        "",
        *ratio_lines(cells),
    ]
    if name in PHASE_SCENARIOS:
        parts += [
            "",
            "Per-rank prefill progress (spread = most minus least progressed rank, in chunks of the round budget; "
            "out-of-phase round = an extend round in which a rank with prefill work left extended nothing):",
            "",
            phase_table(cells),
        ]
    for label, key in (("Throughput vs TTFT p99", "throughput"), ("Per-rank progress spread", "spread")):
        path = charts.get(f"{name}:{key}")
        if path:
            parts += ["", f"![{label}, {name}, SIMULATED on {preset.name}]({path})"]
    return "\n".join(parts)


def render_report(
    groups: Mapping[str, Sequence[Cell]],
    preset: CostPreset,
    command: str,
    settings: str,
    charts: Mapping[str, str] | None = None,
) -> str:
    """The whole lab report: header, then one section per scenario. Deterministic."""
    charts = charts or {}
    header = [
        f"# Policy lab, fixed-load view: every prefill policy on the same requests (SIMULATED, preset {preset.name})",
        "",
        f"Command: `{command}` (`.venv/bin/python -m lab` takes the same options).",
        "",
        *preset_lines(preset),
        "",
        "Every figure below is SIMULATED: the lockstep simulator on the virtual clock with this cost preset, "
        "not a measurement of the hardware it names.",
        "",
        "Each scenario shape runs at its nominal load, every policy at one setting: a secondary view. The lab's "
        "main report is `../lab.md` (`prefill-gate lab capacity`): every policy's goodput capacity, each at its "
        "best knobs.",
        "",
        f"Policies: {settings}. The gate's intervals are searched per scenario by "
        "`prefill-gate lab --sweep --ttft-p99-max S`, which writes `sweep.md` beside this file.",
        "",
        "Columns (PEERS.md): output tokens/s; TTFT and ITL percentiles; share of busy rounds on the extend path; "
        "mean ranks extending per extend round; extend rounds over the oracle bound (the run's extend rounds in "
        "brackets); the longest a prompt waited while schedulable (seconds, rounds in brackets). The oracle row: "
        "decode tokens/s with no round ever off the decode path, the fewest extend rounds for the prompt tokens "
        "the run extended (count in brackets), and ranks per extend round if every rank's extend rounds fit in "
        "the busiest rank's. The oracle's decode tokens/s drains every submitted request from round 0 at the full "
        "batch: an open loop's offered load sits far below it, and a drain tail of long outputs counts in it, so "
        "it is a yardstick rather than a ceiling on a run's windowed rate. Waiting at end: prompts still queued on "
        "all ranks after the last round (a backlog that grows with the run means the policy cannot keep up).",
    ]
    sections = [scenario_section(name, cells, preset, charts) for name, cells in groups.items() if cells]
    return "\n".join(header) + "\n\n" + "\n\n".join(sections) + "\n"
