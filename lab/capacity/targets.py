"""What the capacity lab measures: a scenario shape (load = arrival rate, or clients of a closed loop) or a
window of a production trace (load = replay speed). One `Target` is one row of the capacity table.

A `TargetSpec` names a target with plain values, so a worker process can rebuild it (`target_of`). A target
gives fresh server arguments, a fresh workload at a load, and the probe `Plan` at that load: when arrivals
stop, where the measured window starts, and the most requests and decode tokens the window can hold (for the
early exit). Durations shrink with `--quick` (`QUICK_SCALE` of a scenario's; a shorter trace window).

Traces: the window is `TRACE_WINDOW_S` of the trace's own clock after `TRACE_WARMUP_S` of warm-up, from
`TRACE_START_S` (minute 10: past the trace's first minutes, whose requests were already queued when recording
began), replayed `speed` times faster. A quick run measures `QUICK_TRACE_WINDOW_S` after `QUICK_TRACE_WARMUP_S`,
and so does a full run on a trace whose full replay offers more than `TRACE_MAX_PROMPT_TOKENS`: a probe
simulates the replay at the speed the group holds, which on the default preset is a few thousand prompt tokens
per second whatever the trace, so the simulated time (and the probe's cost) grows with the replay's prompt
tokens. Azure's 110 s offer ~0.7M (its full window stays); Mooncake's offer 4.6M (12k-token prompts, up to
121k), so one probe of them simulates about an hour, and its row alone took 5,853 CPU seconds of an
unfinished full run; its quick window offers 1.75M. The full run must fit its budget of 45 minutes on two
cores. Requests are routed by the prefix-affinity router (Mooncake's prefix blocks are reused on the rank that
holds them, as SGLang's cache-aware router does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path

from engine.config import ServerArgs
from lab.capacity.probe import Plan
from lab.scenarios import BASE_ARGS, DP_SIZE, Scenario, scenario, scenario_names
from workloads import Workload

QUICK_SCALE = 0.3
TRACE_START_S = 600.0
TRACE_WINDOW_S = 90.0
TRACE_WARMUP_S = 20.0
QUICK_TRACE_WINDOW_S = 30.0
QUICK_TRACE_WARMUP_S = 10.0
# A full run's trace replay offering more prompt tokens than this uses the quick window (module docstring).
TRACE_MAX_PROMPT_TOKENS = 2_000_000
TRACE_ROUTER = "prefix-affinity"
# ~40 GB of FP8 MLA KV at ~40 KB per token (the figure engine/executor/presets.py uses): 1M tokens per rank.
TRACE_KV_TOKENS = 1 << 20
# A trace search starts at the speed that offers this many prompt tokens per second: what the QUICK runs found
# the default preset's group holds on both traces within a factor of four (Azure about 2.5k prompt
# tokens/s at its capacity, Mooncake about 1.5k), so the search starts near the answer.
TRACE_START_TOKENS_S = 5_000.0
# Where a search starts, and how far it may go, relative to a target's nominal load.
SEARCH_DOWN = 64.0
SEARCH_UP = 32.0


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A target by name (`kind` "scenario") or by trace file (`kind` "trace"); picklable."""

    kind: str
    name: str
    seed: int = 0
    quick: bool = False

    @property
    def label(self) -> str:
        """The row label: the scenario's name or the trace file's stem."""
        return self.name if self.kind == "scenario" else Path(self.name).stem


@dataclass(frozen=True)
class Target:
    """One capacity row (module docstring): how to build a workload at a load, the probe plan there, and the
    requests per second that load offers (None: a closed loop, where the policy's pace decides)."""

    spec: TargetSpec
    what: str
    load_unit: str  # "req/s", "clients" or "x speed"
    nominal: float
    mean_output: float
    base_args: ServerArgs
    build: Callable[[float, float], Workload] = field(repr=False)  # (load, arrival end) -> workload
    plan: Callable[[float], Plan] = field(repr=False)
    offered_rps: Callable[[float], float | None] = field(repr=False)

    @property
    def label(self) -> str:
        """The row label."""
        return self.spec.label

    @property
    def floor(self) -> float:
        """The lowest load a search tries."""
        return self.nominal / SEARCH_DOWN

    @property
    def ceiling(self) -> float:
        """The highest load a search tries."""
        return self.nominal * SEARCH_UP

    def workload(self, load: float) -> Workload:
        """A fresh workload at `load`, arrivals ending where the plan says."""
        return self.build(load, self.plan(load).arrival_end)


def target_of(spec: TargetSpec) -> Target:
    """Rebuild a target from its spec; ValueError on an unknown scenario or an unreadable trace."""
    if spec.kind == "scenario":
        sc = scenario(spec.name, seed=spec.seed, scale=QUICK_SCALE if spec.quick else 1.0)
        return Target(
            spec,
            sc.what,
            sc.load_unit,
            sc.load,
            sc.mean_output,
            sc.server_args(),
            build=lambda load, until: sc.workload(load, until=until),
            plan=partial(_scenario_plan, sc),
            offered_rps=lambda load: load if sc.open_loop else None,
        )
    if spec.kind == "trace":
        info = _trace_info(spec)
        what = (
            f"{Path(spec.name).name}: trace seconds {TRACE_START_S:g}-{TRACE_START_S + info.window_s + info.warmup_s:g}"
            f" ({info.window_requests} requests measured after {info.warmup_s:g} s of warm-up, mean prompt "
            f"{info.mean_prompt:.0f} tokens, mean output {info.mean_output:.0f}), {TRACE_ROUTER} routing"
        )
        if info.shortened_from_tokens is not None:
            what += (
                f"; the quick window, since the full one offers {info.shortened_from_tokens / 1e6:.1f}M prompt "
                f"tokens (over {TRACE_MAX_PROMPT_TOKENS / 1e6:g}M: a probe would simulate about an hour)"
            )
        args = ServerArgs(**{**BASE_ARGS, "seed": spec.seed, **info.overrides})
        rate = info.window_requests / info.window_s
        return Target(
            spec,
            what,
            "x speed",
            max(0.25, TRACE_START_TOKENS_S / (rate * info.mean_prompt)),
            info.mean_output,
            args,
            build=partial(_trace_build, spec),
            plan=partial(_trace_plan, info),
            offered_rps=lambda speed: info.window_requests / (info.window_s / speed),
        )
    raise ValueError(f"unknown target kind {spec.kind!r}")


