"""One probe of the capacity search: a workload at one load under one policy setting, judged against an SLO.

A probe issues arrivals until `arrival_end`, measures the window after `warmup_end` (requests that arrive in
it, rounds that end in it), and keeps running after the last arrival until every window request has its
first token or `DRAIN_S` (plus the longest idle prefill among them) has passed: a request still without its
first token then is *unserved*, and any unserved request means the load backlogs. With `finish=True` it
runs on until every window request has finished (or `finish_cap_s` has passed), for the goodput figures.

What a probe judges (`verdict`), for an SLO (S, T):

- TTFT: a request's TTFT counts net of its own *idle prefill* (the rounds its uncached prompt takes on an
  otherwise idle group under the preset: 0.1 s for a 1k prompt on h200-dp8-ep8, 3.3 s for a 60k one), so
  that S bounds what the policy and the queue add, not the prompt's length; the p99 of that excess over the
  window's requests (unserved ones count as infinite) must be <= S. The raw TTFT p99 is reported beside it.
- ITL: the p99 of every inter-token gap produced by a round in the window (each gap weighted by the
  requests that waited it) must be <= T. The gaps still open when the window closes count too, up to the
  window's end: a policy that starves decode (a rank that extends every round on a non-mixed engine, so its
  decoding requests get no token while prompts keep coming) produces no closed gap in the window at all,
  and would otherwise pass with no ITL figure.
- Backlog: no window request unserved, and the median TTFT excess of the requests arriving in the last
  third of the window exceeds that of the first third by at most S/2 (a queue that grows through the run
  adds its growth to every later request's wait; a stable one does not, however long it is).

Per request (goodput, DistServe-style): a request is good when its TTFT excess is <= S and its TPOT, the
mean gap over its decode ((finish - first token) / (output tokens - 1)), is <= T. The simulator keeps ITL
per cohort, not per request, so a per-request ITL p99 is not available; TPOT is what DistServe judges.

Early exit: a probe given `exit_slo` stops as soon as the verdict for that SLO is certainly a failure - more
violations of it than 1% of the most requests (or decode tokens) the window can hold - and says so in
`cut_short`; its p99 figures are then lower bounds (`verdict` answers None for a looser SLO it cannot
decide). The run is deterministic: the same probe always gives the same figures.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from engine.config import ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.executor.presets import CostPreset, RankWork
from engine.metrics import weighted_percentile
from engine.policy import PrefillPolicy
from engine.rank import RoundOutcome
from engine.record import RoundRecord
from engine.request import Finished, FirstToken, Refused, RequestSpec
from lab.autotune import TunerClient
from lab.simrun import run_sim
from workloads import Workload

# After the last arrival every window request must have its first token within this many seconds (plus its
# own idle prefill): a request still waiting then is unserved, and the load backlogs.
DRAIN_S = 30.0
# A finishing run (goodput) gives up this long after the last arrival.
FINISH_CAP_S = 900.0
# The share of window requests (or tokens) a p99 may leave above its bound.
TAIL = 0.01


@dataclass(frozen=True, slots=True)
class Slo:
    """The service level a load must hold: TTFT p99 (net of idle prefill) and ITL p99, in seconds.

    The default ITL bound is 0.5 s, not 0.2 s: on the re-derived default preset (h200-dp8-ep8) the round in
    which one rank extends a lone 1k prompt takes 0.33 s, so a bound under one extend round forbids any extend
    round in more than 1% of gaps, and every policy's capacity collapses to the rate at which it can afford to
    extend at all (QUICK runs: 0.1-8 req/s, most rows under 1). 0.5 s is one extend round with room for the
    decode round beside it; `--slo-itl-p99` takes the bound an operator serves.
    """

    ttft_p99_s: float = 2.0
    itl_p99_s: float = 0.5

    def __post_init__(self) -> None:
        if not (self.ttft_p99_s > 0 and self.itl_p99_s > 0):
            raise ValueError(f"SLO bounds must be > 0 s, got TTFT {self.ttft_p99_s}, ITL {self.itl_p99_s}")


@dataclass(frozen=True, slots=True)
class Plan:
    """When a probe's arrivals stop, where its window starts, and how many requests and decode tokens the window
    can hold at most (None: unknown, no early exit on that count)."""

    arrival_end: float
    warmup_end: float
    max_requests: float | None = None
    max_tokens: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_end < self.arrival_end:
            raise ValueError(f"need 0 <= warm-up end < arrival end, got {self.warmup_end}, {self.arrival_end}")

    @property
    def window_s(self) -> float:
        """Seconds of arrivals the probe measures."""
        return self.arrival_end - self.warmup_end


@dataclass(frozen=True, slots=True)
class Probe:
    """A probe's figures (module docstring). Latencies in seconds; `math.inf` where unserved requests decide."""

    load: float
    requests: int
    offered_rps: float
    ttft_p99_s: float | None
    ttft_excess_p99_s: float | None
    itl_p99_s: float | None
    output_tok_s: float
    extend_share: float | None
    extend_round_s: float | None  # mean length of the window's extend rounds
    ranks_per_extend: float | None  # mean ranks extending per extend round
    wait_growth_s: float
    unserved: int
    cut_short: str | None
    exit_slo: Slo | None
    goodput_rps: float | None
    good_share: float | None
    rounds: int
    sim_seconds: float
    wall_seconds: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly figures (infinities as None)."""
        out: dict[str, Any] = {}
        for name in self.__slots__:  # type: ignore[attr-defined]
            value = getattr(self, name)
            if isinstance(value, Slo):
                value = {"ttft_p99_s": value.ttft_p99_s, "itl_p99_s": value.itl_p99_s}
            elif isinstance(value, float) and not math.isfinite(value):
                value = None
            out[name] = value
        return out


def backlogged(probe: Probe, slo: Slo) -> bool:
    """Whether the probe's queue grew through the run (module docstring)."""
    return probe.unserved > 0 or probe.wait_growth_s > slo.ttft_p99_s / 2


