"""The server around the services: health, reflection, auth, TLS, graceful drain."""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from control.host.backends import SimBackend
from control.host.controller import Controller
from control.plane.auth import DEFAULT_PORT, TOKEN_ENV
from control.plane.ctl import add_ctl_parser, ctl_main
from control.plane.grpc_server import SERVICE_NAMES, ControlPlane, PlaneOptions, add_server_args, check_server_args
from engine.request import RequestSpec
from prefill_gate.v1 import admin_pb2, admin_pb2_grpc, requests_pb2, telemetry_pb2, telemetry_pb2_grpc
from tests.grpc_plane import TOKEN, serving
from tests.helpers import sim_args

ARGS = sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class StallingFeeder:
    """A workload with no requests whose `due` blocks while `hold` is set: the engine's thread stalls."""

    done = False
    next_arrival = math.inf

    def __init__(self) -> None:
        self.hold = threading.Event()

    def due(self, now: float, loads: list[int]) -> list[tuple[int, RequestSpec]]:
        while self.hold.is_set():
            time.sleep(0.01)
        return []

    def on_finished(self, rid: str, now: float) -> None:
        return None


async def read_to_end(call) -> list:
    """Every message left on a server stream read with `read()`, until it ends."""
    out = []
    while (message := await call.read()) is not grpc.aio.EOF:
        out.append(message)
    return out


async def health_of(channel: grpc.aio.Channel, service: str = "") -> int:
    response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))
    return response.status


async def until_health(channel: grpc.aio.Channel, status: int, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while await health_of(channel) != status:
            await asyncio.sleep(0.02)


async def health_and_state(channel: grpc.aio.Channel) -> tuple[int, str]:
    """Health and GetSnapshot's state, read in one step of the server's loop (no round can come between)."""
    snapshot = telemetry_pb2_grpc.GateTelemetryStub(channel).GetSnapshot(telemetry_pb2.GetSnapshotRequest())
    health = health_of(channel)
    both = await asyncio.gather(health, snapshot)
    return both[0], both[1].state


async def test_health_follows_the_rounds():  # starting, serving, stalled, serving, draining
    feeder = StallingFeeder()
    backend = SimBackend(ARGS, feeder, pace=0.5)
    controller = Controller(ARGS, backend, stop_when_idle=False)
    controller.start()
    plane = ControlPlane(controller, PlaneOptions(port=0, stall_after_s=0.3), out=io.StringIO())
    await plane.start()
    channel = grpc.aio.insecure_channel(plane.target)
    try:
        # The engine runs, but nothing has reached the controller: no round yet.
        assert [await health_of(channel, s) for s in ("", *SERVICE_NAMES)] == [NOT_SERVING] * 4
        run = asyncio.create_task(controller.run())
        await until_health(channel, SERVING)
        assert [await health_of(channel, s) for s in SERVICE_NAMES] == [SERVING] * 3
        assert await health_and_state(channel) == (SERVING, "serving")
        feeder.hold.set()  # no round for longer than --stall-after
        await until_health(channel, NOT_SERVING)
        for _ in range(5):  # health and the snapshot agree on the stall (they read one decision)
            status, state = await health_and_state(channel)
            assert (status, state) == (NOT_SERVING, "stalled")
            await asyncio.sleep(0.05)
        snapshot = await telemetry_pb2_grpc.GateTelemetryStub(channel).GetSnapshot(telemetry_pb2.GetSnapshotRequest())
        assert snapshot.last_round_age_seconds >= 0.3
        feeder.hold.clear()
        await until_health(channel, SERVING)
        assert (await health_and_state(channel))[1] == "serving"
        await plane.drain()
        assert await health_of(channel) == NOT_SERVING
        assert controller.stopped.is_set() and run.done()
    finally:
        feeder.hold.clear()
        await channel.close()
        await plane.stop()
        backend.close()


async def test_reflection_lists_and_describes_the_services():  # grpcurl works without the .proto files
    async with serving(ARGS) as served:
        stub = reflection_pb2_grpc.ServerReflectionStub(served.channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="prefill_gate.v1.GateAdmin"),
        ]
        responses = [response async for response in stub.ServerReflectionInfo(iter(requests))]
    listed = {service.name for service in responses[0].list_services_response.service}
    assert set(SERVICE_NAMES) | {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= listed
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in responses[1].file_descriptor_response.file_descriptor_proto
    ]
    admin = next(f for f in files if f.name == "prefill_gate/v1/admin.proto")
    assert [m.name for m in admin.service[0].method] == ["GetConfig", "UpdateIntervals"]


