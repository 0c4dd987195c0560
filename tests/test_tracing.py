"""Tracing: deterministic round context, sampling rules, export to a real OTLP/gRPC receiver, bad collectors."""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import time
from typing import Any

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from control.host.backends import ProcessBackend, SimBackend
from control.host.controller import Controller
from control.host.serve import run_serve
from control.telemetry.otlp_wire import KIND_INTERNAL, SpanData, producer
from control.telemetry.telemetry_cli import (
    ENDPOINT_ENV,
    RANK_OBSERVER,
    add_telemetry_args,
    attach_telemetry,
    rank_observer_spec,
    telemetry_settings,
    trace_spans_dropped,
)
from control.telemetry.trace_export import (
    DropCounter,
    ShipperConfig,
    build_shipper,
    close_shared,
    parse_otlp_endpoint,
)
from control.telemetry.tracing import (
    CANDIDATE,
    TIMED,
    UNTIMED,
    CandidateMarks,
    RankRoundTracer,
    RoundMarks,
    RoundSampler,
    SampleReason,
    forget_run,
    hot_ranks,
    new_span_id,
    rank_observer,
    rank_resource,
    rank_span_id,
    rates_pick,
    round_root_span_id,
    round_trace_id,
    sample_reason,
    sampling_key,
)
from engine.drivers.lockstep import LockstepDriver
from engine.gate import GatePoint
from engine.phases import NullTimer
from engine.rows import Row
from tests.helpers import sim_args
from tests.otlp_receiver import OtlpReceiver
from tests.otlp_receiver import attrs as _attrs
from workloads import ClosedLoop, Fixed, Workload


@pytest.fixture
def receiver():
    rec = OtlpReceiver().start()
    yield rec
    rec.stop()


