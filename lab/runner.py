"""The lab's cells: one scenario run under one policy on the simulator, summarised with its oracle bound.

A cell is fully described by a picklable `CellSpec` (names and numbers only), so cells can run in worker
processes: each worker rebuilds the scenario, arguments, policy and preset from the names, and the same
spec always gives the same cell (the simulator runs on a virtual clock from fixed seeds). `run_cells`
returns cells in the order of the specs whatever the number of workers, so a report built from them does
not depend on `jobs`. Only `Cell.wall_seconds` differs between runs; the report never shows it.

Every cell runs for the scenario's `duration_s` virtual seconds (`rounds` is only a safety cap), so in an
open-loop scenario every policy is offered the same requests; in a closed loop each policy's completions
drive its own arrivals; `Cell.request_list` and `Cell.arrivals` let the report tell which case it is looking
at (runs of an open loop differ only in their last requests: each run's last round ends at its own moment).

The oracle bound of a cell (PEERS.md item 8, `engine.policies.oracle`):

- extend rounds: per rank `ceil(prompt tokens extended / budget)`, maximised over ranks, counted on the
  prompt tokens the run actually extended (from the rows). A prompt cut off by the end of the run counts
  only the tokens it got, so the bound stays a lower bound for the run it is compared with; the bound on
  every submitted request is kept beside it (`extend_rounds_submitted`).
- mean ranks extending: every rank's extend rounds packed into the busiest rank's, i.e.
  `sum(per rank) / max(per rank)`.
- decode tokens/s: `oracle_bound` on every submitted request, with the preset's own decode round at the
  requests' mean KV footprint (prompt plus half the output).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from engine.config import PrefillDelay, ServerArgs
from engine.executor.presets import DEFAULT_PRESET, CostPreset, preset_named
from engine.metrics import Summary
from engine.policies.oracle import OracleRequest, decode_round_seconds_of, extend_rounds_per_rank, oracle_bound
from engine.policies.registry import DEFAULT_LOCAL_INTERVAL, make_policy, policy_args
from engine.rank import RoundOutcome
from engine.record import RoundRecord
from engine.request import RequestSpec
from lab.autotune import AUTOTUNE, COLD_START, FIXED_LOAD_SLO, LAB_POLICIES, LAB_TUNING, AutotunedGate
from lab.phase import PhaseStats, PhaseTracker
from lab.scenarios import scenario, scenario_names
from lab.simrun import run_sim
from workloads import Workload

# The gate's intervals when the lab is not told otherwise: the pair the simulator's own benchmark and
# tests run (bench/results/sim_speed.md), not a tuned value; `--sweep` searches around it.
DEFAULT_ATTEMPT_INTERVAL = 8
DEFAULT_ANY_INTERVAL = 32

# Scenarios whose per-rank progress series the lab keeps and charts (the mixed-state feedback loop).
PHASE_SCENARIOS: frozenset[str] = frozenset({"long-chunked", "long-chunked-offset", "long-chunked-decode"})


@dataclass(frozen=True, slots=True)
class CellSpec:
    """One cell: a scenario at a seed and scale, a policy with its knobs, a preset (name or .json path)."""

    scenario: str
    policy: str
    preset: str = DEFAULT_PRESET
    seed: int = 0
    scale: float = 1.0
    attempt_interval: int = DEFAULT_ATTEMPT_INTERVAL
    any_interval: int = DEFAULT_ANY_INTERVAL
    local_interval: int = DEFAULT_LOCAL_INTERVAL

    @property
    def keeps_series(self) -> bool:
        """Whether the cell keeps its progress-spread series (only where the report charts it)."""
        return self.scenario in PHASE_SCENARIOS


@dataclass(frozen=True, slots=True)
class OracleFigures:
    """The oracle bound for one cell's run (module docstring)."""

    extend_rounds: int
    extend_rounds_submitted: int
    mean_ranks_extending: float | None
    decode_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class Cell:
    """One cell's result. `wall_seconds` is the only field that differs between identical runs."""

    spec: CellSpec
    summary: Summary
    oracle: OracleFigures
    phase: PhaseStats
    # Prompts still waiting on every rank after the last round: a backlog that only grows over the run means
    # the policy cannot keep up with the load, and its TTFT tail then depends on the run's length.
    waiting_at_end: int
    requests: int
    request_list: tuple[OracleRequest, ...] = field(repr=False, compare=False)
    arrivals: tuple[float, ...] = field(repr=False, compare=False)
    offered_output_tokens: int
    stopped_by: str
    rounds: int
    sim_seconds: float
    wall_seconds: float

    @property
    def extend_over_oracle(self) -> float | None:
        """The run's extend rounds over its oracle bound; None when the bound is 0."""
        bound = self.oracle.extend_rounds
        return self.summary.extend_rounds / bound if bound else None


