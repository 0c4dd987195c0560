"""Capacity of one policy on one target: `find_capacity` for given knobs, `best_capacity` over the policy's knobs.

Both bisect the target's load (`bisect.bisect_capacity`) with a predicate that runs probes (`probe.run_probe`)
through a `Searcher`, which caches every probe by (knobs, load): the same load is never simulated twice for
the same setting, whichever SLO or search asks. A probe is cut short as soon as the SLO being searched is
certainly broken; a later search under a looser SLO that cannot use the cut probe runs it again in full.

`best_capacity` is "the policy at its best": the load passes when *some* setting of the grid passes it, tried
in order with the last setting that passed first (it usually passes again, and a pass ends the round); the
best setting is the one that passed at the capacity. With `refine` it then walks from that setting to its
neighbours (`KnobSpace.refine`), searching above the capacity found, until no neighbour raises it.

At the capacity it runs one finishing probe with the best setting (no early exit; every window request runs
to its end) for the reported figures and the goodput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.executor.presets import CostPreset
from lab.autotune import AutotunedGate
from lab.capacity.bisect import Lattice, Search, bisect_capacity
from lab.capacity.knobs import Knobs, PolicyFactory, configure, space_of
from lab.capacity.probe import FINISH_CAP_S, Probe, Slo, run_probe, verdict
from lab.capacity.targets import Target

# Lattice steps: the answer's resolution (relative).
FULL_STEP = 0.05
QUICK_STEP = 0.15
# A quick run's goodput probe stops this long after the last arrival (a full one runs every request out).
QUICK_FINISH_CAP_S = 60.0


@dataclass(frozen=True, slots=True)
class Trial:
    """One setting tried at one load under one SLO, and whether it held."""

    knobs: Knobs
    load: float
    held: bool
    probe: Probe


@dataclass(frozen=True)
class Capacity:
    """A policy's capacity on a target under an SLO.

    `capacity` is the highest load that held (0.0: not even the lowest tried), `failed_at` the lowest load
    above it that failed (None: the search's ceiling held), `knobs` the setting that held at the capacity,
    `at_capacity` the finishing probe there (None at capacity 0), `trials` every probe the search asked.
    """

    target: str
    policy: str
    slo: Slo
    capacity: float
    failed_at: float | None
    knobs: Knobs | None
    capacity_rps: float | None
    at_capacity: Probe | None
    trials: tuple[Trial, ...] = field(repr=False)


class Searcher:
    """Probes of one policy on one target, cached by (knobs, load)."""

    def __init__(self, target: Target, policy: str, preset: CostPreset, *, quick: bool = False) -> None:
        space_of(policy)  # unknown policy: ValueError now
        self.target = target
        self.policy = policy
        self.preset = preset
        self.quick = quick
        self.lattice = Lattice(
            base=target.nominal,
            step=QUICK_STEP if quick else FULL_STEP,
            floor=target.floor,
            ceiling=target.ceiling,
        )
        self.probes: dict[tuple[Knobs, int], Probe] = {}
        self.runs = 0
        self._configured: dict[Knobs, tuple[object, PolicyFactory]] = {}

    def probe(self, setting: Knobs, load: float, slo: Slo, *, finish: bool = False) -> Probe:
        """The probe of `setting` at `load`, cut short on `slo` unless `finish` (cached)."""
        key = (setting, self.lattice.index(load))
        cached = self.probes.get(key)
        if cached is not None and not finish and verdict(cached, slo) is not None:
            return cached
        if setting not in self._configured:
            self._configured[setting] = configure(self.policy, setting, self.target.base_args)
        args, factory = self._configured[setting]
        self.runs += 1
        probe = run_probe(
            args,  # type: ignore[arg-type]
            factory,
            self.target.workload(load),
            self.target.plan(load),
            self.preset,
            load=load,
            slo=slo,
            exit_slo=None if finish else slo,
            finish=finish,
            finish_cap_s=QUICK_FINISH_CAP_S if self.quick else FINISH_CAP_S,
            # gate-autotune: a fresh tuner per run, aiming at the SLO this search judges by.
            client=factory.client(slo.ttft_p99_s, slo.itl_p99_s) if isinstance(factory, AutotunedGate) else None,
        )
        if cached is None or cached.cut_short is not None:
            self.probes[key] = probe
        return probe

    def curve(self, setting: Knobs) -> list[Probe]:
        """Every probe of `setting`, by load."""
        return sorted((p for (s, _), p in self.probes.items() if s == setting), key=lambda p: p.load)


def _search(
    searcher: Searcher,
    settings: Sequence[Knobs],
    slo: Slo,
    trials: list[Trial],
    *,
    known: float | None = None,
    hint: float | None = None,
) -> tuple[Search, Knobs | None]:
    """Bisect the load; a load holds when some setting holds it (the last one that held is tried first)."""
    order = list(dict.fromkeys(settings))
    held_by: dict[float, Knobs] = {}

    def passes(load: float) -> bool:
        for setting in list(order):
            probe = searcher.probe(setting, load, slo)
            held = bool(verdict(probe, slo))
            trials.append(Trial(setting, load, held, probe))
            if held:
                order.remove(setting)
                order.insert(0, setting)
                held_by[load] = setting
                return True
        return False

    found = bisect_capacity(passes, searcher.lattice, hint=hint if hint is not None else known, known=known)
    return found, held_by.get(found.capacity)


def best_capacity(
    searcher: Searcher,
    settings: Sequence[Knobs],
    slo: Slo,
    *,
    refine: bool = False,
    goodput: bool = True,
    hint: float | None = None,
) -> Capacity:
    """The policy at its best over `settings` (module docstring); `hint` is the load to start from."""
    trials: list[Trial] = []
    found, best = _search(searcher, settings, slo, trials, hint=hint)
    tried = set(settings)
    while refine and best is not None and found.failed_at is not None:
        neighbours = [s for s in space_of(searcher.policy).refine(best) if s not in tried]
        if not neighbours:
            break
        tried.update(neighbours)
        better, winner = _search(searcher, [best, *neighbours], slo, trials, known=found.capacity)
        if better.capacity <= found.capacity or winner is None:
            break
        found, best = better, winner
    return _result(searcher, found, best, slo, trials, goodput)


def find_capacity(
    target: Target,
    policy: str,
    knobs: Knobs,
    slo: Slo,
    *,
    preset: CostPreset,
    quick: bool = False,
    searcher: Searcher | None = None,
    goodput: bool = True,
) -> Capacity:
    """The goodput capacity of `policy` at one setting `knobs` on `target` under `slo` (one bisection)."""
    searcher = searcher or Searcher(target, policy, preset, quick=quick)
    trials: list[Trial] = []
    found, best = _search(searcher, [knobs], slo, trials)
    return _result(searcher, found, best, slo, trials, goodput)


def _result(
    searcher: Searcher, found: Search, best: Knobs | None, slo: Slo, trials: list[Trial], goodput: bool
) -> Capacity:
    at: Probe | None = None
    if best is not None and found.capacity > 0:
        at = searcher.probe(best, found.capacity, slo, finish=goodput) if goodput else None
        if at is None:
            at = searcher.probe(best, found.capacity, slo)
    rps = None
    if found.capacity > 0:
        offered = searcher.target.offered_rps(found.capacity)
        rps = offered if offered is not None else (at.offered_rps if at is not None else None)
    return Capacity(
        target=searcher.target.label,
        policy=searcher.policy,
        slo=slo,
        capacity=found.capacity,
        failed_at=found.failed_at,
        knobs=best,
        capacity_rps=rps,
        at_capacity=at,
        trials=tuple(trials),
    )
