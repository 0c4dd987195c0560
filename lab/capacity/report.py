"""The capacity lab's report and JSON, pure: results in, text out (no I/O, no clocks).

`render` writes the markdown that `bench/results/lab.md` holds: ONE capacity table first (a row per workload,
a column per policy at its best: capacity in req/s and the knobs that reached it; the gate's ratio to the
best peer and to ungated), then where the gate is not ahead of every peer (by how much, and what broke at
the gate's first failing load), the headline under other presets' runs, the per-workload details, and the
method. `records` gives the `--json` objects. Everything is labelled SIMULATED with its preset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.executor.presets import CostPreset
from lab.autotune import AUTOTUNE
from lab.capacity.knobs import describe, settings_of
from lab.capacity.probe import DRAIN_S, Probe, Slo, backlogged
from lab.capacity.runner import Result
from lab.capacity.search import FULL_STEP, QUICK_STEP

GATE = "gate"
UNGATED = "ungated"
# The gate, static or moved by the tuner: neither is a peer of the gate.
GATES = (GATE, AUTOTUNE)


def _rps(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:#.3g}" if value < 10 else f"{value:.1f}"


def _s(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def capacity_of(result: Result) -> float:
    """The result's capacity in req/s (0 when nothing held)."""
    return result.main.capacity_rps or 0.0


def by_workload(results: Sequence[Result]) -> dict[str, dict[str, Result]]:
    """Results keyed by workload label then policy, both in the order they came."""
    out: dict[str, dict[str, Result]] = {}
    for result in results:
        out.setdefault(result.task.spec.label, {})[result.task.policy] = result
    return out


def policies_of(results: Sequence[Result], asked: Sequence[str] | None = None) -> list[str]:
    """The run's policies in order: those it was asked for (an interrupted run's results may lack some)."""
    return list(asked) if asked is not None else list(dict.fromkeys(result.task.policy for result in results))


def complete_rows(results: Sequence[Result], asked: Sequence[str] | None = None) -> dict[str, dict[str, Result]]:
    """The workloads every policy of the run finished (all of them, unless the run was interrupted): the only
    rows whose ratios and comparisons mean what they say."""
    policies = set(policies_of(results, asked))
    return {label: row for label, row in by_workload(results).items() if set(row) >= policies}


def _cell(result: Result) -> str:
    main = result.main
    if main.capacity <= 0:
        return "0 (none held)"
    speed = f"{main.capacity:.2f}x, " if result.load_unit == "x speed" else ""
    ceiling = ">= " if main.failed_at is None else ""
    return f"{ceiling}{_rps(capacity_of(result))} ({speed}{describe(main.knobs or ())})"


def ratio(gate: float, other: float) -> float | None:
    """gate / other; None when other is 0."""
    return gate / other if other > 0 else None


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def best_peer(row: Mapping[str, Result]) -> tuple[str, float] | None:
    """The peer (any policy but the gate, static or autotuned) with the highest capacity; ties go to the first
    listed."""
    peers = [(name, capacity_of(result)) for name, result in row.items() if name not in GATES]
    return max(peers, key=lambda item: item[1]) if peers else None


def capacity_table(results: Sequence[Result], asked: Sequence[str] | None = None) -> str:
    """The one capacity table (module docstring); `asked`: the policies the run was asked for."""
    rows = by_workload(results)
    whole = complete_rows(results, asked)
    policies = policies_of(results, asked)
    lines = [
        "| workload | " + " | ".join(policies) + " | gate / best peer | gate / ungated |",
        "| --- |" + " ---: |" * (len(policies) + 2),
    ]
    for label, row in rows.items():
        # The best is in bold only where every policy finished.
        top = max((capacity_of(r) for r in row.values()), default=0.0) if label in whole else 0.0
        cells = []
        for policy in policies:
            result = row.get(policy)
            text = "" if result is None else _cell(result)
            cells.append(f"**{text}**" if result is not None and top > 0 and capacity_of(result) == top else text)
        gate = row.get(GATE) if label in whole else None
        peer = best_peer(row)
        vs_peer = _ratio_text(ratio(capacity_of(gate), peer[1])) if gate and peer else "-"
        if gate and peer and vs_peer != "-":
            vs_peer += f" ({peer[0]})"
        ungated = row.get(UNGATED)
        vs_ungated = _ratio_text(ratio(capacity_of(gate), capacity_of(ungated))) if gate and ungated else "-"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {vs_peer} | {vs_ungated} |")
    return "\n".join(lines)


