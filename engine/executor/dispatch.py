"""Expert dispatch/combine with the two legs of rule F1.

Attention is data parallel (every rank runs its own batch); experts are sharded (rank r owns experts
[r*E/N, (r+1)*E/N)). Per MoE layer, every token's top-k (token, expert) pairs travel to the ranks
owning those experts and the expert outputs travel back:

- NORMAL (rounds where some rank extends): exchange per-rank pair counts, then a variable-size
  all-to-all of the pairs; the combine is the reverse all-to-all with the split sizes swapped.
- LOW_LATENCY (all-decode rounds): a fixed capacity of C pairs per (source, destination) rank pair,
  so one padded all-to-all each way with shapes that never depend on the batch (CUDA-graph friendly).
  A source that routes more than C pairs to one destination marks every chunk it sends with an
  overflow sentinel; every rank sees the mark in the same collective and raises
  `LowLatencyCapacityError` at the same point, so nobody is left waiting in the combine.

The source rank sums the k returned contributions in slot order (`combine_in_slot_order`), so the
result does not depend on which rank computed what. Implementations: `AllToAllDispatcher`
(`torch.distributed.all_to_all_single`; gloo on CPU, NCCL on CUDA) and `DeepEPDispatcher`
(`deep_ep.Buffer`, CUDA only; chosen by `make_dispatcher` when `deep_ep` imports).

Every rank must make the same sequence of collective calls: a rank with no tokens still calls each
one with empty inputs (F2); a rank that skipped one would leave its peers blocked in it until the
group's timeout.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from engine.executor.model import LayerExperts, combine_in_slot_order

EMPTY_SLOT = -1.0  # expert-id column of an unused low-latency slot
OVERFLOW_MARK = -2.0  # expert-id column of every slot a source sends when it overflowed the capacity
MAX_IDS_IN_PAYLOAD = 256  # integers bfloat16 represents exactly


class LowLatencyCapacityError(RuntimeError):
    """A rank routed more pairs to one destination than the low-latency capacity allows."""


class Dispatcher(Protocol):
    """Moves (token, expert) pairs to the experts' ranks and the outputs back; counts its collectives."""

    collectives: int

    def normal(self, x: Tensor, topk_idx: Tensor, topk_weights: Tensor, experts: LayerExperts) -> Tensor:
        """NORMAL legs: combined expert output [T, H] of tokens `x` [T, H]."""
        ...

    def low_latency(
        self,
        x: Tensor,
        topk_idx: Tensor,
        topk_weights: Tensor,
        experts: LayerExperts,
        token_valid: Tensor | None = None,
        check: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """LOW_LATENCY legs: combined output [T, H] and, per source rank, whether it overflowed [N] (bool).

        `token_valid` [T] masks padding rows (they route nothing); `check=False` defers the overflow
        error to the caller (inside a CUDA graph nothing may raise).
        """
        ...

    def prepare_low_latency(self) -> None:
        """Called before every LOW_LATENCY round, outside any CUDA graph (cleans state NORMAL legs left)."""
        ...

    def close(self) -> None:
        """Free communication buffers; safe to call twice."""
        ...


def raise_if_overflow(overflow_from: Tensor, rank: int, capacity: int) -> None:
    """Raise LowLatencyCapacityError when any source rank overflowed (the same answer on every rank)."""
    if bool(overflow_from.any()):
        sources = [int(r) for r in overflow_from.nonzero().flatten().tolist()]
        raise LowLatencyCapacityError(
            f"rank {rank}: low-latency dispatch overflow from rank(s) {sources}: more than "
            f"{capacity} (token, expert) pairs for one destination rank; raise --moe-low-latency-capacity "
            f"(0 means the per-rank batch times top-k, which never overflows)"
        )


class AllToAllDispatcher:
    """Both legs over `torch.distributed.all_to_all_single` (the process group of the rank's `TorchGroup`)."""

    def __init__(
        self,
        rank: int,
        size: int,
        num_experts: int,
        capacity: int,
        group: Any = None,
    ) -> None:
        if num_experts % size:
            raise ValueError(f"{num_experts} experts do not shard evenly over {size} ranks")
        if capacity < 1:
            raise ValueError(f"low-latency capacity must be >= 1, got {capacity}")
        if num_experts // size > MAX_IDS_IN_PAYLOAD:
            raise ValueError(
                f"{num_experts // size} experts per rank: local ids ride in the payload's float column, "
                f"exact only up to {MAX_IDS_IN_PAYLOAD} in bfloat16"
            )
        self.rank = rank
        self.size = size
        self.experts_per_rank = num_experts // size
        self.capacity = capacity
        self.group = group
        self.collectives = 0

    def _pairs(self, x: Tensor, topk_idx: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per (token, slot) pair p = t*k + s: destination rank, local expert id, and the token's row."""
        flat = topk_idx.reshape(-1)
        return flat // self.experts_per_rank, flat % self.experts_per_rank, x.repeat_interleave(topk_idx.shape[1], 0)

    def _payload(self, rows: Tensor, local: Tensor) -> Tensor:
        """Token rows with their local expert id as one extra column, so one collective carries both."""
        return torch.cat((rows, local.to(rows.dtype)[:, None]), dim=1)

    # -- NORMAL -----------------------------------------------------------------------------------------

    def normal(self, x: Tensor, topk_idx: Tensor, topk_weights: Tensor, experts: LayerExperts) -> Tensor:
        tokens, top_k = topk_idx.shape
        hidden = x.shape[1]
        dst, local, rows = self._pairs(x, topk_idx)
        order = torch.argsort(dst, stable=True)
        send_counts = torch.bincount(dst, minlength=self.size)
        recv_counts = torch.empty_like(send_counts)
        # Counts leg. Every rank calls it once per MoE layer of a NORMAL round, zero tokens included:
        # a rank that skipped it would leave the others blocked here until the collective timeout.
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        self.collectives += 1
        send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
        received = x.new_empty(sum(recv_split), hidden + 1)
        # Dispatch leg, sized by the counts just exchanged; same callers as the counts leg.
        dist.all_to_all_single(
            received,
            self._payload(rows[order], local[order]),
            output_split_sizes=recv_split,
            input_split_sizes=send_split,
            group=self.group,
        )
        self.collectives += 1
        out = experts.by_id(received[:, :hidden], received[:, hidden].long())
        back = x.new_empty(tokens * top_k, hidden)
        # Combine leg: the dispatch reversed (splits swapped). Every rank that dispatched must combine,
        # or the sources of the pairs it holds wait here forever.
        dist.all_to_all_single(back, out, output_split_sizes=send_split, input_split_sizes=recv_split, group=self.group)
        self.collectives += 1
        pair_out = torch.empty_like(back)
        pair_out[order] = back
        return combine_in_slot_order(pair_out.view(tokens, top_k, hidden), topk_weights)

    # -- LOW_LATENCY --------------------------------------------------------------------------------------

    def low_latency(
        self,
        x: Tensor,
        topk_idx: Tensor,
        topk_weights: Tensor,
        experts: LayerExperts,
        token_valid: Tensor | None = None,
        check: bool = True,
    ) -> tuple[Tensor, Tensor]:
        tokens, top_k = topk_idx.shape
        hidden, size, cap = x.shape[1], self.size, self.capacity
        dst, local, rows = self._pairs(x, topk_idx)
        valid = torch.ones_like(dst, dtype=torch.bool) if token_valid is None else token_valid.repeat_interleave(top_k)
        # Position of each pair inside its destination's chunk: a running count per destination.
        # (A comparison, not one_hot: one_hot may validate its input on the host, which a graph cannot.)
        onehot = ((dst[:, None] == torch.arange(size, device=dst.device)) & valid[:, None]).long()
        position = (onehot.cumsum(0) - 1).gather(1, dst[:, None]).squeeze(1)
        overflowed = (onehot.sum(0) > cap).any()
        kept = valid & (position < cap)
        index = torch.where(kept, dst * cap + position, size * cap)  # the last row is a discard row
        send = x.new_zeros(size * cap + 1, hidden + 1)
        send[:, hidden] = EMPTY_SLOT
        send[index] = self._payload(rows, local)
        send[:, hidden] = torch.where(overflowed, OVERFLOW_MARK, send[:, hidden])
        received = torch.empty_like(send[: size * cap])
        # Dispatch leg: equal splits of C slots per destination. Every rank calls it once per MoE layer
        # of a LOW_LATENCY round, idle ranks with all-empty slots (F2); a missing rank blocks the rest.
        dist.all_to_all_single(received, send[: size * cap], group=self.group)
        self.collectives += 1
        ids = received[:, hidden]
        overflow_from = (ids.view(size, cap) == OVERFLOW_MARK).any(1)
        if check:
            # Every rank received every source's mark in the same collective, so all raise here together
            # and none waits in the combine below.
            raise_if_overflow(overflow_from, self.rank, cap)
        out = experts.masked(received[:, :hidden], ids.long())
        back = torch.empty_like(out)
        # Combine leg: the same equal splits back to the sources; same callers as the dispatch leg.
        dist.all_to_all_single(back, out, group=self.group)
        self.collectives += 1
        pair_out = torch.cat((back, back.new_zeros(1, hidden)))[index]  # dropped pairs read the zero row
        return combine_in_slot_order(pair_out.view(tokens, top_k, hidden), topk_weights), overflow_from

    def prepare_low_latency(self) -> None:
        return None

    def close(self) -> None:
        return None


class DeepEPDispatcher:
    """Both legs through one `deep_ep.Buffer` (CUDA only). Unverified on hardware.

    NORMAL: `get_dispatch_layout` + `dispatch` / `combine` (intranode NVLink kernels). LOW_LATENCY:
    `low_latency_dispatch` / `low_latency_combine` with `num_max_dispatch_tokens_per_rank` = the
    per-rank decode batch (a token reaches each of its experts once, so this never overflows).
    DeepEP sums contributions in its own kernels and in bfloat16, so tokens are not expected to match
    the float64 reference bit for bit; its low-latency kernels also support only some hidden sizes.
    """

    def __init__(self, rank: int, size: int, num_experts: int, hidden: int, max_tokens: int, group: Any) -> None:
        import deep_ep  # lazy: the package exists only on CUDA installs

        self.rank = rank
        self.size = size
        self.num_experts = num_experts
        self.experts_per_rank = num_experts // size
        self.hidden = hidden
        self.max_tokens = max_tokens
        self.collectives = 0
        hidden_bytes = hidden * 2  # bfloat16
        buffer_cls = deep_ep.Buffer
        nvl_bytes = buffer_cls.get_dispatch_config(size).get_nvl_buffer_size_hint(hidden_bytes, size)
        nvl_bytes = max(nvl_bytes, buffer_cls.get_combine_config(size).get_nvl_buffer_size_hint(hidden_bytes, size))
        rdma_bytes = buffer_cls.get_low_latency_rdma_size_hint(max_tokens, hidden, size, num_experts)
        # Collective construction: every rank builds its buffer at executor start, in the same order.
        self.buffer = buffer_cls(
            group,
            num_nvl_bytes=nvl_bytes,
            num_rdma_bytes=rdma_bytes,
            low_latency_mode=True,
            num_qps_per_rank=self.experts_per_rank,
        )
        self._low_latency_clean = False  # the normal kernels dirty the low-latency region

    def normal(self, x: Tensor, topk_idx: Tensor, topk_weights: Tensor, experts: LayerExperts) -> Tensor:
        buffer = self.buffer
        per_rank, per_rdma_rank, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, self.num_experts)
        # Dispatch: every rank of a NORMAL round calls it per MoE layer, idle ranks with zero tokens (F2).
        recv_x, recv_idx, recv_weights, _, handle, _ = buffer.dispatch(
            x,
            topk_idx=topk_idx,
            topk_weights=topk_weights.float(),
            num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
        )
        self.collectives += 1
        out = torch.zeros_like(recv_x)
        for slot in range(recv_idx.shape[1]):  # recv_idx holds local expert ids, -1 where not local
            out = out + experts.by_id(recv_x, recv_idx[:, slot]) * recv_weights[:, slot : slot + 1].to(out.dtype)
        # Combine (unweighted sum back to the sources): the reverse of the dispatch, same callers.
        combined, _, _ = buffer.combine(out, handle)
        self.collectives += 1
        self._low_latency_clean = False
        return combined

    def low_latency(
        self,
        x: Tensor,
        topk_idx: Tensor,
        topk_weights: Tensor,
        experts: LayerExperts,
        token_valid: Tensor | None = None,
        check: bool = True,
    ) -> tuple[Tensor, Tensor]:
        buffer = self.buffer
        self.prepare_low_latency()
        if token_valid is not None:
            topk_idx = torch.where(token_valid[:, None], topk_idx, torch.full_like(topk_idx, -1))
        # Dispatch: every rank of a LOW_LATENCY round calls it per MoE layer, idle ranks included (F2).
        recv_x, _, handle, _, _ = buffer.low_latency_dispatch(
            x, topk_idx, self.max_tokens, self.num_experts, use_fp8=False
        )
        self.collectives += 1
        out = experts.grouped(recv_x)  # rows past each expert's received count are ignored by the combine
        # Combine (weighted by topk_weights inside DeepEP): the reverse leg, same callers.
        combined, _, _ = buffer.low_latency_combine(out, topk_idx, topk_weights.float(), handle)
        self.collectives += 1
        return combined, torch.zeros(self.size, dtype=torch.bool, device=x.device)

    def prepare_low_latency(self) -> None:
        if not self._low_latency_clean:
            # After normal kernels the low-latency region must be zeroed; every rank switches legs on the
            # same round (the mode is a function of the gathered rows), so they clean together.
            self.buffer.clean_low_latency_buffer(self.max_tokens, self.hidden, self.num_experts)
            self._low_latency_clean = True

    def close(self) -> None:
        self.buffer = None


def deep_ep_available() -> bool:
    """Whether the `deep_ep` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("deep_ep") is not None


def low_latency_capacity(configured: int, max_batch_size: int, top_k: int) -> int:
    """C pairs per rank pair: the configured value, or the per-rank batch times top-k (never overflows)."""
    return configured if configured > 0 else max_batch_size * top_k


def make_dispatcher(
    *,
    rank: int,
    size: int,
    num_experts: int,
    hidden: int,
    capacity: int,
    max_batch_size: int,
    device: torch.device,
    group: Any = None,
) -> Dispatcher:
    """`DeepEPDispatcher` on CUDA when `deep_ep` is installed, `AllToAllDispatcher` otherwise."""
    if device.type == "cuda" and deep_ep_available():
        return DeepEPDispatcher(rank, size, num_experts, hidden, max_batch_size, group)
    return AllToAllDispatcher(rank, size, num_experts, capacity, group)