def telemetry_ns(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_telemetry_args(parser)
    ns = parser.parse_args(list(argv))
    ns.rounds = None
    return ns


def gate_args(**overrides: Any):
    values: dict[str, Any] = {"dp_size": 3, "prefill_attempt_interval": 2, "prefill_any_attempt_interval": 6}
    values.update(overrides)
    return sim_args(**values)


# -- pure parts -------------------------------------------------------------------------------------


def test_round_context_is_derived_alike_everywhere_and_differs_by_run_and_round():
    # Same (run, round) -> same ids on any rank or process; another run or round -> other ids; the
    # sampler's cached hashing gives the very ids `round_trace_id` derives.
    sampler = RoundSampler("run-a", 1.0, 1.0)
    assert [sampler.decide(r, (Row(),), None).trace_id for r in (0, 7, 12345)] == [  # type: ignore[union-attr]
        round_trace_id("run-a", r) for r in (0, 7, 12345)
    ]
    assert round_trace_id("run-a", 7) == round_trace_id("run-a", 7)
    assert round_trace_id("run-a", 7) != round_trace_id("run-b", 7) != round_trace_id("run-a", 8)
    assert round_root_span_id("run-a", 7) not in {rank_span_id("run-a", 7, r) for r in range(8)}
    assert len({rank_span_id("run-a", 7, r) for r in range(8)}) == 8
    assert 0 < round_trace_id("run-a", 0) < 2**128 and 0 < round_root_span_id("run-a", 0) < 2**64


def test_sampling_is_one_decision_for_every_rank_and_the_controller():
    # Ratio sampling is a function of the trace id: independent samplers agree on every round, at ~the rate.
    rows = (Row(rank=0, batch_size=1), Row(rank=1, batch_size=1))
    samplers = [RoundSampler("run-x", 0.1, 0.1) for _ in range(4)]
    picked = [[s.decide(r, rows, None) is not None for r in range(4000)] for s in samplers]
    assert picked[0] == picked[1] == picked[2] == picked[3]
    assert 300 < sum(picked[0]) < 500


def test_config_and_watermark_rounds_are_always_traced_and_windows_at_their_own_rate():
    # Config change, watermark crossing: traced even at rate 0. A window-open round is traced when its
    # trace id falls under the window rate; the reason says the rarest rule (config over open).
    never = RoundSampler("run-y", 0.0, 0.0).ratio
    always = RoundSampler("run-y", 1.0, 1.0).ratio
    calm = (Row(rank=0, pool_pages_used=10, pool_pages_usable=100), Row(rank=1, pool_pages_usable=100))
    opened = (Row(rank=0, decision_point=1, decision_open=True), Row(rank=1, decision_point=1, decision_open=True))
    hot = (Row(rank=0, pool_pages_used=95, pool_pages_usable=100), Row(rank=1, pool_pages_usable=100))

    def reason(rows, previous, adopted=None, window=never):
        before = hot_ranks(previous) if previous else 0
        return sample_reason(1, rows, hot_ranks(rows), before, adopted, never, window)

    assert reason(calm, ()) is None
    assert reason(opened, calm) is None  # window rate 0: not traced
    assert reason(opened, calm, window=always) is SampleReason.OPEN
    assert reason(calm, calm, 3) is SampleReason.CONFIG
    assert reason(opened, calm, 3, window=always) is SampleReason.CONFIG  # not hidden behind "open"
    assert reason(hot, calm) is SampleReason.WATERMARK
    assert reason(hot, hot) is None  # still above: not a crossing
    assert reason(hot, ()) is SampleReason.WATERMARK  # the first round: nothing was above before
    unknown = sample_reason(1, hot, hot_ranks(hot), None, None, never, never)
    assert unknown is SampleReason.WATERMARK  # previous round unknown: keep the root
    gate_off = (Row(rank=0, decision_point=0, decision_open=True),)  # R8: always open, but no window
    assert reason(gate_off, (), window=always) is None


def test_window_rate_samples_window_rounds_at_its_rate_and_agrees_across_samplers():
    # Every sampler of a run picks the same window rounds, about the window rate of them; ordinary
    # rounds only at the ordinary rate (the issue: tracing every window-open round cost ~30%).
    opened = (Row(rank=0, batch_size=1, decision_point=2, decision_open=True),)
    calm = (Row(rank=0, batch_size=1),)
    picked = []
    for _ in range(2):
        sampler = RoundSampler("run-w", 0.01, 0.2)
        picked.append([sampler.decide(r, opened if r % 4 == 0 else calm, None) for r in range(8000)])
    assert [c is not None for c in picked[0]] == [c is not None for c in picked[1]]
    windows = [c for r, c in enumerate(picked[0]) if r % 4 == 0]
    others = [c for r, c in enumerate(picked[0]) if r % 4]
    assert 300 < sum(c is not None for c in windows) < 500  # ~20% of 2000
    assert sum(c is not None for c in others) < 120  # ~1% of 6000
    assert {c.reason for c in others if c is not None} == {SampleReason.RATIO}


def test_a_rates_only_sampler_picks_exactly_the_rate_rounds_and_leaves_the_rules_rounds():
    # A simulator in its own process leaves the rules' rounds to the controller (`rates_only`): its
    # sampler must pick exactly the rounds the full rules pick for a rate (same ids), and none that
    # only a config change or a watermark crossing picks; the controller builds those, by `rates_pick`.
    calm = (Row(rank=0, pool_pages_used=10, pool_pages_usable=100, batch_size=1), Row(rank=1, batch_size=1))
    hot = (Row(rank=0, pool_pages_used=95, pool_pages_usable=100, batch_size=1), Row(rank=1, batch_size=1))
    opened = (Row(rank=0, decision_point=2, decision_open=True), Row(rank=1, decision_point=2, decision_open=True))
    full, rates = RoundSampler("run-r", 0.01, 0.1), RoundSampler("run-r", 0.01, 0.1)
    rates.rates_only = True
    by_rules = 0
    for r in range(6000):
        rows = hot if r % 50 == 0 else opened if r % 3 == 0 else calm  # a crossing every 50 rounds
        adopted = 7 if r % 997 == 0 else None
        want, got = full.decide(r, rows, adopted), rates.decide(r, rows, adopted)
        rate_picked = rates_pick(full.timing(r), rows)
        assert (got is not None) == rate_picked, r
        if got is not None:
            assert (got.trace_id, got.root_span_id) == (want.trace_id, want.root_span_id)
            assert got.reason in (SampleReason.RATIO, SampleReason.OPEN)
        elif want is not None:
            by_rules += 1
            assert want.reason in (SampleReason.CONFIG, SampleReason.WATERMARK)
    assert by_rules > 100  # the rules' rounds were there to be left


def test_round_timing_is_known_before_the_round_and_matches_the_sampling_key():
    # A round's timing (computed for blocks of rounds at once) is its sampling key against the rates:
    # TIMED under the sample rate, CANDIDATE under the window rate only, else UNTIMED.
    for rate, window in ((0.01, 0.05), (0.0, 0.0), (1.0, 1.0), (0.3, 0.1), (0.2, 1.0)):
        sampler = RoundSampler("run-t", rate, window)
        ratio, larger = sampler.ratio.bound, max(sampler.ratio.bound, sampler.window.bound)
        for r in [*range(5000), 4095, 4096, 10**9 + 7]:
            key = sampling_key(sampler._seed, r)
            assert sampler.timing(r) == (TIMED if key < ratio else CANDIDATE if key < larger else UNTIMED), (rate, r)


def test_a_lockstep_group_is_observed_once_per_round_and_times_only_what_may_be_traced(monkeypatch):
    # The lockstep driver calls the group's tracer instead of each rank's hooks; an untimed round leaves
    # the ranks' timers off; a window candidate's phases are timed from its vote on, only if it opened.
    def never(*_: object) -> None:
        raise AssertionError("a rank's own tracing hook ran in a lockstep group")

    monkeypatch.setattr(RankRoundTracer, "fill_row", never)
    monkeypatch.setattr(RankRoundTracer, "round_done", never)
    args = gate_args()
    driver = LockstepDriver(args)
    workload = Workload(ClosedLoop(9), dp_size=3, prompt=Fixed(200), output=Fixed(20), seed=4)
    run_id = "group-hook"
    for engine in driver.engines:  # an endpoint nobody listens on: the spans are refused later, counted
        engine.observer = rank_observer(
            engine, endpoint="127.0.0.1:9", run_id=run_id, sample_rate=0.1, window_sample_rate=0.6
        )
    sampler = engine.observer.sampler
    seen = collections.Counter()
    try:
        for _ in range(300):
            round_ = driver.engines[0].round
            outcomes, _ = driver.step_with(workload)
            timing = sampler.timing(round_)
            timers = [engine.timer for engine in driver.engines]
            opened = outcomes[0].decision.allow_prefill and outcomes[0].decision.point != GatePoint.NONE
            if timing == UNTIMED:
                assert all(type(timer) is NullTimer for timer in timers)
            elif timing == TIMED:
                assert all(type(timer) is RoundMarks and len(timer.marks) == 8 for timer in timers)
            else:
                assert all(type(timer) is CandidateMarks and timer.live == opened for timer in timers)
                assert all(len(timer.marks) == 7 for timer in timers if timer.live)  # from "decide" on
            seen[timing, opened] += 1
            traced = sampler.context is not None
            assert all(row.span_start_ns > 0 for row in outcomes[0].rows) == traced
        assert all(engine.group_observed for engine in driver.engines)
        assert seen[CANDIDATE, True] and seen[CANDIDATE, False] and seen[TIMED, True] and seen[UNTIMED, False]
        for engine in driver.engines:  # observers taken away: the ranks step as before any tracer
            engine.observer = None
        driver.step_with(workload)
        assert driver.observer is None and not any(engine.group_observed for engine in driver.engines)
        assert all(type(engine.timer) is NullTimer for engine in driver.engines)
    finally:
        forget_run(run_id)
        close_shared(parse_otlp_endpoint("127.0.0.1:9"), 0.1)


def test_sampler_watermark_rule_uses_the_previous_round():
    # The sampler remembers the previous round's hot ranks, and asked twice for a round answers alike.
    sampler = RoundSampler("run-z", 0.0, 0.0)
    calm = (Row(rank=0, pool_pages_used=10, pool_pages_usable=100),)
    hot = (Row(rank=0, pool_pages_used=95, pool_pages_usable=100),)
    assert sampler.decide(0, calm, None) is None
    context = sampler.decide(1, hot, None)
    assert context is not None and context.reason is SampleReason.WATERMARK
    assert sampler.decide(1, hot, None) is context
    assert sampler.decide(2, hot, None) is None
    assert sampler.decide(5, hot, None) is not None  # rounds 3-4 unseen: previous unknown


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "localhost:notaport",
        "localhost:70000",
        "ftp://collector:4317",
        "http://collector:4317/v1/traces",
        "http://user:pw@collector:4317",
        "http://:4317",
        "bad host:4317",
        "localhost:0",
    ],
)
def test_malformed_endpoint_is_refused_with_a_clear_message(endpoint: str):
    # Bad input: the message names the flag, the value and the expected form, before any rank starts.
    with pytest.raises(ValueError, match=r"--otlp-endpoint .* is not an OTLP/gRPC endpoint .*host:port"):
        rank_observer_spec(telemetry_ns("--otlp-endpoint", endpoint), "run", 3)


