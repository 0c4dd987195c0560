"""Optional per-phase timing of the round, for benchmarks; off by default at the cost of a no-op call."""

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
