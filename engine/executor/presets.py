"""Cost-model presets of the simulator, each fitted to public figures (PEERS.md, "Cost model").

A preset is a handful of linear coefficients. The round time it gives is F3 in numbers: the slowest
rank's attention work, plus the MoE and its dispatch/combine legs, plus the fixed cost of the path the
round runs on (F1): the decode path (CUDA graph, low-latency legs) when every rank is decode-only or
idle, the extend path (eager, normal legs) as soon as any rank extends.

Every preset names the hardware and model it represents and carries its `anchors`: the public
figures it was fitted to, as round shapes with the seconds they took. `tests/test_sim.py` checks every
preset against its anchors, so a coefficient cannot drift away from its source unnoticed. Where a
source gives only part of the picture, the split between coefficients is an assumption and the
preset's docstring says so. A simulated figure is never a measurement of the hardware named here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from engine.executor.base import DispatchMode
from engine.rows import Row

# DeepSeek-V3/R1 have 61 transformer layers, 58 of them MoE (3 dense). Per-layer leg latencies from
# the DeepEP README become per-round costs by multiplying with this count.
DSV3_MOE_LAYERS = 58


@dataclass(frozen=True, slots=True)
class RankWork:
    """One rank's share of a round, as a preset sees it: decode rows, prompt tokens, KV tokens read."""

    decodes: int = 0
    prefill_tokens: int = 0
    kv_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Anchor:
    """A public figure a preset was fitted to: a round of `ranks` and the seconds it took.

    `ranks` lists each rank's work; the preset must give `seconds` within `rel_tol`.
    """

    label: str
    seconds: float
    ranks: tuple[RankWork, ...]
    rel_tol: float = 0.15


@dataclass(frozen=True, slots=True)
class CostPreset:
    """Round time = fixed path cost + slowest rank's attention + MoE compute + dispatch/combine legs.

    Per rank r, attention work is ``attn_per_seq_s * decodes_r + attn_per_kv_token_s * kv_r +
    prefill_per_token_s * prefill_r``; ``kv_r`` is the KV the rank's decode rows read (its pages in use
    times the page size, counted only on a rank that decodes). The round then adds:

    - the path's fixed cost: ``decode_fixed_s`` on the decode path (graph replay and the low-latency
      legs' latency floor), ``extend_fixed_s`` on the extend path (eager launches, the normal legs'
      floor, leaving and re-entering the graph);
    - the experts' compute, ``moe_per_token_s`` per token averaged over the ranks (EP spreads every
      rank's tokens over every rank's experts);
    - the legs' per-token part at the busiest rank: ``ll_per_token_s`` or ``normal_per_token_s``.

    ``extend_penalty_s`` (extend_fixed_s - decode_fixed_s) is the fixed price of leaving the decode path.
    """

    name: str
    hardware: str
    model: str
    source: str
    decode_fixed_s: float
    extend_fixed_s: float
    attn_per_seq_s: float
    attn_per_kv_token_s: float
    prefill_per_token_s: float
    moe_per_token_s: float
    ll_per_token_s: float
    normal_per_token_s: float
    idle_s: float = 0.0005
    anchors: tuple[Anchor, ...] = field(default=(), compare=False)

    @property
    def extend_penalty_s(self) -> float:
        """The fixed price every rank pays when any rank extends (F1)."""
        return self.extend_fixed_s - self.decode_fixed_s

    def round_seconds(self, rows: Sequence[Row], mode: DispatchMode, page_size: int = 16) -> float:
        """The round's time from the gathered rows: every rank meets in the same collectives, so the
        slowest rank sets the attention part and the busiest rank the legs (F3)."""
        if mode is DispatchMode.NONE:
            return self.idle_s
        slowest = 0.0
        busiest = 0
        total = 0
        per_seq, per_prefill = self.attn_per_seq_s, self.prefill_per_token_s
        per_kv = self.attn_per_kv_token_s * page_size  # rows carry pages; the coefficient is per KV token
        for row in rows:
            tokens = row.num_tokens
            prefill = row.prefill_tokens
            decodes = tokens - prefill
            work = prefill * per_prefill
            if decodes:
                work += decodes * per_seq + row.pool_pages_used * per_kv
            if work > slowest:
                slowest = work
            if tokens > busiest:
                busiest = tokens
            total += tokens
        moe = self.moe_per_token_s * total / len(rows)
        if mode is DispatchMode.LOW_LATENCY:
            return self.decode_fixed_s + slowest + moe + self.ll_per_token_s * busiest
        return self.extend_fixed_s + slowest + moe + self.normal_per_token_s * busiest

    def work_seconds(self, ranks: Sequence[RankWork]) -> float:
        """The round time of an explicit per-rank workload (anchors, calibration checks)."""
        return self.round_seconds(rows_for(ranks), mode_for(ranks), page_size=1)


