"""Run a workload through the lockstep simulator on the virtual clock and summarise it.

`run_sim` steps a `LockstepDriver` of `args.dp_size` ranks with the sim executor: each round it hands
the workload's due requests to their ranks, steps every rank once, and feeds the record, events and
ITL samples to `RunMetrics`. It stops when the workload is done and every request has ended, or at the
`rounds` / `duration` bound, whichever comes first.

An all-idle group with nothing in flight skips ahead to the next arrival: every rank's virtual clock
jumps by the same amount after one idle round has run. The skipped rounds would all be identical
all-idle rounds (R3 resets the counter on each), so no rule sees a difference; only the round count
stays meaningful instead of counting idle spins.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.build import build_engine
from engine.clock import VirtualClock
from engine.config import ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.executor.presets import CostPreset, preset_named
from engine.executor.sim import SimExecutor
from engine.metrics import RunMetrics, Summary
from engine.policy import PrefillPolicy
from engine.rank import RankEngine, RoundOutcome
from engine.record import RoundRecord
from engine.request import Finished, Refused
from workloads import Workload

PolicyFactory = Callable[[int, ServerArgs], PrefillPolicy]
RoundHook = Callable[[RoundRecord, Sequence[RoundOutcome]], None]


@dataclass(frozen=True, slots=True)
class SimExtra:
    """What a simulated run did besides its summary: why it stopped, how fast it ran, what it was fed.

    `requests` lists every submitted request as ``(rank, prompt_len, prefix_hit, output_len)``, the
    shape `engine.policies.oracle.oracle_bound` takes.
    """

    stopped_by: str  # "done", "rounds", "duration" or "stop" (the caller's `stop_when` said so)
    rounds: int
    sim_seconds: float
    wall_seconds: float
    rounds_per_second: float
    idle_seconds_skipped: float
    in_flight_at_end: int
    preset: str
    policy: str
    requests_per_rank: tuple[int, ...] = field(default=())
    requests: tuple[tuple[int, int, int, int], ...] = field(default=(), repr=False)


def run_sim(
    args: ServerArgs,
    workload: Workload,
    *,
    rounds: int | None = None,
    duration: float | None = None,
    policy_factory: PolicyFactory | None = None,
    on_round: RoundHook | None = None,
    preset: CostPreset | None = None,
    skip_idle: bool = True,
    stop_when: Callable[[], bool] | None = None,
    on_start: Callable[[LockstepDriver], None] | None = None,
) -> tuple[Summary, SimExtra]:
    """Simulate `workload` on `args` (executor "sim") until done, `rounds` rounds or `duration` virtual seconds.

    `policy_factory(rank, args)` replaces the policy `args` configure (the lab's peers); `preset`
    replaces `args.sim_preset` (a calibrated preset); `on_round(record, outcomes)` sees every round;
    `stop_when()`, asked after every round, ends the run early (the capacity lab stops a run whose verdict
    is already known); `on_start(driver)` gets the driver before the first round (a client that proposes
    config changes, G1).
    """
    if args.executor != "sim":
        raise ValueError(f"run_sim needs --executor sim, got {args.executor!r}")
    if workload.dp_size != args.dp_size:
        raise ValueError(f"workload is for {workload.dp_size} ranks but --dp-size is {args.dp_size}")
    if rounds is None and duration is None and not workload.bounded:
        raise ValueError("an endless workload (closed loop or open arrivals without a limit) needs rounds or duration")
    cost = preset if preset is not None else preset_named(args.sim_preset)
    driver = LockstepDriver(args, engine_factory=_factory(cost, policy_factory))
    if on_start is not None:
        on_start(driver)
    metrics = RunMetrics()
    size = args.dp_size
    requests = [0] * size
    submitted: list[tuple[int, int, int, int]] = []
    live = 0
    skipped = 0.0
    loads: list[int] | None = [0] * size if workload.needs_loads else None
    stopped_by = "done"
    started = time.perf_counter()
    while True:
        if rounds is not None and driver.round >= rounds:
            stopped_by = "rounds"
            break
        now = driver.now()
        if duration is not None and now >= duration:
            stopped_by = "duration"
            break
        outcomes, due = driver.step_with(workload, loads)
        for rank, spec in due:
            metrics.add_submitted(spec)
            submitted.append((rank, spec.prompt_len, spec.prefix_hit, spec.output_len))
            requests[rank] += 1
            live += 1
        for outcome in outcomes:
            if outcome.events:
                metrics.add_events(outcome.events)
                live -= sum(1 for event in outcome.events if isinstance(event, Finished | Refused))
            if outcome.itl:
                metrics.add_itl(outcome.itl)
        record = outcomes[0].record
        if record is not None:
            metrics.add_record(record)
            if on_round is not None:
                on_round(record, outcomes)
        if loads is not None:
            loads = [row.waiting_prompts + row.running for row in outcomes[0].rows]
        if live == 0 and workload.done:
            break
        if stop_when is not None and stop_when():
            stopped_by = "stop"
            break
        if skip_idle and live == 0 and outcomes[0].all_idle:
            target = workload.next_arrival if duration is None else min(workload.next_arrival, duration)
            skipped += driver.skip_to(target)
    wall = time.perf_counter() - started
    extra = SimExtra(
        stopped_by=stopped_by,
        rounds=driver.round,
        sim_seconds=driver.now(),
        wall_seconds=wall,
        rounds_per_second=driver.round / wall if wall > 0 else math.inf,
        idle_seconds_skipped=skipped,
        in_flight_at_end=live,
        preset=cost.name,
        policy=driver.engines[0].policy.name,
        requests_per_rank=tuple(requests),
        requests=tuple(submitted),
    )
    return metrics.summary(), extra


def _factory(cost: CostPreset, policy_factory: PolicyFactory | None) -> Callable[[int, ServerArgs], RankEngine]:
    """Engines with a sim executor of `cost` (page size from the args) and, optionally, another policy."""

    def make(rank: int, args: ServerArgs) -> RankEngine:
        clock = VirtualClock()
        return build_engine(
            rank,
            args,
            executor=SimExecutor(cost, clock, page_size=args.page_size),
            policy=policy_factory(rank, args) if policy_factory is not None else None,
            clock=clock,
        )

    return make
