"""A real engine behind a real control-plane server on an ephemeral port, for the gRPC tests."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from control.host.backends import Backend, SimBackend
from control.host.controller import Controller
from control.plane.auth import bearer_metadata
from control.plane.grpc_server import ControlPlane, PlaneOptions
from engine.config import ServerArgs
from prefill_gate.v1 import admin_pb2_grpc, requests_pb2_grpc, telemetry_pb2_grpc

TOKEN = "test-admin-token"


@dataclass
class Served:
    """A running controller, its control plane, and stubs on one aio channel."""

    controller: Controller
    plane: ControlPlane
    run: asyncio.Task[None]
    channel: grpc.aio.Channel
    auth: tuple[tuple[str, str], ...]

    @property
    def telemetry(self) -> telemetry_pb2_grpc.GateTelemetryStub:
        return telemetry_pb2_grpc.GateTelemetryStub(self.channel)

    @property
    def admin(self) -> admin_pb2_grpc.GateAdminStub:
        return admin_pb2_grpc.GateAdminStub(self.channel)

    @property
    def requests(self) -> requests_pb2_grpc.GateRequestsStub:
        return requests_pb2_grpc.GateRequestsStub(self.channel)

    async def wait_round(self, round_index: int, timeout_s: float = 20.0) -> None:
        """Until the controller has seen `round_index`."""
        async with asyncio.timeout(timeout_s):
            while self.controller.latest is None or self.controller.latest.round < round_index:
                await asyncio.sleep(0.005)


@asynccontextmanager
async def serving(
    args: ServerArgs,
    *,
    backend: Backend | None = None,
    pace: float | None = 0.5,
    token: str | None = TOKEN,
    channel_options: list[tuple[str, Any]] | None = None,
    port: int = 0,
    **options: Any,
) -> AsyncIterator[Served]:
    """Start the engine, attach the control plane on `port` (0: a free one, as `serve` does), and stop both after."""
    backend = backend or SimBackend(args, None, pace=pace)
    controller = Controller(args, backend, stop_when_idle=False)
    await asyncio.get_running_loop().run_in_executor(None, controller.start)
    plane = ControlPlane(controller, PlaneOptions(port=port, token=token, **options), out=io.StringIO())
    try:
        await plane.start()
    except BaseException:
        backend.close()
        raise
    run = asyncio.create_task(controller.run())
    channel = grpc.aio.insecure_channel(plane.target, options=channel_options or [])
    try:
        yield Served(controller, plane, run, channel, bearer_metadata(token))
    finally:
        await channel.close()
        await plane.stop()
        controller.request_stop()
        try:
            await asyncio.wait_for(run, 30)
        finally:
            backend.close()


def bad_fields(error: grpc.aio.AioRpcError) -> set[str]:
    """The field names of the BadRequest carried by an INVALID_ARGUMENT error."""
    status = rpc_status.from_call(error)
    assert status is not None, f"no rich status in {error.code()}: {error.details()}"
    names: set[str] = set()
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        assert detail.Unpack(bad)
        names |= {violation.field for violation in bad.field_violations}
    return names
