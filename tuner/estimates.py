"""What the tuner knows about the engine: estimates over a sliding window of round records.

Pure: the window is fed `prefill_gate.v1.RoundRecord`s (what any client of the control plane reads)
and time is the records' engine clock, never a clock read here. The window keeps only what the law
needs per round (a few numbers and the round's latency samples), for the last `span_s` engine seconds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.metrics import percentile, weighted_percentile
from prefill_gate.v1 import types_pb2 as pb


@dataclass(frozen=True, slots=True)
class RoundFacts:
    """One round as the estimates use it."""

    round: int
    clock: float  # engine clock at the end of the round
    seconds: float  # round_seconds
    busy: bool  # some rank ran a forward
    opened: bool  # the vote opened a window (any point)
    extend: bool  # the group was on the extend path (F1)
    prefill_tokens: int  # prompt tokens every rank extended
    max_prefill_tokens: int  # the busiest rank's: the round lasts as long as its slowest rank (F3)
    waiting: int  # new prompts waiting on every rank, after the plan
    ready: bool  # the ALL condition held on this round's rows: every decoding rank wanted prefill
    wanting: bool  # some rank wanted prefill
    ttft: tuple[float, ...]
    itl: tuple[tuple[float, int], ...]


def facts_of(record: pb.RoundRecord) -> RoundFacts:
    """The few numbers of a record the estimates need."""
    rows = record.ranks
    return RoundFacts(
        round=record.round,
        clock=record.clock_seconds,
        seconds=record.round_seconds,
        busy=any(row.batch_size for row in rows),
        opened=record.open,
        extend=not record.all_decode_or_idle,
        prefill_tokens=sum(row.prefill_tokens for row in rows),
        max_prefill_tokens=max((row.prefill_tokens for row in rows), default=0),
        waiting=sum(row.waiting_prompts for row in rows),
        ready=all(row.want_prefill or not row.has_decode_work for row in rows),
        wanting=any(row.want_prefill for row in rows),
        ttft=tuple(record.ttft_seconds),
        itl=tuple(zip(record.itl_seconds, record.itl_tokens, strict=True)),
    )


# The share of samples a p99 leaves above its bound.
TAIL = 0.01


@dataclass(frozen=True, slots=True)
class Tail:
    """The samples of one percentile past its budget, over the window (a p99 allows `TAIL` of them).

    - `share`: samples past the budget (first tokens; for ITL decode tokens, weighted like the p99);
    - `events`: what they came in: first tokens, or for ITL the rounds whose gaps were past it (one slow
      round delays every decoding sequence at once, so the tokens are not independent; the rounds are);
    - `allowed`: the events the `TAIL` share would have made (for ITL: `events` scaled by TAIL / share);
    - `early`, `late`: events in the first and in the second half of the window's span.
    """

    share: float
    events: int
    allowed: float
    early: int
    late: int

    def breached(self, z: float) -> bool:
        """Past the budget beyond the noise: more events than the tail allows by `z` Poisson standard
        deviations, in both halves of the window (one burst is not a trend)."""
        return self.events > self.allowed + z * math.sqrt(self.allowed) and self.early > 0 and self.late > 0


@dataclass(frozen=True, slots=True)
class Estimates:
    """The window in numbers. Latencies in seconds; None where the window holds no sample.

    - `decode_round_s`: median length of the window's busy all-decode rounds: what one round of K costs.
    - `extend_round_s`: median length of its extend rounds.
    - `window_rounds`: busy rounds per window the vote opened (how often prefill actually got its chance;
      well under K when the ALL point opens most windows).
    - `prompt_tokens`: prompt tokens extended per first token (the mean prompt, prefix hits excluded).
    - `one_prompt_extend_s`: how long an extend round takes when the busiest rank extends one such prompt,
      from a line fitted through the window's extend rounds (length against the busiest rank's tokens);
      None when the window cannot tell (too few extend rounds, or all the same size and not one prompt).
    - `arrival_per_s`: first tokens per second (prompts admitted and prefilled: the load the group serves).
    - `ready_share`: busy rounds on which every decoding rank wanted prefill (the ALL point would open):
      near 0 at low load, near 1 when every rank always has a prompt waiting.
    - `backlog_growth`: waiting prompts at the end of the window minus at its start (means of its last
      and first quarters): positive and large when the group cannot keep up.
    - `ttft_tail`, `itl_tail`: the samples past the TTFT and ITL budgets (`Tail`); None when the window
      was not asked about a budget (then the p99 alone says whether it is over).
    - `extend_token_share`: decode tokens whose gap ended in an extend round, over all decode tokens: the
      most that fewer extend rounds can take out of the ITL tail.
    - `wanting_share`: busy rounds on which some rank wanted prefill; low when prompts come in bursts.
    """

    ranks: int
    rounds: int
    span_s: float
    busy_rounds: int
    extend_share: float
    decode_round_s: float | None
    extend_round_s: float | None
    window_rounds: float | None
    prompt_tokens: float | None
    one_prompt_extend_s: float | None
    ttft_p99_s: float | None
    ttft_samples: int
    itl_p99_s: float | None
    itl_tokens: int
    arrival_per_s: float
    ready_share: float
    waiting_end: float
    backlog_growth: float
    ttft_tail: Tail | None = None
    itl_tail: Tail | None = None
    extend_token_share: float | None = None
    wanting_share: float | None = None


class Window:
    """The last `span_s` engine seconds of rounds, all under one config (the tuner clears it on a change)."""

    def __init__(self, span_s: float) -> None:
        if not span_s > 0:
            raise ValueError(f"the window must span > 0 s, got {span_s}")
        self.span_s = span_s
        self.ranks = 0
        self._rounds: deque[RoundFacts] = deque()

    def __len__(self) -> int:
        return len(self._rounds)

    @property
    def last(self) -> RoundFacts | None:
        """The newest round held."""
        return self._rounds[-1] if self._rounds else None

    def clear(self) -> None:
        """Forget every round (a gap in the stream, a new config, a new run)."""
        self._rounds.clear()

    def add(self, facts: RoundFacts, ranks: int) -> None:
        """Append a round of `ranks` ranks; rounds older than the span fall out."""
        self.ranks = ranks
        self._rounds.append(facts)
        while self._rounds and facts.clock - self._rounds[0].clock > self.span_s:
            self._rounds.popleft()

    def estimates(self, ttft_budget_s: float | None = None, itl_budget_s: float | None = None) -> Estimates:
        """The window's figures (see `Estimates`); the tails past the budgets given."""
        rounds = list(self._rounds)
        busy = [f for f in rounds if f.busy]
        decode = [f.seconds for f in busy if not f.extend]
        extending = [f for f in busy if f.extend]
        extend = [f.seconds for f in extending]
        ttft = [s for f in rounds for s in f.ttft]
        prompt = sum(f.prefill_tokens for f in rounds) / len(ttft) if ttft else None
        itl = [pair for f in rounds for pair in f.itl]
        span = rounds[-1].clock - rounds[0].clock + rounds[0].seconds if rounds else 0.0
        quarter = max(1, len(rounds) // 4)
        head = rounds[:quarter]
        tail = rounds[-quarter:]
        return Estimates(
            ranks=self.ranks,
            rounds=len(rounds),
            span_s=span,
            busy_rounds=len(busy),
            extend_share=len(extend) / len(busy) if busy else 0.0,
            decode_round_s=percentile(decode, 50),
            extend_round_s=percentile(extend, 50),
            window_rounds=len(busy) / opened if (opened := sum(1 for f in busy if f.opened)) else None,
            prompt_tokens=prompt,
            one_prompt_extend_s=_one_prompt_round(extending, prompt),
            ttft_p99_s=percentile(ttft, 99),
            ttft_samples=len(ttft),
            itl_p99_s=weighted_percentile([s for s, _ in itl], [n for _, n in itl], 99),
            itl_tokens=sum(n for _, n in itl),
            arrival_per_s=len(ttft) / span if span > 0 else 0.0,
            ready_share=sum(1 for f in busy if f.ready and f.wanting) / len(busy) if busy else 0.0,
            waiting_end=_mean(f.waiting for f in tail),
            backlog_growth=_mean(f.waiting for f in tail) - _mean(f.waiting for f in head),
            ttft_tail=_ttft_tail(rounds, ttft_budget_s) if ttft_budget_s is not None else None,
            itl_tail=_itl_tail(rounds, itl_budget_s) if itl_budget_s is not None else None,
            extend_token_share=_share(sum(n for f in rounds if f.extend for _, n in f.itl), itl),
            wanting_share=sum(1 for f in busy if f.wanting) / len(busy) if busy else None,
        )


def _share(part: int, itl: list[tuple[float, int]]) -> float | None:
    total = sum(n for _, n in itl)
    return part / total if total else None


def _halves(rounds: list[RoundFacts], hit: list[int]) -> tuple[int, int]:
    """Events (per round, `hit`) in the first and in the second half of the rounds' span."""
    middle = (rounds[0].clock + rounds[-1].clock) / 2 if rounds else 0.0
    early = sum(h for f, h in zip(rounds, hit, strict=True) if f.clock <= middle)
    return early, sum(hit) - early


def _ttft_tail(rounds: list[RoundFacts], budget: float) -> Tail:
    hit = [sum(1 for s in f.ttft if s > budget) for f in rounds]
    samples = sum(len(f.ttft) for f in rounds)
    events = sum(hit)
    return Tail(events / samples if samples else 0.0, events, TAIL * samples, *_halves(rounds, hit))


def _itl_tail(rounds: list[RoundFacts], budget: float) -> Tail:
    hit = [1 if any(s > budget for s, _ in f.itl) else 0 for f in rounds]
    tokens = sum(n for f in rounds for _, n in f.itl)
    slow = sum(n for f in rounds for s, n in f.itl if s > budget)
    share = slow / tokens if tokens else 0.0
    events = sum(hit)
    allowed = events * TAIL / share if share > 0 else 0.0
    return Tail(share, events, allowed, *_halves(rounds, hit))


def _one_prompt_round(extending: list[RoundFacts], prompt: float | None) -> float | None:
    """Extend-round length at one prompt on the busiest rank (see `Estimates.one_prompt_extend_s`)."""
    if prompt is None or len(extending) < 5:
        return None
    tokens = np.array([f.max_prefill_tokens for f in extending], dtype=np.float64)
    seconds = np.array([f.seconds for f in extending], dtype=np.float64)
    if np.ptp(tokens) > 0:
        slope, intercept = np.polyfit(tokens, seconds, 1)
        return float(intercept + max(slope, 0.0) * prompt)
    return float(np.median(seconds)) if tokens[0] <= 1.5 * prompt else None


def _mean(values: object) -> float:
    items = list(values)  # type: ignore[call-overload]
    return sum(items) / len(items) if items else 0.0
