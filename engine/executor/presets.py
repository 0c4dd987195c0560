"""Cost-model presets of the simulator. Every preset names the hardware and the public figures it
was fitted to; simulated figures are never measurements of that hardware."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.executor.base import DispatchMode
from engine.rows import Row


@dataclass(frozen=True)
class CostPreset:
    """Round time = slowest rank's attention work + expert dispatch/combine + extend-path fixed cost.

    Per rank, attention work is `decode_per_seq_s` per decode row plus `extend_per_token_s` per prompt
    token. Dispatch costs `ll_dispatch_s` per round on the low-latency legs and `normal_dispatch_s`
    plus `normal_per_token_s` per token of the busiest rank on the normal legs. A round on the extend
    path also pays `extend_fixed_s` (kernel launches, normal legs set-up, leaving the decode graph).
    """

    name: str
    source: str
    decode_fixed_s: float
    decode_per_seq_s: float
    extend_per_token_s: float
    extend_fixed_s: float
    ll_dispatch_s: float
    normal_dispatch_s: float
    normal_per_token_s: float
    idle_s: float = 0.0005

    def round_seconds(self, rows: Sequence[Row], mode: DispatchMode) -> float:
        """The round's time: every rank meets in the same collectives, so the slowest rank sets it (F3)."""
        slowest = 0.0
        busiest = 0
        for row in rows:
            prefill = row.prefill_tokens
            decodes = row.num_tokens - prefill
            work = decodes * self.decode_per_seq_s + prefill * self.extend_per_token_s
            if work > slowest:
                slowest = work
            if row.num_tokens > busiest:
                busiest = row.num_tokens
        if mode is DispatchMode.LOW_LATENCY:
            return self.decode_fixed_s + slowest + self.ll_dispatch_s
        return (
            self.decode_fixed_s
            + slowest
            + self.extend_fixed_s
            + self.normal_dispatch_s
            + busiest * (self.normal_per_token_s)
        )


PRESETS: dict[str, CostPreset] = {}


def register(preset: CostPreset) -> CostPreset:
    """Add a preset under its name."""
    PRESETS[preset.name] = preset
    return preset


def preset_named(name: str) -> CostPreset:
    """The preset called `name`; raises ValueError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown sim preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None


register(
    CostPreset(
        name="h200-dp8-ep8",
        source=(
            "DeepEP README (low-latency EP8 dispatch+combine 77+114 us at 128 tokens/GPU); lmsys.org "
            "2025-05-05 large-scale EP (about 7k prompt tokens/s per GPU); ATOM#930 (one rank's 1k-token "
            "prefill makes the round ~14x a decode tick)"
        ),
        decode_fixed_s=0.006,
        decode_per_seq_s=0.00012,
        extend_per_token_s=1 / 7000,
        extend_fixed_s=0.012,
        ll_dispatch_s=0.000191,
        normal_dispatch_s=0.0006,
        normal_per_token_s=0.0000004,
    )
)
