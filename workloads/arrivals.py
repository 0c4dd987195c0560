"""Arrival processes: when requests come (Poisson, on/off, bursts, closed loop; trace replay is in traces.py)."""

from __future__ import annotations

import heapq
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Arrival:
    """One arrival. Fields left None are filled by the workload (lengths, rank, storage hit).

    `blocks` names the prompt's prefix blocks (a Mooncake trace's `hash_ids`): the workload's per-rank
    block caches turn them into a prefix hit (`workloads.prefix_cache`).
    """

    time: float
    prompt_len: int | None = None
    output_len: int | None = None
    rank: int | None = None
    prefix_hit: int | None = None
    session: int | None = None  # closed loops: which client issued it
    blocks: tuple[int, ...] | None = None


class ArrivalStream(ABC):
    """The running state of an arrival process."""

    @abstractmethod
    def peek(self) -> float:
        """Time of the next arrival; math.inf when none is scheduled (yet)."""

    @abstractmethod
    def pop(self) -> Arrival:
        """Take the next arrival (the one `peek` timed)."""

    # True for a process that schedules arrivals in response to finishes (a closed loop).
    reactive = False
    # True for a process with finitely many arrivals (a trace).
    finite = False

    @property
    def exhausted(self) -> bool:
        """No arrival will ever come again."""
        return not self.reactive and math.isinf(self.peek())

    def finished(self, session: int | None, now: float) -> None:
        """A request issued by `session` ended at `now` (closed loops issue the next one)."""
        return None


class ArrivalProcess(Protocol):
    """A frozen description of arrivals; `start` begins a run of it."""

    def start(self, rng: random.Random) -> ArrivalStream:
        """A fresh stream drawing from `rng`."""
        ...


@dataclass(frozen=True, slots=True)
class Poisson:
    """Poisson arrivals at `rate` requests per second (exponential gaps), starting at `start_s`."""

    rate: float
    start_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"Poisson: rate must be > 0, got {self.rate}")

    def start(self, rng: random.Random) -> ArrivalStream:
        return _PoissonStream(self, rng)


class _PoissonStream(ArrivalStream):
    def __init__(self, spec: Poisson, rng: random.Random) -> None:
        self._rate = spec.rate
        self._rng = rng
        self._next = spec.start_s + rng.expovariate(spec.rate)

    def peek(self) -> float:
        return self._next

    def pop(self) -> Arrival:
        t = self._next
        self._next = t + self._rng.expovariate(self._rate)
        return Arrival(t)


@dataclass(frozen=True, slots=True)
class OnOff:
    """Bursts: Poisson at `rate` during `on_s` seconds, then nothing for `off_s` seconds, repeating.

    Arrivals are drawn on the "on" time axis and mapped onto the wall: on-time u lands at
    ``(u // on_s) * (on_s + off_s) + u % on_s``, so every burst has the same expected size rate*on_s.
    """

    rate: float
    on_s: float
    off_s: float

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.on_s > 0 and self.off_s >= 0):
            raise ValueError(f"OnOff: need rate > 0, on_s > 0, off_s >= 0, got {self.rate}, {self.on_s}, {self.off_s}")

    def start(self, rng: random.Random) -> ArrivalStream:
        return _OnOffStream(self, rng)


class _OnOffStream(ArrivalStream):
    def __init__(self, spec: OnOff, rng: random.Random) -> None:
        self._spec = spec
        self._rng = rng
        self._u = rng.expovariate(spec.rate)

    def peek(self) -> float:
        spec = self._spec
        cycle, within = divmod(self._u, spec.on_s)
        return cycle * (spec.on_s + spec.off_s) + within

    def pop(self) -> Arrival:
        t = self.peek()
        self._u += self._rng.expovariate(self._spec.rate)
        return Arrival(t)


@dataclass(frozen=True, slots=True)
class Bursts:
    """`size` simultaneous arrivals every `period_s` seconds, the first burst at `first_s`."""

    size: int
    period_s: float
    first_s: float = 0.0

    def __post_init__(self) -> None:
        if self.size < 1 or not self.period_s > 0:
            raise ValueError(f"Bursts: need size >= 1 and period_s > 0, got {self.size}, {self.period_s}")

    def start(self, rng: random.Random) -> ArrivalStream:
        return _BurstStream(self)


class _BurstStream(ArrivalStream):
    def __init__(self, spec: Bursts) -> None:
        self._spec = spec
        self._index = 0

    def peek(self) -> float:
        return self._spec.first_s + (self._index // self._spec.size) * self._spec.period_s

    def pop(self) -> Arrival:
        t = self.peek()
        self._index += 1
        return Arrival(t)


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` clients, each issuing its next request `think_s` after its previous one ends.

    Client s issues its first request at ``ramp_s * s / concurrency`` plus ``start_delays.get(s, 0)``:
    a ramp spreads the first requests (and so the finishes) over time; a delay puts a client out of
    phase in time. ``first_prompt_lens[s]`` gives client s's first prompt another length, which puts it
    out of phase by whole chunks whatever the round time. At most `concurrency` requests are ever in
    flight.
    """

    concurrency: int
    think_s: float = 0.0
    ramp_s: float = 0.0
    start_delays: Mapping[int, float] = field(default_factory=dict)
    first_prompt_lens: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.think_s < 0 or self.ramp_s < 0:
            raise ValueError(
                f"ClosedLoop: need concurrency >= 1, think_s >= 0, ramp_s >= 0, "
                f"got {self.concurrency}, {self.think_s}, {self.ramp_s}"
            )
        for session, length in self.first_prompt_lens.items():
            if length < 1:
                raise ValueError(f"ClosedLoop: first prompt of client {session} must be >= 1 token, got {length}")

    def start(self, rng: random.Random) -> ArrivalStream:
        return _ClosedStream(self)


class _ClosedStream(ArrivalStream):
    reactive = True  # a client whose request is in flight will issue another

    def __init__(self, spec: ClosedLoop) -> None:
        self._spec = spec
        self._first = dict(spec.first_prompt_lens)
        self._heap: list[tuple[float, int]] = [
            (spec.ramp_s * s / spec.concurrency + spec.start_delays.get(s, 0.0), s) for s in range(spec.concurrency)
        ]
        heapq.heapify(self._heap)

    def peek(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def pop(self) -> Arrival:
        t, session = heapq.heappop(self._heap)
        return Arrival(t, prompt_len=self._first.pop(session, None), session=session)

    def finished(self, session: int | None, now: float) -> None:
        if session is not None:
            heapq.heappush(self._heap, (now + self._spec.think_s, session))
