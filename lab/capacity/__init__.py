"""The capacity lab (`prefill-gate lab capacity`): goodput capacity per workload and policy, every policy at its best.

- `bisect`: the search itself, pure (a predicate over loads on a geometric lattice).
- `probe`: one simulated run at one load, judged against an SLO (TTFT p99 net of idle prefill, ITL p99,
  no backlog); goodput per request.
- `targets`: what is measured: scenario shapes (load = arrival rate) and trace windows (load = speed).
- `knobs`: each policy's knobs, their grids, and a setting made runnable.
- `search`: `find_capacity` (one setting) and `best_capacity` (the policy at its best), with a probe cache.
"""

from lab.capacity.bisect import Lattice, Search, bisect_capacity
from lab.capacity.knobs import Knobs, knobs
from lab.capacity.probe import Plan, Probe, Slo, verdict
from lab.capacity.search import Capacity, Searcher, best_capacity, find_capacity
from lab.capacity.targets import Target, TargetSpec, target_of

__all__ = [
    "Capacity",
    "Knobs",
    "Lattice",
    "Plan",
    "Probe",
    "Search",
    "Searcher",
    "Slo",
    "Target",
    "TargetSpec",
    "best_capacity",
    "bisect_capacity",
    "find_capacity",
    "knobs",
    "target_of",
    "verdict",
]
