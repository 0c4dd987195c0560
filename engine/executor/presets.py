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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
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


# -- the presets -------------------------------------------------------------------------------------
#
# Shared derivations (DeepSeek-V3-class models, 58 MoE layers):
# - Low-latency legs: the DeepEP README gives dispatch + combine per layer at 128 tokens/GPU:
#   EP8 77 + 114 us, EP32 155 + 273 us (H800). Assumption: half of it is a latency floor (folded into
#   decode_fixed_s) and half grows with tokens, so per round ll_per_token_s = 58 * (191 us / 2) / 128.
# - Decode attention: MLA reads about 40 KB of FP8 KV per token per forward (61 layers); at H800's
#   3.35 TB/s that is about 1.2e-8 s per KV token, the figure used on Hopper below.


def _h200_dp8_ep8() -> CostPreset:
    """One 8x H200 node serving DeepSeek-V3/R1 with attention DP8 and DeepEP EP8 (the default).

    Decode: the DeepSeek profile's ~55 ms at 128 seq/GPU with ~5k KV each, borrowed unscaled from H800
    (an assumption: H200's extra bandwidth is not credited), split as 25 ms fixed + 5.6 ms legs
    + 10.2 ms per-sequence attention + 7.7 ms KV reads + 5.1 ms experts. Extend: sglang#35241's 16k-token
    per-rank chunk round of ~1.4 s gives ~82 us per prompt token in all (attention 30, experts 40,
    normal legs 12), i.e. ~12k tokens/s/GPU, above lmsys's 6-8k bracket for larger EP; the extend path's
    fixed 50 ms (eager launches, normal legs, leaving the graph) is a choice that makes one lone 1k
    prompt cost the group ~2.7 decode rounds.
    """
    return CostPreset(
        name="h200-dp8-ep8",
        hardware="one node of 8x H200 (NVLink), attention DP8, DeepEP EP8 intranode",
        model="DeepSeek-V3/R1 671B (FP8 weights, MLA, FP8 KV)",
        source=(
            "DeepEP README: EP8 low-latency dispatch+combine 77+114 us/layer at 128 tokens/GPU (H800); "
            "DeepSeek inference profile: decode step ~55 ms at 128 seq/GPU, average KV ~5k tokens (H800 EP128, "
            "shape borrowed unscaled); sglang#35241: a 16k-token/rank chunk round ~1.4 s on one 8-GPU DP8 node; "
            "lmsys.org 2025-05-05: 6-8k prompt tokens/s per GPU (bracket for the extend slope)"
        ),
        decode_fixed_s=0.025,
        extend_fixed_s=0.050,
        attn_per_seq_s=8.0e-5,
        attn_per_kv_token_s=1.2e-8,
        prefill_per_token_s=3.0e-5,
        moe_per_token_s=4.0e-5,
        ll_per_token_s=DSV3_MOE_LAYERS * 95.5e-6 / 128,
        normal_per_token_s=1.2e-5,
        anchors=(
            Anchor("DeepSeek profile: all-decode round at 128 seq/GPU, ~5k KV each", 0.055, _uniform(8, 128, 0, 4989)),
            Anchor("sglang#35241: every rank extends a 16k-token chunk", 1.4, _uniform(8, 0, 16384)),
        ),
    )


def _h800_ep32_dsv3() -> CostPreset:
    """Four 8x H800 nodes serving DeepSeek-V3/R1 with attention DP32 and DeepEP EP32 over InfiniBand.

    Decode: the DeepSeek profile's ~55 ms at 128 seq/GPU, with the EP32 legs (155+273 us/layer) in
    place of EP8's. Extend: lmsys's ~7k prompt tokens/s per GPU with large EP, so a 16k-token round
    takes ~2.3 s; the slower internode normal legs take a larger share of it (40 us/token) and of the
    extend path's fixed cost (60 ms).
    """
    return CostPreset(
        name="h800-ep32-dsv3",
        hardware="4 nodes of 8x H800 (InfiniBand), attention DP32, DeepEP EP32 internode",
        model="DeepSeek-V3/R1 671B (FP8 weights, MLA, FP8 KV)",
        source=(
            "DeepEP README: EP32 low-latency dispatch+combine 155+273 us/layer at 128 tokens/GPU (H800); "
            "DeepSeek inference profile: decode step ~55 ms at 128 seq/GPU, average KV ~5k tokens; "
            "lmsys.org 2025-05-05: about 7k prompt tokens/s per GPU with large EP"
        ),
        decode_fixed_s=0.020,
        extend_fixed_s=0.060,
        attn_per_seq_s=6.0e-5,
        attn_per_kv_token_s=1.2e-8,
        prefill_per_token_s=5.0e-5,
        moe_per_token_s=5.0e-5,
        ll_per_token_s=DSV3_MOE_LAYERS * 214e-6 / 128,
        normal_per_token_s=4.0e-5,
        anchors=(
            Anchor("DeepSeek profile: all-decode round at 128 seq/GPU, ~5k KV each", 0.055, _uniform(8, 128, 0, 4989)),
            Anchor("lmsys: ~7k prompt tokens/s/GPU, every rank extends 16k", 16384 / 7000, _uniform(8, 0, 16384)),
        ),
    )


