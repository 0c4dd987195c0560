"""Routing: which rank a request goes to (round-robin, shortest queue, weighted skew)."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol


class RouterState(ABC):
    """The running state of a routing rule."""

    needs_loads = False

    @abstractmethod
    def pick(self, loads: list[int]) -> int:
        """The rank for the next request; `loads` is per-rank load including this round's picks."""


class Router(Protocol):
    """A frozen routing rule; `start` begins a run of it for `dp_size` ranks."""

    def start(self, dp_size: int, rng: random.Random) -> RouterState:
        """A fresh router state."""
        ...


@dataclass(frozen=True, slots=True)
class RoundRobin:
    """Ranks 0, 1, ..., N-1, 0, ... in turn."""

    def start(self, dp_size: int, rng: random.Random) -> RouterState:
        return _WeightedState([1.0] * dp_size)


@dataclass(frozen=True, slots=True)
class Skewed:
    """Rank `rank` gets `weight` times the traffic of every other rank (smooth weighted round-robin,
    so the shares are exact over every cycle, not only on average)."""

    weight: float = 4.0
    rank: int = 0

    def __post_init__(self) -> None:
        if not self.weight > 0 or self.rank < 0:
            raise ValueError(f"Skewed: need weight > 0 and rank >= 0, got {self.weight}, {self.rank}")

    def start(self, dp_size: int, rng: random.Random) -> RouterState:
        if self.rank >= dp_size:
            raise ValueError(f"Skewed: rank {self.rank} is outside a group of {dp_size} ranks")
        weights = [1.0] * dp_size
        weights[self.rank] = self.weight
        return _WeightedState(weights)


class _WeightedState(RouterState):
    """Smooth weighted round-robin: each pick adds every weight to its rank's credit and takes the
    total from the rank with the most credit (ties: the lowest rank)."""

    def __init__(self, weights: list[float]) -> None:
        self._weights = weights
        self._total = sum(weights)
        self._credit = [0.0] * len(weights)

    def pick(self, loads: list[int]) -> int:
        credit = self._credit
        for rank, weight in enumerate(self._weights):
            credit[rank] += weight
        best = max(range(len(credit)), key=credit.__getitem__)
        credit[best] -= self._total
        return best


@dataclass(frozen=True, slots=True)
class ShortestQueue:
    """The rank with the least load (the driver's per-rank waiting + running; ties: lowest rank)."""

    def start(self, dp_size: int, rng: random.Random) -> RouterState:
        return _ShortestState()


class _ShortestState(RouterState):
    needs_loads = True

    def pick(self, loads: list[int]) -> int:
        return min(range(len(loads)), key=loads.__getitem__)
