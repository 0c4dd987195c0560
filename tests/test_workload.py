"""Workloads: arrival processes, length distributions, routing, storage hits, seeds, trace errors."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from workloads import (
    Bursts,
    ClosedLoop,
    Fixed,
    LogNormal,
    Normal,
    OnOff,
    OutputRatio,
    Poisson,
    RoundRobin,
    ShortestQueue,
    Skewed,
    Trace,
    Uniform,
    Workload,
    load_trace,
)


def drain(workload: Workload, until: float, step: float = 0.05) -> list:
    """Every (rank, spec) due up to `until`, polling like a driver every `step` seconds."""
    out, now = [], 0.0
    while now <= until:
        out += workload.due(now)
        now += step
    return out


# -- arrival processes -------------------------------------------------------------------------------------


def test_poisson_rate_matches_over_a_long_horizon():  # Poisson arrivals: count ~ rate * T
    workload = Workload(Poisson(20.0), dp_size=4, seed=1)
    arrivals = drain(workload, 500.0, step=1.0)
    assert len(arrivals) == pytest.approx(20.0 * 500, rel=0.03)
    gaps = [b.arrival - a.arrival for (_, a), (_, b) in pairwise(arrivals)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 20.0, rel=0.05)


def test_due_returns_only_what_arrived_by_now_in_arrival_order():
    workload = Workload(Poisson(5.0), dp_size=2, seed=3)
    first = workload.due(1.0)
    assert all(spec.arrival <= 1.0 for _, spec in first)
    assert [spec.arrival for _, spec in first] == sorted(spec.arrival for _, spec in first)
    assert workload.next_arrival > 1.0
    assert workload.due(1.0) == []


def test_on_off_bursts_arrive_only_while_on():  # on/off bursts
    spec = OnOff(rate=200.0, on_s=0.5, off_s=4.5)
    arrivals = drain(Workload(spec, dp_size=8, seed=2), 200.0, step=0.01)
    assert all(spec.arrival % 5.0 < 0.5 + 1e-9 for _, spec in arrivals)
    per_burst = Counter(int(spec.arrival // 5.0) for _, spec in arrivals)
    assert sum(per_burst.values()) / 40 == pytest.approx(200.0 * 0.5, rel=0.05)


def test_bursts_are_simultaneous():
    arrivals = drain(Workload(Bursts(size=6, period_s=2.0, first_s=1.0), dp_size=3, seed=0), 6.0)
    assert [spec.arrival for _, spec in arrivals] == [1.0] * 6 + [3.0] * 6 + [5.0] * 6
    assert Counter(rank for rank, _ in arrivals) == {0: 6, 1: 6, 2: 6}


def test_closed_loop_never_exceeds_its_concurrency_and_replaces_finished_requests():  # closed loop bound
    workload = Workload(ClosedLoop(12, think_s=0.5), dp_size=4, seed=5)
    rng = random.Random(0)
    flight: set[str] = set()
    now, issued_after = 0.0, []
    while now < 60.0:
        for _, spec in workload.due(now):
            flight.add(spec.rid)
            issued_after.append(spec.arrival)
        assert len(flight) <= 12 and workload.in_flight == len(flight)
        for rid in sorted(flight):
            if rng.random() < 0.2:
                flight.discard(rid)
                workload.on_finished(rid, now)
        now += 0.1
    assert workload.issued > 100
    assert not workload.done  # a closed loop never runs dry by itself


def test_closed_loop_think_time_delays_the_next_request():
    workload = Workload(ClosedLoop(1, think_s=2.0), dp_size=1, seed=0)
    ((_, first),) = workload.due(0.0)
    workload.on_finished(first.rid, 1.0)
    assert workload.due(2.9) == []
    ((_, second),) = workload.due(3.0)
    assert second.arrival == 3.0


def test_closed_loop_sticky_clients_keep_their_rank():
    workload = Workload(ClosedLoop(4), dp_size=4, seed=0)
    first = dict((spec.rid, rank) for rank, spec in workload.due(0.0))
    assert sorted(first.values()) == [0, 1, 2, 3]
    workload.on_finished("r2", 1.0)
    ((rank, spec),) = workload.due(1.0)
    assert rank == first["r2"] and spec.rid == "r4"


def test_closed_loop_ramp_and_first_prompt_lengths():
    loop = ClosedLoop(4, ramp_s=8.0, first_prompt_lens={1: 77})
    workload = Workload(loop, dp_size=2, prompt=Fixed(500), seed=0)
    arrivals = drain(workload, 10.0, step=0.5)
    assert [spec.arrival for _, spec in arrivals] == [0.0, 2.0, 4.0, 6.0]
    assert [spec.prompt_len for _, spec in arrivals] == [500, 77, 500, 500]
    workload.on_finished("r1", 10.0)
    ((_, again),) = workload.due(10.0)
    assert again.prompt_len == 500  # only the client's first prompt is changed


def test_limit_and_until_end_a_workload():
    limited = Workload(Poisson(100.0), dp_size=2, seed=0, limit=25)
    assert len(drain(limited, 10.0)) == 25 and limited.done and math.isinf(limited.next_arrival)
    timed = Workload(Poisson(100.0), dp_size=2, seed=0, until=1.0)
    arrivals = drain(timed, 5.0)
    assert arrivals and max(spec.arrival for _, spec in arrivals) <= 1.0 and timed.done
    loop = Workload(ClosedLoop(2), dp_size=2, seed=0, until=5.0)
    loop.due(0.0)
    assert not loop.done  # a finishing client may still issue before `until`
    loop.due(6.0)
    assert loop.done


# -- trace replay ------------------------------------------------------------------------------------------


def write(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_trace_replays_times_lengths_ranks_and_hits(tmp_path: Path):  # trace replay
    path = write(
        tmp_path,
        [
            json.dumps({"t": 0.5, "prompt_len": 100, "output_len": 10, "rank": 2}),
            "",
            json.dumps({"t": 0.1, "prompt_len": 300, "output_len": 5, "prefix_hit": 128, "note": "ignored"}),
            json.dumps({"t": 0.5, "prompt_len": 50, "output_len": 1}),
        ],
    )
    workload = Workload(Trace(path), dp_size=4, seed=0)
    assert workload.bounded
    got = drain(workload, 1.0)
    assert [(s.arrival, s.prompt_len, s.output_len, s.prefix_hit) for _, s in got] == [
        (0.1, 300, 5, 128),
        (0.5, 100, 10, 0),
        (0.5, 50, 1, 0),
    ]
    assert got[1][0] == 2  # the trace's rank wins over the router
    assert workload.done


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt_len": 5, "output_len": 5}', "missing key 't'"),
        ('{"t": -1, "prompt_len": 5, "output_len": 5}', "'t' must be a finite number"),
        ('{"t": 1, "output_len": 5}', "missing key 'prompt_len'"),
        ('{"t": 1, "prompt_len": 5, "output_len": 0}', "'output_len' must be an integer >= 1"),
        ('{"t": 1, "prompt_len": 5, "output_len": 2.5}', "'output_len' must be an integer >= 1"),
        ('{"t": 1, "prompt_len": 5, "output_len": 5, "rank": -1}', "'rank' must be an integer >= 0"),
        ('{"t": 1, "prompt_len": 5, "output_len": 5, "prefix_hit": 5}', "'prefix_hit' \\(5\\) must be <"),
    ],
)
def test_malformed_trace_line_names_the_file_and_line(tmp_path: Path, line: str, message: str):  # trace errors
    good = json.dumps({"t": 0, "prompt_len": 8, "output_len": 8})
    path = write(tmp_path, [good, "", line])
    with pytest.raises(ValueError, match=message) as info:
        Workload(Trace(path), dp_size=2)
    assert str(info.value).startswith(f"{path}:3: ")


def test_trace_rank_outside_the_group_is_refused(tmp_path: Path):
    path = write(tmp_path, [json.dumps({"t": 0, "prompt_len": 8, "output_len": 8, "rank": 5})])
    with pytest.raises(ValueError, match="names rank 5 of 2"):
        Workload(Trace(path), dp_size=2).due(0.0)


# -- lengths -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dist", "low", "high"),
    [
        (Fixed(7), 7, 7),
        (Uniform(10, 20), 10, 20),
        (Normal(100, 80, low=50, high=150), 50, 150),
        (LogNormal(1000, 1.5, low=200, high=3000), 200, 3000),
        (OutputRatio(1000, 0.8), 800, 1000),
    ],
)
def test_length_distributions_stay_in_range(dist, low: int, high: int):  # lengths, clipping
    rng = random.Random(4)
    draws = [dist.sample(rng) for _ in range(3000)]
    assert min(draws) >= low and max(draws) <= high
    assert all(isinstance(d, int) for d in draws)


@pytest.mark.parametrize("dist", [Normal(100, 80, low=50, high=150), LogNormal(1000, 1.5, low=200, high=3000)])
def test_clipped_distributions_pile_up_at_both_bounds(dist):  # lognormal/normal clipped
    rng = random.Random(4)
    draws = Counter(dist.sample(rng) for _ in range(3000))
    assert draws[dist.low] > 100 and draws[dist.high] > 100


def test_output_ratio_is_uniform_between_ratio_and_full_length():  # sglang#23189
    rng = random.Random(1)
    draws = [OutputRatio(1000, 0.8).sample(rng) for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(900, rel=0.01)
    assert min(draws) == 800 and max(draws) == 1000


@pytest.mark.parametrize(
    "make",
    [
        lambda: Fixed(0),
        lambda: Uniform(5, 4),
        lambda: Normal(10, -1),
        lambda: LogNormal(0, 1),
        lambda: OutputRatio(100, 0),
        lambda: Poisson(0),
        lambda: OnOff(1, 0, 1),
        lambda: ClosedLoop(0),
        lambda: Skewed(weight=0),
        lambda: Workload(Poisson(1), dp_size=0),
        lambda: Workload(Poisson(1), dp_size=2, prefix_hit_prob=2),
    ],
)
def test_invalid_parameters_are_value_errors(make):
    with pytest.raises(ValueError):
        make()


# -- routing -----------------------------------------------------------------------------------------------


def test_round_robin_gives_every_rank_the_same_share():  # routing: round-robin
    ranks = [rank for rank, _ in Workload(Bursts(40, 1.0), dp_size=8, seed=0).due(0.0)]
    assert ranks == list(range(8)) * 5


def test_skewed_rank_gets_weight_times_the_traffic_of_each_other_rank():  # routing: weighted skew (P4 scenario)
    workload = Workload(Bursts(110 * 4, 1.0), dp_size=8, router=Skewed(weight=4.0, rank=3), seed=0)
    shares = Counter(rank for rank, _ in workload.due(0.0))
    assert shares[3] == 4 * 40 and all(shares[r] == 40 for r in range(8) if r != 3)


def test_skewed_rank_must_be_in_the_group():
    with pytest.raises(ValueError, match="outside a group of 4"):
        Workload(Poisson(1.0), dp_size=4, router=Skewed(rank=4))


def test_shortest_queue_uses_the_drivers_loads_and_its_own_picks():  # routing: shortest queue
    workload = Workload(Bursts(4, 1.0), dp_size=3, router=ShortestQueue(), seed=0)
    assert workload.needs_loads
    ranks = [rank for rank, _ in workload.due(0.0, loads=[5, 1, 2])]
    assert ranks == [1, 1, 2, 1]  # loads 1,2 -> 2,2 -> 2,3 -> 3,3 (ties: lowest rank)
    with pytest.raises(ValueError, match="3 ranks"):
        workload.due(1.0, loads=[0, 0])


def test_shortest_queue_without_loads_balances_what_is_in_flight():
    workload = Workload(ClosedLoop(6), dp_size=3, router=ShortestQueue(), sticky_sessions=False, seed=0)
    first = Counter(rank for rank, _ in workload.due(0.0))
    assert first == {0: 2, 1: 2, 2: 2}
    workload.on_finished("r4", 1.0)  # r4 went to rank 1
    ((rank, _),) = workload.due(1.0)
    assert rank == 1


# -- storage hits, token ids, seeds ------------------------------------------------------------------------


def test_storage_hit_probability_and_size():  # storage-hit probability (prefix_hit tokens)
    workload = Workload(
        Bursts(4000, 1.0), dp_size=4, prompt=Fixed(1000), prefix_hit_prob=0.25, prefix_hit_fraction=0.6, seed=2
    )
    hits = [spec.prefix_hit for _, spec in workload.due(0.0)]
    assert set(hits) == {0, 600}
    assert hits.count(600) / len(hits) == pytest.approx(0.25, abs=0.03)


def test_prompt_token_ids_come_from_the_seed():  # optional prompt token ids for the torch executor
    def prompts(seed: int) -> list:
        workload = Workload(Bursts(5, 1.0), dp_size=2, prompt=Uniform(5, 40), token_ids=True, vocab=50, seed=seed)
        return [spec.prompt for _, spec in workload.due(0.0)]

    first = prompts(11)
    assert first == prompts(11) and first != prompts(12)
    assert all(max(p) < 50 and min(p) >= 0 for p in first)
    spec = Workload(Bursts(1, 1.0), dp_size=1, prompt=Uniform(5, 40), token_ids=True, seed=3).due(0.0)[0][1]
    assert len(spec.prompt) == spec.prompt_len
    spec.check()


def test_same_seed_same_requests_different_seed_different():  # determinism
    def requests(seed: int) -> list:
        workload = Workload(
            Poisson(10.0),
            dp_size=4,
            prompt=LogNormal(500, 0.7, low=10, high=4000),
            output=OutputRatio(300, 0.5),
            router=Skewed(2.0),
            prefix_hit_prob=0.3,
            seed=seed,
        )
        return drain(workload, 30.0)

    assert requests(1) == requests(1)
    assert requests(1) != requests(2)


def test_streams_are_independent_of_each_other():  # changing the router does not change the lengths
    def lengths(router) -> list:
        workload = Workload(Poisson(10.0), dp_size=4, prompt=Uniform(1, 10_000), router=router, seed=9)
        return [(spec.arrival, spec.prompt_len) for _, spec in drain(workload, 20.0)]

    assert lengths(RoundRobin()) == lengths(Skewed(3.0, rank=2))


def test_trace_accepts_arrivals_already_loaded(tmp_path: Path):  # trace replay from load_trace
    path = write(tmp_path, [json.dumps({"t": 0.2, "prompt_len": 9, "output_len": 3})])
    arrivals = load_trace(path)
    ((_, spec),) = Workload(Trace(arrivals), dp_size=1).due(1.0)
    assert (spec.arrival, spec.prompt_len, spec.output_len) == (0.2, 9, 3)
