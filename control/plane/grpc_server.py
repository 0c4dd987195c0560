"""The control plane's gRPC server, attached to `prefill-gate serve` (see `control.host.serve.Attachment`).

It runs on the controller's event loop and serves the three services of `control.plane.services`, the
standard health service and server reflection (so `grpcurl` works without the .proto files).

Health follows the rounds: NOT_SERVING until the first round, SERVING while rounds flow, NOT_SERVING
when no round came for `--stall-after` seconds, and NOT_SERVING for good once the engine drains.

Drain (SIGTERM): health flips, every rank stops after the same round, then every WatchRounds stream
ends with OK after the rounds it had queued, and only then does the server stop. When the engine fails
instead (a rank crashed or was lost) every stream ends at once with UNAVAILABLE and the reason. `server.stop(grace)`
alone would end open streams with UNAVAILABLE, which a client cannot tell from a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from control.host.controller import Controller
from control.plane.auth import DEFAULT_PORT, TOKEN_ENV, BearerTokenInterceptor, read_token_file
from control.plane.budget import DEFAULT_SEND_BUDGET, MAX_SEND_BUDGET, budget_violation
from control.plane.handlers import add_service
from control.plane.recording import RecordingWriter
from control.plane.services import GateAdmin, GateRequests, GateTelemetry
from prefill_gate.v1 import admin_pb2, requests_pb2, telemetry_pb2
from prefill_gate.v1 import types_pb2 as pb

SERVICE_NAMES = (
    telemetry_pb2.DESCRIPTOR.services_by_name["GateTelemetry"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["GateAdmin"].full_name,
    requests_pb2.DESCRIPTOR.services_by_name["GateRequests"].full_name,
)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The control plane's flags on `serve`."""
    group = parser.add_argument_group("control plane (gRPC)")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    group.add_argument("--port", type=int, default=DEFAULT_PORT, help="port; 0 picks a free one (default: %(default)s)")
    group.add_argument(
        "--admin-token",
        default=None,
        help="bearer token required by UpdateIntervals, Submit and Abort; visible to every user in `ps`: prefer "
        f"--admin-token-file or ${TOKEN_ENV} (none of the three: changes are open)",
    )
    group.add_argument(
        "--admin-token-file",
        default=None,
        metavar="FILE",
        help="read the admin token from FILE (its first line), so it appears in no process listing",
    )
    group.add_argument("--tls-cert", default=None, help="PEM certificate chain: serve TLS (with --tls-key)")
    group.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    group.add_argument("--history", type=int, default=4096, help="rounds held for resume and GetRounds")
    group.add_argument(
        "--stall-after", type=float, default=5.0, help="health turns NOT_SERVING when no round came for this long (s)"
    )
    group.add_argument(
        "--record", default=None, metavar="FILE", help="write every round record to FILE (replaced if it exists)"
    )
    group.add_argument("--grace-s", type=float, default=5.0, help="seconds open calls get when the server stops")
    group.add_argument(
        "--watch-send-budget",
        type=int,
        default=DEFAULT_SEND_BUDGET,
        metavar="MSGS_PER_S",
        help="at most this many WatchRounds messages per second over all streams together (a batch is one), "
        "shared fairly; a stream over its share drops its oldest records as for a slow reader, and says so "
        f"in dropped_before. Bounds the control plane's CPU, so subscribers never slow the engine. "
        f"0: no budget; at most {MAX_SEND_BUDGET} (default: %(default)s)",
    )


