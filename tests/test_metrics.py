"""Run metrics on hand-computed inputs: percentiles, extend share, windows, waits, request counts."""

from __future__ import annotations

import pytest

from engine.gate import GatePoint
from engine.metrics import RunMetrics, percentile, summarize, weighted_percentile
from engine.record import RoundRecord
from engine.request import (
    Admitted,
    ChunkPlanned,
    Finished,
    FinishReason,
    FirstToken,
    Refused,
    RequestSpec,
    Retracted,
)
from engine.rows import Row


def rows(*shape: tuple[int, int]) -> tuple[Row, ...]:
    """Rows from (batch_size, num_extends) per rank."""
    return tuple(Row(rank=r, batch_size=b, num_extends=e, num_tokens=b) for r, (b, e) in enumerate(shape))


def record(index: int, clock: float, seconds: float, shape, point=GatePoint.NONE, open_=False) -> RoundRecord:
    extend = any(e for _, e in shape)
    return RoundRecord(
        round=index,
        unix_nanos=0,
        clock=clock,
        counter=0,
        point=point,
        open=open_,
        counter_after=0,
        all_decode_or_idle=not extend,
        round_seconds=seconds,
        rows=rows(*shape),
        policy="gate",
        config_epoch=0,
        attempt_interval=2,
        any_interval=4,
    )


# -- percentiles -------------------------------------------------------------------------------------------


def test_weighted_percentile_is_nearest_rank_on_cumulative_weight():  # weighted percentiles
    values, weights = [3.0, 1.0, 2.0], [2, 5, 3]  # sorted: 1 (w5), 2 (w3), 3 (w2); total 10
    assert weighted_percentile(values, weights, 50) == 1.0  # cumulative 5 reaches 50% of 10
    assert weighted_percentile(values, weights, 51) == 2.0
    assert weighted_percentile(values, weights, 80) == 2.0  # cumulative 8 reaches 80%
    assert weighted_percentile(values, weights, 81) == 3.0
    assert weighted_percentile(values, weights, 99) == 3.0
    assert weighted_percentile(values, weights, 0) == 1.0
    assert weighted_percentile(values, weights, 100) == 3.0


def test_weighted_percentile_equals_repeating_each_value_weight_times():
    values, weights = [0.030, 0.120, 0.031, 0.250], [7, 1, 5, 2]
    expanded = [v for v, w in zip(values, weights, strict=True) for _ in range(w)]
    for q in (1, 25, 50, 75, 90, 99):
        assert weighted_percentile(values, weights, q) == percentile(expanded, q)


def test_percentile_of_ten_samples():
    samples = [float(v) for v in range(10, 0, -1)]  # 10 .. 1
    assert percentile(samples, 50) == 5.0  # 5 of 10 samples are <= 5
    assert percentile(samples, 99) == 10.0
    assert percentile(samples, 10) == 1.0


def test_percentiles_of_nothing_are_none_and_bad_input_is_refused():
    assert percentile([], 50) is None
    assert weighted_percentile([1.0, 2.0], [0, 0], 50) is None
    with pytest.raises(ValueError, match="in \\[0, 100\\]"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match="2 values but 1 weights"):
        weighted_percentile([1.0, 2.0], [1], 50)


# -- rounds: extend share, ranks extending, windows --------------------------------------------------------


def test_round_counts_extend_share_and_windows():  # F1 share, ANY/ALL windows
    records = [
        record(0, 0.010, 0.010, [(4, 0), (3, 0)]),  # decode only
        record(1, 0.110, 0.100, [(1, 1), (1, 1)], GatePoint.ALL, True),  # both ranks extend, ALL window
        record(2, 0.120, 0.010, [(4, 0), (4, 0)], GatePoint.ALL, False),  # ALL point, stayed closed
        record(3, 0.200, 0.080, [(5, 1), (4, 0)], GatePoint.ANY, True),  # one rank extends, ANY window
        record(4, 0.2005, 0.0005, [(0, 0), (0, 0)], GatePoint.ALL, True),  # all idle: no forward (F2)
    ]
    summary = summarize(records, [], [])
    assert summary.rounds == 5 and summary.busy_rounds == 4
    assert summary.extend_rounds == 2
    assert summary.extend_round_share == pytest.approx(2 / 4)
    assert summary.extend_time_share == pytest.approx(0.180 / 0.200)
    assert summary.mean_ranks_extending == pytest.approx((2 + 1) / 2)
    assert (summary.windows_any, summary.windows_all) == (1, 1)  # the idle round's open vote ran nothing
    assert summary.elapsed_s == pytest.approx(0.2005)