def rows_for(ranks: Sequence[RankWork]) -> tuple[Row, ...]:
    """Gathered rows for per-rank work, with page size 1 (one KV token per page)."""
    return tuple(
        Row(
            rank=index,
            num_tokens=work.decodes + work.prefill_tokens,
            batch_size=work.decodes + (1 if work.prefill_tokens else 0),
            num_extends=1 if work.prefill_tokens else 0,
            prefill_tokens=work.prefill_tokens,
            pool_pages_used=work.kv_tokens,
        )
        for index, work in enumerate(ranks)
    )


def mode_for(ranks: Sequence[RankWork]) -> DispatchMode:
    """F1/F2 for explicit per-rank work."""
    if all(w.decodes == 0 and w.prefill_tokens == 0 for w in ranks):
        return DispatchMode.NONE
    return DispatchMode.NORMAL if any(w.prefill_tokens for w in ranks) else DispatchMode.LOW_LATENCY


PRESETS: dict[str, CostPreset] = {}


def register(preset: CostPreset) -> CostPreset:
    """Add a preset under its name; a second preset of the same name is a bug."""
    if preset.name in PRESETS:
        raise ValueError(f"sim preset {preset.name!r} is already registered")
    PRESETS[preset.name] = preset
    return preset


def preset_named(name: str) -> CostPreset:
    """The preset called `name`, or read from `name` when it ends in ".json" (a calibrated preset saved
    with `save_preset`); raises ValueError listing the known names."""
    if name.endswith(".json"):
        return load_preset(name)
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown sim preset {name!r}; known presets: {', '.join(sorted(PRESETS))} (or a calibrated preset's .json)"
        ) from None


# Fields a preset file holds: every field but the anchors (a fitted preset has none).
_FILE_FIELDS = tuple(f.name for f in fields(CostPreset) if f.name != "anchors")


def save_preset(preset: CostPreset, path: str | Path) -> None:
    """Write a preset (without anchors) as JSON, for `--sim-preset PATH.json`."""
    values = {name: value for name, value in asdict(preset).items() if name in _FILE_FIELDS}
    Path(path).write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")


def load_preset(path: str | Path) -> CostPreset:
    """Read a preset written by `save_preset`; ValueError names the file and what is wrong."""
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read sim preset file {str(path)!r}: {exc}") from None
    if not isinstance(values, dict):
        raise ValueError(f"sim preset file {str(path)!r} must hold a JSON object")
    missing = [name for name in _FILE_FIELDS if name not in values and name != "idle_s"]
    unknown = sorted(set(values) - set(_FILE_FIELDS))
    if missing or unknown:
        raise ValueError(f"sim preset file {str(path)!r}: missing {missing}, unknown {unknown}")
    for name, value in values.items():
        numeric = name not in ("name", "hardware", "model", "source")
        if numeric and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise ValueError(f"sim preset file {str(path)!r}: {name} must be a number >= 0, got {value!r}")
    return CostPreset(**values)


