"""The lab's peer policies (PEERS.md 4-8): each peer's published cases replayed, then hand-built row sequences.

Published cases are restated as our own tables (no code copied); each table names its source.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.executor.base import DispatchMode
from engine.executor.presets import preset_named
from engine.policies.atom_coalescer import AtomCoalescerPolicy, Coalescer, Signals
from engine.policies.oracle import decode_round_seconds_of, decode_segments, extend_rounds_per_rank, oracle_bound
from engine.policies.sglang_delayer import SGLangDelayerPolicy, negotiate
from engine.policies.trtllm_balance import TrtllmBalancePolicy
from engine.policies.vllm_cadence import VllmCadencePolicy
from engine.policy import LocalView, PrefillPolicy
from engine.rows import Row
from tests.helpers import sim_args

DECODING = LocalView(has_decode_work=True)
IDLE = LocalView()


def row(rank: int = 0, *, usage: float = 0.5, **fields: int | bool) -> Row:
    """A gathered row with occupancy `usage` (pages out of 1000) and the given fields."""
    values: dict[str, int | bool] = {"batch_size": 1, "pool_pages_usable": 1000, "pool_pages_used": round(usage * 1000)}
    values.update(fields)
    return Row(rank=rank, **values)  # type: ignore[arg-type]


def decoding(rank: int = 0, **fields: int | bool) -> Row:
    """A rank decoding 4 requests with nothing waiting."""
    return row(rank, **{"running": 4, "has_decode_work": True, **fields})


def waiting(rank: int = 0, **fields: int | bool) -> Row:
    """A decoding rank with one schedulable new prompt of 100 tokens."""
    return decoding(rank, **{"waiting_prompts": 1, "pending_prefill_tokens": 100, **fields})


def step(policy: PrefillPolicy, rows: list[Row], local: LocalView = DECODING) -> bool:
    """One round as RankEngine drives it: the round's gathered rows, then the next round's decision."""
    policy.observe(rows)
    return policy.decide(local).allow_prefill


# -- sglang-delayer ------------------------------------------------------------------------------------

# Restated from SGLang's negotiate table: sgl-project/sglang test/registered/scheduler/test_prefill_delayer.py
# (`_NEGOTIATE_TEST_CASES`, 4 ranks). Each call is (prefillable per rank, token usage per rank).
@dataclass(frozen=True)
class NegotiateCase:
    name: str
    max_delay_passes: int
    low_watermark: float | None
    calls: tuple[tuple[tuple[bool, ...], tuple[float, ...]], ...]
    allow: bool
    reason: str


T, F = True, False
MIX = (T, F, T, F)
HIGH = (0.9, 0.9, 0.9, 0.9)
SGLANG_TABLE = (
    NegotiateCase("all_prefillable", 100, 0.8, (((T, T, T, T), HIGH),), True, "no_wait"),
    NegotiateCase("all_prefillable_with_previous_wait", 100, 0.8, ((MIX, HIGH), ((T, T, T, T), HIGH)), True,
                  "wait_success"),
    NegotiateCase("none_prefillable", 100, 0.8, (((F, F, F, F), HIGH),), True, ""),
    NegotiateCase("mixed_delay", 100, 0.8, ((MIX, HIGH),), False, "delay"),
    NegotiateCase("mixed_watermark_force_allow", 100, 0.8, ((MIX, (0.5, 0.9, 0.9, 0.9)),), True, "token_watermark"),
    NegotiateCase("mixed_watermark_disabled", 100, None, ((MIX, (0.5, 0.9, 0.9, 0.9)),), False, "delay"),
    NegotiateCase("mixed_watermark_not_prefillable", 100, 0.8, (((F, F, T, F), (0.5, 0.9, 0.9, 0.9)),), False,
                  "delay"),
    NegotiateCase("mixed_timeout", 3, 0.8, ((MIX, HIGH),) * 3, True, "wait_timeout"),
)


@pytest.mark.parametrize("case", SGLANG_TABLE, ids=lambda c: c.name)
def test_sglang_negotiate_table(case: NegotiateCase):  # SGLang's ALL/NONE/MIXED/timeout table, as published
    delayed, skip_first, outcome = None, True, None
    for prefillable, usage in case.calls:
        low = case.low_watermark
        force = [p and low is not None and u < low for p, u in zip(prefillable, usage, strict=True)]
        outcome = negotiate(prefillable, force, [0] * 4, [0.0] * 4, max_running=64, delayed=delayed,
                            skip_first=skip_first, max_delay_passes=case.max_delay_passes)
        delayed, skip_first = outcome.delayed, outcome.skip_first
    assert (outcome.allow, outcome.reason) == (case.allow, case.reason)


@pytest.mark.parametrize("case", [c for c in SGLANG_TABLE if c.name != "none_prefillable"], ids=lambda c: c.name)
def test_sglang_policy_replays_the_table_on_rows(case: NegotiateCase):  # symbols P_r, WM_r derived from rows
    policy = SGLangDelayerPolicy(sim_args(dp_size=4), max_delay_passes=case.max_delay_passes,
                                 token_usage_low_watermark=case.low_watermark)
    for prefillable, usage in case.calls:
        flags = enumerate(zip(prefillable, usage, strict=True))
        rows = [waiting(r, usage=u) if p else decoding(r, usage=u) for r, (p, u) in flags]
        allow = step(policy, rows)
    assert (allow, policy.reason) == (case.allow, case.reason)


def test_sglang_none_on_rows_a_round_old_holds_without_counting():  # what differs from SGLang (docstring)
    policy = SGLangDelayerPolicy(sim_args(dp_size=4))
    assert not policy.decide(DECODING).allow_prefill and policy.reason == "none"  # no rows yet
    assert not step(policy, [decoding(r) for r in range(4)]) and policy.reason == "none"
    assert policy.counter == 0
    assert not step(policy, [waiting(0)] + [decoding(r) for r in (1, 2, 3)]) and policy.reason == "delay"
    assert policy.counter == 1


def test_sglang_none_allows_when_asked_as_sglang_does():  # SGLang's NONE branch: "allow for simplicity"
    policy = SGLangDelayerPolicy(sim_args(dp_size=4), allow_on_none=True)
    assert policy.decide(DECODING).allow_prefill and policy.reason == "none"
    assert step(policy, [decoding(r) for r in range(4)]) and policy.counter == 0
    assert not step(policy, [waiting(0)] + [decoding(r) for r in (1, 2, 3)]) and policy.reason == "delay"


def test_sglang_mixed_waits_max_delay_passes_minus_one_rounds():  # default max_delay_passes=30 (sglang#16269)
    policy = SGLangDelayerPolicy(sim_args(dp_size=2))
    mixed = [waiting(0), decoding(1)]
    decisions = [step(policy, mixed) for _ in range(30)]
    assert decisions == [False] * 29 + [True] and policy.reason == "wait_timeout"
    assert policy.counter == 0


# Slot-condition cases named after the unit tests proposed in sgl-project/sglang#28795 (closed, not merged)
# for the ALL branch of #17456, with the pass cap of #32880.
def test_sglang_first_slot_condition_is_skipped_then_delays():  # ALL branch: skip_first_delayer, then delay
    policy = SGLangDelayerPolicy(sim_args(dp_size=2, max_num_seqs=16), max_delay_passes=3)  # M = 8
    step(policy, [decoding(0, num_extends=2), decoding(1)])  # B_0 = 2
    full = [waiting(0, running=7), waiting(1, running=7)]  # M - max(R) = 1 < max(B) ~ 2
    assert step(policy, full) and policy.reason == "no_wait"  # the first hit is let through
    assert not step(policy, full) and policy.reason == "delay"
    assert not step(policy, full)
    assert step(policy, full) and policy.reason == "wait_timeout"  # bounded like MIXED (#32880)


def test_sglang_slot_condition_false_allows_without_wait():  # ALL branch, enough free slots
    policy = SGLangDelayerPolicy(sim_args(dp_size=2, max_num_seqs=16))
    step(policy, [decoding(0, num_extends=2), decoding(1)])
    assert step(policy, [waiting(0, running=4), waiting(1, running=4)]) and policy.reason == "no_wait"


def test_sglang_max_prefill_bs_decays_per_round():  # B_r = max(0.998 * B_r, num_extends) (#32880)
    policy = SGLangDelayerPolicy(sim_args(dp_size=2))
    policy.observe([decoding(0, num_extends=4), decoding(1, num_extends=1)])
    policy.observe([decoding(0), decoding(1, num_extends=3)])
    assert policy.max_prefill_bs == [pytest.approx(4 * 0.998), 3.0]


def test_sglang_never_holds_resident_chunks_and_a_chunk_rank_is_not_prefillable():  # chunks always continue
    policy = SGLangDelayerPolicy(sim_args(dp_size=2))
    policy.observe([waiting(0, resident_chunks=1), waiting(1)])
    decision = policy.decide(DECODING)
    assert not decision.hold_resident_chunks
    assert not decision.allow_prefill and policy.reason == "delay"  # MIXED: the chunk rank reports P=false


def test_sglang_prefillable_follows_local_admission():  # P_r: watermark, free slot, storage reads
    policy = SGLangDelayerPolicy(sim_args(dp_size=2, max_num_seqs=16))
    assert policy.prefillable(waiting(0, usage=0.9))
    assert not policy.prefillable(waiting(0, usage=0.95))
    assert not policy.prefillable(waiting(0, running=8))
    assert not policy.prefillable(waiting(0, storage_reads=1))


# -- atom-coalescer ------------------------------------------------------------------------------------

BUDGET = 16384


def coalescer(**overrides: float) -> Coalescer:
    """The parameters ROCm/ATOM tests/test_prefill_delayer.py builds its delayer with (pre-#1670 defaults)."""
    params = {"target_fill": 0.7, "ttft_max_ticks": 30, "partial_max_ticks": 8, "stall_ticks": 3, **overrides}
    made = Coalescer(BUDGET, **params)
    assert made.tick(sig(0)) == (True, "first")  # the first call always fires
    return made


def sig(pending: int, *, ranks: int = 1, prefillable: int = 1, running_decode: int = 64, **flags: bool) -> Signals:
    """Group sums of one tick (one rank, 64 decoding, unless told)."""
    return Signals(ranks=ranks, prefillable=prefillable, pending_tokens=pending, running_decode=running_decode,
                   **flags)


# Restated from ROCm/ATOM tests/test_prefill_delayer.py: (case, overrides, ticks, expected fire per tick, reason).
ATOM_TABLE = (
    ("holds_below_target", {}, [sig(1000)], [F], "fill-wait"),
    ("fires_at_target", {}, [sig(12000)], [T], "fill"),
    ("fires_exactly_at_threshold", {}, [sig(11469)], [T], "fill"),
    ("no_decode_fires", {}, [sig(1000, running_decode=0)], [T], "nodecode"),
    ("kv_high_fires", {}, [sig(1000, kv_high=True)], [T], "kv"),
    ("kv_low_fires_when_watermark_set", {}, [sig(1000, kv_low=True)], [T], "kv"),
    ("ttft_bound_fires", {"ttft_max_ticks": 3, "stall_ticks": 1000},
     [sig(1000), sig(2000), sig(3000), sig(4000)], [F, F, F, T], "ttft"),
    ("stall_fires_when_queue_not_growing", {"ttft_max_ticks": 1000}, [sig(1000)] * 4, [F, F, F, T], "stall"),
    ("growth_resets_stall", {"stall_ticks": 2, "ttft_max_ticks": 1000},
     [sig(1000), sig(1000), sig(2000), sig(2000), sig(2000)], [F, F, F, F, T], "stall"),
    ("small_partial_does_not_fire_immediately", {"partial_max_ticks": 3, "ttft_max_ticks": 1000, "stall_ticks": 1000},
     [sig(500, partial=True)] * 2, [F, F], "fill-wait"),
    ("partial_fires_after_partial_deadline", {"partial_max_ticks": 2, "ttft_max_ticks": 1000, "stall_ticks": 1000},
     [sig(500, partial=True)] * 3, [F, F, T], "partial"),
    ("no_prefillable_rank_allows", {}, [sig(0, prefillable=0)], [T], "vacuous"),
    ("mixed_holds_even_when_full", {"ttft_max_ticks": 1000}, [sig(BUDGET, ranks=2)], [F], "align"),
    ("aligned_fires_when_full", {"ttft_max_ticks": 1000}, [sig(2 * BUDGET, ranks=2, prefillable=2)], [T], "fill"),
    ("mixed_released_by_ttft", {"ttft_max_ticks": 2, "stall_ticks": 1000}, [sig(BUDGET, ranks=2)] * 3, [F, F, T],
     "ttft"),
)


@pytest.mark.parametrize(("name", "overrides", "ticks", "fires", "reason"), ATOM_TABLE, ids=[c[0] for c in ATOM_TABLE])
def test_atom_published_cases(name, overrides, ticks, fires, reason):  # ATOM's coalescer rule, as published
    made = coalescer(**overrides)
    results = [made.tick(s) for s in ticks]
    assert [fire for fire, _ in results] == fires
    assert results[-1][1] == reason


def test_atom_refuses_out_of_range_parameters():  # ATOM clamps these; we refuse them (module docstring)
    for bad in ({"target_fill": 1.5}, {"target_fill": 0.0}, {"ttft_max_ticks": 0}, {"stall_ticks": -1}):
        with pytest.raises(ValueError):
            Coalescer(BUDGET, **bad)


def atom(**overrides: float) -> AtomCoalescerPolicy:
    return AtomCoalescerPolicy(sim_args(dp_size=4, chunked_prefill_size=1000), **overrides)


def test_atom_first_round_fires_on_every_rank():  # "first round fires" (ATOM#1611)
    assert atom().decide(DECODING).allow_prefill


def test_atom_no_prefillable_rank_holds_on_stale_rows():  # staleness adaptation of the vacuous fire
    policy = atom()
    policy.decide(DECODING)
    assert not step(policy, [decoding(r) for r in range(4)]) and policy.reason == "unseen"
    assert policy.counter == 0  # the episode was reset, as ATOM's vacuous fire resets it


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ([waiting(0, running=0, has_decode_work=False)] + [row(r) for r in (1, 2, 3)], "nodecode"),
        ([waiting(0, resident_chunks=1, usage=0.95)] + [decoding(r) for r in (1, 2, 3)], "kv"),
    ],
    ids=["no-decode-anywhere", "kv-high-chunk-rank"],
)
def test_atom_must_fire_bounds_release_an_unaligned_group(rows, reason):  # must-fire before the alignment gate
    policy = atom()
    policy.decide(DECODING)
    assert step(policy, rows) and policy.reason == reason


