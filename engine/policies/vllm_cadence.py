"""vllm-cadence: vLLM's `--prefill-schedule-interval`, restated as a lab peer (PEERS.md policy 6).

Public sources (read for this module; restated, not copied):

- https://github.com/vllm-project/vllm/pull/44558 - "prefill step cadence for better non-PD DP
  balancing": the DP engine core throttles prefill on every step where `step_counter % N != 0`; the
  scheduler defers all prefill compute on a throttled step (new prompts and in-flight chunks) only if a
  running request can decode instead and the last admitting step was not capacity-bound
  (`prefill_capacity_bound`: after a step that admitted, the waiting queue was still non-empty).
  interval=2 was found best there; 1 turns the cadence off.
- `vllm/v1/engine/core.py` (`DPEngineCoreProc._should_throttle_prefills`), `vllm/v1/core/sched/scheduler.py`
  and the throttle tests #44558 added to `tests/v1/core/test_scheduler.py`, which
  `tests/test_peer_policies.py` replays.

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
