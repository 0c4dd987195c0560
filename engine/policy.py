"""The `PrefillPolicy` seam: what decides, each round, whether a rank may plan prefill.

A policy sees two things: its own rank's fresh local view before the plan (`decide`) and the
gathered rows after the all-gather (`observe`). Group policies (the gate, the lab's peers) decide
from the rows they observed; local ones (L1, vLLM's cadence) from the local view alone. Every
policy is a plain object driven by `RankEngine`; none does I/O.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from engine.config import PrefillDelay, ServerArgs
from engine.gate import GatePoint, PrefillGate
from engine.rows import Row


@dataclass(frozen=True, slots=True)
class LocalView:
    """What a rank knows of itself before planning, read fresh from its scheduler."""

    wants_prefill: bool = False
    has_decode_work: bool = False
    # Rounds the longest-waiting schedulable new prompt has waited (L1's delay budget); -1: none.
    oldest_wait_rounds: int = -1


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer for one round.

    `allow_prefill` is the permission for prefill work; `hold_resident_chunks=False` lets resident
    chunks continue even when it is false (peers that gate only new prompts). `point` and `counter`
    describe the vote for the round record.
    """

    allow_prefill: bool
    hold_resident_chunks: bool = True
    point: GatePoint = GatePoint.NONE
    counter: int = 0


class PrefillPolicy(ABC):
    """Decides `allow_prefill` each round; one instance per rank."""

    name: ClassVar[str]
    # True when every rank decides from the same gathered rows, so their decisions must agree.
    group_decision: ClassVar[bool] = False

    @abstractmethod
    def decide(self, local: LocalView) -> Decision:
        """This round's decision, before the plan (R1 step 2)."""

    @abstractmethod
    def observe(self, rows: Sequence[Row]) -> None:
        """The round's gathered rows, after the all-gather (R1 step 7)."""

    @property
    def counter(self) -> int:
        """The policy's round counter after the last observe (0 when it keeps none)."""
        return 0

    @property
    def delay(self) -> PrefillDelay | None:
        """The gate intervals in force, if this policy has them."""
        return None

    def reconfigure(self, delay: PrefillDelay | None) -> None:
        """Adopt new gate intervals (G1). Policies without intervals accept only None."""
        if delay is not None:
            raise ValueError(f"policy {self.name!r} has no prefill delay intervals to reconfigure")


class GatePolicy(PrefillPolicy):
    """The prefill delay gate (R3-R6); with no intervals it is off and always allows (R8)."""

    name = "gate"
    group_decision = True

    def __init__(self, delay: PrefillDelay | None) -> None:
        self.gate = PrefillGate()
        self.reconfigure(delay)

    def decide(self, local: LocalView) -> Decision:
        vote = self.gate.vote()
        return Decision(allow_prefill=vote.open, point=vote.point, counter=vote.counter)

    def observe(self, rows: Sequence[Row]) -> None:
        self.gate.observe(rows)

    @property
    def counter(self) -> int:
        return self.gate.rounds

    @property
    def delay(self) -> PrefillDelay | None:
        gate = self.gate
        if gate.attempt_interval is None or gate.any_interval is None:
            return None
        return PrefillDelay(gate.attempt_interval, gate.any_interval)

    def reconfigure(self, delay: PrefillDelay | None) -> None:
        if delay is None:
            self.gate.reconfigure(None, None)
        else:
            self.gate.reconfigure(delay.attempt_interval, delay.any_interval)


class UngatedPolicy(PrefillPolicy):
    """Plain continuous batching: prefill whenever there is work (the lab's baseline)."""

    name = "ungated"

    def decide(self, local: LocalView) -> Decision:
        return Decision(allow_prefill=True)

    def observe(self, rows: Sequence[Row]) -> None:
        return None


def policy_for(args: ServerArgs, rank: int = 0) -> PrefillPolicy:
    """The policy a launch configures: L1 when its interval is set, else the gate (off when unset)."""
    if args.prefill_decode_interval is not None:
        from engine.policies.local_interval import LocalIntervalPolicy

        return LocalIntervalPolicy(args.prefill_decode_interval, rank)
    return GatePolicy(args.prefill_delay)
