"""What the control plane says when the engine fails: a rank killed outright (SIGKILL) mid-run."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
import pytest

from control.host.backends import ProcessBackend
from engine.drivers.procs import RankFailure
from prefill_gate.v1 import requests_pb2, telemetry_pb2
from tests.grpc_plane import serving
from tests.helpers import sim_args


async def events_and_status(call) -> tuple[list, grpc.aio.AioRpcError | None]:
    """Every message of a server stream, and the error it ended with (None: it ended OK)."""
    out = []
    try:
        while (message := await call.read()) is not grpc.aio.EOF:
            out.append(message)
    except grpc.aio.AioRpcError as exc:
        return out, exc
    return out, None


async def test_a_killed_rank_ends_every_stream_unavailable_and_cuts_off_every_request():  # truth under faults
    args = sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6, kv_pages=8192)
    backend = ProcessBackend(args)
    with pytest.raises(RankFailure, match="rank 1"):
        async with serving(args, backend=backend) as served:
            watch = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest())
            latest = served.telemetry.WatchRounds(
                telemetry_pb2.WatchRoundsRequest(mode=telemetry_pb2.WATCH_MODE_LATEST_ONLY)
            )
            submits = [
                served.requests.Submit(
                    requests_pb2.SubmitRequest(prompt_len=32, output_len=60_000, rank=rank), metadata=served.auth
                )
                for rank in (0, 1, 1)
            ]
            for call in submits:
                assert (await call.read()).HasField("accepted")
            for call in submits:
                assert (await call.read()).HasField("first_token")  # tokens are being generated
            await watch.read()
            os.kill(backend.pids[1], signal.SIGKILL)
            _, watch_error = await events_and_status(watch)
            _, latest_error = await events_and_status(latest)
            ended = [await events_and_status(call) for call in submits]
            snapshot = await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())
            late = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest())
            _, late_error = await events_and_status(late)
            await asyncio.sleep(0)
    for error in (watch_error, latest_error, late_error):  # never OK: a crash is not a clean stop
        assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
        assert "rank 1" in error.details() and "last round published" in error.details()
    for events, error in ended:
        finished = events[-1].finished
        assert finished.reason == "cut_off" and finished.output_len >= 1 and "rank 1" in finished.detail
        assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
    assert snapshot.state == "failed" and "rank 1" in snapshot.failure
    stats = snapshot.stats
    assert stats.requests_submitted == 3 == stats.requests_cut_off
    assert stats.requests_finished + stats.requests_aborted + stats.requests_refused == 0
