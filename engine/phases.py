"""Optional per-phase timing of the round: totals for benchmarks, wall-clock marks for tracing.

Off by default at the cost of a no-op call per phase.
"""

from __future__ import annotations

import time


class PhaseTimer:
    """Accumulates seconds per phase name between successive `lap` calls."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.rounds = 0
        self._last = 0.0

    def start(self) -> None:
        """Mark the start of a round."""
        self.rounds += 1
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the previous mark to `phase`."""
        now = time.perf_counter()
        self.totals[phase] = self.totals.get(phase, 0.0) + (now - self._last)
        self._last = now


class NullTimer(PhaseTimer):
    """The default: records nothing."""

    def start(self) -> None:
        return None

    def lap(self, phase: str) -> None:
        return None


class MarkTimer(PhaseTimer):
    """Also keeps this round's phase boundaries as Unix nanoseconds, for spans built after the round.

    `marks[0]` is ("start", t0); each lap appends (phase, end of that phase).
    """

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[str, int]] = []

    def start(self) -> None:
        super().start()
        self.marks = [("start", time.time_ns())]

    def lap(self, phase: str) -> None:
        super().lap(phase)
        self.marks.append((phase, time.time_ns()))

    def span_of(self, phase: str) -> tuple[int, int] | None:
        """(start, end) nanoseconds of `phase` this round, or None if it did not run."""
        for index in range(1, len(self.marks)):
            if self.marks[index][0] == phase:
                return self.marks[index - 1][1], self.marks[index][1]
        return None
