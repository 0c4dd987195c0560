"""The prefill delay gate: the counter and the vote (rules R3-R6). Pure: no I/O, no clock.

Every rank holds one `PrefillGate` and feeds it the same gathered rows, so every rank computes the
same vote on the same round without another collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from engine.config import check_intervals
from engine.rows import all_idle


class GatePoint(IntEnum):
    """Which attempt point a round falls on."""

    NONE = 0
    ANY = 1
    ALL = 2


class GateRow(Protocol):
    """The fields of a gathered row the gate reads."""

    @property
    def num_extends(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def want_prefill(self) -> bool: ...
    @property
    def has_decode_work(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Vote:
    """The group's permission for one round, and the counter value it was decided from."""

    point: GatePoint
    open: bool
    counter: int


def attempt_point(rounds: int, attempt_interval: int, any_interval: int) -> GatePoint:
    """R4: ANY when `rounds != 0 and rounds % K == 0`, else ALL when `rounds % A == 0`; ANY wins a tie."""
    if rounds != 0 and rounds % any_interval == 0:
        return GatePoint.ANY
    if rounds % attempt_interval == 0:
        return GatePoint.ALL
    return GatePoint.NONE


def decide(rounds: int, attempt_interval: int, any_interval: int, rows: Sequence[GateRow] | None) -> Vote:
    """R4-R6: the vote as a pure function of (rounds, A, K, previous rows)."""
    point = attempt_point(rounds, attempt_interval, any_interval)
    if rows is None or point is GatePoint.NONE:
        return Vote(point, False, rounds)  # R5: no rows before the first gather
    if point is GatePoint.ANY:
        return Vote(point, any(row.want_prefill for row in rows), rounds)
    # P5: a rank with no decode work protects nothing, so it never blocks the ALL point.
    return Vote(point, all(row.want_prefill or not row.has_decode_work for row in rows), rounds)


def next_rounds(rounds: int, rows: Sequence[GateRow]) -> int:
    """R3: reset after a round that extended anywhere or was idle everywhere, else count up."""
    if any(row.num_extends > 0 for row in rows) or all_idle(rows):
        return 0
    return rounds + 1


class PrefillGate:
    """The counter `rounds` (rounds_since_prefill) and the rows it last observed.

    Both intervals None is the gate switched off: every round is open (R8). The counter keeps
    counting while off, so switching the gate back on at runtime keeps it (G1). Intervals startup
    would refuse (one of the two, below 1, K < A) raise ValueError with startup's words (C2).
    """

    def __init__(self, attempt_interval: int | None = None, any_interval: int | None = None) -> None:
        self.attempt_interval: int | None = None
        self.any_interval: int | None = None
        self.rounds = 0
        self.rows: tuple[GateRow, ...] | None = None
        self.reconfigure(attempt_interval, any_interval)

    @property
    def enabled(self) -> bool:
        """Whether the gate holds prefill at all."""
        return self.attempt_interval is not None and self.any_interval is not None

    def vote(self) -> Vote:
        """This round's vote, from the counter and the previous round's rows."""
        if self.attempt_interval is None or self.any_interval is None:
            return Vote(GatePoint.NONE, True, self.rounds)
        return decide(self.rounds, self.attempt_interval, self.any_interval, self.rows)

    def observe(self, rows: Sequence[GateRow]) -> None:
        """Update the counter from one round's gathered rows and keep them for the next vote (R3)."""
        self.rounds = next_rounds(self.rounds, rows)
        self.rows = tuple(rows)

    def reconfigure(self, attempt_interval: int | None, any_interval: int | None) -> None:
        """Adopt new intervals (None, None: off); the counter is kept (G1). Raises ValueError and
        changes nothing for intervals startup would refuse."""
        check_intervals(attempt_interval, any_interval)
        self.attempt_interval = attempt_interval
        self.any_interval = any_interval
