"""sglang-delayer: SGLang's `PrefillDelayer`, restated as a lab peer (PEERS.md policy 4).

Public sources (read for this module; restated, not copied):

- https://github.com/sgl-project/sglang/pull/16269 - the delayer: every DP rank all-gathers whether it is
  prefillable; status ALL (every rank), NONE (no rank) or MIXED; MIXED delays up to `max_delay_passes`.
- https://github.com/sgl-project/sglang/pull/17456 - the ALL-branch slot condition
  `max_running_requests - max(running_batch) < max(max_prefill_bs)`, skipped once the first time it fires
  (`skip_first_delayer`: the first merge must not leave the decode batch short for good).
- https://github.com/sgl-project/sglang/pull/32880 - the ALL-branch delay bounded by the same pass cap
  (released as `wait_timeout`), and `max_prefill_bs` decayed by 0.998 per pass instead of a lifetime peak.
- https://github.com/sgl-project/sglang/pull/31835 - prefillable is negotiated after the KV-budget
  admission checks: a rank that could not admit its head prompt is not prefillable.
- https://github.com/sgl-project/sglang, `python/sglang/srt/managers/prefill_delayer.py`:
  `PrefillDelayer._negotiate_should_allow_prefill_pure` (the status ALL/NONE/MIXED from the gathered
  flags; the NONE branch allows, "it does not matter whether we allow or not"; the MIXED branch's
  `delayed_count < max_delay_passes - 1` test and `wait_timeout`; the ALL branch's watermark valve and
  `slot_trigger = max_running_requests - max(running_batch) < max(max_prefill_bs)` with
  `skip_first_delayer`), `PrefillDelayer._gather_info` (one `all_gather_into_tensor` of five int64 per rank:
  prefillable, watermark force-allow, running batch, max prefill batch, waiting queue length, on the CPU
  group, inside the scheduling pass) and `PrefillDelayerSinglePassExecutor.negotiate_should_allow_prefill`
  / `finalize` (at most one negotiation per pass; a pass that never asked negotiates with
  `local_prefillable=False`). The newest stored version no longer caps the ALL branch's slot-trigger delay
  by `max_delay_passes` ("slot_trigger is a hard capacity constraint ... must not be overridden by the
  timeout"); this module keeps #32880's cap, as PEERS.md describes the policy.
- `test/registered/scheduler/test_prefill_delayer.py` (the negotiate table that `tests/test_peer_policies.py`
  replays).

The rule (one group decision per round, identical on every rank):

- NONE: allow (on our stale rows the policy holds instead, see below).
- MIXED: allow if some prefillable rank is under the low token watermark (off by default), else deny up
  to `max_delay_passes - 1` consecutive rounds and allow the next (`wait_timeout`).
- ALL: the watermark valve as in MIXED; then, while the slot condition holds, deny under the same pass
  cap; the first time the slot condition holds in the policy's life it is skipped (allowed) instead.
- Resident chunks always continue: the delayer gates admission of new prompts only
  (`Decision.hold_resident_chunks=False`).

Our symbols, per rank r, from the previous round's gathered rows (our engine has exactly one all-gather
per round; SGLang's own all-gather of `[P, WM, R, B, Q]` is modelled by it, so the delayer decides on
rows one round old, like the gate - SGLang negotiates on fresh values inside the plan):

- `M` = `args.max_batch_size` (SGLang's per-rank `max_running_requests`).
- `P_r` = the rank has a schedulable new prompt (`waiting_prompts - storage_reads > 0`), its pool is
  at or under kPrefillWatermark (S7), it has a free batch slot (`running < M`, S5), and no resident
  chunk. The last clause is our reading of "a rank whose round budget is taken by its chunk reports
  P=false": the row does not carry the chunk's remainder, and an incomplete chunk after the plan has
  usually just taken the whole budget (S8), so a chunk rank reports false. Source silent on storage
  reads; ours cannot be admitted until their read completes, so they do not count.
- `WM_r` = `P_r` and occupancy `U_r` < `token_usage_low_watermark` (None: off, SGLang's default).
- `R_r` = `running - resident_chunks`: SGLang's running batch holds decoding requests, not the chunk.
- `B_r` = requests in the rank's extend batch (`num_extends`, chunk continuation included, as
  SGLang's `can_run_list` includes the chunked request), kept as `max(0.998 * B_r, num_extends)`
  each observed round (#32880). The comparison uses the float, not SGLang's int() truncation, which
  https://github.com/sgl-project/sglang/pull/34284 reports lets small peaks fall to 0 after one pass.
- `Q_r` = `waiting_prompts`: SGLang gathers it for its queue trigger
  (https://github.com/sgl-project/sglang/pull/23189), which is opt-in (`--prefill-delayer-queue-min-ratio`)
  and not modelled here.

What differs from SGLang, and why NONE holds here by default. SGLang gathers its flags inside the
scheduling pass, after the pass has taken in new requests: it decides on the current state. Our engine has
one all-gather per round, after the plan (R2), so every rank decides round r+1 on the rows of round r: the
state after round r's plan, before round r+1's intake. Exactly what the rows miss: requests that arrived
since the gather (and storage reads that completed), and slots freed by round r's finishes. Everything
else SGLang gathers is in the rows. The round structure therefore forbids deciding on the current state
(another collective before the plan would be needed, which R2 excludes).

On those rows SGLang's literal NONE rule (allow) never lets a prompt be seen waiting: a prompt that arrives
into a group whose rows said NONE is admitted by its rank's next plan, so no later row shows it prefillable,
MIXED never occurs and the delayer never delays; it becomes `ungated`. Measured (bench/results/
peer_fidelity.md, SIMULATED, default preset, scale 0.3): with `allow_on_none=True` the policy gives exactly
ungated's figures on long-chunked (219 extend rounds), long-chunked-offset and osl-variance (206 extend
rounds, 1.64 ranks per extend round) and nearly on scattered (extend share 0.43 against ungated's 0.44,
TTFT p99 15.9 s). Holding on NONE (the default, `allow_on_none=False`, reason "none", no delay pass
counted) applies SGLang's rule one round late instead: the arrival is seen in the next rows and MIXED or
ALL decide as in SGLang. Its cost is that round: on long-chunked, whose closed-loop prompts all arrive into
NONE rows, 236 extend rounds against 219 (+7.8%) at 49.4k against 49.6k prompt tokens/s; where arrivals
meet other ranks' work it is what keeps the delayer a delayer (scattered: extend share 0.18, 7.98 ranks
per extend round, TTFT p99 1.3 s; osl-variance: 76 extend rounds, 7.86 ranks per extend round). Before the
first gather there are no rows: NONE, handled the same way. `negotiate` below is SGLang's rule itself
(NONE allows), as its tests state it; the lab may sweep `allow_on_none` to show both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.config import ServerArgs
from engine.policy import Decision, LocalView, PrefillPolicy
from engine.rows import Row
from engine.scheduler.plan import K_PREFILL_WATERMARK

MAX_DELAY_PASSES = 30
MAX_PREFILL_BS_DECAY = 0.998


@dataclass(frozen=True, slots=True)
class Negotiation:
    """One negotiation's outcome; `delayed` None means no wait is in progress (SGLang's `_State` None)."""

    allow: bool
    reason: str
    delayed: int | None
    skip_first: bool


def negotiate(
    prefillable: Sequence[bool],
    force_allow: Sequence[bool],
    running: Sequence[int],
    max_prefill_bs: Sequence[float],
    *,
    max_running: int,
    delayed: int | None,
    skip_first: bool,
    max_delay_passes: int,
) -> Negotiation:
    """SGLang's negotiation over the gathered per-rank symbols, reasons named as SGLang names them.

    `prefillable` is P, `force_allow` is WM, `running` is R, `max_prefill_bs` is B, one entry per rank;
    `delayed` and `skip_first` are the state carried from the previous negotiation.
    """

    def delay_or_timeout() -> Negotiation:
        count = delayed or 0
        if count < max_delay_passes - 1:
            return Negotiation(False, "delay", count + 1, skip_first)
        return Negotiation(True, "wait_timeout", None, skip_first)

    if not any(prefillable):
        # SGLang: with nothing prefillable the answer does not matter, so it allows.
        return Negotiation(True, "", None, skip_first)
    if any(force_allow):
        return Negotiation(True, "token_watermark", None, skip_first)
    if not all(prefillable):
        return delay_or_timeout()
    if max_running - max(running) < max(max_prefill_bs):
        if not skip_first:
            return delay_or_timeout()
        skip_first = False  # the first slot-condition hit is let through (sglang#17456)
    return Negotiation(True, "wait_success" if delayed is not None else "no_wait", None, skip_first)


class SGLangDelayerPolicy(PrefillPolicy):
    """SGLang's PrefillDelayer: ALL/NONE/MIXED over the gathered prefillable flags, bounded delays."""

    name = "sglang-delayer"
    group_decision = True

    def __init__(
        self,
        args: ServerArgs,
        rank: int = 0,
        *,
        max_delay_passes: int = MAX_DELAY_PASSES,
        token_usage_low_watermark: float | None = None,
        max_prefill_bs_decay: float = MAX_PREFILL_BS_DECAY,
        allow_on_none: bool = False,
    ) -> None:
        if max_delay_passes < 1:
            raise ValueError(f"max_delay_passes must be >= 1, got {max_delay_passes}")
        if not 0.0 < max_prefill_bs_decay <= 1.0:
            raise ValueError(f"max_prefill_bs_decay must be in (0, 1], got {max_prefill_bs_decay}")
        self.rank = rank
        self.max_running = args.max_batch_size
        self.max_delay_passes = max_delay_passes
        self.token_usage_low_watermark = token_usage_low_watermark
        self.decay = max_prefill_bs_decay
        self.allow_on_none = allow_on_none
        self.rows: tuple[Row, ...] | None = None
        self.max_prefill_bs: list[float] = []
        self.delayed: int | None = None
        self.skip_first = True
        self.reason = ""

    def decide(self, local: LocalView) -> Decision:
        allow = self._decide()
        return Decision(allow_prefill=allow, hold_resident_chunks=False, counter=self.counter)

    def observe(self, rows: Sequence[Row]) -> None:
        if len(self.max_prefill_bs) != len(rows):
            self.max_prefill_bs = [0.0] * len(rows)
        self.max_prefill_bs = [
            max(peak * self.decay, float(row.num_extends)) for peak, row in zip(self.max_prefill_bs, rows, strict=True)
        ]
        self.rows = tuple(rows)

    @property
    def counter(self) -> int:
        return self.delayed or 0

    def prefillable(self, row: Row) -> bool:
        """`P_r`: a new prompt that local admission would take now, with no chunk holding the budget."""
        return (
            row.waiting_prompts - row.storage_reads > 0
            and row.occupancy <= K_PREFILL_WATERMARK
            and row.running < self.max_running
            and row.resident_chunks == 0
        )

    def _decide(self) -> bool:
        rows = self.rows
        if rows is None:  # before the first gather: NONE on no rows (see the module docstring)
            self.reason = "none"
            return self.allow_on_none
        prefillable = [self.prefillable(row) for row in rows]
        low = self.token_usage_low_watermark
        outcome = negotiate(
            prefillable,
            [p and low is not None and row.occupancy < low for p, row in zip(prefillable, rows, strict=True)],
            [row.running - row.resident_chunks for row in rows],
            self.max_prefill_bs,
            max_running=self.max_running,
            delayed=self.delayed,
            skip_first=self.skip_first,
            max_delay_passes=self.max_delay_passes,
        )
        self.delayed, self.skip_first = outcome.delayed, outcome.skip_first
        if outcome.reason == "":
            self.reason = "none"  # SGLang allows; on rows a round old we hold by default (module docstring)
            return self.allow_on_none
        self.reason = outcome.reason
        return outcome.allow
