"""Spans lost are counted exactly, and shown: a hung then resumed collector, one that never answers in time."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import time
from collections.abc import Callable

import pytest

from control.host.backends import Polled, SimBackend
from control.host.controller import Controller
from control.host.serve import build_backend, format_summary, run_serve
from control.host.sim_child import SimProcessBackend
from control.plane.grpc_server import ControlPlane, PlaneOptions
from control.telemetry.otlp_wire import KIND_INTERNAL, SpanData, producer
from control.telemetry.telemetry_cli import ENDPOINT_ENV, attach_telemetry, rank_observer_spec
from control.telemetry.trace_export import (
    DropCounter,
    ShipperConfig,
    build_shipper,
    close_shared,
    parse_otlp_endpoint,
)
from control.telemetry.trace_status import TraceStatus, trace_status
from control.telemetry.tracing import new_span_id
from engine.metrics import summarize
from tests.helpers import sim_args
from tests.otlp_receiver import OtlpReceiver, attrs
from tests.test_ctl import ctl
from tests.test_tracing import assert_roots_cover_their_trees, telemetry_ns
from workloads import ClosedLoop, Fixed, Workload


@pytest.fixture
def receiver():
    rec = OtlpReceiver().start()
    yield rec
    rec.stop()


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait for a condition of the running system (checked every 10 ms), failing after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_drops_are_counted_exactly_across_a_hung_and_resumed_collector(receiver, monkeypatch, caplog):
    # Issue 14 item 2: a stopped collector made the count grow by twice what was really missing (the
    # timed-out exports were delivered once it resumed). Here the collector holds every export, the
    # simulator keeps tracing every round into a small queue, the collector resumes: every span offered
    # is either received (once) or counted as dropped, and the surfaced count is exactly the difference.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    caplog.set_level(logging.WARNING, logger="prefill_gate.tracing")
    ns = telemetry_ns("--otlp-endpoint", receiver.endpoint, "--trace-sample-rate", "1.0", "--no-otlp-metrics")
    args = sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    run_id = "drops-exact"
    observer, kwargs = rank_observer_spec(ns, run_id, args.dp_size)  # type: ignore[misc]
    kwargs["queue_spans"] = 160  # 20 rounds of 2 ranks: the hang overflows it
    workload = Workload(ClosedLoop(8), dp_size=2, prompt=Fixed(100), output=Fixed(30), seed=1)
    backend = SimBackend(args, workload, observer=observer, observer_kwargs=kwargs)
    controller = Controller(args, backend, run_id=run_id, stop_when_idle=False)
    counters = [engine.observer.counter for engine in backend.driver.engines]

    async def run() -> tuple[int, int]:
        controller.start()
        stop = await attach_telemetry(controller, ns)
        runner = asyncio.create_task(controller.run())
        try:
            await until(lambda: controller.latest is not None and controller.latest.round > 20)
            receiver.hang()
            await until(receiver.hung.is_set)  # an export is held by the collector
            await until(lambda: sum(c.refused for c in counters) > 40)  # the ranks' queue overflowed
            during = trace_status(controller)
            receiver.resume()
            controller.request_stop()
            await runner
            # Every span is offered by now (the tracer's close exports the last root and requests); let
            # the exporters drain without a deadline, so that nothing is left in flight at close.
            controller.backend.tracer.close()
            loop = asyncio.get_running_loop()
            for shipper in {backend.driver.engines[0].observer.shipper, controller.backend.shipper}:
                assert await loop.run_in_executor(None, shipper.flush, 60.0)
        finally:
            receiver.resume()
            await stop()  # closes the shippers: every count is final
        return during.spans_dropped, receiver.held

    dropped_during, held = asyncio.run(run())
    controller_counter = controller.backend.tracer.counter
    total = DropCounter()
    for counter in [*counters, controller_counter]:
        total.add(counter)
    received = [(span.trace_id, span.span_id) for _, span in receiver.spans()]
    assert len(received) == len(set(received))  # nothing delivered twice
    assert held >= 1 and dropped_during > 0
    assert total.failed == 0 and total.unconfirmed == 0  # the held exports were answered, not written off
    assert total.exported == len(received)  # acknowledged is exactly what arrived
    assert total.offered == len(received) + total.refused  # every other span was refused, and counted
    status = trace_status(controller)
    assert status.spans_dropped == total.offered - len(received) and status.ranks_final
    summary = format_summary(controller.summary(), True, status)
    assert f"WARNING: spans dropped {status.spans_dropped} (ranks " in summary
    logged = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert logged and len(logged) <= 3  # rate-limited: one line at the first loss, one at close


@pytest.mark.parametrize("child", [False, True], ids=["simulator-in-process", "simulator-child"])
def test_rounds_traced_only_for_a_watermark_crossing_have_covering_roots_and_say_they_were_not_timed(receiver, child):
    # Rates 0: only watermark crossings (a small pool) are traced. Their phases were not timed (timing
    # every round would cost every round), so each rank's span says so and has no children; the root
    # still covers them. In `serve`'s child process the simulated ranks leave such rounds to the
    # controller (they trace only what a rate picks): the trees are the same, built by the controller.
    rates = ("--trace-sample-rate", "0", "--trace-window-sample-rate", "0")
    ns = telemetry_ns("--otlp-endpoint", receiver.endpoint, *rates)
    ns.otlp_metrics, ns.no_progress, ns.pace, ns.processes = False, True, None, False
    args = sim_args(dp_size=2, kv_pages=40, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    observer, kwargs = rank_observer_spec(ns, "watermark-only", 2)  # type: ignore[misc]
    workload = Workload(ClosedLoop(8), dp_size=2, prompt=Fixed(200), output=Fixed(40), limit=24, seed=2)
    if child:
        backend = build_backend(args, workload, ns, "watermark-only")
    else:
        backend = SimBackend(args, workload, observer=observer, observer_kwargs=kwargs)
    controller = Controller(args, backend, run_id="watermark-only")
    records = {}
    controller.listeners.append(lambda record: records.__setitem__(record.round, record))
    assert asyncio.run(run_serve(controller, ns, [attach_telemetry], out=io.StringIO())) == 0
    assert getattr(backend, "rule_rounds_to_controller", False) is child
    spans = [(res, span) for res, span in receiver.spans() if span.name in ("round", "gate.round", "plan")]
    roots = [span for _, span in spans if span.name == "round"]
    assert roots and {attrs(root)["gate.sample_reason"] for root in roots} == {"watermark"}
    assert assert_roots_cover_their_trees(receiver.spans()) == len(roots)
    ranks = [(res, span) for res, span in spans if span.name == "gate.round"]
    assert len(ranks) == 2 * len(roots) and all(attrs(span)["gate.phases_timed"] is False for _, span in ranks)
    # Each rank's span carries that rank's resource and its own vote (from its row), whoever built it.
    assert {(res["prefill_gate.rank"], attrs(span)["gate.rank"]) for res, span in ranks} == {(0, 0), (1, 1)}
    for _, span in ranks:
        row = records[attrs(span)["gate.round"]].rows[attrs(span)["gate.rank"]]
        assert (attrs(span)["gate.open"], attrs(span)["gate.counter"]) == (row.decision_open, row.decision_counter)
    if child:  # built by the controller: one round long, between rank 0's record stamps of r - 1 and r
        for root in roots:
            r = attrs(root)["gate.round"]
            if r - 1 in records:
                assert root.end_time_unix_nano - root.start_time_unix_nano == (
                    records[r].unix_nanos - records[r - 1].unix_nanos
                )
    assert not [span for _, span in spans if span.name == "plan"]


def test_an_export_unanswered_past_the_deadline_is_unconfirmed_not_lost(receiver):
    # A collector silent past the export deadline may still take the spans when it resumes (it did with
    # rotel under SIGSTOP): they are counted as unconfirmed, the exporter shows "stalled" meanwhile, and
    # the receiver indeed gets them once it resumes.
    config = ShipperConfig(max_queue_spans=64, batch_spans=8, export_timeout_s=1.0, schedule_delay_s=0.02)
    shipper = build_shipper(parse_otlp_endpoint(receiver.endpoint), config)
    counter = DropCounter()
    who = producer({"service.name": "test"}, "test", "0")
    spans = [SpanData(9, new_span_id(), 0, "plan", KIND_INTERNAL, 1, 2, {"i": i}) for i in range(8)]
    receiver.hang()
    shipper.offer(spans, who, counter)
    deadline = time.monotonic() + 10
    while counter.unconfirmed < 8:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    receiver.resume()
    shipper.offer(spans[:4], who, counter)
    assert shipper.flush(10.0)
    shipper.close()
    assert (counter.offered, counter.exported, counter.unconfirmed, counter.failed, counter.refused) == (12, 4, 8, 0, 0)
    deadline = time.monotonic() + 10
    while len(receiver.spans()) < 12:  # the held call is answered on resume: the "lost" batch arrived
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert shipper.health().state == "closed" and "DEADLINE_EXCEEDED" in shipper.health().detail


def test_exporter_health_reports_a_stall_while_the_collector_holds_an_export(receiver):
    # The state an operator sees in `ctl snapshot` / the metrics: stalled while an export waits.
    config = ShipperConfig(batch_spans=1, schedule_delay_s=0.02, export_timeout_s=30.0, stalled_after_s=0.2)
    shipper = build_shipper(parse_otlp_endpoint(receiver.endpoint), config)
    counter = DropCounter()
    who = producer({"service.name": "test"}, "test", "0")
    assert shipper.health().state == "idle"
    shipper.offer([SpanData(9, 1, 0, "x", KIND_INTERNAL, 1, 2, {})], who, counter)
    assert shipper.flush(10.0) and shipper.health().state == "ok"
    receiver.hang()
    shipper.offer([SpanData(9, 2, 0, "x", KIND_INTERNAL, 1, 2, {})], who, counter)
    assert receiver.hung.wait(10)
    deadline = time.monotonic() + 10
    while shipper.health().state != "stalled":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "no answer for" in shipper.health().detail
    receiver.resume()
    assert shipper.flush(10.0) and shipper.health().state == "ok"
    shipper.close()
    assert (counter.exported, counter.total) == (2, 0)


def test_the_summary_says_nothing_of_tracing_when_it_is_off():
    text = format_summary(summarize([], [], []), False, TraceStatus())
    assert "tracing" not in text and "spans" not in text
    assert io.StringIO(text).read().startswith("summary")


def test_ctl_snapshot_shows_a_stalled_exporter_and_the_spans_dropped(receiver, monkeypatch):
    # Where an operator looks: `ctl snapshot` over a real control plane, while the collector holds every
    # export. The tracing line says the exporter is stalled and how many spans were dropped; the JSON
    # carries the same figures in RunStats.tracing (what the console header reads).
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    ns = telemetry_ns("--otlp-endpoint", receiver.endpoint, "--trace-sample-rate", "1.0", "--no-otlp-metrics")
    args = sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    observer, kwargs = rank_observer_spec(ns, "ctl-stall", 2)  # type: ignore[misc]
    kwargs["queue_spans"] = 80
    workload = Workload(ClosedLoop(4), dp_size=2, prompt=Fixed(100), output=Fixed(30), seed=1)
    backend = SimBackend(args, workload, pace=1.0, observer=observer, observer_kwargs=kwargs)
    controller = Controller(args, backend, run_id="ctl-stall", stop_when_idle=False)

    async def go() -> tuple[str, dict]:
        controller.start()
        stop = await attach_telemetry(controller, ns)
        controller.backend.shipper.config = ShipperConfig(stalled_after_s=0.2)  # the controller's exporter
        plane = ControlPlane(controller, PlaneOptions(port=0, token=None), out=io.StringIO())
        await plane.start()
        runner = asyncio.create_task(controller.run())
        try:
            receiver.hang()
            await until(lambda: trace_status(controller).exporter_state == "stalled")
            await until(lambda: trace_status(controller).spans_dropped > 0)
            text = (await ctl(plane.target, "snapshot"))[1]
            snapshot = json.loads((await ctl(plane.target, "snapshot", "--json"))[1])
        finally:
            receiver.resume()
            await plane.stop()
            controller.request_stop()
            await runner
            await stop()
        return text, snapshot

    text, snapshot = asyncio.run(go())
    [line] = [line for line in text.splitlines() if line.startswith("tracing: ")]
    assert f"tracing: {receiver.endpoint}  rounds traced " in line and "exporter stalled: no answer for" in line
    dropped = int(line.split("spans dropped ")[1].split()[0])
    tracing = snapshot["stats"]["tracing"]
    assert dropped > 0 and int(tracing["spans_dropped"]) >= dropped and tracing["exporter_state"] == "stalled"
    assert tracing["enabled"] and float(tracing["sample_rate"]) == 1.0 and int(tracing["rounds_traced"]) > 0


def simulate_to_the_end(receiver: OtlpReceiver, run_id: str, **observer_kwargs: object) -> tuple[SimBackend, Polled]:
    """A traced 2-rank simulator (every round) run for 40 rounds; its polls, merged."""
    ns = telemetry_ns("--otlp-endpoint", receiver.endpoint, "--trace-sample-rate", "1.0", "--no-otlp-metrics")
    args = sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    observer, kwargs = rank_observer_spec(ns, run_id, 2)  # type: ignore[misc]
    kwargs.update(observer_kwargs)
    workload = Workload(ClosedLoop(4), dp_size=2, prompt=Fixed(100), output=Fixed(30), seed=1)
    backend = SimBackend(args, workload, max_rounds=40, observer=observer, observer_kwargs=kwargs)
    backend.start()
    merged, deadline = Polled(), time.monotonic() + 60
    while not merged.stopped:
        assert time.monotonic() < deadline, "the simulator did not stop"
        merged.add(backend.poll())
        time.sleep(0.01)
    return backend, merged


def test_the_simulator_reports_final_rank_drop_counts_with_its_last_poll_only_when_they_are_final(receiver):
    # How a simulator in another process tells the controller its ranks' final counts (a rank process
    # does it in its goodbye): after the last round it drains its exports, then sends the counts. When the
    # collector holds an export past the bound, it says nothing final (the summary then says "not final").
    endpoint = parse_otlp_endpoint(receiver.endpoint)
    backend, merged = simulate_to_the_end(receiver, "final-counts")
    counters = [engine.observer.counter for engine in backend.driver.engines]
    assert merged.observer_dropped == {0: counters[0].total, 1: counters[1].total} == backend.observer_dropped
    assert all(c.offered == c.exported + c.total > 0 for c in counters)  # nothing was pending: final
    assert len(receiver.spans()) == sum(c.exported for c in counters) == 40 * 2 * 4
    close_shared(endpoint)

    receiver.hang()
    try:
        backend, merged = simulate_to_the_end(receiver, "final-counts-hung", close_timeout_s=0.3)
        assert merged.stopped and merged.observer_dropped is None
        counters = [engine.observer.counter for engine in backend.driver.engines]
        assert any(c.offered > c.exported + c.total for c in counters)  # an export still unanswered
    finally:
        receiver.resume()
        close_shared(endpoint)


def test_serve_s_simulator_ends_with_final_counts_and_every_rank_span_delivered(receiver, monkeypatch):
    # Wherever `serve` runs the simulator (this process, or a child process of its own), a traced run ends
    # with the ranks' counts final, and every rank span of every round at the collector.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    ns = telemetry_ns("--otlp-endpoint", receiver.endpoint, "--trace-sample-rate", "1.0", "--no-otlp-metrics")
    ns.pace, ns.processes, ns.no_progress = None, False, True
    args = sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    workload = Workload(ClosedLoop(4), dp_size=2, prompt=Fixed(100), output=Fixed(30), limit=16, seed=1)
    controller = Controller(args, build_backend(args, workload, ns, "serve-final"), run_id="serve-final")
    records = []
    controller.listeners.append(records.append)
    out = io.StringIO()
    assert asyncio.run(run_serve(controller, ns, [attach_telemetry], out=out)) == 0
    status = trace_status(controller)
    assert status.ranks_final and status.spans_dropped == 0, out.getvalue()
    rank_spans = [span for _, span in receiver.spans() if span.name in ("gate.round", "plan", "all-gather", "forward")]
    assert len(rank_spans) == len(records) * 2 * 4 > 0
    assert "not final" not in out.getvalue() and "spans dropped 0 (ranks 0;" in out.getvalue()


def test_a_simulator_process_s_refused_spans_are_all_in_the_run_s_final_count(receiver, monkeypatch):
    # Issue 14, session 3: a bench log line "4 of 67,588 spans refused (queue full)" was read as a
    # simulator child's loss that its run's status missed (it was the exporter-capacity section's shipper,
    # whose producer fills the queue on purpose). The property itself, through `serve`'s child process:
    # a queue too small for the run refuses spans, and every rank span is either at the collector or in
    # the final count, exactly.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    ns = telemetry_ns("--otlp-endpoint", receiver.endpoint, "--trace-sample-rate", "1.0", "--no-otlp-metrics")
    ns.pace, ns.processes, ns.no_progress = None, False, True
    args = sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    run_id = "child-refusals"
    observer, kwargs = rank_observer_spec(ns, run_id, args.dp_size)  # type: ignore[misc]
    kwargs["queue_spans"] = 200  # 25 rounds of 2 ranks: the run outgrows it before the first export
    workload = Workload(ClosedLoop(4), dp_size=2, prompt=Fixed(100), output=Fixed(30), limit=24, seed=1)
    backend = SimProcessBackend(args, workload, observer=observer, observer_kwargs=kwargs)
    controller = Controller(args, backend, run_id=run_id)
    records = []
    controller.listeners.append(records.append)
    out = io.StringIO()
    assert asyncio.run(run_serve(controller, ns, [attach_telemetry], out=out)) == 0
    status = trace_status(controller)
    rank_spans = [span for _, span in receiver.spans() if span.name in ("gate.round", "plan", "all-gather", "forward")]
    assert status.ranks_final and status.spans_dropped_by_ranks > 0 and rank_spans, out.getvalue()
    assert len(rank_spans) + status.spans_dropped_by_ranks == len(records) * 2 * 4
    assert status.spans_dropped == status.spans_dropped_by_ranks  # the controller's own spans all arrived


@pytest.mark.parametrize("collector", ["never up", "hung"])
def test_a_simulator_process_s_final_counts_are_final_whatever_the_collector_did(receiver, monkeypatch, collector):
    # Session 6: a short traced run against a collector that was never up ended "ranks 0, not final": the
    # simulator's process flushed for 2 s while its exporter retried for 5 s, so it reported no final count.
    # That process ends with the run, as a rank process does: it closes its observers (what is still queued
    # counts as refused, an export in flight as unconfirmed) and its counts are final, with every rank span
    # of every round either at the collector or in them.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    if collector == "hung":
        endpoint = receiver.endpoint
        receiver.hang()
    else:
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            endpoint = f"127.0.0.1:{probe.getsockname()[1]}"
    ns = telemetry_ns("--otlp-endpoint", endpoint, "--trace-sample-rate", "1.0", "--no-otlp-metrics")
    ns.pace, ns.processes, ns.no_progress = None, False, True
    args = sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    run_id = f"child-final-{collector.replace(' ', '-')}"
    observer, kwargs = rank_observer_spec(ns, run_id, args.dp_size)  # type: ignore[misc]
    workload = Workload(ClosedLoop(4), dp_size=2, prompt=Fixed(100), output=Fixed(30), limit=8, seed=1)
    controller = Controller(args, SimProcessBackend(args, workload, observer=observer, observer_kwargs=kwargs))
    records = []
    controller.listeners.append(records.append)
    out = io.StringIO()
    try:
        assert asyncio.run(run_serve(controller, ns, [attach_telemetry], out=out)) == 0
    finally:
        receiver.resume()
    status = trace_status(controller)
    delivered = [span for _, span in receiver.spans() if span.name in ("gate.round", "plan", "all-gather", "forward")]
    assert status.ranks_final and "not final" not in out.getvalue(), out.getvalue()
    assert status.spans_dropped_by_ranks == len(records) * 2 * 4 > 0  # none acknowledged: all counted
    if collector == "never up":
        assert delivered == []  # (a hung collector may hold some: counted as unconfirmed, as they are)
