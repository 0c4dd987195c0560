"""The tuner's guards (tuner/core.py) on streams of records built to need a change: noise, dwell, the rate
cap, an operator's change, a new run, a gap, a change in flight and a retry after a stale epoch."""

from __future__ import annotations

from dataclasses import replace

from prefill_gate.v1 import types_pb2 as pb
from tuner.core import Tuner, TunerSettings
from tuner.estimates import Window, facts_of
from tuner.law import Intervals, Slo

SLO = Slo(ttft_p99_s=2.0, itl_p99_s=0.2)
ROUND_S = 0.03
FAST = TunerSettings(
    min_span=0, min_rounds=50, min_ttft_samples=20, min_itl_tokens=100, dwell_rounds=100, evaluate_every=1
)


def config(
    epoch: int = 0, a: int | None = 8, k: int | None = 32, by: str = "launch", reason: str = ""
) -> pb.GateConfig:
    return pb.GateConfig(
        epoch=epoch, attempt_interval=a or 0, any_interval=k or 0, enabled=a is not None, changed_by=by, reason=reason
    )


def record(
    round_: int, conf: pb.GateConfig, *, run: str = "run-1", dropped: int = 0, itl: float = 0.3
) -> pb.RoundRecord:
    """A busy decode round whose ITL p99 (`itl`, 0.3 s) is over the 0.2 s budget; a first token every round."""
    return pb.RoundRecord(
        round=round_,
        run_id=run,
        clock_seconds=(round_ + 1) * ROUND_S,
        round_seconds=ROUND_S,
        all_decode_or_idle=True,
        config=conf,
        dropped_before=dropped,
        ranks=[pb.RankRow(rank=r, batch_size=4, has_decode_work=True) for r in range(2)],
        ttft_seconds=[0.5],
        itl_seconds=[0.03, itl],
        itl_tokens=[90, 10],
    )


def feed(tuner: Tuner, rounds: range, conf: pb.GateConfig, **kw: object) -> list:
    """Feed `rounds`; returns (round, proposal) for each proposal."""
    out = []
    for r in rounds:
        proposal = tuner.observe(record(r, conf, **kw))  # type: ignore[arg-type]
        if proposal is not None:
            out.append((r, proposal))
    return out


def test_no_change_while_the_estimates_are_noisy_then_one_with_its_reason():
    settings = TunerSettings(min_span=0.2, min_rounds=200, min_ttft_samples=20, min_itl_tokens=100, dwell_rounds=10)
    tuner = Tuner(SLO, settings)
    assert feed(tuner, range(0, 150), config()) == []
    assert tuner.status == "gathering estimates: 4.5/6 seconds, 150/200 rounds"  # 150 rounds of 30 ms
    [(at, proposal)] = feed(tuner, range(150, 201), config())
    assert at == 199 and proposal.expected_epoch == 0 and proposal.target == Intervals(4, 32)
    assert proposal.reason.startswith("tuner: ITL p99 300 ms > 200 ms budget") and proposal.reason.endswith("A 8->4")


def test_one_change_in_flight_then_a_dwell_under_the_new_config():
    tuner = Tuner(SLO, replace(FAST, hold_s=15.0))
    [(at, proposal)] = feed(tuner, range(0, 300), config())  # in flight: nothing more while epoch 0 holds
    assert at == 100
    tuner.settle(proposal)  # accepted: still in flight until a record shows epoch 1
    assert feed(tuner, range(300, 310), config()) == []
    adopted = config(1, 4, 32, "tuner", proposal.reason)
    assert feed(tuner, range(310, 409), adopted) == []  # dwell: 100 rounds under the new config
    assert tuner.status.startswith("dwelling: the config in force since round 310")
    [(at, second)] = feed(tuner, range(409, 420), adopted)
    assert at == 410 and second.expected_epoch == 1
    # The ITL tail did not move (10% of tokens past the budget before and after, the p99 300 ms): smaller
    # windows did not help, so the other way.
    assert second.target == Intervals(8, 64)
    went = "it went 10% -> 10% of decode tokens past the budget after the last change toward smaller windows"
    assert f"{went}: the other way" in second.reason
    # Fewer extend rounds did not move it either: the intervals cannot fix it, and the tuner stops trying.
    tuner.settle(second)
    fewer = config(2, 8, 64, "tuner", second.reason)
    assert feed(tuner, range(411, 700), fewer) == []
    assert tuner.status.endswith("and neither way moved it: the intervals cannot fix it, holding")
    # The hold lasts hold_s engine seconds after that change (made at 12.33 s), then the model decides afresh.
    [(at, third)] = feed(tuner, range(700, 1000), fewer)
    assert at == 911  # its record's clock, 27.36 s, is the first past 12.33 + 15 s
    assert third.target == Intervals(4, 64) and "an extend round of one prompt takes" in third.reason


