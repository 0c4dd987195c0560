"""WatchRounds in batches (max_batch > 1): every round once, in order, with its own ages; resume; refusals.

The hub's batching is checked without a server (deterministic: records published by hand), the
stream's over a real server and a busy simulator.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.source import unbatch
from control.host.backends import SimBackend
from control.plane import hub as hub_module
from control.plane.hub import MAX_BATCH, RoundHub, StreamFailed
from prefill_gate.v1 import telemetry_pb2
from tests.grpc_plane import bad_fields, serving
from tests.helpers import sim_args
from tests.test_hub import record
from workloads import ClosedLoop, Fixed, Workload

LATEST_ONLY = telemetry_pb2.WATCH_MODE_LATEST_ONLY


def busy_backend(args):
    workload = Workload(ClosedLoop(32), dp_size=args.dp_size, prompt=Fixed(64), output=Fixed(32), seed=0)
    return SimBackend(args, workload, pace=None)


def gate_args(**overrides):
    return sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6, **overrides)


async def test_a_batch_takes_what_is_queued_at_once_and_waits_no_longer_than_its_delay():
    hub = RoundHub("run")
    stream = hub.subscribe(max_batch=4, max_batch_delay_s=0.2)
    for i in range(6):
        hub.publish(record(i))
    started = time.monotonic()
    full = await stream.next()  # four were queued: no wait
    took_full = time.monotonic() - started
    partial = await stream.next()  # two queued, nothing more comes: out when the first one's delay passed
    took_partial = time.monotonic() - started
    assert [m.round for m in unbatch(full)] == [0, 1, 2, 3]
    assert [m.round for m in unbatch(partial)] == [4, 5]
    assert took_full < 0.15 and took_partial < 5.0  # bounded by the delay (and this machine's load)
    # The delay counts from publication: both records were published before `started`.
    assert took_partial - took_full < 0.2 + 0.5


async def test_a_clean_stop_sends_a_partial_batch_at_once_and_a_crash_fails_at_once():
    hub = RoundHub("run")
    stopping = hub.subscribe(max_batch=64, max_batch_delay_s=1.0)
    crashing = hub.subscribe(max_batch=64, max_batch_delay_s=1.0)
    hub.publish(record(0))
    first = asyncio.create_task(stopping.next())
    failed = asyncio.create_task(crashing.next())
    await asyncio.sleep(0.05)  # both wait for more records
    assert not first.done() and not failed.done()
    started = time.monotonic()
    crashing.fail("rank 1 lost")
    hub.publish(record(1))
    hub.close_all()
    message = await first
    with pytest.raises(StreamFailed, match="rank 1 lost"):
        await failed
    assert time.monotonic() - started < 0.5  # neither waited for its delay
    assert [m.round for m in unbatch(message)] == [0, 1]
    assert await stopping.next() is None


async def test_a_waiting_batch_empties_a_full_queue_instead_of_letting_it_drop():
    hub = RoundHub("run")
    stream = hub.subscribe(max_queue=4, max_batch=64, max_batch_delay_s=1.0)
    hub.publish(record(0))
    batch = asyncio.create_task(stream.next())
    for i in range(1, 13):  # three times the queue's bound while the batch waits for company
        await asyncio.sleep(0)
        hub.publish(record(i))
    await asyncio.sleep(0)
    hub.close_all()
    records = unbatch(await batch)
    assert [(m.round, m.dropped_before) for m in records] == [(i, 0) for i in range(13)]
    assert stream.dropped_total == 0


async def test_a_slow_batched_reader_is_told_every_gap_and_is_never_further_behind_than_queue_plus_batch():
    hub = RoundHub("run")
    max_queue, max_batch = 4, 8
    stream = hub.subscribe(max_queue=max_queue, max_batch=max_batch, max_batch_delay_s=0.01)
    records = []
    for i in range(200):
        hub.publish(record(i))
        if i % 13 == 12:  # a reader that takes a message now and then, far slower than the engine
            records += unbatch(await stream.next())
    hub.close_all()
    while (message := await stream.next()) is not None:
        records += unbatch(message)
    assert records[-1].round == 199 and sum(m.dropped_before for m in records) > 0
    previous = -1
    for message in records:
        assert message.round - previous - 1 == message.dropped_before  # every gap told, exactly
        assert message.latest_round - message.round <= max_queue + max_batch - 1
        previous = message.round


async def test_every_record_of_a_batch_carries_its_own_drops_and_rank_filter():
    hub = RoundHub("run")
    stream = hub.subscribe(max_batch=8, max_queue=3, ranks=[1])
    for i in range(10):
        hub.publish(record(i))
    hub.close_all()
    records = unbatch(await stream.next())
    assert [(m.round, m.dropped_before) for m in records] == [(7, 7), (8, 0), (9, 0)]
    assert all([row.rank for row in m.ranks] == [1] for m in records)
    assert all(m.latest_round == 9 and m.sent_unix_nanos > 0 for m in records)
    assert not any(m.following for m in records)  # never nested further


@settings(max_examples=60, deadline=None)
@given(
    max_queue=st.integers(-2, hub_module.MAX_QUEUE + 2),
    max_batch=st.integers(-2, MAX_BATCH + 2),
    delay_s=st.floats(-1.0, 3.0, allow_nan=False),
    latest_only=st.booleans(),
)
def test_bad_stream_parameters_are_refused_and_change_nothing(max_queue, max_batch, delay_s, latest_only):
    hub = RoundHub("run")
    problems = hub_module.watch_violations(max_queue, max_batch, delay_s, latest_only)
    good = (
        0 <= max_queue <= hub_module.MAX_QUEUE
        and 0 <= max_batch <= MAX_BATCH
        and not (latest_only and max_batch > 1)
        and 0 <= delay_s <= hub_module.MAX_BATCH_DELAY_S
    )
    assert (not problems) == good
    if good:
        hub.subscribe(max_queue=max_queue, max_batch=max_batch, max_batch_delay_s=delay_s, latest_only=latest_only)
        assert hub.subscriber_count == 1
    else:
        with pytest.raises(ValueError, match=problems[0][0]):
            hub.subscribe(max_queue=max_queue, max_batch=max_batch, max_batch_delay_s=delay_s, latest_only=latest_only)
        assert hub.subscriber_count == 0


async def test_a_batched_stream_delivers_every_round_once_in_order_with_ages():  # freshness (WatchRounds)
    args = gate_args(dp_size=4)
    async with serving(args, backend=busy_backend(args)) as served:
        await served.wait_round(100)
        start = served.controller.latest.round + 1
        request = telemetry_pb2.WatchRoundsRequest(from_round=start, max_batch=64, max_queue=65536)
        stream = served.telemetry.WatchRounds(request)
        sizes, records = [], []
        while len(records) < 3000:
            batch = unbatch(await stream.read())
            sizes.append(len(batch))
            records += batch
        stream.cancel()
    assert [m.round for m in records] == list(range(start, start + len(records)))  # once each, in order
    assert all(m.dropped_before == 0 for m in records)
    assert max(sizes) <= 64 and max(sizes) > 1 and len(sizes) < len(records)  # batched, never above the ask
    now = time.time_ns()
    for message in records:  # each record its own ages: published, then sent, then read
        assert 0 < message.unix_nanos <= message.sent_unix_nanos <= now
        assert message.latest_round >= message.round
    # No record waited in the server for more than its batch delay (50 ms) plus this machine's noise.
    assert max(m.sent_unix_nanos - m.unix_nanos for m in records) < 2e9


async def test_a_batched_resume_replays_every_held_round_whatever_the_queue_bound():  # resume without loss
    args = gate_args()
    async with serving(args, backend=busy_backend(args), history=1024) as served:
        await served.wait_round(1200)
        start = served.controller.hub.first_round + 300
        request = telemetry_pb2.WatchRoundsRequest(from_round=start, max_queue=16, max_batch=100)
        stream = served.telemetry.WatchRounds(request)
        first = unbatch(await stream.read())
        held = first[0].latest_round - start + 1
        replayed = list(first)
        while len(replayed) < held:
            replayed += unbatch(await stream.read())
        stream.cancel()
    assert held > 600 and len(first) == 100  # the held rounds were there: a full batch at once
    assert [m.round for m in replayed[:held]] == list(range(start, start + held))
    assert all(m.dropped_before == 0 for m in replayed[:held])


async def test_bad_batch_parameters_are_refused_by_field_and_change_nothing():
    async with serving(gate_args(dp_size=2)) as served:
        refused = {}
        bad_requests = {
            "too big": telemetry_pb2.WatchRoundsRequest(max_batch=MAX_BATCH + 1),
            "latest only": telemetry_pb2.WatchRoundsRequest(mode=LATEST_ONLY, max_batch=8),
            "delay": telemetry_pb2.WatchRoundsRequest(max_batch=8, max_batch_delay_ms=1001),
        }
        for name, request in bad_requests.items():
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                async for _ in served.telemetry.WatchRounds(request):
                    pass
            refused[name] = (bad.value.code(), bad_fields(bad.value), bad.value.details())
        subscribers = served.controller.hub.subscriber_count
        good = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest(max_batch=MAX_BATCH))
        assert (await good.read()).round >= 0
        good.cancel()
    assert refused == {
        "too big": (grpc.StatusCode.INVALID_ARGUMENT, {"max_batch"}, "invalid watch request"),
        "latest only": (grpc.StatusCode.INVALID_ARGUMENT, {"max_batch"}, "invalid watch request"),
        "delay": (grpc.StatusCode.INVALID_ARGUMENT, {"max_batch_delay_ms"}, "invalid watch request"),
    }
    assert subscribers == 0  # nothing was attached by a refused call
