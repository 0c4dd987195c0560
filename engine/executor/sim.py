"""The cost-model executor: a round's time from the gathered rows, on a virtual clock (F1-F3).

Every rank computes the same round time from the same rows and advances its own clock by it, so the
ranks' virtual clocks stay equal without communication, exactly as the real ranks leave the same
collectives at the same moment (F3). The time depends on the whole group's rows, never on the rank's
own plan alone: a rank that only decodes pays for its peer's extend (F1).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.clock import VirtualClock
from engine.executor.base import DispatchMode, ForwardResult, dispatch_mode
from engine.executor.presets import CostPreset, preset_named
from engine.rows import Row
from engine.scheduler.plan import Plan

# The last round time computed, keyed by the identity of the gathered rows tuple: in the lockstep driver
# every rank receives the same tuple object, so the cost model runs once per round instead of once per
# rank. One tuple, replaced whole, so two simulators in threads of one process never mix their entries;
# holding the rows keeps their identity from being reused.
_last: tuple[object, object, int, tuple[float, DispatchMode]] = (None, None, 0, (0.0, DispatchMode.NONE))


class SimExecutor:
    """Advances a virtual clock by the preset's round time; samples no tokens."""

    def __init__(self, preset: CostPreset, clock: VirtualClock, page_size: int = 16) -> None:
        self.preset = preset
        self.clock = clock
        self.page_size = page_size

    @classmethod
    def named(cls, preset: str, clock: VirtualClock, page_size: int = 16) -> SimExecutor:
        """An executor of a named preset; raises ValueError listing the known names."""
        return cls(preset_named(preset), clock, page_size)

    def round_seconds(self, rows: Sequence[Row]) -> float:
        """The round's time for the gathered `rows` (identical on every rank)."""
        return self._cost(rows)[0]

    def _cost(self, rows: Sequence[Row]) -> tuple[float, DispatchMode]:
        global _last
        cached_rows, preset, page_size, result = _last
        if cached_rows is rows and preset is self.preset and page_size == self.page_size:
            return result
        mode = dispatch_mode(rows)
        result = (self.preset.round_seconds(rows, mode, self.page_size), mode)
        _last = (rows, self.preset, self.page_size, result)
        return result

    def forward(self, plan: Plan, rows: Sequence[Row]) -> ForwardResult:
        seconds, mode = self._cost(rows)
        self.clock.advance(seconds)
        # Cache operations complete within the round; the scheduler acknowledges them next intake.
        return ForwardResult(seconds=seconds, mode=mode, tokens=None, completed_ops=plan.cache_ops)

    def release(self, rid: str) -> None:
        return None

    def close(self) -> None:
        return None
