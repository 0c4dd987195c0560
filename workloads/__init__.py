"""Workloads: when requests arrive, how long they are, which rank gets them (ARCHITECTURE.md, Engine).

A `Workload` is what a driver asks each round: ``due(now, loads)`` returns the requests that arrived by
``now`` with their ranks, ``on_finished(rid, now)`` tells it a request ended (closed loops issue the
next one), and ``done`` says no request will come again. The same object serves the lockstep simulator
(virtual clock) and the process driver (wall clock): it only compares arrival times with ``now``.

Parts, each a small frozen spec started from the workload's seed:

- arrivals: `Poisson`, `OnOff` bursts, `Bursts` of simultaneous requests, `ClosedLoop` concurrency,
  `Trace` replay of a JSONL file;
- lengths: `Fixed`, `Uniform`, `Normal`, `LogNormal` (both clipped), `OutputRatio` (sglang#23189);
- routing: `RoundRobin`, `ShortestQueue`, `Skewed`.

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
    Trace,
    load_trace,
)
from workloads.core import Workload, stream
from workloads.lengths import Fixed, LengthDist, LogNormal, Normal, OutputRatio, Uniform
from workloads.routing import RoundRobin, Router, RouterState, ShortestQueue, Skewed

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
    "RoundRobin",
    "Router",
    "RouterState",
    "ShortestQueue",
    "Skewed",
    "Trace",
    "Uniform",
    "Workload",
    "load_trace",
    "stream",
]