def verdict(probe: Probe, slo: Slo) -> bool | None:
    """Whether the load holds `slo` without backlog; None when a probe cut short cannot tell."""
    if probe.cut_short is not None:
        # Cut short on a bound at least as strict as this one's: a failure; else its figures cannot tell.
        bound = probe.exit_slo or slo
        if probe.cut_short == "ttft" and slo.ttft_p99_s <= bound.ttft_p99_s:
            return False
        if probe.cut_short == "itl" and slo.itl_p99_s <= bound.itl_p99_s:
            return False
        return None
    ttft_bad = probe.ttft_excess_p99_s is not None and probe.ttft_excess_p99_s > slo.ttft_p99_s
    itl_bad = probe.itl_p99_s is not None and probe.itl_p99_s > slo.itl_p99_s
    return probe.requests > 0 and not (ttft_bad or itl_bad or backlogged(probe, slo))


def idle_prefill_seconds(preset: CostPreset, tokens: int, budget: int, ranks: int) -> float:
    """The time `tokens` uncached prompt tokens take on an otherwise idle group: full chunks of `budget`, then
    the rest, one rank extending and `ranks - 1` idle."""
    full, rest = divmod(max(tokens, 0), budget)
    idle = (RankWork(),) * (ranks - 1)
    seconds = full * preset.work_seconds((RankWork(0, budget, 0), *idle)) if full else 0.0
    return seconds + (preset.work_seconds((RankWork(0, rest, 0), *idle)) if rest else 0.0)


class _Logged:
    """A workload that notes every request it issues (id -> spec); delegates the rest."""

    def __init__(self, workload: Workload, on_issue: Callable[[RequestSpec], None]) -> None:
        self._workload = workload
        self._on_issue = on_issue

    def due(self, now: float, loads: Sequence[int] | None = None) -> list[tuple[int, RequestSpec]]:
        issued = self._workload.due(now, loads)
        for _, spec in issued:
            self._on_issue(spec)
        return issued

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workload, name)


@dataclass(slots=True)
class _Request:
    arrival: float
    floor: float
    output_len: int
    first: float | None = None
    finish: float | None = None
    late: bool = False  # counted as a violation while still waiting


