"""`gate-autotune` in the lab: the simulator driven through the same tuner code that runs live.

The tuner sees what a real client sees: each round's record converted to `prefill_gate.v1` by the
contract's own converter (`prefill_gate.convert`), with the round's latency samples attached as the
controller attaches them (here exactly: every rank's outcome of the round is at hand), and who made each
config. Its proposals reach rank 0 as the controller's do (`driver.propose`), so every rank adopts them
on one round (G1); a proposal is accepted like `UpdateIntervals` with `expected_epoch`.

`TunerClient` is that client for one run (`run_sim`'s `on_start` / `on_round`, plus a workload wrapper for
the arrival times TTFT is measured from); `AutotunedGate` is the policy the capacity lab and `run_autotuned`
run: the gate on every rank, started at (A, K), and a fresh `TunerClient` per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.config import PrefillDelay, ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.metrics import Summary
from engine.policies.registry import POLICIES, make_policy, policy_args
from engine.policy import PrefillPolicy
from engine.rank import RoundOutcome
from engine.record import RoundRecord
from engine.request import Finished, FirstToken, Refused, RequestSpec
from lab.simrun import SimExtra, run_sim
from prefill_gate.convert import Origin, round_record
from tuner.core import LAUNCH, TUNER, Proposal, Tuner, TunerSettings
from tuner.law import Slo
from workloads import Workload

AUTOTUNE = "gate-autotune"
# Every policy the lab can run: the engine's, and the gate moved by the tuner (a client of the run).
LAB_POLICIES: tuple[str, ...] = (*POLICIES, AUTOTUNE)
# Where the tuner starts in the lab: cold (no estimates), on the launch config an operator runs today (the
# demo's and the fixed-load lab's A=8, K=32); it moves from there. A=1, K=4 was the first choice, but on
# h200-dp8-ep8 one extend round costs more than the ITL budget, and the probes ended before the tuner had
# climbed out of it (quick capacity runs: bursty 0.98 req/s from A=1 K=4, 7.95 from A=8 K=32; none lower).
COLD_START = PrefillDelay(8, 32)
# The SLO it aims at in the fixed-load lab (the capacity lab's default): TTFT p99 2 s, ITL p99 0.5 s.
FIXED_LOAD_SLO = (2.0, 0.5)
RUN_ID = "lab"
# The lab's probes measure after a warm-up of 6-20 simulated seconds: the tuner gets a shorter dwell and
# window and a looser change cap than its live defaults (the same flags `tune` takes), so that it can settle
# before the measurement starts; the law is the same.
LAB_TUNING = TunerSettings(window_s=10.0, min_rounds=100, min_ttft_samples=20, dwell_rounds=100, max_changes_per_min=12)


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
    """What an autotuned run did: every change, every adoption, the intervals at the end."""

    changes: list[Change] = field(default_factory=list)
    adoptions: list[tuple[int, float, int]] = field(default_factory=list)  # (round, engine clock, epoch) adopted
    final: tuple[int | None, int | None] = (None, None)


class _ArrivalTap:
    """The workload, remembering each request's arrival (the TTFT origin the controller keeps)."""

    def __init__(self, workload: Workload, arrivals: dict[str, float]) -> None:
        self._workload = workload
        self._arrivals = arrivals

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workload, name)

    def due(self, now: float, loads: Sequence[int] | None = None) -> list[tuple[int, RequestSpec]]:
        due = self._workload.due(now, loads)
        for _, spec in due:
            self._arrivals[spec.rid] = spec.arrival
        return due


class TunerClient:
    """The tuner as a client of one simulated run (module docstring)."""

    def __init__(self, tuner: Tuner, start: PrefillDelay | None, on_record: Any = None) -> None:
        self.tuner = tuner
        self.driver: LockstepDriver | None = None
        self.arrivals: dict[str, float] = {}
        launch = f"A={start.attempt_interval} K={start.any_interval}" if start else "gate off"
        self.origins: dict[int, Origin] = {0: Origin(LAUNCH, f"{LAUNCH}: startup flags, {launch}")}
        self.epoch = 0
        self.run = AutotuneRun(final=(start.attempt_interval, start.any_interval) if start else (None, None))
        self.on_record = on_record  # sees every record the tuner reads (tests)

    def wrap(self, workload: Workload) -> Workload:
        """`workload`, noting arrivals for TTFT."""
        return _ArrivalTap(workload, self.arrivals)  # type: ignore[return-value]

    def start(self, driver: LockstepDriver) -> None:
        """`run_sim`'s `on_start`: the driver whose rank 0 takes the proposals."""
        self.driver = driver

    def on_round(self, record: RoundRecord, outcomes: Sequence[RoundOutcome]) -> None:
        """`run_sim`'s `on_round`: the record as a client reads it, then the tuner's proposal, if any."""
        arrivals = self.arrivals
        ttft: list[float] = []
        for outcome in outcomes:
            for event in outcome.events:
                if isinstance(event, FirstToken) and event.rid in arrivals:
                    ttft.append(event.time - arrivals[event.rid])
                elif isinstance(event, Finished | Refused):
                    arrivals.pop(event.rid, None)
        itl = tuple(sample for outcome in outcomes for sample in outcome.itl)
        message = round_record(replace(record, ttft=tuple(ttft), itl=itl), RUN_ID, self.origins.get)
        if record.adopted_epoch:
            self.run.adoptions.append((record.round, record.clock, record.adopted_epoch))
        if self.on_record is not None:
            self.on_record(message)
        proposal = self.tuner.observe(message)
        if proposal is not None:
            self._accept(proposal)

    def _accept(self, proposal: Proposal) -> None:
        """`UpdateIntervals` with expected_epoch: validated (C2 holds by construction), proposed to rank 0."""
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
        self.run.final = (target.attempt, target.any)
        self.tuner.settle(proposal)


class AutotunedGate:
    """`gate-autotune`: the gate's policy on every rank, started at `start`, and a tuner per run."""

    name = AUTOTUNE

    def __init__(self, start: PrefillDelay, settings: TunerSettings | None = None) -> None:
        self.start = start
        self.settings = settings

    def __call__(self, rank: int, args: ServerArgs) -> PrefillPolicy:
        return make_policy("gate", args, rank)

    def args(self, base: ServerArgs) -> ServerArgs:
        """`base` with the gate on at the start intervals."""
        return policy_args("gate", base, prefill_delay=self.start)

    def client(self, ttft_p99_s: float, itl_p99_s: float, on_record: Any = None) -> TunerClient:
        """A fresh tuner for one run, aiming at this SLO."""
        tuner = Tuner(Slo(ttft_p99_s, itl_p99_s), self.settings)
        return TunerClient(tuner, self.start, on_record)


def run_autotuned(
    args: ServerArgs,
    workload: Workload,
    slo: Slo,
    settings: TunerSettings | None = None,
    *,
    rounds: int | None = None,
    duration: float | None = None,
    on_record: Any = None,
    **sim: Any,
) -> tuple[Summary, SimExtra, AutotuneRun]:
    """`run_sim` with the tuner moving the gate's intervals from the ones `args` starts with."""
    client = TunerClient(Tuner(slo, settings), args.prefill_delay, on_record)
    summary, extra = run_sim(
        args,
        client.wrap(workload),
        rounds=rounds,
        duration=duration,
        on_round=client.on_round,
        on_start=client.start,
        **sim,
    )
    return summary, extra, client.run
