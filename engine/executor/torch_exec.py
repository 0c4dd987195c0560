"""`TorchExecutor`: one rank's forward of the real MoE model over its paged KV cache (F1, F2).

Per round, after the all-gather:

1. cache operations of the plan, offloads first, then restores (retraction/readmission; local copies);
2. the dispatch mode from the gathered rows (`dispatch_mode`, identical on every rank):
   - NONE: every rank is idle, so no forward and no collective (F2);
   - NORMAL (some rank extends): the eager extend path for every rank, pure-decode and idle ranks
     included, with the NORMAL dispatcher legs (F1);
   - LOW_LATENCY (all decode or idle): the decode step, padded to a batch bucket, with the
     LOW_LATENCY legs; on CUDA the step is replayed from a CUDA graph per bucket (F1).
   An idle rank in a NORMAL or LOW_LATENCY round runs the step with zero (or only padding) tokens,
   so it joins every MoE collective (F2).
3. greedy tokens of the sampling rows, keyed by request id.

Setting the environment variable `PREFILL_GATE_FORWARD_TRACE` to a directory makes every rank append
one line per forward to `forward-rank{r}.log` there: `round mode tokens collectives`, where `tokens`
is the rank's real token count and `collectives` the MoE collectives it issued that round. Tests read
it to check rule F1/F2 on every rank; it costs nothing when unset.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import Tensor

from engine.config import ServerArgs
from engine.executor.base import DispatchMode, ForwardResult, dispatch_mode
from engine.executor.dispatch import low_latency_capacity, make_dispatcher, raise_if_overflow
from engine.executor.kv_cache import PagedKVCache
from engine.executor.model import (
    MoEModel,
    attend,
    attend_paged,
    build_weights,
    model_dtype,
    synthetic_prompt_tokens,
)
from engine.rows import Row
from engine.scheduler.plan import BatchRow, CacheOp, CacheOpKind, Plan

TRACE_ENV = "PREFILL_GATE_FORWARD_TRACE"
GRAPH_WARMUPS = 2


@dataclass(slots=True)
class DecodeInputs:
    """The decode step's inputs for a bucket of B rows (padding rows have `valid` False)."""

    ids: Tensor  # [B] input token
    positions: Tensor  # [B] KV position of the token
    slots: Tensor  # [B] flat KV slot the token's keys/values are written to
    block_table: Tensor  # [B, P] pages of each row (padding: the scratch page)
    lengths: Tensor  # [B] KV entries each row attends to (its position + 1)
    valid: Tensor  # [B] bool: a real row, routed to experts

    def copy_into(self, static: DecodeInputs) -> None:
        """Copy these inputs into a graph's static buffers of the same shapes."""
        for f in fields(self):
            getattr(static, f.name).copy_(getattr(self, f.name))


def decode_buckets(limit: int) -> list[int]:
    """Batch sizes the decode step is padded to: powers of two below `limit`, and `limit`."""
    buckets, size = [], 1
    while size < limit:
        buckets.append(size)
        size *= 2
    return [*buckets, limit]


