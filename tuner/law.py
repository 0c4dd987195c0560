"""The control law: from the window's estimates and the intervals in force, the intervals to move to.

Pure and stateless: `decide` is a function of (estimates, intervals, SLO, settings). Guards that need
history (dwell, rate cap, an operator's change, noisy estimates) live in `tuner.core`. The rules, in
the order they are tried (docs/autotune.md gives the reasons):

1. gate off: switch it on (A=1, K from the TTFT budget) when ITL is over budget; otherwise keep it off.
2. overload (waiting prompts grow through the window, or TTFT is over budget by more than K rounds could
   account for: the queue's wait, not the gate's): batch more per window, A x2 (A=K: both x2, K never
   past the whole TTFT budget in rounds): extend rounds are what the group cannot afford.
3. TTFT over budget: K down through the measured round time, `K + (target*S - p99) / round`; when the
   ALL point opens most windows (a window every < K/2 rounds) A is halved too: its wait is the one paid
   (and at A=1 nothing is left for the gate to give: hold).
4. ITL over budget: when few decode tokens wait an extend round (<= max_step x the 1% tail), fewer extend
   rounds first (one bounded step takes them out of the tail, however long the round); else when an extend
   round of one prompt would fit the budget, smaller windows (A, then K, halved) make every extend round
   short; when even one prompt's round is too long, fewer extend rounds (K and A up) is the only way, as far
   as the TTFT budget allows. Prompts that come in bursts can defeat that model (a burst makes long rounds
   whatever the window): the tuner then remembers which way its last ITL change moved the tail and keeps or
   reverses it, and holds once neither way moved it (`Memory`): the cost of one extend round, not the
   intervals, then sets the p99.
4b. ITL p99 past the budget within the noise, few tokens waiting an extend round, TTFT under its target:
   fewer extend rounds, by A where the ALL point opens (it gathers a burst into one window), by K where it
   never does; not again once such a change did not shrink the tail.
5. both within budget: at low load (the ALL point rarely finds every rank ready) with TTFT past the slack
   mark, halve A towards 1 (the ALL point's wait is then the TTFT it costs; with TTFT slack, A is left
   alone, since bursts that reach every rank at once are batched by it), unless the ALL point never opens,
   the ITL tail has no room or the load comes in bursts; with room on both percentiles and the ITL tail
   (and some prefill in the window to judge by), K up towards the TTFT target (more batching, fewer extend
   rounds), but never back to a K where a budget broke recently.

"Over budget" is the p99 past the budget and its tail past the noise (`ttft_over`, `itl_over`): more samples
past the budget than the 1% a p99 allows, by `confidence` Poisson deviations, in both halves of the window.

Every interval moves by at most `max_step` x per change, some interval by at least `min_change` (smaller
moves are noise), and C2 holds: K >= A >= 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.estimates import TAIL, Estimates, Tail


@dataclass(frozen=True, slots=True)
class Slo:
    """The latency objective: p99 time to first token and p99 inter-token latency, in seconds."""

    ttft_p99_s: float
    itl_p99_s: float

    def __post_init__(self) -> None:
        for name, value in (("TTFT p99", self.ttft_p99_s), ("ITL p99", self.itl_p99_s)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"the {name} budget must be a number of seconds > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Intervals:
    """The gate's intervals: (A, K), or the gate off (both None)."""

    attempt: int | None
    any: int | None

    def __post_init__(self) -> None:
        if (self.attempt is None) != (self.any is None):
            raise ValueError(f"set both intervals or neither, got A={self.attempt} K={self.any}")
        if self.attempt is not None and not 1 <= self.attempt <= (self.any or 0):
            raise ValueError(f"intervals must satisfy K >= A >= 1 (C2), got A={self.attempt} K={self.any}")

    @property
    def enabled(self) -> bool:
        """The gate is on."""
        return self.attempt is not None

    def __str__(self) -> str:
        return f"A={self.attempt} K={self.any}" if self.enabled else "gate off"


OFF = Intervals(None, None)