class _Window:
    """The window's bookkeeping during one run."""

    def __init__(self, plan: Plan, floor_of: Callable[[RequestSpec], float], exit_slo: Slo | None) -> None:
        self.plan = plan
        self.floor_of = floor_of
        self.exit_slo = exit_slo
        self.requests: dict[str, _Request] = {}
        self.pending: set[str] = set()  # window requests without a first token
        self.unfinished: set[str] = set()
        self.deadlines: list[tuple[float, str]] = []  # (arrival + floor + exit S, rid) of pending requests
        self.violations = 0
        self.itl_values: list[float] = []
        self.itl_weights: list[int] = []
        self.itl_bad = 0
        self.tokens = 0
        self.busy = 0
        self.extend = 0
        self.extend_seconds = 0.0
        self.ranks_extending = 0
        self.max_floor = 0.0
        self.cut_short: str | None = None
        self.closed = False  # the open gaps of the window's end are counted

    def issue(self, spec: RequestSpec) -> None:
        if not self.plan.warmup_end <= spec.arrival < self.plan.arrival_end:
            return
        floor = self.floor_of(spec)
        self.requests[spec.rid] = _Request(spec.arrival, floor, spec.output_len)
        self.pending.add(spec.rid)
        self.unfinished.add(spec.rid)
        self.max_floor = max(self.max_floor, floor)
        if self.exit_slo is not None:
            heapq.heappush(self.deadlines, (spec.arrival + floor + self.exit_slo.ttft_p99_s, spec.rid))

    def round(
        self,
        record: RoundRecord,
        outcomes: Sequence[RoundOutcome],
        open_gaps: Callable[[float], list[tuple[float, int]]],
    ) -> None:
        now = record.clock
        in_window = self.plan.warmup_end <= now <= self.plan.arrival_end
        if in_window and record.rows and any(row.batch_size for row in record.rows):
            self.busy += 1
            if not record.all_decode_or_idle:
                self.extend += 1
                self.extend_seconds += record.round_seconds
                self.ranks_extending += sum(1 for row in record.rows if row.num_extends > 0)
        bound = self.exit_slo.itl_p99_s if self.exit_slo is not None else math.inf
        for outcome in outcomes:
            for event in outcome.events:
                request = self.requests.get(event.rid) if isinstance(event, FirstToken | Finished | Refused) else None
                if request is None:
                    continue
                if isinstance(event, FirstToken):
                    request.first = event.time
                    self.pending.discard(event.rid)
                    if not request.late and self._late(request, event.time):
                        self.violations += 1
                elif isinstance(event, Finished):
                    request.finish = event.time
                    self.unfinished.discard(event.rid)
                else:
                    self.unfinished.discard(event.rid)
            if in_window:
                self.tokens += sum(1 for event in outcome.events if isinstance(event, FirstToken))
                self.tokens += self._gaps(outcome.itl, bound)
        if not self.closed and now >= self.plan.arrival_end:
            self.closed = True
            self._gaps(open_gaps(self.plan.arrival_end), bound)
        # Pending requests past their deadline are violations already, whenever their first token comes.
        while self.deadlines and self.deadlines[0][0] < now:
            _, rid = heapq.heappop(self.deadlines)
            if rid in self.pending:
                self.violations += 1
                self.requests[rid].late = True
        self._check_exit()

    def _gaps(self, samples: Sequence[tuple[float, int]], bound: float) -> int:
        """Add ITL samples (seconds, requests); the tokens they stand for."""
        tokens = 0
        for seconds, count in samples:
            self.itl_values.append(seconds)
            self.itl_weights.append(count)
            tokens += count
            if seconds > bound:
                self.itl_bad += count
        return tokens

    def _late(self, request: _Request, first: float) -> bool:
        return self.exit_slo is not None and first - request.arrival - request.floor > self.exit_slo.ttft_p99_s

    def _check_exit(self) -> None:
        plan = self.plan
        if self.exit_slo is None or self.cut_short is not None:
            return
        if plan.max_requests is not None and self.violations > TAIL * plan.max_requests:
            self.cut_short = "ttft"
        elif plan.max_tokens is not None and self.itl_bad > TAIL * plan.max_tokens:
            self.cut_short = "itl"


