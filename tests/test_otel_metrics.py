"""Metrics: a Prometheus scrape during a run, parity with the run summary, OTLP metric export, promtool's
verdict on the scrape, and a contract with the shipped dashboard and alert rules (dynamo#7123)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from control.host.backends import SimBackend
from control.host.controller import Controller
from control.telemetry.telemetry_cli import ENDPOINT_ENV, attach_telemetry, rank_observer_spec
from tests.helpers import sim_args
from tests.otlp_receiver import OtlpReceiver
from tests.test_tracing import telemetry_ns
from workloads import ClosedLoop, Fixed, Workload

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "prefill-gate.json"
RULES = ROOT / "docs" / "prometheus" / "prefill_gate_alerts.yml"
RULE_TESTS = ROOT / "docs" / "prometheus" / "prefill_gate_alerts_test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; `make tools` installs it)"
)
Samples = dict[str, list[tuple[dict[str, str], float]]]


def fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def parse(text: str) -> Samples:
    """Sample name -> [(labels, value)] of one scrape."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def scrape(port: int) -> Samples:
    """One scrape, parsed."""
    return parse(fetch(port))


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for got, v in samples.get(name, []) if all(got.get(k) == x for k, x in labels.items()))


@dataclass
class Run:
    """Three scrapes of one traced, metered run and what the run itself reported."""

    first: str
    second: str
    final: str
    controller: Controller
    receiver: OtlpReceiver


@pytest.fixture(scope="module")
def run() -> Any:
    # A 3-rank simulator with a small pool (retractions, the watermark), traced at the defaults, metrics
    # scraped and pushed over OTLP to a real receiver.
    mp = pytest.MonkeyPatch()
    mp.delenv(ENDPOINT_ENV, raising=False)
    receiver = OtlpReceiver().start()
    args = sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6, kv_pages=96)
    workload = Workload(ClosedLoop(12), dp_size=3, prompt=Fixed(300), output=Fixed(60), seed=2)
    ns = telemetry_ns("--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--otlp-endpoint", receiver.endpoint)
    observer, kwargs = rank_observer_spec(ns, "metrics-run", 3)  # type: ignore[misc]
    backend = SimBackend(args, workload, pace=2.0, observer=observer, observer_kwargs=kwargs)
    controller = Controller(args, backend, run_id="metrics-run", stop_when_idle=False)

    async def go() -> Run:
        controller.start()
        stop = await attach_telemetry(controller, ns)
        runner = asyncio.create_task(controller.run())
        port = controller.backend.sinks[-1].port
        loop = asyncio.get_running_loop()
        try:
            first = await loop.run_in_executor(None, fetch, port)
            # Until tokens flowed and the rules picked rounds (not a fixed sleep: a loaded machine is slow).
            itl_before, deadline = total(parse(first), "prefill_gate_itl_seconds_count"), time.monotonic() + 60.0
            while True:
                await asyncio.sleep(0.2)
                second = await loop.run_in_executor(None, fetch, port)
                moved = total(parse(second), "prefill_gate_itl_seconds_count") > itl_before
                if (moved and controller.backend.tracer.traced_rounds > 0) or time.monotonic() > deadline:
                    break
            controller.request_stop()
            await runner
            final = await loop.run_in_executor(None, fetch, port)
        finally:
            await stop()
        return Run(first, second, final, controller, receiver)

    try:
        yield asyncio.run(go())
    finally:
        receiver.stop()
        mp.undo()


def test_prometheus_scrape_moves_and_matches_the_run_summary(run: Run):
    # Counters moved between scrapes, one occupancy series per dp_rank. After the run the counters equal
    # the summary's figures (a dashboard and the summary agree), and the OTLP receiver got the metrics.
    first, second, final = parse(run.first), parse(run.second), parse(run.final)
    controller = run.controller
    assert total(second, "prefill_gate_rounds_total") > total(first, "prefill_gate_rounds_total")
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

    tracer = controller.backend.tracer
    assert total(final, "prefill_gate_trace_rounds_sampled_total") == tracer.traced_rounds > 0
    assert total(final, "prefill_gate_trace_spans_dropped_total") == 0
    assert total(final, "prefill_gate_trace_exporter_up") == 1
    pushed = {
        metric.name
        for request in run.receiver.metric_requests
        for resource_metrics in request.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    }
    assert {"prefill_gate_rounds", "prefill_gate_occupancy_ratio", "prefill_gate_ttft"} <= pushed


def test_counter_series_exist_at_zero_and_carry_no_empty_scope_labels(run: Run):
    # Issue 14 item 7: every counter series from the first scrape (retractions of every rank before any
    # retraction), no otel_scope_* labels, names with unit suffixes and no repeated word.
    first = parse(run.first)
    assert sorted(labels["dp_rank"] for labels, _ in first["prefill_gate_retractions_total"]) == ["0", "1", "2"]
    assert {labels["point"] for labels, _ in first["prefill_gate_windows_opened_total"]} == {"ANY", "ALL"}
    assert len(first["prefill_gate_rounds_total"]) == 9  # every point x outcome
    for name in ("prefill_gate_extend_rounds_total", "prefill_gate_output_tokens_total"):
        assert name in first
    reasons = {labels["reason"] for labels, _ in first["prefill_gate_trace_rounds_sampled_total"]}
    assert reasons == {"config", "watermark", "open", "ratio"}
    for samples in parse(run.final).values():
        for labels, _ in samples:
            assert not any(key.startswith("otel_scope") for key in labels)
    names = set(parse(run.final))
    assert not any("gate_gate" in name for name in names) and "prefill_gate_occupancy" not in names


def metric_names(expression: str) -> set[str]:
    """prefill_gate_* series a PromQL expression reads (recording-rule names, with a colon, excluded)."""
    return set(re.findall(r"(?<![:\w])(prefill_gate_[a-z_]+)", expression))


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def test_dashboard_and_alert_rules_read_only_series_the_scrape_has(run: Run):
    # A dashboard or an alert that reads a series nobody emits shows nothing and never fires.
    scraped = set(parse(run.final))
    expressions = dashboard_expressions() + re.findall(r"expr: (.+)", RULES.read_text())
    expressions += re.findall(r"expr: \|\n((?:\s{10,}.+\n)+)", RULES.read_text())
    read = set().union(*(metric_names(e) for e in expressions))
    assert len(read) >= 14
    assert sorted(read - scraped) == []
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)  # Grafana needs unique panel ids


@needs_promtool
def test_promtool_accepts_the_scrape(run: Run, tmp_path: Path):
    # `promtool check metrics` lints the exposition: names, suffixes, HELP/TYPE; it prints nothing when clean.
    for text in (run.first, run.final):
        result = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result


@needs_promtool
def test_alert_rules_pass_their_unit_tests_and_dashboard_queries_parse(tmp_path: Path):
    # The alerting rules' promtool unit tests (firing and quiet cases of each alert), and every dashboard
    # query parsed by Prometheus' own parser (as recording rules, with Grafana's variables filled in).
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "1m").replace("$instance", ".*")}
        for i, expr in enumerate(dashboard_expressions())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
