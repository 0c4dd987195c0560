"""The simulator: cost model (F1-F3), presets and their public anchors, run_sim, and calibration."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.clock import VirtualClock
from engine.config import ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.executor.base import DispatchMode
from engine.executor.presets import (
    DEFAULT_PRESET,
    PRESETS,
    CostPreset,
    RankWork,
    mode_for,
    preset_named,
    rows_for,
    save_preset,
)
from engine.executor.sim import SimExecutor
from engine.policy import UngatedPolicy
from lab.calibrate import COEFFICIENTS, fit_error, fit_preset, nnls
from lab.simrun import run_sim
from tests.helpers import req, sim_args
from workloads import Fixed, Poisson, Workload


def eight_ranks(**extra) -> ServerArgs:
    return sim_args(dp_size=8, max_num_seqs=8 * 64, chunked_prefill_size=2048, kv_pages=2048, **extra)


# -- the cost model (F1-F3) --------------------------------------------------------------------------------


def test_one_extending_rank_makes_the_whole_round_slow_and_equal_on_every_rank():  # rules F1, F3
    driver = LockstepDriver(eight_ranks())
    for rank in range(8):
        for i in range(16):
            driver.submit(rank, req(f"d{rank}-{i}", prompt_len=256, output_len=400))
    for _ in range(20):  # every prompt admitted, every rank decoding
        outcomes = driver.step()
    assert outcomes[0].mode is DispatchMode.LOW_LATENCY
    decode_round = outcomes[0].record.round_seconds
    driver.submit(3, req("lone", prompt_len=1024, output_len=8))  # one rank, one prompt
    outcomes = driver.step()
    record = outcomes[0].record
    assert [row.num_extends > 0 for row in record.rows] == [r == 3 for r in range(8)]
    # F1: one rank's extend puts every rank on the extend path, the seven decode-only ranks included.
    assert {o.mode for o in outcomes} == {DispatchMode.NORMAL} and not record.all_decode_or_idle
    # F3: the round lasts as long as the slowest rank, for everyone: the clocks stay equal.
    assert len({engine.clock.now() for engine in driver.engines}) == 1
    assert record.round_seconds > 2.5 * decode_round


def test_round_time_is_identical_for_every_rank_of_the_group():  # rule F3
    preset = preset_named(DEFAULT_PRESET)
    rows = rows_for([RankWork(64, 0, 64 * 900)] * 7 + [RankWork(0, 1024, 0)])
    executors = [SimExecutor(preset, VirtualClock()) for _ in range(8)]
    seconds = {executor.round_seconds(rows) for executor in executors}
    assert len(seconds) == 1


def test_extend_round_costs_the_fixed_extend_path_whoever_extends():  # rule F1
    preset = preset_named(DEFAULT_PRESET)
    decode = [RankWork(32, 0, 32 * 500)] * 8
    base = preset.work_seconds(decode)
    times = set()
    for rank in range(8):
        shape = list(decode)
        shape[rank] = RankWork(32, 16, 32 * 500)  # mixed: a tiny chunk beside the same decodes
        assert mode_for(shape) is DispatchMode.NORMAL
        times.add(preset.work_seconds(shape))
    assert len(times) == 1  # whoever extends, the group pays the same
    # 16 prompt tokens cost next to nothing; the group pays for leaving the decode path (the normal legs'
    # cheaper per-token rate takes back a little of the fixed penalty).
    assert times.pop() > base + 0.8 * preset.extend_penalty_s


def test_decode_attention_grows_with_the_kv_each_rank_reads():  # cost model: KV length from the row
    preset = preset_named(DEFAULT_PRESET)
    short = preset.work_seconds([RankWork(64, 0, 64 * 200)] * 8)
    long = preset.work_seconds([RankWork(64, 0, 64 * 8000)] * 8)
    assert long - short == pytest.approx(64 * 7800 * preset.attn_per_kv_token_s)


def test_slowest_rank_sets_the_attention_part():  # rule F3
    preset = preset_named(DEFAULT_PRESET)
    even = preset.work_seconds([RankWork(32, 0, 32 * 1000)] * 8)
    one_heavy = preset.work_seconds([RankWork(32, 0, 32 * 1000)] * 7 + [RankWork(32, 0, 32 * 9000)])
    assert one_heavy - even == pytest.approx(32 * 8000 * preset.attn_per_kv_token_s)


def test_all_idle_round_costs_the_idle_tick():  # rule F2
    preset = preset_named(DEFAULT_PRESET)
    assert preset.work_seconds([RankWork()] * 8) == preset.idle_s


# -- presets: honest, named, looked up by name -----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_reproduces_the_public_figures_it_cites(name: str):  # PEERS.md cost model anchors
    preset = PRESETS[name]
    assert len(preset.anchors) >= 2
    for anchor in preset.anchors:
        got = preset.work_seconds(anchor.ranks)
        assert got == pytest.approx(anchor.seconds, rel=anchor.rel_tol), anchor.label


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_names_hardware_model_and_sources(name: str):  # PEERS.md: keep the presets honest
    preset = PRESETS[name]
    assert preset.hardware and preset.model and preset.source
    assert any(mark in preset.source for mark in ("#", "README", "lmsys"))
    assert preset.extend_penalty_s > 0  # leaving the decode path is never free


def test_presets_cover_every_public_anchor_of_peers():  # PEERS.md cost model: every anchor is used
    sources = " ".join(p.source for p in PRESETS.values())
    for anchor in ("77+114", "155+273", "55 ms", "92 ms", "sglang#35241", "ATOM#930", "vllm#44558", "7k"):
        assert anchor in sources, anchor


def test_default_preset_is_the_server_args_default():
    assert ServerArgs().sim_preset == DEFAULT_PRESET == "h200-dp8-ep8"
    assert preset_named(DEFAULT_PRESET) is PRESETS[DEFAULT_PRESET]


def test_unknown_preset_is_a_value_error_listing_the_names():
    with pytest.raises(ValueError, match="unknown sim preset 'h100-tiny'") as info:
        preset_named("h100-tiny")
    for name in PRESETS:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="known presets"):
        run_sim(sim_args(sim_preset="nope"), Workload(Poisson(1.0), dp_size=2, limit=1))


def test_one_extending_lone_prompt_is_many_decode_ticks_on_the_atom_preset():  # ATOM#930's ratio
    preset = preset_named("mi355x-dp8-atom")
    tick = preset.work_seconds([RankWork(16, 0, 16 * 1000)] * 8)
    lone = preset.work_seconds([RankWork(0, 1024, 0)] + [RankWork(16, 0, 16 * 1000)] * 7)
    assert lone / tick > 10


# -- run_sim ----------------------------------------------------------------------------------------------


def small_workload(seed: int, limit: int | None = 120, rate: float = 40.0) -> Workload:
    return Workload(Poisson(rate), dp_size=8, prompt=Fixed(300), output=Fixed(40), seed=seed, limit=limit)


def test_same_seed_same_summary_different_seed_different():  # determinism
    args = eight_ranks(prefill_attempt_interval=4, prefill_any_attempt_interval=16)
    first, _ = run_sim(args, small_workload(7))
    again, _ = run_sim(args, small_workload(7))
    other, _ = run_sim(args, small_workload(8))
    assert first == again
    assert first != other


def test_run_ends_when_the_workload_is_done_and_every_request_ended():
    summary, extra = run_sim(eight_ranks(), small_workload(1))
    assert extra.stopped_by == "done" and extra.in_flight_at_end == 0
    assert summary.requests_submitted == summary.requests_finished == 120
    assert summary.output_tokens == 120 * 40
    assert sum(extra.requests_per_rank) == 120 and len(extra.requests) == 120


def test_rounds_and_duration_bound_a_run():
    _, by_rounds = run_sim(eight_ranks(), small_workload(1, limit=None), rounds=50)
    assert by_rounds.stopped_by == "rounds" and by_rounds.rounds == 50
    _, by_time = run_sim(eight_ranks(), small_workload(1, limit=None), duration=2.0)
    assert by_time.stopped_by == "duration" and 2.0 <= by_time.sim_seconds < 2.5


def test_endless_workload_needs_a_bound():
    with pytest.raises(ValueError, match="needs rounds or duration"):
        run_sim(eight_ranks(), small_workload(1, limit=None))


def test_run_sim_refuses_the_torch_executor_and_a_mismatched_group():
    with pytest.raises(ValueError, match="--executor sim"):
        run_sim(ServerArgs(executor="torch"), Workload(Poisson(1.0), dp_size=1, limit=1))
    with pytest.raises(ValueError, match="--dp-size"):
        run_sim(eight_ranks(), Workload(Poisson(1.0), dp_size=2, limit=1))


def test_idle_skip_keeps_results_and_saves_rounds():  # an all-idle group skips to the next arrival
    args = eight_ranks()

    def sparse() -> Workload:
        return Workload(Poisson(2.0), dp_size=8, prompt=Fixed(200), output=Fixed(20), seed=3, limit=6)

    skipped, fast = run_sim(args, sparse())
    spun, slow = run_sim(args, sparse(), skip_idle=False)
    assert fast.rounds < slow.rounds / 5 and fast.idle_seconds_skipped > 0
    assert skipped.requests_finished == spun.requests_finished == 6
    assert skipped.output_tokens == spun.output_tokens
    # Skipping starts the round at the arrival instead of at the next idle tick: TTFT moves by < a tick.
    assert skipped.ttft_p50_s == pytest.approx(spun.ttft_p50_s, abs=preset_named(args.sim_preset).idle_s)


def test_policy_factory_replaces_the_configured_policy():  # the lab's injection seam
    args = eight_ranks(prefill_attempt_interval=4, prefill_any_attempt_interval=16)
    # 20 req/s: a few prompts arrive per extend round (~0.25 s on the default preset), so ungated rounds
    # catch only some ranks with a prompt.
    gated, gated_extra = run_sim(args, small_workload(2, rate=20.0))
    ungated, ungated_extra = run_sim(args, small_workload(2, rate=20.0), policy_factory=lambda rank, a: UngatedPolicy())
    assert (gated_extra.policy, ungated_extra.policy) == ("gate", "ungated")
    assert gated.windows_all > 0 and ungated.windows_all == ungated.windows_any == 0
    # Batching prefill into windows runs fewer extend rounds with more ranks in each.
    assert gated.extend_rounds < ungated.extend_rounds
    assert gated.mean_ranks_extending > ungated.mean_ranks_extending


def test_run_sim_takes_an_unregistered_preset_and_the_page_size_of_the_args():
    preset = CostPreset("flat", "none", "none", "test", 0.01, 0.05, 0, 0, 0, 0, 0, 0)
    args = eight_ranks(page_size=32)
    summary, extra = run_sim(args, small_workload(4), preset=preset)
    assert extra.preset == "flat" and summary.requests_finished == 120


# -- calibration ------------------------------------------------------------------------------------------


def synthetic_samples(preset: CostPreset, count: int, seed: int) -> list:
    """Rounds of varied shapes timed by `preset` itself (page size 1: pages are KV tokens)."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        extend = rng.random() < 0.3
        ranks = []
        for rank in range(8):
            decodes = rng.randint(0, 64)
            prefill = rng.randint(1, 4096) if extend and (rank == 0 or rng.random() < 0.4) else 0
            if prefill and rng.random() < 0.5:
                decodes = 0
            ranks.append(RankWork(decodes, prefill, decodes * rng.randint(10, 4000)))
        rows = rows_for(ranks)
        samples.append((rows, preset.round_seconds(rows, mode_for(ranks), page_size=1)))
    samples.append((rows_for([RankWork()] * 8), 0.0007))
    return samples


