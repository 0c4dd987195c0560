"""atom-coalescer: ROCm ATOM's prefill coalescer, restated as a lab peer (PEERS.md policy 5).

Public sources (read for this module; restated, not copied):

- https://github.com/ROCm/ATOM/pull/1611 - the coalescer ("Nagle's algorithm for prefill"): one
  `all_reduce(SUM)` of per-rank signals, tick-based bounds, an alignment gate, a fill target, a stall
  give-up; the first call fires.
- https://github.com/ROCm/ATOM/pull/1670 - defaults retuned: TARGET_FILL 0.9, TTFT_MAX_TICKS 200,
  PARTIAL_MAX_TICKS 100, STALL_TICKS 10 (KV_HIGH_WATERMARK 0.9, TOKEN_USAGE_LOW_WATERMARK off).
- https://github.com/ROCm/ATOM, `atom/model_engine/prefill_delayer.py`: `PrefillDelayer.should_allow_prefill`
  (one `all_reduce(SUM)` of an int64 CPU buffer per tick: prefillable, pending tokens, running decode,
  kv-high, kv-low, has-partial, queue-hot flags; then the first-call fire, the vacuous fire, the must-fire
  bounds, the alignment gate, the fill target and the stall give-up in that order), `_fire` and `_reset`
  (every fire resets hold ticks, stall count and the previous sum). The newest stored version adds an
  eighth slot (a prefill ran on the previous tick) and a post-prefill `prefill_decode_interval`, default 0
  (off); not modelled. `tests/test_prefill_delayer.py` holds the cases `tests/test_peer_policies.py`
  replays.

The rule, evaluated once per round on every rank from the same sums (so identical everywhere):
first round fires; no prefillable rank fires (vacuous); must-fire when no rank decodes, when a
prefillable rank is KV-high (U >= 0.9) or KV-low (U < low watermark, off by default), when the hold has
lasted TTFT_MAX_TICKS, or when some rank holds a chunk and the hold has lasted PARTIAL_MAX_TICKS; hold
while fewer than N ranks are prefillable; fire when `sum(T) / (n_prefillable * budget) >= TARGET_FILL`;
fire after STALL_TICKS rounds in which `sum(T)` did not grow; else hold. Every fire resets the episode
(hold ticks, stall count, previous sum). Resident chunks are held too: ATOM's permission covers every
prefill, partials included (`Decision.hold_resident_chunks=True`).

Our symbols, per rank r, from the previous round's gathered rows (our one all-gather per round stands in
for ATOM's SUM all-reduce: each rank sums the gathered rows itself, so the decision sees rows one round
old, like the gate):

- `P_r` = a resident chunk (`resident_chunks > 0`, "a resumable partial") or a schedulable new prompt
  that local admission would take (`waiting_prompts - storage_reads > 0`, occupancy at or under
  kPrefillWatermark (S7), a free batch slot `running < M` (S5)). Our admission refuses new prompts above
  0.9, so KV-high can be raised only by a chunk rank or one at exactly 0.9.
- `T_r` = `pending_prefill_tokens`: fresh + chunk remainder, capped at the round budget, as ATOM sends
  it (ours also counts prompts still on their storage read; the source is silent on such prompts).
- `R_r` = `running - resident_chunks` (ATOM: decode sequences, not counting mid-chunked-prefill ones).
- `C_r` = `resident_chunks > 0` (ATOM's has_partial). `U_r` = row occupancy.
- budget = `args.chunked_prefill_size`; N = rows gathered (dp_size with attention DP, 1 without).
- queue_hot (ATOM's wall-clock `MAX_QUEUE_MS` guard) is off by default in ATOM and not modelled.

Adapting the rule to rows one round old (sources silent): ATOM fires "vacuously" when no rank is
prefillable, because with fresh sums there is nothing to admit and the answer does not matter. On our rows
it means no rank *was* prefillable a round ago, so whatever is prefillable now arrived since and is unseen;
firing would admit every lone arrival at once, which fresh ATOM would hold at its alignment gate (unless
no rank decodes, which fires next round here too). The policy therefore holds on a vacuous tick (reason
"unseen"), resetting the episode as ATOM does. `Coalescer` below
is ATOM's rule itself, driven by the gathered sums as ATOM's tests drive it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.config import ServerArgs
from engine.policy import Decision, LocalView, PrefillPolicy
from engine.rows import Row
from engine.scheduler.plan import K_PREFILL_WATERMARK

TARGET_FILL = 0.9
TTFT_MAX_TICKS = 200
PARTIAL_MAX_TICKS = 100
STALL_TICKS = 10
KV_HIGH_WATERMARK = 0.9


@dataclass(frozen=True, slots=True)
class Signals:
    """One tick's group sums, as ATOM's SUM all-reduce yields them."""

    ranks: int
    prefillable: int
    pending_tokens: int
    running_decode: int
    kv_high: bool = False
    kv_low: bool = False
    partial: bool = False


class Coalescer:
    """ATOM's tick rule and episode state (hold ticks, stall count, previous pending sum)."""

    def __init__(
        self,
        budget: int,
        *,
        target_fill: float = TARGET_FILL,
        ttft_max_ticks: int = TTFT_MAX_TICKS,
        partial_max_ticks: int = PARTIAL_MAX_TICKS,
        stall_ticks: int = STALL_TICKS,
    ) -> None:
        # ATOM clamps bad values with a warning; we refuse them so a lab run never silently changes policy.
        if not 0.0 < target_fill <= 1.0:
            raise ValueError(f"target_fill must be in (0, 1], got {target_fill}")
        for label, ticks in (
            ("ttft_max_ticks", ttft_max_ticks),
            ("partial_max_ticks", partial_max_ticks),
            ("stall_ticks", stall_ticks),
        ):
            if ticks < 1:
                raise ValueError(f"{label} must be >= 1, got {ticks}")
        self.budget = budget
        self.target_fill = target_fill
        self.ttft_max_ticks = ttft_max_ticks
        self.partial_max_ticks = partial_max_ticks
        self.stall_ticks = stall_ticks
        self.first = True
        self.hold_ticks = 0
        self.stall = 0
        self.prev_pending = -1

    def tick(self, signals: Signals | None) -> tuple[bool, str]:
        """(fire, reason) for one tick, advancing the episode; None: no sums yet (only the first tick)."""
        if self.first or signals is None:
            self.first = False  # the first call fires to seed the decode batch
            return self._fire("first")
        if signals.prefillable == 0:
            return self._fire("vacuous")
        if signals.running_decode == 0:
            return self._fire("nodecode")
        if signals.kv_high or signals.kv_low:
            return self._fire("kv")
        if self.hold_ticks >= self.ttft_max_ticks:
            return self._fire("ttft")
        if signals.partial and self.hold_ticks >= self.partial_max_ticks:
            return self._fire("partial")
        if signals.prefillable < signals.ranks:
            return self._hold("align")
        if signals.pending_tokens / (signals.prefillable * self.budget) >= self.target_fill:
            return self._fire("fill")
        self.stall = self.stall + 1 if signals.pending_tokens <= self.prev_pending else 0
        self.prev_pending = signals.pending_tokens
        if self.stall >= self.stall_ticks:
            return self._fire("stall")
        return self._hold("fill-wait")

    def _fire(self, reason: str) -> tuple[bool, str]:
        self.hold_ticks = 0
        self.stall = 0
        self.prev_pending = -1
        return True, reason

    def _hold(self, reason: str) -> tuple[bool, str]:
        self.hold_ticks += 1
        return False, reason


