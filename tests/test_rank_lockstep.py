"""The round of R1 on the lockstep driver: one gather per round, agreement, config adoption, roles."""

from __future__ import annotations

import pytest

from engine.config import PrefillDelay
from engine.drivers.lockstep import LockstepDriver
from engine.gate import GatePoint
from engine.group import CollectiveError
from engine.request import Admitted, Finished, ProposalRefused
from engine.scheduler.states import ReqState
from tests.helpers import req, run_rounds, sim_args


def gated(**extra):
    return sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6, **extra)


def feed(driver: LockstepDriver, count: int, every: int, rounds: int):
    """Submit `count` requests round-robin, one every `every` rounds, while stepping `rounds` rounds."""
    outcomes, sent = [], 0
    for r in range(rounds):
        if sent < count and r % every == 0:
            driver.submit(sent % driver.args.dp_size, req(f"q{sent}", prompt_len=40 + sent, output_len=12))
            sent += 1
        outcomes.append(driver.step())
    return outcomes


def test_exactly_one_gather_per_round_idle_included():  # rule R2
    driver = LockstepDriver(gated())
    run_rounds(driver, 5)  # idle rounds
    feed(driver, 6, 3, 40)
    assert driver.group.gathers == 45 == driver.round


def test_every_rank_votes_alike_every_round():  # rule R6
    driver = LockstepDriver(gated())
    opened = 0
    for outcomes in feed(driver, 12, 2, 120):
        decisions = {
            (o.decision.point, o.decision.allow_prefill, o.decision.counter, o.counter_after) for o in outcomes
        }
        assert len(decisions) == 1
        opened += outcomes[0].decision.allow_prefill
    assert opened > 0


def test_a_prompt_is_first_seen_by_the_next_rounds_vote():  # rule R6: one round of staleness
    driver = LockstepDriver(sim_args(dp_size=1, prefill_attempt_interval=1, prefill_any_attempt_interval=1))
    driver.submit(0, req("long", output_len=100))
    run_rounds(driver, 4)  # now decoding with no backlog: every point is closed
    driver.submit(0, req("late"))
    first = driver.step()[0]
    assert not first.decision.allow_prefill  # voted on the previous rows: want=false, decodes=true
    assert first.rows[0].want_prefill and first.rows[0].num_extends == 0
    second = driver.step()[0]
    assert second.decision.allow_prefill and second.rows[0].num_extends == 1
    assert any(isinstance(e, Admitted) and e.rid == "late" and e.wait_rounds == 1 for e in second.events)


def test_a_resident_chunk_waits_out_closed_rounds_and_the_next_open_round_resumes_it():  # rules R4, S1
    # Rank 1 decodes, so the counter climbs and most rounds are closed; rank 0's prompt needs ten
    # chunks of 16 tokens. At the engine level a resident chunk extends only on open rounds, and every
    # open round while it waits extends it.
    driver = LockstepDriver(
        sim_args(dp_size=2, prefill_attempt_interval=3, prefill_any_attempt_interval=6, chunked_prefill_size=16)
    )
    driver.submit(1, req("decoder", prompt_len=16, output_len=200))
    run_rounds(driver, 4)
    driver.submit(0, req("long", prompt_len=160, output_len=4))
    scheduler = driver.engines[0].scheduler
    opened, held = 0, 0
    waiting = (None, ReqState.NEW, ReqState.PREFILLING)  # None: still in the inbox, taken in at intake
    while (before := scheduler.state_of("long")) in waiting and opened < 20:
        outcome = driver.step()[0]
        chunk = outcome.rows[0].prefill_tokens
        if outcome.decision.allow_prefill:
            assert chunk > 0, f"round {outcome.round}: an open round left the prompt waiting"
            opened += 1
        else:
            assert chunk == 0, f"round {outcome.round}: prefill ran on a closed round"
            held += before is ReqState.PREFILLING
    assert opened == 10 and held > 0  # 160 tokens in 10 chunks, with closed rounds between them


def test_a_prompt_at_an_idle_engine_meets_an_open_all_point():  # rules R3, P5
    driver = LockstepDriver(sim_args(dp_size=2, prefill_attempt_interval=4, prefill_any_attempt_interval=8))
    run_rounds(driver, 3)  # all idle: the counter stays 0, an ALL point every round
    driver.submit(1, req("first"))
    outcome = driver.step()[1]
    assert outcome.decision.point is GatePoint.ALL and outcome.decision.allow_prefill
    assert outcome.rows[1].num_extends == 1  # admitted in the round it arrived


def test_without_dp_attention_each_rank_gates_on_its_own_row():  # rule R7
    def scenario(dp_attention: bool):
        driver = LockstepDriver(
            sim_args(
                dp_size=2,
                enable_dp_attention=dp_attention,
                prefill_attempt_interval=2,
                prefill_any_attempt_interval=50,
                max_num_seqs=64,
            )
        )
        driver.submit(0, req("a0", output_len=200))
        driver.submit(1, req("b0", output_len=200))
        run_rounds(driver, 6)  # both ranks now decode
        driver.submit(0, req("a1"))  # only rank 0 has backlog; rank 1 would block a group ALL point
        admitted_round = None
        for outcomes in run_rounds(driver, 20):
            for event in outcomes[0].events:
                if isinstance(event, Admitted) and event.rid == "a1":
                    admitted_round = event.round
        return admitted_round

    group_round, own_round = scenario(True), scenario(False)
    assert own_round is not None and own_round <= 9  # its own next ALL point opens
    assert group_round is None  # the group's ALL stays shut, ANY (50) not reached yet


