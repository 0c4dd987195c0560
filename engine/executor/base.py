"""The executor seam: run the planned batch after the gather, and say how long the round took."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from engine.rows import Row, all_idle
from engine.scheduler.plan import CacheOp, Plan


class DispatchMode(IntEnum):
    """The expert-dispatch legs of a round (F1); NONE when every rank is idle (F2)."""

    NONE = 0
    NORMAL = 1
    LOW_LATENCY = 2


def dispatch_mode(rows: Sequence[Row]) -> DispatchMode:
    """F1/F2 from the gathered rows, identical on every rank."""
    if all_idle(rows):
        return DispatchMode.NONE
    if all(row.num_extends == 0 for row in rows):
        return DispatchMode.LOW_LATENCY  # all_decode_or_idle
    return DispatchMode.NORMAL


@dataclass(slots=True)
class ForwardResult:
    """What one rank's forward produced.

    `tokens` maps each sampling row's request id to its output token; None when the executor does
    not sample real tokens (the simulator). `completed_ops` are cache operations finished during
    this round; the scheduler acknowledges them at the next intake.
    """

    seconds: float
    mode: DispatchMode
    tokens: dict[str, int] | None = None
    completed_ops: list[CacheOp] = field(default_factory=list)


class Executor(Protocol):
    """Runs a rank's part of every round's forward, idle forward included (F2)."""

    def forward(self, plan: Plan, rows: Sequence[Row]) -> ForwardResult:
        """Run `plan` in the round whose gathered rows are `rows`."""
        ...

    def release(self, rid: str) -> None:
        """Forget a finished or aborted request's state (host images, last token)."""
        ...

    def close(self) -> None:
        """Free resources; safe to call twice."""
        ...