def check_names(scenarios: Iterable[str], policies: Iterable[str], preset: str) -> CostPreset:
    """Raise ValueError naming what is unknown (listing the known names); returns the preset."""
    known_scenarios = scenario_names()
    for name in scenarios:
        if name not in known_scenarios:
            raise ValueError(f"unknown scenario {name!r}; known scenarios: {', '.join(known_scenarios)}")
    for name in policies:
        if name not in LAB_POLICIES:
            raise ValueError(
                f"unknown policy {name!r}; known policies: {', '.join(LAB_POLICIES)} "
                "(the oracle bound row is always shown)"
            )
    return preset_named(preset)


@cache
def _preset(name: str) -> CostPreset:
    return preset_named(name)


def run_cell(spec: CellSpec) -> Cell:
    """Simulate one cell (deterministic for a given spec)."""
    started = time.perf_counter()
    sc = scenario(spec.scenario, seed=spec.seed, scale=spec.scale)
    cost = _preset(spec.preset)
    sim_preset = spec.preset if not spec.preset.endswith(".json") else cost.name
    # gate-autotune: the gate on every rank, from a cold start, moved by a tuner reading the rounds.
    client = AutotunedGate(COLD_START, LAB_TUNING).client(*FIXED_LOAD_SLO) if spec.policy == AUTOTUNE else None
    policy = "gate" if client is not None else spec.policy
    args = policy_args(
        policy,
        sc.server_args(sim_preset=sim_preset),
        prefill_delay=COLD_START if client is not None else PrefillDelay(spec.attempt_interval, spec.any_interval),
        decode_interval=spec.local_interval,
    )
    tracker = PhaseTracker(args.chunked_prefill_size, keep_series=spec.keeps_series)
    last: list[RoundRecord] = []

    def observe(record: RoundRecord, outcomes: Sequence[RoundOutcome]) -> None:
        tracker.observe(record)
        last[:] = [record]
        if client is not None:
            client.on_round(record, outcomes)

    workload = _ArrivalLog(client.wrap(sc.workload()) if client is not None else sc.workload())
    summary, extra = run_sim(
        args,
        workload,  # a Workload in all but name: it delegates everything
        rounds=sc.rounds,
        duration=sc.duration_s,
        policy_factory=lambda rank, rank_args: make_policy(policy, rank_args, rank),
        on_round=observe,
        preset=cost,
        on_start=client.start if client is not None else None,
    )
    phase = tracker.stats()
    requests = extra.requests
    return Cell(
        spec=spec,
        summary=summary,
        oracle=_oracle(requests, phase.tokens_per_rank, args, cost),
        phase=phase,
        waiting_at_end=sum(row.waiting_prompts for row in last[0].rows) if last else 0,
        requests=len(requests),
        request_list=requests,
        arrivals=tuple(workload.arrivals),
        offered_output_tokens=sum(output for *_, output in requests),
        stopped_by=extra.stopped_by,
        rounds=extra.rounds,
        sim_seconds=extra.sim_seconds,
        wall_seconds=time.perf_counter() - started,
    )