def test_gate_unset_always_allows():  # rule R8
    driver = LockstepDriver(sim_args(dp_size=2))
    for outcomes in feed(driver, 8, 1, 30):
        assert all(o.decision.allow_prefill and o.decision.point is GatePoint.NONE for o in outcomes)
        for o in outcomes:
            for event in o.events:
                if isinstance(event, Admitted):
                    assert event.wait_rounds == 0


def test_roles_ignore_allow_prefill():  # rule R9
    prefill = LockstepDriver(sim_args(dp_size=1, disaggregation_mode="prefill"))
    prefill.submit(0, req("p"))
    assert prefill.step()[0].rows[0].num_extends == 1
    decode = LockstepDriver(sim_args(dp_size=1, disaggregation_mode="decode"))
    decode.submit(0, req("d"))
    assert all(o[0].rows[0].num_extends == 0 for o in run_rounds(decode, 10))


def test_config_change_is_adopted_by_every_rank_after_the_same_gather():  # rules G1, G2
    driver = LockstepDriver(gated())
    feed(driver, 6, 2, 13)
    driver.propose(1, PrefillDelay(3, 9))
    change = driver.step()
    assert {o.adopted_epoch for o in change} == {1}
    assert change[0].record.config_epoch == 0 and change[0].record.attempt_interval == 2  # decided under old
    assert change[0].record.adopted_epoch == 1
    after = driver.step()
    assert {o.rows[r].config_epoch for o in after for r in range(3)} == {1}
    record = after[0].record
    assert (record.config_epoch, record.attempt_interval, record.any_interval) == (1, 3, 9)
    assert record.counter == change[0].counter_after  # the counter is kept across the change
    for outcomes in run_rounds(driver, 30):
        rec = outcomes[0].record
        expected = (
            GatePoint.ANY
            if rec.counter and rec.counter % 9 == 0
            else (GatePoint.ALL if rec.counter % 3 == 0 else GatePoint.NONE)
        )
        assert rec.point is expected


def test_a_proposal_is_checked_where_it_enters_and_a_bad_one_changes_nothing():  # rules C3, G1
    # Handed to the driver directly, past the controller's checks: rank 0's intake refuses values
    # startup would refuse and stale epochs, reports them, and later proposals still go through.
    driver = LockstepDriver(gated())
    feed(driver, 3, 2, 6)
    driver.propose(1, PrefillDelay(0, 0))
    driver.propose(2, PrefillDelay(6, 3))
    refused = [e for o in run_rounds(driver, 3) for e in o[0].events if isinstance(e, ProposalRefused)]
    assert [(e.epoch, e.error) for e in refused] == [
        (1, "--prefill-attempt-interval must be an integer in [1, 4294967295], got 0"),
        (2, "--prefill-any-attempt-interval (3) must be >= --prefill-attempt-interval (6): otherwise the ALL "
            "points a burst relies on could never be reached twice in a row"),
    ]  # fmt: skip
    assert {engine.epoch for engine in driver.engines} == {0}
    assert {engine.policy.delay for engine in driver.engines} == {PrefillDelay(2, 6)}
    driver.propose(1, PrefillDelay(3, 9))  # the next good one is not blocked by the refused ones
    driver.propose(1, PrefillDelay(4, 8))  # a second epoch 1: stale
    outcomes = run_rounds(driver, 3)
    stale = [e for o in outcomes for e in o[0].events if isinstance(e, ProposalRefused)]
    assert [e.epoch for e in stale] == [1] and "stale" in stale[0].error
    assert {engine.epoch for engine in driver.engines} == {1}
    assert {engine.policy.delay for engine in driver.engines} == {PrefillDelay(3, 9)}
    driver.propose(0, None)  # a zero epoch is stale too, and does not block the queue
    driver.propose(2, None)
    run_rounds(driver, 3)
    assert {engine.epoch for engine in driver.engines} == {2}
    assert {engine.policy.delay for engine in driver.engines} == {None}


def test_disable_at_runtime_turns_the_gate_off():  # rules C3, G1
    driver = LockstepDriver(gated())
    driver.propose(1, None)
    run_rounds(driver, 2)
    outcomes = driver.step()
    assert outcomes[0].record.attempt_interval is None and outcomes[0].decision.allow_prefill


def test_stop_is_agreed_on_the_same_round():
    driver = LockstepDriver(gated())
    run_rounds(driver, 3)
    driver.request_stop()
    outcomes = driver.step()
    assert all(o.stop for o in outcomes)


def test_divergence_is_detected():
    driver = LockstepDriver(gated())
    run_rounds(driver, 3)
    driver.engines[2].policy.gate.rounds += 1  # corrupt one rank's counter
    with pytest.raises(CollectiveError, match="voted differently"):
        run_rounds(driver, 4)


def test_requests_finish_and_pages_return():
    driver = LockstepDriver(gated())
    finished = set()
    for outcomes in feed(driver, 9, 1, 200):
        for o in outcomes:
            finished |= {e.rid for e in o.events if isinstance(e, Finished)}
    assert finished == {f"q{i}" for i in range(9)}
    assert all(e.scheduler.pool.used == 0 and e.scheduler.live == 0 for e in driver.engines)
