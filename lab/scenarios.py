"""The lab's named scenarios (PEERS.md, "Scenarios"): seeded workloads plus the server arguments they need.

Every scenario runs an 8-rank attention-DP group on the simulator. `scenario(name, seed, scale)` gives
a `Scenario`; its `server_args()` and `workload()` build fresh objects for one run. A lab run lasts
`duration_s` virtual seconds, so every policy is offered the same requests; `rounds` is a safety cap
well above what any sane policy needs for that time. `scale` stretches both without changing the load,
so a test can run a scenario at scale 0.05 and see the same regime, only shorter.

Default lengths are sized so the whole lab (every scenario x 8 policies) fits in a few minutes on a
2-core machine (each run takes 0.5-4 s at about 5-7k rounds/s); the rates are chosen on the default
preset (h200-dp8-ep8) to sit in the regime each scenario is about, which the docstring of each builder
names. Page size 64 is FlashMLA's and keeps decode growth events (one per page) cheap to simulate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from engine.config import ServerArgs
from workloads import (
    ClosedLoop,
    Fixed,
    LogNormal,
    Normal,
    OnOff,
    OutputRatio,
    Poisson,
    RoundRobin,
    Skewed,
    Workload,
)

DP_SIZE = 8

# What every scenario runs on; a scenario's own overrides win.
BASE_ARGS: Mapping[str, Any] = MappingProxyType(
    {
        "executor": "sim",
        "dp_size": DP_SIZE,
        "enable_dp_attention": True,
        "max_num_seqs": 128 * DP_SIZE,
        "chunked_prefill_size": 8192,
        "page_size": 64,
        "kv_pages": 4096,
    }
)


@dataclass(frozen=True)
class Scenario:
    """One named, seeded scenario at one scale."""

    name: str
    what: str
    tests: str
    source: str
    seed: int
    scale: float
    duration_s: float
    rounds: int
    overrides: Mapping[str, Any]
    build: Callable[[int], Workload] = field(repr=False)

    def server_args(self, **changes: Any) -> ServerArgs:
        """Fresh ServerArgs for this scenario; `changes` (e.g. gate intervals, a preset) win over it."""
        return ServerArgs(**{**BASE_ARGS, **self.overrides, "seed": self.seed, **changes})

    def workload(self) -> Workload:
        """A fresh workload of this scenario's seed (same seed, same requests)."""
        return self.build(self.seed)


@dataclass(frozen=True)
class _Def:
    what: str
    tests: str
    source: str
    duration_s: float
    overrides: Mapping[str, Any]
    build: Callable[[int], Workload]


def _scattered(seed: int) -> Workload:
    """Poisson 16 req/s over 8 ranks, ISL 1k, OSL 256: ~2 req/s/rank keeps a steady decode background
    (tens of requests per rank) while prompts arrive alone, a few per second per rank."""
    return Workload(Poisson(16.0), dp_size=DP_SIZE, prompt=Fixed(1024), output=Fixed(256), seed=seed)


def _bursty(seed: int) -> Workload:
    """Bursts of ~200 requests within 0.1 s every ~6 s (Poisson at 2000/s while on), ISL 1k, OSL 256:
    ~25 prompts per rank, three to four rounds of the 8192-token budget, land while the previous
    burst still decodes."""
    return Workload(OnOff(rate=2000.0, on_s=0.1, off_s=6.0), dp_size=DP_SIZE, output=Fixed(256), seed=seed)


def _osl_variance(seed: int) -> Workload:
    """Closed loop of 256 clients, ISL 1000, OSL uniform in [800, 1000]: finishes drift apart, so
    replacement prompts arrive one rank at a time."""
    return Workload(
        ClosedLoop(256),
        dp_size=DP_SIZE,
        prompt=Fixed(1000),
        output=OutputRatio(1000, 0.8),
        sticky_sessions=False,
        seed=seed,
    )


def _skewed(seed: int) -> Workload:
    """Poisson 12 req/s; rank 0 gets 4x the traffic of each other rank (4/11 of it)."""
    return Workload(Poisson(12.0), dp_size=DP_SIZE, router=Skewed(weight=4.0, rank=0), seed=seed)


def _kv_pressure(seed: int) -> Workload:
    """Poisson 2.4 req/s with long, spread outputs on small pools (1024 pages of 64 tokens per rank):
    rank 0 gets 1.5x its peers' traffic and spends about half the run above the 0.9 watermark, its peers
    average 0.5-0.65 with occasional excursions above it."""
    return Workload(
        Poisson(2.4),
        dp_size=DP_SIZE,
        prompt=LogNormal(1024, 0.5, low=128, high=4096),
        output=LogNormal(1500, 0.6, low=256, high=6000),
        router=Skewed(weight=1.5, rank=0),
        seed=seed,
    )


