"""vllm-cadence: vLLM's `--prefill-schedule-interval`, restated as a lab peer (PEERS.md policy 6).

Public sources (read for this module; restated, not copied):

- https://github.com/vllm-project/vllm/pull/44558 - "prefill step cadence for better non-PD DP
  balancing": the DP engine core throttles prefill on every step where `step_counter % N != 0`; the
  scheduler defers all prefill compute on a throttled step (new prompts and in-flight chunks) only if a
  running request can decode instead and the last admitting step was not capacity-bound
  (`prefill_capacity_bound`: after a step that admitted, the waiting queue was still non-empty).
  interval=2 was found best there; 1 turns the cadence off.
- https://github.com/vllm-project/vllm, `vllm/v1/engine/core.py`: `EngineCore.step` passes
  `self._should_throttle_prefills()` to `Scheduler.schedule`; the base `EngineCore._should_throttle_prefills`
  never throttles, `DPEngineCoreProc._should_throttle_prefills` (#44558) throttles on the DP wave's step
  counter when `step % prefill_schedule_interval != 0`.
- `vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`: `defer_prefills = (throttle_prefills and not
  self.prefill_capacity_bound) and any(not r.is_prefill_chunk for r in self.running)`; running prefill chunks
  are skipped and the waiting queue is not scanned on a deferred step; after the waiting phase of a step
  that did not defer, `self.prefill_capacity_bound = bool(self.waiting)`. The same `schedule` batches
  prefill chunks beside the running decodes in one step: vLLM is a mixed engine, so the lab runs this
  policy with `enable_mixed_prefill_decode` (`engine.policies.registry.MIXED_PREFILL_DECODE`).
- the throttle tests #44558 added to `tests/v1/core/test_scheduler.py`, which `tests/test_peer_policies.py`
  replays.

Measured at #44558's own point (bench/results/peer_fidelity.md, SIMULATED on gb200-dp8-vllm: 1k in / 200
out, Poisson 24 req/s, DP8): mixed, interval 2 gives P50 ITL 36.7 ms and TTFT p99 0.91 s (the PR: 32.1 ms
and 1.48 s) where the non-mixed engine gives a P50 ITL of 297 ms; the baseline (`ungated`, mixed) gives
273 ms (the PR: 274.9 ms).

The rule, per rank, no collective of its own: on step s, `throttle = N > 1 and s % N != 0`;
`defer = throttle and not capacity_bound and has_decode_work`; prefill (continuation included, so
`Decision.hold_resident_chunks=True`) is allowed iff not defer. After a round that was not deferred,
`capacity_bound = waiting queue still non-empty`; a deferred round leaves it unchanged, so a
capacity-bound rank stays open until one of its open rounds drains the queue.

Our symbols and choices where the source is silent:

- The shared step counter is the round count since the group's last all-idle round (every gathered row
  has `batch_size == 0`), 0 on the first round. vLLM's DP ranks count from the same wave start, and a
  wave ends when the whole group has no work; the gathered rows already tell every rank when that
  happened, so no extra collective models the wave sync. Every rank therefore throttles on the same
  rounds, but each decides alone (`group_decision = False`): `has_decode_work` and `capacity_bound`
  are the rank's own.
- `has_decode_work` = the fresh `LocalView.has_decode_work` (P2), vLLM's
  `any(not r.is_prefill_chunk for r in running)`.
- the waiting queue = this rank's `waiting_prompts - storage_reads` in its own gathered row (after the
  plan): a prompt still on its storage read is not in vLLM's `waiting` (it sits in `skipped_waiting`).
- vLLM leaves `capacity_bound` unchanged on a pass that preempted (noted in the review of
  https://github.com/ai-dynamo/aisimulate/pull/98); our row does not say whether the plan retracted, so
  every open round updates it.
- interval default 2 (the value #44558 recommends); vLLM's own default is 1 (off).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import ServerArgs
from engine.policy import Decision, LocalView, PrefillPolicy
from engine.rows import Row, all_idle

PREFILL_SCHEDULE_INTERVAL = 2


class VllmCadencePolicy(PrefillPolicy):
    """vLLM's prefill cadence: prefill on every N-th step unless nothing decodes or the queue is backed up."""

    name = "vllm-cadence"

    def __init__(self, args: ServerArgs, rank: int = 0, *, interval: int = PREFILL_SCHEDULE_INTERVAL) -> None:
        if interval < 1:
            raise ValueError(f"prefill_schedule_interval must be >= 1, got {interval}")
        self.rank = rank
        self.interval = interval
        self.step = 0
        self.capacity_bound = False
        self._open = False

    def decide(self, local: LocalView) -> Decision:
        throttle = self.interval > 1 and self.step % self.interval != 0
        defer = throttle and not self.capacity_bound and local.has_decode_work
        self._open = not defer
        return Decision(allow_prefill=not defer, hold_resident_chunks=True, counter=self.step)

    def observe(self, rows: Sequence[Row]) -> None:
        own = rows[self.rank] if len(rows) > self.rank else rows[0]
        if self._open:
            self.capacity_bound = own.waiting_prompts - own.storage_reads > 0
        self.step = 0 if all_idle(rows) else self.step + 1

    @property
    def counter(self) -> int:
        return self.step