@dataclass(frozen=True, slots=True)
class LawSettings:
    """The law's constants (docs/autotune.md says how each was chosen)."""

    target: float = 0.8  # aim a percentile at this fraction of its budget
    slack: float = 0.6  # below this fraction of its budget a percentile leaves room to batch more
    max_step: float = 2.0  # an interval moves by at most this factor per change
    min_change: float = 0.1  # a change that moves no interval by this share (and 1) is noise, not worth it
    max_interval: int = 256
    overload_prompts_per_rank: float = 2.0  # backlog growth through the window that counts as falling behind
    low_ready_share: float = 0.2  # below it the ALL point rarely finds every decoding rank ready: low load
    min_ready_share: float = 0.01  # below it the ALL point (nearly) never opens: A costs and batches nothing
    may_switch_on: bool = True  # the law may switch the gate on when it finds it off (never off: docs/autotune.md)
    confidence: float = 2.0  # a tail past its budget counts beyond this many Poisson deviations (Tail.breached)

    def __post_init__(self) -> None:
        if not 0 < self.slack < self.target < 1:
            raise ValueError(f"need 0 < slack < target < 1, got slack={self.slack} target={self.target}")
        if not self.max_step > 1:
            raise ValueError(f"max_step must be > 1, got {self.max_step}")
        if self.max_interval < 1:
            raise ValueError(f"max_interval must be >= 1, got {self.max_interval}")


SMALLER = "smaller windows"
FEWER = "fewer extend rounds"
HOLD = "hold"  # neither way moved the ITL p99: the load or the cost of one extend round sets it


@dataclass(frozen=True, slots=True)
class Memory:
    """What the tuner learnt from its own earlier changes (the law itself keeps nothing).

    `itl_way`: the way (SMALLER or FEWER) to answer an ITL over budget, with `itl_why`, when an earlier
    change showed which one works, HOLD when neither did (None: the law asks its model); `grow_below`: a K
    at which a budget broke recently, which slack never grows K back to; `fewer_failed`: the last change
    toward fewer extend rounds did not shrink the ITL tail (one burst still needs its extend round).
    """

    itl_way: str | None = None
    itl_why: str = ""
    grow_below: int | None = None
    fewer_failed: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the law wants: new intervals (None: keep those in force) and why, in one line; `way` names the
    ITL rule's direction when that rule decided."""

    target: Intervals | None
    reason: str
    way: str | None = None


def _over(p99: float | None, budget: float, tail: Tail | None, law: LawSettings) -> bool:
    """The p99 past its budget, and (when the window counted them) its tail past the noise (`Tail.breached`)."""
    if p99 is None or p99 <= budget:
        return False
    return tail is None or tail.breached(law.confidence)


def ttft_over(est: Estimates, slo: Slo, law: LawSettings = LawSettings()) -> bool:
    """TTFT over budget: the p99 past it, and more first tokens past it than the 1% tail allows, beyond the
    noise and in both halves of the window."""
    return _over(est.ttft_p99_s, slo.ttft_p99_s, est.ttft_tail, law)


def itl_over(est: Estimates, slo: Slo, law: LawSettings = LawSettings()) -> bool:
    """ITL over budget: as `ttft_over`, counting the rounds whose gaps were past the budget."""
    return _over(est.itl_p99_s, slo.itl_p99_s, est.itl_tail, law)


