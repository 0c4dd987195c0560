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

EngineFactory = Callable[[int, ServerArgs], RankEngine]


class Arrivals(Protocol):
    """What the driver needs of a workload (`workloads.Workload` is one)."""

    def due(self, now: float, loads: list[int] | None = None) -> list[tuple[int, RequestSpec]]: ...

    def on_finished(self, rid: str, now: float) -> None: ...


class LockstepDriver:
    """Runs `args.dp_size` rank engines round by round: all begin, one gather, all end."""

    def __init__(self, args: ServerArgs, engine_factory: EngineFactory | None = None) -> None:
        self.args = args
        self.group = LocalGroup(args.dp_size)
        factory = engine_factory or (lambda rank, a: build_engine(rank, a))
        self.engines = [factory(rank, args) for rank in range(args.dp_size)]
        self.round = 0

    def step(self) -> list[RoundOutcome]:
        """One round on every rank; outcomes in rank order."""
        rows = self.group.gather_lockstep([engine.begin_round() for engine in self.engines])
        outcomes = [engine.end_round(rows) for engine in self.engines]
        self.round += 1
        return outcomes

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
