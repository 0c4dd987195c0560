"""Workloads: when requests arrive, how long they are, which rank gets them (ARCHITECTURE.md, Engine).

A `Workload` is what a driver asks each round: ``due(now, loads)`` returns the requests that arrived by
``now`` with their ranks, ``on_finished(rid, now)`` tells it a request ended (closed loops issue the
next one), and ``done`` says no request will come again. The same object serves the lockstep simulator
(virtual clock) and the process driver (wall clock): it only compares arrival times with ``now``.

Parts, each a small frozen spec started from the workload's seed:

- arrivals: `Poisson`, `OnOff` bursts, `Bursts` of simultaneous requests, `ClosedLoop` concurrency,
  `Trace` replay of a JSONL file;
- lengths: `Fixed`, `Uniform`, `Normal`, `LogNormal` (both clipped), `OutputRatio` (sglang#23189);
- routing: `RoundRobin`, `ShortestQueue`, `Skewed`.

Every random choice comes from its own stream seeded from ``(seed, stream name)``, so the same seed
gives the same requests, and changing, say, the router does not change the lengths drawn.
"""

from __future__ import annotations

import heapq
import json
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engine.request import RequestSpec


def stream(seed: int, name: str) -> random.Random:
    """An independent random stream for one part of a workload (string seeds hash with SHA-512,
    so the stream does not depend on PYTHONHASHSEED)."""
    return random.Random(f"{seed}:{name}")


# -- length distributions ------------------------------------------------------------------------------


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


# -- arrivals --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    """One arrival. Fields left None are filled by the workload (lengths, rank, storage hit)."""

    time: float
    prompt_len: int | None = None
    output_len: int | None = None
    rank: int | None = None
    prefix_hit: int | None = None
    session: int | None = None  # closed loops: which client issued it


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


@dataclass(frozen=True)
class Trace:
    """Replay of a JSONL file, one request a line: ``{"t", "prompt_len", "output_len", ["rank"], ["prefix_hit"]}``.

    `source` is the file's path, or arrivals already read with `load_trace`. A path is read and
    checked when the workload starts; a malformed line raises ValueError naming the file and the line
    number. Blank lines are skipped; other keys are ignored. Requests are replayed in time order (lines
    with equal `t` keep their file order).
    """

    source: str | Path | Sequence[Arrival]

    def start(self, rng: random.Random) -> ArrivalStream:
        if isinstance(self.source, str | Path):
            return _TraceStream(load_trace(self.source))
        return _TraceStream(sorted(self.source, key=lambda a: a.time))


class _TraceStream(ArrivalStream):
    finite = True

    def __init__(self, arrivals: list[Arrival]) -> None:
        self._arrivals = arrivals
        self._index = 0

    def peek(self) -> float:
        return self._arrivals[self._index].time if self._index < len(self._arrivals) else math.inf

    def pop(self) -> Arrival:
        arrival = self._arrivals[self._index]
        self._index += 1
        return arrival


def load_trace(path: str | Path) -> list[Arrival]:
    """Parse a JSONL trace; raises ValueError("<file>:<line>: ...") on the first malformed line."""
    arrivals: list[Arrival] = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            arrivals.append(_parse_trace_line(line, f"{path}:{number}"))
    arrivals.sort(key=lambda a: a.time)  # stable: equal times keep file order
    return arrivals


def _parse_trace_line(line: str, where: str) -> Arrival:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(item).__name__}")
    t = item.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise ValueError(f"{where}: 't' must be a finite number >= 0, got {t!r}")
    prompt_len = _trace_int(item, "prompt_len", where, minimum=1)
    output_len = _trace_int(item, "output_len", where, minimum=1)
    rank = _trace_int(item, "rank", where, minimum=0, required=False)
    hit = _trace_int(item, "prefix_hit", where, minimum=0, required=False)
    if hit is not None and prompt_len is not None and hit >= prompt_len:
        raise ValueError(f"{where}: 'prefix_hit' ({hit}) must be < 'prompt_len' ({prompt_len})")
    return Arrival(float(t), prompt_len, output_len, rank, hit)


def _trace_int(item: dict[str, object], key: str, where: str, minimum: int, required: bool = True) -> int | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


# -- routing ---------------------------------------------------------------------------------------------


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


# -- the workload ----------------------------------------------------------------------------------------


