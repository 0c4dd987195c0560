"""trtllm-balance: TensorRT-LLM's attention-DP balance, restated as a lab peer (PEERS.md policy 7).

Public sources (read for this module; restated, not copied):

- https://nvidia.github.io/TensorRT-LLM/blogs/tech_blog/blog10_ADP_Balance_Strategy.html - the ADP
  balance strategy: hold context requests until every rank has some, so ranks enter the context phase
  together; bounded by a timeout.
- https://nvidia.github.io/TensorRT-LLM/llm-api/reference/AttentionDpConfig.html - `AttentionDpConfig`
  (`enable_balance`, `timeout_iters=50`, `batching_wait_iters=10`).
- https://github.com/NVIDIA/TensorRT-LLM, `tensorrt_llm/_torch/pyexecutor/py_executor.py`,
  `PyExecutor._balance_adp_requests` (later moved unchanged into the scheduler as a `balance_adp_requests`
  helper): one `dist.tp_allgather([num_scheduled_context_requests, num_scheduled_generation_requests,
  num_scheduled_tokens])` per iteration; `all_ranks_have_free_ctx_slots` compares every rank's generation
  count with `max_batch_size`; the `_adp_ctx_waiting_iters_count` / `_adp_ctx_batching_wait_iters_count`
  counters against `attention_dp_time_out_iters` / `attention_dp_batching_wait_iters`.
- The PyExecutor schedules context and generation requests into one batch (inflight batching): TensorRT-LLM
  is a mixed engine, so the lab runs this policy with `enable_mixed_prefill_decode`
  (`engine.policies.registry.MIXED_PREFILL_DECODE`).

The rule, one group decision per round from the gathered counts:

- every rank has context work and a free slot: reset the wait counter; if every rank is also decoding,
  hold `batching_wait_iters` rounds, release on the next and start counting again (so each release is
  preceded by that many held rounds); if some rank is not decoding, release.
- otherwise: count the round and hold, unless the count reached `timeout_iters` or some rank has no
  decode work (it protects nothing), in which case reset and release.

Faithful oddities kept: the wait counter also counts rounds with no context work anywhere (so a prompt
arriving after a long decode stretch can be released by a timeout that was already almost reached),
and the batching counter is not reset by the other branch. Context work is held whatever its kind:
resident chunks are context requests (`Decision.hold_resident_chunks=True`).

Our symbols, per rank r, from the previous round's gathered rows (the one all-gather per round stands in
for TRT-LLM's own `tp_allgather`, so the decision sees rows one round old, like the gate; TRT-LLM
decides on the counts of the batch it is about to run):

- `n_ctx_r > 0` = a resident chunk, or a schedulable new prompt that local admission would take now
  (`waiting_prompts - storage_reads > 0`, occupancy at or under kPrefillWatermark, `running < M`): the
  context requests TRT-LLM's capacity and micro-batch schedulers would hand to the balancer.
- `n_gen_r > 0` = `has_decode_work` (P2).
- free slot = `running - resident_chunks < M` (TRT-LLM compares the generation count with
  `max_batch_size`); `M` = `args.max_batch_size`.
- `n_tok` is gathered by TRT-LLM but does not enter the decision; it is not used here either.

Before the first gather there are no rows: release (no rank has decode work to protect yet).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import ServerArgs
from engine.policy import Decision, LocalView, PrefillPolicy
from engine.rows import Row
from engine.scheduler.plan import K_PREFILL_WATERMARK

TIMEOUT_ITERS = 50
BATCHING_WAIT_ITERS = 10


class TrtllmBalancePolicy(PrefillPolicy):
    """TensorRT-LLM's ADP balance: release context work when every rank has some, or on timeout."""

    name = "trtllm-balance"
    group_decision = True

    def __init__(
        self,
        args: ServerArgs,
        rank: int = 0,
        *,
        timeout_iters: int = TIMEOUT_ITERS,
        batching_wait_iters: int = BATCHING_WAIT_ITERS,
    ) -> None:
        if timeout_iters < 0 or batching_wait_iters < 0:
            raise ValueError(
                f"timeout_iters and batching_wait_iters must be >= 0, got {timeout_iters}, {batching_wait_iters}"
            )
        self.rank = rank
        self.max_running = args.max_batch_size
        self.timeout_iters = timeout_iters
        self.batching_wait_iters = batching_wait_iters
        self.rows: tuple[Row, ...] | None = None
        self.waiting_iters = 0
        self.batching_iters = 0
        self.reason = ""

    def decide(self, local: LocalView) -> Decision:
        allow, self.reason = self._balance()
        return Decision(allow_prefill=allow, hold_resident_chunks=True, counter=self.waiting_iters)

    def observe(self, rows: Sequence[Row]) -> None:
        self.rows = tuple(rows)

    @property
    def counter(self) -> int:
        return self.waiting_iters

    def has_context(self, row: Row) -> bool:
        """`n_ctx_r > 0`: a resident chunk, or a new prompt that local admission would take now."""
        if row.resident_chunks > 0:
            return True
        return (
            row.waiting_prompts - row.storage_reads > 0
            and row.occupancy <= K_PREFILL_WATERMARK
            and row.running < self.max_running
        )

    def _balance(self) -> tuple[bool, str]:
        rows = self.rows
        if rows is None:
            return True, "no-rows"
        all_free = all(row.running - row.resident_chunks < self.max_running for row in rows)
        all_ctx = all(self.has_context(row) for row in rows)
        all_gen = all(row.has_decode_work for row in rows)
        if all_free and all_ctx:
            self.waiting_iters = 0
            if not all_gen:
                return True, "aligned"
            if self.batching_iters < self.batching_wait_iters:
                self.batching_iters += 1
                return False, "batching-wait"
            self.batching_iters = 0
            return True, "batched"
        self.waiting_iters += 1
        if self.waiting_iters >= self.timeout_iters or not all_gen:
            reason = "no-decode" if not all_gen else "timeout"
            self.waiting_iters = 0
            return True, reason
        return False, "wait"