@dataclass(frozen=True)
class PlaneOptions:
    """The control plane's settings, validated."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    history: int = 4096
    stall_after_s: float = 5.0
    record: str | None = None
    grace_s: float = 5.0
    watch_send_budget: int = DEFAULT_SEND_BUDGET

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.history < 1:
            raise ValueError(f"--history must be >= 1, got {self.history}")
        if not self.stall_after_s > 0:
            raise ValueError(f"--stall-after must be > 0, got {self.stall_after_s}")
        if self.grace_s < 0:
            raise ValueError(f"--grace-s must be >= 0, got {self.grace_s}")
        if (problem := budget_violation(self.watch_send_budget)) is not None:
            raise ValueError(problem)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> PlaneOptions:
        """From parsed `serve` flags; the token falls back to the environment."""
        return cls(
            host=ns.host,
            port=ns.port,
            token=ns.admin_token
            or read_token_file(ns.admin_token_file, "--admin-token-file")
            or os.environ.get(TOKEN_ENV)
            or None,
            tls_cert=ns.tls_cert,
            tls_key=ns.tls_key,
            history=ns.history,
            stall_after_s=ns.stall_after,
            record=ns.record,
            grace_s=ns.grace_s,
            watch_send_budget=ns.watch_send_budget,
        )

    @property
    def loopback(self) -> bool:
        """Whether only this machine can connect."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class ControlPlane:
    """The gRPC server of one controller: services, health, reflection, auth, TLS, recording, drain."""

    def __init__(self, controller: Controller, options: PlaneOptions, out: TextIO = sys.stdout) -> None:
        self.controller = controller
        self.options = options
        self.out = out
        self.telemetry = GateTelemetry(controller)
        self.health = HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.recorder: RecordingWriter | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._drained = False

    @property
    def target(self) -> str:
        """HOST:PORT a client dials."""
        host = self.options.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def start(self) -> None:
        """Bind, start serving and follow the engine's health; raises OSError when the port cannot be bound."""
        options, controller = self.options, self.controller
        controller.hub.resize(options.history)
        controller.hub.set_send_budget(options.watch_send_budget)
        controller.stall_after_s = options.stall_after_s
        for service in ("", *SERVICE_NAMES):
            await self.health.set(service, NOT_SERVING)  # the servicer starts out SERVING: not before a round
        interceptors = [BearerTokenInterceptor(options.token)] if options.token else []
        # Without SO_REUSEPORT a second server on the same port fails to bind instead of sharing it.
        server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
        add_service(server, self.telemetry, telemetry_pb2.DESCRIPTOR.services_by_name["GateTelemetry"])
        add_service(server, GateAdmin(controller), admin_pb2.DESCRIPTOR.services_by_name["GateAdmin"])
        add_service(server, GateRequests(controller), requests_pb2.DESCRIPTOR.services_by_name["GateRequests"])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection((*SERVICE_NAMES, health_name, reflection.SERVICE_NAME), server)
        address = f"[{options.host}]:{options.port}" if ":" in options.host else f"{options.host}:{options.port}"
        try:
            if options.tls_cert:
                credentials = grpc.ssl_server_credentials([_key_pair(options.tls_key, options.tls_cert)])
                self.port = server.add_secure_port(address, credentials)
            else:
                self.port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot bind the control plane to {address}: {exc}") from exc
        if not self.port:
            raise OSError(f"cannot bind the control plane to {address}")
        if options.record:
            self._start_recording(options.record)
        await server.start()
        self.server = server
        self._supervisor = asyncio.create_task(self._supervise(), name="control-plane-health")
        scheme = "grpcs" if options.tls_cert else "grpc"
        auth = "admin token required for changes" if options.token else "no admin token: changes are open"
        print(f"control plane: {scheme}://{self.target} ({auth})", file=self.out, flush=True)
        if not options.token and not options.loopback:
            print(f"warning: {options.host} is not loopback and no admin token is set", file=sys.stderr, flush=True)

    def _start_recording(self, path: str) -> None:
        controller = self.controller
        header = pb.RecordingHeader(
            run_id=controller.run_id,
            dp_size=controller.backend.dp_size,
            started_unix_nanos=time.time_ns(),
            executor=controller.args.executor,
        )
        self.recorder = RecordingWriter(path, header)
        controller.hub.add_tap(self.recorder.tap)

    async def _supervise(self) -> None:
        """Health follows the rounds until the engine drains; when it has stopped, streams end."""
        controller = self.controller
        tick = min(0.1, self.options.stall_after_s / 4)
        current = None
        while not controller.draining.is_set() and not controller.stopped.is_set():
            serving = controller.serving()
            # GetSnapshot reports "stalled" from this same decision, so health and snapshot never disagree.
            controller.stalled = controller.state == "serving" and not serving
            status = SERVING if serving else NOT_SERVING
            if status != current:
                for service in ("", *SERVICE_NAMES):
                    await self.health.set(service, status)
                current = status
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(controller.draining.wait(), tick)
        await self.health.enter_graceful_shutdown()
        await controller.stopped.wait()
        controller.hub.close_all()

    async def drain(self) -> None:
        """The SIGTERM path: health NOT_SERVING, every rank stops, then every WatchRounds stream ends OK."""
        if self._drained:
            return
        self._drained = True
        controller = self.controller
        await self.health.enter_graceful_shutdown()
        controller.request_stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(controller.stopped.wait(), max(self.options.grace_s, 1.0))
        controller.hub.close_all()  # streams end after what they queued, with OK
        await self.telemetry.wait_streams_ended(self.options.grace_s)

    async def stop(self) -> None:
        """Drain (if not yet), stop the server within the grace period, close the recording."""
        await self.drain()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self.server is not None:
            await self.server.stop(self.options.grace_s)
        if self.recorder is not None:
            self.controller.hub.remove_tap(self.recorder.tap)
            self.recorder.close()


def _key_pair(key_path: str | None, cert_path: str) -> tuple[bytes, bytes]:
    try:
        return Path(key_path or "").read_bytes(), Path(cert_path).read_bytes()
    except OSError as exc:
        raise OSError(f"cannot read the TLS key or certificate: {exc}") from exc


def check_server_args(ns: argparse.Namespace) -> PlaneOptions:
    """The control plane's flags, validated before anything starts; raises ValueError naming the flag."""
    if ns.admin_token and ns.admin_token_file:
        raise ValueError("--admin-token and --admin-token-file exclude each other")
    options = PlaneOptions.from_namespace(ns)
    for flag, path in (("--tls-cert", options.tls_cert), ("--tls-key", options.tls_key)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    if options.record is not None and not Path(options.record).resolve().parent.is_dir():
        raise ValueError(f"--record {options.record}: its directory does not exist")
    return options


async def attach_grpc(controller: Controller, ns: argparse.Namespace) -> Callable[[], Awaitable[None]]:
    """`serve`'s attachment: start the control plane on the controller's loop; returns its stop coroutine."""
    plane = ControlPlane(controller, check_server_args(ns))
    await plane.start()
    return plane.stop