def test_atom_holds_a_lone_prompt_until_ttft_max_ticks():  # TTFT_MAX_TICKS bound (default 200, ATOM#1670)
    policy = atom()
    policy.decide(DECODING)
    lone = [waiting(0)] + [decoding(r) for r in (1, 2, 3)]
    decisions = [step(policy, lone) for _ in range(201)]
    assert decisions == [False] * 200 + [True] and policy.reason == "ttft"


def test_atom_a_held_chunk_fires_after_partial_max_ticks():  # PARTIAL_MAX_TICKS bound (default 100)
    policy = atom()
    policy.decide(DECODING)
    chunk = [waiting(0, resident_chunks=1, waiting_prompts=0)] + [decoding(r) for r in (1, 2, 3)]
    decisions = [step(policy, chunk) for _ in range(101)]
    assert decisions == [False] * 100 + [True] and policy.reason == "partial"


def test_atom_fires_when_the_group_fills_the_target():  # TARGET_FILL 0.9 of n_prefillable * budget
    policy = atom()
    policy.decide(DECODING)
    assert not step(policy, [waiting(r, pending_prefill_tokens=850) for r in range(4)])  # fill 0.85
    assert step(policy, [waiting(r, pending_prefill_tokens=900) for r in range(4)]) and policy.reason == "fill"