class Workload:
    """Requests for a group of `dp_size` ranks, one run's worth (build a new one for every run).

    `limit` caps the requests issued; `until` drops arrivals after that time. With probability
    `prefix_hit_prob` a request's first ``floor(prefix_hit_fraction * prompt_len)`` tokens are a storage
    hit (`RequestSpec.prefix_hit`). `token_ids` adds prompt token ids below `vocab` (the torch executor
    needs them). `sticky_sessions` sends a closed-loop client's requests to the rank of its first one.
    """

    def __init__(
        self,
        arrivals: ArrivalProcess,
        *,
        dp_size: int,
        prompt: LengthDist = Fixed(1024),
        output: LengthDist = Fixed(256),
        router: Router = RoundRobin(),
        seed: int = 0,
        limit: int | None = None,
        until: float | None = None,
        prefix_hit_prob: float = 0.0,
        prefix_hit_fraction: float = 0.5,
        token_ids: bool = False,
        vocab: int = 512,
        sticky_sessions: bool = True,
        rid_prefix: str = "r",
    ) -> None:
        if dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {dp_size}")
        if not 0.0 <= prefix_hit_prob <= 1.0 or not 0.0 <= prefix_hit_fraction < 1.0:
            raise ValueError(
                f"need 0 <= prefix_hit_prob <= 1 and 0 <= prefix_hit_fraction < 1, "
                f"got {prefix_hit_prob}, {prefix_hit_fraction}"
            )
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if vocab < 1:
            raise ValueError(f"vocab must be >= 1, got {vocab}")
        self.dp_size = dp_size
        self.seed = seed
        self.limit = limit
        self.until = until
        self.prefix_hit_prob = prefix_hit_prob
        self.prefix_hit_fraction = prefix_hit_fraction
        self.token_ids = token_ids
        self.vocab = vocab
        self.sticky_sessions = sticky_sessions
        self.rid_prefix = rid_prefix
        self._prompt = prompt
        self._output = output
        self._arrivals = arrivals.start(stream(seed, "arrivals"))
        self._router = router.start(dp_size, stream(seed, "router"))
        self._lengths = stream(seed, "lengths")
        self._hits = stream(seed, "hits")
        self._tokens = stream(seed, "tokens")
        self.issued = 0
        self.finished = 0
        self.in_flight_per_rank = [0] * dp_size
        self._flight: dict[str, tuple[int, int | None]] = {}  # rid -> (rank, session)
        self._session_rank: dict[int, int] = {}
        self._last_now = -math.inf

    @property
    def bounded(self) -> bool:
        """Whether the workload ends by itself (a limit, a time bound, or finitely many arrivals)."""
        return self.limit is not None or self.until is not None or self._arrivals.finite

    @property
    def needs_loads(self) -> bool:
        """Whether `due` wants the driver's per-rank loads (shortest-queue routing)."""
        return self._router.needs_loads

    @property
    def next_arrival(self) -> float:
        """Time of the next request; math.inf when none is scheduled now."""
        if self.limit is not None and self.issued >= self.limit:
            return math.inf
        t = self._arrivals.peek()
        return math.inf if self.until is not None and t > self.until else t

    @property
    def done(self) -> bool:
        """No request will be issued again (requests in flight may still be running)."""
        if self.limit is not None and self.issued >= self.limit:
            return True
        if self._arrivals.exhausted:
            return True
        if self.until is None or self._arrivals.peek() <= self.until:
            return False
        # Past `until` nothing is issued; before it, a closed-loop client that finishes may still issue.
        return not self._arrivals.reactive or self._last_now >= self.until

    @property
    def in_flight(self) -> int:
        """Requests issued and not yet reported finished."""
        return len(self._flight)

    def due(self, now: float, loads: Sequence[int] | None = None) -> list[tuple[int, RequestSpec]]:
        """Every request that arrived by `now`, with its rank, in arrival order.

        `loads` is the driver's per-rank load (e.g. waiting + running from the latest rows); without it
        the workload's own in-flight count per rank is used. Either way picks made in this call count.
        """
        out: list[tuple[int, RequestSpec]] = []
        self._last_now = now
        if self.next_arrival > now:
            return out
        current = list(loads) if loads is not None else list(self.in_flight_per_rank)
        if len(current) != self.dp_size:
            raise ValueError(f"loads has {len(current)} entries for {self.dp_size} ranks")
        while self.next_arrival <= now:
            arrival = self._arrivals.pop()
            rank = self._rank_for(arrival, current)
            spec = self._spec(arrival)
            current[rank] += 1
            self.in_flight_per_rank[rank] += 1
            self._flight[spec.rid] = (rank, arrival.session)
            self.issued += 1
            out.append((rank, spec))
        return out

    def on_finished(self, rid: str, now: float) -> None:
        """A request ended (finished, aborted or refused) at `now`; closed loops issue the next one."""
        entry = self._flight.pop(rid, None)
        if entry is None:
            return
        rank, session = entry
        self.in_flight_per_rank[rank] -= 1
        self.finished += 1
        self._arrivals.finished(session, now)

    def _rank_for(self, arrival: Arrival, loads: list[int]) -> int:
        if arrival.rank is not None:
            if arrival.rank >= self.dp_size:
                raise ValueError(f"trace request at t={arrival.time} names rank {arrival.rank} of {self.dp_size}")
            return arrival.rank
        session = arrival.session
        if self.sticky_sessions and session is not None and session in self._session_rank:
            return self._session_rank[session]
        rank = self._router.pick(loads)
        if session is not None:
            self._session_rank[session] = rank
        return rank

    def _spec(self, arrival: Arrival) -> RequestSpec:
        prompt_len = arrival.prompt_len if arrival.prompt_len is not None else self._prompt.sample(self._lengths)
        output_len = arrival.output_len if arrival.output_len is not None else self._output.sample(self._lengths)
        if arrival.prefix_hit is not None:
            hit = arrival.prefix_hit
        elif self.prefix_hit_prob and self._hits.random() < self.prefix_hit_prob:
            hit = min(int(self.prefix_hit_fraction * prompt_len), prompt_len - 1)
        else:
            hit = 0
        prompt = tuple(self._tokens.choices(range(self.vocab), k=prompt_len)) if self.token_ids else None
        return RequestSpec(
            rid=f"{self.rid_prefix}{self.issued}",
            prompt_len=prompt_len,
            output_len=output_len,
            arrival=arrival.time,
            prompt=prompt,
            prefix_hit=hit,
        )