def limit_text(probe: Probe | None, slo: Slo) -> str:
    """What broke in a failing probe."""
    if probe is None:
        return "-"
    if probe.cut_short == "ttft":
        return f"TTFT: over 1% of requests past {slo.ttft_p99_s:g} s net of idle prefill (run cut short)"
    if probe.cut_short == "itl":
        return f"ITL: over 1% of tokens past {slo.itl_p99_s:g} s (run cut short)"
    broke = []
    if probe.ttft_excess_p99_s is not None and probe.ttft_excess_p99_s > slo.ttft_p99_s:
        broke.append(f"TTFT p99 net {_s(probe.ttft_excess_p99_s)} s")
    if probe.itl_p99_s is not None and probe.itl_p99_s > slo.itl_p99_s:
        broke.append(f"ITL p99 {_s(probe.itl_p99_s, 3)} s")
    if backlogged(probe, slo):
        broke.append(f"backlog ({probe.unserved} unserved, wait growth {_s(probe.wait_growth_s)} s)")
    return ", ".join(broke) or "-"


def failing_probe(result: Result) -> Probe | None:
    """The best setting's probe at the first load above the capacity (what stopped it)."""
    main = result.main
    if main.failed_at is None:
        return None
    setting = main.knobs if main.knobs is not None else settings_of(result.task.policy, result.task.quick)[0]
    for trial in main.trials:
        if trial.knobs == setting and math.isclose(trial.load, main.failed_at, rel_tol=1e-9):
            return trial.probe
    return None


def not_ahead_lines(results: Sequence[Result], asked: Sequence[str] | None = None) -> list[str]:
    """Per workload where the gate is not ahead of every peer: by how much, and what broke for the gate."""
    out = []
    for label, row in complete_rows(results, asked).items():
        gate, peer = row.get(GATE), best_peer(row)
        if gate is None or peer is None or capacity_of(gate) > peer[1]:
            continue
        winner = row[peer[0]]
        g, p = capacity_of(gate), peer[1]
        if g == p:
            how = f"ties with {peer[0]} at {_rps(p)} req/s"
        else:
            knobs = describe(winner.main.knobs or ())
            how = f"holds {_rps(g)} req/s, {1 - g / p:.0%} below {peer[0]} ({_rps(p)} req/s, {knobs})"
        slo = gate.main.slo
        at_gate, at_winner = gate.main.at_capacity, winner.main.at_capacity
        shares = ""
        if at_gate is not None and at_winner is not None:
            shares = (
                f" At their capacities the gate ran {_pct(at_gate.extend_share)} of busy rounds on the extend path "
                f"({_itl(at_gate)}), {peer[0]} {_pct(at_winner.extend_share)} ({_itl(at_winner)})."
            )
        out.append(
            f"- **{label}**: the gate ({describe(gate.main.knobs or ())}) {how}. What stopped the gate at "
            f"{_rps(_failed_rps(gate))} req/s: {limit_text(failing_probe(gate), slo)}.{shares}"
        )
    return out


def autotune_lines(results: Sequence[Result], asked: Sequence[str] | None = None) -> list[str]:
    """Per workload with both: gate-autotune's capacity over the best static gate's and over the best peer's."""
    out = []
    for label, row in complete_rows(results, asked).items():
        tuned, static, peer = row.get(AUTOTUNE), row.get(GATE), best_peer(row)
        if tuned is None or (static is None and peer is None):
            continue
        value = capacity_of(tuned)
        parts = [f"- **{label}**: gate-autotune holds {_rps(value)} req/s"]
        if static is not None:
            knobs = describe(static.main.knobs or ())
            parts.append(
                f"{_ratio_text(ratio(value, capacity_of(static)))} of the best static gate "
                f"({_rps(capacity_of(static))} req/s at {knobs})"
            )
        if peer is not None:
            parts.append(f"{_ratio_text(ratio(value, peer[1]))} of the best peer ({peer[0]}, {_rps(peer[1])} req/s)")
        out.append(", ".join(parts) + ".")
    return out


