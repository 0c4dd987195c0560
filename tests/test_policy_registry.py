"""The lab's policy registry, and every registered policy run end to end on the lockstep driver."""

from __future__ import annotations

import random

import pytest

from engine.build import build_engine
from engine.config import PrefillDelay, ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.policies.registry import DEFAULT_LOCAL_INTERVAL, MIXED_PREFILL_DECODE, POLICIES, make_policy, policy_args
from engine.policy import LocalView
from engine.request import Admitted, Finished
from tests.helpers import req, sim_args

GROUP = {"gate", "sglang-delayer", "atom-coalescer", "trtllm-balance"}
NAMES = ("ungated", "gate", "local-interval", "sglang-delayer", "atom-coalescer", "vllm-cadence", "trtllm-balance")
DELAY = PrefillDelay(attempt_interval=2, any_interval=6)


def test_registry_names_every_lab_policy():  # PEERS.md policies 1-7
    assert tuple(POLICIES) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_make_policy_builds_the_named_policy(name: str):  # factory(args, rank); group policies flagged
    policy = make_policy(name, policy_args(name, sim_args(dp_size=4), prefill_delay=DELAY), 2)
    assert policy.name == name
    assert policy.group_decision == (name in GROUP)


def test_an_unknown_name_lists_the_known_ones():  # clear ValueError
    with pytest.raises(ValueError, match="unknown prefill policy 'nagle'") as info:
        make_policy("nagle", sim_args(), 0)
    assert all(name in str(info.value) for name in NAMES)
    with pytest.raises(ValueError, match="known: ungated, gate"):
        policy_args("nagle", sim_args())


def test_keyword_overrides_reach_the_policy():  # constructors take (args, rank) plus keyword overrides
    args = sim_args(dp_size=4)
    assert make_policy("atom-coalescer", args, 0, target_fill=0.5).coalescer.target_fill == 0.5
    assert make_policy("trtllm-balance", args, 0, timeout_iters=7).timeout_iters == 7
    assert make_policy("local-interval", args, 1, interval=9).interval == 9
    with pytest.raises(TypeError):
        make_policy("gate", args, 0, target_fill=0.5)


def test_gate_args_set_the_intervals_and_clear_the_local_one():  # C2: the gate refuses L1 beside it
    base = sim_args(prefill_decode_interval=5)
    args = policy_args("gate", base, prefill_delay=DELAY)
    assert (args.prefill_delay, args.prefill_decode_interval) == (DELAY, None)
    assert make_policy("gate", args, 0).delay == DELAY
    kept = sim_args(prefill_attempt_interval=3, prefill_any_attempt_interval=9)
    assert policy_args("gate", kept).prefill_delay == PrefillDelay(3, 9)


def test_gate_args_without_intervals_are_refused():  # gate unset would be "ungated" (R8)
    with pytest.raises(ValueError, match="needs --prefill-attempt-interval and --prefill-any-attempt-interval"):
        policy_args("gate", sim_args())


def test_local_interval_args_set_l1_and_clear_the_gate():  # L1 from args, the caller, or the default
    gated = sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    args = policy_args("local-interval", gated)
    assert (args.prefill_delay, args.prefill_decode_interval) == (None, DEFAULT_LOCAL_INTERVAL)
    assert policy_args("local-interval", sim_args(prefill_decode_interval=7)).prefill_decode_interval == 7
    assert policy_args("local-interval", sim_args(), decode_interval=3).prefill_decode_interval == 3
    assert make_policy("local-interval", policy_args("local-interval", gated), 1).interval == DEFAULT_LOCAL_INTERVAL


@pytest.mark.parametrize("name", ["ungated", "sglang-delayer", "atom-coalescer", "vllm-cadence", "trtllm-balance"])
def test_peer_args_carry_no_gate_or_local_interval(name: str):  # no launch record claims a gate that did not run
    args = policy_args(name, sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6))
    assert (args.prefill_delay, args.prefill_decode_interval) == (None, None)


def test_peers_decide_from_rows_not_from_the_local_view():  # group policies read only gathered rows
    args = sim_args(dp_size=4)
    for name in GROUP - {"gate"}:
        one, other = make_policy(name, args, 0), make_policy(name, args, 3)
        first = one.decide(LocalView(wants_prefill=True, has_decode_work=True))
        assert first == other.decide(LocalView())


# -- every policy on the lockstep driver -------------------------------------------------------------------

def run_to_completion(name: str, args: ServerArgs, requests: int = 24, max_rounds: int = 2000):
    """A decode background on every rank, then `requests` scattered requests (some longer than a chunk,
    rank 0 getting twice its share); steps until every request finished."""

    def factory(rank: int, a: ServerArgs):
        return build_engine(rank, a, policy=make_policy(name, a, rank))

    driver = LockstepDriver(args, engine_factory=factory)
    for rank in range(args.dp_size):
        driver.submit(rank, req(f"bg{rank}", prompt_len=100, output_len=150))
    rng = random.Random(7)
    sent, finished, rounds = 0, set(), []
    while len(finished) < requests + args.dp_size:
        assert driver.round < max_rounds, f"{name}: {len(finished)}/{requests} finished after {max_rounds} rounds"
        if sent < requests and driver.round % 3 == 0:
            rank = 0 if sent % 4 == 3 else sent % args.dp_size
            driver.submit(rank, req(f"q{sent}", prompt_len=rng.randint(30, 700), output_len=rng.randint(4, 40)))
            sent += 1
        outcomes = driver.step()  # RankEngine raises CollectiveError if a group policy's ranks disagree
        rounds.append(outcomes)
        finished |= {event.rid for outcome in outcomes for event in outcome.events if isinstance(event, Finished)}
    return rounds, finished


@pytest.mark.parametrize("name", NAMES)
def test_every_policy_finishes_every_request_on_the_lockstep_driver(name: str):  # liveness; G agreement
    args = policy_args(name, sim_args(dp_size=4), prefill_delay=DELAY)
    rounds, finished = run_to_completion(name, args)
    assert finished == {f"q{i}" for i in range(24)} | {f"bg{r}" for r in range(4)}
    closed = 0
    for outcomes in rounds:
        if name in GROUP:
            assert len({(o.decision.allow_prefill, o.decision.counter) for o in outcomes}) == 1
        for rank, outcome in enumerate(outcomes):
            if outcome.decision.allow_prefill:
                continue
            closed += 1
            if outcome.decision.hold_resident_chunks:
                assert outcome.rows[rank].num_extends == 0  # a closed round plans no prefill at all (S1)
            else:
                assert not any(isinstance(e, Admitted) for e in outcome.events)  # chunks only (sglang-delayer)
    assert (closed > 0) == (name != "ungated")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_mixed_engines_run_their_peers_mixed(name: str):  # issue 11: vLLM and TRT-LLM batch prefill with decode
    base = sim_args(dp_size=4, prefill_attempt_interval=4, prefill_any_attempt_interval=16)
    assert not base.enable_mixed_prefill_decode
    args = policy_args(name, base)
    assert args.enable_mixed_prefill_decode == (name in MIXED_PREFILL_DECODE)
    assert policy_args(name, base.replace(enable_mixed_prefill_decode=True)).enable_mixed_prefill_decode
