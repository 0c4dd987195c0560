"""The tuner against a real engine over gRPC, under faults: killed mid-run, the engine restarted under it,
two tuners at once, an operator's change. The engine is the unpaced simulator behind a real server."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from contextlib import asynccontextmanager
from dataclasses import replace

import grpc

from control.host.backends import SimBackend
from engine.drivers.procs import free_port
from prefill_gate.v1 import admin_pb2, telemetry_pb2
from prefill_gate.v1 import types_pb2 as pb
from tests.grpc_plane import TOKEN, Served, serving
from tests.helpers import sim_args
from tuner.client import GrpcPlane
from tuner.core import Proposal, Tuner, TunerSettings
from tuner.law import Slo
from tuner.loop import Adopted, run_tuner
from workloads import Fixed, Poisson, Workload

ARGS = sim_args(
    dp_size=4,
    prefill_attempt_interval=8,
    prefill_any_attempt_interval=64,
    max_num_seqs=256,
    chunked_prefill_size=2048,
    kv_pages=2048,
)
# A TTFT budget the launch config misses by far: the law takes several steps (A and K down) to meet it.
SLO = Slo(ttft_p99_s=0.3, itl_p99_s=10.0)
FAST = TunerSettings(window_s=10.0, min_rounds=100, dwell_rounds=100, max_changes_per_min=20.0)
MOVE = re.compile(r"([AK]) (\d+)->(\d+)")
TUNER_MOVE = re.compile(r"tuner: .+ -> [AK] \d+->\d+")  # a change the tuner explained


def engine(seed: int = 0) -> SimBackend:
    """40 req/s on 4 simulated ranks, ten times faster than real time: an unpaced simulator thread would
    starve the event loop that serves gRPC and feeds the tuner, which no real engine does."""
    workload = Workload(Poisson(40.0), dp_size=4, prompt=Fixed(256), output=Fixed(64), seed=seed)
    return SimBackend(ARGS, workload, pace=10.0)


@asynccontextmanager
async def tuning(served: Served, tuner: Tuner, plane: GrpcPlane | None = None):
    """`run_tuner` on its own channel to `served` (as `prefill-gate tune` runs it); yields its log lines."""
    lines: list[str] = []
    channel = grpc.aio.insecure_channel(served.plane.target)
    task = asyncio.create_task(
        run_tuner(plane or GrpcPlane(channel, served.auth), tuner, lines.append, stale_after_s=1.0, reconnect_max_s=0.2)
    )
    try:
        yield lines
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await channel.close()


async def until(predicate, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


def adoptions(records: list[pb.RoundRecord]) -> list[pb.RoundRecord]:
    return [r for r in records if r.adopted_epoch]


async def history(served: Served) -> list[pb.RoundRecord]:
    """Every held record, asked for page by page."""
    records: list[pb.RoundRecord] = []
    while True:
        start = records[-1].round + 1 if records else 0
        response = await served.telemetry.GetRounds(telemetry_pb2.GetRoundsRequest(from_round=start))
        records += response.records
        if not response.truncated:
            return records


def check_serialized(changes: list[pb.RoundRecord], launch: tuple[int, int]) -> None:
    """Every change names the intervals it replaced, and they are the ones in force before it: no change
    was decided against a config another writer had already replaced (a lost update)."""
    before = {"A": launch[0], "K": launch[1]}
    for record in changes:
        config = record.adopted_config
        assert config.epoch == record.adopted_epoch
        moved = {name: (int(old), int(new)) for name, old, new in MOVE.findall(config.reason)}
        assert moved, config.reason
        after = {"A": config.attempt_interval, "K": config.any_interval}
        for name in before:
            old, new = moved.get(name, (before[name], before[name]))
            assert (old, new) == (before[name], after[name]), (config.reason, before, after)
        before = after


async def test_a_killed_tuner_leaves_the_engine_serving_on_its_last_config():  # faults: tuner killed
    async with serving(ARGS, backend=engine(), history=100_000) as served:
        command = [
            sys.executable,
            "-m",
            "control.cli",
            "tune",
            "--target",
            served.plane.target,
            "--token",
            TOKEN,
            "--ttft-p99",
            "0.3",
            "--itl-p99",
            "10",
            "--dwell-rounds",
            "100",
            "--window-s",
            "10",
        ]
        tune = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(tune.stdout), daemon=True)  # type: ignore[arg-type]
        reader.start()
        try:
            # Killed right after it reported a change adopted by every rank.
            await until(lambda: any("adopted by every rank after round" in line for line in lines), 90.0)
        finally:
            tune.kill()
            tune.wait(10)
        # Which rule moves first depends on how far the engine ran ahead of the tuner (TTFT or the backlog).
        assert any(TUNER_MOVE.match(line.split("  ", 2)[-1]) for line in lines), lines
        await asyncio.sleep(0.5)  # a change the server accepted before the kill is still adopted
        kept = served.controller.config
        after = served.controller.latest.round
        await served.wait_round(after + 500)
        assert served.controller.serving()
        records = await history(served)
    assert kept.origin is not None and kept.origin.changed_by == "tuner"
    assert TUNER_MOVE.match(kept.origin.reason), kept.origin.reason
    tail = [r for r in records if r.round > after]
    assert len(tail) >= 500 and {r.config.epoch for r in tail} == {kept.epoch}  # nobody changed it since
    assert all(r.config.changed_by == "tuner" and r.config.reason == kept.origin.reason for r in tail)
    check_serialized(adoptions(records), (8, 64))


async def test_an_engine_restart_under_the_tuner_resets_its_estimates():  # faults: new run id
    port = free_port()
    tuner = Tuner(SLO, FAST)
    lines: list[str] = []
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    plane = GrpcPlane(channel, (("authorization", f"Bearer {TOKEN}"),))
    task = asyncio.create_task(run_tuner(plane, tuner, lines.append, stale_after_s=1.0, reconnect_max_s=0.2))
    try:
        async with serving(ARGS, backend=engine(1), port=port) as first:
            first_run = first.controller.run_id
            await until(lambda: first.controller.config.epoch >= 1)
        await until(lambda: any("stream lost" in line for line in lines))  # the engine is gone; it reconnects
        assert tuner.run_id == first_run
        async with serving(ARGS, backend=engine(2), port=port) as second:
            await until(lambda: second.controller.config.epoch >= 1)
            second_run = second.controller.run_id
            records = await history(second)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await channel.close()
    assert second_run != first_run
    assert len([line for line in lines if f"new run {second_run}: estimates reset" in line]) == 1
    first_change = adoptions(records)[0]
    # Decided on the new run's own estimates, after its own dwell, from its launch config (A=8 K=64), not
    # from the intervals the first engine had been tuned to.
    decided = [line for line in lines if "[epoch 1," in line][-1]
    assert int(re.search(r"round (\d+)", decided).group(1)) >= FAST.dwell_rounds
    reason = first_change.adopted_config.reason
    assert first_change.adopted_config.changed_by == "tuner" and re.search(r"A 8->\d+", reason) and "K 64->" in reason


class DelayedPlane(GrpcPlane):
    """A tuner on a slow link: its first change reaches the server only after `delay_s`."""

    def __init__(self, *args, delay_s: float, **kw) -> None:
        super().__init__(*args, **kw)
        self.delay_s = delay_s

    async def update(self, proposal: Proposal, changed_by: str) -> Adopted:
        delay, self.delay_s = self.delay_s, 0.0
        await asyncio.sleep(delay)
        return await super().update(proposal, changed_by)


def settled_after_stale(lines: list[str]) -> bool:
    """The tuner's change met a stale epoch, and then was either adopted on retry or dropped as moot."""
    stale = next((i for i, line in enumerate(lines) if "epoch moved under the change" in line), None)
    return stale is not None and any("[epoch " in ln or "not retried" in ln for ln in lines[stale + 1 :])


