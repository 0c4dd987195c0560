"""The controller's spans: the root of every traced round, and one span per request.

The root span of round r carries the gathered decision and uses the span id every rank derived as the
parent of its `gate.round` span, so each traced round is one tree with no missing parent. A request
span runs from arrival to finish, with events for admission, each prefill chunk, first token and
retractions, the gate wait and TTFT as attributes, and links to its rank's `gate.round` spans of the
traced rounds it was resident in. Up to `REQUEST_SPANS_PER_S` requests a second are traced (each one
at a real engine's request rates); the rest are counted in `requests_untraced`.

Times: rank spans are wall-clock; request events carry rounds, so they are placed at their round's wall
time (rank 0's record stamp). A request span is built once the records of its last round arrived
(records and events travel on different queues from rank processes), or after a second at most.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME
from opentelemetry.sdk.trace import Event
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from control.host.backends import Polled
from control.telemetry.trace_export import DropCounter, SpanShipper
from control.telemetry.tracing import (
    DEFAULT_SERVICE,
    RoundSampler,
    make_span,
    new_span_id,
    rank_span_id,
    request_trace_id,
    resource_of,
    round_trace_id,
    span_context,
)
from engine.record import RoundRecord
from engine.request import Admitted, ChunkPlanned, Finished, FirstToken, Refused, RequestSpec, Retracted
from prefill_gate.convert import OriginOf

MAX_LINKS = 64  # the first chunks and the earliest decode rounds; a long request would otherwise carry hundreds
MAX_EVENTS = 128
ROUND_MEMORY = 16384  # rounds whose wall time and sampling the controller remembers
MAX_LIVE_REQUESTS = 100_000
READY_AFTER_S = 1.0
# Request spans per second at most (a token bucket, as Jaeger's rate-limiting sampler): a real engine
# serves far fewer, so each is traced; the simulator finishes thousands a second, and each costs ~80 us
# to encode on the process that also steps the simulated ranks.
REQUEST_SPANS_PER_S = 100.0
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


@dataclass
class _RequestTrace:
    """What the controller learned of one request so far."""

    rid: str
    rank: int
    arrival: float  # engine clock
    start_ns: int
    spec: RequestSpec
    events: list[tuple[str, int, int, dict[str, object]]] = field(default_factory=list)  # name, round, seen, attrs
    chunks: list[int] = field(default_factory=list)
    admitted: Admitted | None = None
    first_token: FirstToken | None = None
    retractions: int = 0
    end_round: int | None = None
    end_seen_ns: int = 0
    reason: str = ""
    error: str | None = None


class ControllerTracer:
    """Builds and exports the controller's spans from what the backend produced (`polled`) and submits."""

    def __init__(
        self,
        run_id: str,
        sample_rate: float,
        shipper: SpanShipper,
        *,
        dp_size: int,
        virtual_clock: bool,
        service_name: str = DEFAULT_SERVICE,
        request_spans_per_s: float = REQUEST_SPANS_PER_S,
        origin_of: OriginOf | None = None,
    ) -> None:
        self.run_id = run_id
        self.origin_of = origin_of  # who made a config epoch and why: the adoption round's span event
        self.sampler = RoundSampler(run_id, sample_rate)
        self.shipper = shipper
        self.counter = DropCounter()
        self.dp_size = dp_size
        # The simulator's clocks are virtual: round_seconds is no wall duration, arrivals map through records.
        self.virtual_clock = virtual_clock
        self.resource = resource_of(
            {
                SERVICE_NAME: service_name,
                SERVICE_INSTANCE_ID: f"{run_id}/controller",
                "prefill_gate.role": "controller",
                "prefill_gate.run_id": run_id,
                "prefill_gate.dp_size": dp_size,
            }
        )
        self.traced_rounds = 0  # rounds the sampling rules picked
        self.roots = 0  # root spans queued for export
        self.requests = 0
        self.requests_untraced = 0  # over the request span rate: not traced (not lost)
        self.request_spans_per_s = request_spans_per_s
        self._tokens = request_spans_per_s
        self._refilled = time.monotonic()
        self._wall: dict[int, int] = {}  # round -> rank 0's record stamp (Unix ns)
        self._clock: deque[tuple[float, int]] = deque(maxlen=ROUND_MEMORY)  # (engine clock, Unix ns) per record
        self._sampled: list[int] = []  # traced rounds, ascending
        self._latest_round = -1
        self._previous: RoundRecord | None = None
        self._live: dict[str, _RequestTrace] = {}
        self._ended: deque[_RequestTrace] = deque()

    @property
    def dropped(self) -> int:
        """Controller spans (roots and requests) that never reached the collector."""
        return self.counter.total

    # -- inputs --------------------------------------------------------------------------------------

    def submitted(self, rank: int, spec: RequestSpec) -> None:
        """A request was handed to `rank`."""
        if len(self._live) >= MAX_LIVE_REQUESTS:
            self.counter.refused += 1  # its span will never be built
            return
        if not self._take_token():
            self.requests_untraced += 1
            return
        if self.virtual_clock:
            start = self._wall_of_clock(spec.arrival)
        else:
            start = time.time_ns()  # on wall clocks a request arrives as it is submitted, i.e. now
        self._live[spec.rid] = _RequestTrace(spec.rid, rank, spec.arrival, start, spec)

    def _take_token(self) -> bool:
        now = time.monotonic()
        rate = self.request_spans_per_s
        self._tokens = min(rate, self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def polled(self, polled: Polled) -> None:
        """One poll's records (root spans first: the clock map needs them), submissions and events."""
        for record in polled.records:
            self._on_record(record)
        for rank, spec in polled.submitted:
            self.submitted(rank, spec)
        seen = time.time_ns()
        for event in polled.events:
            trace = self._live.get(event.rid)
            if trace is not None:
                self._on_event(trace, event, seen)
        self._emit_ready(force=False)

    def close(self) -> None:
        """Export every ended request, then the ones still open (marked unfinished)."""
        self._emit_ready(force=True)
        now = time.time_ns()
        for trace in list(self._live.values()):
            trace.end_seen_ns, trace.reason = now, "unfinished"
            self._export_request(trace)
        self._live.clear()

    # -- rounds --------------------------------------------------------------------------------------

    def _on_record(self, record: RoundRecord) -> None:
        self._wall[record.round] = record.unix_nanos
        if len(self._wall) > ROUND_MEMORY:
            del self._wall[next(iter(self._wall))]  # rounds arrive in order: the first key is the oldest
        self._clock.append((record.clock, record.unix_nanos))
        self._latest_round = max(self._latest_round, record.round)
        context = self.sampler.decide(record.round, record.rows, record.adopted_epoch)
        previous, self._previous = self._previous, record
        if context is None:
            return
        self.traced_rounds += 1
        self._sampled.append(record.round)
        if len(self._sampled) > 2 * ROUND_MEMORY:
            del self._sampled[:ROUND_MEMORY]
        if not self.virtual_clock:
            start = record.unix_nanos - int(record.round_seconds * 1e9)
        elif previous is not None and previous.round == record.round - 1:
            start = previous.unix_nanos  # virtual round time: the previous round's stamp is when this one began
        else:
            start = record.unix_nanos
        rows = record.rows
        attributes: dict[str, object] = {
            "gate.round": record.round,
            "gate.point": record.point.name,
            "gate.open": record.open,
            "gate.counter": record.counter,
            "gate.counter_after": record.counter_after,
            "gate.config_epoch": record.config_epoch,
            "gate.policy": record.policy,
            "gate.all_decode_or_idle": record.all_decode_or_idle,
            "gate.sample_reason": context.reason.value,
            "gate.ranks": len(rows),
            "gate.ranks_wanting": sum(row.want_prefill for row in rows),
            "gate.ranks_with_decodes": sum(row.has_decode_work for row in rows),
            "gate.ranks_extending": sum(row.num_extends > 0 for row in rows),
            "gate.max_occupancy": round(max((row.occupancy for row in rows), default=0.0), 4),
            "gate.round_seconds": record.round_seconds,
        }
        if record.attempt_interval is not None:
            attributes["gate.attempt_interval"] = record.attempt_interval
            attributes["gate.any_interval"] = record.any_interval or 0
        if record.adopted_epoch:
            attributes["gate.adopted_epoch"] = record.adopted_epoch
        root = span_context(context.trace_id, context.root_span_id)
        events = [self._adoption_event(record)] if record.adopted_epoch else []
        span = make_span("round", root, None, self.resource, start, record.unix_nanos, attributes, events=events)
        if self.shipper.offer([span], self.counter):
            self.roots += 1

    def _adoption_event(self, record: RoundRecord) -> Event:
        """`gate.config_adopted`: the epoch every rank adopted after this round's gather, who made it and why."""
        epoch = record.adopted_epoch or 0
        origin = self.origin_of(epoch) if self.origin_of is not None else None
        attributes: dict[str, object] = {"gate.config_epoch": epoch}
        if origin is not None:
            attributes["gate.changed_by"] = origin.changed_by
            attributes["gate.reason"] = origin.reason
        return Event("gate.config_adopted", attributes, record.unix_nanos)  # type: ignore[arg-type]

    def _wall_of_clock(self, clock: float) -> int:
        """Unix ns of an engine-clock time, interpolated between the records around it."""
        points = self._clock
        if not points:
            return time.time_ns()
        for index in range(len(points) - 1, -1, -1):  # arrivals are recent: search from the newest
            c0, u0 = points[index]
            if c0 <= clock:
                if index + 1 < len(points):
                    c1, u1 = points[index + 1]
                    if c1 > c0:
                        return u0 + int((clock - c0) / (c1 - c0) * (u1 - u0))
                return u0
        return points[0][1]

    # -- requests ------------------------------------------------------------------------------------

    def _on_event(self, trace: _RequestTrace, event: object, seen: int) -> None:
        if isinstance(event, ChunkPlanned):
            trace.chunks.append(event.round)
            self._add_event(
                trace,
                "prefill_chunk",
                event.round,
                seen,
                {"gate.round": event.round, "request.chunk_tokens": event.tokens},
            )
        elif isinstance(event, Admitted):
            trace.admitted = event
            self._add_event(
                trace,
                "admitted",
                event.round,
                seen,
                {
                    "gate.round": event.round,
                    "gate.wait_rounds": event.wait_rounds,
                    "gate.wait_seconds": event.wait_seconds,
                },
            )
        elif isinstance(event, FirstToken):
            trace.first_token = event
            self._add_event(
                trace,
                "first_token",
                event.round,
                seen,
                {"gate.round": event.round, "request.ttft_seconds": event.time - trace.arrival},
            )
        elif isinstance(event, Retracted):
            trace.retractions += 1
            self._add_event(trace, "retracted", event.round, seen, {"gate.round": event.round})
        elif isinstance(event, Finished):
            trace.end_round, trace.end_seen_ns, trace.reason = event.round, seen, event.reason.value
            self._end(trace)
        elif isinstance(event, Refused):
            trace.end_seen_ns, trace.reason, trace.error = seen, "refused", event.error
            self._end(trace)

    @staticmethod
    def _add_event(trace: _RequestTrace, name: str, round_: int, seen: int, attributes: dict[str, object]) -> None:
        if len(trace.events) < MAX_EVENTS:
            trace.events.append((name, round_, seen, attributes))

    def _end(self, trace: _RequestTrace) -> None:
        del self._live[trace.rid]
        self._ended.append(trace)

    def _emit_ready(self, force: bool) -> None:
        now = time.time_ns()
        while self._ended:
            trace = self._ended[0]
            waiting = trace.end_round is not None and trace.end_round > self._latest_round
            if waiting and not force and now - trace.end_seen_ns < READY_AFTER_S * 1e9:
                break  # ended in order: the ones behind it ended no earlier
            self._ended.popleft()
            self._export_request(trace)

    def _export_request(self, trace: _RequestTrace) -> None:
        events = [Event(name, attrs, self._wall.get(round_, seen)) for name, round_, seen, attrs in trace.events]
        end = self._wall.get(trace.end_round, trace.end_seen_ns) if trace.end_round is not None else trace.end_seen_ns
        spec = trace.spec
        attributes: dict[str, object] = {
            "request.id": trace.rid,
            "gate.rank": trace.rank,
            "request.prompt_len": spec.prompt_len,
            "request.output_len": spec.output_len,
            "request.prefix_hit": spec.prefix_hit,
            "request.chunks": len(trace.chunks),
            "request.retractions": trace.retractions,
            "request.finish_reason": trace.reason,
        }
        if trace.admitted is not None:
            attributes["gate.wait_rounds"] = trace.admitted.wait_rounds
            attributes["gate.wait_seconds"] = trace.admitted.wait_seconds
            attributes["request.admitted_round"] = trace.admitted.round
        if trace.first_token is not None:
            attributes["request.ttft_seconds"] = trace.first_token.time - trace.arrival
        if trace.end_round is not None:
            attributes["request.finished_round"] = trace.end_round
        status = Status(StatusCode.ERROR, trace.error) if trace.error else None
        context = span_context(request_trace_id(self.run_id, trace.rid), new_span_id())
        span = make_span(
            "request",
            context,
            None,
            self.resource,
            trace.start_ns,
            max(end, trace.start_ns),
            attributes,
            events=events,
            links=self._links(trace),
            status=status,
        )
        if self.shipper.offer([span], self.counter):
            self.requests += 1

    def _links(self, trace: _RequestTrace) -> list[Link]:
        """Links to the rank's `gate.round` spans of the traced rounds the request was resident in."""
        first = trace.chunks[0] if trace.chunks else (trace.admitted.round if trace.admitted else None)
        if first is None:
            return []
        last = trace.end_round if trace.end_round is not None else self._latest_round
        low = bisect.bisect_left(self._sampled, first)
        high = bisect.bisect_right(self._sampled, last)
        chunks = set(trace.chunks)
        rounds = sorted(self._sampled[low:high], key=lambda r: (r not in chunks, r))[:MAX_LINKS]
        links = []
        for r in sorted(rounds):
            target = SpanContext(
                round_trace_id(self.run_id, r), rank_span_id(self.run_id, r, trace.rank), True, trace_flags=_SAMPLED
            )
            links.append(Link(target, {"gate.round": r, "gate.prefill_chunk": r in chunks}))
        return links