def test_endpoint_forms_env_fallback_and_other_flags(monkeypatch):
    # host:port, http and https URLs; the env var when the flag is absent (else tracing off); rate and port bounds.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    assert parse_otlp_endpoint("collector:4317").target == "collector:4317"
    assert parse_otlp_endpoint("http://127.0.0.1").target == "127.0.0.1:4317"
    assert parse_otlp_endpoint("https://[::1]:4317") == parse_otlp_endpoint("https://[::1]:4317")
    assert not parse_otlp_endpoint("https://[::1]:4317").insecure
    assert telemetry_settings(telemetry_ns(), {}).endpoint is None
    assert rank_observer_spec(telemetry_ns(), "run", 3) is None
    from_env = telemetry_settings(telemetry_ns(), {ENDPOINT_ENV: "http://jaeger:4317"})
    assert from_env.endpoint is not None and from_env.endpoint.target == "jaeger:4317"
    with pytest.raises(ValueError, match=ENDPOINT_ENV):
        telemetry_settings(telemetry_ns(), {ENDPOINT_ENV: "jaeger:port"})
    with pytest.raises(ValueError, match="--trace-sample-rate"):
        telemetry_settings(telemetry_ns("--trace-sample-rate", "1.5"), {})
    with pytest.raises(ValueError, match="--trace-window-sample-rate"):
        telemetry_settings(telemetry_ns("--trace-window-sample-rate", "nan"), {})
    with pytest.raises(ValueError, match="--trace-request-rate"):
        telemetry_settings(telemetry_ns("--trace-request-rate", "-1"), {})
    lifted = telemetry_settings(telemetry_ns("--trace-sample-rate", "0.3", "--trace-window-sample-rate", "0.1"), {})
    assert lifted.window_sample_rate == 0.3  # window rounds are never sampled less than any round
    with pytest.raises(ValueError, match="--metrics-port"):
        telemetry_settings(telemetry_ns("--metrics-port", "70000"), {})
    spec = rank_observer_spec(telemetry_ns("--otlp-endpoint", "localhost:4317"), "run-1", 3)
    assert spec is not None and spec[0] == RANK_OBSERVER and spec[1]["run_id"] == "run-1"


