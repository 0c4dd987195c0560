"""The round stream and history over a real server: bounded queues, latest-only, rank filter, resume."""

from __future__ import annotations

import asyncio
import itertools
import time

import grpc
import pytest

from control.host.backends import SimBackend
from control.plane import hub, services
from control.plane.ctl import FRESH_STREAM_OPTIONS
from prefill_gate.v1 import telemetry_pb2, telemetry_pb2_grpc
from prefill_gate.v1 import types_pb2 as pb
from tests.grpc_plane import bad_fields, serving
from tests.helpers import sim_args
from workloads import ClosedLoop, Fixed, Workload

LATEST_ONLY = telemetry_pb2.WATCH_MODE_LATEST_ONLY
# A reader that does not buffer ahead: with gRPC's default receive window (BDP probing) hundreds of
# records would sit in HTTP/2 buffers, fresh when sent and stale when read (PRACTICE.md).
SMALL_WINDOW = list(FRESH_STREAM_OPTIONS)


def gate_args(**overrides):
    return sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6, **overrides)


async def test_slow_subscriber_slows_neither_the_engine_nor_a_fast_subscriber():  # the hub's bounded queues
    # A closed loop keeps the unpaced simulator busy: thousands of records a second, far more than any
    # transport buffer holds, so the slow reader must lose records at the hub and be told so.
    args = gate_args(dp_size=8)
    workload = Workload(ClosedLoop(64), dp_size=8, prompt=Fixed(64), output=Fixed(32), seed=0)
    async with serving(args, backend=SimBackend(args, workload, pace=None)) as served:
        fast_rounds: list[tuple[float, int]] = []

        async def fast() -> None:
            async for record in served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest()):
                fast_rounds.append((time.monotonic(), record.round))

        def rates(start: float, end: float) -> tuple[float, float]:
            """(engine rounds/s, fast subscriber records/s) over [start, end]."""
            seen = [r for t, r in fast_rounds if start <= t <= end]
            return (engine_at[end] - engine_at[start]) / (end - start), len(seen) / (end - start)

        engine_at: dict[float, int] = {}

        def mark() -> float:
            now = time.monotonic()
            engine_at[now] = served.controller.latest.round
            return now

        fast_task = asyncio.create_task(fast())
        await served.wait_round(200)
        await asyncio.sleep(0.3)
        a0 = mark()
        await asyncio.sleep(1.0)
        a1 = mark()
        slow_channel = grpc.aio.insecure_channel(served.plane.target, options=SMALL_WINDOW)
        slow_stub = telemetry_pb2_grpc.GateTelemetryStub(slow_channel)
        slow_stream = slow_stub.WatchRounds(telemetry_pb2.WatchRoundsRequest(max_queue=4))
        slow: list[pb.RoundRecord] = []
        b0 = mark()
        for _ in range(4):  # one record a second
            slow.append(await slow_stream.read())
            await asyncio.sleep(1.0)
        b1 = mark()
        slow_stream.cancel()
        await slow_channel.close()
        c0 = mark()
        await asyncio.sleep(1.0)
        c1 = mark()
        fast_task.cancel()

    # The slow reader's window B against windows before (A) and after (C) it: the lower of the two, so
    # that other work starting on this shared machine meanwhile does not read as the slow reader's cost.
    (engine_a, fast_a), (engine_b, fast_b), (engine_c, fast_c) = rates(a0, a1), rates(b0, b1), rates(c0, c1)
    assert engine_a > 50 and fast_a > 50  # an idle paced simulator waits between rounds instead of spinning
    assert engine_b >= 0.5 * min(engine_a, engine_c), (engine_a, engine_b, engine_c)
    assert fast_b >= 0.5 * min(fast_a, fast_c), (fast_a, fast_b, fast_c)
    assert any(record.dropped_before > 0 for record in slow), [r.dropped_before for r in slow]
    # What the slow reader lost is what the counts say: rounds it saw differ by dropped_before + 1.
    for older, newer in itertools.pairwise(slow):
        assert newer.round - older.round == newer.dropped_before + 1


async def read_sleeping(stub: telemetry_pb2_grpc.GateTelemetryStub, request, seconds: float, nap: float):
    """Read for `seconds`, sleeping `nap` between messages; per record: (record, its age when read,
    the seconds it spent between the server's write and the read), in seconds."""
    out = []
    stream = stub.WatchRounds(request)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        record = await stream.read()
        now = time.time_ns()
        out.append((record, (now - record.unix_nanos) / 1e9, (now - record.sent_unix_nanos) / 1e9))
        await asyncio.sleep(nap)
    stream.cancel()
    return out


async def test_a_sleeping_reader_gets_fresh_records_or_is_told_what_it_missed():  # freshness (WatchRounds)
    # The unpaced simulator publishes about a thousand rounds a second; the readers take ten.
    # (bench/bench_watch.py runs the same readers for 60 s.)
    args = gate_args(dp_size=8)
    workload = Workload(ClosedLoop(64), dp_size=8, prompt=Fixed(64), output=Fixed(32), seed=0)
    async with serving(args, backend=SimBackend(args, workload, pace=None), channel_options=SMALL_WINDOW) as served:
        await served.wait_round(200)
        stub = served.telemetry
        latest = await read_sleeping(stub, telemetry_pb2.WatchRoundsRequest(mode=LATEST_ONLY), 2.5, 0.1)
        bounded = await read_sleeping(stub, telemetry_pb2.WatchRoundsRequest(max_queue=64), 2.5, 0.1)
        engine_rounds = served.controller.latest.round
    assert engine_rounds > 1000 and len(latest) >= 10 and len(bounded) >= 10
    # Nothing waits in the transport for long: about one nap.
    assert max(transit for _, _, transit in latest + bounded) <= 1.0
    # LATEST_ONLY: the newest record when it was sent, and so fresh when read.
    assert all(record.latest_round == record.round for record, _, _ in latest)
    assert max(age for _, age, _ in latest) <= 1.0, [round(age, 2) for _, age, _ in latest]
    # LOSSLESS_BOUNDED: less than the queue bound behind when sent, and every skipped round counted exactly.
    assert all(record.latest_round - record.round < 64 for record, _, _ in bounded)
    for older, newer in itertools.pairwise([record for record, _, _ in bounded]):
        assert newer.round - older.round == newer.dropped_before + 1
    assert sum(record.dropped_before for record, _, _ in bounded) > 0