def test_atom_gives_up_after_stall_ticks_without_growth():  # STALL_TICKS 10
    policy = atom()
    policy.decide(DECODING)
    aligned = [waiting(r) for r in range(4)]  # fill 0.1, never grows
    decisions = [step(policy, aligned) for _ in range(11)]
    assert decisions == [False] * 10 + [True] and policy.reason == "stall"


def test_atom_signals_are_the_sums_of_the_rows():  # P_r, T_r, R_r, C_r, kv flags only from prefillable ranks
    policy = atom(token_usage_low_watermark=0.2)
    policy.observe([waiting(0, usage=0.1), decoding(1, resident_chunks=1, pending_prefill_tokens=300),
                    decoding(2, usage=0.95), waiting(3, usage=0.95)])
    assert policy.signals() == Signals(ranks=4, prefillable=2, pending_tokens=500, running_decode=15, kv_high=False,
                                       kv_low=True, partial=True)
    assert not atom().signals()  # before the first gather
    policy = atom()
    policy.observe([waiting(0, usage=0.001)])
    assert not policy.signals().kv_low  # KV-low is off by default


def test_atom_holds_resident_chunks():  # ATOM's permission covers partials too
    assert atom().decide(DECODING).hold_resident_chunks


# -- vllm-cadence --------------------------------------------------------------------------------------

