"""Two clocks, one code path: wall time for the torch executor, virtual time for the simulator."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds since the run started."""

    def now(self) -> float: ...


class WallClock:
    """Monotonic wall time since `origin` (a `time.perf_counter()` value; default: construction).

    On Linux perf_counter reads CLOCK_MONOTONIC, which every process of the machine shares, so rank
    processes given the controller's origin stamp events on the controller's clock.
    """

    def __init__(self, origin: float | None = None) -> None:
        self._start = time.perf_counter() if origin is None else origin

    def now(self) -> float:
        return time.perf_counter() - self._start


class VirtualClock:
    """Time that moves only when the simulator says a round took so long."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move forward; a negative step is a bug in the cost model."""
        if seconds < 0:
            raise ValueError(f"virtual clock cannot go back ({seconds} s)")
        self._now += seconds
