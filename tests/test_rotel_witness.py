"""A collector nobody here wrote reads our traces: rotel (pip `rotel`, a dev extra) with its debug log."""

from __future__ import annotations

import asyncio
import io
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from control.host.backends import SimBackend
from control.host.controller import Controller
from control.host.serve import run_serve
from control.telemetry.telemetry_cli import ENDPOINT_ENV, attach_telemetry, rank_observer_spec
from engine.drivers.procs import free_port
from tests.helpers import sim_args
from tests.test_tracing import telemetry_ns
from workloads import ClosedLoop, Fixed, Workload

rotel = pytest.importorskip("rotel", reason="rotel not installed (pip install -e '.[dev]' installs it)")
AGENT = Path(rotel.__file__).parent / "rotel-agent"


def wait_listening(port: int, process: subprocess.Popen, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, "rotel exited"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            assert time.monotonic() < deadline, "rotel did not listen"
            time.sleep(0.05)


@pytest.mark.skipif(not AGENT.exists(), reason="the rotel package has no agent binary for this platform")
def test_rotel_receives_every_span_we_count_as_exported(tmp_path: Path, monkeypatch):
    # A traced simulator run exports to rotel: its debug log shows every span our counters call exported
    # (not one more, not one less), the request spans as SERVER with the GenAI attributes.
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    port = free_port()
    log = (tmp_path / "rotel.log").open("w")
    agent = subprocess.Popen(
        [
            str(AGENT),
            "start",
            f"--otlp-grpc-endpoint=127.0.0.1:{port}",
            f"--otlp-http-endpoint=127.0.0.1:{free_port()}",
            "--exporter=blackhole",
            "--debug-log=traces",
            "--debug-log-verbosity=detailed",
            "--otlp-receiver-metrics-disabled",
            "--otlp-receiver-logs-disabled",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_listening(port, agent)
        ns = telemetry_ns("--otlp-endpoint", f"http://127.0.0.1:{port}", "--trace-sample-rate", "0.5")
        ns.otlp_metrics = False  # rotel here takes traces only
        ns.no_progress = True
        args = sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
        observer, kwargs = rank_observer_spec(ns, "rotel-run", 2)  # type: ignore[misc]
        workload = Workload(ClosedLoop(4), dp_size=2, prompt=Fixed(120), output=Fixed(12), limit=12, seed=6)
        backend = SimBackend(args, workload, observer=observer, observer_kwargs=kwargs)
        controller = Controller(args, backend, run_id="rotel-run")
        assert asyncio.run(run_serve(controller, ns, [attach_telemetry], out=io.StringIO())) == 0
        exported = sum(e.observer.counter.exported for e in backend.driver.engines)
        exported += controller.backend.tracer.counter.exported
        assert exported > 0
        text = ""
        deadline = time.monotonic() + 20
        while len(re.findall(r"^Span #", text, re.M)) < exported:  # rotel prints after it answered us
            assert time.monotonic() < deadline, (exported, text[-2000:])
            time.sleep(0.05)
            text = (tmp_path / "rotel.log").read_text()
    finally:
        agent.terminate()
        agent.wait(10)
        log.close()
    assert len(re.findall(r"^Span #", text, re.M)) == exported
    assert text.count("Kind           : SPAN_KIND_SERVER") == 12  # one per request
    assert "gen_ai.usage.input_tokens: Int(120)" in text
    assert "gen_ai.response.finish_reasons: Slice(Str(length))" in text
    assert "-> prefill_gate.rank: Int(1)" in text and "-> service.version: Str(" in text