def preset_names() -> tuple[str, ...]:
    """Every registered preset name, sorted."""
    return tuple(sorted(PRESETS))


def _uniform(n: int, decodes: int = 0, prefill: int = 0, kv_per_seq: int = 0) -> tuple[RankWork, ...]:
    return tuple(RankWork(decodes, prefill, decodes * kv_per_seq) for _ in range(n))


def _one_extends(n: int, decodes: int, kv_per_seq: int, prefill: int) -> tuple[RankWork, ...]:
    """Rank 0 extends a prompt (and does not decode, as without mixed mode); the others decode."""
    return (RankWork(0, prefill, 0), *_uniform(n - 1, decodes, 0, kv_per_seq))


# -- the shapes every preset is described by ----------------------------------------------------------------
#
# The penalty anchors of PEERS.md are ratios of two round shapes on one machine; a preset is compared with
# them, and with the others, on the same shapes:
# - ATOM#930: a decode tick of 16 seq/GPU with 1k KV each (TICK_16), and the round in which one rank
#   extends a ~1k prompt while the seven others decode that (LONE_1K): 118 / 8.5 ms = 13.9x.
# - vllm#44558: the cudagraph decode floor of the interval-2 run, ~80 seq/GPU by Little's law
#   (22.6 req/s / 8 GPUs x (0.50 s TTFT + 199 x 0.140 s TPOT) = 80), with 1k prompt + ~100 output tokens
#   of KV (FLOOR_80), and the baseline run's P50 round, every rank extending a 1k prompt beside its decodes
#   at ~140 seq/GPU (22.4 / 8 x (0.81 + 199 x 0.2405) = 137) (MIXED_140): 274.9 / 32.1 ms = 8.6x.
ATOM_LONE_RATIO = 118.0 / 8.5
VLLM_MIXED_RATIO = 274.9 / 32.1
TICK_16 = _uniform(8, 16, 0, 1000)
LONE_1K = _one_extends(8, 16, 1000, 1024)
FLOOR_80 = _uniform(8, 80, 0, 1100)
MIXED_140 = tuple(RankWork(140, 1024, 140 * 1100) for _ in range(8))
FULL_16K = _uniform(8, 0, 16384)

# The extend slope every preset without an anchor of its own uses: lmsys.org 2025-05-05 measured 6-8k
# prompt tokens/s per GPU (H100, large EP); 7k is the middle. Per prompt token, in a round where every rank
# extends, that is 1/7000 s = 143 us in all (the fixed extend cost included), split between the extending
# rank's own attention and dense layers (prefill_per_token_s), the experts spread over the EP group
# (moe_per_token_s, which decode already pins at 30-50 us) and the normal dispatch/combine legs
# (normal_per_token_s): an assumption per preset, stated in its docstring.
LMSYS_TOKENS_PER_S = 7000.0


def lone_prompt_ratio(preset: CostPreset) -> float:
    """How many decode ticks one rank's lone 1k prompt costs the group (LONE_1K / TICK_16, ATOM#930's shape).

    The measure of how steep a preset's extend penalty is: what the gate saves by batching prefill."""
    return preset.work_seconds(LONE_1K) / preset.work_seconds(TICK_16)


def mixed_ratio(preset: CostPreset) -> float:
    """vllm#44558's shape: every rank extends 1k beside ~140 decodes, over the ~80-seq decode floor."""
    return preset.work_seconds(MIXED_140) / preset.work_seconds(FLOOR_80)


def extend_tokens_per_s(preset: CostPreset) -> float:
    """Prompt tokens per second per GPU when every rank extends a 16k chunk (the extend slope)."""
    return FULL_16K[0].prefill_tokens / preset.work_seconds(FULL_16K)


