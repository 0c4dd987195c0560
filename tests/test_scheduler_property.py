"""The scheduler never loses a request and never leaks a page, whatever arrives and whatever the gate says."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.request import Finished, Refused, RequestError
from engine.scheduler.plan import PlanOptions
from engine.scheduler.states import ReqState
from tests.helpers import req
from tests.test_scheduler_rules import Rank

ACTIONS = st.lists(
    st.tuples(
        st.integers(0, 3),  # arrivals this round
        st.booleans(),  # allow_prefill
        st.booleans(),  # allow chunk continuation separately
        st.integers(0, 9),  # abort one live request when 0
        st.integers(0, 40),  # weight update when 0
    ),
    min_size=20,
    max_size=120,
)


def check_accounting(rank: Rank) -> None:
    s = rank.s
    held = sum(len(r.pages) for r in s._live.values())
    assert held == s.pool.used  # every used page belongs to exactly one live request
    assert 0.0 <= s.pool.occupancy <= 1.0
    assert s.running <= s.max_batch_size
    for r in s._live.values():
        assert r.state not in (ReqState.FINISHED, ReqState.ABORTED)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    actions=ACTIONS,
    lengths=st.lists(
        st.tuples(st.integers(-1, 90), st.integers(-1, 40), st.integers(0, 30)), min_size=400, max_size=400
    ),
    mixed=st.booleans(),
    kv_pages=st.integers(12, 40),
)
def test_random_traffic_drains_completely(actions, lengths, mixed, kv_pages):
    rank = Rank(
        kv_pages=kv_pages,
        chunked_prefill_size=24,
        max_num_seqs=6,
        storage_read_ticks=2,
        enable_mixed_prefill_decode=mixed,
        max_readmissions_per_round=2,
    )
    submitted, refused, wanted = set(), set(), {}
    n = 0
    for arrivals, allow, chunks, abort, pause in actions:
        for _ in range(arrivals):
            prompt, output, prefix = lengths[n % len(lengths)]
            rid = f"r{n}"
            n += 1
            spec = req(rid, prompt_len=prompt, output_len=output, prefix_hit=min(prefix, max(prompt - 1, 0)))
            try:
                rank.s.submit(spec)
                submitted.add(rid)
                wanted[rid] = output
            except RequestError:
                refused.add(rid)
        if abort == 0 and rank.s._live:
            rank.s.abort(sorted(rank.s._live)[0])
        if pause == 0:
            rank.s.pause_for_weight_update()
        rank.step(PlanOptions(allow_prefill=allow, allow_chunk_continuation=chunks or None))
        check_accounting(rank)
    idle = 0
    while rank.s.live and idle < 300:  # drain with the gate open, until nothing moves for 300 rounds
        before = (rank.s.live, rank.s.pool.used, rank.s._decode.step, rank.s._pending_tokens)
        rank.step(PlanOptions(allow_prefill=True))
        check_accounting(rank)
        idle = idle + 1 if (rank.s.live, rank.s.pool.used, rank.s._decode.step, rank.s._pending_tokens) == before else 0
    stuck = [
        (r.rid, r.state.value, len(r.pages), r.computed, r.prompt_len, r.prefix, r.output_len)
        for r in rank.s._live.values()
    ]
    assert rank.s.live == 0, (stuck, rank.s.pool.free, rank.s.running)
    assert rank.s.pool.used == 0
    ended = [e for e in rank.events if isinstance(e, Finished)]
    assert {e.rid for e in ended} == submitted  # finished or aborted, each exactly once
    assert len(ended) == len(submitted)
    assert not refused & submitted
    for e in ended:  # a request that ran to its length produced exactly output_len tokens
        assert e.output_len == wanted[e.rid] if e.reason.value == "length" else e.output_len <= wanted[e.rid]
    assert not [e for e in rank.events if isinstance(e, Refused)]  # refusals raise at submit instead


def test_thousands_of_requests_under_pressure_exercise_retraction():
    import random

    rng = random.Random(7)
    rank = Rank(
        kv_pages=48, chunked_prefill_size=32, max_num_seqs=12, storage_read_ticks=3, max_readmissions_per_round=1
    )
    submitted = set()
    for i in range(600):
        spec = req(
            f"q{i}", prompt_len=rng.randint(1, 60), output_len=rng.randint(1, 120), prefix_hit=rng.choice([0, 0, 8])
        )
        if spec.prefix_hit >= spec.prompt_len:
            spec = req(spec.rid, prompt_len=spec.prompt_len, output_len=spec.output_len)
        rank.s.submit(spec)
        submitted.add(spec.rid)
        if rng.random() < 0.05:
            rank.s.abort(f"q{rng.randrange(i + 1)}")
        rank.step(PlanOptions(allow_prefill=rng.random() < 0.3))
        check_accounting(rank)
    for _ in range(50_000):
        if not rank.s.live:
            break
        rank.step(PlanOptions(allow_prefill=True))
        check_accounting(rank)
    assert rank.s.live == 0 and rank.s.pool.used == 0
    assert {e.rid for e in rank.events if isinstance(e, Finished)} == submitted
    assert rank.s.retractions_total > 0  # decode growth and capacity retraction both ran