def cadence(interval: int = 2, rank: int = 0) -> VllmCadencePolicy:
    return VllmCadencePolicy(sim_args(dp_size=2), rank, interval=interval)


# Restated from vLLM tests/v1/core/test_scheduler.py, the throttle cases added with vllm-project/vllm#44558.
def test_vllm_throttled_step_defers_new_prefill_only_while_something_decodes():  # has_running True/False case
    policy = cadence()
    assert policy.decide(DECODING).allow_prefill  # step 0: cadence-aligned
    assert not step(policy, [decoding(0), decoding(1)], DECODING)  # step 1 throttled, a decode to protect
    assert step(policy, [decoding(0), decoding(1)], DECODING)  # step 2: aligned again, admitted
    policy = cadence()
    policy.decide(IDLE)
    assert step(policy, [row(0), row(1)], IDLE)  # throttled step, nothing decoding: admitted


def test_vllm_throttle_defers_inflight_prefill_chunk():  # continuation is throttled too
    policy = cadence()
    policy.decide(DECODING)
    chunk = [decoding(0, resident_chunks=1), decoding(1)]
    decision = (policy.observe(chunk), policy.decide(DECODING))[1]
    assert not decision.allow_prefill and decision.hold_resident_chunks


def test_vllm_capacity_bound_guard_admits():  # an open step that could not drain the queue keeps it open
    policy = cadence()
    policy.decide(DECODING)
    assert step(policy, [waiting(0, waiting_prompts=2), decoding(1)], DECODING)  # step 1 throttled, but bound
    assert policy.capacity_bound