@pytest.mark.parametrize("name", ["mi355x-dp8-atom", "h200-dp8-ep8"])
def test_fit_recovers_the_coefficients_of_a_known_preset(name: str):  # calibration fitter
    truth = PRESETS[name]
    fitted = fit_preset(synthetic_samples(truth, 300, seed=5), page_size=1, name="fit")
    for coefficient in COEFFICIENTS:
        assert getattr(fitted, coefficient) == pytest.approx(getattr(truth, coefficient), rel=1e-6, abs=1e-12)
    assert fitted.idle_s == pytest.approx(0.0007)


def test_fit_of_noisy_samples_stays_close():  # calibration fitter: measurement noise
    truth = PRESETS["gb200-dp8-vllm"]
    rng = random.Random(9)
    noisy = [(rows, s * rng.uniform(0.97, 1.03)) for rows, s in synthetic_samples(truth, 400, seed=6)]
    fitted = fit_preset(noisy, page_size=1)
    assert fit_error(fitted, noisy, page_size=1) < 0.03
    assert fitted.extend_fixed_s == pytest.approx(truth.extend_fixed_s, rel=0.15)


def test_fit_needs_decode_and_extend_rounds():
    samples = synthetic_samples(PRESETS[DEFAULT_PRESET], 60, seed=1)
    decode_only = [(rows, s) for rows, s in samples if all(row.num_extends == 0 for row in rows)]
    with pytest.raises(ValueError, match="both decode-only and extend rounds"):
        fit_preset(decode_only, page_size=1)