def _itl(probe: Probe) -> str:
    itl = "no decode" if probe.itl_p99_s is None else f"ITL p99 {_s(probe.itl_p99_s, 3)} s"
    if probe.extend_round_s is None or probe.ranks_per_extend is None:
        return itl
    rounds = f"extend rounds of {probe.extend_round_s * 1000:.0f} ms on average"
    return f"{itl}; {rounds}, {probe.ranks_per_extend:.1f} ranks extending"


def _failed_rps(result: Result) -> float | None:
    main = result.main
    if main.failed_at is None or main.capacity <= 0 or not main.capacity_rps:
        return None
    return main.capacity_rps * main.failed_at / main.capacity


def detail_table(row: Mapping[str, Result]) -> str:
    """Per policy at its capacity: the finishing probe's figures and what broke above it."""
    lines = [
        "| policy | capacity req/s | knobs | goodput req/s | TTFT p99 s | TTFT p99 net s | ITL p99 s | output tok/s "
        "| extend share | extend round ms | ranks / extend round | above it (first failing load) | runs |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for policy, result in row.items():
        at, slo = result.main.at_capacity, result.main.slo
        above = limit_text(failing_probe(result), slo)
        if at is None:
            lines.append(f"| {policy} | 0 | - | - | - | - | - | - | - | - | - | {above} | {result.runs} |")
            continue
        cells = [
            _rps(capacity_of(result)),
            describe(result.main.knobs or ()),
            _rps(at.goodput_rps),
            _s(at.ttft_p99_s),
            _s(at.ttft_excess_p99_s),
            _s(at.itl_p99_s, 3),
            f"{at.output_tok_s:.0f}",
            _pct(at.extend_share),
            "-" if at.extend_round_s is None else f"{at.extend_round_s * 1000:.0f}",
            _s(at.ranks_per_extend, 1),
            above,
            str(result.runs),
        ]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def frontier_table(row: Mapping[str, Result]) -> str:
    """Capacity (req/s) against the TTFT bound, a column per bound."""
    bounds = sorted({bound for result in row.values() for bound, _, _ in result.frontier})
    lines = [
        "| policy | " + " | ".join(f"TTFT <= {b:g} s" for b in bounds) + " |",
        "| --- |" + " ---: |" * len(bounds),
    ]
    for policy, result in row.items():
        values = {bound: (rps, setting) for bound, rps, setting in result.frontier}
        cells = []
        for bound in bounds:
            rps, setting = values.get(bound, (None, None))
            cells.append("-" if rps is None else f"{_rps(rps)} ({describe(setting) if setting is not None else '-'})")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline_table(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Per workload and preset: the gate's capacity, the best peer's, and their ratio (from `--json` records)."""
    presets = list(runs)
    lines = [
        "| workload | " + " | ".join(f"{p}: gate / best peer" for p in presets) + " |",
        "| --- |" + " --- |" * len(presets),
    ]
    labels = list(dict.fromkeys(rec["workload"] for recs in runs.values() for rec in recs))
    for label in labels:
        cells = []
        for preset in presets:
            rows = {rec["policy"]: rec for rec in runs[preset] if rec["workload"] == label}
            gate = rows.get(GATE)
            peers = [(name, rec["capacity_rps"] or 0.0) for name, rec in rows.items() if name not in GATES]
            if gate is None or not peers:
                cells.append("-")
                continue
            name, best = max(peers, key=lambda item: item[1])
            value = gate["capacity_rps"] or 0.0
            cells.append(f"{_rps(value)} / {_rps(best)} ({name}) = {_ratio_text(ratio(value, best))}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def records(results: Sequence[Result], preset: str) -> list[dict[str, Any]]:
    """The `--json` objects: one per (workload, policy)."""
    out = []
    for result in results:
        main, at = result.main, result.main.at_capacity
        out.append(
            {
                "workload": result.task.spec.label,
                "kind": result.task.spec.kind,
                "policy": result.task.policy,
                "preset": preset,
                "slo": {"ttft_p99_s": main.slo.ttft_p99_s, "itl_p99_s": main.slo.itl_p99_s},
                "knobs": dict(main.knobs) if main.knobs is not None else None,
                "load_unit": result.load_unit,
                "capacity_load": main.capacity,
                "failed_at_load": main.failed_at,
                "capacity_rps": main.capacity_rps if main.capacity > 0 else 0.0,
                "goodput_rps": at.goodput_rps if at else 0.0,
                "ttft_p99_s": _finite(at.ttft_p99_s) if at else None,
                "ttft_excess_p99_s": _finite(at.ttft_excess_p99_s) if at else None,
                "itl_p99_s": at.itl_p99_s if at else None,
                "output_tok_s": at.output_tok_s if at else None,
                "extend_share": at.extend_share if at else None,
                "extend_round_s": at.extend_round_s if at else None,
                "ranks_per_extend": at.ranks_per_extend if at else None,
                "frontier": [
                    {"ttft_p99_s": bound, "capacity_rps": rps, "knobs": dict(s) if s is not None else None}
                    for bound, rps, s in result.frontier
                ],
                "runs": result.runs,
                "wall_s": round(result.wall_seconds, 1),  # this pair's search, in its worker (for budgets)
                "quick": result.task.quick,
                "simulated": True,
            }
        )
    return out


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def method_lines(slo: Slo, quick: bool) -> list[str]:
    """How capacity is defined and searched (the text docs/tuning.md summarises)."""
    step = QUICK_STEP if quick else FULL_STEP
    return [
        "## Method",
        "",
        f"- **Capacity** of a policy on a workload: the highest load at which TTFT p99 <= {slo.ttft_p99_s:g} s, "
        f"ITL p99 <= {slo.itl_p99_s:g} s and nothing backlogs, over the measured window (warm-up excluded). "
        "The load is the arrival rate for the open-loop scenario shapes, the number of clients for a closed "
        "loop, the replay speed for a trace; every capacity is given in requests per second offered (a closed "
        "loop: served).",
        "- **TTFT** is judged net of each request's *idle prefill*: the rounds its uncached prompt takes on an "
        "otherwise idle group under the preset (0.1 s for a 1k prompt on h200-dp8-ep8, 3.3 s for a 60k one). "
        "The bound is then what the policy and the queue add, so a 60k prompt or a long trace prompt does not "
        "fail every policy alike. Both the raw TTFT p99 and the net one are in the details.",
        "- **ITL** p99: every inter-token gap of a round in the window, weighted by the requests that waited it "
        "(the simulator's cohorts). Output length 1 has no gaps.",
        f"- **Backlog**: a window request without its first token {DRAIN_S:g} s (plus its idle prefill) after the "
        "last arrival, or the median net TTFT of the window's last third of arrivals above that of its first "
        "third by more than half the TTFT bound (a growing queue adds its growth to every later wait).",
        "- **Goodput**: window requests meeting both SLOs per second, judged per request DistServe-style: net "
        f"TTFT <= {slo.ttft_p99_s:g} s and TPOT (mean gap over its decode, (finish - first token) / (output - 1)) "
        f"<= {slo.itl_p99_s:g} s, from a run at the capacity in which every window request runs to its end"
        + (
            " (--quick: at most 60 s after the last arrival; a request still decoding then is judged on its TTFT)"
            if quick
            else ""
        )
        + ". The simulator keeps ITL per cohort of requests, not per request, so a per-request ITL p99 is not "
        "available.",
        f"- **Search**: bisection on a geometric lattice of loads, {step:.0%} apart (the capacity is exact to one "
        "step); a load holds when some setting of the policy's grid holds it. A full run then walks the best "
        "setting's neighbours (each knob one rung up or down) while that raises the capacity. A run stops as "
        "soon as more than 1% of the window's requests (or decode tokens) are certainly over the bound.",
        "- **Same requests**: a shape's arrivals come from one exponential stream scaled by the rate, so every "
        "load, policy and setting sees the same requests, only sooner or later.",
    ]


def _starts(quick: bool) -> str:
    """gate-autotune's launch configs in this mode: `A=8 K=32, A=1 K=2 or A=1 K=16`."""
    starts = list(dict.fromkeys(f"A={dict(s)['A']:g} K={dict(s)['K']:g}" for s in settings_of(AUTOTUNE, quick)))
    return starts[0] if len(starts) == 1 else f"{', '.join(starts[:-1])} or {starts[-1]}"


def render(
    results: Sequence[Result],
    preset: CostPreset,
    command: str,
    slo: Slo,
    *,
    quick: bool,
    charts: Mapping[str, str] | None = None,
    other_presets: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    preset_notes: Sequence[str] = (),
    partial: tuple[int, int] | None = None,
    policies: Sequence[str] | None = None,
) -> str:
    """The capacity report (module docstring); `partial` (finished, total) labels an interrupted run's, and
    `policies` (those asked for) keeps the columns of policies that never finished."""
    mode = "QUICK (shorter runs, smaller grids, coarser steps: a smoke run, not the measurement)" if quick else "full"
    lines = [
        f"# Capacity lab: goodput capacity per workload, every policy at its best (SIMULATED, preset {preset.name})",
        "",
        f"Command: `{command}` ({mode} run). Every figure is SIMULATED: the lockstep simulator on the virtual "
        f"clock with the cost preset `{preset.name}` ({preset.hardware}; {preset.model}), not a measurement of "
        "that hardware.",
        "",
        *(
            [
                f"**PARTIAL**: the run was interrupted; {partial[0]} of {partial[1]} (workload, policy) pairs "
                "finished. A blank cell was not measured; a ratio or a sentence that needs a blank cell is left out.",
                "",
            ]
            if partial
            else []
        ),
        f"## Capacity, req/s (SIMULATED, {preset.name}): TTFT p99 <= {slo.ttft_p99_s:g} s net of idle prefill, "
        f"ITL p99 <= {slo.itl_p99_s:g} s, no backlog",
        "",
        "Cells: the capacity in requests per second (for a trace also the replay speed) and the knobs that "
        "reached it, the best in bold; `>=` where the search's ceiling held. The last two columns are the gate's "
        "capacity over the best peer's and over ungated's (gate-autotune is the gate too, never its peer).",
        "",
        capacity_table(results, policies),
        "",
    ]
    behind = not_ahead_lines(results, policies)
    if behind:
        lines += ["Where the gate is not ahead of every peer:", "", *behind, ""]
    elif (whole := complete_rows(results, policies)) and all(GATE in row and best_peer(row) for row in whole.values()):
        lines += ["The gate is ahead of every peer on every workload.", ""]
    tuned = autotune_lines(results, policies)
    if tuned:
        lines += [
            f"{AUTOTUNE} (the gate launched at {_starts(quick)}, the start that won named in the table, and moved "
            "live by the tuner toward this SLO; docs/autotune.md) against the gate at its best static (A, K) and "
            "against the best peer:",
            "",
            *tuned,
            "",
        ]
    if other_presets:
        lines += [
            "## The headline under other presets (SIMULATED)",
            "",
            "The gate's capacity over the best peer's (req/s), per preset run found beside this report "
            "(`lab/capacity-<preset>[-quick].json`, each made by the same command with `--preset`): how much the "
            "conclusion depends on the cost model. A quick run is a smoke run: shorter windows, smaller grids.",
            *(["", *preset_notes] if preset_notes else []),
            "",
            headline_table(other_presets),
            "",
        ]
    lines += ["## Details per workload", ""]
    for label, row in by_workload(results).items():
        first = next(iter(row.values()))
        lines += [
            f"### {label} (SIMULATED, {preset.name})",
            "",
            f"{first.what}. Load: {first.load_unit}.",
            "",
            detail_table(row),
            "",
        ]
        if any(len(result.frontier) > 1 for result in row.values()):
            lines += [
                "Capacity (req/s) against the TTFT bound (ITL bound fixed; each policy at the setting it reached its "
                "capacity with under the main bound):",
                "",
                frontier_table(row),
                "",
            ]
        path = (charts or {}).get(label)
        if path:
            alt = f"{label}: TTFT p99 against load, capacity against the TTFT bound, SIMULATED on {preset.name}"
            lines += [f"![{alt}]({path})", ""]
    lines += method_lines(slo, quick)
    lines += ["", "Knob grids (the upstream default first; a full run refines from the best):", ""]
    for policy in dict.fromkeys(result.task.policy for result in results):
        grid = settings_of(policy, quick)
        lines.append(f"- {policy}: " + ("; ".join(describe(s) for s in grid) if grid != ((),) else "no knobs"))
    return "\n".join(lines) + "\n"