def test_unreachable_collector_loses_spans_countably_and_offers_never_wait():
    # Bad input: nothing listens at the endpoint. Offering is immediate, a full queue refuses whole
    # offers, a failed export counts its spans, and flush and close are bounded.
    from engine.drivers.procs import free_port

    endpoint = parse_otlp_endpoint(f"127.0.0.1:{free_port()}")
    config = ShipperConfig(max_queue_spans=8, batch_spans=4, export_timeout_s=2.0, retry_s=0.5)
    shipper = build_shipper(endpoint, config)
    counter = DropCounter()
    who = producer(rank_resource("run-u", 0, 1), "test", "0")
    spans = [SpanData(7, new_span_id(), 0, "plan", KIND_INTERNAL, 1, 2, {}) for _ in range(4)]
    started = time.perf_counter()
    for _ in range(3):
        shipper.offer(spans, who, counter)
    assert time.perf_counter() - started < 1.0  # well under one export timeout: offering never waits on it
    shipper.flush(6.0)
    # Whole offers refused; nobody listening is a definite failure (not "unconfirmed"), after the retries.
    assert counter.total == 12 and counter.refused % 4 == 0 and counter.failed >= 4 and counter.unconfirmed == 0
    assert shipper.health().state == "failing" and "UNAVAILABLE" in shipper.health().detail
    started = time.perf_counter()
    shipper.close(1.0)
    assert time.perf_counter() - started < 5.0  # bounded by its timeout, not by the dead collector
    assert not shipper.offer(spans, who, counter) and counter.refused >= 4  # closed: refused, counted
    assert counter.offered == 16 == counter.total


