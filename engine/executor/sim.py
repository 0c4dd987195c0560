"""The cost-model executor: a round's time from the gathered rows, on a virtual clock (F1-F3)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.clock import VirtualClock
from engine.executor.base import DispatchMode, ForwardResult, dispatch_mode
from engine.executor.presets import CostPreset, preset_named
from engine.rows import Row
from engine.scheduler.plan import Plan


class SimExecutor:
    """Every rank computes the same round time from the same rows and advances its own clock by it,
    so the ranks' virtual clocks stay equal without communication."""

    def __init__(self, preset: CostPreset, clock: VirtualClock) -> None:
        self.preset = preset
        self.clock = clock

    @classmethod
    def named(cls, preset: str, clock: VirtualClock) -> SimExecutor:
        """An executor of a named preset; raises ValueError on an unknown name."""
        return cls(preset_named(preset), clock)

    def forward(self, plan: Plan, rows: Sequence[Row]) -> ForwardResult:
        mode = dispatch_mode(rows)
        seconds = self.preset.round_seconds(rows, mode) if mode is not DispatchMode.NONE else self.preset.idle_s
        self.clock.advance(seconds)
        # Cache operations complete within the round; the scheduler acknowledges them next intake.
        return ForwardResult(seconds=seconds, mode=mode, tokens=None, completed_ops=plan.cache_ops)

    def release(self, rid: str) -> None:
        return None

    def close(self) -> None:
        return None
