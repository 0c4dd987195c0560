"""The controller's spans: the root of every traced round, and one span per request.

The root span of round r carries the gathered decision and uses the span id every rank derived as the
parent of its `gate.round` span, so each traced round is one tree with no missing parent. It runs from
the earliest rank's start of round r (in round r's rows) to the latest rank's end of it (in round
r+1's rows), so it covers every rank's span; it is exported when round r+1's record arrives.

A request span (kind SERVER: the engine serving a request) follows OpenTelemetry's GenAI conventions
(`gen_ai.operation.name`, `gen_ai.usage.input_tokens`, `gen_ai.response.finish_reasons`, ...) and runs
from arrival to finish, with events for admission, each prefill chunk, first token and retractions,
the gate wait and TTFT as attributes, and links to its rank's `gate.round` spans of the traced rounds
it was resident in. Up to `--trace-request-rate` requests a second are traced (a token bucket); the
rest are counted in `requests_untraced`, which the summary, `ctl snapshot` and the metrics show.

Times: rank spans are wall-clock; request events carry rounds, so they are placed at their round's wall
time (rank 0's record stamp). A request span is built once the records of its last round arrived
(records and events travel on different queues from rank processes), or after a second at most.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter as Tally
from collections import deque
from dataclasses import dataclass, field

from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, SERVICE_VERSION

from control.host.backends import Polled
from control.telemetry.otlp_wire import KIND_INTERNAL, KIND_SERVER, STATUS_ERROR, Producer, SpanData, producer
from control.telemetry.trace_export import DropCounter, SpanShipper
from control.telemetry.tracing import (
    DEFAULT_SERVICE,
    SCOPE_NAME,
    VERSION,
    RoundContext,
    RoundSampler,
    new_span_id,
    rank_resource,
    rank_round_span,
    rank_span_id,
    rates_pick,
    request_trace_id,
    resource_of,
    round_trace_id,
)
from engine.record import RoundRecord
from engine.request import Admitted, ChunkPlanned, Finished, FirstToken, Refused, RequestSpec, Retracted
from engine.rows import Row
from prefill_gate.convert import OriginOf

MAX_LINKS = 64  # the first chunks and the earliest decode rounds; a long request would otherwise carry hundreds
MAX_EVENTS = 128
ROUND_MEMORY = 16384  # rounds whose wall time and sampling the controller remembers
MAX_LIVE_REQUESTS = 100_000
READY_AFTER_S = 1.0
# Request spans per second at most (a token bucket, as Jaeger's rate-limiting sampler): a real engine
# serves fewer, so each is traced; the simulator finishes thousands a second, and each span (with its
# events and links) costs tens of us to build and encode in the process that steps the simulated ranks.
REQUEST_SPANS_PER_S = 100.0
OPERATION = "text_completion"  # gen_ai.operation.name: a prompt in, tokens out


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
    output_tokens: int | None = None
    error: str | None = None


@dataclass(slots=True)
class _PendingRoot:
    """A traced round whose root waits for the next round's rows (they carry each rank's end of it)."""

    context: RoundContext
    attributes: dict[str, object]
    start_ns: int
    record_ns: int  # rank 0's record stamp: a floor for the end
    events: list[tuple[str, int, dict[str, object]]]  # the config adoption, when this round adopted one


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
        window_sample_rate: float | None = None,
        model: str = "prefill-gate",
        service_name: str = DEFAULT_SERVICE,
        request_spans_per_s: float = REQUEST_SPANS_PER_S,
        origin_of: OriginOf | None = None,
        rank_rule_spans: bool = False,
    ) -> None:
        self.run_id = run_id
        # The ranks trace only the rounds a rate picks (a simulator in a process of its own): the rounds
        # only a rule picks (config, watermark) get each rank's `gate.round` span from here, untimed.
        self.rank_rule_spans = rank_rule_spans
        self.service_name = service_name
        self._rank_producers: dict[int, Producer] = {}
        self.origin_of = origin_of  # who made a config epoch and why: the adoption round's span event
        window = sample_rate if window_sample_rate is None else window_sample_rate
        self.sampler = RoundSampler(run_id, sample_rate, window)
        self.shipper = shipper
        self.counter = DropCounter()
        self.dp_size = dp_size
        self.model = model
        # The simulator's clocks are virtual: round_seconds is no wall duration, arrivals map through records.
        self.virtual_clock = virtual_clock
        resource = resource_of(
            {
                SERVICE_NAME: service_name,
                SERVICE_VERSION: VERSION,
                SERVICE_INSTANCE_ID: f"{run_id}/controller",
                "prefill_gate.role": "controller",
                "prefill_gate.run_id": run_id,
                "prefill_gate.dp_size": dp_size,
            }
        )
        self.resource = resource
        self.producer = producer(resource, SCOPE_NAME, VERSION)
        self.rounds_seen = 0  # records the controller got (the denominator of the traced share)
        self.traced_rounds = 0  # rounds the sampling rules picked
        self.traced_by_reason: Tally[str] = Tally()
        self.roots = 0  # root spans queued for export
        self.requests = 0
        self.requests_untraced = 0  # over the request span rate: not traced (not lost)
        self._pending: _PendingRoot | None = None
        self._stopped_ns = 0  # when the controller learned that every rank stopped
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
        """Controller spans (roots, requests, and the rank spans of rule-only rounds it built for a simulator
        in its own process, `rank_rule_spans`) that never reached the collector."""
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
        if polled.stopped and not self._stopped_ns:
            self._stopped_ns = time.time_ns()  # every rank left its loop: no rank span ends later
        for rank, spec in polled.submitted:
            self.submitted(rank, spec)
        seen = time.time_ns()
        for event in polled.events:
            trace = self._live.get(event.rid)
            if trace is not None:
                self._on_event(trace, event, seen)
        self._emit_ready(force=False)

    def close(self) -> None:
        """Export the last root, every ended request, then the ones still open (marked unfinished)."""
        if self._pending is not None:
            # No later round: the run is over, so every rank's span of it ended by now.
            pending, self._pending = self._pending, None
            self._export_root(pending, max(pending.record_ns, self._stopped_ns or time.time_ns()))
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
        self.rounds_seen += 1
        if self._pending is not None:
            self._finish_root(self._pending, record)
            self._pending = None
        context = self.sampler.decide(record.round, record.rows, record.adopted_epoch)
        previous, self._previous = self._previous, record
        if context is None:
            return
        self.traced_rounds += 1
        self.traced_by_reason[context.reason.value] += 1
        self._sampled.append(record.round)
        if len(self._sampled) > 2 * ROUND_MEMORY:
            del self._sampled[:ROUND_MEMORY]
        starts = [row.span_start_ns for row in record.rows]
        if all(starts):
            start = min(starts)  # the earliest rank's start of this round
        elif not self.virtual_clock:
            start = record.unix_nanos - int(record.round_seconds * 1e9)  # a rank without marks: estimated
        elif previous is not None and previous.round == record.round - 1:
            start = previous.unix_nanos
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
        events = [self._adoption_event(record)] if record.adopted_epoch else []
        pending = _PendingRoot(context, attributes, min(start, record.unix_nanos), record.unix_nanos, events)
        if self.rank_rule_spans and not rates_pick(self.sampler.timing(record.round), rows):
            # Only a rule picked it, and the ranks left such rounds to this tracer, keeping no marks of them:
            # rank 0's record stamps of the round before and of this one bound it (one round's length; the
            # other ranks' last phases of this round fall after it, of the round before inside it).
            self._export_root(pending, record.unix_nanos)
            self._export_rank_spans(context, rows, record.adopted_epoch, pending.start_ns, record.unix_nanos)
            return
        self._pending = pending

    def _finish_root(self, pending: _PendingRoot, later: RoundRecord) -> None:
        """Export the pending root, ended by the latest rank's end of its round."""
        ends = [row.previous_span_end_ns for row in later.rows]
        if later.round == pending.context.round + 1 and all(ends):
            end = max(ends)
        else:
            # Round r+1's record was lost (or a rank had no marks): any later record is stamped after a
            # gather that every rank entered only once it had finished round r.
            end = later.unix_nanos
        self._export_root(pending, max(end, pending.record_ns))

    def _export_root(self, pending: _PendingRoot, end_ns: int) -> None:
        context = pending.context
        span = SpanData(
            context.trace_id,
            context.root_span_id,
            0,
            "round",
            KIND_INTERNAL,
            pending.start_ns,
            end_ns,
            pending.attributes,  # type: ignore[arg-type]
            pending.events,  # type: ignore[arg-type]
        )
        if self.shipper.offer([span], self.producer, self.counter):
            self.roots += 1

    def _export_rank_spans(
        self, context: RoundContext, rows: tuple[Row, ...], adopted_epoch: int | None, start_ns: int, end_ns: int
    ) -> None:
        """Each rank's untimed `gate.round` span of a round only a rule picked (`rank_rule_spans`)."""
        for row in rows:
            # Each rank's own vote (a policy without DP attention decides per rank), from its row.
            decision = (row.decision_point, row.decision_open, row.decision_counter, adopted_epoch)
            rank_span = rank_round_span(
                context, row, decision, start_ns, end_ns, phases_timed=False, parent_remote=False
            )
            self.shipper.offer([rank_span], self._rank_producer(row.rank), self.counter)

    def _rank_producer(self, rank: int) -> Producer:
        """The resource and scope a rank's own spans carry, for the rank spans built here."""
        made = self._rank_producers.get(rank)
        if made is None:
            resource = rank_resource(self.run_id, rank, self.dp_size, self.service_name)
            made = self._rank_producers[rank] = producer(resource, SCOPE_NAME, VERSION)
        return made

    def _adoption_event(self, record: RoundRecord) -> tuple[str, int, dict[str, object]]:
        """`gate.config_adopted`: the epoch every rank adopted after this round's gather, who made it and why."""
        epoch = record.adopted_epoch or 0
        origin = self.origin_of(epoch) if self.origin_of is not None else None
        attributes: dict[str, object] = {"gate.config_epoch": epoch}
        if origin is not None:
            attributes["gate.changed_by"] = origin.changed_by
            attributes["gate.reason"] = origin.reason
        return ("gate.config_adopted", record.unix_nanos, attributes)

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
                {"gate.round": event.round, "prefill_gate.request.chunk_tokens": event.tokens},
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
                {"gate.round": event.round, "prefill_gate.request.ttft_seconds": event.time - trace.arrival},
            )
        elif isinstance(event, Retracted):
            trace.retractions += 1
            self._add_event(trace, "retracted", event.round, seen, {"gate.round": event.round})
        elif isinstance(event, Finished):
            trace.end_round, trace.end_seen_ns, trace.reason = event.round, seen, event.reason.value
            trace.output_tokens = event.output_len
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
        events = [(name, self._wall.get(round_, seen), attrs) for name, round_, seen, attrs in trace.events]
        end = self._wall.get(trace.end_round, trace.end_seen_ns) if trace.end_round is not None else trace.end_seen_ns
        spec = trace.spec
        attributes: dict[str, object] = {  # OpenTelemetry GenAI conventions where they apply, ours beside
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": "prefill_gate",
            "gen_ai.request.model": self.model,
            "gen_ai.response.id": trace.rid,
            "gen_ai.request.max_tokens": spec.output_len,
            "gen_ai.usage.input_tokens": spec.prompt_len,
            "gen_ai.response.finish_reasons": (trace.reason,),
            "gate.rank": trace.rank,
            "prefill_gate.request.prefix_hit": bool(spec.prefix_hit),
            "prefill_gate.request.chunks": len(trace.chunks),
            "prefill_gate.request.retractions": trace.retractions,
        }
        if trace.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = trace.output_tokens
        if trace.admitted is not None:
            attributes["gate.wait_rounds"] = trace.admitted.wait_rounds
            attributes["gate.wait_seconds"] = trace.admitted.wait_seconds
            attributes["prefill_gate.request.admitted_round"] = trace.admitted.round
        if trace.first_token is not None:
            attributes["prefill_gate.request.ttft_seconds"] = trace.first_token.time - trace.arrival
        if trace.end_round is not None:
            attributes["prefill_gate.request.finished_round"] = trace.end_round
        status = (STATUS_ERROR, trace.error) if trace.error else None
        span = SpanData(
            request_trace_id(self.run_id, trace.rid),
            new_span_id(),
            0,
            f"{OPERATION} {self.model}",
            KIND_SERVER,
            trace.start_ns,
            max(end, trace.start_ns),
            attributes,  # type: ignore[arg-type]
            events,
            self._links(trace),
            status,
        )
        if self.shipper.offer([span], self.producer, self.counter):
            self.requests += 1

    def _links(self, trace: _RequestTrace) -> list[tuple[int, int, dict[str, object]]]:
        """Links to the rank's `gate.round` spans of the traced rounds the request was resident in."""
        first = trace.chunks[0] if trace.chunks else (trace.admitted.round if trace.admitted else None)
        if first is None:
            return []
        last = trace.end_round if trace.end_round is not None else self._latest_round
        low = bisect.bisect_left(self._sampled, first)
        high = bisect.bisect_right(self._sampled, last)
        chunks = set(trace.chunks)
        rounds = sorted(self._sampled[low:high], key=lambda r: (r not in chunks, r))[:MAX_LINKS]
        return [
            (
                round_trace_id(self.run_id, r),
                rank_span_id(self.run_id, r, trace.rank),
                {"gate.round": r, "gate.prefill_chunk": r in chunks},
            )
            for r in sorted(rounds)
        ]
