"""What one round says about each rank, as the console reads it: computed once per record, then reused.

A `Digest` holds the per-rank facts the summary line, the flags, the history strips, the heatmap, the
alerts, sorting and filtering all need, as bitmasks (by row position) and small tuples, so a tick can look
back over hundreds of rounds without touching the protobuf messages again.

"blocks ALL" is decided here, not read from the record's `blocks_all`: the engine reads `want_prefill`
after the round's plan, so a rank that just took its prompt reads `want=false` in the very round it
extends; and with the gate off there is no ALL point to block. A rank blocks ALL when the gate is on, it
has decode work, does not want prefill, and is not extending this round (P4, P5).
"""

from __future__ import annotations

from dataclasses import dataclass

from prefill_gate.v1 import types_pb2 as pb

# kPrefillWatermark (SEMANTICS.md): a rank is under the watermark while occupancy <= 0.9.
WATERMARK = 0.9


@dataclass(frozen=True, slots=True)
class Digest:
    """One round, per rank (bit i / item i: the i-th row of the record)."""

    round: int
    ranks: tuple[int, ...]
    gate_on: bool
    want: int
    decode: int
    extend: int
    above: int
    blocks: int
    occupancy: tuple[float, ...]
    waiting: tuple[int, ...]

    @property
    def size(self) -> int:
        """Ranks in the round."""
        return len(self.ranks)

    @property
    def contested(self) -> bool:
        """Some rank wants prefill: a rank blocking ALL then delays that rank's prompts."""
        return self.want != 0


def gate_on(record: pb.RoundRecord) -> bool:
    """The ALL and ANY points exist: the record's config says the gate is on (unknown: assume on)."""
    return record.config.enabled if record.HasField("config") else True


def digest(record: pb.RoundRecord) -> Digest:
    """The digest of one record."""
    on = gate_on(record)
    want = decode = extend = above = 0
    occupancy = []
    waiting = []
    for position, row in enumerate(record.ranks):
        bit = 1 << position
        if row.want_prefill:
            want |= bit
        if row.has_decode_work:
            decode |= bit
        if row.num_extends:
            extend |= bit
        occ = row.occupancy
        if occ > WATERMARK:
            above |= bit
        occupancy.append(occ)
        waiting.append(row.waiting_prompts)
    blocks = decode & ~want & ~extend if on else 0
    return Digest(
        round=record.round,
        ranks=tuple(row.rank for row in record.ranks),
        gate_on=on,
        want=want,
        decode=decode,
        extend=extend,
        above=above,
        blocks=blocks,
        occupancy=tuple(occupancy),
        waiting=tuple(waiting),
    )


def count(mask: int) -> int:
    """Set bits."""
    return mask.bit_count()


@dataclass(frozen=True, slots=True)
class Summary:
    """The counts of the round shown, for the summary line."""

    ranks: int = 0
    want: int = 0
    blocks: int = 0
    above: int = 0
    extending: int = 0

    @classmethod
    def of(cls, entry: Digest | None) -> Summary:
        """The counts of one round (all zero before the first)."""
        if entry is None:
            return cls()
        return cls(entry.size, count(entry.want), count(entry.blocks), count(entry.above), count(entry.extend))

    def line(self) -> str:
        """`ranks 64 · want 45/64 · blocks ALL 19 · >0.9 1 · extending 0`: read at a glance, easy to grep."""
        return (
            f"ranks {self.ranks} · want {self.want}/{self.ranks} · blocks ALL {self.blocks} · "
            f">{WATERMARK} {self.above} · extending {self.extending}"
        )
