"""Per-rank prefix block caches: which 512-token prompt blocks each rank still holds (Mooncake `hash_ids`).

A Mooncake trace names every prompt by its blocks: block i is the hash of the prompt's first
``(i + 1) * 512`` tokens, so two prompts with an equal block id share the whole prefix up to it. A rank
that served a prompt keeps its blocks; a later prompt sent there reuses the longest run of its leading
blocks the rank still holds, and only the rest needs prefill.

The model, per rank:

- What a rank holds: the blocks of the prompts it finished (`insert`, called when a request ends: its
  KV exists from the end of its prefill, so counting it from the finish never claims KV a rank has not
  computed yet; a follow-up turn of a conversation arrives after its previous turn finished anyway).
- Where it is held: the rank's host KV tier (as SGLang's HiCache or the Mooncake store keep prefix KV
  off the GPU). A hit therefore goes through the scheduler's existing storage-hit path
  (`RequestSpec.prefix_hit`): the prompt waits `--storage-read-ticks` rounds for the read, its hit
  tokens are loaded into Device pages, and only the suffix is extended.
- Eviction: least recently used, by block, bounded at `capacity` blocks. A prompt's blocks are touched
  from its last block to its first, so a shared head (a system prompt, earlier turns) is always more
  recent than the tails hanging off it and goes last, as a radix tree evicts leaves before their
  parents. A hit touches the blocks it matched.

`DEFAULT_CACHE_BLOCKS` = 6144 blocks (3.1M tokens) per rank, a choice: a node of 8 GPUs with 2 TB of host
memory gives 256 GB a rank; half of it for KV, at about 40 KB of FP8 MLA KV per token for a
DeepSeek-V3-class model (the figure `engine/executor/presets.py` uses), holds ~3.2M tokens. On the
Mooncake conversation trace (~93M distinct prompt tokens in an hour, ~12M per rank) that keeps roughly
the last 15 minutes of a rank's traffic, so conversations that come back within minutes hit and old
ones are evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

MOONCAKE_BLOCK_TOKENS = 512
DEFAULT_CACHE_BLOCKS = 6144


class BlockCache:
    """One rank's cached prefix blocks, least recently used first, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"prefix cache capacity must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def match(self, blocks: Sequence[int]) -> int:
        """How many leading blocks of `blocks` this rank holds (a prefix match stops at the first miss)."""
        held = self._blocks
        count = 0
        for block in blocks:
            if block not in held:
                break
            count += 1
        return count

    def touch(self, blocks: Sequence[int]) -> None:
        """Mark held `blocks` as just used, the first block most recent (see the module docstring)."""
        held = self._blocks
        for block in reversed(blocks):
            if block in held:
                held.move_to_end(block)

    def insert(self, blocks: Sequence[int]) -> None:
        """Hold `blocks` (a finished prompt's), evicting the least recently used beyond the capacity."""
        if not self.capacity:
            return
        held = self._blocks
        for block in reversed(blocks):
            held[block] = None
            held.move_to_end(block)
        while len(held) > self.capacity:
            held.popitem(last=False)
            self.evicted += 1


@dataclass(frozen=True, slots=True)
class PrefixView:
    """What a router may know of one request's prefix: per rank, the leading blocks that rank holds
    (`matched`) and how many blocks it holds in all (`sizes`); `blocks` is the request's block count."""

    blocks: int
    matched: tuple[int, ...]
    sizes: tuple[int, ...]


class RankCaches:
    """A group's per-rank block caches and the hits they give."""

    def __init__(self, dp_size: int, capacity: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        if block_tokens < 1:
            raise ValueError(f"prefix block size must be >= 1 token, got {block_tokens}")
        self.block_tokens = block_tokens
        self.ranks = [BlockCache(capacity) for _ in range(dp_size)]

    def view(self, blocks: Sequence[int]) -> PrefixView:
        """Every rank's match for `blocks`, for the router."""
        return PrefixView(
            blocks=len(blocks),
            matched=tuple(cache.match(blocks) for cache in self.ranks),
            sizes=tuple(len(cache) for cache in self.ranks),
        )

    def hit(self, rank: int, blocks: Sequence[int], prompt_len: int, matched: int | None = None) -> int:
        """Prompt tokens `rank` serves from its cache for a prompt of `blocks` (touching what matched).

        At most ``prompt_len - 1``: the last prompt token is always computed, since it yields the first
        output token (and `RequestSpec.prefix_hit` must stay below `prompt_len`).
        """
        cache = self.ranks[rank]
        count = cache.match(blocks) if matched is None else matched
        if not count:
            return 0
        cache.touch(blocks[:count])
        return min(count * self.block_tokens, prompt_len - 1)

    def finished(self, rank: int, blocks: Sequence[int]) -> None:
        """A request of `blocks` ended on `rank`: the rank now holds them."""
        self.ranks[rank].insert(blocks)

    @property
    def evicted(self) -> int:
        """Blocks evicted on every rank so far."""
        return sum(cache.evicted for cache in self.ranks)
