"""Telemetry flags of `serve` and their wiring: rank observers, controller spans, metrics.

`rank_observer_spec` gives the backends the observer factory for the ranks (None when tracing is off:
then no observer is installed and the rounds pay nothing). `attach_telemetry` is a `serve` attachment:
it wraps the controller's backend so that every poll also feeds the controller's spans and the
metrics, and returns the coroutine that flushes and stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from control.host.backends import Backend, Polled
from control.telemetry.trace_controller import REQUEST_SPANS_PER_S, ControllerTracer
from control.telemetry.trace_export import (
    ExporterHealth,
    OtlpEndpoint,
    SpanShipper,
    close_shared,
    parse_otlp_endpoint,
    shared_shipper,
)
from control.telemetry.tracing import forget_run
from engine.config import PrefillDelay
from engine.request import RequestSpec

if TYPE_CHECKING:
    from control.host.controller import Controller

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
# Sized for the harshest case, the in-process simulator (~2,000 rounds/s, every rank in one interpreter):
# +2.0% to +2.2% of its round rate in paired runs (bench/results/tracing.md, session 5), where the previous
# 0.01 (windows 0.05) cost +4.0% to +8.2% on the code path of then. Still ~10 traced rounds a second there;
# an engine with real forwards (tens of ms a round) can afford far higher rates.
DEFAULT_SAMPLE_RATE = 0.005
# Window-open rounds are up to a quarter of busy rounds at A=4: tracing each of them cost the simulator ~30%
# of its round rate. At this rate they add at most ~0.5% of rounds to the ordinary 0.5%.
DEFAULT_WINDOW_SAMPLE_RATE = 0.02
RANK_OBSERVER = "control.telemetry.tracing:rank_observer"
_log = logging.getLogger("prefill_gate.telemetry")


def add_telemetry_args(parser: argparse.ArgumentParser) -> None:
    """--otlp-endpoint, --trace-sample-rate, --no-otlp-metrics, --metrics-port, --metrics-addr."""
    group = parser.add_argument_group("telemetry")
    group.add_argument(
        "--otlp-endpoint",
        default=None,
        help=f"OTLP/gRPC collector for traces and metrics, e.g. http://localhost:4317 (Jaeger); default: "
        f"${ENDPOINT_ENV}, else tracing is off",
    )
    group.add_argument(
        "--trace-sample-rate",
        type=float,
        default=DEFAULT_SAMPLE_RATE,
        help="share of rounds traced; rounds that change config or cross the watermark are always traced "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--trace-window-sample-rate",
        type=float,
        default=DEFAULT_WINDOW_SAMPLE_RATE,
        help="share of the rounds whose vote opened a prefill window that are traced (at least "
        "--trace-sample-rate; default: %(default)s)",
    )
    group.add_argument(
        "--trace-request-rate",
        type=float,
        default=REQUEST_SPANS_PER_S,
        help="request spans per second at most (a token bucket); the rest are counted as untraced "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--no-otlp-metrics",
        dest="otlp_metrics",
        action="store_false",
        help="send only traces to the OTLP endpoint (Jaeger takes no metrics); Prometheus is unaffected",
    )
    group.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    group.add_argument(
        "--metrics-addr", default="127.0.0.1", help="metrics endpoint address (default: %(default)s, loopback)"
    )


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """The telemetry flags, validated."""

    endpoint: OtlpEndpoint | None
    sample_rate: float
    metrics_port: int | None
    metrics_addr: str
    otlp_metrics: bool = True
    window_sample_rate: float = DEFAULT_WINDOW_SAMPLE_RATE
    request_rate: float = REQUEST_SPANS_PER_S

    @property
    def tracing(self) -> bool:
        """Whether spans are exported at all."""
        return self.endpoint is not None

    @property
    def metrics_endpoint(self) -> OtlpEndpoint | None:
        """Where metrics are pushed over OTLP, if anywhere."""
        return self.endpoint if self.otlp_metrics else None

    @property
    def metrics(self) -> bool:
        """Whether metrics are kept (scraped or pushed)."""
        return self.metrics_port is not None or self.metrics_endpoint is not None


def telemetry_settings(ns: argparse.Namespace, environ: dict[str, str] | None = None) -> TelemetrySettings:
    """Validate the flags; raises ValueError naming the flag (or environment variable) at fault."""
    env = os.environ if environ is None else environ
    flag = getattr(ns, "otlp_endpoint", None)
    if flag is not None:
        endpoint = parse_otlp_endpoint(flag, "--otlp-endpoint")
    elif env.get(ENDPOINT_ENV):
        endpoint = parse_otlp_endpoint(env[ENDPOINT_ENV], ENDPOINT_ENV)
    else:
        endpoint = None
    rates = {}
    for flag, default in (
        ("trace_sample_rate", DEFAULT_SAMPLE_RATE),
        ("trace_window_sample_rate", DEFAULT_WINDOW_SAMPLE_RATE),
    ):
        rate = getattr(ns, flag, default)
        if not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:  # NaN fails both comparisons
            raise ValueError(f"--{flag.replace('_', '-')} must be in [0, 1], got {rate!r}")
        rates[flag] = float(rate)
    request_rate = getattr(ns, "trace_request_rate", REQUEST_SPANS_PER_S)
    if not isinstance(request_rate, int | float) or not 0.0 <= request_rate <= 1e9:
        raise ValueError(f"--trace-request-rate must be in [0, 1e9] spans/s, got {request_rate!r}")
    port = getattr(ns, "metrics_port", None)
    if port is not None and not 0 <= port <= 65535:
        raise ValueError(f"--metrics-port must be in [0, 65535] (0: any free port), got {port}")
    addr = getattr(ns, "metrics_addr", "127.0.0.1")
    return TelemetrySettings(
        endpoint,
        rates["trace_sample_rate"],
        port,
        addr,
        bool(getattr(ns, "otlp_metrics", True)),
        max(rates["trace_window_sample_rate"], rates["trace_sample_rate"]),
        float(request_rate),
    )


def rank_observer_spec(ns: argparse.Namespace, run_id: str, dp_size: int) -> tuple[str, dict[str, Any]] | None:
    """The round observer factory and its kwargs for the backends; None when tracing is off.

    Raises ValueError on a malformed endpoint or rate, so a bad flag stops `serve` before any rank starts.
    """
    settings = telemetry_settings(ns)
    if settings.endpoint is None:
        return None
    kwargs: dict[str, Any] = {
        "endpoint": settings.endpoint.url,
        "run_id": run_id,
        "sample_rate": settings.sample_rate,
        "window_sample_rate": settings.window_sample_rate,
    }
    return RANK_OBSERVER, kwargs


class Sink(Protocol):
    """Something fed from every poll of the backend (controller spans, metrics)."""

    def submitted(self, rank: int, spec: RequestSpec) -> None: ...
    def polled(self, polled: Polled) -> None: ...


class TelemetryBackend:
    """The controller's backend with telemetry sinks watching it; everything else passes through.

    A sink that raises is logged and skipped: telemetry must never stop the engine.
    """

    def __init__(
        self,
        inner: Backend,
        sinks: list[Sink],
        settings: TelemetrySettings,
        tracer: ControllerTracer | None = None,
        shipper: SpanShipper | None = None,
    ) -> None:
        self.inner = inner
        self.sinks = sinks
        self.dp_size = inner.dp_size
        self.settings = settings
        self.tracer = tracer
        self.shipper = shipper
        self._reported_final: dict[int, int] = {}  # rank observers' final counts, as a poll reported them

    def __getattr__(self, name: str) -> Any:  # feeder, driver, args ... of the wrapped backend
        return getattr(self.inner, name)

    @property
    def observer_dropped(self) -> dict[int, int]:
        """Each rank observer's final drop count: as the backend keeps it (rank processes that exited,
        a simulator in this process), else as the run's last poll reported it (one in another process)."""
        return {**self._reported_final, **(getattr(self.inner, "observer_dropped", None) or {})}

    @property
    def controller_spans_dropped(self) -> int:
        """Spans the controller (round roots, requests) could not export."""
        return self.tracer.dropped if self.tracer is not None else 0

    def start(self) -> None:
        self.inner.start()

    def submit(self, rank: int, spec: RequestSpec) -> None:
        self._feed("submitted", rank, spec)
        self.inner.submit(rank, spec)

    def abort(self, rank: int, rid: str) -> None:
        self.inner.abort(rank, rid)

    def propose(self, epoch: int, delay: PrefillDelay | None) -> None:
        self.inner.propose(epoch, delay)

    def request_stop(self) -> None:
        self.inner.request_stop()

    def poll(self) -> Polled:
        polled = self.inner.poll()
        if polled.observer_dropped is not None:
            self._reported_final.update(polled.observer_dropped)
        if polled.records or polled.events or polled.submitted or polled.itl or polled.stopped:
            self._feed("polled", polled)
        return polled

    def records_dropped(self) -> int:
        return self.inner.records_dropped()

    def now(self) -> float:
        return self.inner.now()

    def close(self) -> None:
        self.inner.close()

    def _feed(self, method: str, *args: Any) -> None:
        for sink in self.sinks:
            try:
                getattr(sink, method)(*args)
            except Exception:
                _log.exception("telemetry sink %s failed; the engine continues", type(sink).__name__)