def fitted_extend_penalty(preset: CostPreset) -> float:
    """The extend penalty (extend_fixed_s - decode_fixed_s) that puts `preset` on both penalty anchors
    at once, transferred as ratios onto its own decode ticks.

    With penalty X the two rounds are L0 + X and M0 + X (L0, M0: `preset` with no penalty); X solves
    (L0 + X)(M0 + X) = (13.9 x TICK_16)(8.6 x FLOOR_80), so the log errors against the two ratios are equal
    and opposite: the least-squares compromise of ATOM#930 (steeper) and vllm#44558 (milder).
    """
    free = replace(preset, extend_fixed_s=preset.decode_fixed_s)
    lone, mixed = free.work_seconds(LONE_1K), free.work_seconds(MIXED_140)
    target = ATOM_LONE_RATIO * free.work_seconds(TICK_16) * VLLM_MIXED_RATIO * free.work_seconds(FLOOR_80)
    total = lone + mixed
    return (-total + math.sqrt(total * total - 4 * (lone * mixed - target))) / 2


def _ratio_anchors(preset: CostPreset) -> tuple[Anchor, ...]:
    """The two penalty anchors as absolute rounds on `preset`'s own decode ticks (within 20%)."""
    tick, floor = preset.work_seconds(TICK_16), preset.work_seconds(FLOOR_80)
    return (
        Anchor("ROCm/ATOM#930 ratio: a lone 1k prompt costs 13.9 decode ticks", ATOM_LONE_RATIO * tick, LONE_1K, 0.2),
        Anchor(
            "vllm#44558 ratio: every rank's 1k prompt beside decodes, 8.6 floors",
            VLLM_MIXED_RATIO * floor,
            MIXED_140,
            0.2,
        ),
    )


def _lmsys_anchor() -> Anchor:
    return Anchor("lmsys: ~7k prompt tokens/s/GPU (6-8k), every rank extends 16k", 16384 / LMSYS_TOKENS_PER_S, FULL_16K)


def _penalty_from_ratios(preset: CostPreset) -> CostPreset:
    """`preset` with its extend penalty fitted to the ratio anchors, and its anchors listed."""
    fitted = replace(preset, extend_fixed_s=round(preset.decode_fixed_s + fitted_extend_penalty(preset), 3))
    return replace(fitted, anchors=(*preset.anchors, _lmsys_anchor(), *_ratio_anchors(fitted)))


# -- the presets -------------------------------------------------------------------------------------
#
# Shared derivations (DeepSeek-V3-class models, 58 MoE layers):
# - Low-latency legs: the DeepEP README gives dispatch + combine per layer at 128 tokens/GPU:
#   EP8 77 + 114 us, EP32 155 + 273 us (H800). Assumption: half of it is a latency floor (folded into
#   decode_fixed_s) and half grows with tokens, so per round ll_per_token_s = 58 * (191 us / 2) / 128.
# - Decode attention: MLA reads about 40 KB of FP8 KV per token per forward (61 layers); at H800's
#   3.35 TB/s that is about 1.2e-8 s per KV token, the figure used on Hopper below.
#
# Of the five, MILDEST_PRESET (gb200-dp8-vllm: a lone 1k prompt costs 9.2 decode ticks) and STEEPEST_PRESET
# (mi355x-dp8-atom: 14.5) bracket the extend penalty; `lone_prompt_ratio` is the measure, and
# tests/test_presets.py checks that these names are the extremes.