# -- requests: TTFT, ITL, tokens, waits, outcomes ----------------------------------------------------------


def test_request_metrics_from_events_and_itl_samples():
    specs = [RequestSpec(f"r{i}", 100, 4, arrival=0.1 * i) for i in range(4)]
    events = [
        Refused("r3", 1, "too long"),
        Admitted("r0", 0, 1, 0.01, wait_rounds=0, wait_seconds=0.0),
        Admitted("r1", 1, 3, 0.21, wait_rounds=6, wait_seconds=0.09),
        ChunkPlanned("r0", 0, 1, 100),
        FirstToken("r0", 0, 1, 0.25),  # TTFT 0.25
        FirstToken("r1", 1, 3, 0.40),  # TTFT 0.30
        Retracted("r1", 1, 5),
        Admitted("r2", 0, 6, 0.5, wait_rounds=2, wait_seconds=0.3),
        FirstToken("r2", 0, 7, 0.6),  # TTFT 0.40
        Finished("r0", 0, 9, 0.7, FinishReason.LENGTH, 4),
        Finished("r2", 0, 9, 0.7, FinishReason.ABORT, 1),
    ]
    itl = [(0.03, 2), (0.10, 1), (0.03, 3)]  # 6 decode tokens: 5 at 30 ms, 1 at 100 ms
    records = [record(0, 0.0, 0.0, [(1, 1), (0, 0)]), record(1, 1.0, 0.1, [(2, 0), (1, 0)])]
    summary = summarize(records, events, itl, specs)
    assert summary.requests_submitted == 4
    assert (summary.requests_finished, summary.requests_aborted, summary.requests_refused) == (1, 1, 1)
    assert summary.retractions == 1
    assert summary.ttft_p50_s == pytest.approx(0.30) and summary.ttft_p99_s == pytest.approx(0.40)
    assert summary.itl_p50_s == 0.03 and summary.itl_p99_s == 0.10
    assert summary.output_tokens == 3 + 6  # three first tokens, six decode tokens
    assert summary.output_tokens_per_s == pytest.approx(9 / 1.0)
    assert summary.gate_wait_max_rounds == 6 and summary.gate_wait_p99_rounds == 6
    assert summary.gate_wait_max_s == pytest.approx(0.3) and summary.gate_wait_p99_s == pytest.approx(0.3)


def test_arrival_map_and_streaming_accumulator_agree():
    metrics = RunMetrics()
    metrics.add_arrivals({"a": 1.0})
    metrics.add_events([FirstToken("a", 0, 3, 1.5), FirstToken("unknown", 0, 3, 9.0)])
    summary = metrics.summary()
    assert summary.ttft_p50_s == pytest.approx(0.5)  # a request of unknown arrival has no TTFT
    assert summary.output_tokens == 2 and summary.output_tokens_per_s is None  # no records: no elapsed time
    assert summary.as_dict()["ttft_p50_s"] == pytest.approx(0.5)


def test_empty_run_summary():
    summary = summarize([], [], [])
    assert summary.rounds == 0 and summary.extend_round_share is None and summary.itl_p50_s is None
    assert summary.gate_wait_max_rounds == 0 and summary.gate_wait_p99_rounds is None


def test_bounded_samples_keep_the_newest_and_summary_is_cached():
    metrics = RunMetrics(max_samples=4)
    metrics.add_itl([(1.0, 1), (2.0, 1), (3.0, 1), (4.0, 1)])
    assert metrics.summary().itl_p99_s == 4.0
    first = metrics.summary()
    assert metrics.summary() is first  # nothing new: the same object, no re-sort
    metrics.add_itl([(100.0, 1)])  # five samples: the oldest half goes, the newest stay
    summary = metrics.summary()
    assert summary is not first
    assert summary.itl_p50_s == 4.0 and summary.itl_p99_s == 100.0
    with pytest.raises(ValueError, match="max_samples"):
        RunMetrics(max_samples=1)
