"""Workloads: when requests arrive, how long they are, which rank gets them (ARCHITECTURE.md, Engine).

A `Workload` is what a driver asks each round: ``due(now, loads)`` returns the requests that arrived by
``now`` with their ranks, ``on_finished(rid, now)`` tells it a request ended (closed loops issue the
next one), and ``done`` says no request will come again. The same object serves the lockstep simulator
(virtual clock) and the process driver (wall clock): it only compares arrival times with ``now``.

Parts, each a small frozen spec started from the workload's seed:

- arrivals: `Poisson`, `OnOff` bursts, `Bursts` of simultaneous requests, `ClosedLoop` concurrency,
  `Trace` replay of a trace file (traces.py: Azure 2023 CSV, Mooncake FAST'25 JSONL, our own JSONL;
  `trace_workload` builds a whole workload from one, windowed, sped up and routed);
- lengths: `Fixed`, `Uniform`, `Normal`, `LogNormal` (both clipped), `OutputRatio` (sglang#23189);
- routing: `RoundRobin`, `ShortestQueue`, `Skewed`, `PrefixAffinity` (SGLang's cache-aware router over the
  per-rank prefix block caches of prefix_cache.py).

Every random choice comes from its own stream seeded from ``(seed, stream name)``, so the same seed
gives the same requests, and changing, say, the router does not change the lengths drawn.
"""

from __future__ import annotations

from workloads.arrivals import (
    Arrival,
    ArrivalProcess,
    ArrivalStream,
    Bursts,
    ClosedLoop,
    OnOff,
    Poisson,
)
from workloads.core import Workload, stream
from workloads.lengths import Fixed, LengthDist, LogNormal, Normal, OutputRatio, Uniform
from workloads.routing import PrefixAffinity, RoundRobin, Router, RouterState, ShortestQueue, Skewed
from workloads.traces import Trace, TraceData, TraceError, load_trace, load_trace_file, trace_workload

__all__ = [
    "Arrival",
    "ArrivalProcess",
    "ArrivalStream",
    "Bursts",
    "ClosedLoop",
    "Fixed",
    "LengthDist",
    "LogNormal",
    "Normal",
    "OnOff",
    "OutputRatio",
    "Poisson",
    "PrefixAffinity",
    "RoundRobin",
    "Router",
    "RouterState",
    "ShortestQueue",
    "Skewed",
    "Trace",
    "TraceData",
    "TraceError",
    "Uniform",
    "Workload",
    "load_trace",
    "load_trace_file",
    "stream",
    "trace_workload",
]