class _ArrivalLog:
    """A workload that also keeps the arrival time of every request it issues, so the report can tell an open
    loop (every policy sees the same arrivals) from a closed one (completions move them). Delegates the rest."""

    def __init__(self, workload: Workload) -> None:
        self._workload = workload
        self.arrivals: list[float] = []

    def due(self, now: float, loads: Sequence[int] | None = None) -> list[tuple[int, RequestSpec]]:
        """The wrapped workload's due requests, their arrival times noted."""
        issued = self._workload.due(now, loads)
        self.arrivals.extend(spec.arrival for _, spec in issued)
        return issued

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workload, name)


def _oracle(
    requests: Sequence[OracleRequest], tokens_per_rank: Sequence[int], args: ServerArgs, cost: CostPreset
) -> OracleFigures:
    """The cell's oracle figures (module docstring)."""
    budget = args.chunked_prefill_size
    extended = [(rank, tokens, 0, 1) for rank, tokens in enumerate(tokens_per_rank) if tokens > 0]
    per_rank = extend_rounds_per_rank(extended, budget)
    if requests:
        footprint = sum(prompt + output / 2 for _, prompt, _, output in requests) / len(requests)
        pages = math.ceil(footprint / args.page_size)
        # One decode round per distinct batch size: the bound asks for the same few sizes many times.
        seconds = cache(
            decode_round_seconds_of(cost, ranks=args.dp_size, kv_pages_per_seq=pages, page_size=args.page_size)
        )
        bound = oracle_bound(requests, budget, args.max_batch_size, seconds)
        decode_rate, submitted_rounds = bound.decode_tokens_per_s, bound.extend_rounds
    else:
        decode_rate, submitted_rounds = 0.0, 0
    busiest = max(per_rank.values(), default=0)
    return OracleFigures(
        extend_rounds=busiest,
        extend_rounds_submitted=submitted_rounds,
        mean_ranks_extending=sum(per_rank.values()) / busiest if busiest else None,
        decode_tokens_per_s=decode_rate,
    )


def default_jobs() -> int:
    """Two workers where two CPUs exist (the lab's target machine), else one."""
    return max(1, min(2, os.cpu_count() or 1))


def run_cells(specs: Sequence[CellSpec], jobs: int = 1) -> list[Cell]:
    """Run every spec; cells come back in the order of `specs` whatever `jobs` is."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(specs) <= 1:
        return [run_cell(spec) for spec in specs]
    # spawn, not fork: a forked worker inherits locks held by the parent's other threads (gRPC, OTel
    # exporters in a long-lived process) and can wait on them forever.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=context) as pool:
        # map() yields in submission order: the report never depends on which worker finished first.
        return list(pool.map(run_cell, specs, chunksize=1))


@dataclass(frozen=True, slots=True)
class LabConfig:
    """What one lab run covers."""

    scenarios: tuple[str, ...]
    policies: tuple[str, ...]
    preset: str = DEFAULT_PRESET
    seed: int = 0
    scale: float = 1.0
    attempt_interval: int = DEFAULT_ATTEMPT_INTERVAL
    any_interval: int = DEFAULT_ANY_INTERVAL
    local_interval: int = DEFAULT_LOCAL_INTERVAL

    def specs(self) -> list[CellSpec]:
        """Every (scenario, policy) cell, scenario-major in the configured order."""
        return [
            CellSpec(
                scenario=name,
                policy=policy,
                preset=self.preset,
                seed=self.seed,
                scale=self.scale,
                attempt_interval=self.attempt_interval,
                any_interval=self.any_interval,
                local_interval=self.local_interval,
            )
            for name in self.scenarios
            for policy in self.policies
        ]


def group_by_scenario(cells: Iterable[Cell], scenarios: Sequence[str]) -> dict[str, list[Cell]]:
    """Cells grouped by scenario, in the order of `scenarios`; within a scenario, in the order given."""
    grouped: dict[str, list[Cell]] = {name: [] for name in scenarios}
    for cell in cells:
        grouped[cell.spec.scenario].append(cell)
    return grouped


def run_lab(config: LabConfig, jobs: int = 1) -> dict[str, list[Cell]]:
    """Every cell of `config`, grouped by scenario (in order), policies in order within each."""
    check_names(config.scenarios, config.policies, config.preset)
    return group_by_scenario(run_cells(config.specs(), jobs), config.scenarios)
