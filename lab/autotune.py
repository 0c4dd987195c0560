"""`gate-autotune` in the lab: the simulator driven through the same tuner code that runs live.

The tuner sees what a real client sees: each round's record converted to `prefill_gate.v1` by the
contract's own converter (`prefill_gate.convert`), with the round's latency samples attached as the
controller attaches them (here exactly: every rank's outcome of the round is at hand), and who made each
config. Its proposals reach rank 0 as the controller's do (`driver.propose`), so every rank adopts them
on one round (G1); a proposal is "accepted" like `UpdateIntervals` with `expected_epoch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.config import PrefillDelay, ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.metrics import Summary
from engine.rank import RoundOutcome
from engine.record import RoundRecord
from engine.request import FirstToken, RequestSpec
from lab.simrun import SimExtra, run_sim
from prefill_gate.convert import Origin, round_record
from tuner.core import TUNER, Proposal, Tuner, TunerSettings
from tuner.law import Slo
from workloads import Workload

RUN_ID = "lab"


@dataclass(frozen=True, slots=True)
class Change:
    """One change the tuner made: the round it was decided on, the epoch, A and K (None: off), why."""

    round: int
    epoch: int
    attempt: int | None
    any: int | None
    reason: str


@dataclass
class AutotuneRun:
    """What an autotuned run did besides its summary: every change and the records' config epochs."""

    changes: list[Change] = field(default_factory=list)
    adoptions: list[tuple[int, float, int]] = field(default_factory=list)  # (round, engine clock, epoch) adopted
    final: tuple[int | None, int | None] = (None, None)


class _ArrivalTap:
    """The workload, remembering each request's arrival (the TTFT origin the controller keeps)."""

    def __init__(self, workload: Workload) -> None:
        self._workload = workload
        self.arrivals: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workload, name)

    def due(self, now: float, loads: list[int] | None = None) -> list[tuple[int, RequestSpec]]:
        due = self._workload.due(now, loads)
        for _, spec in due:
            self.arrivals[spec.rid] = spec.arrival
        return due


class _TunerHook:
    """Records to the tuner as a client reads them; its proposals to rank 0 as the controller sends them."""

    def __init__(self, tuner: Tuner, args: ServerArgs, tap: _ArrivalTap) -> None:
        self.tuner = tuner
        self.tap = tap
        self.driver: LockstepDriver | None = None
        delay = args.prefill_delay
        launch = f"A={delay.attempt_interval} K={delay.any_interval}" if delay else "gate off"
        self.origins: dict[int, Origin] = {0: Origin("launch", f"launch: startup flags, {launch}")}
        self.epoch = 0
        self.run = AutotuneRun()

    def start(self, driver: LockstepDriver) -> None:
        self.driver = driver

    def on_round(self, record: RoundRecord, outcomes: Sequence[RoundOutcome]) -> None:
        arrivals = self.tap.arrivals
        ttft = tuple(
            event.time - arrivals.pop(event.rid)
            for outcome in outcomes
            for event in outcome.events
            if isinstance(event, FirstToken) and event.rid in arrivals
        )
        itl = tuple(sample for outcome in outcomes for sample in outcome.itl)
        message = round_record(replace(record, ttft=ttft, itl=itl), RUN_ID, self.origins.get)
        if record.adopted_epoch:
            self.run.adoptions.append((record.round, record.clock, record.adopted_epoch))
        proposal = self.tuner.observe(message)
        if proposal is not None:
            self._apply(proposal)

    def _apply(self, proposal: Proposal) -> None:
        """`UpdateIntervals` with expected_epoch: accepted (the only writer here), proposed to rank 0."""
        assert self.driver is not None
        if proposal.expected_epoch != self.epoch:
            self.tuner.settle(proposal, f"expected epoch {proposal.expected_epoch}, current {self.epoch}")
            return
        target = proposal.target
        self.epoch += 1
        self.origins[self.epoch] = Origin(TUNER, proposal.reason)
        delay = PrefillDelay(target.attempt, target.any) if target.enabled else None  # type: ignore[arg-type]
        self.driver.propose(self.epoch, delay)
        self.run.changes.append(Change(proposal.round, self.epoch, target.attempt, target.any, proposal.reason))
        self.tuner.settle(proposal)


def run_autotuned(
    args: ServerArgs,
    workload: Workload,
    slo: Slo,
    settings: TunerSettings | None = None,
    *,
    rounds: int | None = None,
    duration: float | None = None,
    **sim: Any,
) -> tuple[Summary, SimExtra, AutotuneRun]:
    """`run_sim` with the tuner moving the gate's intervals from the ones `args` starts with."""
    tap = _ArrivalTap(workload)
    hook = _TunerHook(Tuner(slo, settings), args, tap)
    summary, extra = run_sim(
        args,
        tap,  # type: ignore[arg-type]
        rounds=rounds,
        duration=duration,
        on_round=hook.on_round,
        on_start=hook.start,
        **sim,
    )
    last = hook.run.changes[-1] if hook.run.changes else None
    delay = args.prefill_delay
    if last is not None:
        hook.run.final = (last.attempt, last.any)
    elif delay is not None:
        hook.run.final = (delay.attempt_interval, delay.any_interval)
    return summary, extra, hook.run