def test_vllm_prefills_only_on_steps_divisible_by_n():  # step % N == 0
    policy = cadence(interval=3)
    decisions = [policy.decide(DECODING).allow_prefill]
    for _ in range(6):
        decisions.append(step(policy, [decoding(0), decoding(1)]))
    assert decisions == [T, F, F, T, F, F, T]


def test_vllm_capacity_bound_stays_open_until_the_queue_drains():  # prefill_capacity_bound
    policy = cadence(interval=4)
    policy.decide(DECODING)
    backlog = [waiting(0, waiting_prompts=3), decoding(1)]
    assert [step(policy, backlog) for _ in range(3)] == [T, T, T]
    assert step(policy, [decoding(0), decoding(1)])  # this open round drained: the next throttled one closes
    assert not step(policy, [decoding(0), decoding(1)])
    assert policy.counter == 5


def test_vllm_an_all_idle_round_restarts_the_wave():  # shared step counter, reset on an all-idle round
    policy = cadence(interval=4)
    policy.decide(DECODING)
    assert not step(policy, [decoding(0), decoding(1)])  # step 1: throttled
    assert step(policy, [row(0, batch_size=0), row(1, batch_size=0)]) and policy.counter == 0


def test_vllm_reads_its_own_row_without_dp_attention():  # R7: observe gets only the rank's row
    policy = cadence(rank=1)
    policy.decide(DECODING)
    assert step(policy, [waiting(1, waiting_prompts=2)]) and policy.capacity_bound


