"""The round hub and the controller's admin checks, without a server."""

from __future__ import annotations

import asyncio

import pytest

from control.host.backends import SimBackend
from control.host.controller import ConfigRejected, Controller, RequestRejected
from control.plane.hub import OutOfHistory, RoundHub
from engine.config import MAX_INTERVAL, ServerArgs
from engine.gate import GatePoint
from engine.record import RoundRecord
from engine.request import RequestSpec
from engine.rows import Row
from tests.helpers import sim_args


def record(round_index: int, ranks: int = 3) -> RoundRecord:
    rows = tuple(Row(rank=r, round=round_index, pool_pages_usable=64) for r in range(ranks))
    return RoundRecord(round_index, 0, 0.0, 0, GatePoint.ALL, False, 0, True, 0.0, rows, "gate", 0, 2, 6)


async def drain(subscriber) -> list:
    out = []
    while (message := await subscriber.next()) is not None:
        out.append(message)
    return out


async def test_bounded_queue_drops_the_oldest_and_counts_them():
    hub = RoundHub("run")
    bounded = hub.subscribe(max_queue=3)
    latest = hub.subscribe(latest_only=True, ranks=[2])
    for i in range(10):
        hub.publish(record(i))
    hub.close_all()
    kept = await drain(bounded)
    newest = await drain(latest)
    assert [(m.round, m.dropped_before) for m in kept] == [(7, 7), (8, 0), (9, 0)]
    assert [(m.round, m.dropped_before, [r.rank for r in m.ranks]) for m in newest] == [(9, 9, [2])]
    assert len(hub.latest().ranks) == 3  # a filtered copy never changes the shared message


async def test_resume_history_resize_taps_and_close():
    hub = RoundHub("run", history=5)
    seen = []
    hub.add_tap(seen.append)
    for i in range(8):
        hub.publish(record(i))
    assert (hub.first_round, hub.last_round, hub.capacity) == (3, 7, 5)
    with pytest.raises(OutOfHistory, match="history starts at round 3"):
        hub.subscribe(from_round=2)
    resumed = hub.subscribe(from_round=5)
    hub.resize(2)
    hub.remove_tap(seen.append)
    hub.publish(record(8))
    assert (hub.first_round, hub.capacity) == (7, 2)
    assert [m.round for m in seen] == list(range(8))
    hub.close_all()
    hub.publish(record(9))  # after the drain nothing more reaches a stream
    assert [m.round for m in await drain(resumed)] == [5, 6, 7, 8]
    late = hub.subscribe(from_round=8)
    assert [m.round for m in await asyncio.wait_for(drain(late), 1)] == [8, 9]
    assert hub.subscriber_count == 1  # `late` was never added: it ended at once


def test_interval_checks_name_every_bad_field():  # rules C2, C3
    args = sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    controller = Controller(args, SimBackend(args))

    def fields(*call_args, **kwargs) -> list[str]:
        with pytest.raises(ConfigRejected) as rejected:
            controller.validate_intervals(*call_args, **kwargs)
        return [name for name, _ in rejected.value.violations]

    def startup_text(attempt, any_) -> str:
        with pytest.raises(ValueError) as refused:
            ServerArgs(executor="sim", prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)
        return str(refused.value)

    # Exactly the property's words (C3), once as the message and as each named field's description;
    # the field at fault only, as the property names it.
    for attempt, any_, at_fault in [
        (0, 5, ["attempt_interval"]),
        (-1, MAX_INTERVAL + 1, ["attempt_interval"]),  # the first problem, as startup reports it
        (2, MAX_INTERVAL + 1, ["any_interval"]),
        (4, 2, ["any_interval", "attempt_interval"]),  # K < A is a problem of both
        (4, None, ["any_interval"]),  # the missing one
        (None, 7, ["attempt_interval"]),
    ]:
        with pytest.raises(ConfigRejected) as rejected:
            controller.validate_intervals(attempt, any_)
        text = startup_text(attempt, any_)
        assert str(rejected.value) == text
        assert rejected.value.violations == [(name, text) for name in at_fault]
    assert fields(None, None) == ["attempt_interval", "any_interval"]
    assert fields(None, 3, disable=True) == ["any_interval"]
    assert controller.validate_intervals(MAX_INTERVAL, MAX_INTERVAL).prefill_delay.any_interval == MAX_INTERVAL
    assert controller.validate_intervals(None, None, disable=True).prefill_delay is None
    assert controller._accepted_args.prefill_delay.attempt_interval == 2  # validation changed nothing
    assert controller._accepted_epoch == 0 and controller.config.epoch == 0


def test_submission_checks_name_every_bad_field():
    args = sim_args(kv_pages=8, page_size=16)
    controller = Controller(args, SimBackend(args))
    spec = RequestSpec("r", prompt_len=100, output_len=100, prefix_hit=100, prompt=(1,) * 3)
    with pytest.raises(RequestRejected) as rejected:
        controller.submit(spec, rank=2)
    assert [name for name, _ in rejected.value.violations] == [
        "prompt_len", "prefix_hit", "prompt_len", "output_len", "rank"
    ]  # fmt: skip
    assert controller.request_violations(RequestSpec("r", 16, 16), rank=1) == []
