"""The per-rank scheduler, one test per rule: probe (P1-P5), plan under the gate (S1-S8), local policy (L1)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.drivers.lockstep import LockstepDriver
from engine.executor.base import DispatchMode, ForwardResult
from engine.gate import GatePoint
from engine.policies.local_interval import LocalIntervalPolicy
from engine.policy import LocalView
from engine.request import Admitted, Finished, RequestError, Retracted
from engine.rows import Row
from engine.scheduler.plan import BatchKind, CacheOpKind, Plan, PlanBuild, PlanOptions
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.states import ReqState
from tests.helpers import req, sim_args

OPEN, CLOSED = PlanOptions(allow_prefill=True), PlanOptions(allow_prefill=False)


class Rank:
    """One scheduler driven by hand, round by round, the way RankEngine drives it."""

    def __init__(self, **overrides: Any) -> None:
        values = {"dp_size": 1, "page_size": 4, "kv_pages": 20, "chunked_prefill_size": 32, "max_num_seqs": 8}
        values.update(overrides)
        self.s = Scheduler(sim_args(**values))
        self.round = 0
        self.acks: list = []
        self.events: list = []

    def plan(self, options: PlanOptions = OPEN) -> Plan:
        self.s.start_round(self.round, float(self.round))
        if self.acks:
            self.s.acknowledge(self.acks)
            self.acks = []
        self.s.storage_tick()
        return self.s.plan(options)

    def commit(self, plan: Plan) -> None:
        mode = DispatchMode.NORMAL if plan.extend_rows else DispatchMode.LOW_LATENCY
        self.s.commit(plan, ForwardResult(0.0, mode, None, plan.cache_ops), float(self.round) + 0.5)
        self.acks = list(plan.cache_ops)
        self.events += self.s.take_events()
        self.round += 1

    def step(self, options: PlanOptions = OPEN) -> Plan:
        plan = self.plan(options)
        self.commit(plan)
        return plan

    def decode_until_occupancy(self, rid: str, prompt_len: int, output_len: int | None = None) -> None:
        """Admit one request and run it into its decode phase (by default it may fill the whole pool)."""
        room = self.s.pool.usable * self.s.page_size - prompt_len
        self.s.submit(req(rid, prompt_len=prompt_len, output_len=output_len or room))
        while self.s.state_of(rid) is not ReqState.DECODING:
            self.step()


# -- the probe --------------------------------------------------------------------------------------


def pressured() -> Rank:
    """A rank decoding one request that holds 19 of its 20 pages (occupancy 0.95)."""
    rank = Rank()
    rank.decode_until_occupancy("big", prompt_len=72)  # 18 pages = 0.9, not above
    rank.step(CLOSED)  # its first decode writes position 72: a 19th page
    assert rank.s.pool.occupancy == pytest.approx(0.95)
    return rank


def test_p1_wants_prefill():  # rule P1
    rank = Rank()
    assert not rank.s.probe_prefill_gate().wants_prefill
    rank.s.submit(req("new", prompt_len=8))
    assert rank.s.probe_prefill_gate().wants_prefill  # a new prompt under the watermark
    rank = pressured()
    rank.s.submit(req("late", prompt_len=4, output_len=1))
    assert not rank.s.probe_prefill_gate().wants_prefill  # new work above the watermark: no vote


def test_p1_s7_exactly_at_the_watermark_is_under_it():  # rules P1, S7: occupancy <= 0.9
    rank = Rank()
    rank.decode_until_occupancy("big", prompt_len=72, output_len=3)  # 18 of 20 pages: exactly 0.9
    assert rank.s.pool.occupancy == 0.9
    rank.s.submit(req("late", prompt_len=4, output_len=1))
    assert rank.s.probe_prefill_gate().wants_prefill  # at the watermark a new prompt still votes
    plan = rank.plan(OPEN)  # and is admitted (its one page takes the pool above the watermark after)
    assert [row.rid for row in plan.extend_rows] == ["late"] and plan.build is PlanBuild.OK


def test_p1_resident_chunk_wants_regardless_of_pressure():  # rule P1
    rank = Rank(kv_pages=40, chunked_prefill_size=8)
    rank.decode_until_occupancy("big", prompt_len=136, output_len=20)  # 34 of 40 pages
    rank.s.submit(req("chunked", prompt_len=40, output_len=2))
    rank.step(OPEN)  # first chunk of 8 admitted at 0.85: 36 pages
    rank.step(CLOSED)  # chunk held, "big" decodes into a 37th page
    assert rank.s.state_of("chunked") is ReqState.PREFILLING
    assert rank.s.pool.occupancy > 0.9
    assert rank.s.probe_prefill_gate().wants_prefill


def test_p1_storage_read_counts_as_new_work():  # rule P1
    rank = Rank(storage_read_ticks=3)
    rank.s.submit(req("cached", prompt_len=40, prefix_hit=24))
    assert rank.s.state_of("cached") is ReqState.STORAGE_READ
    assert rank.s.probe_prefill_gate().wants_prefill
    assert rank.s.counts().storage_reads == 1 and rank.s.pool.used == 0  # no chunk, no reservation


def test_p2_has_decode_work():  # rule P2
    rank = Rank()
    rank.s.submit(req("a", prompt_len=8, output_len=5))
    plan = rank.plan()
    assert plan.num_extends == 1
    assert rank.s.probe_prefill_gate().has_decode_work  # prefill just finished: first decode next round
    rank.commit(plan)
    assert rank.s.state_of("a") is ReqState.DECODING and rank.s.probe_prefill_gate().has_decode_work
    only_prefill = Rank(chunked_prefill_size=8)
    only_prefill.s.submit(req("p", prompt_len=40))
    only_prefill.step()
    assert only_prefill.s.state_of("p") is ReqState.PREFILLING
    assert not only_prefill.s.probe_prefill_gate().has_decode_work  # prefilling does not count
    one_token = Rank()
    one_token.s.submit(req("one", prompt_len=8, output_len=1))
    one_token.plan()
    assert not one_token.s.probe_prefill_gate().has_decode_work  # nothing left to decode


def test_p2_a_request_being_restored_to_decoding_is_decode_work():  # rule P2 (the "P6")
    # "b" is retracted while "a" decodes; when "a" finishes, "b" is restored and is the only request
    # left: nothing decodes this round, but "b" decodes in the next one, so the rank has decode work.
    rank = Rank(kv_pages=24)
    rank.s.submit(req("a", prompt_len=40, output_len=30))
    rank.s.submit(req("b", prompt_len=40, output_len=50))
    while rank.s.counts().waiting_prompts or rank.s.counts().resident_chunks:
        rank.step(OPEN)
    while rank.s.state_of("b") is not ReqState.RESTORING:
        assert rank.round < 100
        plan = rank.plan(CLOSED)
        if rank.s.state_of("b") is not ReqState.RESTORING:
            rank.commit(plan)
    assert rank.s.state_of("a") is None and plan.num_decodes == 0  # nothing else runs on the rank
    assert [op.kind for op in plan.cache_ops] == [CacheOpKind.RESTORE]
    assert rank.s.probe_prefill_gate().has_decode_work
    rank.commit(plan)
    assert rank.s.state_of("b") is ReqState.RESTORING and rank.s.probe_prefill_gate().has_decode_work
    assert rank.plan(CLOSED).num_decodes == 1  # it decodes in the next round, as the probe said


def test_p3_probe_reads_the_state_after_the_plan():  # rule P3
    rank = Rank()
    rank.s.submit(req("a", prompt_len=8, output_len=5))
    before = rank.s.probe_prefill_gate()
    rank.plan()
    after = rank.s.probe_prefill_gate()
    assert before.wants_prefill and not before.has_decode_work
    assert not after.wants_prefill and after.has_decode_work  # it describes the next round's work


def test_p4_pressured_rank_with_only_new_prompts_votes_no_even_in_a_window():  # rule P4
    rank = pressured()
    rank.s.submit(req("late", prompt_len=4, output_len=1))
    probe = rank.s.probe_prefill_gate()
    assert (probe.wants_prefill, probe.has_decode_work) == (False, True)  # blocks the group's ALL point
    plan = rank.step(OPEN)  # even when the group's window is open
    assert plan.num_extends == 0 and plan.build is PlanBuild.WATERMARK


def test_p2_p3_a_request_on_its_last_decode_is_no_work_for_the_next_round():  # rules P2, P3
    rank = Rank()
    rank.s.submit(req("a", prompt_len=8, output_len=2))
    rank.step()  # prefill and first token
    plan = rank.plan()  # its second and last token
    assert plan.num_decodes == 1
    assert not rank.s.probe_prefill_gate().has_decode_work  # it would not block the next ALL point
    rank.commit(plan)
    assert rank.s.live == 0


def test_p5_rank_without_decode_work_never_blocks_all():  # rule P5
    # Rank 0 decodes with a prompt waiting; rank 1 is idle: want=false, decodes=false. A strict
    # all(want) would hold the prompt until the ANY point; P5 lets the next ALL point open.
    driver = LockstepDriver(sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=50))
    driver.submit(0, req("long", output_len=60))
    for _ in range(3):
        driver.step()
    driver.submit(0, req("waiting"))
    opened = []
    for _ in range(6):
        outcome = driver.step()[0]
        assert (outcome.rows[1].want_prefill, outcome.rows[1].has_decode_work) == (False, False)
        if outcome.decision.point is GatePoint.ALL and outcome.decision.allow_prefill:
            opened.append(outcome.round)
    assert opened and opened[0] < 50  # an ALL point opened well before the ANY point


# -- the plan under the gate ------------------------------------------------------------------------


def test_s1_closed_gate_holds_resident_chunks_and_new_prompts():  # rule S1
    rank = Rank(chunked_prefill_size=8)
    rank.s.submit(req("chunked", prompt_len=40))
    rank.step(OPEN)
    rank.s.submit(req("new", prompt_len=8))
    plan = rank.step(CLOSED)
    assert plan.num_extends == 0 and plan.build is PlanBuild.GATED
    assert rank.s.state_of("chunked") is ReqState.PREFILLING and rank.s.state_of("new") is ReqState.NEW


def test_s1_chunk_continuation_can_be_allowed_separately():  # rule S1 (the seam peer policies use)
    rank = Rank(chunked_prefill_size=8)
    rank.s.submit(req("chunked", prompt_len=40))
    rank.step(OPEN)
    plan = rank.step(PlanOptions(allow_prefill=False, allow_chunk_continuation=True))
    assert plan.num_extends == 1 and plan.extend_rows[0].rid == "chunked"


def test_s2_closed_round_still_restores_decodes_aborts_and_ticks():  # rule S2
    rank = Rank(kv_pages=24, max_readmissions_per_round=2, storage_read_ticks=2)
    rank.decode_until_occupancy("a", prompt_len=40, output_len=40)
    rank.decode_until_occupancy("b", prompt_len=40, output_len=40)
    while not any(isinstance(e, Retracted) for e in rank.events):  # decode growth forces a retraction
        rank.step(CLOSED)
    retracted = next(e.rid for e in rank.events if isinstance(e, Retracted))
    rank.s.submit(req("cached", prompt_len=20, prefix_hit=8))
    rank.s.submit(req("doomed", prompt_len=8))
    rank.s.abort("doomed")
    rank.s.pause_for_weight_update()
    paused = rank.step(CLOSED)
    assert paused.kind is BatchKind.PAUSED and paused.num_tokens == 0  # a weight update: one quiet round
    restored = False
    for _ in range(200):
        plan = rank.step(CLOSED)
        assert plan.num_extends == 0 and plan.prefill_tokens == 0
        restored |= any(op.kind is CacheOpKind.RESTORE and op.rid == retracted for op in plan.cache_ops)
        if rank.s.live == 1:
            break
    assert restored  # readmission ran on closed rounds, and took no prefill tokens
    assert rank.s.state_of("cached") is ReqState.NEW  # its storage read completed without the gate
    finished = {e.rid: e.reason.value for e in rank.events if isinstance(e, Finished)}
    assert finished == {"doomed": "abort", "a": "length", "b": "length"}


def test_s3_a_full_decode_batch_leaves_the_pending_chunk_its_reserve():  # rule S3
    # The smallest budget startup accepts in mixed mode: the per-rank batch (8) plus one page (4).
    rank = Rank(enable_mixed_prefill_decode=True, chunked_prefill_size=12, max_num_seqs=8, kv_pages=200)
    for i in range(7):
        rank.s.submit(req(f"d{i}", prompt_len=4, output_len=60))
    while rank.s.counts().waiting_prompts:
        rank.step(OPEN)
    rank.s.submit(req("p", prompt_len=40))
    rank.step(OPEN)  # its first chunk: the batch is now full, 7 decoding and 1 resident chunk
    assert rank.s.running == 8 and rank.s.state_of("p") is ReqState.PREFILLING
    closed = rank.step(CLOSED)
    assert closed.num_decodes == 7 and closed.prefill_tokens == 0  # not allowed: no reserve, decodes run
    opened = rank.step(OPEN)
    assert opened.kind is BatchKind.MIXED and opened.num_decodes == 7
    assert opened.prefill_tokens == 12 - 7 >= 4  # decode rows share the budget and leave at least one page


def test_s4_ineligible_prefill_neither_triggers_retraction_nor_gets_a_grant():  # rule S4
    def state() -> Rank:
        rank = Rank(kv_pages=10, storage_read_ticks=0)
        rank.decode_until_occupancy("d", prompt_len=32)  # 8 pages
        rank.step(CLOSED)  # first decode: a 9th page, occupancy 0.9 (not above)
        rank.s.submit(req("pfx", prompt_len=16, prefix_hit=8, output_len=2))  # needs 3 pages, 1 is free
        return rank

    rank = state()
    plan = rank.step(CLOSED)  # not allowed: it triggers nothing
    assert rank.s.retractions_total == 0 and plan.build is PlanBuild.GATED
    rank = state()
    plan = rank.step(OPEN)  # eligible: the decoding request is retracted and its pages granted
    assert rank.s.retractions_total == 1
    assert [r.rid for r in plan.extend_rows] == ["pfx"]
    assert [(op.kind, op.rid) for op in plan.cache_ops] == [
        (CacheOpKind.OFFLOAD, "d"),
        (CacheOpKind.LOAD_PREFIX, "pfx"),
    ]
    pressured_rank = pressured()  # above the watermark a new prompt is ineligible: no retraction either
    pressured_rank.s.submit(req("late", prompt_len=4, output_len=1))
    pressured_rank.step(OPEN)
    assert pressured_rank.s.retractions_total == 0


def blocker_state(with_older_chunk: bool) -> Rank:
    """The head-of-line chunk "b" is the newest running request and the pool is full. With
    `with_older_chunk`, an older resident chunk "a" (retracted once, then restored) sits behind it."""
    rank = Rank(kv_pages=20, chunked_prefill_size=8, max_num_seqs=8)
    if with_older_chunk:
        rank.s.submit(req("a", prompt_len=40, output_len=2))
        plan = rank.step(OPEN)
        rank.s._retract(rank.s._live["a"], plan)  # hand-built: "a" was retracted after its first chunk
        rank.acks = list(plan.cache_ops)
    rank.s.submit(req("b", prompt_len=64, output_len=2))
    rank.step(OPEN)  # "b" admitted (and "a" restored by readmission, behind it)
    rank.step(CLOSED)
    assert [r.rid for r in rank.s._resident] == (["b", "a"] if with_older_chunk else ["b"])
    rank.s.submit(req("n", prompt_len=4, output_len=1))
    rank.s.pool.allocate(rank.s.pool.free)  # hand-built pressure: no page left
    return rank


def test_s4_blocker_redirect_rechecks_every_alternative():  # rule S4
    rank = blocker_state(with_older_chunk=False)
    # "b" would have to retract itself (it is the blocker); the only alternative, the new prompt "n", is
    # above the watermark, so it is ineligible: nothing is retracted and the chunk waits.
    plan = rank.step(OPEN)
    assert plan.build is PlanBuild.NO_MEMORY and rank.s.retractions_total == 0
    plan = rank.step(PlanOptions(allow_prefill=False, allow_chunk_continuation=True))
    assert plan.build is PlanBuild.NO_MEMORY and rank.s.retractions_total == 0


def test_s4_blocker_redirect_grants_the_first_eligible_alternative():  # rule S4
    rank = blocker_state(with_older_chunk=True)
    retracted_before = rank.s.retractions_total
    plan = rank.step(PlanOptions(allow_prefill=False, allow_chunk_continuation=True))
    assert rank.s.retractions_total == retracted_before + 1
    assert [op.rid for op in plan.cache_ops if op.kind is CacheOpKind.OFFLOAD] == ["b"]  # the blocker goes
    assert [r.rid for r in plan.extend_rows] == ["a"]  # the older chunk receives the grant


def test_s5_full_batch_defers_new_prompts_silently():  # rule S5
    rank = Rank(max_num_seqs=2, kv_pages=64)
    rank.decode_until_occupancy("a", prompt_len=8)
    rank.decode_until_occupancy("b", prompt_len=8)
    rank.s.submit(req("c", prompt_len=8))
    plan = rank.step(OPEN)
    assert plan.build is PlanBuild.FULL and plan.num_extends == 0 and plan.num_decodes == 2
    assert rank.s.probe_prefill_gate().wants_prefill  # the probe still says so; the plan stays silent


def test_s6_open_gate_with_nothing_schedulable_plans_as_closed():  # rule S6
    def plan_with(options):
        rank = Rank()
        rank.decode_until_occupancy("a", prompt_len=8)
        plan = rank.plan(options)
        return (
            plan.kind,
            plan.build,
            plan.num_tokens,
            plan.batch_size,
            plan.num_extends,
            plan.counts,
            [(r.rid, r.start, r.num_tokens) for r in plan.rows],
        )

    assert plan_with(OPEN) == plan_with(CLOSED)


def test_s7_new_prompts_wait_above_the_watermark_even_beside_a_resident_chunk():  # rule S7
    rank = Rank(kv_pages=40, chunked_prefill_size=12)
    rank.decode_until_occupancy("big", prompt_len=136, output_len=20)  # 34 pages
    rank.s.submit(req("chunked", prompt_len=16, output_len=2))
    rank.s.submit(req("new", prompt_len=4, output_len=1))
    rank.step(OPEN)  # first chunk of 12: 37 pages; "new" waits behind the incomplete chunk (S8)
    assert rank.s.pool.occupancy > 0.9 and rank.s.probe_prefill_gate().wants_prefill  # the chunk's vote
    plan = rank.step(OPEN)  # the chunk completes (38 pages) with budget left; "new" is checked at plan time
    assert [r.rid for r in plan.extend_rows] == ["chunked"]
    assert plan.build is PlanBuild.WATERMARK and rank.s.state_of("new") is ReqState.NEW


def test_s8_chunk_budget_and_head_of_line():  # rule S8
    rank = Rank(chunked_prefill_size=8, kv_pages=64)
    rank.s.submit(req("long", prompt_len=20))
    rank.s.submit(req("short", prompt_len=2))
    chunks = []
    while rank.s.state_of("long") in (ReqState.NEW, ReqState.PREFILLING):
        plan = rank.step()
        assert plan.prefill_tokens <= 8
        chunks.append([(r.rid, r.num_tokens) for r in plan.extend_rows])
    # "short" waits behind the incomplete chunk, then rides in the round the chunk completes.
    assert chunks == [[("long", 8)], [("long", 8)], [("long", 4), ("short", 2)]]


def test_l1_local_interval():  # rule L1
    policy = LocalIntervalPolicy(3)
    idle = LocalView(wants_prefill=True, has_decode_work=False, oldest_wait_rounds=0)
    busy = LocalView(wants_prefill=True, has_decode_work=True, oldest_wait_rounds=0)
    assert policy.decide(busy).allow_prefill  # never prefilled yet
    policy.observe([Row(num_extends=1, batch_size=1)])
    assert not policy.decide(busy).allow_prefill  # 0 rounds since its own prefill
    assert policy.decide(idle).allow_prefill  # no decode work: prefill freely
    policy.observe([Row(batch_size=1)])
    policy.observe([Row(batch_size=1)])
    assert not policy.decide(busy).allow_prefill
    assert policy.decide(LocalView(wants_prefill=True, has_decode_work=True, oldest_wait_rounds=3)).allow_prefill
    policy.observe([Row(batch_size=1)])
    assert policy.decide(busy).allow_prefill  # N rounds have passed


def test_l1_runs_in_the_engine_per_rank():  # rule L1
    driver = LockstepDriver(sim_args(dp_size=2, prefill_decode_interval=4))
    driver.submit(0, req("a", output_len=50))
    driver.step()  # round 0: "a" prefills; the rank now has decode work
    driver.submit(0, req("b"))
    extend_rounds = []
    for _ in range(8):
        outcome = driver.step()[0]
        if outcome.rows[0].num_extends:
            extend_rounds.append(outcome.round)
    # The vote of round r reads the rounds counted up to r-1: 4 rounds since round 0 is round 5.
    assert extend_rounds == [5]


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (req("e", prompt_len=0), "prompt must not be empty"),
        (req("z", output_len=0), "output_len: must be >= 1"),
        (req("n", output_len=-3), "output_len: must be >= 1"),
        (req("huge", prompt_len=10_000), "more than the 20"),
        (req("pfx", prompt_len=8, prefix_hit=8), "prefix_hit"),
    ],
)
def test_bad_requests_are_refused_and_change_nothing(spec, message):
    rank = Rank()
    rank.s.submit(req("ok"))
    before = (rank.s.live, rank.s.counts(), rank.s.probe_prefill_gate())
    with pytest.raises(RequestError, match=message):
        rank.s.submit(spec)
    assert (rank.s.live, rank.s.counts(), rank.s.probe_prefill_gate()) == before


def test_duplicate_id_and_unknown_abort():
    rank = Rank()
    rank.s.submit(req("x"))
    with pytest.raises(RequestError, match="duplicate"):
        rank.s.submit(req("x"))
    assert rank.s.abort("nope") is False
    assert [type(e).__name__ for e in rank.s.take_events()] == ["AbortIgnored"]


def test_admission_reports_gate_wait():
    rank = Rank()
    rank.s.submit(req("w"))
    rank.step(CLOSED)
    rank.step(CLOSED)
    rank.step(OPEN)
    admitted = [e for e in rank.events if isinstance(e, Admitted)]
    assert [(e.rid, e.wait_rounds) for e in admitted] == [("w", 2)]
