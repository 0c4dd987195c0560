"""The tuner's control plane over gRPC: what `prefill-gate tune` runs against a serving engine.

An ordinary client: `WatchRounds` (lossless, bounded: a record it falls behind on is dropped by the
server and the gap is reported in the next record), `GetConfig`, and `UpdateIntervals` with
`expected_epoch`, `changed_by` and `reason`. It reads what any client reads, nothing more.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from prefill_gate.v1 import admin_pb2, admin_pb2_grpc, telemetry_pb2, telemetry_pb2_grpc
from prefill_gate.v1 import types_pb2 as pb
from tuner.core import Proposal
from tuner.loop import Adopted, PlaneLost, Refused, StaleConfig

# Codes after which a new connection may work: the engine is away, restarting or draining.
RECONNECTABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN}
)
WATCH_QUEUE = 16384  # records the server holds for the tuner before it drops the oldest (a gap)


class GrpcPlane:
    """`tuner.loop.Plane` on a `grpc.aio` channel; `metadata` carries the admin token."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple = (), timeout_s: float = 30.0) -> None:
        self.telemetry = telemetry_pb2_grpc.GateTelemetryStub(channel)
        self.admin = admin_pb2_grpc.GateAdminStub(channel)
        self.metadata = metadata
        self.timeout_s = timeout_s

    async def watch(self) -> AsyncIterator[pb.RoundRecord]:
        call = self.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest(max_queue=WATCH_QUEUE))
        try:
            async for record in call:
                yield record
        except grpc.aio.AioRpcError as exc:
            raise PlaneLost(f"{exc.code().name}: {exc.details()}") from exc
        finally:
            call.cancel()

    async def get_config(self) -> pb.GateConfig:
        try:
            return await self.admin.GetConfig(admin_pb2.GetConfigRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise PlaneLost(f"{exc.code().name}: {exc.details()}") from exc

    async def update(self, proposal: Proposal, changed_by: str) -> Adopted:
        target = proposal.target
        request = admin_pb2.UpdateIntervalsRequest(
            expected_epoch=proposal.expected_epoch, changed_by=changed_by, reason=proposal.reason
        )
        if target.enabled:
            request.attempt_interval = target.attempt or 0
            request.any_interval = target.any or 0
        else:
            request.disable = True
        try:
            response = await self.admin.UpdateIntervals(request, metadata=self.metadata, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            text = f"{exc.code().name}: {exc.details()}"
            if exc.code() is grpc.StatusCode.FAILED_PRECONDITION:
                raise StaleConfig(text) from exc
            if exc.code() in RECONNECTABLE:
                raise PlaneLost(text) from exc
            raise Refused(text) from exc
        return Adopted(response.config, response.adopted_round)
