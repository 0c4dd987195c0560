"""The policy lab (issue 8): the gate and its public peers on the same simulated requests, in one table.

- `runner`: cells (scenario x policy) on the simulator, with each run's oracle bound; parallel and deterministic.
- `phase`: per-rank prefill progress and its spread (the mixed-state feedback loop of sglang#35241).
- `report`: tables, direction-aware ratios of the gate to the best peer and to the oracle bound (pure).
- `sweep`: the gate's (A, K) searched per scenario under a TTFT p99 bound.
- `charts`: PNG charts (matplotlib, Agg).
- `cli`: `prefill-gate lab` (`add_lab_parser`, `lab_main`); `python -m lab` runs it standalone.
"""