# -- three rank processes against a real receiver ---------------------------------------------------


def is_request(span: Any) -> bool:
    return span.kind == trace_pb2.Span.SPAN_KIND_SERVER


def assert_roots_cover_their_trees(spans: list[tuple[dict[str, Any], Any]]) -> int:
    """Every round root starts no later and ends no earlier than each span of its trace; returns the roots."""
    traces: dict[bytes, list[Any]] = collections.defaultdict(list)
    for _, span in spans:
        if not is_request(span):
            traces[span.trace_id].append(span)
    for trace in traces.values():
        [root] = [span for span in trace if span.name == "round"]
        assert root.end_time_unix_nano > root.start_time_unix_nano  # never zero-length (round 0 was)
        for span in trace:
            assert root.start_time_unix_nano <= span.start_time_unix_nano, (root, span)
            assert span.end_time_unix_nano <= root.end_time_unix_nano, (root, span)
    return len(traces)


def test_every_sampled_round_is_one_trace_of_root_and_all_ranks(receiver: OtlpReceiver, monkeypatch):
    # Every round the sampling rules pick arrives as one trace: the controller's root and all 3 ranks'
    # gate.round spans with plan/all-gather/forward under each, every parent present, the root covering
    # every rank's span; request spans are SERVER spans with the GenAI attributes, the gate wait and
    # TTFT, and link to their rank's round spans. The summary says what was traced and dropped.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    # Every window-open round traced: whether some open round's trace id also falls under a rate of 0.2
    # depends on which rounds the rank processes' timing opens, and the run must show both reasons.
    ns = telemetry_ns(
        "--otlp-endpoint", receiver.endpoint, "--trace-sample-rate", "0.2", "--trace-window-sample-rate", "1"
    )
    run_id = "trace-e2e"
    args = gate_args()
    observer, kwargs = rank_observer_spec(ns, run_id, args.dp_size)  # type: ignore[misc]
    workload = Workload(ClosedLoop(6), dp_size=3, prompt=Fixed(200), output=Fixed(20), limit=18, seed=3)
    backend = ProcessBackend(args, workload, max_rounds=3000, observer=observer, observer_kwargs=kwargs)
    controller = Controller(args, backend, run_id=run_id)
    records = []
    controller.listeners.append(records.append)
    ns.no_progress = True
    out = io.StringIO()
    assert asyncio.run(run_serve(controller, ns, [attach_telemetry], out=out)) == 0  # serve's path

    sampler = RoundSampler(run_id, 0.2, 1.0)  # a fresh, independent sampler of the same run
    forget_run(run_id)
    expected = {rec.round: sampler.decide(rec.round, rec.rows, rec.adopted_epoch) for rec in records}
    expected = {r: ctx for r, ctx in expected.items() if ctx is not None}
    assert records and len(records) == records[-1].round + 1  # no record lost: the expectation is exact
    reasons = {ctx.reason for ctx in expected.values()}
    assert SampleReason.OPEN in reasons and SampleReason.RATIO in reasons

    spans = receiver.spans()
    traces: dict[bytes, list[tuple[dict[str, Any], Any]]] = collections.defaultdict(list)
    for resource, span in spans:
        if not is_request(span):
            traces[span.trace_id].append((resource, span))
    assert len(traces) == len(expected)
    assert assert_roots_cover_their_trees(spans) == len(expected)  # the last round's root too
    for round_, ctx in expected.items():
        trace = traces[ctx.trace_id.to_bytes(16, "big")]
        by_id = {span.span_id: span for _, span in trace}
        assert all(span.parent_span_id in by_id for _, span in trace if span.parent_span_id)  # no missing parent
        roots = [span for _, span in trace if span.name == "round"]
        assert len(roots) == 1 and not roots[0].parent_span_id
        assert roots[0].span_id == ctx.root_span_id.to_bytes(8, "big")
        assert _attrs(roots[0])["gate.round"] == round_ and _attrs(roots[0])["gate.sample_reason"] == ctx.reason
        ranks = {res["prefill_gate.rank"]: span for res, span in trace if span.name == "gate.round"}
        assert sorted(ranks) == [0, 1, 2]
        for rank, span in ranks.items():
            assert span.parent_span_id == roots[0].span_id
            assert span.span_id == rank_span_id(run_id, round_, rank).to_bytes(8, "big")
            assert span.kind == trace_pb2.Span.SPAN_KIND_INTERNAL
            attrs = _attrs(span)
            assert attrs["gate.round"] == round_ and attrs["gate.rank"] == rank
            assert {
                "gate.point",
                "gate.open",
                "gate.counter",
                "gate.want_prefill",
                "gate.has_decode_work",
                "gate.occupancy",
                "gate.config_epoch",
            } <= set(attrs)
            children = sorted(s.name for _, s in trace if s.parent_span_id == span.span_id)
            assert children == ["all-gather", "forward", "plan"]
    resources = [res for res, span in spans if span.name == "gate.round"]
    assert {res["service.instance.id"] for res in resources} == {f"{run_id}/rank{r}" for r in range(3)}
    assert {res["service.name"] for res in resources} == {"prefill-gate"}
    assert all(res["service.version"] and "rank" not in res for res, _ in spans)  # namespaced, versioned

    rank_spans = {(s.trace_id, s.span_id): res["prefill_gate.rank"] for res, s in spans if s.name == "gate.round"}
    requests = [span for _, span in spans if is_request(span)]
    assert len(requests) == 18
    linked = 0
    for span in requests:
        attrs = _attrs(span)
        assert span.name == "text_completion sim/h200-dp8-ep8"  # {gen_ai.operation.name} {gen_ai.request.model}
        assert attrs["gen_ai.operation.name"] == "text_completion"
        assert attrs["gen_ai.request.model"] == "sim/h200-dp8-ep8"
        assert attrs["gen_ai.usage.input_tokens"] == 200 and attrs["gen_ai.usage.output_tokens"] == 20
        assert attrs["gen_ai.request.max_tokens"] == 20 and attrs["gen_ai.response.finish_reasons"] == ["length"]
        assert attrs["gen_ai.response.id"].startswith("r") and attrs["prefill_gate.request.prefix_hit"] is False
        assert not any(key.startswith("request.") for key in attrs)
        assert attrs["gate.wait_rounds"] >= 0 and attrs["gate.wait_seconds"] >= 0
        assert attrs["prefill_gate.request.ttft_seconds"] > 0
        names = [e.name for e in span.events]
        assert {"admitted", "prefill_chunk", "first_token"} <= set(names) and names[-1] == "first_token"
        for link in span.links:
            assert rank_spans[(link.trace_id, link.span_id)] == attrs["gate.rank"]  # resolves to its rank's span
            linked += 1
    assert linked >= len(requests)
    assert trace_spans_dropped(controller) == 0
    summary = out.getvalue()
    assert f"rounds traced {len(expected)}/{len(records)}" in summary and "spans dropped 0 (ranks 0;" in summary
    assert "untraced over 100/s 0" in summary and "WARNING" not in summary


