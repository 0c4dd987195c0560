"""What the scheduler hands the round: the probe, the plan options, the plan and its cache ops."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum

K_PREFILL_WATERMARK = 0.9


@dataclass(frozen=True, slots=True)
class Probe:
    """The two booleans a rank votes with (P1, P2), read on the state after planning (P3)."""

    wants_prefill: bool
    has_decode_work: bool


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """The round's permission. `allow_chunk_continuation` None means: same as `allow_prefill`."""

    allow_prefill: bool
    allow_chunk_continuation: bool | None = None

    @property
    def chunks_allowed(self) -> bool:
        """Whether resident chunks may extend this round."""
        if self.allow_chunk_continuation is None:
            return self.allow_prefill
        return self.allow_chunk_continuation


class BatchKind(IntEnum):
    """What the rank's forward runs this round."""

    IDLE = 0
    DECODE = 1
    EXTEND = 2
    MIXED = 3
    PAUSED = 4


class PlanBuild(Enum):
    """How the prefill part of the plan was built; every value but OK means no new prompt entered."""

    OK = "ok"  # prefill planned as asked, or there was none to plan
    GATED = "gated"  # prefill work was waiting but not allowed (S1)
    FULL = "full"  # a new prompt was allowed but the batch was full: deferred silently (S5)
    WATERMARK = "watermark"  # a new prompt waited while occupancy was above the watermark (S7)
    NO_MEMORY = "no_memory"  # eligible prefill found no pages, even after capacity retraction (S4)
    PAUSED = "paused"  # a weight update paused the round


class CacheOpKind(Enum):
    """Cache operations move KV images between the Device pool and the host tier."""

    OFFLOAD = "offload"  # retraction: Device pages -> host image; pages are free once issued
    RESTORE = "restore"  # readmission: host image -> Device pages; no prefill tokens (S2)
    LOAD_PREFIX = "load_prefix"  # a storage hit: cached prefix -> Device pages


@dataclass(frozen=True, slots=True)
class CacheOp:
    """One cache operation; completes asynchronously and is acknowledged at a later intake."""

    kind: CacheOpKind
    rid: str
    pages: tuple[int, ...]
    num_tokens: int


@dataclass(slots=True)
class BatchRow:
    """One request's slice of the forward: `num_tokens` tokens at KV positions from `start`."""

    rid: str
    extend: bool
    start: int
    num_tokens: int
    pages: list[int]
    samples: bool  # produces an output token this round (last prefill chunk or decode)
    input_tokens: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """The counts the round row publishes, taken after the plan."""

    pool_pages_used: int = 0
    pool_pages_usable: int = 0
    resident_chunks: int = 0
    waiting_prompts: int = 0
    storage_reads: int = 0
    retracted: int = 0
    running: int = 0
    pending_prefill_tokens: int = 0
    retractions_total: int = 0

    @property
    def occupancy(self) -> float:
        """Pages in use or reserved over usable pages."""
        return self.pool_pages_used / self.pool_pages_usable if self.pool_pages_usable else 0.0


@dataclass(slots=True)
class Plan:
    """One rank's plan for one round.

    Decode rows are materialised on demand (`rows`): the simulator needs only the counts, and a
    rank with hundreds of decoding requests should not build a row object per request per round.
    """

    round: int
    kind: BatchKind = BatchKind.IDLE
    build: PlanBuild = PlanBuild.OK
    extend_rows: list[BatchRow] = field(default_factory=list)
    num_decodes: int = 0
    prefill_tokens: int = 0
    cache_ops: list[CacheOp] = field(default_factory=list)
    counts: PoolCounts = field(default_factory=PoolCounts)
    decode_rows_fn: Callable[[], list[BatchRow]] | None = None

    @property
    def num_extends(self) -> int:
        """Requests extending (prefill chunks) this round."""
        return len(self.extend_rows)

    @property
    def batch_size(self) -> int:
        """Requests in this round's forward."""
        return self.num_decodes + len(self.extend_rows)

    @property
    def num_tokens(self) -> int:
        """Tokens in this round's forward: one per decode row plus the chunks."""
        return self.num_decodes + self.prefill_tokens

    @property
    def decode_rows(self) -> list[BatchRow]:
        """The decode rows, built now."""
        return self.decode_rows_fn() if self.decode_rows_fn is not None and self.num_decodes else []

    @property
    def rows(self) -> list[BatchRow]:
        """Every row the forward runs: prefill chunks first, then decodes."""
        return self.extend_rows + self.decode_rows