LONG_ISL = 60_000
LONG_BUDGET = 8192


def _long_chunked(seed: int) -> Workload:
    """Closed loop of 16 clients (2 per rank, sticky), ISL 60k, OSL 1: every prompt is 8 chunks of 8192."""
    return Workload(ClosedLoop(16), dp_size=DP_SIZE, prompt=Fixed(LONG_ISL), output=Fixed(1), seed=seed)


def long_chunked_offset_workload(seed: int, offset: bool = True) -> Workload:
    """long-chunked with non-sticky routing (each new prompt goes to the next rank in turn, so a rank's
    queue can run dry) and, with `offset`, rank 1's first two prompts one chunk shorter: rank 1 starts a
    whole chunk out of phase with its peers (sglang#35241's divergence). `offset=False` is the healthy twin.
    """
    shorter = {1: LONG_ISL - LONG_BUDGET, 1 + DP_SIZE: LONG_ISL - LONG_BUDGET} if offset else {}
    # The first 16 prompts go round-robin in client order: clients s and s + 8 land on rank s.
    loop = ClosedLoop(16, first_prompt_lens=shorter)
    return Workload(loop, dp_size=DP_SIZE, prompt=Fixed(LONG_ISL), output=Fixed(1), sticky_sessions=False, seed=seed)


def _long_chunked_offset(seed: int) -> Workload:
    """sglang#35241's ranks a chunk out of phase: a control, because the simulator cannot show its loop.

    The report (DeepSeek-V4-Pro, DP8 with DP attention, 16k effective chunks, ~60k-token prompts, the
    PrefillDelayer on): runs that start with ranks a whole chunk apart stay apart and reach 0.65-0.83x of
    the healthy input throughput. The ingredients it names are here (per-rank queues that can run dry,
    non-sticky routing, long prompts in whole chunks) except a prefill attention cost that grows with the
    context, and the loop still cannot appear, for three reasons:

    1. SGLang negotiates on the flags of the pass it is scheduling: a rank whose last chunk leaves part of
       the budget free is prefillable in that very pass, so the ranks that finish a chunk later start their
       next prompt with a partial chunk and stay staggered, and the rank ahead sits out MIXED passes. Our
       engine has one all-gather per round, after the plan (R2): `sglang-delayer` decides on the previous
       round's rows, where a rank with a resident chunk is never prefillable. After one held round every
       rank is prefillable at once (ALL) and the group re-aligns on the first cycle.
    2. With two closed-loop clients per rank and 60k-token prompts every rank always has a full budget of
       prompt tokens, so for every other policy a stagger costs nothing: each rank extends 8192 tokens every
       round whichever prompt they belong to.
    3. The cost model has no context term. sglang#35241's own figures bound it for its model: a 16k chunk
       every p50 1.397 s, p95 1.535 s, across offsets 0 to 48k (V4-Pro's sparse attention), so a one-chunk
       stagger could cost a round at most ~10%, not 17-35%.

    Measured (SIMULATED, default preset, 300 virtual seconds, bench/results/peer_fidelity.md): offset over
    healthy input throughput 0.999 for sglang-delayer (1.000 with `allow_on_none`), 1.000 for ungated and
    gate; with 8, 12 or 24 clients instead of 16 at most 5% apart (ungated, 8 clients: 0.948). The scenario
    stays as the control that a one-chunk stagger alone changes nothing here.
    """
    return long_chunked_offset_workload(seed)


def _long_chunked_decode(seed: int) -> Workload:
    """long-chunked-offset with OSL 256: finished prompts decode beside the next chunks, so a rank with
    decode work is where a policy can hold chunks and let ranks drift out of phase."""
    shorter = LONG_ISL - LONG_BUDGET
    loop = ClosedLoop(16, first_prompt_lens={1: shorter, 1 + DP_SIZE: shorter})
    return Workload(loop, dp_size=DP_SIZE, prompt=Fixed(LONG_ISL), output=Fixed(256), seed=seed)


def _long_osl(seed: int) -> Workload:
    """Closed loop of 768 clients (96 per rank, slots left free), ISL ~800, OSL ~3600, first requests
    ramped over 60 s so finishes, and so prompts, spread out."""
    return Workload(
        ClosedLoop(768, ramp_s=60.0),
        dp_size=DP_SIZE,
        prompt=Normal(800, 100, low=256, high=2048),
        output=Normal(3600, 400, low=1024, high=8192),
        seed=seed,
    )