def run_probe(
    args: ServerArgs,
    policy_factory: Callable[[int, ServerArgs], PrefillPolicy],
    workload: Workload,
    plan: Plan,
    preset: CostPreset,
    *,
    load: float,
    slo: Slo,
    exit_slo: Slo | None = None,
    finish: bool = False,
    finish_cap_s: float = FINISH_CAP_S,
    client: TunerClient | None = None,
) -> Probe:
    """Run one probe (module docstring); `slo` sets the per-request goodput judgement of a finishing run, which
    gives up `finish_cap_s` after the last arrival (a request still decoding then is judged on its TTFT alone).
    `client` (gate-autotune's tuner) reads every round and may change the intervals during the run."""
    started = time.perf_counter()
    budget, ranks = args.chunked_prefill_size, args.dp_size
    floor_cache = cache(lambda tokens: idle_prefill_seconds(preset, tokens, budget, ranks))
    window = _Window(plan, lambda spec: floor_cache(spec.prompt_len - spec.prefix_hit), exit_slo)
    clock = [0.0]
    drivers: list[LockstepDriver] = []

    def start(driver: LockstepDriver) -> None:
        drivers.append(driver)
        if client is not None:
            client.start(driver)

    def open_gaps(at: float) -> list[tuple[float, int]]:
        return [gap for engine in drivers[0].engines for gap in engine.scheduler.open_itl(at)]

    def stop() -> bool:
        now = clock[0]
        if window.cut_short is not None:
            return True
        if now < plan.arrival_end:
            return False
        if finish:
            return not window.unfinished or now > plan.arrival_end + finish_cap_s
        # The drain bound: the longest idle prefill in the window is known once arrivals stop.
        return not window.pending or now > plan.arrival_end + DRAIN_S + window.max_floor

    def on_round(record: RoundRecord, outcomes: Sequence[RoundOutcome]) -> None:
        clock[0] = record.clock
        window.round(record, outcomes, open_gaps)
        if client is not None:
            client.on_round(record, outcomes)

    _, extra = run_sim(
        args,
        _Logged(client.wrap(workload) if client is not None else workload, window.issue),  # type: ignore[arg-type]
        # A backstop only: `stop` ends every run first unless a round lasts longer than the bound itself.
        duration=plan.arrival_end + max(finish_cap_s, DRAIN_S) + 3600.0,
        policy_factory=policy_factory,
        on_round=on_round,
        preset=preset,
        stop_when=stop,
        on_start=start,
    )
    return _figures(window, plan, slo, load, exit_slo, finish, extra.rounds, extra.sim_seconds, started)


def _figures(
    window: _Window,
    plan: Plan,
    slo: Slo,
    load: float,
    exit_slo: Slo | None,
    finish: bool,
    rounds: int,
    sim_seconds: float,
    started: float,
) -> Probe:
    requests = list(window.requests.values())
    ttft = np.array([_ttft(r) for r in requests], dtype=np.float64)
    floors = np.array([r.floor for r in requests], dtype=np.float64)
    excess = ttft - floors
    unserved = sum(1 for r in requests if r.first is None)
    ones = [1] * len(requests)
    ttft_p99 = weighted_percentile(ttft.tolist(), ones, 99) if requests else None
    excess_p99 = weighted_percentile(excess.tolist(), ones, 99) if requests else None
    itl = weighted_percentile(window.itl_values, window.itl_weights, 99) if window.itl_weights else None
    good: float | None = None
    share: float | None = None
    if finish and requests:
        count = sum(1 for r, e in zip(requests, excess, strict=True) if e <= slo.ttft_p99_s and _tpot_ok(r, slo))
        good, share = count / plan.window_s, count / len(requests)
    return Probe(
        load=load,
        requests=len(requests),
        offered_rps=len(requests) / plan.window_s,
        ttft_p99_s=ttft_p99,
        ttft_excess_p99_s=excess_p99,
        itl_p99_s=itl,
        output_tok_s=window.tokens / plan.window_s,
        extend_share=window.extend / window.busy if window.busy else None,
        extend_round_s=window.extend_seconds / window.extend if window.extend else None,
        ranks_per_extend=window.ranks_extending / window.extend if window.extend else None,
        wait_growth_s=_wait_growth(requests, excess, plan),
        unserved=unserved,
        cut_short=window.cut_short,
        exit_slo=exit_slo,
        goodput_rps=good,
        good_share=share,
        rounds=rounds,
        sim_seconds=sim_seconds,
        wall_seconds=time.perf_counter() - started,
    )


def _ttft(request: _Request) -> float:
    if request.first is None:
        return math.inf
    return request.first - request.arrival


def _tpot_ok(request: _Request, slo: Slo) -> bool:
    if request.first is None:
        return False
    if request.finish is None or request.output_len <= 1:  # still decoding at the cap: its TTFT decides
        return True
    return (request.finish - request.first) / (request.output_len - 1) <= slo.itl_p99_s


def _wait_growth(requests: Sequence[_Request], excess: np.ndarray, plan: Plan) -> float:
    """Median TTFT excess of the window's last third of arrivals minus that of its first third."""
    if not requests:
        return 0.0
    arrivals = np.array([r.arrival for r in requests])
    third = plan.window_s / 3
    first = excess[arrivals < plan.warmup_end + third]
    last = excess[arrivals >= plan.arrival_end - third]
    if not len(first) or not len(last):
        return 0.0
    growth = float(np.median(last) - np.median(first))
    return growth if not math.isnan(growth) else math.inf
