"""The `Workload`: arrivals, lengths and routing of one run, drawn from independent seeded streams."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from engine.request import RequestSpec
from workloads.arrivals import Arrival, ArrivalProcess
from workloads.lengths import Fixed, LengthDist
from workloads.prefix_cache import MOONCAKE_BLOCK_TOKENS, PrefixView, RankCaches
from workloads.routing import RoundRobin, Router

# Frozen specs, shared safely as defaults.
DEFAULT_PROMPT = Fixed(1024)
DEFAULT_OUTPUT = Fixed(256)
DEFAULT_ROUTER = RoundRobin()


def stream(seed: int, name: str) -> random.Random:
    """An independent random stream for one part of a workload (string seeds hash with SHA-512,
    so the stream does not depend on PYTHONHASHSEED)."""
    return random.Random(f"{seed}:{name}")


class Workload:
    """Requests for a group of `dp_size` ranks, one run's worth (build a new one for every run).

    `limit` caps the requests issued; `until` drops arrivals after that time. With probability
    `prefix_hit_prob` a request's first ``floor(prefix_hit_fraction * prompt_len)`` tokens are a storage
    hit (`RequestSpec.prefix_hit`). `token_ids` adds prompt token ids below `vocab` (the torch executor
    needs them). `sticky_sessions` sends a closed-loop client's requests to the rank of its first one.

    Arrivals that name prefix `blocks` (a Mooncake trace) meet per-rank block caches of `cache_blocks`
    blocks of `block_tokens` tokens (`workloads.prefix_cache`; 0: no caches): the router sees every rank's
    match, the chosen rank's match becomes the request's `prefix_hit`, and the blocks are the rank's once
    the request ends.
    """

    def __init__(
        self,
        arrivals: ArrivalProcess,
        *,
        dp_size: int,
        prompt: LengthDist = DEFAULT_PROMPT,
        output: LengthDist = DEFAULT_OUTPUT,
        router: Router = DEFAULT_ROUTER,
        seed: int = 0,
        limit: int | None = None,
        until: float | None = None,
        prefix_hit_prob: float = 0.0,
        prefix_hit_fraction: float = 0.5,
        token_ids: bool = False,
        vocab: int = 512,
        sticky_sessions: bool = True,
        rid_prefix: str = "r",
        cache_blocks: int = 0,
        block_tokens: int = MOONCAKE_BLOCK_TOKENS,
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
        if cache_blocks < 0:
            raise ValueError(f"cache_blocks must be >= 0, got {cache_blocks}")
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
        self.prefix_caches = RankCaches(dp_size, cache_blocks, block_tokens) if cache_blocks > 0 else None
        self.in_flight_per_rank = [0] * dp_size
        # rid -> (rank, session, prefix blocks)
        self._flight: dict[str, tuple[int, int | None, tuple[int, ...] | None]] = {}
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
        caches = self.prefix_caches
        while self.next_arrival <= now and self.next_arrival != math.inf:  # due(math.inf): every arrival, then stop
            arrival = self._arrivals.pop()
            blocks = arrival.blocks if caches is not None else None
            view = caches.view(blocks) if caches is not None and blocks else None
            rank = self._rank_for(arrival, current, view)
            cached = None
            if caches is not None and blocks and view is not None and arrival.prefix_hit is None:
                prompt_len = arrival.prompt_len if arrival.prompt_len is not None else 1
                cached = caches.hit(rank, blocks, prompt_len, view.matched[rank])
            spec = self._spec(arrival, cached)
            current[rank] += 1
            self.in_flight_per_rank[rank] += 1
            self._flight[spec.rid] = (rank, arrival.session, blocks)
            self.issued += 1
            out.append((rank, spec))
        return out

    def on_finished(self, rid: str, now: float) -> None:
        """A request ended (finished, aborted or refused) at `now`; closed loops issue the next one."""
        entry = self._flight.pop(rid, None)
        if entry is None:
            return
        rank, session, blocks = entry
        if blocks and self.prefix_caches is not None:
            self.prefix_caches.finished(rank, blocks)
        self.in_flight_per_rank[rank] -= 1
        self.finished += 1
        self._arrivals.finished(session, now)

    def _rank_for(self, arrival: Arrival, loads: list[int], prefix: PrefixView | None = None) -> int:
        if arrival.rank is not None:
            if arrival.rank >= self.dp_size:
                raise ValueError(f"trace request at t={arrival.time} names rank {arrival.rank} of {self.dp_size}")
            return arrival.rank
        session = arrival.session
        if self.sticky_sessions and session is not None and session in self._session_rank:
            return self._session_rank[session]
        rank = self._router.pick(loads, prefix)
        if session is not None:
            self._session_rank[session] = rank
        return rank

    def _spec(self, arrival: Arrival, cached: int | None = None) -> RequestSpec:
        prompt_len = arrival.prompt_len if arrival.prompt_len is not None else self._prompt.sample(self._lengths)
        output_len = arrival.output_len if arrival.output_len is not None else self._output.sample(self._lengths)
        if arrival.prefix_hit is not None:
            hit = arrival.prefix_hit
        elif cached is not None:
            hit = cached
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