def _low_load(seed: int) -> Workload:
    """Poisson 1 req/s, ISL 1k, OSL 128: mostly one request in flight at a time."""
    return Workload(Poisson(1.0), dp_size=DP_SIZE, output=Fixed(128), router=RoundRobin(), seed=seed)


_DEFS: dict[str, _Def] = {
    "scattered": _Def(
        "Poisson arrivals, round-robin, ISL 1k, OSL 256, steady decode background",
        "the seed's core case: lone small prefills",
        "sglang#23588, ROCm/ATOM#930",
        600.0,
        {},
        _scattered,
    ),
    "bursty": _Def(
        "on/off bursts of ~200 requests every ~6 s",
        "a burst drains in consecutive prefill rounds (R3)",
        "seed section 1",
        400.0,
        {},
        _bursty,
    ),
    "osl-variance": _Def(
        "ISL=OSL=1000, output length ratio 0.8, concurrency 256",
        "fragmentation of prefill across ranks",
        "sglang#23189",
        400.0,
        {},
        _osl_variance,
    ),
    "skewed": _Def(
        "one rank gets 4x the traffic",
        "ANY cadence governs peers (P4)",
        "seed section 2",
        600.0,
        {},
        _skewed,
    ),
    "kv-pressure": _Def(
        "long outputs fill the pool past 0.9 on some ranks",
        "watermark, retraction, blocker rules",
        "sglang#31835",
        600.0,
        {"kv_pages": 1024, "max_num_seqs": 64 * DP_SIZE},
        _kv_pressure,
    ),
    "long-chunked": _Def(
        "ISL 60k, OSL 1, concurrency 16, budget 8192/rank",
        "the mixed-state feedback loop",
        "sglang#35241",
        1000.0,
        {"chunked_prefill_size": LONG_BUDGET},
        _long_chunked,
    ),
    "long-chunked-offset": _Def(
        "long-chunked with non-sticky routing and rank 1 a chunk out of phase from the start",
        "a control: sglang#35241's loop cannot appear on one gather per round (see its builder), so a "
        "one-chunk stagger should change nothing",
        "sglang#35241",
        1000.0,
        {"chunked_prefill_size": LONG_BUDGET},
        _long_chunked_offset,
    ),
    "long-chunked-decode": _Def(
        "long-chunked-offset with OSL 256: chunks of the next prompts run beside decoding requests",
        "whether holding chunks on decoding ranks leaves ranks out of phase (the feedback loop with decode)",
        "sglang#35241",
        1000.0,
        {"chunked_prefill_size": LONG_BUDGET},
        _long_chunked_decode,
    ),
    "long-osl": _Def(
        "ISL ~800, OSL ~3600, concurrency 768",
        "steady-state balance ratio",
        "TensorRT-LLM ADP blog",
        500.0,
        {"kv_pages": 8192},
        _long_osl,
    ),
    "low-load": _Def(
        "well below saturation: Poisson 1 req/s",
        "no policy should cost TTFT for nothing",
        "-",
        600.0,
        {},
        _low_load,
    ),
}

# A lab run's round cap per unit of scale: far above what 600 virtual seconds take at any round time the
# presets give (>= 25 ms when busy), so only a policy that spins idle could reach it.
ROUND_CAP = 60_000

# The eight scenarios of PEERS.md; `long-chunked-offset` is long-chunked's variant.
LAB_SCENARIOS: tuple[str, ...] = (
    "scattered",
    "bursty",
    "osl-variance",
    "skewed",
    "kv-pressure",
    "long-chunked",
    "long-osl",
    "low-load",
)


def scenario_names() -> tuple[str, ...]:
    """Every scenario name, variants included, in lab order."""
    return tuple(_DEFS)


def scenario(name: str, seed: int = 0, scale: float = 1.0) -> Scenario:
    """The scenario `name` with `seed`, its run length scaled by `scale`; ValueError lists the names."""
    definition = _DEFS.get(name)
    if definition is None:
        raise ValueError(f"unknown scenario {name!r}; known scenarios: {', '.join(_DEFS)}")
    if not scale > 0:
        raise ValueError(f"scenario scale must be > 0, got {scale}")
    return Scenario(
        name=name,
        what=definition.what,
        tests=definition.tests,
        source=definition.source,
        seed=seed,
        scale=scale,
        duration_s=definition.duration_s * scale,
        rounds=max(1, round(ROUND_CAP * scale)),
        overrides=MappingProxyType(dict(definition.overrides)),
        build=definition.build,
    )