def rank_spans_dropped(controller: Controller) -> tuple[int, bool]:
    """Every rank's spans not delivered, and whether each count is final.

    A rank's row carries its count as of that round; a rank that flushed and exited (or one in this
    process, the simulator's) reports its count to the backend, which is then exact.
    """
    rows = controller.latest.rows if controller.latest is not None else ()
    final: dict[int, int] = dict(getattr(controller.backend, "observer_dropped", None) or {})
    total = 0
    for rank in range(controller.backend.dp_size):
        from_row = rows[rank].spans_dropped if rank < len(rows) else 0
        total += max(from_row, final.get(rank, from_row))
    return total, len(final) == controller.backend.dp_size


def trace_spans_dropped(controller: Controller) -> int:
    """Spans lost in all: every rank's count plus the controller's; 0 when tracing is off.

    What `RunStats.trace_spans_dropped` shows.
    """
    backend = controller.backend
    if not isinstance(backend, TelemetryBackend) or backend.tracer is None:
        return 0
    return rank_spans_dropped(controller)[0] + backend.controller_spans_dropped


def exporter_health(controller: Controller) -> ExporterHealth | None:
    """The controller process's span exporter, when tracing is on."""
    backend = controller.backend
    if isinstance(backend, TelemetryBackend) and backend.shipper is not None:
        return backend.shipper.health()
    return None


