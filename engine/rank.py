"""`RankEngine`: one rank's round, rule R1 as a short sequence of phases.

    intake -> decide -> plan -> probe -> ALL-GATHER -> observe -> adopt -> forward -> commit -> publish

`begin_round` runs the phases before the gather and returns this rank's row; `end_round` takes the
gathered rows and runs the rest. `run_round` joins them around a real collective (one process per
rank); the lockstep driver calls the halves itself so that every rank of a group can step inside one
process. Either way the same code runs in the same order on every rank.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.clock import Clock
from engine.config import PrefillDelay, ServerArgs
from engine.executor.base import DispatchMode, Executor, ForwardResult
from engine.group import CollectiveError, Group
from engine.phases import NullTimer, PhaseTimer
from engine.policy import Decision, PrefillPolicy
from engine.record import RoundRecord
from engine.request import (
    Abort,
    Command,
    Finished,
    ProposalRefused,
    ProposeConfig,
    RequestError,
    RequestEvent,
    Stop,
    Submit,
    UpdateWeights,
)
from engine.rows import UNSET, Row
from engine.scheduler.plan import CacheOp, Plan, PlanOptions
from engine.scheduler.scheduler import Scheduler


@dataclass(slots=True)
class RoundOutcome:
    """What one rank's round produced, for its driver to publish."""

    round: int
    decision: Decision
    counter_after: int
    rows: tuple[Row, ...]
    mode: DispatchMode
    events: list[RequestEvent] = field(default_factory=list)
    # Inter-token latency samples of this round: (seconds since the request's previous token, requests).
    itl: list[tuple[float, int]] = field(default_factory=list)
    record: RoundRecord | None = None
    adopted_epoch: int | None = None
    stop: bool = False

    @property
    def all_idle(self) -> bool:
        """No rank had anything to run this round."""
        return self.mode is DispatchMode.NONE


class RoundObserver(Protocol):
    """Sees every finished round of a rank (tracing); must not block."""

    def round_done(self, engine: RankEngine, outcome: RoundOutcome) -> None:
        """Called at the end of `end_round`, after the commit."""
        ...

    def fill_row(self, row: Row) -> None:
        """Set the observer's fields of this rank's row (drop counts, span bounds) before the gather."""
        ...