def _h200_dp8_ep8() -> CostPreset:
    """One 8x H200 node serving DeepSeek-V3/R1 with attention DP8 and DeepEP EP8 (the default).

    Decode (DeepSeek inference profile, ~55 ms at 128 seq/GPU with ~5k KV each, borrowed unscaled from H800:
    H200's extra bandwidth is not credited): 25 ms fixed (graph replay, and the EP8 legs' floor
    58 x 95.5 us = 5.5 ms) + 128 x 80 us per-sequence attention (10.2 ms) + 128 x 4989 x 1.2e-8 KV reads
    (7.7 ms) + 128 x 40 us experts (5.1 ms) + 128 x 43.3 us legs (5.5 ms) = 53.6 ms.

    Extend slope (lmsys 6-8k prompt tokens/s/GPU): 80 us attention and dense layers + 40 us experts + 20 us
    normal legs = 140 us per prompt token. Extend penalty (the two ratio anchors on this preset's ticks):
    TICK_16 = 27.8 ms and FLOOR_80 = 39.1 ms; without a penalty LONE_1K = 133.1 ms and MIXED_140 = 189.8 ms;
    (133.1 + X)(189.8 + X) = (13.9 x 27.8)(8.6 x 39.1) gives X = 199 ms, so extend_fixed_s = 224 ms. Then a
    lone 1k prompt costs 11.9 decode ticks (ATOM#930: 13.9), every rank's 1k prompt beside 140 decodes
    9.9 floors (vllm#44558: 8.6), and a 16k chunk on every rank 2.52 s: 6.5k tokens/s/GPU, inside lmsys's
    bracket. (The issue 11 version had 50 ms and 30/40/12 us: 3.5 ticks and 11.8k tokens/s/GPU.)

    Not an anchor here: sglang#35241's ~1.4 s round of a 16k-token chunk on every rank of one 8-GPU DP8 node
    is DeepSeek-V4-Pro (sparse attention, a different model), 1.8x faster per token than this V3 preset.
    """
    base = CostPreset(
        name="h200-dp8-ep8",
        hardware="one node of 8x H200 (NVLink), attention DP8, DeepEP EP8 intranode",
        model="DeepSeek-V3/R1 671B (FP8 weights, MLA, FP8 KV)",
        source=(
            "DeepEP README: EP8 low-latency dispatch+combine 77+114 us/layer at 128 tokens/GPU (H800); "
            "DeepSeek inference profile: decode step ~55 ms at 128 seq/GPU, average KV ~5k tokens (H800 EP128, "
            "shape borrowed unscaled); lmsys.org 2025-05-05: 6-8k prompt tokens/s per GPU (the extend slope); "
            "extend penalty fitted to ROCm/ATOM#930 (lone 1k prompt = 13.9 decode ticks) and vllm#44558 (1k "
            "prompts beside decodes = 8.6 decode floors) as ratios; not fitted: sglang#35241's 16k-token/rank "
            "chunk round of ~1.4 s is DeepSeek-V4-Pro, not V3"
        ),
        decode_fixed_s=0.025,
        extend_fixed_s=0.025,
        attn_per_seq_s=8.0e-5,
        attn_per_kv_token_s=1.2e-8,
        prefill_per_token_s=8.0e-5,
        moe_per_token_s=4.0e-5,
        ll_per_token_s=DSV3_MOE_LAYERS * 95.5e-6 / 128,
        normal_per_token_s=2.0e-5,
        anchors=(
            Anchor("DeepSeek profile: all-decode round at 128 seq/GPU, ~5k KV each", 0.055, _uniform(8, 128, 0, 4989)),
        ),
    )
    return _penalty_from_ratios(base)


