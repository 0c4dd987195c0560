"""The lab's named scenarios (PEERS.md, "Scenarios"): seeded workload SHAPES plus the server arguments they need.

Every scenario runs an 8-rank attention-DP group on the simulator. A scenario is a shape (lengths, routing,
burstiness) whose load is a parameter: the arrival rate in requests per second for the open-loop shapes, the
number of clients for a closed loop. The capacity lab (`lab.capacity`) bisects that load; the fixed-load
lab runs each shape at its nominal `load`.

`scenario(name, seed, scale)` gives a `Scenario`; its `server_args()` and `workload(load, until)` build fresh
objects for one run. A fixed-load run lasts `duration_s` virtual seconds, so every policy is offered the same
requests (`rounds` is a safety cap); a capacity run issues arrivals for `warmup_s + window_s` seconds and
measures only the window (requests arriving after the warm-up, rounds after it). `scale` stretches every
duration without changing the load, so a test can run a scenario at scale 0.05 and see the same regime.

The same seed gives the same requests at every load: arrivals come from one exponential stream scaled by the
rate, lengths and routing from their own streams, so a run at a higher rate is the same requests sooner (the
capacity search compares like with like). Warm-ups are about the time a request's decode takes at the
nominal load (the decode population is then in steady state); windows hold a few thousand requests near the
capacity of the default preset. Page size 64 is FlashMLA's and keeps decode growth events cheap to simulate.
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
    LengthDist,
    LogNormal,
    Normal,
    OnOff,
    OutputRatio,
    Poisson,
    RoundRobin,
    Router,
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

RATE = "req/s"
CLIENTS = "clients"

ROUND_ROBIN = RoundRobin()

# (seed, load, until) -> a fresh workload whose arrivals stop at `until` (None: never).
Builder = Callable[[int, float, float | None], Workload]


@dataclass(frozen=True)
class Scenario:
    """One named, seeded scenario at one scale."""

    name: str
    what: str
    tests: str
    source: str
    seed: int
    scale: float
    load: float
    load_unit: str
    duration_s: float
    rounds: int
    warmup_s: float
    window_s: float
    mean_output: float
    overrides: Mapping[str, Any]
    build: Builder = field(repr=False)

    @property
    def open_loop(self) -> bool:
        """Whether the load is an arrival rate (else a number of closed-loop clients)."""
        return self.load_unit == RATE

    def server_args(self, **changes: Any) -> ServerArgs:
        """Fresh ServerArgs for this scenario; `changes` (e.g. gate intervals, a preset) win over it."""
        return ServerArgs(**{**BASE_ARGS, **self.overrides, "seed": self.seed, **changes})

    def workload(self, load: float | None = None, until: float | None = None) -> Workload:
        """A fresh workload of this scenario's seed at `load` (default: the nominal load); arrivals stop at
        `until` (same seed, same requests)."""
        value = self.load if load is None else load
        if not value > 0:
            raise ValueError(f"scenario {self.name}: load must be > 0, got {value}")
        return self.build(self.seed, value, until)


@dataclass(frozen=True)
class _Def:
    what: str
    tests: str
    source: str
    load: float
    duration_s: float
    warmup_s: float
    window_s: float
    mean_output: float
    overrides: Mapping[str, Any]
    build: Builder
    load_unit: str = RATE


def _poisson(prompt: LengthDist, output: LengthDist, router: Router = ROUND_ROBIN, **kwargs: Any) -> Builder:
    """An open-loop Poisson shape: `load` is the arrival rate."""

    def build(seed: int, load: float, until: float | None) -> Workload:
        return Workload(
            Poisson(load),
            dp_size=DP_SIZE,
            prompt=prompt,
            output=output,
            router=router,
            seed=seed,
            until=until,
            **kwargs,
        )

    return build


# Bursts: every BURST_PERIOD_S seconds a burst lasting BURST_ON_S, sized so the mean rate is the load.
BURST_PERIOD_S = 3.0
BURST_ON_S = 0.1


def _bursty(seed: int, load: float, until: float | None) -> Workload:
    """On/off bursts whose mean rate is `load`: a burst of ~3*load requests (Poisson at load*30/s while on)
    every 3 s, ISL 1k, OSL 256; a burst lands while the previous one still decodes."""
    on_rate = load * BURST_PERIOD_S / BURST_ON_S
    arrivals = OnOff(rate=on_rate, on_s=BURST_ON_S, off_s=BURST_PERIOD_S - BURST_ON_S)
    return Workload(arrivals, dp_size=DP_SIZE, output=Fixed(256), seed=seed, until=until)


LONG_ISL = 60_000
LONG_BUDGET = 8192


def long_chunked_offset_workload(
    seed: int, load: float = 16.0, until: float | None = None, offset: bool = True
) -> Workload:
    """Closed loop of `load` clients, ISL 60k, OSL 1, with non-sticky routing (each new prompt goes to the
    next rank in turn, so a rank's queue can run dry); with `offset`, rank 1's first prompts are one chunk
    shorter, so rank 1 starts a whole chunk out of phase with its peers (sglang#35241's divergence).
    `offset=False` is the healthy twin."""
    clients = max(1, round(load))
    shorter = LONG_ISL - LONG_BUDGET
    # The first prompts go round-robin in client order: clients s, s + 8, ... land on rank s.
    firsts = {client: shorter for client in range(1, clients, DP_SIZE)} if offset else {}
    loop = ClosedLoop(clients, first_prompt_lens=firsts)
    return Workload(
        loop,
        dp_size=DP_SIZE,
        prompt=Fixed(LONG_ISL),
        output=Fixed(1),
        sticky_sessions=False,
        seed=seed,
        until=until,
    )


def _long_chunked_offset(seed: int, load: float, until: float | None) -> Workload:
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
    stays as the control that a one-chunk stagger alone changes nothing here. The capacity lab's full run
    (bench/results/lab.md) does separate one policy on it, the other way round from sglang#35241: the
    delayer holding on NONE (`allow_on_none=0`, 30 passes) fills 7.0 of 8 ranks per extend round against
    5.0 for every other policy, and holds 0.70 req/s under the TTFT bound where they hold 0.50.
    """
    return long_chunked_offset_workload(seed, load, until)


_DEFS: dict[str, _Def] = {
    "scattered": _Def(
        "Poisson arrivals, round-robin, ISL 1k, OSL 256, steady decode background",
        "the seed's core case: lone small prefills",
        "sglang#23588, ROCm/ATOM#930",
        16.0,
        600.0,
        20.0,
        60.0,
        256,
        {},
        _poisson(Fixed(1024), Fixed(256)),
    ),
    "bursty": _Def(
        "on/off bursts: ~3 s of requests land within 0.1 s, every 3 s, ISL 1k, OSL 256",
        "a burst drains in consecutive prefill rounds (R3)",
        "seed section 1",
        16.0,
        400.0,
        21.0,
        60.0,
        256,
        {},
        _bursty,
    ),
    "osl-variance": _Def(
        "Poisson arrivals, ISL 1000, OSL uniform in [800, 1000] (output length ratio 0.8)",
        "fragmentation of prefill across ranks: finishes drift apart, prompts arrive one rank at a time",
        "sglang#23189",
        8.0,
        400.0,
        40.0,
        60.0,
        900,
        {},
        _poisson(Fixed(1000), OutputRatio(1000, 0.8)),
    ),
    "skewed": _Def(
        "Poisson arrivals, ISL 1k, OSL 256; rank 0 gets 4x the traffic of each other rank (4/11 of it)",
        "ANY cadence governs peers (P4): the busy rank sets the pace",
        "seed section 2",
        12.0,
        600.0,
        20.0,
        60.0,
        256,
        {},
        _poisson(Fixed(1024), Fixed(256), Skewed(weight=4.0, rank=0)),
    ),
    "kv-pressure": _Def(
        "Poisson arrivals with long, spread outputs on small pools (1024 pages of 64 tokens per rank); rank 0 "
        "gets 1.5x its peers' traffic and runs near the 0.9 watermark",
        "watermark, retraction, blocker rules",
        "sglang#31835",
        2.4,
        600.0,
        60.0,
        90.0,
        1600,
        {"kv_pages": 1024, "max_num_seqs": 64 * DP_SIZE},
        _poisson(
            LogNormal(1024, 0.5, low=128, high=4096),
            LogNormal(1500, 0.6, low=256, high=6000),
            Skewed(weight=1.5, rank=0),
        ),
    ),
    "long-chunked": _Def(
        "Poisson arrivals, ISL 60k, OSL 1, budget 8192/rank: every prompt is 8 chunks, nothing decodes",
        "that no policy costs capacity where no rank decodes (every hold protects nothing)",
        "sglang#35241",
        1.0,
        1000.0,
        20.0,
        120.0,
        1,
        {"chunked_prefill_size": LONG_BUDGET},
        _poisson(Fixed(LONG_ISL), Fixed(1)),
    ),
    "long-chunked-offset": _Def(
        "closed loop, ISL 60k, OSL 1, non-sticky routing, rank 1 a chunk out of phase from the start; the load "
        "is the clients",
        "a control: sglang#35241's loop cannot appear on one gather per round (see its builder), so a "
        "one-chunk stagger should change nothing",
        "sglang#35241",
        16.0,
        1000.0,
        20.0,
        120.0,
        1,
        {"chunked_prefill_size": LONG_BUDGET},
        _long_chunked_offset,
        CLIENTS,
    ),
    "long-chunked-decode": _Def(
        "Poisson arrivals, ISL 60k, OSL 256: chunks of the next prompts run beside decoding requests",
        "whether holding chunks on decoding ranks leaves ranks out of phase (the feedback loop with decode)",
        "sglang#35241",
        1.0,
        1000.0,
        30.0,
        120.0,
        256,
        {"chunked_prefill_size": LONG_BUDGET},
        _poisson(Fixed(LONG_ISL), Fixed(256)),
    ),
    "long-osl": _Def(
        "Poisson arrivals, ISL ~800, OSL ~3600: a deep decode population",
        "steady-state balance ratio",
        "TensorRT-LLM ADP blog",
        4.0,
        500.0,
        150.0,
        90.0,
        3600,
        {"kv_pages": 8192},
        _poisson(Normal(800, 100, low=256, high=2048), Normal(3600, 400, low=1024, high=8192)),
    ),
    "low-load": _Def(
        "Poisson arrivals, ISL 1k, OSL 128, nominally 1 req/s: mostly one request in flight",
        "no policy should cost TTFT for nothing (the low end of the TTFT frontier)",
        "-",
        1.0,
        600.0,
        10.0,
        60.0,
        128,
        {},
        _poisson(Fixed(1024), Fixed(128)),
    ),
}

# A fixed-load run's round cap per unit of scale: far above what 600 virtual seconds take at any round time
# the presets give (>= 25 ms when busy), so only a policy that spins idle could reach it.
ROUND_CAP = 60_000

# The eight scenarios of PEERS.md; `long-chunked-offset` and `long-chunked-decode` are long-chunked's variants.
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
    """The scenario `name` with `seed`, its run lengths scaled by `scale`; ValueError lists the names."""
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
        load=definition.load,
        load_unit=definition.load_unit,
        duration_s=definition.duration_s * scale,
        rounds=max(1, round(ROUND_CAP * scale)),
        warmup_s=definition.warmup_s * scale,
        window_s=definition.window_s * scale,
        mean_output=definition.mean_output,
        overrides=MappingProxyType(dict(definition.overrides)),
        build=definition.build,
    )
