"""Run metrics: from round records, request events and inter-token latency samples to one summary.

Pure: no I/O, no clock. The same code summarises a simulated run (virtual clock), a `serve` run with
the torch executor (wall clock) and every cell of the lab. Times are whatever clock the records and
events were stamped with; request arrival times must be on that same clock.

Percentiles are nearest-rank on the (weighted) empirical distribution: the p-th percentile is the
smallest value whose cumulative weight reaches p% of the total weight. No interpolation, so every
reported value is one that was observed, and a hand-computed example checks exactly.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from engine.gate import GatePoint
from engine.record import RoundRecord
from engine.request import Admitted, Finished, FinishReason, FirstToken, Refused, RequestEvent, RequestSpec, Retracted
from engine.rows import all_idle


def weighted_percentile(values: Sequence[float], weights: Sequence[int | float], q: float) -> float | None:
    """Nearest-rank weighted percentile: the smallest value v with weight(<= v) >= q% of the total.

    Returns None when there is no positive weight. `q` is in [0, 100]; q=0 gives the smallest value.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    vals = np.asarray(values, dtype=np.float64)
    wts = np.asarray(weights, dtype=np.float64)
    keep = wts > 0
    if not keep.any():
        return None
    vals, wts = vals[keep], wts[keep]
    order = np.argsort(vals, kind="stable")
    cumulative = np.cumsum(wts[order])
    # Compare cum * 100 with q * total so that integer weights and integer q stay exact.
    index = int(np.searchsorted(cumulative * 100.0, q * cumulative[-1], side="left"))
    return float(vals[order][min(index, len(vals) - 1)])


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of unweighted samples; None for no samples."""
    return weighted_percentile(values, [1] * len(values), q)


@dataclass(frozen=True, slots=True)
class Summary:
    """One run in numbers. Latencies in seconds; None where no sample exists.

    - rounds: rounds recorded; busy_rounds: those that ran a forward (not all-idle).
    - extend_rounds: busy rounds on the extend path (`all_decode_or_idle` false, F1);
      extend_round_share = extend_rounds / busy_rounds; extend_time_share the same by forward time.
    - mean_ranks_extending: ranks with `num_extends > 0`, averaged over extend rounds.
    - windows_any / windows_all: busy rounds decided open at an ANY / ALL point (record.point, record.open);
      an open vote in an all-idle round opens nothing and is not counted.
    - gate_wait_*: how long admitted prompts waited while schedulable (Admitted.wait_rounds/wait_seconds).
    - output_tokens: first tokens plus decode tokens (the ITL samples' counts) produced in the run.
    - prompt_tokens: prompt tokens of the submitted requests; prefix_hit_requests / prefix_hit_tokens:
      those submitted with a cached prefix (`RequestSpec.prefix_hit`: a storage hit or a trace's prefix
      blocks met in a rank's cache) and its tokens, which need no prefill; prefix_hit_share =
      prefix_hit_tokens / prompt_tokens.
    """

    rounds: int
    busy_rounds: int
    elapsed_s: float
    output_tokens: int
    output_tokens_per_s: float | None
    requests_submitted: int
    requests_finished: int
    requests_aborted: int
    requests_refused: int
    retractions: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    extend_rounds: int
    extend_round_share: float | None
    extend_time_share: float | None
    mean_ranks_extending: float | None
    windows_any: int
    windows_all: int
    gate_wait_max_rounds: int
    gate_wait_p99_rounds: float | None
    gate_wait_max_s: float
    gate_wait_p99_s: float | None
    prompt_tokens: int = 0
    prefix_hit_requests: int = 0
    prefix_hit_tokens: int = 0
    prefix_hit_share: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        """Field name to value, in declaration order."""
        return asdict(self)


class RunMetrics:
    """Accumulates one run's records, events and ITL samples; `summary()` at any point.

    Keeps counters and compact arrays only (no records), so a 100k-round run costs a few MB. With
    `max_samples` (a server that runs for days) each latency array keeps its newest samples only: past
    the bound the oldest half is dropped, and the percentiles describe the recent past. `summary()` is
    cached until something new arrives, so a dashboard polling it costs nothing between rounds.
    """

    def __init__(self, max_samples: int | None = None) -> None:
        if max_samples is not None and max_samples < 2:
            raise ValueError(f"max_samples must be >= 2, got {max_samples}")
        self.max_samples = max_samples
        self._version = 0
        self._summary: tuple[int, Summary] | None = None
        self.rounds = 0
        self.busy_rounds = 0
        self.extend_rounds = 0
        self.ranks_extending = 0
        self.busy_seconds = 0.0
        self.extend_seconds = 0.0
        self.windows_any = 0
        self.windows_all = 0
        self.start: float | None = None
        self.end = 0.0
        self.submitted = 0
        self.finished = 0
        self.aborted = 0
        self.refused = 0
        self.retractions = 0
        self.first_tokens = 0
        self.prompt_tokens = 0
        self.prefix_hit_requests = 0
        self.prefix_hit_tokens = 0
        self._arrival: dict[str, float] = {}
        self._ttft = array("d")
        self._itl = array("d")
        self._itl_weight = array("q")
        self._wait_rounds = array("q")
        self._wait_seconds = array("d")

    # -- inputs ------------------------------------------------------------------------------------

    def add_submitted(self, spec: RequestSpec) -> None:
        """A request was handed to a rank; its `arrival` is the TTFT origin."""
        self._version += 1
        self.submitted += 1
        self._arrival[spec.rid] = spec.arrival
        self.prompt_tokens += spec.prompt_len
        if spec.prefix_hit:
            self.prefix_hit_requests += 1
            self.prefix_hit_tokens += spec.prefix_hit

    def add_arrivals(self, arrivals: Mapping[str, float]) -> None:
        """Arrival times by request id, for inputs that are not RequestSpecs."""
        self._version += 1
        self.submitted += len(arrivals)
        self._arrival.update(arrivals)

    def arrival(self, rid: str) -> float | None:
        """The arrival time of a submitted request that has not ended (None when unknown)."""
        return self._arrival.get(rid)

    def add_record(self, record: RoundRecord) -> None:
        """One round record (rank 0's)."""
        self._version += 1
        self.rounds += 1
        if self.start is None:
            self.start = record.clock - record.round_seconds
        self.end = record.clock
        rows = record.rows
        if all_idle(rows):
            return  # an all-idle round runs no forward (F2)
        self.busy_rounds += 1
        self.busy_seconds += record.round_seconds
        if not record.all_decode_or_idle:
            self.extend_rounds += 1
            self.extend_seconds += record.round_seconds
            self.ranks_extending += sum(1 for row in rows if row.num_extends > 0)
        if record.open:
            if record.point is GatePoint.ANY:
                self.windows_any += 1
            elif record.point is GatePoint.ALL:
                self.windows_all += 1

    def add_events(self, events: Iterable[RequestEvent]) -> None:
        """Request events of any rank."""
        self._version += 1
        for event in events:
            if isinstance(event, FirstToken):
                self.first_tokens += 1
                arrival = self._arrival.get(event.rid)
                if arrival is not None:
                    self._ttft.append(event.time - arrival)
                    self._trim(self._ttft)
            elif isinstance(event, Finished):
                self._arrival.pop(event.rid, None)
                if event.reason is FinishReason.ABORT:
                    self.aborted += 1
                else:
                    self.finished += 1
            elif isinstance(event, Admitted):
                self._wait_rounds.append(event.wait_rounds)
                self._wait_seconds.append(event.wait_seconds)
                self._trim(self._wait_rounds, self._wait_seconds)
            elif isinstance(event, Refused):
                self._arrival.pop(event.rid, None)
                self.refused += 1
            elif isinstance(event, Retracted):
                self.retractions += 1

    def add_itl(self, samples: Iterable[tuple[float, int]]) -> None:
        """Inter-token latency samples: (seconds since the previous token, requests that waited so long)."""
        self._version += 1
        for seconds, count in samples:
            self._itl.append(seconds)
            self._itl_weight.append(count)
        self._trim(self._itl, self._itl_weight)

    # -- output ------------------------------------------------------------------------------------

    def summary(self) -> Summary:
        """The run so far (cached until the next input)."""
        cached = self._summary
        if cached is not None and cached[0] == self._version:
            return cached[1]
        summary = self._compute()
        self._summary = (self._version, summary)
        return summary

    def _trim(self, *arrays: array) -> None:
        """Keep the newest half of parallel sample arrays once they pass `max_samples`."""
        if self.max_samples is None or len(arrays[0]) <= self.max_samples:
            return
        drop = len(arrays[0]) // 2
        for values in arrays:
            del values[:drop]

    def _compute(self) -> Summary:
        elapsed = self.end - self.start if self.start is not None else 0.0
        output_tokens = self.first_tokens + int(sum(self._itl_weight))
        ttft = self._ttft.tolist()
        waits = self._wait_rounds.tolist()
        wait_s = self._wait_seconds.tolist()
        return Summary(
            rounds=self.rounds,
            busy_rounds=self.busy_rounds,
            elapsed_s=elapsed,
            output_tokens=output_tokens,
            output_tokens_per_s=output_tokens / elapsed if elapsed > 0 else None,
            requests_submitted=self.submitted,
            requests_finished=self.finished,
            requests_aborted=self.aborted,
            requests_refused=self.refused,
            retractions=self.retractions,
            ttft_p50_s=percentile(ttft, 50),
            ttft_p99_s=percentile(ttft, 99),
            itl_p50_s=weighted_percentile(self._itl, self._itl_weight, 50),
            itl_p99_s=weighted_percentile(self._itl, self._itl_weight, 99),
            extend_rounds=self.extend_rounds,
            extend_round_share=self.extend_rounds / self.busy_rounds if self.busy_rounds else None,
            extend_time_share=self.extend_seconds / self.busy_seconds if self.busy_seconds > 0 else None,
            mean_ranks_extending=self.ranks_extending / self.extend_rounds if self.extend_rounds else None,
            windows_any=self.windows_any,
            windows_all=self.windows_all,
            gate_wait_max_rounds=max(waits, default=0),
            gate_wait_p99_rounds=percentile(waits, 99),
            gate_wait_max_s=max(wait_s, default=0.0),
            gate_wait_p99_s=percentile(wait_s, 99),
            prompt_tokens=self.prompt_tokens,
            prefix_hit_requests=self.prefix_hit_requests,
            prefix_hit_tokens=self.prefix_hit_tokens,
            prefix_hit_share=self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else None,
        )


def summarize(
    records: Iterable[RoundRecord],
    events: Iterable[RequestEvent],
    itl: Iterable[tuple[float, int]],
    arrivals: Mapping[str, float] | Iterable[RequestSpec] = (),
) -> Summary:
    """One-shot summary of a finished run's inputs. `arrivals` maps request ids to arrival times
    (or lists the submitted RequestSpecs); TTFT counts only requests whose arrival is known."""
    metrics = RunMetrics()
    if isinstance(arrivals, Mapping):
        metrics.add_arrivals(arrivals)
    else:
        for spec in arrivals:
            metrics.add_submitted(spec)
    for record in records:
        metrics.add_record(record)
    metrics.add_events(events)
    metrics.add_itl(itl)
    return metrics.summary()