async def _measure(
    controller: Controller, ns: argparse.Namespace | None, steps: list[tuple[str, float]], receiver: OtlpReceiver | None
) -> list[tuple[float, int]]:
    """Run the controller; for each (mode, seconds) step, the round rate over its window and the drops
    counted after it: for a failing mode, once the count grew (retries and the export deadline make a loss
    count some time after the spans were offered; a loaded machine makes it later still)."""
    controller.start()
    stop = await attach_telemetry(controller, ns) if ns is not None else None
    runner = asyncio.create_task(controller.run())
    out = []
    try:
        while controller.latest is None or controller.latest.round < 50:  # warm up
            await asyncio.sleep(0.05)
        dropped = 0
        for mode, seconds in steps:
            if receiver is not None:
                receiver.mode = mode
            start = controller.latest.round
            await asyncio.sleep(seconds)
            rate = (controller.latest.round - start) / seconds
            deadline = time.monotonic() + 30.0
            while mode != "ok" and trace_spans_dropped(controller) <= dropped and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            dropped = trace_spans_dropped(controller)
            out.append((rate, dropped))
        controller.request_stop()
        await runner
    finally:
        if stop is not None:
            await stop()
    return out


def test_failing_collectors_do_not_slow_rounds_and_drops_are_counted(receiver: OtlpReceiver, monkeypatch):
    # Bad input: a collector answering UNAVAILABLE, then one that sleeps past the timeout, leave the round
    # rate of 2 rank processes (every round traced) near their rate with a healthy collector just before;
    # lost spans are counted. (One run: a second set of rank processes for a baseline costs ~10 s of CPU.)
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    args = gate_args(dp_size=2, max_num_seqs=32)
    workload = Workload(ClosedLoop(6), dp_size=2, prompt=Fixed(100), output=Fixed(40), seed=5)
    ns = telemetry_ns("--otlp-endpoint", receiver.endpoint, "--trace-sample-rate", "1.0")
    run_id = "trace-bad-collector"
    observer, kwargs = rank_observer_spec(ns, run_id, args.dp_size)  # type: ignore[misc]
    # Exports every 0.1 s (not the default 5 s): each 1 s step must see the collector's answers.
    kwargs.update(queue_spans=512, export_timeout_s=0.3, close_timeout_s=0.5, schedule_delay_s=0.1)
    backend = ProcessBackend(args, workload, observer=observer, observer_kwargs=kwargs)
    traced = Controller(args, backend, run_id=run_id, stop_when_idle=False)
    steps = [("ok", 1.0), ("unavailable", 1.0), ("sleep", 1.0)]
    (rate_ok, _), (rate_unavailable, dropped_1), (rate_sleep, dropped_2) = asyncio.run(
        _measure(traced, ns, steps, receiver)
    )

    figures = {"ok": rate_ok, "unavailable": rate_unavailable, "sleep": rate_sleep, "drops": (dropped_1, dropped_2)}
    assert rate_ok > 50, figures
    # Generous for a shared 2-core machine; a round that waited on the collector would drop the rate to a
    # few rounds a second (each failing export takes the 0.3 s timeout).
    assert rate_unavailable > rate_ok / 3 and rate_sleep > rate_ok / 3, figures
    assert receiver.refused > 0 and receiver.slept > 0, (receiver.refused, receiver.slept)
    assert 0 < dropped_1 < dropped_2, figures  # every lost span is counted, and the count only grows