async def test_resume_replays_every_held_round_whatever_the_queue_bound():  # resume without loss
    args = gate_args()
    busy = SimBackend(args, Workload(ClosedLoop(8), dp_size=2, prompt=Fixed(64), output=Fixed(32), seed=0))
    async with serving(args, backend=busy, history=1024) as served:
        await served.wait_round(1200)
        start = served.controller.hub.first_round + 300  # deep in the ring, far beyond the queue bound
        stream = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest(from_round=start, max_queue=16))
        first = await stream.read()
        await asyncio.sleep(0.3)  # live rounds pile up behind the replay meanwhile
        held = first.latest_round - start + 1
        replayed = [first] + [await stream.read() for _ in range(held + 50)]
        stream.cancel()
    assert held > 600
    assert [record.round for record in replayed[:held]] == list(range(start, start + held))  # all, in order
    assert all(record.dropped_before == 0 for record in replayed[:held])
    for older, newer in itertools.pairwise(replayed):  # past the replay the bound may drop, and says so
        assert newer.round - older.round == newer.dropped_before + 1


async def test_latest_only_with_a_rank_filter_keeps_only_the_newest_record_of_the_chosen_ranks():
    async with serving(gate_args(dp_size=4), pace=1.0, channel_options=SMALL_WINDOW) as served:
        request = telemetry_pb2.WatchRoundsRequest(mode=LATEST_ONLY, ranks=[1, 3])
        stream = served.telemetry.WatchRounds(request)
        first = await stream.read()
        await asyncio.sleep(0.5)
        # What the 1 KiB receive window already held comes first (a dozen idle records), then the newest.
        later = [await stream.read()]
        while later[-1].dropped_before < 50 and len(later) < 40:
            later.append(await stream.read())
        newest = served.controller.latest.round
        stream.cancel()
    assert [row.rank for row in first.ranks] == [1, 3]
    assert all([row.rank for row in record.ranks] == [1, 3] for record in later)
    # After the pause the stream jumps to the newest round and says how much it skipped.
    jumped = later[-1]
    assert jumped.dropped_before >= 50 and jumped.round - first.round > 50
    assert newest - jumped.round < jumped.dropped_before / 2  # fresh, unlike what the window held


async def test_resume_from_history_or_learn_where_it_starts():  # etcd-style resume
    async with serving(gate_args(), pace=1.0, history=256) as served:
        await served.wait_round(600)
        start = served.controller.latest.round - 50  # well inside the ring while the call travels
        stream = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest(from_round=start))
        resumed = [await stream.read() for _ in range(100)]  # history, then live rounds, without a gap
        stream.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest(from_round=5)):
                pass
        future = served.controller.latest.round + 50
        ahead = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest(from_round=future))
        starts_at = (await ahead.read()).round
        ahead.cancel()
    assert [r.round for r in resumed] == list(range(start, start + 100))
    assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "history starts at round" in refused.value.details()
    metadata = dict(refused.value.trailing_metadata())
    held_then = int(metadata[services.HISTORY_FIRST_ROUND_KEY])
    assert held_then > 5 and str(held_then) in refused.value.details()
    assert starts_at == future  # a round still to come: the stream starts when it happens


async def test_get_rounds_returns_a_range_of_the_history(monkeypatch):
    async with serving(gate_args(dp_size=4), pace=1.0) as served:
        await served.wait_round(400)
        stub = served.telemetry
        held = await stub.GetRounds(telemetry_pb2.GetRoundsRequest())
        some = await stub.GetRounds(telemetry_pb2.GetRoundsRequest(from_round=300, to_round=309, ranks=[2]))
        monkeypatch.setattr(services, "ROUNDS_RESPONSE_BYTES", 2000)
        page = await stub.GetRounds(telemetry_pb2.GetRoundsRequest(from_round=300))
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.GetRounds(telemetry_pb2.GetRoundsRequest(from_round=10, to_round=5, ranks=[4]))
    assert not held.truncated and held.history_first_round == 0 == held.records[0].round
    assert [r.round for r in held.records] == list(range(held.history_last_round + 1))
    assert [r.round for r in some.records] == list(range(300, 310))
    assert all([row.rank for row in r.ranks] == [2] for r in some.records)
    assert page.truncated and page.records[0].round == 300 and page.records[-1].round < page.history_last_round
    assert sum(r.ByteSize() + 8 for r in page.records) <= 2000  # the page stops before the size bound
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_fields(bad.value) == {"to_round", "ranks"}


async def test_watch_rejects_bad_parameters_by_field():
    async with serving(gate_args(dp_size=2)) as served:
        request = telemetry_pb2.WatchRoundsRequest(ranks=[0, 2], max_queue=hub.MAX_QUEUE + 1, mode=7)
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            async for _ in served.telemetry.WatchRounds(request):
                pass
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_fields(bad.value) == {"ranks", "max_queue", "mode"}
