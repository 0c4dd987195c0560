"""The gate's metrics through the OpenTelemetry SDK: OTLP export and a Prometheus scrape endpoint.

Names are `prefill_gate_*`; per-rank series carry a `dp_rank` attribute (as SGLang and TokenSpeed
label theirs). They count exactly what `engine.metrics.RunMetrics` counts, so a dashboard and the
run summary agree: windows and the extend path are counted on busy rounds only.

| metric (as Prometheus shows it)              | kind      | attributes       |
| -------------------------------------------- | --------- | ---------------- |
| prefill_gate_rounds_total                    | counter   | point, outcome   |
| prefill_gate_windows_opened_total            | counter   | point (ANY, ALL) |
| prefill_gate_extend_rounds_total             | counter   |                  |
| prefill_gate_retractions_total               | counter   | dp_rank          |
| prefill_gate_output_tokens_total             | counter   |                  |
| prefill_gate_gate_wait_rounds                | histogram |                  |
| prefill_gate_gate_wait_seconds               | histogram |                  |
| prefill_gate_ttft_seconds                    | histogram |                  |
| prefill_gate_itl_seconds                     | histogram |                  |
| prefill_gate_occupancy                       | gauge     | dp_rank          |
| prefill_gate_trace_spans_dropped_total       | counter   |                  |
| prefill_gate_config_changes_total            | counter   | by               |

Counters are summed per poll before they reach the SDK (an `add` costs ~5 us, a poll holds many
rounds). ITL is one observation per group of a rank's requests whose tokens came the same time apart
(what a rank reports per round), not one per token: a per-token `record` (~2.4 us) at the simulator's
~250k tokens/s would cost more than half a core. `prefill_gate_output_tokens_total` counts the tokens.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource

from control.host.backends import Polled
from control.telemetry.trace_export import OtlpEndpoint
from engine.gate import GatePoint
from engine.record import RoundRecord
from engine.request import Admitted, Finished, FirstToken, Refused, RequestSpec, Retracted
from engine.rows import Row, all_idle
from prefill_gate.convert import OriginOf

WAIT_ROUND_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
MAX_ARRIVALS = 100_000  # requests whose arrival is remembered for TTFT


def round_outcome(record: RoundRecord) -> str:
    """`idle` when no rank had work (no forward ran), else whether prefill was allowed."""
    if all_idle(record.rows):
        return "idle"
    return "open" if record.open else "closed"


class GateMetrics:
    """The gate's instruments on their own `MeterProvider`, fed from the controller's polls."""

    def __init__(
        self,
        *,
        run_id: str,
        dp_size: int,
        metrics_port: int | None = None,
        metrics_addr: str = "0.0.0.0",
        otlp: OtlpEndpoint | None = None,
        export_interval_s: float = 10.0,
        export_timeout_s: float = 2.0,
        spans_dropped: Callable[[], int] | None = None,
        service_name: str = "prefill-gate",
        origin_of: OriginOf | None = None,
    ) -> None:
        readers: list[MetricReader] = []
        self._server = None
        self.port: int | None = None
        if metrics_port is not None:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry, start_http_server

            registry = CollectorRegistry()  # ours, not the global one: runs in one process never collide
            readers.append(PrometheusMetricReader(registry=registry))
            self._server, self._server_thread = start_http_server(metrics_port, metrics_addr, registry=registry)
            self.port = int(self._server.server_port)
        if otlp is not None:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            exporter = OTLPMetricExporter(endpoint=otlp.target, insecure=otlp.insecure, timeout=export_timeout_s)
            readers.append(
                PeriodicExportingMetricReader(
                    exporter,
                    export_interval_millis=export_interval_s * 1000,
                    export_timeout_millis=export_timeout_s * 1000,
                )
            )
        resource = Resource.create(
            {SERVICE_NAME: service_name, SERVICE_INSTANCE_ID: f"{run_id}/controller", "prefill_gate.run_id": run_id}
        )
        self.provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
        self.dp_size = dp_size
        self._rows: tuple[Row, ...] = ()
        self._spans_dropped = spans_dropped
        self._arrivals: dict[str, float] = {}
        meter = self.provider.get_meter("prefill_gate")
        self.rounds = meter.create_counter("prefill_gate_rounds", "{round}", "Rounds by vote point and outcome.")
        self.windows = meter.create_counter(
            "prefill_gate_windows_opened", "{round}", "Busy rounds whose vote opened a prefill window, by point."
        )
        self.extend_rounds = meter.create_counter(
            "prefill_gate_extend_rounds", "{round}", "Busy rounds on the extend path (some rank extended, F1)."
        )
        self.retractions = meter.create_counter(
            "prefill_gate_retractions", "{request}", "Requests retracted to the host tier, by rank."
        )
        self.output_tokens = meter.create_counter("prefill_gate_output_tokens", "{token}", "Output tokens produced.")
        self._origin_of = origin_of
        self.config_changes = meter.create_counter(
            "prefill_gate_config_changes", "{change}", "Config changes every rank adopted, by who made them."
        )
        self.wait_rounds = meter.create_histogram(
            "prefill_gate_gate_wait_rounds",
            "{round}",
            "Rounds an admitted prompt waited while schedulable.",
            explicit_bucket_boundaries_advisory=WAIT_ROUND_BUCKETS,
        )
        self.wait_seconds = meter.create_histogram(
            "prefill_gate_gate_wait",
            "s",
            "Seconds an admitted prompt waited while schedulable (engine clock).",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.ttft = meter.create_histogram(
            "prefill_gate_ttft",
            "s",
            "Time to first token (engine clock).",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.itl = meter.create_histogram(
            "prefill_gate_itl",
            "s",
            "Inter-token latency, one observation per group of a rank's requests with the same gap.",
            explicit_bucket_boundaries_advisory=ITL_BUCKETS,
        )
        meter.create_observable_gauge(
            "prefill_gate_occupancy", [self._occupancy], "1", "Device KV pool occupancy of each rank (0..1)."
        )
        if spans_dropped is not None:
            meter.create_observable_counter(
                "prefill_gate_trace_spans_dropped", [self._dropped], "{span}", "Trace spans that never left."
            )

    # -- inputs --------------------------------------------------------------------------------------

    def submitted(self, rank: int, spec: RequestSpec) -> None:
        """A request was handed to a rank; its arrival is the TTFT origin."""
        if len(self._arrivals) < MAX_ARRIVALS:
            self._arrivals[spec.rid] = spec.arrival

    def polled(self, polled: Polled) -> None:
        """One poll's worth of records, submissions, events and ITL samples."""
        for rank, spec in polled.submitted:
            self.submitted(rank, spec)
        if polled.records:
            self._add_records(polled.records)
        retracted: Tally[int] = Tally()
        first_tokens = 0
        for event in polled.events:
            if isinstance(event, Admitted):
                self.wait_rounds.record(event.wait_rounds)
                self.wait_seconds.record(event.wait_seconds)
            elif isinstance(event, FirstToken):
                first_tokens += 1
                arrival = self._arrivals.pop(event.rid, None)
                if arrival is not None:
                    self.ttft.record(event.time - arrival)
            elif isinstance(event, Retracted):
                retracted[event.rank] += 1
            elif isinstance(event, Finished | Refused):
                self._arrivals.pop(event.rid, None)  # ended before a first token: forget its arrival
        for rank, count in retracted.items():
            self.retractions.add(count, {"dp_rank": rank})
        tokens = first_tokens
        for seconds, count in polled.itl:
            self.itl.record(seconds)
            tokens += count
        if tokens:
            self.output_tokens.add(tokens)

    def _add_records(self, records: Sequence[RoundRecord]) -> None:
        rounds: Tally[tuple[str, str]] = Tally()
        windows: Tally[str] = Tally()
        changes: Tally[str] = Tally()
        extend = 0
        for record in records:
            outcome = round_outcome(record)
            rounds[(record.point.name, outcome)] += 1
            if record.adopted_epoch:
                origin = self._origin_of(record.adopted_epoch) if self._origin_of is not None else None
                changes[origin.changed_by if origin is not None else "unknown"] += 1
            if outcome == "idle":
                continue  # as RunMetrics: an all-idle round opens no window and runs no forward (F2)
            if not record.all_decode_or_idle:
                extend += 1
            if record.open and record.point is not GatePoint.NONE:
                windows[record.point.name] += 1
        self._rows = records[-1].rows  # the gauges show the latest round
        for (point, outcome), count in rounds.items():
            self.rounds.add(count, {"point": point, "outcome": outcome})
        for point, count in windows.items():
            self.windows.add(count, {"point": point})
        if extend:
            self.extend_rounds.add(extend)
        for by, count in changes.items():
            self.config_changes.add(count, {"by": by})

    # -- observable instruments ----------------------------------------------------------------------

    def _occupancy(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(row.occupancy, {"dp_rank": row.rank}) for row in self._rows]

    def _dropped(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._spans_dropped())] if self._spans_dropped is not None else []

    def close(self) -> None:
        """Export a last time (OTLP), stop the scrape endpoint and release the readers."""
        self.provider.shutdown()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
