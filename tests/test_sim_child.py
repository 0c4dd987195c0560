"""The simulator in a child process: the same run as in a thread, and a death that is noticed."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from control.host.backends import SimBackend
from control.host.controller import Controller
from control.host.sim_child import SimProcessBackend
from engine.drivers.procs import RankFailure
from tests.helpers import sim_args
from workloads import Fixed, Poisson, Workload


def run_args():
    return sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6)


def workload() -> Workload:
    return Workload(Poisson(200.0), dp_size=3, prompt=Fixed(64), output=Fixed(16), seed=7)


async def run_to_end(backend) -> Controller:
    controller = Controller(run_args(), backend, stop_when_idle=False)
    await asyncio.get_running_loop().run_in_executor(None, controller.start)
    await asyncio.wait_for(controller.run(), 60)
    return controller


async def test_the_child_runs_exactly_the_run_the_thread_runs():  # one engine, two homes
    # A bound in rounds, not a stop timed by the controller: then the virtual clock makes the run exact.
    threaded = await run_to_end(SimBackend(run_args(), workload(), max_rounds=800))
    child = await run_to_end(SimProcessBackend(run_args(), workload(), max_rounds=800))
    summary = child.summary()
    assert summary == threaded.summary()
    assert summary.rounds == 800 and summary.requests_finished > 50 and child.state == "stopped"
    assert summary.requests_submitted == summary.requests_finished + summary.requests_cut_off
    assert child.records_dropped() == 0


async def test_a_killed_child_is_a_failure_not_a_stop():
    backend = SimProcessBackend(run_args(), None, pace=1.0)
    controller = Controller(run_args(), backend, stop_when_idle=False)
    await asyncio.get_running_loop().run_in_executor(None, controller.start)
    run = asyncio.create_task(controller.run())
    async with asyncio.timeout(30):
        while controller.latest is None:
            await asyncio.sleep(0.01)
    os.kill(backend.pid, signal.SIGKILL)
    with pytest.raises(RankFailure, match="killed by signal 9"):
        await asyncio.wait_for(run, 30)
    assert controller.state == "failed" and "the simulator process" in controller.failure


def test_a_bad_preset_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="unknown sim preset 'nope'"):
        SimProcessBackend(sim_args(sim_preset="nope"))


def test_a_controller_that_falls_behind_loses_records_not_requests():  # the engine never waits
    import time

    from engine.request import Finished

    backend = SimProcessBackend(run_args(), workload(), record_queue_size=5, max_rounds=600)
    backend.start()
    try:
        time.sleep(2.0)  # nobody polls: records pile up in flight until the bound, then are counted
        polled = backend.poll()
        assert len(polled.records) <= 5 and backend.records_dropped() > 0
        deadline = time.monotonic() + 60
        while not polled.stopped and time.monotonic() < deadline:
            time.sleep(0.01)
            polled.add(backend.poll())
    finally:
        backend.close()
    assert polled.stopped
    reference = SimBackend(run_args(), workload(), max_rounds=600)  # the same run in a thread
    reference.run()
    expected = reference.poll()

    def finished(p) -> list[str]:
        return sorted(event.rid for event in p.events if isinstance(event, Finished))

    assert len(finished(expected)) > 10 and finished(polled) == finished(expected)  # no request event lost
    assert len(polled.records) + backend.records_dropped() == len(expected.records) == 600