def test_a_refused_change_frees_the_tuner_says_why_and_waits_a_dwell():
    tuner = Tuner(SLO, FAST)
    [(_, proposal)] = feed(tuner, range(0, 101), config())
    tuner.settle(proposal, "INVALID_ARGUMENT: nope")
    assert tuner.pending is None and tuner.status == "change refused: INVALID_ARGUMENT: nope"
    assert feed(tuner, range(101, 200), config()) == []  # not asked again every round: a dwell first
    assert len(feed(tuner, range(200, 201), config())) == 1


def test_the_rate_cap_counts_its_own_changes_per_engine_minute():
    tuner = Tuner(SLO, replace(FAST, max_changes_per_min=2, dwell_rounds=10))
    conf, epoch, r, times, capped = config(), 0, 0, [], False
    while r < 6000 and len(times) < 4:
        # Each change helps a little (ITL p99 x0.9, still over budget): the tuner keeps at it, the cap paces it.
        proposal = tuner.observe(record(r, conf, itl=0.3 * 0.9**epoch))
        if proposal is not None:
            epoch += 1
            target = proposal.target
            conf = config(epoch, target.attempt, target.any, "tuner", proposal.reason)
            times.append((r + 1) * ROUND_S)
        r += 1
        if "cap of 2 changes per minute" in tuner.status:
            capped = True
    assert capped and len(times) == 4
    assert times[2] - times[0] > 60.0  # no three changes in any 60 engine seconds


def test_an_operators_change_is_respected_for_its_window_then_tuned_from():
    tuner = Tuner(SLO, replace(FAST, respect_manual_s=30.0))
    assert len(feed(tuner, range(0, 101), config())) == 1
    manual = config(1, 16, 64, "operator", "operator: A 8->16, K 32->64")
    assert feed(tuner, range(101, 1100), manual) == []  # 1000 rounds x 30 ms = 30 s: still respected
    assert tuner.pending is None  # the operator's epoch overtook the tuner's proposal
    assert tuner.take_events()[-1] == ("operator changed the config to A=16 K=64 at round 101: respecting it for 30 s")
    [(at, after)] = feed(tuner, range(1100, 1110), manual)
    assert after.expected_epoch == 1 and after.target == Intervals(8, 64) and at * ROUND_S >= 30.0


def test_a_new_run_resets_the_estimates_and_a_gap_restarts_them():
    tuner = Tuner(SLO, FAST)
    feed(tuner, range(0, 60), config())
    assert len(tuner.window) == 60
    tuner.observe(record(5, config(), run="run-2"))  # the engine restarted: a new run id, rounds from 0
    assert tuner.take_events()[-1] == "new run run-2: estimates reset" and len(tuner.window) == 1
    feed(tuner, range(6, 40), config(), run="run-2")
    tuner.observe(record(45, config(), run="run-2"))  # rounds 40-44 never came
    assert tuner.take_events() == ["gap in the stream before round 45: estimates restart"] and len(tuner.window) == 1
    tuner.observe(record(46, config(), run="run-2", dropped=3))  # the server says it dropped some
    assert len(tuner.window) == 1
    tuner.lost("stream lost (UNAVAILABLE)")
    assert tuner.take_events()[-1] == "stream lost (UNAVAILABLE): keeping A=8 K=32" and len(tuner.window) == 0


def test_a_stale_epoch_is_retried_against_the_config_that_won_unless_an_operator_made_it():
    tuner = Tuner(SLO, FAST)
    [(_, proposal)] = feed(tuner, range(0, 101), config())
    other = config(1, 4, 32, "tuner", "tuner: ... -> A 8->4")  # another tuner got there first
    retried = tuner.retry(proposal, other)
    assert retried is not None and retried.expected_epoch == 1 and retried.target == Intervals(2, 32)
    assert retried.reason.endswith("A 4->2")  # decided against what is in force now: nothing lost
    operator = config(2, 16, 64, "operator")
    assert tuner.retry(retried, operator) is None and tuner.pending is None


def test_the_window_counts_each_tail_in_rounds_and_halves():
    window = Window(60.0)
    conf = config()
    for r in range(100):
        # Every 10th round has 10 of its 100 tokens past the 0.2 s budget; 3 first tokens past 2 s, late.
        rec = record(r, conf, itl=0.3 if r % 10 == 0 else 0.1)
        if r in (80, 90, 95):
            rec.ttft_seconds[:] = [2.5]
        window.add(facts_of(rec), len(rec.ranks))
    est = window.estimates(ttft_budget_s=2.0, itl_budget_s=0.2)
    itl = est.itl_tail
    assert itl is not None and (itl.events, itl.early, itl.late) == (10, 5, 5)
    assert itl.share == 0.01 and itl.allowed == 10.0  # 1% of the tokens: exactly what a p99 allows
    assert not itl.breached(2.0)
    ttft = est.ttft_tail
    assert ttft is not None and (ttft.events, ttft.early, ttft.late, ttft.allowed) == (3, 0, 3, 1.0)
    assert not ttft.breached(0.0)  # all in the second half: one burst, not a trend
    assert est.extend_token_share == 0.0 and est.wanting_share == 0.0
    assert window.estimates().itl_tail is None  # no budget asked: the p99 alone decides
