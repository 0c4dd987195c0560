"""What tracing did and is doing, in one value: sampling decisions, spans lost, the exporter's health.

The closing summary, `ctl snapshot` (through `RunStats.tracing`), the console header and the metrics
all read `trace_status(controller)`, so they cannot disagree. A span counts as dropped when it was not
confirmed delivered: refused (the queue was full), failed (the collector answered an error or could
not be reached) or unconfirmed (no answer within the export deadline).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from control.telemetry.telemetry_cli import TelemetryBackend, exporter_health, rank_spans_dropped
from control.telemetry.trace_export import DropCounter
from prefill_gate.v1 import tracing_pb2

if TYPE_CHECKING:
    from control.host.controller import Controller


@dataclass(frozen=True, slots=True)
class TraceStatus:
    """Tracing's figures at one moment (all zero and `enabled` False when tracing is off)."""

    enabled: bool = False
    endpoint: str = ""
    sample_rate: float = 0.0
    window_sample_rate: float = 0.0
    request_spans_per_s: float = 0.0
    rounds_seen: int = 0
    rounds_traced: int = 0
    rounds_traced_by_reason: dict[str, int] = field(default_factory=dict)
    requests_traced: int = 0
    requests_untraced: int = 0
    spans_dropped: int = 0  # ranks and controller together
    spans_dropped_by_ranks: int = 0
    ranks_final: bool = False
    exporter_state: str = "off"
    exporter_detail: str = ""
    exporter_queued: int = 0
    process: DropCounter = field(default_factory=DropCounter)  # the controller process's shipper, all producers

    @property
    def traced_share(self) -> float | None:
        """Rounds traced over rounds seen."""
        return self.rounds_traced / self.rounds_seen if self.rounds_seen else None

    def as_proto(self) -> tracing_pb2.TracingStatus:
        """The contract's form (`RunStats.tracing`), what `ctl snapshot` and the console read."""
        process = self.process
        return tracing_pb2.TracingStatus(
            enabled=self.enabled,
            endpoint=self.endpoint,
            sample_rate=self.sample_rate,
            window_sample_rate=self.window_sample_rate,
            request_spans_per_second=self.request_spans_per_s,
            rounds_seen=self.rounds_seen,
            rounds_traced=self.rounds_traced,
            rounds_traced_by_reason=self.rounds_traced_by_reason,
            requests_traced=self.requests_traced,
            requests_untraced=self.requests_untraced,
            spans_dropped=self.spans_dropped,
            spans_dropped_by_ranks=self.spans_dropped_by_ranks,
            ranks_final=self.ranks_final,
            exporter_state=self.exporter_state,
            exporter_detail=self.exporter_detail,
            exporter_queued=self.exporter_queued,
            spans_offered=process.offered,
            spans_exported=process.exported,
            spans_refused=process.refused,
            spans_failed=process.failed,
            spans_unconfirmed=process.unconfirmed,
        )


def trace_status(controller: Controller) -> TraceStatus:
    """The status of the controller's tracing now."""
    backend = controller.backend
    if not isinstance(backend, TelemetryBackend) or backend.tracer is None:
        return TraceStatus()
    tracer = backend.tracer
    settings = backend.settings
    by_ranks, final = rank_spans_dropped(controller)
    health = exporter_health(controller)
    return TraceStatus(
        enabled=True,
        endpoint=settings.endpoint.url if settings.endpoint is not None else "",
        sample_rate=settings.sample_rate,
        window_sample_rate=settings.window_sample_rate,
        request_spans_per_s=settings.request_rate,
        rounds_seen=tracer.rounds_seen,
        rounds_traced=tracer.traced_rounds,
        rounds_traced_by_reason=dict(tracer.traced_by_reason),
        requests_traced=tracer.requests,
        requests_untraced=tracer.requests_untraced,
        spans_dropped=by_ranks + tracer.dropped,
        spans_dropped_by_ranks=by_ranks,
        ranks_final=final,
        exporter_state=health.state if health is not None else "off",
        exporter_detail=health.detail if health is not None else "",
        exporter_queued=health.queued if health is not None else 0,
        process=health.totals if health is not None else DropCounter(),
    )


def summary_lines(status: TraceStatus) -> list[str]:
    """The closing summary's tracing lines (none when tracing was off)."""
    if not status.enabled:
        return []
    share = f"{status.traced_share:.1%}" if status.traced_share is not None else "-"
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(status.rounds_traced_by_reason.items()))
    lines = [
        f"  tracing to {status.endpoint}: rounds traced {status.rounds_traced}/{status.rounds_seen} ({share}"
        f"{': ' + reasons if reasons else ''})  requests traced {status.requests_traced}, untraced over "
        f"{status.request_spans_per_s:g}/s {status.requests_untraced}",
    ]
    process = status.process
    dropped = f"  spans dropped {status.spans_dropped} (ranks {status.spans_dropped_by_ranks}"
    dropped += "" if status.ranks_final else ", not final: some rank did not report after its flush"
    dropped += (
        f"; this process: queue full {process.refused}, failed {process.failed}, unconfirmed "
        f"{process.unconfirmed}, exported {process.exported} of {process.offered})  exporter {status.exporter_state}"
    )
    if status.exporter_detail:
        dropped += f": {status.exporter_detail}"
    lines.append(("  WARNING:" + dropped[1:]) if status.spans_dropped else dropped)
    return lines