class TorchExecutor:
    """Runs one rank's part of every round's forward (the `Executor` protocol)."""

    def __init__(self, args: ServerArgs, rank: int, group: Any) -> None:
        self.args = args
        self.rank = rank
        self.size = int(group.size)
        self.device = torch.device(group.device) if hasattr(group, "device") else torch.device(args.device)
        self.dtype = model_dtype(args.device)
        per_rank = args.model_experts // self.size
        weights = build_weights(
            args, device=self.device, dtype=self.dtype, expert_range=(rank * per_rank, (rank + 1) * per_rank)
        )
        self.model = MoEModel(weights, args)
        self.page_size = args.page_size
        self.cache = PagedKVCache(
            args.model_layers,
            args.kv_pages,
            args.page_size,
            args.model_heads,
            args.model_hidden // args.model_heads,
            device=self.device,
            dtype=self.dtype,
        )
        self.capacity = low_latency_capacity(args.moe_low_latency_capacity, args.max_batch_size, args.model_top_k)
        self.dispatcher = make_dispatcher(
            rank=rank,
            size=self.size,
            num_experts=args.model_experts,
            hidden=args.model_hidden,
            capacity=self.capacity,
            max_batch_size=args.max_batch_size,
            device=self.device,
            group=getattr(group, "process_group", None),
        )
        self.buckets = decode_buckets(min(args.cuda_graph_max_batch, args.max_batch_size))
        self._last_token: dict[str, int] = {}
        self._trace = _open_trace(rank)
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda":
            with torch.inference_mode():
                self.graphs = DecodeGraphs(self.decode_step, self._padding_inputs, self.buckets, args.kv_pages)

    # -- the round -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, plan: Plan, rows: Sequence[Row]) -> ForwardResult:
        """Cache ops, then this rank's share of the round's forward in the mode the rows dictate."""
        started = time.perf_counter()
        mode = dispatch_mode(rows)
        self._check_plan(plan, rows)
        completed = self._run_cache_ops(plan.cache_ops)
        before = self.dispatcher.collectives
        batch = plan.rows
        tokens: dict[str, int] = {}
        if mode is DispatchMode.LOW_LATENCY:
            tokens = self._decode_round(batch)
        elif mode is DispatchMode.NORMAL:
            tokens = self._extend_round(batch)
        self._last_token.update(tokens)
        seconds = time.perf_counter() - started
        if self._trace is not None:
            real = sum(row.num_tokens for row in batch)
            self._trace.write(f"{plan.round} {mode.name} {real} {self.dispatcher.collectives - before}\n")
        return ForwardResult(seconds=seconds, mode=mode, tokens=tokens, completed_ops=completed)

    def release(self, rid: str) -> None:
        """Drop the request's host image and last token."""
        self.cache.drop(rid)
        self._last_token.pop(rid, None)

    def close(self) -> None:
        """Close the trace and the dispatcher's buffers; safe to call twice."""
        if self._trace is not None:
            self._trace.close()
            self._trace = None
        self.dispatcher.close()
        self.graphs = None

    # -- phases ----------------------------------------------------------------------------------------

    def _check_plan(self, plan: Plan, rows: Sequence[Row]) -> None:
        """The plan must be the batch this rank published; otherwise the group decided on wrong facts.

        Only this rank raises (a bug, not a condition to recover from); its peers then fail with a
        collective timeout in the round's first MoE collective, which names the round.
        """
        mine = rows[self.rank]
        if (mine.batch_size, mine.num_extends) != (plan.batch_size, plan.num_extends):
            raise RuntimeError(
                f"rank {self.rank} round {plan.round}: plan has {plan.batch_size} rows ({plan.num_extends} "
                f"extending), its gathered row says {mine.batch_size} ({mine.num_extends})"
            )

    def _run_cache_ops(self, ops: list[CacheOp]) -> list[CacheOp]:
        """Offloads first (their pages may be reused this round), then restores; all complete now."""
        for op in ops:
            if op.kind is CacheOpKind.LOAD_PREFIX:
                raise ValueError(
                    f"request {op.rid}: LOAD_PREFIX reached the torch executor, which has no storage tier "
                    f"(the scheduler must refuse prefix hits for it)"
                )
        for op in ops:
            if op.kind is CacheOpKind.OFFLOAD:
                self.cache.offload(op.rid, op.pages, op.num_tokens)
        for op in ops:
            if op.kind is CacheOpKind.RESTORE:
                self.cache.restore(op.rid, op.pages, op.num_tokens)
        return list(ops)

    def _row_tokens(self, row: BatchRow) -> list[int]:
        """The token ids the row feeds: given ids, a derived prompt slice, or the last sampled token."""
        if row.input_tokens is not None:
            if len(row.input_tokens) != row.num_tokens:
                raise ValueError(f"request {row.rid}: {len(row.input_tokens)} input tokens for {row.num_tokens}")
            return list(row.input_tokens)
        if row.extend:
            return synthetic_prompt_tokens(self.args.seed, row.rid, row.start, row.num_tokens, self.args.model_vocab)
        last = self._last_token.get(row.rid)
        if last is None:
            raise RuntimeError(f"request {row.rid}: decode row without an input token")
        return [last]

    # -- NORMAL: the eager extend path -------------------------------------------------------------------

    def _extend_round(self, batch: list[BatchRow]) -> dict[str, int]:
        """Every row type, eager, NORMAL legs; a rank with no rows still joins each layer's legs (F2)."""
        model, cache, device = self.model, self.cache, self.device
        ids: list[int] = []
        positions: list[int] = []
        slots: list[Tensor] = [torch.empty(0, dtype=torch.int64, device=device)]
        spans: list[tuple[int, int, Tensor]] = []  # extend rows: token offset, count, slots of keys 0..end
        decode_at: list[int] = []
        sample_at: list[tuple[str, int]] = []
        for row in batch:
            offset = len(ids)
            ids += self._row_tokens(row)
            positions += range(row.start, row.start + row.num_tokens)
            slots.append(cache.slots(row.pages, row.start, row.num_tokens))
            if row.extend:
                spans.append((offset, row.num_tokens, cache.slots(row.pages, 0, row.start + row.num_tokens)))
            else:
                decode_at.append(offset)
            if row.samples:
                sample_at.append((row.rid, offset + row.num_tokens - 1))
        decode_rows = [row for row in batch if not row.extend]
        table, lengths = self._block_table(decode_rows, pages=max((len(r.pages) for r in decode_rows), default=1))
        ids_t = torch.tensor(ids, dtype=torch.int64, device=device)
        pos_t = torch.tensor(positions, dtype=torch.int64, device=device)
        slots_t = torch.cat(slots)
        decode_t = torch.tensor(decode_at, dtype=torch.int64, device=device)
        x = model.embed(ids_t)
        for layer in range(model.layers):
            q, k, v = model.qkv(layer, x, pos_t)
            cache.write(layer, slots_t, k, v)
            attn = torch.empty_like(q)
            for offset, count, key_slots in spans:
                keys, values = cache.read(layer, key_slots)
                attn[offset : offset + count] = attend(
                    q[offset : offset + count], keys, values, pos_t[offset : offset + count]
                )
            if decode_at:
                attn[decode_t] = attend_paged(
                    q[decode_t], cache.k[layer], cache.v[layer], table, lengths, cache.page_size
                )
            x = x + model.attn_out(layer, attn)
            hn, idx, weights = model.route(layer, x)
            x = x + self.dispatcher.normal(hn, idx, weights, model.experts(layer))
        if not sample_at:
            return {}
        last = torch.tensor([at for _, at in sample_at], dtype=torch.int64, device=device)
        sampled = model.logits(x[last]).argmax(-1).tolist()
        return {rid: int(token) for (rid, _), token in zip(sample_at, sampled, strict=True)}

    # -- LOW_LATENCY: the decode step ------------------------------------------------------------------------

    def _decode_round(self, batch: list[BatchRow]) -> dict[str, int]:
        """Decode rows padded to a bucket; from a CUDA graph when one was captured for the bucket."""
        count = len(batch)
        bucket = next((b for b in self.buckets if b >= count), count)
        self.dispatcher.prepare_low_latency()
        if self.graphs is not None and self.graphs.has(bucket):
            inputs = self._decode_inputs(batch, bucket, pages=self.args.kv_pages)
            tokens, overflow = self.graphs.run(inputs)
            raise_if_overflow(overflow, self.rank, self.capacity)  # the same on every rank (see dispatch)
        else:
            pages = max((len(row.pages) for row in batch), default=1)
            tokens, _ = self.decode_step(self._decode_inputs(batch, bucket, pages=pages), check=True)
        sampled = tokens[:count].tolist()
        return {row.rid: int(token) for row, token in zip(batch, sampled, strict=True)}

    def decode_step(self, inputs: DecodeInputs, check: bool) -> tuple[Tensor, Tensor]:
        """The decode forward with static shapes: greedy tokens [B] and per-source overflow flags [N].

        This body is what a CUDA graph captures; on CPU it runs eagerly on the same padded inputs.
        """
        model, cache = self.model, self.cache
        x = model.embed(inputs.ids)
        overflow = torch.zeros(self.size, dtype=torch.bool, device=self.device)
        for layer in range(model.layers):
            q, k, v = model.qkv(layer, x, inputs.positions)
            cache.write(layer, inputs.slots, k, v)
            attn = attend_paged(q, cache.k[layer], cache.v[layer], inputs.block_table, inputs.lengths, cache.page_size)
            x = x + model.attn_out(layer, attn)
            hn, idx, weights = model.route(layer, x)
            moe, flags = self.dispatcher.low_latency(
                hn, idx, weights, model.experts(layer), token_valid=inputs.valid, check=check
            )
            overflow = overflow | flags
            x = x + moe
        return model.logits(x).argmax(-1), overflow

    def _decode_inputs(self, batch: list[BatchRow], bucket: int, pages: int) -> DecodeInputs:
        """Real rows first, then padding rows that write the scratch page and route nothing."""
        page_size, device = self.page_size, self.device
        inputs = self._padding_inputs(bucket, pages, device=torch.device("cpu"))
        for i, row in enumerate(batch):
            if row.start >= len(row.pages) * page_size:
                raise ValueError(f"request {row.rid}: KV position {row.start} beyond its {len(row.pages)} pages")
            inputs.ids[i] = self._row_tokens(row)[0]
            inputs.positions[i] = row.start
            inputs.slots[i] = row.pages[row.start // page_size] * page_size + row.start % page_size
            inputs.block_table[i, : len(row.pages)] = torch.tensor(row.pages, dtype=torch.int64)
            inputs.lengths[i] = row.start + 1
            inputs.valid[i] = True
        return DecodeInputs(*(getattr(inputs, f.name).to(device) for f in fields(DecodeInputs)))

    def _padding_inputs(self, bucket: int, pages: int, device: torch.device | None = None) -> DecodeInputs:
        """A bucket of padding rows only."""
        device = device if device is not None else self.device
        scratch = self.cache.scratch_page

        def filled(shape: tuple[int, ...], value: int, dtype: torch.dtype = torch.int64) -> Tensor:
            return torch.full(shape, value, dtype=dtype, device=device)

        return DecodeInputs(
            ids=filled((bucket,), 0),
            positions=filled((bucket,), 0),
            slots=filled((bucket,), scratch * self.page_size),
            block_table=filled((bucket, pages), scratch),
            lengths=filled((bucket,), 1),
            valid=filled((bucket,), 0, torch.bool),
        )

    def _block_table(self, rows: list[BatchRow], pages: int) -> tuple[Tensor, Tensor]:
        """Block table [B, pages] (padded with the scratch page) and KV lengths of decode rows."""
        table = torch.full((len(rows), pages), self.cache.scratch_page, dtype=torch.int64)
        for i, row in enumerate(rows):
            table[i, : len(row.pages)] = torch.tensor(row.pages, dtype=torch.int64)
        lengths = torch.tensor([row.start + 1 for row in rows], dtype=torch.int64)
        return table.to(self.device), lengths.to(self.device)


class DecodeGraphs:
    """CUDA graphs of the decode step, one per batch bucket. Unverified on hardware.

    Captured at executor start on every rank, buckets in the same order: the warm-up runs execute the
    LOW_LATENCY collectives for real (all rows padding, so nothing is routed), and their shapes do not
    depend on the bucket, so the ranks' warm-ups pair up even though each later replays its own bucket.
    Block tables are captured at the pool's full width (`kv_pages`), so any request fits; the
    attention gathers that many slots per row, which is the memory price of static shapes. The
    overflow check cannot raise inside a graph: the flags are a graph output, checked after replay.
    """

    def __init__(
        self,
        step: Callable[[DecodeInputs, bool], tuple[Tensor, Tensor]],
        padding_inputs: Callable[[int, int], DecodeInputs],
        buckets: list[int],
        pages: int,
    ) -> None:
        self._entries: dict[int, tuple[torch.cuda.CUDAGraph, DecodeInputs, Tensor, Tensor]] = {}
        pool = torch.cuda.graph_pool_handle()
        for bucket in sorted(buckets, reverse=True):  # largest first: smaller graphs reuse its pool memory
            static = padding_inputs(bucket, pages)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(GRAPH_WARMUPS):
                    step(static, False)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                tokens, overflow = step(static, False)
            self._entries[bucket] = (graph, static, tokens, overflow)

    def has(self, bucket: int) -> bool:
        """Whether a graph was captured for `bucket` rows."""
        return bucket in self._entries

    def run(self, inputs: DecodeInputs) -> tuple[Tensor, Tensor]:
        """Replay the bucket's graph on `inputs`; returns its static token and overflow outputs."""
        graph, static, tokens, overflow = self._entries[int(inputs.ids.shape[0])]
        inputs.copy_into(static)
        graph.replay()
        return tokens, overflow


def _open_trace(rank: int) -> TextIO | None:
    directory = os.environ.get(TRACE_ENV)
    if not directory:
        return None
    return (Path(directory) / f"forward-rank{rank}.log").open("a", buffering=1)  # line-buffered: survives exit
