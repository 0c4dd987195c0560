"""The cost-model presets re-derived from their anchors (issue 11, item 5): the numbers their derivations
state are the numbers they give, the penalty and slope sit where the anchors put them, and the mildest and
steepest presets are named truthfully."""

from __future__ import annotations

import re

import pytest

from engine.executor.presets import (
    ATOM_LONE_RATIO,
    DEFAULT_PRESET,
    DERIVATIONS,
    FLOOR_80,
    MILDEST_PRESET,
    MIXED_140,
    PRESETS,
    STEEPEST_PRESET,
    VLLM_MIXED_RATIO,
    extend_tokens_per_s,
    fitted_extend_penalty,
    lone_prompt_ratio,
    mixed_ratio,
)


def test_mildest_and_steepest_are_the_extremes_of_the_lone_prompt_ratio():  # 11B reports under both
    ratios = {name: lone_prompt_ratio(preset) for name, preset in PRESETS.items()}
    assert min(ratios, key=ratios.__getitem__) == MILDEST_PRESET
    assert max(ratios, key=ratios.__getitem__) == STEEPEST_PRESET
    assert "MILDEST" in DERIVATIONS[MILDEST_PRESET] and "STEEPEST" in DERIVATIONS[STEEPEST_PRESET]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_derivation_states_the_ratio_and_slope_the_preset_gives(name: str):  # docstrings cannot drift
    text = " ".join(DERIVATIONS[name].split())
    ticks = re.search(r"costs (\d+\.\d) (?:decode )?ticks", text)
    slope = re.search(r"(\d+\.\d)k tokens/s/GPU", text)
    assert ticks and slope, name
    assert float(ticks[1]) == pytest.approx(lone_prompt_ratio(PRESETS[name]), abs=0.05)
    assert float(slope[1]) * 1000 == pytest.approx(extend_tokens_per_s(PRESETS[name]), abs=50)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_extend_slope_sits_in_the_lmsys_bracket(name: str):  # lmsys.org 2025-05-05: 6-8k tokens/s/GPU
    assert 6000 <= extend_tokens_per_s(PRESETS[name]) <= 8000


@pytest.mark.parametrize("name", [n for n, p in PRESETS.items() if "ratios" in p.source])
def test_ratio_fitted_penalty_is_the_least_squares_compromise(name: str):  # ATOM#930 and vllm#44558
    preset = PRESETS[name]
    assert preset.extend_penalty_s == pytest.approx(fitted_extend_penalty(preset), abs=0.0011)  # rounded to ms
    lone, mixed = lone_prompt_ratio(preset), mixed_ratio(preset)
    # Between the two anchors, each within 20%, the log errors (nearly) equal and opposite.
    assert VLLM_MIXED_RATIO < lone < ATOM_LONE_RATIO and VLLM_MIXED_RATIO < mixed < ATOM_LONE_RATIO
    assert (lone / ATOM_LONE_RATIO) * (mixed / VLLM_MIXED_RATIO) == pytest.approx(1.0, abs=0.02)


def test_default_lone_prompt_is_as_steep_as_the_anchors_say():  # issue 11: was 3.5 decode ticks
    assert lone_prompt_ratio(PRESETS[DEFAULT_PRESET]) > VLLM_MIXED_RATIO
    assert "DeepSeek-V4-Pro" in PRESETS[DEFAULT_PRESET].source  # sglang#35241's model, not V3's


def test_vllm_shapes_follow_littles_law_of_each_run():  # vllm#44558: in flight = rate x time in system
    interval_2 = 22.59 / 8 * (0.502 + 199 * 0.1402)  # P50 ITL 32.1 ms: the decode floor
    baseline = 22.43 / 8 * (0.813 + 199 * 0.2405)  # P50 ITL 274.9 ms: prefill beside decodes
    assert FLOOR_80[0].decodes == pytest.approx(interval_2, rel=0.05)
    assert MIXED_140[0].decodes == pytest.approx(baseline, rel=0.05)
