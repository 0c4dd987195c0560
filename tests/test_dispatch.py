"""The all-to-all dispatcher over 2 real gloo processes, against a local computation with every expert
(rules F1, F2). Each worker asserts; `torch.multiprocessing.spawn` re-raises a worker's failure here."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.config import ServerArgs
from engine.drivers.procs import free_port
from engine.executor.dispatch import AllToAllDispatcher, LowLatencyCapacityError
from engine.executor.model import MoEModel, build_weights, combine_in_slot_order

RANKS = 2


def _args() -> ServerArgs:
    return ServerArgs(
        executor="torch",
        dp_size=RANKS,
        enable_dp_attention=True,
        max_num_seqs=16,
        model_hidden=16,
        model_heads=2,
        model_ffn=24,
        model_experts=4,
        model_top_k=2,
    )


def _tokens(
    args: ServerArgs, counts: tuple[int, ...], case: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every rank's (x, topk_idx, topk_weights), drawn identically on every rank."""
    model = MoEModel(build_weights(args), args)
    generator = torch.Generator().manual_seed(1000 + case)
    out = []
    for count in counts:
        x = torch.randn(count, args.model_hidden, generator=generator, dtype=torch.float64)
        _, idx, weights = model.route(0, x)
        out.append((x, idx, weights))
    return out


def _expected(args: ServerArgs, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The MoE output with every expert local: what the dispatcher must reproduce."""
    full = MoEModel(build_weights(args), args)
    pair_out = full.experts(0).by_id(x.repeat_interleave(args.model_top_k, 0), idx.reshape(-1))
    return combine_in_slot_order(pair_out.view(x.shape[0], args.model_top_k, args.model_hidden), weights)


def _join(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS, timeout=timedelta(seconds=30)
    )


def _legs_worker(rank: int, port: int) -> None:
    _join(rank, port)
    try:
        args = _args()
        local = MoEModel(build_weights(args, expert_range=(rank * 2, rank * 2 + 2)), args)
        dispatcher = AllToAllDispatcher(rank, RANKS, args.model_experts, capacity=args.max_batch_size * 2)
        # NORMAL legs: uneven batches, then rank 0 with no tokens at all (F2: it still joins every leg).
        for case, counts in enumerate(((5, 3), (0, 4))):
            x, idx, weights = _tokens(args, counts, case)[rank]
            before = dispatcher.collectives
            out = dispatcher.normal(x, idx, weights, local.experts(0))
            assert dispatcher.collectives - before == 3  # counts, dispatch, combine
            assert out.shape == x.shape
            torch.testing.assert_close(out, _expected(args, x, idx, weights), rtol=1e-12, atol=1e-12)
        # LOW_LATENCY legs: uneven batches, rank 1 idle, and padding rows that must route nothing.
        for case, counts in enumerate(((5, 3), (4, 0), (6, 6)), start=10):
            x, idx, weights = _tokens(args, counts, case)[rank]
            valid = torch.ones(x.shape[0], dtype=torch.bool)
            if case == 12:
                valid[1::2] = False  # every other row is padding
            before = dispatcher.collectives
            out, overflow = dispatcher.low_latency(x, idx, weights, local.experts(0), token_valid=valid)
            assert dispatcher.collectives - before == 2  # one padded all-to-all each way
            assert not overflow.any()
            torch.testing.assert_close(
                out[valid], _expected(args, x[valid], idx[valid], weights[valid]), rtol=1e-12, atol=1e-12
            )
            assert torch.equal(out[~valid], torch.zeros_like(out[~valid]))
    finally:
        dist.destroy_process_group()


def _overflow_worker(rank: int, port: int) -> None:
    _join(rank, port)
    try:
        args = _args()
        local = MoEModel(build_weights(args, expert_range=(rank * 2, rank * 2 + 2)), args)
        dispatcher = AllToAllDispatcher(rank, RANKS, args.model_experts, capacity=2)
        x, idx, weights = _tokens(args, (8, 1), 20)[rank]  # rank 0: 16 pairs over 2 destinations > 2 each
        with pytest.raises(LowLatencyCapacityError, match=r"overflow from rank\(s\) \[0\].*more than 2"):
            dispatcher.low_latency(x, idx, weights, local.experts(0))
        assert dispatcher.collectives == 1  # both ranks stopped after the dispatch leg, before the combine
        # Nobody was left inside a collective: the group still works, and a batch that fits goes through.
        x, idx, weights = _tokens(args, (1, 1), 21)[rank]
        out, _ = dispatcher.low_latency(x, idx, weights, local.experts(0))
        torch.testing.assert_close(out, _expected(args, x, idx, weights), rtol=1e-12, atol=1e-12)
    finally:
        dist.destroy_process_group()


def test_both_legs_match_local_experts_including_an_idle_rank():  # rules F1, F2
    mp.spawn(_legs_worker, args=(free_port(),), nprocs=RANKS, join=True)


def test_low_latency_overflow_raises_the_same_error_on_every_rank():  # rule F1 (fixed-capacity legs)
    mp.spawn(_overflow_worker, args=(free_port(),), nprocs=RANKS, join=True)


def test_the_three_expert_shapes_agree():  # the low-latency legs (masked, grouped) compute what the normal one does
    args = _args()
    experts = MoEModel(build_weights(args, expert_range=(2, 4)), args).experts(1)
    x = torch.randn(6, args.model_hidden, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ids = torch.tensor([1, -1, 0, 1, -2, 0])
    by_id = experts.by_id(x, ids)
    assert torch.equal(by_id[1], torch.zeros(args.model_hidden)) and torch.equal(by_id[4], by_id[1])
    torch.testing.assert_close(experts.masked(x, ids), by_id, rtol=1e-12, atol=1e-12)
    grouped = experts.grouped(x.expand(2, -1, -1))  # every row through expert 0, then through expert 1
    for local in (0, 1):
        rows = ids == local
        torch.testing.assert_close(grouped[local][rows], by_id[rows], rtol=1e-12, atol=1e-12)
