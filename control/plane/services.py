"""The control plane's gRPC servicers (`grpc.aio`): telemetry, admin and requests.

Each servicer is a thin mapping between the contract in `protos/` and the `Controller`, which owns the
semantics; this module only translates values and turns the controller's exceptions into status codes:

- invalid values: INVALID_ARGUMENT with a `google.rpc.BadRequest` naming every bad field;
- a stale `expected_epoch`: FAILED_PRECONDITION; a resume point older than the history: OUT_OF_RANGE;
- anything while the engine drains: UNAVAILABLE; a stream the engine's crash cut short: UNAVAILABLE with
  the reason (never OK, which only a clean stop gives).

Authentication of the mutating calls is not here: `control.plane.auth` intercepts them before a servicer runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from control.host.controller import (
    ConfigRejected,
    ConfigView,
    Controller,
    Draining,
    DuplicateRequest,
    RequestRejected,
    RequestStream,
    StaleEpoch,
)
from control.plane.hub import OutOfHistory, StreamFailed, Subscriber, watch_violations
from control.telemetry.trace_status import TraceStatus, trace_status
from engine.metrics import Summary
from engine.request import Finished, FinishReason, FirstToken, Refused, RequestError, RequestEvent, Tokens
from prefill_gate.convert import gate_config
from prefill_gate.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    requests_pb2,
    requests_pb2_grpc,
    telemetry_pb2,
    telemetry_pb2_grpc,
)
from prefill_gate.v1 import types_pb2 as pb

# GetRounds answers stay under gRPC's default 4 MiB message limit; the rest is asked for again.
ROUNDS_RESPONSE_BYTES = 3 << 20
# Trailing metadata of an OUT_OF_RANGE WatchRounds: the first round the history still holds.
HISTORY_FIRST_ROUND_KEY = "history-first-round"

Violations = Sequence[tuple[str, str]]


async def abort_invalid(context: grpc.aio.ServicerContext, message: str, violations: Violations) -> None:
    """End the call with INVALID_ARGUMENT and a BadRequest listing (field, description) pairs."""
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=name, description=text) for name, text in violations
        ]
    )
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=message)
    status.details.add().Pack(bad)
    await context.abort_with_status(rpc_status.to_status(status))


async def send(context: grpc.aio.ServicerContext, message: Message | bytes) -> bool:
    """Write one message of a server stream; False when the call is over (the client went away).

    A write that is waiting on flow control when the client cancels fails with grpc's internal
    ExecuteBatchError; as a generator's `yield` that would log a traceback per cancelled stream.
    """
    try:
        await context.write(message)
    except Exception:  # grpc exports no public type for it; a failed write always ends the call
        return False
    return True


def config_message(view: ConfigView) -> pb.GateConfig:
    """The GateConfig of a controller config view."""
    delay = view.delay
    return gate_config(
        view.epoch,
        delay.attempt_interval if delay else None,
        delay.any_interval if delay else None,
        view.policy,
        view.origin,
    )


def run_stats(summary: Summary, records_dropped: int, tracing: TraceStatus | None = None) -> pb.RunStats:
    """RunStats from the controller's summary and tracing's status; figures without a sample yet are 0."""
    elapsed = summary.elapsed_s
    return pb.RunStats(
        rounds=summary.rounds,
        rounds_per_second=summary.rounds / elapsed if elapsed > 0 else 0.0,
        output_tokens_per_second=summary.output_tokens_per_s or 0.0,
        ttft_p50_seconds=summary.ttft_p50_s or 0.0,
        ttft_p99_seconds=summary.ttft_p99_s or 0.0,
        itl_p50_seconds=summary.itl_p50_s or 0.0,
        itl_p99_seconds=summary.itl_p99_s or 0.0,
        gate_wait_p99_seconds=summary.gate_wait_p99_s or 0.0,
        gate_wait_p99_rounds=summary.gate_wait_p99_rounds or 0.0,
        extend_round_share=summary.extend_round_share or 0.0,
        ranks_extending_per_window=summary.mean_ranks_extending or 0.0,
        windows_any=summary.windows_any,
        windows_all=summary.windows_all,
        requests_submitted=summary.requests_submitted,
        requests_finished=summary.requests_finished,
        requests_aborted=summary.requests_aborted,
        requests_refused=summary.requests_refused,
        requests_cut_off=summary.requests_cut_off,
        output_tokens=summary.output_tokens,
        retractions=summary.retractions,
        records_dropped=records_dropped,
        trace_spans_dropped=tracing.spans_dropped if tracing is not None else 0,
        elapsed_seconds=elapsed,
        prompt_tokens=summary.prompt_tokens,
        prefix_hit_requests=summary.prefix_hit_requests,
        prefix_hit_tokens=summary.prefix_hit_tokens,
        prefix_hit_share=summary.prefix_hit_share or 0.0,
        tracing=tracing.as_proto() if tracing is not None else None,
    )


def _rank_violations(ranks: Sequence[int], dp_size: int) -> list[tuple[str, str]]:
    bad = sorted({r for r in ranks if r >= dp_size})
    return [("ranks", f"must name ranks in [0, {dp_size}), got {bad}")] if bad else []


class GateTelemetry(telemetry_pb2_grpc.GateTelemetryServicer):
    """Read-only: the round stream, the latest snapshot and the history ring."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.streams: set[Subscriber] = set()
        self._no_streams = asyncio.Event()
        self._no_streams.set()

    async def WatchRounds(self, request: telemetry_pb2.WatchRoundsRequest, context: grpc.aio.ServicerContext) -> None:
        """Every round from `from_round` (or the next one) through this stream's own bounded queue."""
        violations = _rank_violations(request.ranks, self.controller.backend.dp_size)
        latest_only = request.mode == telemetry_pb2.WATCH_MODE_LATEST_ONLY
        batch_delay_s = request.max_batch_delay_ms / 1000
        violations += watch_violations(request.max_queue, request.max_batch, batch_delay_s, latest_only)
        if request.mode not in telemetry_pb2.WatchMode.values():
            violations.append(("mode", f"unknown watch mode {request.mode}"))
        if violations:
            await abort_invalid(context, "invalid watch request", violations)
        hub = self.controller.hub
        try:
            subscriber = hub.subscribe(
                from_round=request.from_round if request.HasField("from_round") else None,
                latest_only=latest_only,
                max_queue=request.max_queue,
                ranks=request.ranks,
                max_batch=request.max_batch,
                max_batch_delay_s=batch_delay_s,
            )
        except OutOfHistory as exc:
            context.set_trailing_metadata(((HISTORY_FIRST_ROUND_KEY, str(exc.first)),))
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        self.streams.add(subscriber)
        self._no_streams.clear()
        try:
            # One write at a time, each chosen when the previous one completed (freshness, see the proto).
            while (frame := await subscriber.next_frame()) is not None and await send(context, frame):
                pass
        except StreamFailed as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            hub.unsubscribe(subscriber)
            self.streams.discard(subscriber)
            if not self.streams:
                self._no_streams.set()

    async def wait_streams_ended(self, timeout_s: float) -> bool:
        """Wait until every WatchRounds stream has returned; False when some still run after `timeout_s`."""
        try:
            await asyncio.wait_for(self._no_streams.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def GetSnapshot(
        self, request: telemetry_pb2.GetSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.Snapshot:
        """The latest record, the config in force and the run's figures."""
        controller = self.controller
        hub = controller.hub
        return pb.Snapshot(
            run_id=controller.run_id,
            dp_size=controller.backend.dp_size,
            executor=controller.args.executor,
            state=controller.reported_state,
            failure=controller.failure or "",
            last_round_age_seconds=controller.last_round_age_s(),
            latest=hub.latest(),
            config=config_message(controller.config),
            stats=run_stats(controller.summary(), controller.records_dropped(), trace_status(controller)),
            history_first_round=hub.first_round or 0,
            history_last_round=hub.last_round or 0,
        )

    async def GetRounds(
        self, request: telemetry_pb2.GetRoundsRequest, context: grpc.aio.ServicerContext
    ) -> telemetry_pb2.GetRoundsResponse:
        """Held records in [from_round, to_round]; rounds the ring no longer holds are simply absent."""
        violations = _rank_violations(request.ranks, self.controller.backend.dp_size)
        if request.to_round and request.to_round < request.from_round:
            text = f"must be >= from_round ({request.from_round}) or 0, got {request.to_round}"
            violations.append(("to_round", text))
        if violations:
            await abort_invalid(context, "invalid rounds request", violations)
        hub = self.controller.hub
        response = telemetry_pb2.GetRoundsResponse(
            history_first_round=hub.first_round or 0, history_last_round=hub.last_round or 0
        )
        size = 0
        for record in hub.rounds(request.from_round, request.to_round or None, request.ranks):
            size += record.ByteSize() + 8
            if size > ROUNDS_RESPONSE_BYTES and response.records:
                response.truncated = True
                break
            response.records.append(record)
        return response


class GateAdmin(admin_pb2_grpc.GateAdminServicer):
    """The gate's intervals: read them, or change them on every rank at once (G1)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    async def GetConfig(self, request: admin_pb2.GetConfigRequest, context: grpc.aio.ServicerContext) -> pb.GateConfig:
        """The config every rank decides under now."""
        return config_message(self.controller.config)

    async def UpdateIntervals(
        self, request: admin_pb2.UpdateIntervalsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateIntervalsResponse:
        """Validate like startup (C3); unless validate_only, answer once every rank adopted the change."""
        try:
            update = await self.controller.update_intervals(
                request.attempt_interval if request.HasField("attempt_interval") else None,
                request.any_interval if request.HasField("any_interval") else None,
                disable=request.disable,
                expected_epoch=request.expected_epoch if request.HasField("expected_epoch") else None,
                validate_only=request.validate_only,
                changed_by=request.changed_by,
                reason=request.reason,
            )
        except ConfigRejected as exc:
            await abort_invalid(context, str(exc), exc.violations)
        except StaleEpoch as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Draining as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return admin_pb2.UpdateIntervalsResponse(
            config=config_message(update.config),
            adopted_round=update.adopted_round,
            validated_only=update.validated_only,
        )


class GateRequests(requests_pb2_grpc.GateRequestsServicer):
    """Submit a request and stream its progress back; abort one."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    async def Submit(self, request: requests_pb2.SubmitRequest, context: grpc.aio.ServicerContext) -> None:
        """Accepted, then the first token (with TTFT), token batches, and the finish.

        A client that cancels the call aborts the request: nobody is left to read its tokens.
        """
        prompt = tuple(request.prompt) or None
        prompt_len = request.prompt_len if request.prompt_len or prompt is None else len(prompt)
        try:
            stream = self.controller.submit(
                rid=request.request_id,
                prompt_len=prompt_len,
                output_len=request.output_len,
                prefix_hit=request.prefix_hit,
                prompt=prompt,
                rank=request.rank if request.HasField("rank") else None,
            )
        except Draining as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except RequestRejected as exc:
            await abort_invalid(context, str(exc), exc.violations)
        except DuplicateRequest as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        except RequestError as exc:
            await abort_invalid(context, str(exc), [("request", str(exc))])
        ended = False
        try:
            accepted = requests_pb2.Accepted(request_id=stream.rid, rank=stream.rank)
            if not await send(context, requests_pb2.SubmitEvent(accepted=accepted)):
                return
            while not ended:
                events = [await stream.queue.get()]
                while not stream.queue.empty():
                    events.append(stream.queue.get_nowait())
                refused = next((e for e in events if isinstance(e, Refused)), None)
                if refused is not None:
                    ended = True
                    await abort_invalid(context, refused.error, [("request", refused.error)])
                for message in _submit_events(stream, events):
                    if not await send(context, message):
                        return
                finished = next((e for e in events if isinstance(e, Finished)), None)
                ended = finished is not None
                if finished is not None and finished.reason is FinishReason.CUT_OFF:
                    # The Finished event says what was generated; the status says it was not a success.
                    await context.abort(grpc.StatusCode.UNAVAILABLE, finished.detail or "cut off: the engine stopped")
        finally:
            if not ended:
                self.controller.abort(stream.rid)

    async def Abort(
        self, request: requests_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> requests_pb2.AbortResponse:
        """Abort a live request; `found` is false for an id that is not live (a no-op)."""
        if not request.request_id:
            await abort_invalid(context, "request_id is required", [("request_id", "must not be empty")])
        return requests_pb2.AbortResponse(found=self.controller.abort(request.request_id))


def _submit_events(stream: RequestStream, events: list[RequestEvent]) -> list[requests_pb2.SubmitEvent]:
    """One read's events as messages: the first token, then the tokens (one batch), then the finish."""
    out: list[requests_pb2.SubmitEvent] = []
    tokens: list[int] = []
    finished: Finished | None = None
    for event in events:
        if isinstance(event, FirstToken):
            first = requests_pb2.FirstToken(ttft_seconds=event.time - stream.arrival, round=event.round)
            out.append(requests_pb2.SubmitEvent(first_token=first))
        elif isinstance(event, Tokens):
            tokens.extend(event.tokens)
        elif isinstance(event, Finished):
            finished = event
    if tokens:
        out.append(requests_pb2.SubmitEvent(tokens=requests_pb2.TokenBatch(tokens=tokens)))
    if finished is not None:
        first, admitted = stream.first_token, stream.admitted
        out.append(
            requests_pb2.SubmitEvent(
                finished=requests_pb2.Finished(
                    reason=str(finished.reason),
                    output_len=finished.output_len,
                    ttft_seconds=first.time - stream.arrival if first else 0.0,
                    e2e_seconds=max(0.0, finished.time - stream.arrival),
                    gate_wait_rounds=admitted.wait_rounds if admitted else 0,
                    gate_wait_seconds=admitted.wait_seconds if admitted else 0.0,
                    detail=finished.detail,
                )
            )
        )
    return out