def _h800_ep32_dsv3() -> CostPreset:
    """Four 8x H800 nodes serving DeepSeek-V3/R1 with attention DP32 and DeepEP EP32 over InfiniBand.

    Decode (DeepSeek profile, ~55 ms at 128 seq/GPU, ~5k KV): 20 ms fixed (with the EP32 legs' floor
    58 x 214 us = 12.4 ms) + 128 x 60 us per sequence (7.7 ms) + KV reads 7.7 ms + 128 x 50 us experts
    (6.4 ms) + 128 x 97 us EP32 legs (12.4 ms) = 54.2 ms.

    Extend slope (lmsys ~7k prompt tokens/s/GPU with large EP): 55 us attention and dense + 50 us experts
    + 35 us internode normal legs (RDMA is slower than EP8's NVLink, so the legs take a larger share) =
    140 us per prompt token. Extend penalty (ratio anchors): TICK_16 = 23.5 ms, FLOOR_80 = 37.6 ms; without a
    penalty LONE_1K = 119.3 ms, MIXED_140 = 185.5 ms; (119.3 + X)(185.5 + X) = (13.9 x 23.5)(8.6 x 37.6) gives
    X = 173 ms (extend_fixed_s = 193 ms): a lone 1k prompt costs 12.4 ticks, 1k prompts beside decodes 9.5
    floors, a 16k chunk on every rank 2.49 s (6.6k tokens/s/GPU).
    """
    base = CostPreset(
        name="h800-ep32-dsv3",
        hardware="4 nodes of 8x H800 (InfiniBand), attention DP32, DeepEP EP32 internode",
        model="DeepSeek-V3/R1 671B (FP8 weights, MLA, FP8 KV)",
        source=(
            "DeepEP README: EP32 low-latency dispatch+combine 155+273 us/layer at 128 tokens/GPU (H800); "
            "DeepSeek inference profile: decode step ~55 ms at 128 seq/GPU, average KV ~5k tokens; "
            "lmsys.org 2025-05-05: about 7k prompt tokens/s per GPU with large EP; extend penalty fitted to the "
            "ROCm/ATOM#930 and vllm#44558 ratios"
        ),
        decode_fixed_s=0.020,
        extend_fixed_s=0.020,
        attn_per_seq_s=6.0e-5,
        attn_per_kv_token_s=1.2e-8,
        prefill_per_token_s=5.5e-5,
        moe_per_token_s=5.0e-5,
        ll_per_token_s=DSV3_MOE_LAYERS * 214e-6 / 128,
        normal_per_token_s=3.5e-5,
        anchors=(
            Anchor("DeepSeek profile: all-decode round at 128 seq/GPU, ~5k KV each", 0.055, _uniform(8, 128, 0, 4989)),
        ),
    )
    return _penalty_from_ratios(base)


def _h100_ep72_dsv3() -> CostPreset:
    """The lmsys large-scale EP deployment: DeepSeek-V3 decode on 9 nodes of 8x H100 with EP72.

    Decode (~92 ms per step at 256 seq/GPU with 2k-token inputs, KV ~2.2k by mid-output): 22 ms fixed
    + 256 x 130 us per sequence (33.3 ms: H100's lower bandwidth at twice DeepSeek's batch) + 256 x 2200 x
    1.7e-8 KV reads (9.6 ms) + 256 x 50 us experts (12.8 ms) + 256 x 48 us legs (DeepEP's EP32 figure, the
    nearest published, halved per token for the larger batch: 12.4 ms) = 90.1 ms.

    Extend slope (~7k prompt tokens/s/GPU, the prefill side of the same deployment): 55 + 50 + 35 us =
    140 us per prompt token. Extend penalty (ratio anchors): TICK_16 = 25.9 ms, FLOOR_80 = 41.8 ms; without a
    penalty LONE_1K = 121.3 ms, MIXED_140 = 198.1 ms; (121.3 + X)(198.1 + X) = (13.9 x 25.9)(8.6 x 41.8)
    gives X = 201 ms (extend_fixed_s = 223 ms): a lone 1k prompt costs 12.4 ticks, 1k prompts beside
    decodes 9.6 floors, a 16k chunk on every rank 2.52 s (6.5k tokens/s/GPU).
    """
    base = CostPreset(
        name="h100-ep72-dsv3",
        hardware="9 nodes of 8x H100 (InfiniBand), decode with attention DP and DeepEP EP72",
        model="DeepSeek-V3 671B (FP8 weights, MLA)",
        source=(
            "lmsys.org 2025-05-05 large-scale EP: decode ~92 ms per step at 256 seq/GPU (EP72, 2k-token inputs), "
            "about 6-8k prompt tokens/s per GPU on the prefill side; DeepEP README EP32 legs as the nearest "
            "published low-latency figure (155+273 us/layer at 128 tokens/GPU); extend penalty fitted to the "
            "ROCm/ATOM#930 and vllm#44558 ratios"
        ),
        decode_fixed_s=0.022,
        extend_fixed_s=0.022,
        attn_per_seq_s=1.3e-4,
        attn_per_kv_token_s=1.7e-8,
        prefill_per_token_s=5.5e-5,
        moe_per_token_s=5.0e-5,
        ll_per_token_s=DSV3_MOE_LAYERS * 214e-6 / 128 / 2,
        normal_per_token_s=3.5e-5,
        anchors=(Anchor("lmsys: all-decode round at 256 seq/GPU, ~2.2k KV each", 0.092, _uniform(8, 256, 0, 2200)),),
    )
    return _penalty_from_ratios(base)