class RankEngine:
    """One attention-DP rank: scheduler, policy and executor stepped through the round of R1."""

    def __init__(
        self,
        rank: int,
        size: int,
        args: ServerArgs,
        scheduler: Scheduler,
        executor: Executor,
        policy: PrefillPolicy,
        clock: Clock,
    ) -> None:
        self.rank = rank
        self.size = size
        self.args = args
        self.scheduler = scheduler
        self.executor = executor
        self.policy = policy
        self.clock = clock
        self.inbox: deque[Command] = deque()
        self.round = 0
        self.epoch = 0
        self._completed_ops: list[CacheOp] = []
        self._proposals: deque[ProposeConfig] = deque()
        self._refused: list[ProposalRefused] = []
        self._stop_requested = False
        self._forward_us = 0
        self.timer: PhaseTimer = NullTimer()
        self.observer: RoundObserver | None = None
        # True while a lockstep driver calls the observer once per round for its whole group (see
        # `LockstepDriver`): the rank then calls none of the observer's hooks itself.
        self.group_observed = False
        # Per-round state between the two halves.
        self._round_start = 0.0
        self._decision = Decision(allow_prefill=False)
        self._plan = Plan(round=0)

    @property
    def decision(self) -> Decision:
        """This round's decision from the decide phase on (the previous round's before it): what a phase
        timer reads at the "decide" lap."""
        return self._decision

    # -- the round ---------------------------------------------------------------------------------

    def run_round(self, group: Group) -> RoundOutcome:
        """One whole round around the group's all-gather."""
        row = self.begin_round()
        rows = group.all_gather(row)  # the round's one collective (R2)
        self.timer.lap("gather")
        return self.end_round(rows)

    def begin_round(self) -> Row:
        """R1 steps 1-5; returns the row this rank publishes."""
        timer = self.timer
        timer.start()
        self._round_start = self.clock.now()
        self._intake()
        timer.lap("intake")
        local = self.scheduler.local_view()
        self._decision = self.policy.decide(local)
        timer.lap("decide")
        self._plan = self.scheduler.plan(self._plan_options(self._decision, local.wants_prefill))
        timer.lap("plan")
        probe = self.scheduler.probe_prefill_gate()
        row = self._row(probe.wants_prefill, probe.has_decode_work)
        timer.lap("probe")
        return row

    def end_round(self, rows: tuple[Row, ...]) -> RoundOutcome:
        """R1 steps 7-11, from the gathered rows."""
        timer = self.timer
        self._check_agreement(rows)
        self.policy.observe(rows if self.args.enable_dp_attention else (rows[self.rank],))  # R7
        record_config = (self.epoch, self.policy.delay)
        adopted = self._adopt_config(rows)
        timer.lap("observe")
        result = self._forward(rows)
        timer.lap("forward")
        self.scheduler.commit(self._plan, result, self.clock.now())
        events: list[RequestEvent] = self.scheduler.take_events()
        if self._refused:
            events += self._refused
            self._refused = []
        for event in events:
            if isinstance(event, Finished):
                self.executor.release(event.rid)
        outcome = RoundOutcome(
            round=self.round,
            decision=self._decision,
            counter_after=self.policy.counter,
            rows=rows,
            mode=result.mode,
            events=events,
            itl=self.scheduler.take_itl(),
            adopted_epoch=adopted,
            stop=rows[0].stop,
        )
        if outcome.stop and self.scheduler.live:  # every rank leaves after this round: say what it leaves
            self.scheduler.cut_off(f"the engine stopped after round {self.round} (an agreed stop)")
            outcome.events += self.scheduler.take_events()
        if self.rank == 0:
            outcome.record = self._record(outcome, record_config)
        self.round += 1
        timer.lap("commit")
        if self.observer is not None and not self.group_observed:
            self.observer.round_done(self, outcome)
        return outcome

    # -- phases ------------------------------------------------------------------------------------

    def _intake(self) -> None:
        """R1 step 1: commands, cache-op acknowledgments, the storage tick."""
        now = self.clock.now()
        self.scheduler.start_round(self.round, now)
        if self._completed_ops:
            self.scheduler.acknowledge(self._completed_ops)
            self._completed_ops = []
        while self.inbox:
            command = self.inbox.popleft()
            if isinstance(command, Submit):
                try:
                    self.scheduler.submit(command.request)
                except RequestError as exc:
                    self.scheduler.refuse(command.request.rid, str(exc))
            elif isinstance(command, Abort):
                self.scheduler.abort(command.rid)
            elif isinstance(command, UpdateWeights):
                self.scheduler.pause_for_weight_update()
            elif isinstance(command, ProposeConfig):
                self._queue_proposal(command)
            elif isinstance(command, Stop):
                self._stop_requested = True
            else:
                raise TypeError(f"unknown command {command!r}")
        self.scheduler.storage_tick()

    def _plan_options(self, decision: Decision, wants_prefill: bool) -> PlanOptions:
        """R1 step 3 and R9: the group's permission meets the rank's fresh probe and its role."""
        role = self.args.disaggregation_mode
        if role == "prefill":
            return PlanOptions(allow_prefill=True)  # a P node is prefill by construction
        if role == "decode":
            return PlanOptions(allow_prefill=False)  # a D node's prompts are its peer's work
        allow = decision.allow_prefill and wants_prefill
        return PlanOptions(
            allow_prefill=allow,
            allow_chunk_continuation=None if decision.hold_resident_chunks else True,
        )

    def _row(self, wants_prefill: bool, has_decode_work: bool) -> Row:
        plan, decision, counts = self._plan, self._decision, self._plan.counts
        proposal = self._proposals[0] if self._proposals and self.rank == 0 else None
        row = Row(
            rank=self.rank,
            round=self.round,
            num_tokens=plan.num_tokens,
            batch_size=plan.batch_size,
            num_extends=plan.num_extends,
            want_prefill=wants_prefill,
            has_decode_work=has_decode_work,
            prefill_tokens=plan.prefill_tokens,
            decision_counter=decision.counter,
            decision_point=int(decision.point),
            decision_open=decision.allow_prefill,
            config_epoch=self.epoch,
            pool_pages_used=counts.pool_pages_used,
            pool_pages_usable=counts.pool_pages_usable,
            resident_chunks=counts.resident_chunks,
            waiting_prompts=counts.waiting_prompts,
            storage_reads=counts.storage_reads,
            retracted=counts.retracted,
            running=counts.running,
            pending_prefill_tokens=counts.pending_prefill_tokens,
            retractions_total=counts.retractions_total,
            forward_us=self._forward_us,
            proposal_epoch=proposal.epoch if proposal else 0,
            proposal_attempt_interval=_interval(proposal, "attempt_interval"),
            proposal_any_interval=_interval(proposal, "any_interval"),
            stop=self._stop_requested and self.rank == 0,
        )
        if self.observer is not None and not self.group_observed:
            self.observer.fill_row(row)
        return row

    def _check_agreement(self, rows: Sequence[Row]) -> None:
        """Every rank must be on the same round and config; a group policy must have voted alike."""
        first = rows[0]
        for row in rows:
            if row.round != first.round or row.config_epoch != first.config_epoch:
                raise CollectiveError(
                    f"ranks diverged at round {self.round}: rank {row.rank} is at round {row.round} "
                    f"epoch {row.config_epoch}, rank 0 at round {first.round} epoch {first.config_epoch}"
                )
            if (
                self.args.enable_dp_attention
                and self.policy.group_decision
                and (
                    row.decision_counter,
                    row.decision_point,
                    row.decision_open,
                )
                != (first.decision_counter, first.decision_point, first.decision_open)
            ):
                raise CollectiveError(f"rank {row.rank} voted differently from rank 0 at round {self.round}")

    def _adopt_config(self, rows: Sequence[Row]) -> int | None:
        """R1 step 8 / G1: every rank adopts rank 0's proposal after the same gather."""
        proposal = rows[0]
        if proposal.proposal_epoch <= self.epoch:
            return None
        attempt = None if proposal.proposal_attempt_interval == UNSET else proposal.proposal_attempt_interval
        any_ = None if proposal.proposal_any_interval == UNSET else proposal.proposal_any_interval
        candidate = self.args.replace(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)
        self.policy.reconfigure(candidate.prefill_delay)  # the counter is kept
        self.args = candidate
        self.epoch = proposal.proposal_epoch
        if self.rank == 0:
            self._proposals.popleft()
        return self.epoch

    def _queue_proposal(self, command: ProposeConfig) -> None:
        """G1 at rank 0's intake: a proposal is checked where it enters, so that its adoption, on every
        rank after the same gather, cannot fail on any. A stale epoch or values startup would refuse
        are dropped, and reported, with nothing changed."""
        newest = self._proposals[-1].epoch if self._proposals else self.epoch
        if self.rank != 0:
            error = f"config changes are proposed by rank 0, not rank {self.rank} (G1)"
        elif command.epoch <= newest:
            error = f"config epoch {command.epoch} is stale: epoch {newest} is already accepted"
        else:
            error = _proposal_error(self.args, command.delay)
        if error:
            self._refused.append(ProposalRefused(command.epoch, error))
        else:
            self._proposals.append(command)

    def _forward(self, rows: tuple[Row, ...]) -> ForwardResult:
        started = time.perf_counter()
        result = self.executor.forward(self._plan, rows)
        self._forward_us = int((time.perf_counter() - started) * 1e6)
        self._completed_ops = result.completed_ops
        return result

    def _record(self, outcome: RoundOutcome, config: tuple[int, PrefillDelay | None]) -> RoundRecord:
        epoch, delay = config
        now = self.clock.now()
        return RoundRecord(
            round=self.round,
            unix_nanos=time.time_ns(),
            clock=now,
            counter=self._decision.counter,
            point=self._decision.point,
            open=self._decision.allow_prefill,
            counter_after=outcome.counter_after,
            all_decode_or_idle=outcome.mode is not DispatchMode.NORMAL,
            round_seconds=now - self._round_start,
            rows=outcome.rows,
            policy=self.policy.name,
            config_epoch=epoch,
            attempt_interval=delay.attempt_interval if delay else None,
            any_interval=delay.any_interval if delay else None,
            adopted_epoch=outcome.adopted_epoch,
        )


def _proposal_error(args: ServerArgs, delay: PrefillDelay | None) -> str:
    """Startup's words for what is wrong with `delay` on these arguments, or "" (C3)."""
    attempt = delay.attempt_interval if delay is not None else None
    any_ = delay.any_interval if delay is not None else None
    try:
        args.replace(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_).prefill_delay  # noqa: B018
    except ValueError as exc:
        return str(exc)
    return ""


def _interval(proposal: ProposeConfig | None, name: str) -> int:
    if proposal is None or proposal.delay is None:
        return UNSET
    return int(getattr(proposal.delay, name))