def decide(
    est: Estimates, now: Intervals, slo: Slo, law: LawSettings = LawSettings(), memory: Memory = Memory()
) -> Verdict:
    """The law (module docstring). `est` must hold latency samples (the caller's noise guard)."""
    t = est.decode_round_s
    if t is None or t <= 0:
        return Verdict(None, "no busy decode round in the window: nothing to measure K against")
    ttft, itl = est.ttft_p99_s, est.itl_p99_s
    if ttft is None or itl is None:
        return Verdict(None, "no latency samples in the window")
    round_ms = f"round time {t * 1e3:.0f} ms"
    ttft_text = f"TTFT p99 {_s(ttft)}"
    itl_text = f"ITL p99 {itl * 1e3:.0f} ms"
    # Rounds of gate wait the TTFT budget leaves at the target, from where the window measured it.
    k_room = now.any + (law.target * slo.ttft_p99_s - ttft) / t if now.any is not None else None
    budget_rounds = max(1, math.floor(slo.ttft_p99_s / t))

    over_ttft, over_itl = ttft_over(est, slo, law), itl_over(est, slo, law)
    if not now.enabled:
        if over_itl and law.may_switch_on:
            k = _clamp(math.floor((law.target * slo.ttft_p99_s - ttft) / t), 1, min(budget_rounds, law.max_interval))
            reason = f"{itl_text} > {_ms(slo.itl_p99_s)} budget with the gate off at {round_ms} -> gate on A=1 K={k}"
            return Verdict(Intervals(1, k), reason)
        return Verdict(None, f"gate off; {itl_text} within {_ms(slo.itl_p99_s)}")
    a, k = now.attempt, now.any
    assert a is not None and k is not None and k_room is not None

    threshold = law.overload_prompts_per_rank * max(est.ranks, 1)
    # The gate holds a prompt at most about K rounds (the ANY point): TTFT further over budget than that is
    # the queue's, which fewer, fuller extend rounds drain faster, and which a smaller K would only feed.
    queued = ttft - k * t > law.target * slo.ttft_p99_s
    if est.backlog_growth > threshold or (over_ttft and queued):
        if est.backlog_growth > threshold:
            behind = f"waiting prompts grew by {est.backlog_growth:.0f} to {est.waiting_end:.0f} in {est.span_s:.0f} s"
        else:
            behind = f"{ttft_text} is more than K={k} rounds ({_s(k * t)}) over the budget: the queue sets it"
        if a < k:
            new_a = _step(a, a * 2, law)
            return _verdict(now, Intervals(min(new_a, k), k), f"{behind}: batch more per window", law)
        cap = min(budget_rounds, law.max_interval)
        if k < cap:
            new_k = min(_step(k, k * 2, law), cap)
            return _verdict(now, Intervals(new_k, new_k), f"{behind}: batch more per window", law)
        return Verdict(None, f"{behind}, at the largest intervals the TTFT budget allows (K={k})")

    if over_ttft:
        if k == 1:
            return Verdict(None, f"{ttft_text} > {_s(slo.ttft_p99_s)} budget at K=1: the load, not the gate, sets it")
        new_k = _step(k, max(1, math.floor(k_room)), law)
        why = f"{ttft_text} > {_s(slo.ttft_p99_s)} budget at {round_ms}"
        window = est.window_rounds
        if window is not None and window < k / 2:
            # The ALL point opens most windows long before K: the wait that costs TTFT is A's.
            why += f", a window every {window:.0f} rounds"
            if a == 1:
                return Verdict(None, f"{why} at A=1: the excess is not the gate's wait")
            return _verdict(now, Intervals(min(_step(a, a // 2, law), new_k), new_k), why, law)
        return _verdict(now, Intervals(min(a, new_k), new_k), why, law)

    room = min(math.floor(k_room), budget_rounds, law.max_interval)
    # Few decode tokens wait an extend round (at most max_step x the tail, and every slow token is one of
    # them): fewer extend rounds, by one bounded step, take the waits out of the 1% tail.
    ext, tail = est.extend_token_share, est.itl_tail
    few = ext is not None and 0 < ext <= law.max_step * TAIL and (tail is None or tail.share <= ext)
    if over_itl:
        why = f"{itl_text} > {_ms(slo.itl_p99_s)} budget"
        one = est.one_prompt_extend_s
        way = memory.itl_way
        opens = est.ready_share >= law.min_ready_share  # A batches only where the ALL point opens
        if way is None and few and (room > k or (opens and a < k)):
            # Halving the extend rounds takes every waited token out of the 1% tail, however long the round.
            way = FEWER
            why += f", {_pct(est.extend_token_share)} of decode tokens waited an extend round"
        elif way is None:
            way = SMALLER if one is None or one <= law.target * slo.itl_p99_s else FEWER
            size = f"{_ms(one)}" if one is not None else "an unknown time"
            why += f", an extend round of one prompt takes {size}"
        else:
            why += f", {memory.itl_why}"
        if way == HOLD:
            return Verdict(None, f"{why}: the intervals cannot fix it, holding")
        if way == FEWER and (room > k or (few and opens and a < k)):
            new_k = _step(k, room, law) if room > k else k
            return _verdict(now, Intervals(min(_step(a, a * 2, law), new_k), new_k), f"{why}: {FEWER}", law, FEWER)
        if way == FEWER:
            return Verdict(None, f"{why}, but the TTFT budget leaves no room for fewer extend rounds")
        if a > 1:
            return _verdict(now, Intervals(_step(a, a // 2, law), k), f"{why}: {SMALLER}", law, SMALLER)
        return _verdict(now, Intervals(1, _step(k, max(1, k // 2), law)), f"{why}: {SMALLER}", law, SMALLER)

    tipped = itl > slo.itl_p99_s and not memory.fewer_failed
    if tipped and tail is not None and few and ttft <= law.target * slo.ttft_p99_s:
        # Near the 1% the p99 allows, one burst more tips the p99 from a decode round to an extend round; so
        # few tokens wait an extend round that halving those rounds keeps the tail well inside it.
        why = (
            f"{itl_text} > {_ms(slo.itl_p99_s)} within the noise: {_pct(tail.share)} of decode tokens past it, "
            f"{_pct(est.extend_token_share)} waited an extend round"
        )
        if est.ready_share >= law.min_ready_share:
            # Prompts reach every rank together: the ALL point's A gathers them, by the rounds of wait the
            # TTFT target leaves (K, the lone prompt's wait and the TTFT tail, moves only to keep K >= A).
            wait = math.floor((law.target * slo.ttft_p99_s - ttft) / t)
            new_a = max(a, min(_step(a, a * 2, law), a + wait))
            new_k = max(k, new_a)
        else:
            # Only the ANY point opens windows: K within its room, not past the TTFT target in rounds nor
            # back to a K where a budget broke lately.
            grow = min(room, math.floor(law.target * slo.ttft_p99_s / t))
            grow = grow if memory.grow_below is None else min(grow, memory.grow_below - 1)
            new_a, new_k = a, _step(k, grow, law) if grow > k else k
        if (new_a, new_k) != (a, k):
            return _verdict(now, Intervals(new_a, new_k), f"{why}: {FEWER}", law, FEWER)
    itl_room = tail is None or tail.share <= law.slack * TAIL
    # Bursts: prefill wanted on few rounds, and on half of those by every decoding rank at once; the ALL
    # point's wait is then what gathers a burst into one window, not a cost to cut.
    wanting = est.wanting_share
    bursts = wanting is not None and wanting < law.low_ready_share and est.ready_share >= wanting / 2
    low = law.min_ready_share <= est.ready_share < law.low_ready_share and a > 1 and ttft >= law.slack * slo.ttft_p99_s
    if low and itl_room and not bursts:
        why = f"low load (every decoding rank ready on {est.ready_share:.0%} of rounds): open the ALL point sooner"
        return _verdict(now, Intervals(_step(a, a // 2, law), k), why, law)
    if ttft < law.slack * slo.ttft_p99_s and itl < law.slack * slo.itl_p99_s and itl_room and est.extend_share > 0:
        # Grown on slack, K stops at the TTFT target in rounds: a lone prompt held K rounds still meets it.
        room = min(math.floor(k_room), math.floor(law.target * slo.ttft_p99_s / t), law.max_interval)
        if memory.grow_below is not None:
            room = min(room, memory.grow_below - 1)  # a budget broke at that K not long ago
        if room > k:
            why = (
                f"{ttft_text} and {itl_text} under {law.slack:.0%} of their budgets at {round_ms}: "
                "batch more per window"
            )
            return _verdict(now, Intervals(a, _step(k, room, law)), why, law)
    if ttft > slo.ttft_p99_s or itl > slo.itl_p99_s:
        return Verdict(None, f"within the noise: {ttft_text}, {itl_text}, {_tails(est)}: not a breach to act on")
    return Verdict(None, f"within budget: {ttft_text} <= {_s(slo.ttft_p99_s)}, {itl_text} <= {_ms(slo.itl_p99_s)}")


def _tails(est: Estimates) -> str:
    parts = [
        f"{name} past the budget on {tail.events} {what} ({tail.allowed:.1f} allowed; {tail.early} + {tail.late})"
        for name, tail, what in (("TTFT", est.ttft_tail, "first tokens"), ("ITL", est.itl_tail, "rounds"))
        if tail is not None
    ]
    return "; ".join(parts) or "no tail counted"


def _pct(share: float | None) -> str:
    return f"{(share or 0.0) * 100:.2g}%"


def _verdict(now: Intervals, target: Intervals, why: str, law: LawSettings, way: str | None = None) -> Verdict:
    """A change from `now` to `target` (C2 enforced), with its reason: `why -> K 32->24`."""
    k = _clamp(target.any or 1, 1, law.max_interval)
    a = _clamp(target.attempt or 1, 1, k)
    target = Intervals(a, k)
    if target == now:
        return Verdict(None, f"{why}, but the intervals are already at their bound ({now})")
    if now.enabled and all(abs(new - old) < law.min_change * old for old, new in _pairs(now, target)):
        return Verdict(None, f"{why}, but {target} is within {law.min_change:.0%} of {now}: not worth a change")
    moved = [
        f"{name} {old}->{new}"
        for name, old, new in (("A", now.attempt, target.attempt), ("K", now.any, target.any))
        if old != new
    ]
    return Verdict(target, f"{why} -> {', '.join(moved)}", way)


def _pairs(now: Intervals, target: Intervals) -> list[tuple[int, int]]:
    return [(now.attempt or 0, target.attempt or 0), (now.any or 0, target.any or 0)]


def _step(old: int, wanted: int, law: LawSettings) -> int:
    """`wanted`, but at most `max_step` x away from `old`, and at least 1 away when it moves at all."""
    high = max(old + 1, math.floor(old * law.max_step))
    low = min(old - 1, math.ceil(old / law.max_step))
    return max(1, min(high, max(low, wanted))) if wanted != old else old


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"