def _mi355x_dp8_atom() -> CostPreset:
    """One 8x MI355X node (ROCm ATOM) with attention DP8: a short decode tick and the STEEPEST extend penalty.

    ATOM#930 reports a decode tick of ~8.5 ms and ~118 ms when one rank prefills about 1k tokens while
    seven decode: 13.9 ticks, the steepest ratio of the five presets. The tick's batch is not given; 16
    seq/GPU with 1k KV is assumed: 6.5 ms fixed + 16 x (40 us per sequence + 30 us experts + 20 us legs) +
    16k KV tokens x 1e-8 s = 8.1 ms.

    Extend slope: no MI355X figure is published in these sources; lmsys's ~7k prompt tokens/s/GPU is used
    unscaled (an assumption): 80 us attention and dense + 30 us experts + 20 us legs = 130 us per prompt
    token when every rank extends. The lone round is then 1024 x (80 + 20) us = 102.4 ms on the extending
    rank + (1024 + 7 x 16) / 8 x 30 us = 4.3 ms of experts + the fixed path: 118 - 102.4 - 4.3 = 11 ms of
    extend_fixed_s, a penalty of only 4.5 ms. At lmsys's slope ATOM#930's ~14 ticks are the lone prompt's
    own work on one rank rather than a fixed cost; batching wins either way, since it puts the ranks'
    prompts in one round. On this model's 8.1 ms tick the lone prompt costs 14.5 ticks (the steepest of the
    five); a 16k chunk on every rank takes 2.14 s (7.7k tokens/s/GPU).
    """
    return CostPreset(
        name="mi355x-dp8-atom",
        hardware="one node of 8x MI355X, attention DP8 with expert parallelism (ROCm ATOM)",
        model="DeepSeek-V4-class MoE as served in ROCm/ATOM#930",
        source=(
            "ROCm/ATOM#930 (as summarised in PEERS.md): a decode tick of ~8.5 ms, and ~118 ms when one rank "
            "prefills about 1k tokens while the seven others decode; the decode batch size of that tick is not "
            "given: assumed 16 seq/GPU with 1k KV; extend slope: lmsys.org 2025-05-05's ~7k prompt tokens/s "
            "per GPU, unscaled (no MI355X figure is published)"
        ),
        decode_fixed_s=0.0065,
        extend_fixed_s=0.011,
        attn_per_seq_s=4.0e-5,
        attn_per_kv_token_s=1.0e-8,
        prefill_per_token_s=8.0e-5,
        moe_per_token_s=3.0e-5,
        ll_per_token_s=2.0e-5,
        normal_per_token_s=2.0e-5,
        anchors=(
            Anchor("ATOM#930: decode tick", 0.0085, TICK_16),
            Anchor("ATOM#930: one rank prefills ~1k tokens, seven decode", 0.118, LONE_1K),
            _lmsys_anchor(),
        ),
    )


