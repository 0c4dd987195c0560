"""Per-rank prefill progress over a run: the lab's measure of the mixed-state feedback loop (sglang#35241).

A rank's *progress* is the prompt tokens it has extended so far (the sum of its rows' `prefill_tokens`),
the same observable sglang#35241 scraped per rank (`realtime_tokens_total`). When every rank of a closed
loop has the same work, a policy that keeps ranks in phase keeps their progress equal; a policy caught in
the feedback loop lets some ranks extend while others wait, and their progress drifts apart. So:

- **spread** at a round = (most progressed rank - least progressed rank) / round budget, in chunks;
- **out-of-phase round** = an extend round in which some rank had prefill work left after its plan
  (a resident chunk or pending prompt tokens) but extended nothing: the group paid the extend path
  while that rank's prompt stood aside, which is how the loop shows in a single round.

Pure: `PhaseTracker.observe` takes round records (or anything with `round`, `clock`, `rows`), so a test
can feed hand-built rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.rows import Row


class RoundLike(Protocol):
    """What the tracker reads of a round record."""

    @property
    def clock(self) -> float: ...

    @property
    def rows(self) -> tuple[Row, ...]: ...


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """One run's per-rank prefill progress, summarised.

    `series` holds `(virtual seconds, spread in chunks)` for every round that changed some rank's
    progress (a chart needs no more); `tokens_per_rank` is each rank's progress at the end.
    """

    budget: int
    tokens_per_rank: tuple[int, ...]
    max_spread_chunks: float
    final_spread_chunks: float
    extend_rounds: int
    out_of_phase_rounds: int
    series: tuple[tuple[float, float], ...]

    @property
    def out_of_phase_share(self) -> float | None:
        """Out-of-phase rounds over extend rounds; None without extend rounds."""
        return self.out_of_phase_rounds / self.extend_rounds if self.extend_rounds else None


class PhaseTracker:
    """Accumulates progress per rank, round by round; `stats()` at any point.

    `keep_series=False` skips the time series (the extend-bound needs only the totals).
    """

    def __init__(self, budget: int, keep_series: bool = True) -> None:
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        self.budget = budget
        self.keep_series = keep_series
        self._tokens: list[int] = []
        self._max_spread = 0
        self._extend_rounds = 0
        self._out_of_phase = 0
        self._series: list[tuple[float, float]] = []

    def observe(self, record: RoundLike) -> None:
        """One round's gathered rows (after the plan: prefill_tokens is what the rank extended)."""
        rows = record.rows
        if len(self._tokens) < len(rows):
            self._tokens.extend([0] * (len(rows) - len(self._tokens)))
        extended = False
        stood_aside = False
        for row in rows:
            if row.prefill_tokens:
                self._tokens[row.rank] += row.prefill_tokens
                extended = True
            elif row.num_extends == 0 and (row.resident_chunks > 0 or row.pending_prefill_tokens > 0):
                stood_aside = True
        if not extended:
            return  # progress unchanged: spread unchanged, nothing to record
        self._extend_rounds += 1
        self._out_of_phase += stood_aside
        spread = max(self._tokens) - min(self._tokens)
        self._max_spread = max(self._max_spread, spread)
        if self.keep_series:
            self._series.append((record.clock, spread / self.budget))

    def stats(self) -> PhaseStats:
        """The run so far."""
        tokens = tuple(self._tokens)
        final = (max(tokens) - min(tokens)) / self.budget if tokens else 0.0
        return PhaseStats(
            budget=self.budget,
            tokens_per_rank=tokens,
            max_spread_chunks=self._max_spread / self.budget,
            final_spread_chunks=final,
            extend_rounds=self._extend_rounds,
            out_of_phase_rounds=self._out_of_phase,
            series=tuple(self._series),
        )


def phase_stats(records: Iterable[RoundLike], budget: int) -> PhaseStats:
    """One-shot `PhaseStats` of a finished sequence of rounds."""
    tracker = PhaseTracker(budget)
    for record in records:
        tracker.observe(record)
    return tracker.stats()


def thin_series(series: Sequence[tuple[float, float]], points: int) -> tuple[tuple[float, float], ...]:
    """At most about `points` samples of a spread series, keeping each bucket's largest spread (peaks
    are what the chart is for); the last sample is always kept."""
    if points < 1:
        raise ValueError(f"points must be >= 1, got {points}")
    if len(series) <= points:
        return tuple(series)
    size = -(-len(series) // points)
    kept = [max(series[i : i + size], key=lambda sample: sample[1]) for i in range(0, len(series), size)]
    if kept[-1] != series[-1]:
        kept.append(series[-1])
    return tuple(kept)
