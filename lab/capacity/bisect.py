"""The capacity search itself, pure: the highest load at which a predicate holds, by bisection on a lattice.

`bisect_capacity(passes, lo, hi)` assumes `passes(load)` is true up to some capacity and false above it
(a simulated run at a load either meets its SLOs and does not backlog, or it does not). Loads live on a
geometric lattice ``lo * (1 + step) ** i``: every probe is a lattice point, so two searches over the same
lattice (another SLO, another knob setting) ask for the same loads and a cache answers the repeats; the
answer is exact to one lattice step.

The search first brackets the capacity: while `hi` passes it doubles (up to `ceiling`); while `lo` fails it
halves (down to `floor`, below which the capacity is reported as 0). Then it bisects the exponent until the
passing and the failing load are neighbours. A predicate that is not monotone (noise near the knee) still
gets an answer: a load that passed with a failing load right above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lattice:
    """Loads ``base * (1 + step) ** i`` for integer i; `floor` and `ceiling` bound the search."""

    base: float
    step: float
    floor: float
    ceiling: float

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.step > 0 and 0 < self.floor <= self.base <= self.ceiling):
            raise ValueError(
                f"need base > 0, step > 0 and 0 < floor <= base <= ceiling, got base={self.base}, "
                f"step={self.step}, floor={self.floor}, ceiling={self.ceiling}"
            )

    def load(self, index: int) -> float:
        """The load at lattice index `index` (index 0 is `base`)."""
        return self.base * (1 + self.step) ** index

    def index(self, load: float) -> int:
        """The lattice index nearest `load`."""
        return round(math.log(load / self.base) / math.log1p(self.step))

    @property
    def low(self) -> int:
        """The lowest index not below `floor`."""
        return math.ceil(math.log(self.floor / self.base) / math.log1p(self.step) - 1e-9)

    @property
    def high(self) -> int:
        """The highest index not above `ceiling`."""
        return math.floor(math.log(self.ceiling / self.base) / math.log1p(self.step) + 1e-9)

    @property
    def octave(self) -> int:
        """Lattice steps per doubling of the load (at least 1)."""
        return max(1, round(math.log(2) / math.log1p(self.step)))


@dataclass(frozen=True, slots=True)
class Search:
    """What a bisection found: `capacity` passed (0.0 when even the floor failed), `failed_at` failed (None when
    the ceiling passed), and every probe in the order it was asked."""

    capacity: float
    failed_at: float | None
    probes: tuple[tuple[float, bool], ...]


def bisect_capacity(
    passes: Callable[[float], bool], lattice: Lattice, *, hint: float | None = None, known: float | None = None
) -> Search:
    """The highest lattice load at which `passes` holds (module docstring).

    `hint` is where to start (default: the lattice base); `known` is a load already known to pass (a previous
    search's answer), which the search then never asks again.
    """
    probes: list[tuple[float, bool]] = []
    answers: dict[int, bool] = {}

    def ask(index: int) -> bool:
        if index not in answers:
            load = lattice.load(index)
            answers[index] = bool(passes(load))
            probes.append((load, answers[index]))
        return answers[index]

    low, high = lattice.low, lattice.high

    def clamp(index: int) -> int:
        return min(max(index, low), high)

    start = clamp(lattice.index(hint if hint is not None else lattice.base))
    bottom = low  # the lowest index a downward bracket may try
    if known is not None:
        bottom = clamp(lattice.index(known))
        answers[bottom] = True
        start = max(start, bottom)
    # Bracket the capacity: `ok` held, `bad` failed (None: nothing found yet on that side).
    ok: int | None = None
    bad: int | None = None
    if ask(start):
        ok = start
        while bad is None and ok < high:
            trial = min(ok + lattice.octave, high)
            if ask(trial):
                ok = trial
            else:
                bad = trial
    else:
        bad = start
        while ok is None and bad > bottom:
            trial = max(bad - lattice.octave, bottom)
            if ask(trial):
                ok = trial
            else:
                bad = trial
    if ok is None:
        return Search(0.0, lattice.load(bad) if bad is not None else None, tuple(probes))
    if bad is None:
        return Search(lattice.load(ok), None, tuple(probes))
    while bad - ok > 1:
        mid = (ok + bad) // 2
        if ask(mid):
            ok = mid
        else:
            bad = mid
    return Search(lattice.load(ok), lattice.load(bad), tuple(probes))
