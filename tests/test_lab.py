"""The policy lab (issue 8): determinism, the oracle bound, ratios, the sweep, bad input, the spread metric, charts."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import pytest

from engine.executor.presets import preset_named
from engine.metrics import RunMetrics
from engine.rows import Row
from lab.cli import add_lab_arguments, lab_main, main
from lab.phase import PhaseStats, phase_stats, thin_series
from lab.report import (
    METRIC_BY_KEY,
    Better,
    compare,
    gate_vs_best_peer,
    gate_vs_oracle,
    render_report,
    same_requests,
    verdict,
)
from lab.runner import Cell, CellSpec, LabConfig, OracleFigures, run_cells, run_lab
from lab.sweep import SweepPoint, grid, pick_best, sweep_specs

SMALL = LabConfig(
    scenarios=("scattered", "long-chunked-offset"),
    policies=("ungated", "gate", "sglang-delayer"),
    scale=0.03,
)
PRESET = preset_named("h200-dp8-ep8")


@pytest.fixture(scope="module")
def small_lab() -> dict[str, list[Cell]]:
    """A reduced lab run once with two worker processes, shared by the tests that only read it."""
    return run_lab(SMALL, jobs=2)


def _report(groups: dict[str, list[Cell]]) -> str:
    return render_report(groups, PRESET, "prefill-gate lab --scale 0.03", "gate A=8, K=32")


# -- determinism -----------------------------------------------------------------------------------------------


def test_same_lab_twice_gives_the_same_report_whatever_the_workers(small_lab):
    # Determinism: a second run (in-process this time) renders exactly the same text as the parallel one.
    again = run_lab(SMALL, jobs=1)
    assert _report(again) == _report(small_lab)
    assert [c.spec.policy for c in again["scattered"]] == list(SMALL.policies)  # order follows the config


def test_report_names_the_preset_and_says_simulated(small_lab):
    # Labelling: every section says SIMULATED and names the preset; wall times never enter the report.
    text = _report(small_lab)
    assert text.count("SIMULATED") >= 1 + len(SMALL.scenarios)
    assert "h200-dp8-ep8" in text and PRESET.source in text
    assert "wall" not in text.lower()
    assert "*oracle bound*" in text and "Gate / best peer" in text and "Gate / oracle bound" in text


# -- the oracle bound ------------------------------------------------------------------------------------------


def test_oracle_extend_rounds_never_beat_by_a_policy(small_lab):
    # Oracle: the bound's extend rounds are <= every policy's extend rounds on the same run's requests.
    for cells in small_lab.values():
        for cell in cells:
            assert cell.oracle.extend_rounds <= cell.summary.extend_rounds, cell.spec
            assert cell.extend_over_oracle is None or cell.extend_over_oracle >= 1.0


def test_open_loop_policies_are_offered_the_same_requests(small_lab):
    # Same requests: in an open-loop scenario every policy sees the identical request list.
    cells = small_lab["scattered"]
    shortest = min(len(cell.request_list) for cell in cells)
    assert len({cell.request_list[:shortest] for cell in cells}) == 1 and shortest > 10
    assert same_requests(cells) and not same_requests([*cells[:1], _cell("gate")])


# -- ratios on hand-made summaries -----------------------------------------------------------------------------


def _cell(policy: str, extend_rounds: int = 10, oracle_rounds: int = 5, **summary) -> Cell:
    base = dataclasses.replace(RunMetrics().summary(), extend_rounds=extend_rounds, **summary)
    phase = PhaseStats(8192, (0,), 0.0, 0.0, 0, 0, ())
    oracle = OracleFigures(oracle_rounds, oracle_rounds, 8.0, 10_000.0)
    return Cell(
        spec=CellSpec("scattered", policy),
        summary=base,
        oracle=oracle,
        phase=phase,
        waiting_at_end=0,
        requests=1,
        request_list=((0, 9, 0, 9),),
        arrivals=(0.0,),
        offered_output_tokens=9,
        stopped_by="duration",
        rounds=1,
        sim_seconds=1.0,
        wall_seconds=0.0,
    )


def test_ratios_to_the_best_peer_follow_each_metrics_direction():
    # Ratios: higher-is-better picks the peer maximum, lower-is-better the minimum; ratio is gate / best.
    cells = [
        _cell("gate", output_tokens_per_s=900.0, ttft_p99_s=2.0, itl_p50_s=0.03, extend_rounds=10),
        _cell("ungated", output_tokens_per_s=800.0, ttft_p99_s=0.5, itl_p50_s=0.10, extend_rounds=40),
        _cell("vllm-cadence", output_tokens_per_s=1000.0, ttft_p99_s=1.0, itl_p50_s=0.06, extend_rounds=20),
    ]
    got = {c.metric: c for c in gate_vs_best_peer(cells)}
    assert (got["tok_s"].other_name, got["tok_s"].ratio, got["tok_s"].verdict) == ("vllm-cadence", 0.9, "worse")
    assert (got["ttft_p99"].other_name, got["ttft_p99"].ratio, got["ttft_p99"].verdict) == ("ungated", 4.0, "worse")
    assert (got["itl_p50"].other_name, got["itl_p50"].ratio, got["itl_p50"].verdict) == ("vllm-cadence", 0.5, "better")
    # extend rounds over the oracle bound: 10/5 = 2 for the gate against the best peer's 20/5 = 4.
    assert (got["extend_over_oracle"].ratio, got["extend_over_oracle"].verdict) == (0.5, "better")
    assert got["ttft_p50"].verdict == "n/a"  # nobody has a value: no ratio
    assert (got["tok_s"].place, got["tok_s"].of, got["itl_p50"].place, got["ttft_p99"].place) == (2, 3, 1, 3)


def test_ratio_to_the_oracle_and_edge_cases():
    # Oracle ratios and edge cases: a zero denominator has no ratio; within 0.5% is a tie.
    oracle = {c.metric: c for c in gate_vs_oracle([_cell("gate", output_tokens_per_s=2500.0)])}
    assert oracle["tok_s"].ratio == 0.25 and oracle["tok_s"].verdict == "worse"
    assert oracle["extend_over_oracle"].ratio == 2.0
    wait = compare(METRIC_BY_KEY["wait_max"], 1.0, 0.0, "ungated")
    assert wait.ratio is None and wait.verdict == "worse"
    assert verdict(1000.0, 1004.0, Better.HIGHER) == "tie"
    assert verdict(1.0, 2.0, Better.LOWER) == "better" and verdict(1.0, 2.0, Better.HIGHER) == "worse"
    assert gate_vs_best_peer([_cell("ungated")]) == []  # no gate row: no ratios


# -- the sweep -------------------------------------------------------------------------------------------------


def test_sweep_picks_the_best_cell_under_the_bound():
    # Sweep: the fastest cell meeting the TTFT bound wins; a faster one over the bound does not; ties on
    # throughput (within 0.5%) go to the lower extend share; no eligible cell gives None.
    points = [
        SweepPoint(2, 8, 1000.0, 0.5, 0.30),
        SweepPoint(4, 16, 1200.0, 0.9, 0.20),
        SweepPoint(4, 32, 1203.0, 0.8, 0.10),  # within 0.5% of 1200: a tie, and its extend share is lower
        SweepPoint(8, 32, 1500.0, 3.0, 0.05),  # fastest, but over the bound
    ]
    assert pick_best(points, ttft_p99_max=1.0).key == (4, 32)
    assert pick_best(points, ttft_p99_max=10.0).key == (8, 32)
    assert pick_best(points, ttft_p99_max=0.1) is None
    assert grid([2, 8], [4, 8]) == [(2, 4), (2, 8), (8, 8)]  # K >= A only
    with pytest.raises(ValueError, match="no \\(A, K\\)"):
        grid([16], [4])


def test_sweep_on_a_tiny_real_grid_picks_and_reports(tmp_path, capsys):
    # Sweep end to end: a 2-cell grid on a short scenario through the command; the pick under a loose bound is
    # the cell of highest throughput, and an impossible bound is reported as met by none.
    argv = ["--sweep", "--ttft-p99-max", "100", "1e-6", "--scenarios", "low-load", "--scale", "0.05"]
    argv += ["--sweep-attempt", "2", "8", "--sweep-any", "8", "--jobs", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    text = (tmp_path / "lab" / "sweep.md").read_text()
    assert not (tmp_path / "lab" / "fixed-load.md").exists()  # the sweep leaves the policy table alone
    cells = run_cells(sweep_specs(LabConfig(("low-load",), ("gate",), scale=0.05), grid([2, 8], [8])), jobs=1)
    best = pick_best([SweepPoint.of(cell) for cell in cells], ttft_p99_max=100.0)
    assert best is not None and best.tokens_per_s == max(c.summary.output_tokens_per_s for c in cells)
    assert f"| low-load | ({best.attempt}, {best.any}) |" in text
    assert "none meets it" in text and "SIMULATED" in text
    assert "`prefill-gate lab --scenarios low-load --scale 0.05 --sweep --ttft-p99-max 100 1e-06" in text
    assert text.split("\n## Run")[0].strip() in capsys.readouterr().out  # printed as well as written


# -- bad input -------------------------------------------------------------------------------------------------


def _ns(*argv: str):
    import argparse

    parser = argparse.ArgumentParser()
    add_lab_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--scenarios", "sparse"), "unknown scenario 'sparse'"),
        (("--policies", "nagle"), "unknown policy 'nagle'"),
        (("--preset", "tpu-v9"), "unknown sim preset 'tpu-v9'"),
        (("--sweep",), "--sweep needs --ttft-p99-max"),
        (("--sweep", "--ttft-p99-max", "1", "--sweep-attempt", "16", "--sweep-any", "4"), "no (A, K) with K >= A"),
        (("--attempt-interval", "8", "--any-interval", "4"), "--attempt-interval <= --any-interval"),
    ],
)
def test_bad_input_is_one_line_and_exit_two(argv, message, capsys, tmp_path):
    # Bad input: a clear one-line error naming the bad value, exit status 2, nothing written, no traceback.
    assert lab_main(_ns(*argv, "--out", str(tmp_path))) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "lab" / "fixed-load.md").exists()


def test_bad_input_from_the_command_line_has_no_traceback():
    # Bad input end to end: the module entry point exits 2 with argparse's or the lab's message only.
    for argv in (["--scenarios", "sparse"], ["--scale", "abc"]):
        done = subprocess.run([sys.executable, "-m", "lab", *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr and "error" in done.stderr


# -- the spread metric -----------------------------------------------------------------------------------------


def _round(clock: float, *ranks: tuple[int, int, int]) -> SimpleNamespace:
    """A round of rows: per rank (prefill tokens extended, resident chunks, pending prefill tokens)."""
    rows = tuple(
        Row(rank=i, prefill_tokens=t, num_extends=int(t > 0), resident_chunks=c, pending_prefill_tokens=p)
        for i, (t, c, p) in enumerate(ranks)
    )
    return SimpleNamespace(clock=clock, rows=rows)


def test_spread_metric_on_a_hand_built_round_sequence():
    # Spread: progress is cumulative prefill tokens per rank; spread = max - min in budgets; a round where a
    # rank with work left extends nothing while another extends is out of phase; idle rounds change nothing.
    budget = 100
    records = [
        _round(1.0, (100, 1, 100), (100, 1, 100)),  # in phase
        _round(2.0, (100, 1, 100), (0, 1, 100)),  # rank 1 stands aside with a chunk: out of phase, spread 1
        _round(3.0, (100, 0, 0), (0, 0, 50)),  # again (pending tokens): spread 2
        _round(4.0, (0, 0, 0), (0, 0, 0)),  # nobody extends: not an extend round, spread unchanged
        _round(5.0, (0, 0, 0), (150, 0, 0)),  # rank 1 catches up by 1.5 budgets: spread 0.5
    ]
    stats = phase_stats(records, budget)
    assert stats.tokens_per_rank == (300, 250)
    assert stats.max_spread_chunks == 2.0 and stats.final_spread_chunks == 0.5
    assert (stats.extend_rounds, stats.out_of_phase_rounds) == (4, 2)
    assert stats.series == ((1.0, 0.0), (2.0, 1.0), (3.0, 2.0), (5.0, 0.5))
    assert thin_series(stats.series, 2) == ((2.0, 1.0), (3.0, 2.0), (5.0, 0.5))  # bucket peaks + the last


def test_long_chunked_offset_reports_the_spread_per_policy(small_lab):
    # The loop's measure reaches the report: a progress table for the long-chunked scenarios only.
    text = _report(small_lab)
    section = text.split("## long-chunked-offset")[1]
    assert "max spread (chunks)" in section and "out-of-phase rounds" in section
    assert "max spread (chunks)" not in text.split("## long-chunked-offset")[0]


# -- charts and the written report -----------------------------------------------------------------------------


def test_lab_command_writes_report_and_charts(tmp_path, capsys):
    # Charts: the fixed-load view writes lab/fixed-load.md (lab.md is the capacity report's) and a PNG per
    # scenario beside it, plus the spread chart for long-chunked ones.
    argv = ["--scenarios", "low-load,long-chunked", "--policies", "ungated", "gate", "--scale", "0.02"]
    assert main([*argv, "--jobs", "1", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "lab.md").exists()
    report = (tmp_path / "lab" / "fixed-load.md").read_text()
    assert report.startswith("# Policy lab") and "## Run" in report
    assert "`prefill-gate lab --scenarios low-load long-chunked --policies ungated gate --scale 0.02`" in report
    for name in ("low-load.png", "long-chunked.png", "long-chunked-spread.png"):
        data = (tmp_path / "lab" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
        assert f"]({name})" in report
    assert not (tmp_path / "lab" / "low-load-spread.png").exists()
    assert "| gate |" in capsys.readouterr().out  # the tables are printed too