@pytest.mark.parametrize("window", [0.1, 0.6])
def test_lockstep_simulator_rounds_are_complete_traces_too(receiver: OtlpReceiver, monkeypatch, window: float):
    # The simulator steps all ranks in one process (one group tracer, shared sampler and shipper, the
    # controller reusing the ranks' decisions): every traced round still holds the root and each rank's
    # tree, with the lockstep all-gather marked as such. With a window rate above the sample rate, the
    # window rounds' phases are timed from their vote on, and their trees are complete too.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    ns = telemetry_ns(
        "--otlp-endpoint",
        receiver.endpoint,
        "--trace-sample-rate",
        "0.1",
        "--trace-window-sample-rate",
        str(window),
        "--no-otlp-metrics",
    )
    ns.no_progress = True
    run_id = f"trace-lockstep-{window}"
    args = gate_args()
    observer, kwargs = rank_observer_spec(ns, run_id, args.dp_size)  # type: ignore[misc]
    workload = Workload(ClosedLoop(6), dp_size=3, prompt=Fixed(200), output=Fixed(20), limit=24, seed=4)
    controller = Controller(args, SimBackend(args, workload, observer=observer, observer_kwargs=kwargs), run_id=run_id)
    records = []
    controller.listeners.append(records.append)
    assert asyncio.run(run_serve(controller, ns, [attach_telemetry], out=io.StringIO())) == 0

    sampler = RoundSampler(run_id, 0.1, window)  # a fresh, independent sampler: it must pick the same rounds
    forget_run(run_id)
    reasons = {rec.round: sampler.decide(rec.round, rec.rows, rec.adopted_epoch) for rec in records}
    expected = {round_ for round_, context in reasons.items() if context is not None}
    if window > 0.1:
        assert any(c.reason is SampleReason.OPEN for c in reasons.values() if c is not None)
    spans = [(res, span) for res, span in receiver.spans() if not is_request(span)]
    roots = {_attrs(span)["gate.round"] for _, span in spans if span.name == "round"}
    assert roots == expected and len(spans) == 13 * len(expected)
    assert assert_roots_cover_their_trees(receiver.spans()) == len(expected)
    gathers = [_attrs(span) for _, span in spans if span.name == "all-gather"]
    assert gathers and all(attrs == {"gate.lockstep": True} for attrs in gathers)
    assert len([span for res, span in receiver.spans() if is_request(span)]) == 24