def startup_line(settings: TelemetrySettings, metrics_port: int | None) -> str:
    """What `serve` says at start: where traces and metrics go, and how to turn the OTLP metrics off."""
    parts = []
    if settings.endpoint is not None:
        parts.append(
            f"traces to {settings.endpoint.url} (sample rate {settings.sample_rate:g}, window-open rounds "
            f"{settings.window_sample_rate:g}, requests <= {settings.request_rate:g}/s)"
        )
    if settings.metrics_endpoint is not None:
        parts.append(
            f"metrics pushed over OTLP to {settings.metrics_endpoint.url} every 10 s "
            "(--no-otlp-metrics for a traces-only collector such as Jaeger)"
        )
    if metrics_port is not None:
        parts.append(f"metrics on http://{settings.metrics_addr}:{metrics_port}/metrics")
    return "telemetry: " + ", ".join(parts)


async def attach_telemetry(controller: Controller, ns: argparse.Namespace) -> Callable[[], Awaitable[None]]:
    """`serve` attachment: controller root and request spans, and metrics, as the flags ask."""
    settings = telemetry_settings(ns)
    sinks: list[Sink] = []
    tracer = None
    shipper = None
    metrics = None
    if settings.tracing:
        assert settings.endpoint is not None
        shipper = shared_shipper(settings.endpoint)
        args = controller.args
        tracer = ControllerTracer(
            controller.run_id,
            settings.sample_rate,
            shipper,
            dp_size=controller.backend.dp_size,
            virtual_clock=args.executor == "sim",
            window_sample_rate=settings.window_sample_rate,
            model=f"sim/{args.sim_preset}" if args.executor == "sim" else "prefill-gate-moe",
            request_spans_per_s=settings.request_rate,
            origin_of=controller.origin_of,
            rank_rule_spans=bool(getattr(controller.backend, "rule_rounds_to_controller", False)),
        )
        sinks.append(tracer)
    if settings.metrics:
        from control.telemetry.otel_metrics import GateMetrics
        from control.telemetry.trace_status import trace_status

        metrics = GateMetrics(
            run_id=controller.run_id,
            dp_size=controller.backend.dp_size,
            metrics_port=settings.metrics_port,
            metrics_addr=settings.metrics_addr,
            otlp=settings.metrics_endpoint,
            tracing=(lambda: trace_status(controller)) if settings.tracing else None,
            origin_of=controller.origin_of,
        )
        sinks.append(metrics)
    if sinks:
        controller.backend = TelemetryBackend(controller.backend, sinks, settings, tracer, shipper)
        print(startup_line(settings, metrics.port if metrics is not None else None), file=sys.stderr, flush=True)

    async def stop() -> None:
        loop = asyncio.get_running_loop()
        if tracer is not None:
            tracer.close()
            forget_run(controller.run_id)
        if metrics is not None:
            await loop.run_in_executor(None, metrics.close)
        if settings.endpoint is not None:
            # Flushing waits on the collector: off the event loop, and bounded.
            await loop.run_in_executor(None, close_shared, settings.endpoint, 2.0)

    return stop