async def test_two_tuners_serialize_through_the_expected_epoch_and_no_change_is_lost():  # faults: two tuners
    async with serving(ARGS, backend=engine(3), history=100_000) as served:
        slow_channel = grpc.aio.insecure_channel(served.plane.target)
        try:
            both = replace(FAST, evaluate_every=5)
            async with (
                tuning(served, Tuner(SLO, both)) as fast_lines,
                tuning(served, Tuner(SLO, both), DelayedPlane(slow_channel, served.auth, delay_s=0.5)) as slow_lines,
            ):
                # Both decide on the same estimates; the slow one's change (or, rarely, the other's)
                # arrives after its rival's was adopted: FAILED_PRECONDITION, then a retry decided
                # against the config that won.
                await until(lambda: settled_after_stale(slow_lines) or settled_after_stale(fast_lines), 90.0)
            records = await history(served)
        finally:
            await slow_channel.close()
    changes = adoptions(records)
    assert [c.adopted_epoch for c in changes] == list(range(1, len(changes) + 1))
    assert len(changes) >= 2 and all(c.adopted_config.changed_by == "tuner" for c in changes)
    check_serialized(changes, (8, 64))  # every change replaced the config it was decided against
    loser = slow_lines if settled_after_stale(slow_lines) else fast_lines
    winner = fast_lines if loser is slow_lines else slow_lines
    assert any("[epoch 1," in line for line in winner)
    retried = [line for line in loser if "[epoch " in line]
    if retried:  # adopted on retry: it is in the records, after the winner's change
        epoch = int(re.search(r"\[epoch (\d+),", retried[0]).group(1))
        assert epoch >= 2 and any(c.adopted_epoch == epoch for c in changes)


async def test_an_operators_change_is_respected_then_tuned_from():  # faults: manual change
    respect = 20.0  # engine seconds
    async with serving(ARGS, backend=engine(4), history=100_000) as served:
        async with tuning(served, Tuner(SLO, replace(FAST, respect_manual_s=respect))) as lines:
            await until(lambda: served.controller.config.epoch >= 1)
            await served.admin.UpdateIntervals(
                admin_pb2.UpdateIntervalsRequest(attempt_interval=16, any_interval=96, reason="looking at something"),
                metadata=served.auth,
            )
            manual_epoch = served.controller.config.epoch
            await until(lambda: served.controller.config.epoch > manual_epoch, 90.0)
        records = await history(served)
    changes = adoptions(records)
    manual = next(c for c in changes if c.adopted_config.changed_by == "operator")
    assert manual.adopted_config.reason == "looking at something"
    after = [c for c in changes if c.adopted_epoch > manual.adopted_epoch]
    assert after and all(c.adopted_config.changed_by == "tuner" for c in after)
    assert after[0].clock_seconds >= manual.clock_seconds + respect  # held for the whole window
    assert "A 16->" in after[0].adopted_config.reason or "K 96->" in after[0].adopted_config.reason
    assert any("operator changed the config to A=16 K=96" in line for line in lines)