async def test_mutating_calls_need_the_token_and_reading_needs_none():  # bearer auth
    async with serving(ARGS) as served:
        change = admin_pb2.UpdateIntervalsRequest(attempt_interval=2, any_interval=6, validate_only=True)
        cases = {
            (): grpc.StatusCode.UNAUTHENTICATED,
            (("authorization", "Basic dXNlcjpwdw=="),): grpc.StatusCode.UNAUTHENTICATED,
            (("authorization", "Bearer "),): grpc.StatusCode.UNAUTHENTICATED,
            (("authorization", "Bearer wrong"),): grpc.StatusCode.PERMISSION_DENIED,
            (("authorization", f"Bearer {TOKEN}"[:-1]),): grpc.StatusCode.PERMISSION_DENIED,
        }
        for metadata, code in cases.items():
            for call in (
                served.admin.UpdateIntervals(change, metadata=metadata),
                served.requests.Abort(requests_pb2.AbortRequest(request_id="r"), metadata=metadata),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == code, metadata
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in served.requests.Submit(requests_pb2.SubmitRequest(prompt_len=4), metadata=metadata):
                    pass
            assert refused.value.code() == code
        assert (await served.admin.UpdateIntervals(change, metadata=served.auth)).validated_only
        await served.admin.GetConfig(admin_pb2.GetConfigRequest())
        await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())
        await served.telemetry.GetRounds(telemetry_pb2.GetRoundsRequest())
        assert served.controller.metrics.submitted == 0
    async with serving(ARGS, token=None) as open_server:  # no token configured: loopback, changes open
        assert (await open_server.admin.UpdateIntervals(change)).validated_only


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its key (openssl CLI; `cryptography` is not installed)."""
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


async def test_tls(tmp_path: Path):  # --tls-cert/--tls-key
    key, cert = self_signed(tmp_path)
    async with serving(ARGS, tls_cert=str(cert), tls_key=str(key)) as served:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with grpc.aio.secure_channel(served.plane.target, credentials) as secure:
            config = await admin_pb2_grpc.GateAdminStub(secure).GetConfig(admin_pb2.GetConfigRequest())
            change = admin_pb2.UpdateIntervalsRequest(attempt_interval=3, any_interval=9, validate_only=True)
            checked = await admin_pb2_grpc.GateAdminStub(secure).UpdateIntervals(change, metadata=served.auth)
        with pytest.raises(grpc.aio.AioRpcError) as plain:
            await served.admin.GetConfig(admin_pb2.GetConfigRequest(), timeout=2)  # plaintext to a TLS port
        # `ctl` without --tls-ca says what to try, instead of only asking whether the engine runs.
        parser = argparse.ArgumentParser(prog="prefill-gate")
        add_ctl_parser(parser.add_subparsers(dest="command"))
        ns = parser.parse_args(["ctl", "--target", served.plane.target, "--timeout", "3", "snapshot"])
        err = io.StringIO()
        code = await asyncio.to_thread(ctl_main, ns, io.StringIO(), err)
    assert config.attempt_interval == 2 and checked.validated_only
    assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    assert code == 1 and "error: UNAVAILABLE" in err.getvalue() and "--tls-ca" in err.getvalue(), err.getvalue()
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        PlaneOptions(tls_cert=str(cert))


async def test_a_busy_port_is_an_error():
    async with serving(ARGS) as served:
        controller = Controller(ARGS, SimBackend(ARGS))
        second = ControlPlane(controller, PlaneOptions(port=served.plane.port), out=io.StringIO())
        with pytest.raises(OSError, match="cannot bind"):
            await second.start()


async def test_drain_ends_every_stream_cleanly_and_stops_the_ranks():  # the SIGTERM path
    async with serving(ARGS, pace=1.0) as served:
        lossless = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest())
        latest = served.telemetry.WatchRounds(
            telemetry_pb2.WatchRoundsRequest(mode=telemetry_pb2.WATCH_MODE_LATEST_ONLY)
        )
        submit = served.requests.Submit(
            requests_pb2.SubmitRequest(prompt_len=64, output_len=2000), metadata=served.auth
        )
        assert (await submit.read()).HasField("accepted")
        await lossless.read()
        await served.plane.drain()
        # Every rank left its loop (the backend said so) before the streams ended.
        assert served.controller.stopped.is_set() and served.controller.state == "stopped"
        last_round = served.controller.latest.round
        seen = [record.round for record in await read_to_end(lossless)]  # what was queued, then the end
        rest = await read_to_end(latest)
        events = []
        with pytest.raises(grpc.aio.AioRpcError) as cut:
            while (event := await submit.read()) is not grpc.aio.EOF:
                events.append(event)
        late = [record async for record in served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest())]
        codes = [await call.code() for call in (lossless, latest)]
        snapshot = await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())
        assert await health_of(served.channel) == NOT_SERVING
    assert codes == [grpc.StatusCode.OK] * 2  # not UNAVAILABLE: the client can tell a drain from a crash
    assert seen[-1] == last_round and rest[-1].round == last_round and late == []
    # The request the stop cut short says so, with what it generated, and its call is no success.
    finished = events[-1].finished
    assert finished.reason == "cut_off" and 0 < finished.output_len < 2000 and "stopped" in finished.detail
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE and cut.value.details() == finished.detail
    stats = snapshot.stats
    assert (stats.requests_submitted, stats.requests_cut_off, stats.requests_finished) == (1, 1, 0)
    assert snapshot.state == "stopped" and snapshot.failure == ""


def test_server_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # loopback; the token from env or a file
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    options = check_server_args(parser.parse_args([]))
    assert (options.host, options.port, options.token, options.loopback) == (
        "127.0.0.1",
        DEFAULT_PORT,
        "from-env",
        True,
    )
    assert "from-env" not in parser.format_help()  # the token never shows up as a default
    options = check_server_args(parser.parse_args(["--admin-token", "flag", "--host", "0.0.0.0", "--port", "0"]))
    assert options.token == "flag" and not options.loopback
    token_file, empty = tmp_path / "token", tmp_path / "empty"
    token_file.write_text("from-file\n")
    empty.write_text("\n")
    assert check_server_args(parser.parse_args(["--admin-token-file", str(token_file)])).token == "from-file"
    assert "--admin-token-file" in parser.format_help() and "ps" in parser.format_help()
    for argv, message in (
        (["--tls-cert", "cert.pem"], "go together"),
        (["--tls-cert", "missing.pem", "--tls-key", "missing.key"], "--tls-cert missing.pem: no such file"),
        (["--port", "70000"], "--port"),
        (["--history", "0"], "--history"),
        (["--stall-after", "0"], "--stall-after"),
        (["--record", "/no/such/dir/run.pgrec"], "--record"),
        (["--admin-token-file", str(tmp_path / "missing")], "--admin-token-file .*missing: cannot read it"),
        (["--admin-token-file", str(empty)], "the file holds no token"),
        (["--admin-token", "x", "--admin-token-file", str(token_file)], "exclude each other"),
    ):
        with pytest.raises(ValueError, match=message):
            check_server_args(parser.parse_args(argv))


async def test_garbage_protobuf_is_an_invalid_argument_and_changes_nothing():  # every service, by hand-made bytes
    truncated_varint = b"\x08"  # field 1 (varint) with no value
    short_bytes = b"\x0a\x05ab"  # field 1 (length 5) with two bytes
    bad_tag = b"\x00\x01"  # field number 0 is not a field
    calls = [
        ("/prefill_gate.v1.GateTelemetry/GetSnapshot", "unary", truncated_varint),
        ("/prefill_gate.v1.GateTelemetry/GetRounds", "unary", short_bytes),
        ("/prefill_gate.v1.GateTelemetry/WatchRounds", "stream", bad_tag),
        ("/prefill_gate.v1.GateAdmin/UpdateIntervals", "unary", truncated_varint),
        ("/prefill_gate.v1.GateRequests/Submit", "stream", short_bytes),
        ("/prefill_gate.v1.GateRequests/Abort", "unary", bad_tag),
    ]
    async with serving(ARGS) as served:
        before = served.controller.config
        for method, kind, body in calls:
            make = served.channel.unary_unary if kind == "unary" else served.channel.unary_stream
            call = make(method)(body, metadata=served.auth)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                if kind == "unary":
                    await call
                else:
                    await read_to_end(call)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, refused.value)
            request_type = f"prefill_gate.v1.{method.rsplit('/', 1)[1]}Request"
            assert f"the request is not a valid {request_type}" in refused.value.details(), refused.value.details()
        snapshot = await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())
        assert served.controller.config == before and snapshot.stats.requests_submitted == 0
        assert snapshot.state == "serving"  # and the server still serves