# -- trtllm-balance ------------------------------------------------------------------------------------

def balance(**overrides: int) -> TrtllmBalancePolicy:
    return TrtllmBalancePolicy(sim_args(dp_size=2, max_num_seqs=16), **overrides)  # M = 8


def test_trtllm_first_round_releases():  # no rows yet: nothing to protect
    assert balance().decide(DECODING).allow_prefill


def test_trtllm_all_ready_and_all_decoding_waits_batching_wait_iters_before_each_release():  # batching_wait_iters
    policy = balance()
    ready = [waiting(0), waiting(1)]
    decisions = [step(policy, ready) for _ in range(22)]
    assert decisions == ([F] * 10 + [T]) * 2 and policy.reason == "batched"


def test_trtllm_all_ready_releases_at_once_when_some_rank_does_not_decode():  # batching wait needs all decoding
    policy = balance()
    assert step(policy, [waiting(0), waiting(1, running=0, has_decode_work=False)]) and policy.reason == "aligned"


def test_trtllm_holds_until_timeout_iters_when_not_every_rank_has_context():  # timeout_iters 50
    policy = balance()
    lone = [waiting(0), decoding(1)]
    decisions = [step(policy, lone) for _ in range(51)]
    assert decisions == [F] * 49 + [T, F] and policy.counter == 1


def test_trtllm_a_rank_with_no_decode_work_releases():  # "or some rank has no decode work"
    policy = balance()
    assert not step(policy, [waiting(0), decoding(1)])
    assert step(policy, [waiting(0), row(1, running=0)]) and policy.reason == "no-decode"
    assert policy.counter == 0


def test_trtllm_a_full_rank_is_not_ready():  # free slot: running decodes < max_batch_size
    policy = balance()
    assert not step(policy, [waiting(0), waiting(1, running=8, resident_chunks=0)]) and policy.reason == "wait"


def test_trtllm_holds_chunks_as_context_work():  # chunks are context requests
    policy = balance()
    assert policy.has_context(decoding(0, resident_chunks=1))
    assert policy.decide(DECODING).hold_resident_chunks


# -- oracle bound --------------------------------------------------------------------------------------

def test_oracle_extend_rounds_is_the_busiest_ranks_ceil():  # per rank ceil(tokens / budget), max over ranks
    requests = [(0, 1000, 0, 5), (0, 600, 100, 5), (1, 2049, 0, 5), (2, 10, 9, 1)]
    assert extend_rounds_per_rank(requests, 1024) == {0: 2, 1: 3, 2: 1}
    assert oracle_bound(requests, 1024, 8, lambda b: 0.01).extend_rounds == 3


def test_oracle_decode_segments_respect_the_batch_limit():  # at most M decode at once, admitted in order
    assert decode_segments([3, 5, 2, 1], 2) == [(0, 2, 2), (2, 3, 2), (3, 4, 1)]  # 2, 4 and 1 rounds


def test_oracle_decode_bound_uses_the_busiest_rank_per_round():  # F3: the slowest rank sets the round
    bound = oracle_bound([(0, 10, 0, 5), (0, 10, 0, 5), (1, 10, 0, 3)], 64, 8, lambda batch: 0.001 * batch)
    assert bound.decode_rounds == 4 and bound.decode_tokens == 10
    assert bound.decode_seconds == pytest.approx(4 * 0.002)
    assert bound.decode_tokens_per_s == pytest.approx(10 / 0.008)


def test_oracle_decode_round_time_of_a_preset_is_its_low_latency_round():  # CostPreset-like callable
    preset = preset_named("h200-dp8-ep8")
    seconds = decode_round_seconds_of(preset, ranks=2, kv_pages_per_seq=3)
    rows = [Row(rank=r, num_tokens=10, batch_size=10, pool_pages_used=30) for r in range(2)]
    assert seconds(10) == pytest.approx(preset.round_seconds(rows, DispatchMode.LOW_LATENCY))
    assert seconds(20) > seconds(10) > 0