def test_nnls_keeps_every_coefficient_non_negative():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])  # unconstrained slope would be -1
    x = nnls(a, b)
    assert (x >= 0).all() and x[1] == 0 and x[0] == pytest.approx(2.0)


def test_nnls_solutions_meet_the_optimality_conditions():  # KKT: x >= 0, no descent along a zero coordinate
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = rng.normal(size=(20, 6))
        a[:, rng.integers(6)] = 0.0  # a coefficient the samples cannot see
        b = rng.normal(size=20)
        x = nnls(a, b)
        gradient = a.T @ (b - a @ x)
        assert (x >= 0).all() and np.isfinite(x).all()
        assert (gradient[x == 0] <= 1e-8).all() and np.allclose(gradient[x > 0], 0, atol=1e-8)


def test_short_real_calibration_of_the_torch_executor():  # calibrate_torch on this machine's CPU
    pytest.importorskip("engine.executor.torch_exec")
    from lab.calibrate import calibrate_torch

    result = calibrate_torch(rounds=80, timeout_s=240)
    assert result.samples == 80 and result.extend_samples > 0
    preset = result.preset
    assert preset.name == "calibrated" and "CPU" in preset.hardware
    assert all(getattr(preset, c) >= 0 for c in COEFFICIENTS)
    assert preset.decode_fixed_s + preset.extend_fixed_s > 0


def test_a_saved_preset_runs_the_simulator_by_path(tmp_path):  # calibrate -> --sim-preset PATH.json
    path = tmp_path / "fitted.json"
    fitted = fit_preset(synthetic_samples(PRESETS["mi355x-dp8-atom"], 200, seed=2), page_size=1, name="fitted")
    save_preset(fitted, path)
    assert preset_named(str(path)) == fitted
    summary, extra = run_sim(eight_ranks(sim_preset=str(path)), small_workload(4))
    assert extra.preset == "fitted" and summary.requests_finished == 120


def test_a_broken_preset_file_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x", "decode_fixed_s": -1}')
    with pytest.raises(ValueError, match=r"broken\.json.*missing"):
        preset_named(str(path))
    with pytest.raises(ValueError, match="cannot read sim preset file"):
        preset_named(str(tmp_path / "absent.json"))