def _gb200_dp8_vllm() -> CostPreset:
    """DeepSeek-R1 (FP4) on 2x GB200 NVL (8 GPUs) with vLLM, attention DP8, EP and CUDA graphs: the MILDEST
    extend penalty of the five presets.

    vllm#44558, 1k-in/200-out Poisson at 24 req/s offered (22.4-22.6 served): the interval-2 run's P50 ITL
    (32.1 ms) is the cudagraph decode floor, at ~80 seq/GPU in flight by Little's law (22.6 / 8 x (0.50 s
    TTFT + 199 x 0.140 s TPOT)); the baseline (interval 1) run's P50 ITL of 274.9 ms is a round in which
    every rank extends a 1k prompt beside its decodes, at ~140 seq/GPU in flight (22.4 / 8 x (0.81 + 199 x
    0.2405) = 137; the "~80 seq/GPU" of the issue 11 version held only for the interval-2 run). Decode floor:
    22 ms fixed + 80 x (60 us per sequence + 40 us experts + 20 us legs) + 88k KV tokens x 1e-8 s = 32.5 ms.

    Extend slope: lmsys's ~7k prompt tokens/s/GPU (an H100 figure, unscaled: GB200's FP4 is not credited):
    80 us attention and dense + 40 us experts + 20 us legs. The baseline round then is 1024 x 80 us + 140
    sequences' attention and KV (9.9 ms) on the slowest rank, 1,164 x 40 us experts and 1,164 x 20 us legs:
    161.7 ms + extend_fixed_s; 274.9 ms puts extend_fixed_s at 113 ms (penalty 91 ms). A lone 1k prompt costs
    9.2 decode ticks: the mildest of the five. A 16k chunk on every rank: 2.41 s (6.8k tokens/s/GPU).
    """
    return CostPreset(
        name="gb200-dp8-vllm",
        hardware="2x GB200 NVL (4 GPUs each), attention DP8 with expert parallelism (vLLM, CUDA graphs)",
        model="DeepSeek-R1-0528 671B (FP4 weights, MLA, FP8 KV)",
        source=(
            "vllm#44558: 1k-in/200-out Poisson at 24 req/s on DP8/EP: the interval-2 run's P50 ITL is the ~32 ms "
            "cudagraph decode floor at ~80 seq/GPU (Little's law), the baseline run's P50 ITL of ~275 ms is every "
            "rank extending 1k beside ~140 seq/GPU (Little's law, an estimate, not a published figure); extend "
            "slope: lmsys.org 2025-05-05's ~7k prompt tokens/s per GPU, unscaled"
        ),
        decode_fixed_s=0.022,
        extend_fixed_s=0.113,
        attn_per_seq_s=6.0e-5,
        attn_per_kv_token_s=1.0e-8,
        prefill_per_token_s=8.0e-5,
        moe_per_token_s=4.0e-5,
        ll_per_token_s=2.0e-5,
        normal_per_token_s=2.0e-5,
        anchors=(
            Anchor("vllm#44558: decode floor at ~80 seq/GPU, ~1.1k KV (interval 2)", 0.032, FLOOR_80, rel_tol=0.2),
            Anchor(
                "vllm#44558: every rank extends 1k beside ~140 decodes (baseline P50 ITL)",
                0.275,
                MIXED_140,
                rel_tol=0.2,
            ),
            _lmsys_anchor(),
        ),
    )


# Each preset's derivation (its factory's docstring), by name: the arithmetic behind its coefficients.
DERIVATIONS: dict[str, str] = {}
for _make in (_h200_dp8_ep8, _h800_ep32_dsv3, _h100_ep72_dsv3, _mi355x_dp8_atom, _gb200_dp8_vllm):
    DERIVATIONS[register(_make()).name] = _make.__doc__ or ""

DEFAULT_PRESET = "h200-dp8-ep8"
# The presets whose lone 1k prompt costs the fewest and the most decode ticks (`lone_prompt_ratio`): the
# lab reports its headline under both, so a reader sees how much a conclusion depends on the cost model.
MILDEST_PRESET = "gb200-dp8-vllm"
STEEPEST_PRESET = "mi355x-dp8-atom"