def _h100_ep72_dsv3() -> CostPreset:
    """The lmsys large-scale EP deployment: DeepSeek-V3 decode on 9 nodes of 8x H100 with EP72.

    Decode: ~92 ms per step at 256 seq/GPU with 2k-token inputs (KV ~2.2k by mid-output); the heavier
    per-sequence cost (130 us) reflects H100's lower bandwidth at twice DeepSeek's batch. Legs: DeepEP's
    EP32 figure is the nearest published one, halved per token for the larger batch. Extend: ~7k prompt
    tokens/s per GPU, as measured on the prefill side of the same deployment.
    """
    return CostPreset(
        name="h100-ep72-dsv3",
        hardware="9 nodes of 8x H100 (InfiniBand), decode with attention DP and DeepEP EP72",
        model="DeepSeek-V3 671B (FP8 weights, MLA)",
        source=(
            "lmsys.org 2025-05-05 large-scale EP: decode ~92 ms per step at 256 seq/GPU (EP72, 2k-token inputs), "
            "about 6-8k prompt tokens/s per GPU on the prefill side; DeepEP README EP32 legs as the nearest "
            "published low-latency figure (155+273 us/layer at 128 tokens/GPU)"
        ),
        decode_fixed_s=0.022,
        extend_fixed_s=0.065,
        attn_per_seq_s=1.3e-4,
        attn_per_kv_token_s=1.7e-8,
        prefill_per_token_s=5.5e-5,
        moe_per_token_s=5.0e-5,
        ll_per_token_s=DSV3_MOE_LAYERS * 214e-6 / 128 / 2,
        normal_per_token_s=4.0e-5,
        anchors=(
            Anchor("lmsys: all-decode round at 256 seq/GPU, ~2.2k KV each", 0.092, _uniform(8, 256, 0, 2200)),
            Anchor("lmsys: ~7k prompt tokens/s/GPU, every rank extends 16k", 16384 / 7000, _uniform(8, 0, 16384)),
        ),
    )


def _mi355x_dp8_atom() -> CostPreset:
    """One 8x MI355X node (ROCm ATOM) with attention DP8: a short decode tick and a costly extend path.

    ATOM#930 reports a decode tick of ~8.5 ms and ~118 ms when one rank prefills about 1k tokens while
    seven decode: the extend path costs the group ~14 ticks, whoever extends. The tick's batch is not
    given; 16 seq/GPU with 1k KV is assumed. Most of the 118 ms is the extend path's fixed cost (80 ms);
    the 1k prompt's own attention and experts add the rest.
    """
    return CostPreset(
        name="mi355x-dp8-atom",
        hardware="one node of 8x MI355X, attention DP8 with expert parallelism (ROCm ATOM)",
        model="DeepSeek-V4-class MoE as served in ROCm/ATOM#930",
        source=(
            "ROCm/ATOM#930 (as summarised in PEERS.md): a decode tick of ~8.5 ms, and ~118 ms when one rank "
            "prefills about 1k tokens while the seven others decode; the decode batch size of that tick is not "
            "given: assumed 16 seq/GPU with 1k KV"
        ),
        decode_fixed_s=0.0065,
        extend_fixed_s=0.080,
        attn_per_seq_s=4.0e-5,
        attn_per_kv_token_s=1.0e-8,
        prefill_per_token_s=2.5e-5,
        moe_per_token_s=3.0e-5,
        ll_per_token_s=2.0e-5,
        normal_per_token_s=1.0e-5,
        anchors=(
            Anchor("ATOM#930: decode tick", 0.0085, _uniform(8, 16, 0, 1000)),
            Anchor("ATOM#930: one rank prefills ~1k tokens, seven decode", 0.118, _one_extends(8, 16, 1000, 1024)),
        ),
    )


def _gb200_dp8_vllm() -> CostPreset:
    """DeepSeek-R1 (FP4) on 2x GB200 NVL (8 GPUs) with vLLM, attention DP8, EP and CUDA graphs.

    vllm#44558: at 24 req/s of 1k-in/200-out, decode alone runs at the ~32 ms cudagraph floor, and with
    1k-token prefills interleaved (vLLM mixes them into the decode batch) P50 ITL is ~275 ms: nearly
    every round then carries a prompt on every rank. ~80 seq/GPU in flight is an estimate from the load
    (Little's law), not a published figure. The 120 ms fixed extend cost is the eager, non-graph path.
    """
    return CostPreset(
        name="gb200-dp8-vllm",
        hardware="2x GB200 NVL (4 GPUs each), attention DP8 with expert parallelism (vLLM, CUDA graphs)",
        model="DeepSeek-R1-0528 671B (FP4 weights, MLA, FP8 KV)",
        source=(
            "vllm#44558: 1k-in/200-out Poisson at 24 req/s on DP8/EP: the cudagraph decode floor is ~32 ms, and "
            "with 1k-token prefills interleaved every round P50 ITL is ~275 ms; the ~80 seq/GPU in flight follow "
            "from that load by Little's law (an estimate, not a published figure)"
        ),
        decode_fixed_s=0.022,
        extend_fixed_s=0.120,
        attn_per_seq_s=6.0e-5,
        attn_per_kv_token_s=1.0e-8,
        prefill_per_token_s=8.0e-5,
        moe_per_token_s=4.0e-5,
        ll_per_token_s=2.0e-5,
        normal_per_token_s=2.0e-5,
        anchors=(
            Anchor("vllm#44558: decode floor at ~80 seq/GPU, ~1.1k KV", 0.032, _uniform(8, 80, 0, 1100), rel_tol=0.2),
            Anchor(
                "vllm#44558: every rank extends a 1k prompt beside its decodes (P50 ITL)",
                0.275,
                tuple(RankWork(80, 1024, 80 * 1100) for _ in range(8)),
                rel_tol=0.2,
            ),
        ),
    )


for _make in (_h200_dp8_ep8, _h800_ep32_dsv3, _h100_ep72_dsv3, _mi355x_dp8_atom, _gb200_dp8_vllm):
    register(_make())

DEFAULT_PRESET = "h200-dp8-ep8"
