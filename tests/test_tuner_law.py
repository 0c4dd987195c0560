"""The control law (tuner/law.py): each rule on estimates built to trigger it, and C2 on any estimates."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.estimates import Estimates, Tail
from tuner.law import FEWER, HOLD, OFF, SMALLER, Intervals, LawSettings, Memory, Slo, decide

SLO = Slo(ttft_p99_s=1.5, itl_p99_s=0.2)


def est(**changes: object) -> Estimates:
    """Steady estimates of a moderately loaded 8-rank group, within budget; `changes` win."""
    values: dict[str, object] = {
        "ranks": 8,
        "rounds": 1000,
        "span_s": 30.0,
        "busy_rounds": 1000,
        "extend_share": 0.05,
        "decode_round_s": 0.041,
        "extend_round_s": 0.12,
        "window_rounds": 30.0,
        "prompt_tokens": 1024.0,
        "one_prompt_extend_s": 0.1,
        "ttft_p99_s": 1.0,
        "ttft_samples": 400,
        "itl_p99_s": 0.15,
        "itl_tokens": 100_000,
        "arrival_per_s": 16.0,
        "ready_share": 0.5,
        "waiting_end": 3.0,
        "backlog_growth": 0.0,
    }
    values.update(changes)
    return Estimates(**values)  # type: ignore[arg-type]


def test_ttft_over_budget_moves_k_down_through_the_measured_round_time():
    # K + (0.8 * 1.5 - 1.8) / 0.041 = 32 - 14.6 -> 17: the excess TTFT, in rounds of 41 ms, comes off K.
    verdict = decide(est(ttft_p99_s=1.8), Intervals(8, 32), SLO)
    assert verdict.target == Intervals(8, 17)
    assert verdict.reason == "TTFT p99 1.80 s > 1.50 s budget at round time 41 ms -> K 32->17"


def test_ttft_over_budget_with_windows_opened_well_before_k_halves_a_too():
    verdict = decide(est(ttft_p99_s=1.8, window_rounds=9.0), Intervals(8, 32), SLO)
    assert verdict.target == Intervals(4, 17)
    assert verdict.reason.endswith("at round time 41 ms, a window every 9 rounds -> A 8->4, K 32->17")
    held = decide(est(ttft_p99_s=1.8, window_rounds=3.0), Intervals(1, 32), SLO)
    assert held.target is None and held.reason.endswith("at A=1: the excess is not the gate's wait")


def test_a_step_is_bounded_and_c2_pulls_a_down_with_k():  # C2: K >= A >= 1
    verdict = decide(est(ttft_p99_s=2.4), Intervals(24, 32), SLO)
    assert verdict.target == Intervals(16, 16)  # wanted K = 32 - 29 = 3: at most a halving per change
    assert verdict.reason.endswith("-> A 24->16, K 32->16")


def test_ttft_over_budget_by_more_than_k_rounds_is_the_queue_and_batches_more():
    # 5 s - 8 rounds x 41 ms is still 4.7 s over: no K can remove that; fuller extend rounds drain the queue.
    verdict = decide(est(ttft_p99_s=5.0), Intervals(4, 8), SLO)
    assert verdict.target == Intervals(8, 8)
    assert verdict.reason == (
        "TTFT p99 5.00 s is more than K=8 rounds (0.33 s) over the budget: the queue sets it: "
        "batch more per window -> A 4->8"
    )


def test_ttft_over_budget_at_k_1_is_the_load_not_the_gate():
    verdict = decide(est(ttft_p99_s=1.6, decode_round_s=0.5), Intervals(1, 1), SLO)  # within a round of target
    assert verdict.target is None and "the load, not the gate" in verdict.reason


def test_itl_over_budget_with_short_one_prompt_rounds_makes_windows_smaller():
    verdict = decide(est(itl_p99_s=0.25, one_prompt_extend_s=0.1), Intervals(8, 32), SLO)
    assert verdict.target == Intervals(4, 32)
    assert "an extend round of one prompt takes 100 ms: smaller windows -> A 8->4" in verdict.reason
    assert decide(est(itl_p99_s=0.25), Intervals(1, 32), SLO).target == Intervals(1, 16)  # then K


def test_itl_over_budget_when_even_one_prompt_is_too_long_means_fewer_extend_rounds():
    # One prompt's round takes 300 ms > 160 ms: only fewer extend rounds bring the p99 down; the TTFT
    # budget leaves 32 + (1.2 - 0.5) / 0.041 = 49 rounds, but K never passes the whole budget, 1.5 s / 41 ms.
    verdict = decide(est(itl_p99_s=0.3, one_prompt_extend_s=0.3, ttft_p99_s=0.5), Intervals(8, 32), SLO)
    assert verdict.target == Intervals(16, 36)
    stuck = decide(est(itl_p99_s=0.3, one_prompt_extend_s=0.3, ttft_p99_s=1.4), Intervals(8, 32), SLO)
    assert stuck.target is None and "no room" in stuck.reason


def test_itl_memory_overrides_the_model_and_a_hold_changes_nothing_but_ttft_still_decides():
    # The model says smaller windows (one prompt's round is short); the tuner's memory says fewer rounds.
    learnt = Memory(FEWER, "it went 300 -> 250 ms after the last change toward fewer extend rounds")
    verdict = decide(est(itl_p99_s=0.25, ttft_p99_s=0.5), Intervals(8, 32), SLO, memory=learnt)
    assert verdict.target == Intervals(16, 36) and verdict.way == FEWER and "it went 300 -> 250 ms" in verdict.reason
    held = Memory(HOLD, "it went 300 -> 300 ms after the last change toward fewer extend rounds, and neither way ...")
    verdict = decide(est(itl_p99_s=0.25), Intervals(8, 32), SLO, memory=held)
    assert verdict.target is None and verdict.reason.endswith("neither way ...: the intervals cannot fix it, holding")
    # A hold is the ITL rule's: TTFT over budget still moves K.
    assert decide(est(itl_p99_s=0.25, ttft_p99_s=1.8), Intervals(8, 32), SLO, memory=held).target == Intervals(8, 17)


def test_a_growing_backlog_batches_more_per_window():
    verdict = decide(est(backlog_growth=40.0, waiting_end=45.0), Intervals(2, 16), SLO)
    assert verdict.target == Intervals(4, 16)
    assert verdict.reason.startswith("waiting prompts grew by 40 to 45 in 30 s: batch more per window")
    # A = K: both grow, never past the whole TTFT budget in rounds (1.5 s / 41 ms = 36).
    assert decide(est(backlog_growth=40.0), Intervals(32, 32), SLO).target == Intervals(36, 36)
    assert decide(est(backlog_growth=40.0), Intervals(36, 36), SLO).target is None


def test_low_load_halves_a_and_slack_on_both_budgets_raises_k():
    assert decide(est(ready_share=0.05), Intervals(8, 16), SLO).target == Intervals(4, 16)
    verdict = decide(est(ttft_p99_s=0.5, itl_p99_s=0.05), Intervals(4, 8), SLO)
    assert verdict.target == Intervals(4, 16)  # wanted 8 + (1.2 - 0.5) / 0.041 = 25, one doubling at most
    assert decide(est(), Intervals(4, 16), SLO).target is None  # within budget, no slack on ITL: hold


def test_the_gate_off_comes_on_when_itl_is_over_budget():
    verdict = decide(est(itl_p99_s=0.25, ttft_p99_s=0.3), OFF, SLO)
    assert verdict.target == Intervals(1, 21)  # (0.8 * 1.5 - 0.3) / 0.041 = 21.9 rounds of gate wait
    assert "with the gate off" in verdict.reason and verdict.reason.endswith("gate on A=1 K=21")
    assert decide(est(), OFF, SLO).target is None
    assert decide(est(itl_p99_s=0.25), OFF, SLO, LawSettings(may_switch_on=False)).target is None


def test_bad_slo_and_intervals_are_refused():
    with pytest.raises(ValueError, match="TTFT p99 budget must be a number of seconds > 0"):
        Slo(0.0, 0.1)
    with pytest.raises(ValueError, match="ITL p99"):
        Slo(1.0, math.nan)
    with pytest.raises(ValueError, match="C2"):
        Intervals(8, 4)
    with pytest.raises(ValueError, match="both intervals or neither"):
        Intervals(None, 4)


seconds = st.floats(min_value=0.001, max_value=100.0, allow_nan=False)


@settings(max_examples=120, deadline=None)
@given(
    a=st.integers(1, 256),
    extra=st.integers(0, 256),
    ttft=seconds,
    itl=seconds,
    round_s=st.floats(min_value=0.0005, max_value=2.0),
    one=st.one_of(st.none(), seconds),
    growth=st.floats(min_value=-100, max_value=100),
    ready=st.floats(min_value=0, max_value=1),
    enabled=st.booleans(),
)
def test_every_verdict_obeys_c2_and_moves_each_interval_at_most_2x(
    a, extra, ttft, itl, round_s, one, growth, ready, enabled
):  # C2
    law = LawSettings()
    now = Intervals(a, min(a + extra, law.max_interval)) if enabled and a <= law.max_interval else OFF
    estimates = est(
        ttft_p99_s=ttft,
        itl_p99_s=itl,
        decode_round_s=round_s,
        one_prompt_extend_s=one,
        backlog_growth=growth,
        ready_share=ready,
    )
    verdict = decide(estimates, now, SLO, law)
    assert verdict.reason
    target = verdict.target
    if target is None:
        return
    assert target != now and "->" in verdict.reason
    if target.enabled:
        assert 1 <= target.attempt <= target.any <= law.max_interval  # type: ignore[operator]
    if now.enabled and target.enabled:
        for old, new in ((now.attempt, target.attempt), (now.any, target.any)):
            assert new <= max(old + 1, 2 * old) and new >= min(old - 1, math.ceil(old / 2))  # type: ignore[operator]


def tail(share: float, events: int, early: int | None = None) -> Tail:
    """A tail of `events` past the budget making `share` of the samples; 1% of them `allowed` (ITL rounds)."""
    first = events // 2 if early is None else early
    return Tail(share, events, events * 0.01 / share if share else 0.0, first, events - first)


def test_a_p99_past_its_budget_within_the_noise_is_not_a_breach():
    # 7 rounds past the budget where a 1% tail allows 5.8: inside 2 Poisson deviations; the p99 alone says 0.25 s.
    noisy = est(itl_p99_s=0.25, itl_tail=tail(0.012, 7), extend_token_share=0.05)
    verdict = decide(noisy, Intervals(8, 32), SLO)
    assert verdict.target is None and verdict.reason.startswith("within the noise")
    # Far past the allowance, in both halves of the window: the ITL rule acts.
    assert decide(replace(noisy, itl_tail=tail(0.04, 20)), Intervals(8, 32), SLO).target == Intervals(4, 32)
    # As many, all in one half (one burst): not a trend.
    assert decide(replace(noisy, itl_tail=tail(0.04, 20, early=0)), Intervals(8, 32), SLO).target is None
    # TTFT alike: 3 of 300 first tokens past 1.5 s is the 1% a p99 allows; 12 is a breach.
    ttft = est(ttft_p99_s=1.8, ttft_tail=Tail(0.01, 3, 3.0, 1, 2))
    assert decide(ttft, Intervals(8, 32), SLO).target is None
    assert decide(replace(ttft, ttft_tail=Tail(0.04, 12, 3.0, 5, 7)), Intervals(8, 32), SLO).target == Intervals(8, 17)


def test_itl_over_budget_with_few_tokens_waiting_an_extend_round_means_fewer_extend_rounds_first():
    # One prompt's round would fit (100 ms), but only 1.5% of tokens wait an extend round: halving those
    # rounds takes them out of the 1% tail, whatever their length.
    over = est(itl_p99_s=0.25, ttft_p99_s=0.5, itl_tail=tail(0.015, 30), extend_token_share=0.015)
    verdict = decide(over, Intervals(8, 32), SLO)
    assert verdict.way == FEWER and verdict.target == Intervals(16, 36)
    assert "1.5% of decode tokens waited an extend round: fewer extend rounds" in verdict.reason
    # Slow tokens that are not the extend rounds' (2% past the budget, 1.5% waited one): the model decides.
    assert decide(replace(over, itl_tail=tail(0.02, 30)), Intervals(8, 32), SLO).way == SMALLER


def test_a_p99_tipped_within_the_noise_gathers_bursts_with_a_and_stops_when_that_did_not_help():
    tipped = est(itl_p99_s=0.25, ttft_p99_s=0.5, itl_tail=tail(0.011, 4), extend_token_share=0.012)
    verdict = decide(tipped, Intervals(8, 32), SLO)  # the ALL point opens (ready on 50% of rounds): A x2
    assert verdict.target == Intervals(16, 32) and verdict.way == FEWER
    assert verdict.reason.startswith("ITL p99 250 ms > 200 ms within the noise: 1.1% of decode tokens past it")
    # The wait the TTFT target leaves bounds A: (1.2 - 1.0) / 0.041 = 4 rounds.
    assert decide(replace(tipped, ttft_p99_s=1.0), Intervals(16, 32), SLO).target == Intervals(20, 32)
    # The ALL point never opens: K, up to its room (16 + 17) but not past the TTFT target in rounds (1.2 s / 41 ms).
    assert decide(replace(tipped, ready_share=0.0), Intervals(8, 16), SLO).target == Intervals(8, 29)
    assert decide(tipped, Intervals(8, 32), SLO, memory=Memory(fewer_failed=True)).target is None


def test_the_low_load_rule_leaves_bursts_an_all_point_that_never_opens_and_a_full_itl_tail_alone():
    low = est(ready_share=0.05, itl_tail=tail(0.002, 2), extend_token_share=0.05, wanting_share=0.5)
    assert decide(low, Intervals(8, 16), SLO).target == Intervals(4, 16)
    assert decide(replace(low, wanting_share=0.08), Intervals(8, 16), SLO).target is None  # bursts
    assert decide(replace(low, ready_share=0.0), Intervals(8, 16), SLO).target is None  # A costs nothing
    assert decide(replace(low, itl_tail=tail(0.009, 4)), Intervals(8, 16), SLO).target is None  # no ITL room
