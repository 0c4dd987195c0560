"""The row every rank publishes in the round's one all-gather (R2).

A row is one int64 vector per rank. The gate reads five fields (`num_tokens`, `batch_size`,
`num_extends`, `want_prefill`, `has_decode_work`); the rest ride along so that rank 0 sees every
rank's pressure and decision without another channel: observability counts, what the rank decided
(so divergence is detectable), the config epoch it decided under, and rank 0's config proposal (G1).
Adding a field here changes the vector length on every rank at once, which is why the layout lives in
one tuple.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Protocol

# Sentinel for an unset interval inside an int64 vector (intervals are >= 1 when set).
UNSET = -1


@dataclass(slots=True)
class Row:
    """One rank's published row. Booleans travel as 0/1."""

    rank: int = 0
    round: int = 0
    # Gate fields (R3, R4).
    num_tokens: int = 0
    batch_size: int = 0
    num_extends: int = 0
    want_prefill: bool = False
    has_decode_work: bool = False
    # What the rank planned and decided this round.
    prefill_tokens: int = 0
    decision_counter: int = 0
    decision_point: int = 0
    decision_open: bool = False
    config_epoch: int = 0
    # Pressure and queues (observability; peer policies of the lab read some of them).
    pool_pages_used: int = 0
    pool_pages_usable: int = 0
    resident_chunks: int = 0
    waiting_prompts: int = 0
    storage_reads: int = 0
    retracted: int = 0
    running: int = 0
    pending_prefill_tokens: int = 0
    retractions_total: int = 0
    forward_us: int = 0
    spans_dropped: int = 0  # trace spans this rank's exporter dropped so far
    # Tracing only (0 otherwise): when this rank began this round, and ended the previous one (Unix ns),
    # so that a round's root span covers every rank's span of it.
    span_start_ns: int = 0
    previous_span_end_ns: int = 0
    # Rank 0's proposals, adopted by every rank after this gather (G1) and the agreed stop.
    proposal_epoch: int = 0
    proposal_attempt_interval: int = UNSET
    proposal_any_interval: int = UNSET
    stop: bool = False

    @property
    def occupancy(self) -> float:
        """Pages in use or reserved over usable pages (0..1)."""
        return self.pool_pages_used / self.pool_pages_usable if self.pool_pages_usable else 0.0

    @property
    def planned_prefill(self) -> bool:
        """This rank scheduled prefill work this round."""
        return self.num_extends > 0

    def encode(self) -> list[int]:
        """The int64 vector of this row, in `FIELD_NAMES` order."""
        return [int(getattr(self, name)) for name in FIELD_NAMES]

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Pickled as a plain tuple of values: several times cheaper than the slots' state dict, and
        # rows cross a process boundary every round (rank 0's records, the simulator's child process).
        return Row, _VALUES_OF(self)

    @classmethod
    def decode(cls, vector: Sequence[int]) -> Row:
        """Inverse of `encode`; raises ValueError on a vector of the wrong length."""
        if len(vector) != ROW_WIDTH:
            raise ValueError(f"row vector has {len(vector)} values, expected {ROW_WIDTH}")
        row = cls()
        for name, value in zip(FIELD_NAMES, vector, strict=True):
            setattr(row, name, bool(value) if name in BOOL_FIELDS else int(value))
        return row


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Row))
BOOL_FIELDS: frozenset[str] = frozenset(f.name for f in fields(Row) if f.type in ("bool", bool))
ROW_WIDTH = len(FIELD_NAMES)
_VALUES_OF = attrgetter(*FIELD_NAMES)


def decode_rows(flat: Sequence[int], size: int) -> tuple[Row, ...]:
    """Split a gathered flat vector of `size` rows."""
    if len(flat) != size * ROW_WIDTH:
        raise ValueError(f"gathered {len(flat)} values for {size} rows of {ROW_WIDTH}")
    return tuple(Row.decode(flat[i * ROW_WIDTH : (i + 1) * ROW_WIDTH]) for i in range(size))


class _Batched(Protocol):
    @property
    def batch_size(self) -> int: ...


def all_idle(rows: Iterable[_Batched]) -> bool:
    """Every rank had nothing to run this round: no forward runs (F2) and the counter resets (R3)."""
    return all(row.batch_size == 0 for row in rows)
