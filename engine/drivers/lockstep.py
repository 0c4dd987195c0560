"""The lockstep driver: every rank of a group stepped inside one process over a `LocalGroup`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from engine.build import build_engine
from engine.clock import VirtualClock
from engine.config import PrefillDelay, ServerArgs
from engine.group import LocalGroup
from engine.rank import RankEngine, RoundOutcome
from engine.request import Abort, Finished, ProposeConfig, Refused, RequestSpec, Stop, Submit, UpdateWeights
from engine.rows import Row

EngineFactory = Callable[[int, ServerArgs], RankEngine]


class Arrivals(Protocol):
    """What the driver needs of a workload (`workloads.Workload` is one)."""

    def due(self, now: float, loads: list[int] | None = None) -> list[tuple[int, RequestSpec]]: ...

    def on_finished(self, rid: str, now: float) -> None: ...


class GroupObserver(Protocol):
    """Sees the rounds of a lockstep group once, for all its ranks (tracing); must not block.

    `quiet_until`: the observer has nothing to do in rounds before this one (the driver then calls
    neither hook for them); 0 when it wants every round.
    """

    quiet_until: int

    def round_begins(self, round_: int) -> None:
        """Before any rank begins round `round_`."""
        ...

    def round_done(self, rows: tuple[Row, ...], outcomes: list[RoundOutcome]) -> None:
        """After every rank ended the round (its rows may still be annotated: nobody has read them yet)."""
        ...

    def detach(self) -> None:
        """The ranks' observers changed: leave their engines as an observer-less group would have them."""
        ...


class LockstepDriver:
    """Runs `args.dp_size` rank engines round by round: all begin, one gather, all end.

    When the ranks' round observers can observe the group as one (rank 0's offers `group_observer`, as
    the tracer does), the driver calls that group observer twice a round instead of every rank calling
    its own: a round nobody traces then costs the group a few calls, not a few per rank, and none in
    the rounds the group observer says it has nothing to do in (`quiet_until`). The driver notices
    observers attached, replaced or removed (rank 0's) before the next round.
    """

    def __init__(self, args: ServerArgs, engine_factory: EngineFactory | None = None) -> None:
        self.args = args
        self.group = LocalGroup(args.dp_size)
        factory = engine_factory or (lambda rank, a: build_engine(rank, a))
        self.engines = [factory(rank, args) for rank in range(args.dp_size)]
        self.round = 0
        self.observer: GroupObserver | None = None
        self._observed: object = None  # rank 0's observer when `observer` was chosen

    def step(self) -> list[RoundOutcome]:
        """One round on every rank; outcomes in rank order."""
        engines = self.engines
        if engines[0].observer is not self._observed:
            self._observe()
        observer = self.observer
        if observer is not None and engines[0].round < observer.quiet_until:
            observer = None  # a round it has said it has nothing to do in
        if observer is not None:
            observer.round_begins(engines[0].round)
        rows = self.group.gather_lockstep([engine.begin_round() for engine in engines])
        outcomes = [engine.end_round(rows) for engine in engines]
        if observer is not None:
            observer.round_done(rows, outcomes)
        self.round += 1
        return outcomes

    def _observe(self) -> None:
        """Choose how the ranks' (new) observers see the rounds: as one group when they can, else each."""
        if self.observer is not None:
            self.observer.detach()
            self.observer = None
        first = self._observed = self.engines[0].observer
        make = getattr(first, "group_observer", None)
        self.observer = make(self.engines) if make is not None else None
        for engine in self.engines:
            engine.group_observed = self.observer is not None

    def now(self) -> float:
        """The group's clock (every rank's clock agrees; rank 0's is read)."""
        return self.engines[0].clock.now()

    def submit(self, rank: int, request: RequestSpec) -> None:
        """Queue a request for `rank`'s next intake."""
        self.engines[rank].inbox.append(Submit(request))

    def abort(self, rank: int, rid: str) -> None:
        """Queue an abort for `rank`'s next intake."""
        self.engines[rank].inbox.append(Abort(rid))

    def update_weights(self, rank: int) -> None:
        """Pause `rank` for one round."""
        self.engines[rank].inbox.append(UpdateWeights())

    def propose(self, epoch: int, delay: PrefillDelay | None) -> None:
        """Hand a validated config change to rank 0 (G1)."""
        self.engines[0].inbox.append(ProposeConfig(epoch, delay))

    def request_stop(self) -> None:
        """Every rank stops after the round in which rank 0 publishes the stop."""
        self.engines[0].inbox.append(Stop())

    def skip_to(self, target: float) -> float:
        """Advance every rank's virtual clock to `target` (an idle group waiting for its next arrival);
        returns the seconds skipped."""
        now = self.now()
        if not math.isfinite(target) or target <= now:
            return 0.0
        step = target - now
        for engine in self.engines:
            clock = engine.clock
            if not isinstance(clock, VirtualClock):
                raise TypeError("skipping idle time needs virtual clocks")
            clock.advance(step)
        return step

    def step_with(
        self, arrivals: Arrivals | None, loads: list[int] | None = None
    ) -> tuple[list[RoundOutcome], list[tuple[int, RequestSpec]]]:
        """Submit what `arrivals` has due by now, run one round, and tell it which requests ended."""
        submitted = arrivals.due(self.now(), loads) if arrivals is not None else []
        for rank, spec in submitted:
            self.submit(rank, spec)
        outcomes = self.step()
        if arrivals is not None:
            end = self.now()
            for outcome in outcomes:
                for event in outcome.events:
                    if isinstance(event, Finished | Refused):
                        arrivals.on_finished(event.rid, end)
        return outcomes, submitted

    def idle(self, outcomes: list[RoundOutcome]) -> bool:
        """No rank ran anything this round and none holds a request."""
        return outcomes[0].all_idle and all(engine.scheduler.live == 0 for engine in self.engines)
