"""The lockstep driver: every rank of a group stepped inside one process over a `LocalGroup`."""

from __future__ import annotations

from collections.abc import Callable

from engine.build import build_engine
from engine.config import PrefillDelay, ServerArgs
from engine.group import LocalGroup
from engine.rank import RankEngine, RoundOutcome
from engine.request import Abort, ProposeConfig, RequestSpec, Stop, Submit, UpdateWeights

EngineFactory = Callable[[int, ServerArgs], RankEngine]


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
