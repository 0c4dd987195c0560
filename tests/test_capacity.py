"""The capacity lab (issue 11): the bisection, the probe's verdict, knobs, targets, the report and the command."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import ServerArgs
from engine.executor.presets import RankWork, preset_named, preset_names
from lab.capacity import Lattice, Plan, Slo, Target, TargetSpec, bisect_capacity, find_capacity, knobs, verdict
from lab.capacity.cli import add_capacity_arguments, capacity_main, preset_notes
from lab.capacity.knobs import SPACES, configure, describe, settings_of, space_of
from lab.capacity.probe import Probe, backlogged, idle_prefill_seconds, run_probe
from lab.capacity.report import capacity_table, records, render
from lab.capacity.runner import CurvePoint, Interrupted, Result, Task, run_order, run_tasks
from lab.capacity.search import Capacity, Searcher
from lab.capacity.targets import target_of, trace_specs
from lab.scenarios import scenario_names
from workloads import Bursts, Fixed, Workload

PRESET = preset_named("h200-dp8-ep8")
LATTICE = Lattice(base=1.0, step=0.05, floor=1 / 64, ceiling=64.0)


# -- the bisection, pure ---------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(capacity=st.floats(min_value=0.05, max_value=50.0), hint=st.floats(min_value=0.02, max_value=60.0))
def test_bisection_finds_a_closed_form_capacity_to_one_step(capacity: float, hint: float):
    # Toy policy: a queue that holds exactly up to `capacity` (a server of that rate). The search must answer
    # the highest lattice load at or below it, with the failing neighbour above it, from any starting hint.
    asked: list[float] = []

    def holds(load: float) -> bool:
        asked.append(load)
        return load <= capacity

    found = bisect_capacity(holds, LATTICE, hint=hint)
    assert found.capacity <= capacity < found.failed_at
    assert found.failed_at == pytest.approx(found.capacity * 1.05)
    assert len(asked) == len(set(asked)) <= 2 * math.log2(64 * 64) + 8  # logarithmic, never a load twice
    assert [load for load, _ in found.probes] == asked


def test_bisection_edges_floor_ceiling_and_a_known_pass():
    # Nothing holds: capacity 0 and the floor named as failing; everything holds: the ceiling, no failing load.
    none = bisect_capacity(lambda load: False, LATTICE)
    assert none.capacity == 0.0 and none.failed_at == pytest.approx(1 / 64, rel=0.05)
    every = bisect_capacity(lambda load: True, LATTICE)
    assert every.capacity == pytest.approx(64.0, rel=0.05) and every.failed_at is None
    # A load known to hold is never asked again, and the search starts from it.
    asked: list[float] = []
    found = bisect_capacity(lambda load: asked.append(load) or load <= 3.0, LATTICE, known=2.0)
    assert all(load > 2.0 for load in asked) and found.capacity <= 3.0 < found.failed_at


def test_bisection_on_a_noisy_predicate_still_answers_a_neighbour_pair():
    # Not monotone (a lucky pass above the knee): the answer is a load that held with a failing neighbour.
    answers: dict[float, bool] = {}

    def noisy(load: float) -> bool:
        answers[load] = load <= 5.0 or 7.0 <= load <= 7.5
        return answers[load]

    found = bisect_capacity(noisy, LATTICE, hint=1.0)
    assert answers[found.capacity] and not answers[found.failed_at]
    assert found.failed_at == pytest.approx(found.capacity * 1.05)


def test_lattice_refuses_bad_bounds():
    with pytest.raises(ValueError, match="floor <= base <= ceiling"):
        Lattice(base=1.0, step=0.05, floor=2.0, ceiling=4.0)
    with pytest.raises(ValueError, match="step > 0"):
        Lattice(base=1.0, step=0.0, floor=0.5, ceiling=4.0)


# -- a toy policy on the simulator, capacity known in closed form -----------------------------------------------

TOY_PROMPT = 8192  # exactly one chunk of the budget: one prompt per round


def _toy_target(window_s: float = 60.0, warmup_s: float = 10.0) -> Target:
    """One rank, ungated, one-chunk prompts at a fixed period, output length 1 (nothing decodes): a D/D/1 queue
    whose server takes one extend round, t_e, per request; it holds any rate below 1 / t_e and backlogs above."""
    args = ServerArgs(executor="sim", dp_size=1, max_num_seqs=8, chunked_prefill_size=TOY_PROMPT, page_size=64)

    def build(load: float, until: float) -> Workload:
        return Workload(Bursts(1, 1 / load), dp_size=1, prompt=Fixed(TOY_PROMPT), output=Fixed(1), until=until)

    def plan(load: float) -> Plan:
        return Plan(warmup_s + window_s, warmup_s, load * window_s + 2)

    spec = TargetSpec("scenario", "toy-queue")
    return Target(spec, "a D/D/1 queue", "req/s", 1.0, 1, args, build, plan, lambda load: load)


def test_find_capacity_on_a_toy_queue_matches_its_closed_form():
    # Capacity in closed form: 1 / t_e, t_e the preset's round for one rank extending one full chunk.
    round_s = PRESET.work_seconds((RankWork(0, TOY_PROMPT, 0),))
    searcher = Searcher(_toy_target(), "ungated", PRESET)
    searcher.lattice = Lattice(base=1.0, step=0.02, floor=0.1, ceiling=8.0)
    found = find_capacity(searcher.target, "ungated", (), Slo(), preset=PRESET, searcher=searcher)
    assert found.capacity <= 1 / round_s * 1.02 and found.failed_at is not None and found.failed_at > 1 / round_s
    assert found.capacity >= 1 / round_s / 1.02**2  # to one lattice step (plus the last one that queues slowly)
    at = found.at_capacity
    assert at is not None and verdict(at, Slo()) is True and at.unserved == 0
    assert at.itl_p99_s is None and at.goodput_rps == pytest.approx(at.offered_rps)  # nothing decodes
    assert found.knobs == () and found.capacity_rps == found.capacity


def test_probe_verdicts_below_and_above_the_toy_capacity():
    target = _toy_target()
    round_s = PRESET.work_seconds((RankWork(0, TOY_PROMPT, 0),))
    args, factory = configure("ungated", (), target.base_args)

    def probe(load: float, exit_slo: Slo | None) -> Probe:
        return run_probe(
            args, factory, target.workload(load), target.plan(load), PRESET, load=load, slo=Slo(), exit_slo=exit_slo
        )

    below = probe(0.8 / round_s, Slo())
    assert below.ttft_excess_p99_s == pytest.approx(0.0, abs=0.01)  # a lone request waits only for its round
    assert below.ttft_p99_s == pytest.approx(idle_prefill_seconds(PRESET, TOY_PROMPT, TOY_PROMPT, 1), rel=0.01)
    assert verdict(below, Slo()) is True and not backlogged(below, Slo())
    above = probe(1.5 / round_s, Slo(1.0, 0.2))
    assert above.cut_short == "ttft"  # certainly over 1 s for more than 1% of requests: stopped early
    assert verdict(above, Slo(1.0, 0.2)) is False and verdict(above, Slo(0.5, 0.2)) is False
    assert verdict(above, Slo(60.0, 0.2)) is None  # its figures cannot judge a looser bound
    full = probe(1.5 / round_s, None)
    assert full.cut_short is None and verdict(full, Slo(60.0, 0.2)) is False  # the queue grows: backlog
    assert full.wait_growth_s > 5 and full.rounds > above.rounds


def test_slo_must_be_positive():
    with pytest.raises(ValueError, match="must be > 0"):
        Slo(0.0, 0.2)


# -- knobs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(SPACES))
def test_every_grid_setting_and_its_neighbours_configure(policy: str):
    # Every knob setting the lab can try builds a runnable policy, the upstream default first in a full grid.
    base = target_of(TargetSpec("scenario", "scattered")).base_args
    space = space_of(policy)
    full = settings_of(policy, quick=False)
    assert full[0] == space.default and len(set(full)) == len(full)
    for setting in {*full, *settings_of(policy, quick=True), *(n for s in full for n in space.refine(s))}:
        args, factory = configure(policy, setting, base)
        assert factory(0, args).name == ("gate" if policy == "gate-autotune" else policy)  # the tuner moves a gate


def test_gate_neighbours_keep_k_at_least_a():
    neighbours = space_of("gate").refine(knobs(A=8, K=8))
    assert knobs(A=16, K=8) not in neighbours and knobs(A=4, K=8) in neighbours and knobs(A=8, K=16) in neighbours
    assert describe(knobs(K=32, A=8)) == "A=8 K=32" and describe(()) == "defaults"
    with pytest.raises(ValueError, match="unknown policy"):
        space_of("nagle")


# -- targets ---------------------------------------------------------------------------------------------------


def test_a_shape_offers_the_same_requests_sooner_at_a_higher_rate():
    # Same requests at every load: arrival times scale with 1 / rate, lengths and ranks are unchanged.
    target = target_of(TargetSpec("scenario", "kv-pressure", quick=True))
    slow = target.workload(2.0).due(30.0)
    fast = target.workload(4.0).due(15.0)
    assert len(slow) == len(fast) > 20
    for (rank_a, a), (rank_b, b) in zip(slow, fast, strict=True):
        assert (rank_a, a.prompt_len, a.output_len) == (rank_b, b.prompt_len, b.output_len)
        assert b.arrival == pytest.approx(a.arrival / 2)
    plan = target.plan(2.0)
    assert (
        plan.warmup_end > 0 and not target.workload(2.0).due(plan.arrival_end + 1.0)[-1][1].arrival > plan.arrival_end
    )


SHARED_TRACES = Path(os.environ.get("PREFILL_GATE_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
AZURE = SHARED_TRACES / "traces" / "azure-llm-2023-conv.csv"


@pytest.mark.skipif(not AZURE.is_file(), reason=f"shared trace not found at {AZURE} (set PREFILL_GATE_SHARED)")
def test_a_trace_row_is_a_window_replayed_faster():
    # A trace's load is its speed: the window (after warm-up) offers proportionally more requests per second and
    # its arrivals end proportionally sooner; the window's requests are the same at every speed.
    target = target_of(trace_specs((str(AZURE),), 0, True)[0])
    assert target.load_unit == "x speed" and "trace seconds 600-640" in target.what
    assert target.offered_rps(3.0) == pytest.approx(3 * target.offered_rps(1.0))
    slow, fast = target.plan(1.0), target.plan(4.0)
    assert fast.arrival_end == pytest.approx(slow.arrival_end / 4) and fast.max_requests == slow.max_requests
    issued = target.workload(4.0).due(fast.arrival_end)
    assert [s.prompt_len for _, s in issued] == [s.prompt_len for _, s in target.workload(1.0).due(slow.arrival_end)]
    in_window = sum(1 for _, s in issued if s.arrival >= fast.warmup_end)
    assert in_window == fast.max_requests and target.offered_rps(4.0) == pytest.approx(in_window / fast.window_s)


def _azure_csv(path: Path, prompt_len: int) -> Path:
    start = datetime(2023, 11, 16, 18, 0, 0)
    rows = [f"{start + timedelta(seconds=t)},{prompt_len},50" for t in range(800)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def test_a_full_run_keeps_the_quick_window_on_a_trace_too_heavy_to_replay(tmp_path):
    # A probe simulates the replay at the speed the group holds (a few thousand prompt tokens/s), so a full
    # window offering millions of prompt tokens would simulate an hour per probe: such a trace gets the quick
    # window in a full run, and the row says so; a light trace keeps the full window.
    light = target_of(trace_specs((str(_azure_csv(tmp_path / "light.csv", 1_000)),), 0, False)[0])
    heavy_spec = trace_specs((str(_azure_csv(tmp_path / "heavy.csv", 30_000)),), 0, False)[0]
    heavy, heavy_quick = target_of(heavy_spec), target_of(replace(heavy_spec, quick=True))
    assert "trace seconds 600-710" in light.what and "quick window" not in light.what
    assert light.plan(1.0).window_s == pytest.approx(90.0)
    assert "trace seconds 600-640" in heavy.what and "offers 3.3M prompt tokens" in heavy.what
    assert heavy.plan(1.0) == heavy_quick.plan(1.0)


def test_a_malformed_trace_is_one_line_naming_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.0,x,1\n"
    )
    out = tmp_path / "out"
    assert capacity_main(_ns("--scenarios", "--trace", str(bad), "--out", str(out))) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prefill-gate lab capacity: error: ") and f"{bad}:3" in err and len(err.splitlines()) == 1
    assert not out.exists()


# -- the report ------------------------------------------------------------------------------------------------


def _probe(load: float, *, itl: float = 0.15, share: float = 0.1, cut: str | None = None) -> Probe:
    return Probe(
        load, 100, load, 0.4, 0.3, itl, 1000.0, share, 0.12, 7.5, 0.0, 0, cut, Slo(), load * 0.99, 0.99, 10, 60.0, 0.1
    )


def _result(workload: str, policy: str, capacity: float, setting=(), *, broke: str | None = "itl") -> Result:
    failed = capacity * 1.05
    trials = [] if broke is None else [_trial(setting, failed, broke)]
    main = Capacity(workload, policy, Slo(), capacity, failed, setting, capacity, _probe(capacity), tuple(trials))
    curve = (CurvePoint(capacity, capacity, 0.4, 0.3, 0.15, True, None),)
    frontier = ((1.0, capacity / 2, setting), (2.0, capacity, setting))
    task = Task(TargetSpec("scenario", workload), policy, PRESET.name, Slo(), (1.0, 2.0))
    return Result(task, f"{workload} shape", "req/s", main, frontier, curve, 7, 1.0)


def _trial(setting, load, broke):
    from lab.capacity.search import Trial

    return Trial(setting, load, False, _probe(load, itl=0.6, cut=None if broke == "itl" else broke))


RESULTS = [
    _result("scattered", "ungated", 6.0),
    _result("scattered", "gate", 20.0, knobs(A=1, K=2)),
    _result("scattered", "vllm-cadence", 24.0, knobs(interval=2)),
    _result("bursty", "ungated", 10.0),
    _result("bursty", "gate", 16.0, knobs(A=8, K=32)),
    _result("bursty", "vllm-cadence", 12.0, knobs(interval=2)),
]


def test_report_opens_with_one_capacity_table_and_says_where_the_gate_is_behind():
    text = render(RESULTS, PRESET, "prefill-gate lab capacity", Slo(), quick=False)
    head, rest = text.split("## Details per workload")
    assert text.startswith("# Capacity lab") and "SIMULATED" in head and PRESET.name in head
    assert head.count("| workload |") == 1 and capacity_table(RESULTS) in head  # the one table comes first
    assert (
        "| scattered | 6.00 (defaults) | 20.0 (A=1 K=2) | **24.0 (interval=2)** | 0.83x (vllm-cadence) | 3.33x |"
        in head
    )
    assert (
        "| bursty | 10.0 (defaults) | **16.0 (A=8 K=32)** | 12.0 (interval=2) | 1.33x (vllm-cadence) | 1.60x |" in head
    )
    # Behind on scattered: by how much, and what stopped the gate; bursty is not listed (the gate leads there).
    assert "**scattered**: the gate (A=1 K=2) holds 20.0 req/s, 17% below vllm-cadence" in head
    assert "ITL p99 0.600 s" in head and "**bursty**" not in head
    assert "TTFT <= 1 s" in rest and "## Method" in rest and "wall" not in text.lower()


def test_autotune_is_no_peer_and_is_compared_with_the_best_static_gate_and_peer():
    # gate-autotune beats vllm-cadence on scattered: still the gate's best *peer* is vllm-cadence, and the
    # autotune paragraph gives its ratio to the best static gate and to that peer.
    tuned = [*RESULTS, _result("scattered", "gate-autotune", 30.0, knobs(A=1, K=4))]
    head = render(tuned, PRESET, "prefill-gate lab capacity", Slo(), quick=False).split("## Details")[0]
    assert "| 0.83x (vllm-cadence) | 3.33x |" in head and "17% below vllm-cadence" in head
    assert (
        "**scattered**: gate-autotune holds 30.0 req/s, 1.50x of the best static gate (20.0 req/s at A=1 K=2), "
        "1.25x of the best peer (vllm-cadence, 24.0 req/s)." in head
    )
    assert "**bursty**: gate-autotune" not in head  # no autotune result there, no line


def test_records_hold_the_issue_fields_per_workload_and_policy():
    out = records(RESULTS, PRESET.name)
    assert len(out) == len(RESULTS)
    fields = {"workload", "policy", "knobs", "capacity_rps", "goodput_rps", "ttft_p99_s", "itl_p99_s"}
    assert all(fields | {"output_tok_s", "extend_share", "simulated"} <= set(rec) for rec in out)
    gate = next(rec for rec in out if rec["policy"] == "gate" and rec["workload"] == "scattered")
    assert gate["knobs"] == {"A": 1, "K": 2} and gate["capacity_rps"] == 20.0 and gate["goodput_rps"] == 19.8
    assert gate["wall_s"] == 1.0  # the search's own time, for budgeting a run
    json.dumps(out)  # serialisable as it is


# -- the command -----------------------------------------------------------------------------------------------


def _ns(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_capacity_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--scenarios", "sparse"), "unknown scenario 'sparse'"),
        (("--policies", "nagle"), "unknown policy 'nagle'"),
        (("--preset", "tpu-v9"), "unknown sim preset 'tpu-v9'"),
        (("--slo-ttft-p99", "0"), "--slo-ttft-p99 must be a finite number of seconds > 0"),
        (("--slo-itl-p99", "-1"), "--slo-itl-p99 must be"),
        (("--slo-itl-p99", "nan"), "--slo-itl-p99 must be"),
        (("--jobs", "0"), "--jobs must be >= 1"),
        (("--frontier", "0.5", "inf"), "--frontier bounds must be"),
        (("--trace", "no-such-trace.csv"), "trace file 'no-such-trace.csv' does not exist"),
        (("--scenarios",), "need at least one workload"),
        (("--json", "/no/such/dir/x.json"), "--json: directory of"),
    ],
)
def test_bad_input_is_one_line_exit_two_and_writes_nothing(argv, message, capsys, tmp_path):
    assert capacity_main(_ns(*argv, "--out", str(tmp_path))) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_bad_input_from_the_command_line_has_no_traceback():
    # One process end to end: exit 2, our one line, no traceback.
    argv = [sys.executable, "-m", "lab.capacity", "--scenarios", "sparse"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    known = ", ".join(scenario_names())
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip() == f"prefill-gate lab capacity: error: unknown scenario 'sparse'; known scenarios: {known}"
    )


def test_command_writes_report_json_and_charts(tmp_path, monkeypatch, capsys):
    # The command's plumbing, with the searches replaced by fixed results: lab.md (a full run on the default
    # preset), the records as JSON twice, one chart per workload linked from the report.
    monkeypatch.setattr("lab.capacity.cli.run_tasks", lambda tasks, jobs: RESULTS)
    out = tmp_path / "results"
    argv = ("--scenarios", "scattered", "bursty", "--policies", "ungated", "gate", "vllm-cadence")
    assert capacity_main(_ns(*argv, "--out", str(out), "--json", str(tmp_path / "x.json"))) == 0
    report = (out / "lab.md").read_text()
    assert report.startswith("# Capacity lab") and "## Run" in report and "Wall time" in report
    assert "`prefill-gate lab capacity --scenarios scattered bursty --policies ungated gate vllm-cadence`" in report
    assert json.loads((tmp_path / "x.json").read_text()) == json.loads(
        (out / "lab" / "capacity-h200-dp8-ep8.json").read_text()
    )
    for name in ("scattered", "bursty"):
        data = (out / "lab" / "capacity-h200-dp8-ep8" / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and f"](lab/capacity-h200-dp8-ep8/{name}.png)" in report
    assert "| workload |" in capsys.readouterr().out
    # A quick run never replaces the measurement: it writes beside it.
    assert capacity_main(_ns(*argv, "--out", str(out), "--quick", "--no-charts")) == 0
    assert (out / "lab" / "capacity-h200-dp8-ep8-quick.md").read_text().count("QUICK") >= 1
    assert (out / "lab.md").read_text() == report


def test_an_interrupted_run_keeps_what_finished(monkeypatch):
    # The second task is interrupted: the first one's result survives, in an Interrupted naming the total.
    calls: list[Task] = []

    def run_task(task: Task) -> Result:
        calls.append(task)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return RESULTS[0]

    monkeypatch.setattr("lab.capacity.runner.run_task", run_task)
    tasks = [RESULTS[0].task, RESULTS[1].task, RESULTS[2].task]
    with pytest.raises(Interrupted) as info:
        run_tasks(tasks, jobs=1)
    assert info.value.results == [RESULTS[0]] and info.value.total == 3 and len(calls) == 2


def test_an_interrupted_command_writes_a_partial_report_and_fails(tmp_path, monkeypatch, capsys):
    # Interrupted after two of six pairs: the report says PARTIAL, shows what finished, draws no ratio from an
    # incomplete row, and the command does not end with the status of a success.
    def interrupted(tasks, jobs):
        raise Interrupted(RESULTS[:2], len(tasks))

    monkeypatch.setattr("lab.capacity.cli.run_tasks", interrupted)
    out = tmp_path / "results"
    argv = ("--scenarios", "scattered", "bursty", "--policies", "ungated", "gate", "vllm-cadence", "--no-charts")
    assert capacity_main(_ns(*argv, "--out", str(out))) == 130
    report = (out / "lab.md").read_text()
    assert "**PARTIAL**" in report and "2 of 6 (workload, policy) pairs finished" in report
    assert "| scattered | 6.00 (defaults) | 20.0 (A=1 K=2) |  | - | - |" in report and "| bursty |" not in report
    assert "below vllm-cadence" not in report  # no comparison with a peer that never ran
    assert len(json.loads((out / "lab" / "capacity-h200-dp8-ep8.json").read_text())) == 2
    assert "PARTIAL" in capsys.readouterr().err


def test_tasks_run_workload_by_workload_costliest_first():
    # Whole rows finish together (an interrupted run keeps whole rows); the trace row, costliest, goes first.
    policies = ("ungated", "gate", "vllm-cadence")
    specs = [TargetSpec("scenario", "scattered"), TargetSpec("trace", "x.csv"), TargetSpec("scenario", "bursty")]
    tasks = [Task(spec, policy, PRESET.name, Slo()) for spec in specs for policy in policies]
    rows = [tasks[i].spec.name for i in run_order(tasks)]
    assert rows == ["x.csv"] * 3 + ["scattered"] * 3 + ["bursty"] * 3  # equal cost: the order given
    assert tasks[run_order(tasks)[0]].policy == "gate"  # the largest grid of its row first


def test_a_run_without_the_gate_or_its_peers_claims_no_lead():
    # gate-autotune alone: no static gate, no peer, so no sentence about the gate being ahead.
    alone = [_result("scattered", "gate-autotune", 3.0, knobs(A=8, K=32))]
    text = render(alone, PRESET, "prefill-gate lab capacity", Slo(), quick=True)
    assert "ahead of every peer" not in text and "| scattered | **3.00 (A=8 K=32)** | - | - |" in text


def test_a_policy_that_starves_decode_fails_on_the_gaps_still_open():
    # rule F1 (non-mixed: a rank that extends does not decode). Far above capacity every rank extends every
    # round on the non-mixed engine, so no decoding request gets its next token inside the window: no gap
    # closes there. The gaps still open at the window's end count, so the probe fails on ITL instead of
    # passing with no ITL figure.
    target = target_of(TargetSpec("scenario", "osl-variance", quick=True))
    searcher = Searcher(target, "ungated", PRESET, quick=True)
    overloaded = searcher.probe(knobs(mixed=0), 32.0, Slo(2.0, 0.5))
    assert overloaded.extend_share == 1.0  # every busy round of the window extends
    assert overloaded.itl_p99_s is not None and overloaded.itl_p99_s > 5.0
    assert verdict(overloaded, Slo(2.0, 0.5)) is False
    healthy = searcher.probe(knobs(mixed=0), 2.0, Slo(2.0, 0.5))
    assert healthy.itl_p99_s is not None and healthy.itl_p99_s < 0.5 and verdict(healthy, Slo(2.0, 0.5)) is True


def test_the_preset_notes_name_the_mildest_and_steepest_by_the_figure_they_print():
    # The report marks the mildest and the steepest preset; the figure printed beside the mark must be the one
    # that ranks them (the registry's lone-prompt ratio), not another measure that ranks them differently.
    notes = preset_notes(list(preset_names()))
    ticks = {line.split("`")[1]: float(line.split("costs ")[1].split(" decode ticks")[0]) for line in notes}
    (mildest,) = [line.split("`")[1] for line in notes if "(the mildest preset)" in line]
    (steepest,) = [line.split("`")[1] for line in notes if "(the steepest preset)" in line]
    assert ticks[mildest] == min(ticks.values()) and ticks[steepest] == max(ticks.values())
