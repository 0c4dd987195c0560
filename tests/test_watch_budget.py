"""The WatchRounds send budget (`serve --watch-send-budget`): bounded, fair, every drop told.

The arithmetic (`TokenTurns`) runs on a fake clock, so the bound and the shares are checked exactly; the
hub's streams run on the event loop with the budget's clock held by hand, so a token comes exactly when
the test says; one test goes through a real server for the flag and the snapshot's fields.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.source import unbatch
from control.plane.budget import BURST_S, DEFAULT_SEND_BUDGET, MAX_SEND_BUDGET, SendBudget, TokenTurns
from control.plane.grpc_server import add_server_args, check_server_args
from control.plane.hub import RoundHub
from prefill_gate.v1 import telemetry_pb2
from tests.grpc_plane import serving
from tests.test_ctl import ctl
from tests.test_hub import record
from tests.test_watch_batches import busy_backend, gate_args

STEP_S = 0.001


def simulate(rate: float, wants: dict[str, tuple[float, float]], seconds: float) -> dict[str, list[float]]:
    """Streams that want to send without pause while `start <= t < stop`: the times each one sent."""
    turns = TokenTurns(rate, 0.0)
    sent: dict[str, list[float]] = {name: [] for name in wants}
    waiting: set[str] = set()
    for step in range(round(seconds / STEP_S)):
        now = step * STEP_S
        for name, (start, stop) in wants.items():
            if name in waiting or not start <= now < stop:
                continue
            if turns.take(now):
                sent[name].append(now)
            else:
                turns.wait(name)
                waiting.add(name)
        for name in turns.grant(now):
            waiting.discard(name)
            sent[name].append(now)
    return sent


def most_in_a_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    best, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= window_s - 1e-9:
            first += 1
        best = max(best, last - first + 1)
    return best


@pytest.mark.parametrize("rate", [50, 400, 1200])
@pytest.mark.parametrize("streams", [1, 3, 32])
def test_the_budget_is_never_exceeded_over_any_window(rate, streams):
    sent = simulate(rate, {f"s{i}": (0.0, 9.0) for i in range(streams)}, 3.0)
    every = [t for times in sent.values() for t in times]
    burst = max(1.0, rate * BURST_S)
    for window_s in (0.01, 0.1, 0.5, 1.0):
        assert most_in_a_window(every, window_s) <= burst + rate * window_s + 1
    wanted = min(rate, streams / STEP_S)  # a simulated stream sends at most once a step
    assert len(every) >= wanted * 3.0 * 0.95  # and it is spent: waiting streams get what there is


def test_streams_that_all_want_to_send_share_it_evenly():
    sent = simulate(300, {f"s{i}": (0.0, 9.0) for i in range(6)}, 2.0)
    counts = [len(times) for times in sent.values()]
    assert max(counts) - min(counts) <= 1  # in turn: nobody gets two before another gets one
    assert min(counts) >= 300 * 2.0 / 6 * 0.95  # at least budget / streams each


def test_an_idle_streams_share_goes_to_the_others():
    # c sends only in the second second: a and b split the budget, then the three do.
    sent = simulate(300, {"a": (0.0, 9.0), "b": (0.0, 9.0), "c": (1.0, 9.0)}, 2.0)
    first = Counter(name for name, times in sent.items() for t in times if t < 1.0)
    second = Counter(name for name, times in sent.items() for t in times if t >= 1.0)
    assert first["c"] == 0
    assert first["a"] >= 150 * 0.95 and first["b"] >= 150 * 0.95
    assert min(second.values()) >= 100 * 0.95 and max(second.values()) - min(second.values()) <= 2


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def held(task: asyncio.Task, hub: RoundHub) -> None:
    """Let `task` run until its stream waits for the budget."""
    for _ in range(100):
        await asyncio.sleep(0)
        if any(s._held for s in hub._subscribers):
            return
    raise AssertionError("the stream never waited for the budget")


def budgeted_hub(rate: int) -> tuple[RoundHub, Clock]:
    hub, clock = RoundHub("run"), Clock()
    hub.send_budget = SendBudget(rate, clock=clock)
    return hub, clock


async def test_a_stream_over_its_share_drops_the_oldest_and_says_so():
    hub, clock = budgeted_hub(10)  # one token saved at most
    stream = hub.subscribe(max_queue=4, budgeted=True)
    hub.publish(record(0))
    assert (await stream.next()).round == 0  # the saved token
    reading = asyncio.create_task(stream.next())
    await asyncio.sleep(0)
    hub.publish(record(1))
    await held(reading, hub)
    for i in range(2, 11):
        hub.publish(record(i))  # the queue holds 4: rounds 1-6 go while the stream waits for its token
    await asyncio.sleep(0.02)
    assert not reading.done()  # no token: the clock did not move
    clock.now += 0.15  # a token and a half: the budget saves one at most
    message = await asyncio.wait_for(reading, 5)
    assert (message.round, message.dropped_before) == (7, 6)
    assert stream.budget_dropped == hub.budget_dropped == 6 == stream.dropped_total
    assert hub.watch_messages == 2
    # The rest of the queue follows, each message waiting for its token: nothing more is lost.
    rounds = []
    for _ in range(3):
        clock.now += 0.15
        message = await asyncio.wait_for(stream.next(), 5)
        rounds.append((message.round, message.dropped_before))
    assert rounds == [(8, 0), (9, 0), (10, 0)]


async def test_a_latest_only_stream_over_its_share_gets_the_newest():
    hub, clock = budgeted_hub(10)
    stream = hub.subscribe(latest_only=True, budgeted=True)
    hub.publish(record(0))
    assert (await stream.next()).round == 0
    reading = asyncio.create_task(stream.next())
    await asyncio.sleep(0)
    hub.publish(record(1))
    await held(reading, hub)
    for i in range(2, 10):
        hub.publish(record(i))
    clock.now += 0.15  # a token and a half: the budget saves one at most
    message = await asyncio.wait_for(reading, 5)
    assert (message.round, message.dropped_before, message.latest_round) == (9, 8, 9)
    assert hub.budget_dropped == 8


async def test_a_clean_stop_sends_what_is_queued_without_the_budget():
    hub, _ = budgeted_hub(10)  # the clock never moves: one token in all
    stream = hub.subscribe(max_queue=64, budgeted=True)
    for i in range(20):
        hub.publish(record(i))
    assert (await stream.next()).round == 0
    hub.close_all()  # the engine stopped: a drain must not wait for tokens
    rounds = [message.round async for message in drained(stream)]
    assert rounds == list(range(1, 20))


async def drained(stream):
    while (message := await asyncio.wait_for(stream.next(), 5)) is not None:
        yield message


async def test_in_process_subscribers_and_an_unbudgeted_hub_are_not_held():
    hub, _ = budgeted_hub(10)
    inner = hub.subscribe(max_queue=64)  # the autotuner's kind: not a WatchRounds stream
    for i in range(20):
        hub.publish(record(i))
    assert [(await inner.next()).round for _ in range(20)] == list(range(20))
    free = RoundHub("run")
    free.set_send_budget(0)
    assert free.send_budget is None
    stream = free.subscribe(budgeted=True)
    for i in range(20):
        free.publish(record(i))
    assert [(await stream.next()).round for _ in range(20)] == list(range(20))
    assert free.watch_messages == 20 and free.budget_dropped == 0


async def test_batched_streams_below_the_budget_get_every_round():
    hub = RoundHub("run")
    hub.set_send_budget(1000)
    streams = [hub.subscribe(max_batch=128, max_batch_delay_s=0.02, budgeted=True) for _ in range(4)]
    one_by_one = hub.subscribe(max_queue=16, budgeted=True)  # the contrast: one message per record
    got: dict[int, list[int]] = {i: [] for i in range(5)}

    async def read(index, stream):
        while (message := await stream.next()) is not None:
            got[index].extend(r.round for r in unbatch(message))

    readers = [asyncio.create_task(read(i, s)) for i, s in enumerate([*streams, one_by_one])]
    for burst in range(40):  # 2,000 rounds in ~0.2 s: ~10,000 rounds/s
        for i in range(50):
            hub.publish(record(burst * 50 + i))
        await asyncio.sleep(0.005)
    hub.close_all()
    await asyncio.wait_for(asyncio.gather(*readers), 30)
    for index in range(4):
        assert got[index] == list(range(2000))
    lost = 2000 - len(got[4])
    assert lost > 0 and one_by_one.dropped_total == lost  # over its share: it lost records, every one told
    # Most while it waited for its turn (the budget's); the rest while its reader had not yet run.
    assert lost / 2 < hub.budget_dropped <= lost
    assert sum(s.dropped_total for s in streams) == 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    return parser.parse_args(argv)


@given(st.integers(min_value=-(10**7), max_value=10**7))
def test_the_flag_takes_exactly_the_integers_in_range(value):
    ns = parse(["--watch-send-budget", str(value)])
    if 0 <= value <= MAX_SEND_BUDGET:
        assert check_server_args(ns).watch_send_budget == value
    else:
        with pytest.raises(ValueError, match=r"^--watch-send-budget must be an integer in \[0, 1000000\]") as bad:
            check_server_args(ns)
        assert "\n" not in str(bad.value) and f"got {value}" in str(bad.value)


def test_the_flag_has_a_default_and_says_what_it_does():
    assert check_server_args(parse([])).watch_send_budget == DEFAULT_SEND_BUDGET
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    text = " ".join(parser.format_help().split())
    assert "--watch-send-budget MSGS_PER_S" in text and "dropped_before" in text and "0: no budget" in text
    with pytest.raises(SystemExit):
        parse(["--watch-send-budget", "many"])


async def test_the_snapshot_shows_the_budget_and_what_it_dropped():
    args = gate_args()
    async with serving(args, backend=busy_backend(args), watch_send_budget=50) as served:
        await served.wait_round(5)
        call = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest(max_queue=4))
        previous = None
        told = 0
        async for message in call:
            if previous is not None:
                assert message.round - previous - 1 == message.dropped_before
            told += message.dropped_before
            previous = message.round
            if told > 0 and served.controller.hub.watch_messages >= 20:
                break
        call.cancel()
        snapshot = await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())
        code, text, _ = await ctl(served.plane.target, "snapshot")
    assert snapshot.watch_send_budget == 50
    assert snapshot.watch_messages >= 20
    assert snapshot.watch_records_dropped_by_budget > 0
    assert code == 0 and "send budget 50 messages/s" in text and "records dropped by the budget" in text
