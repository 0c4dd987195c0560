"""The oracle bound of the policy lab (PEERS.md item 8): not a policy, the limits a policy is measured against.

Both bounds are pure functions of the run's requests, given as `(rank, prompt_len, prefix_hit, output_len)`.

- **Extend rounds.** A rank extends at most `budget` prompt tokens per round (S8), and only the uncached
  suffix `prompt_len - prefix_hit` needs prefill. So rank r needs at least `ceil(sum of its suffixes / budget)`
  extend rounds, and since ranks can extend in the same rounds, the group needs at least the largest of those.
  The bound ignores arrival times: no policy can do better, even one that knew every arrival in advance.
- **Decode throughput.** What the decode path could deliver for the same requests if no decode round ever
  left it: every request starts decoding at round 0 (its first token comes from its last prefill chunk,
  so it decodes `output_len - 1` rounds), each rank runs at most `max_batch_size` requests at once and
  admits its waiting ones in the given order as slots free, and a round costs `decode_round_seconds(b)`
  where b is the largest per-rank decode batch of that round (the slowest rank sets the round, F3).
  `decode_tokens_per_s` is the decode tokens over that time. It is an optimistic yardstick, not a
  schedule: arrivals, prefill rounds and retraction only add time (admission is in the given order; another
  order could pack the tail slightly tighter).

`decode_round_seconds_of(preset)` adapts a simulator cost preset (anything with the `CostPreset.round_seconds`
signature) to the callable: the preset's own low-latency round with every rank decoding `b` sequences that
read `kv_pages_per_seq` pages each. Using the busiest batch on every rank slightly overstates the experts'
share when ranks are uneven; going through `round_seconds` keeps the bound in step with the preset.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

from engine.executor.base import DispatchMode
from engine.rows import Row

# (rank, prompt_len, prefix_hit, output_len), as the lab's workloads describe a request.
OracleRequest = tuple[int, int, int, int]
# Seconds of one decode round whose busiest rank decodes `batch` sequences.
DecodeRoundSeconds = Callable[[int], float]


class RoundCost(Protocol):
    """What the oracle needs of a cost preset: the round time of gathered rows on a dispatch path."""

    def round_seconds(self, rows: Sequence[Row], mode: DispatchMode, page_size: int = 16) -> float: ...


@dataclass(frozen=True, slots=True)
class OracleBound:
    """The limits for one run's requests."""

    extend_rounds: int
    extend_rounds_per_rank: dict[int, int]
    decode_rounds: int
    decode_seconds: float
    decode_tokens: int

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode tokens per second on the ideal decode path (0 when there is nothing to decode)."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def extend_rounds_per_rank(requests: Iterable[OracleRequest], budget: int) -> dict[int, int]:
    """Per rank, `ceil(uncached prompt tokens / budget)`: the fewest extend rounds it could run."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    tokens: dict[int, int] = defaultdict(int)
    for rank, prompt_len, prefix_hit, _ in requests:
        if not 0 <= prefix_hit < prompt_len:
            raise ValueError(f"prefix_hit must be in [0, prompt_len), got {prefix_hit} for prompt_len {prompt_len}")
        tokens[rank] += prompt_len - prefix_hit
    return {rank: -(-total // budget) for rank, total in sorted(tokens.items())}


def decode_segments(output_lens: Iterable[int], max_batch_size: int) -> list[tuple[int, int, int]]:
    """One rank's decode batch over rounds as `(start, end, batch)` segments, end exclusive.

    Requests decode `output_len - 1` rounds each, at most `max_batch_size` at once, admitted in order.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    queue = deque(length - 1 for length in output_lens if length > 1)
    finishing: list[int] = []
    segments: list[tuple[int, int, int]] = []
    now = 0
    while queue or finishing:
        while queue and len(finishing) < max_batch_size:
            heapq.heappush(finishing, now + queue.popleft())
        end = finishing[0]
        segments.append((now, end, len(finishing)))
        now = end
        while finishing and finishing[0] == now:
            heapq.heappop(finishing)
    return segments


def _group_batches(per_rank: list[list[tuple[int, int, int]]]) -> list[tuple[int, int]]:
    """(rounds, largest batch over ranks) for each stretch where no rank's batch changes."""
    bounds = sorted({edge for segments in per_rank for start, end, _ in segments for edge in (start, end)})
    cursors = [0] * len(per_rank)
    stretches = []
    for start, end in pairwise(bounds):
        batch = 0
        for index, segments in enumerate(per_rank):
            while cursors[index] < len(segments) and segments[cursors[index]][1] <= start:
                cursors[index] += 1
            if cursors[index] < len(segments) and segments[cursors[index]][0] <= start:
                batch = max(batch, segments[cursors[index]][2])
        stretches.append((end - start, batch))
    return stretches


def oracle_bound(
    requests: Iterable[OracleRequest],
    budget: int,
    max_batch_size: int,
    decode_round_seconds: DecodeRoundSeconds,
) -> OracleBound:
    """Both bounds for one run's requests (see the module docstring)."""
    requests = list(requests)
    per_rank_rounds = extend_rounds_per_rank(requests, budget)
    outputs: dict[int, list[int]] = defaultdict(list)
    for rank, _, _, output_len in requests:
        if output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {output_len}")
        outputs[rank].append(output_len)
    stretches = _group_batches([decode_segments(lens, max_batch_size) for _, lens in sorted(outputs.items())])
    return OracleBound(
        extend_rounds=max(per_rank_rounds.values(), default=0),
        extend_rounds_per_rank=per_rank_rounds,
        decode_rounds=sum(rounds for rounds, _ in stretches),
        decode_seconds=sum(rounds * decode_round_seconds(batch) for rounds, batch in stretches),
        decode_tokens=sum(output_len - 1 for *_, output_len in requests),
    )


def decode_round_seconds_of(
    preset: RoundCost, ranks: int = 1, kv_pages_per_seq: int = 0, page_size: int = 16
) -> DecodeRoundSeconds:
    """A preset's decode-path round as a function of the busiest rank's decode batch (module docstring)."""
    if ranks < 1 or kv_pages_per_seq < 0:
        raise ValueError(f"need ranks >= 1 and kv_pages_per_seq >= 0, got {ranks}, {kv_pages_per_seq}")

    def seconds(batch: int) -> float:
        rows = tuple(
            Row(rank=rank, num_tokens=batch, batch_size=batch, pool_pages_used=batch * kv_pages_per_seq)
            for rank in range(ranks)
        )
        return preset.round_seconds(rows, DispatchMode.LOW_LATENCY, page_size)

    return seconds
