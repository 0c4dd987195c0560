"""Metrics: a Prometheus scrape during a run, parity with the run summary, OTLP metric export."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from control.host.backends import SimBackend
from control.host.controller import Controller
from control.telemetry.telemetry_cli import ENDPOINT_ENV, attach_telemetry
from tests.helpers import sim_args
from tests.otlp_receiver import OtlpReceiver
from tests.test_tracing import telemetry_ns
from workloads import ClosedLoop, Fixed, Workload


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for got, v in samples.get(name, []) if all(got.get(k) == x for k, x in labels.items()))


def test_prometheus_scrape_moves_and_matches_the_run_summary(monkeypatch):
    # Two scrapes during a run: counters moved, one occupancy series per dp_rank. After the run the
    # counters equal the summary's figures (a dashboard and the summary agree), and the OTLP receiver got
    # the same metrics pushed.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    receiver = OtlpReceiver().start()
    args = sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6, kv_pages=96)
    workload = Workload(ClosedLoop(12), dp_size=3, prompt=Fixed(300), output=Fixed(60), seed=2)
    controller = Controller(args, SimBackend(args, workload, pace=2.0), stop_when_idle=False)
    # Metrics without tracing: the endpoint is set, yet no rank observer is passed to the backend.
    ns = telemetry_ns("--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--otlp-endpoint", receiver.endpoint)

    async def run() -> tuple[dict, dict, dict]:
        controller.start()
        stop = await attach_telemetry(controller, ns)
        runner = asyncio.create_task(controller.run())
        port = controller.backend.sinks[-1].port
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(0.5)
            first = await loop.run_in_executor(None, scrape, port)
            await asyncio.sleep(0.5)
            second = await loop.run_in_executor(None, scrape, port)
            controller.request_stop()
            await runner
            final = await loop.run_in_executor(None, scrape, port)
        finally:
            await stop()
        return first, second, final

    try:
        first, second, final = asyncio.run(run())
    finally:
        receiver.stop()

    assert total(second, "prefill_gate_rounds_total") > total(first, "prefill_gate_rounds_total") > 0
    assert total(second, "prefill_gate_itl_seconds_count") > total(first, "prefill_gate_itl_seconds_count")
    occupancy = second["prefill_gate_occupancy_ratio"]
    assert sorted(labels["dp_rank"] for labels, _ in occupancy) == ["0", "1", "2"]
    assert all(0.0 <= value <= 1.0 for _, value in occupancy)

    summary = controller.summary()
    assert total(final, "prefill_gate_rounds_total") == summary.rounds
    assert total(final, "prefill_gate_windows_opened_total", point="ANY") == summary.windows_any
    assert total(final, "prefill_gate_windows_opened_total", point="ALL") == summary.windows_all
    assert summary.windows_any + summary.windows_all > 0
    assert total(final, "prefill_gate_extend_rounds_total") == summary.extend_rounds
    assert total(final, "prefill_gate_retractions_total") == summary.retractions
    assert total(final, "prefill_gate_output_tokens_total") == summary.output_tokens
    assert total(final, "prefill_gate_ttft_seconds_count") == controller.metrics.first_tokens > 0
    assert total(final, "prefill_gate_wait_rounds_count") > 0
    assert total(final, "prefill_gate_rounds_total", point="ANY", outcome="open") == summary.windows_any

    pushed = {
        metric.name
        for request in receiver.metric_requests
        for resource_metrics in request.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    }
    assert {"prefill_gate_rounds", "prefill_gate_occupancy_ratio", "prefill_gate_ttft"} <= pushed
