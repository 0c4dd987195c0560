"""Length distributions of prompts and outputs: token counts >= 1, drawn from a workload's stream."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol


class LengthDist(Protocol):
    """A distribution of token counts (>= 1)."""

    def sample(self, rng: random.Random) -> int:
        """Draw one length."""
        ...


def _check_range(kind: str, low: int, high: int | None) -> None:
    if low < 1 or (high is not None and high < low):
        raise ValueError(f"{kind}: need 1 <= low <= high, got low={low}, high={high}")


@dataclass(frozen=True, slots=True)
class Fixed:
    """Always `value` tokens."""

    value: int

    def __post_init__(self) -> None:
        _check_range("Fixed", self.value, None)

    def sample(self, rng: random.Random) -> int:
        return self.value


@dataclass(frozen=True, slots=True)
class Uniform:
    """Uniform integer in [low, high]."""

    low: int
    high: int

    def __post_init__(self) -> None:
        _check_range("Uniform", self.low, self.high)

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


@dataclass(frozen=True, slots=True)
class Normal:
    """Normal(mean, std), rounded and clipped to [low, high]."""

    mean: float
    std: float
    low: int = 1
    high: int | None = None

    def __post_init__(self) -> None:
        _check_range("Normal", self.low, self.high)
        if self.std < 0:
            raise ValueError(f"Normal: std must be >= 0, got {self.std}")

    def sample(self, rng: random.Random) -> int:
        return _clip(round(rng.gauss(self.mean, self.std)), self.low, self.high)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Log-normal with the given median and shape `sigma` (of the log), rounded and clipped to [low, high]."""

    median: float
    sigma: float
    low: int = 1
    high: int | None = None

    def __post_init__(self) -> None:
        _check_range("LogNormal", self.low, self.high)
        if self.median <= 0 or self.sigma < 0:
            raise ValueError(f"LogNormal: need median > 0 and sigma >= 0, got {self.median}, {self.sigma}")

    def sample(self, rng: random.Random) -> int:
        return _clip(round(rng.lognormvariate(math.log(self.median), self.sigma)), self.low, self.high)


@dataclass(frozen=True, slots=True)
class OutputRatio:
    """sglang#23189's output length ratio: uniform integer in [ceil(ratio * length), length]."""

    length: int
    ratio: float

    def __post_init__(self) -> None:
        _check_range("OutputRatio", self.length, None)
        if not 0 < self.ratio <= 1:
            raise ValueError(f"OutputRatio: ratio must be in (0, 1], got {self.ratio}")

    def sample(self, rng: random.Random) -> int:
        return rng.randint(max(1, math.ceil(self.ratio * self.length)), self.length)


def _clip(value: int, low: int, high: int | None) -> int:
    value = max(low, value)
    return value if high is None else min(high, value)