class AtomCoalescerPolicy(PrefillPolicy):
    """ROCm ATOM's coalescer: hold prefill until the group's pending tokens fill a worthwhile forward."""

    name = "atom-coalescer"
    group_decision = True

    def __init__(
        self,
        args: ServerArgs,
        rank: int = 0,
        *,
        target_fill: float = TARGET_FILL,
        ttft_max_ticks: int = TTFT_MAX_TICKS,
        partial_max_ticks: int = PARTIAL_MAX_TICKS,
        stall_ticks: int = STALL_TICKS,
        kv_high_watermark: float = KV_HIGH_WATERMARK,
        token_usage_low_watermark: float | None = None,
    ) -> None:
        self.coalescer = Coalescer(
            args.chunked_prefill_size,
            target_fill=target_fill,
            ttft_max_ticks=ttft_max_ticks,
            partial_max_ticks=partial_max_ticks,
            stall_ticks=stall_ticks,
        )
        self.rank = rank
        self.max_running = args.max_batch_size
        self.kv_high_watermark = kv_high_watermark
        self.token_usage_low_watermark = token_usage_low_watermark
        self.rows: tuple[Row, ...] | None = None
        self.reason = ""

    def decide(self, local: LocalView) -> Decision:
        fire, reason = self.coalescer.tick(self.signals())
        if reason == "vacuous":
            fire, reason = False, "unseen"  # see the module docstring
        self.reason = reason
        return Decision(allow_prefill=fire, hold_resident_chunks=True, counter=self.counter)

    def observe(self, rows: Sequence[Row]) -> None:
        self.rows = tuple(rows)

    @property
    def counter(self) -> int:
        return self.coalescer.hold_ticks

    def prefillable(self, row: Row) -> bool:
        """`P_r`: a resident chunk, or a new prompt that local admission would take now."""
        if row.resident_chunks > 0:
            return True
        return (
            row.waiting_prompts - row.storage_reads > 0
            and row.occupancy <= K_PREFILL_WATERMARK
            and row.running < self.max_running
        )

    def signals(self) -> Signals | None:
        """The group sums of the last observed rows (None before the first gather)."""
        rows = self.rows
        if rows is None:
            return None
        prefillable = [self.prefillable(row) for row in rows]
        # ATOM raises the KV flags only from ranks that have prefill to push.
        usage = [row.occupancy for p, row in zip(prefillable, rows, strict=True) if p]
        low = self.token_usage_low_watermark
        return Signals(
            ranks=len(rows),
            prefillable=sum(prefillable),
            pending_tokens=sum(row.pending_prefill_tokens for row in rows),
            running_decode=sum(row.running - row.resident_chunks for row in rows),
            kv_high=any(u >= self.kv_high_watermark for u in usage),
            kv_low=low is not None and any(u < low for u in usage),
            partial=any(row.resident_chunks > 0 for row in rows),
        )