def scenario_specs(names: tuple[str, ...], seed: int, quick: bool) -> list[TargetSpec]:
    """Specs for scenarios by name; ValueError names an unknown one."""
    known = scenario_names()
    for name in names:
        if name not in known:
            raise ValueError(f"unknown scenario {name!r}; known scenarios: {', '.join(known)}")
    return [TargetSpec("scenario", name, seed, quick) for name in names]


def trace_specs(paths: tuple[str, ...], seed: int, quick: bool) -> list[TargetSpec]:
    """Specs for trace files; ValueError (one line, naming the file and line) on one that cannot be read."""
    specs = [TargetSpec("trace", str(path), seed, quick) for path in paths]
    for spec in specs:
        try:
            _trace_info(spec)
        except ImportError:
            raise ValueError("trace replay needs workloads.trace_workload, which this tree lacks") from None
        except OSError as exc:
            raise ValueError(f"cannot read trace file {spec.name!r}: {exc.strerror or exc}") from None
    return specs


def _trace_build(spec: TargetSpec, speed: float, until: float) -> Workload:
    from workloads import trace_workload

    info = _trace_info(spec)
    return trace_workload(
        _trace_data(spec.name),
        speed=speed,
        start=TRACE_START_S,
        duration=info.warmup_s + info.window_s,
        router=TRACE_ROUTER,
        dp_size=DP_SIZE,
        seed=spec.seed,
    )


def _scenario_plan(sc: Scenario, load: float) -> Plan:
    end = sc.warmup_s + sc.window_s
    if not sc.open_loop:
        return Plan(end, sc.warmup_s)
    expected = load * sc.window_s
    # Poisson counts: the mean plus four standard deviations bounds the window's requests.
    requests = expected + 4 * math.sqrt(expected) + 10
    tokens = 1.5 * load * end * sc.mean_output + 1000
    return Plan(end, sc.warmup_s, requests, tokens if sc.mean_output > 1 else None)


def _trace_plan(info: _TraceInfo, speed: float) -> Plan:
    return Plan(
        (info.warmup_s + info.window_s) / speed,
        info.warmup_s / speed,
        float(info.window_requests),
        1.2 * info.output_tokens + 1000,
    )


@dataclass(frozen=True, slots=True)
class _TraceInfo:
    warmup_s: float
    window_s: float
    window_requests: int
    output_tokens: int
    mean_prompt: float
    mean_output: float
    overrides: dict[str, int]
    shortened_from_tokens: int | None = None  # a full run's window cut to the quick one: the full replay's tokens


@cache
def _trace_data(path: str) -> object:
    from workloads.traces import load_trace_file

    return load_trace_file(path)


@cache
def _trace_info(spec: TargetSpec) -> _TraceInfo:
    """The trace window's requests, read once per process (trace seconds from the window's start)."""
    from workloads.traces import trace_window

    data = _trace_data(spec.name)
    warmup, window = TRACE_WARMUP_S, TRACE_WINDOW_S
    requests = trace_window(data, start=TRACE_START_S, duration=warmup + window)
    full_tokens = sum(r.prompt_len or 1 for r in requests)
    shortened = not spec.quick and full_tokens > TRACE_MAX_PROMPT_TOKENS
    if spec.quick or shortened:
        warmup, window = QUICK_TRACE_WARMUP_S, QUICK_TRACE_WINDOW_S
        requests = trace_window(data, start=TRACE_START_S, duration=warmup + window)
    measured = [r for r in requests if r.time >= warmup]
    if not measured:
        span = f"{TRACE_START_S + warmup:g}-{TRACE_START_S + warmup + window:g}"
        raise ValueError(f"{spec.name}: no request in trace seconds {span}")
    longest = max((r.prompt_len or 1) + (r.output_len or 1) for r in requests)
    # A rank's pool holds TRACE_KV_TOKENS (what an H200 keeps for KV next to its share of the weights), and at
    # least twice the longest request: long-context traces measure the policies, not a small pool.
    pages = max(TRACE_KV_TOKENS, 2 * longest) // BASE_ARGS["page_size"]
    return _TraceInfo(
        warmup_s=warmup,
        window_s=window,
        window_requests=len(measured),
        output_tokens=sum(r.output_len or 1 for r in requests),
        mean_prompt=sum(r.prompt_len or 1 for r in requests) / len(requests),
        mean_output=sum(r.output_len or 1 for r in requests) / len(requests),
        overrides={"kv_pages": pages},
        shortened_from_tokens=full_tokens if shortened else None,
    )
