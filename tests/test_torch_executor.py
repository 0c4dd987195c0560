"""The torch executor: real model, paged KV cache, sharded experts, real gloo processes (rules F1, F2, S2).

The multi-rank runs compare every request's greedy tokens with `reference_generate` (one process, every
expert local, contiguous KV): paging, chunking, retraction, expert sharding and both dispatch legs must
all be invisible in the tokens.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from engine.config import ServerArgs
from engine.drivers.procs import ProcessDriver, RankExited, RankFailed, RankRound, free_port
from engine.executor.base import DispatchMode, dispatch_mode
from engine.executor.kv_cache import PagedKVCache
from engine.executor.model import reference_generate, synthetic_prompt_tokens
from engine.executor.torch_exec import TRACE_ENV, decode_buckets
from engine.record import RoundRecord
from engine.request import Finished, FirstToken, RequestSpec, Retracted, Submit, Tokens
from engine.rows import Row
from engine.scheduler.plan import BatchRow, CacheOp, CacheOpKind, Plan

VOCAB = 128


def torch_args(**overrides: Any) -> ServerArgs:
    """A tiny model on 2 ranks; pages of 4 tokens and 8-token chunks so prompts span pages and chunks."""
    values: dict[str, Any] = {
        "executor": "torch",
        "dp_size": 2,
        "enable_dp_attention": True,
        "max_num_seqs": 8,
        "chunked_prefill_size": 8,
        "page_size": 4,
        "kv_pages": 64,
        "model_layers": 2,
        "model_hidden": 32,
        "model_heads": 4,
        "model_ffn": 64,
        "model_vocab": VOCAB,
        "model_experts": 4,
        "model_top_k": 2,
        "seed": 3,
    }
    values.update(overrides)
    return ServerArgs(**values)


def spec(rid: str, prompt_len: int, output_len: int) -> RequestSpec:
    """A request with explicit prompt token ids."""
    prompt = tuple(synthetic_prompt_tokens(99, rid, 0, prompt_len, VOCAB))
    return RequestSpec(rid=rid, prompt_len=prompt_len, output_len=output_len, prompt=prompt)


@dataclass
class Run:
    """What a multi-process run produced."""

    tokens: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    first_tokens: set[str] = field(default_factory=set)
    first_token_times: list[float] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=dict)
    retracted: int = 0
    records: list[RoundRecord] = field(default_factory=list)
    exits: list[RankExited] = field(default_factory=list)


def run_group(
    args: ServerArgs, placed: list[tuple[int, RequestSpec]], timeout_s: float = 120.0, clock_origin: float | None = None
) -> Run:
    """Submit `placed` (rank, request) pairs, run until every request finished, stop, and collect.
    `clock_origin`: the `perf_counter` origin `Go` gives the ranks' wall clocks (as a node agent does)."""
    run = Run()
    driver = ProcessDriver(args, idle_wait_s=0.001)
    try:
        driver.start(go=False)
        driver.go(clock_origin)
        for rank, request in placed:
            driver.send(rank, Submit(request))
        stopping = False
        end = time.monotonic() + timeout_s
        while len(run.exits) < args.dp_size:
            for message in driver.poll_events(0.02):
                if isinstance(message, RankFailed):
                    raise AssertionError(f"rank {message.rank} failed: {message.error}")
                if isinstance(message, RankExited):
                    run.exits.append(message)
                elif isinstance(message, RankRound):
                    _collect(run, message)
            run.records += driver.poll_records()  # drained continuously: rank 0 must never block on it
            driver.raise_if_failed()
            if not stopping and len(run.finished) == len(placed):
                driver.request_stop()
                stopping = True
            assert time.monotonic() < end, "the run did not finish in time"
        run.records += driver.poll_records()
    finally:
        driver.terminate()
    return run


def _collect(run: Run, message: RankRound) -> None:
    for event in message.events:
        if isinstance(event, Tokens):
            run.tokens[event.rid] += event.tokens
        elif isinstance(event, FirstToken):
            run.first_tokens.add(event.rid)
            run.first_token_times.append(event.time)
        elif isinstance(event, Finished):
            run.finished[event.rid] = event.output_len
        elif isinstance(event, Retracted):
            run.retracted += 1


def expected_tokens(args: ServerArgs, placed: list[tuple[int, RequestSpec]]) -> dict[str, list[int]]:
    requests = [request for _, request in placed]
    return reference_generate(args, {r.rid: r.prompt for r in requests}, {r.rid: r.output_len for r in requests})


def read_traces(directory: Path, ranks: int) -> list[dict[int, tuple[DispatchMode, int, int]]]:
    """Per rank: round -> (mode, real tokens, MoE collectives) from the executor's forward trace."""
    traces = []
    for rank in range(ranks):
        lines = (directory / f"forward-rank{rank}.log").read_text().split()
        entries = [lines[i : i + 4] for i in range(0, len(lines), 4)]
        traces.append({int(r): (DispatchMode[m], int(t), int(c)) for r, m, t, c in entries})
    return traces


# -- the gated two-rank run ------------------------------------------------------------------------------

GATED = {"prefill_attempt_interval": 2, "prefill_any_attempt_interval": 4}


def gated_workload() -> list[tuple[int, RequestSpec]]:
    """Rank 0: long prompts (several chunks), short outputs. Rank 1: short prompts, long outputs.

    So rank 1 decodes while rank 0's chunks wait for ANY windows (NORMAL rounds with a pure-decode rank),
    and rank 1 decodes alone at the end (LOW_LATENCY rounds with an idle rank).
    """
    placed = [(0, spec(f"long{i}", 18 + 5 * i, 3 + i)) for i in range(3)]
    placed += [(1, spec(f"short{i}", 3 + 2 * i, 26 + 3 * i)) for i in range(3)]
    return placed


NODE0_CLOCK_S = 1000.0  # what node 0's engine clock reads when the gated run's ranks start


@pytest.fixture(scope="module")
def gated_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ServerArgs, Run, list[dict], list]:
    args = torch_args(**GATED)
    trace_dir = tmp_path_factory.mktemp("forward-trace")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TRACE_ENV, str(trace_dir))  # inherited by the spawned rank processes
        # The ranks start as a remote node's do: `Go` says node 0's engine clock reads NODE0_CLOCK_S.
        run = run_group(args, gated_workload(), clock_origin=time.perf_counter() - NODE0_CLOCK_S)
    return args, run, read_traces(trace_dir, args.dp_size), gated_workload()


def test_go_rebases_every_ranks_wall_clock_on_node_0s(gated_run):  # issue 16: one clock for TTFT and ITL
    """A remote node's ranks start on their own machine's clock; `Go` carries node 0's engine clock and
    every rank re-bases on it, so their event times read on node 0's clock (fails without re-basing)."""
    _, run, _, placed = gated_run
    assert len(run.first_token_times) == len(placed)
    assert all(NODE0_CLOCK_S <= t < NODE0_CLOCK_S + 120 for t in run.first_token_times), run.first_token_times


def test_two_ranks_produce_the_reference_tokens(gated_run):  # rules F1, F2 (the forward is exact under both legs)
    args, run, _, placed = gated_run
    expected = expected_tokens(args, placed)
    assert dict(run.tokens) == expected
    assert run.first_tokens == set(expected)
    assert run.finished == {rid: len(tokens) for rid, tokens in expected.items()}


def test_dispatch_mode_follows_the_gathered_rows_on_every_rank(gated_run):  # rules F1, F2
    args, run, traces, _ = gated_run
    per_layer = {DispatchMode.NORMAL: 3, DispatchMode.LOW_LATENCY: 2, DispatchMode.NONE: 0}
    records = {record.round: record for record in run.records}
    assert sorted(records) == list(range(len(records)))  # no record dropped
    seen: Counter[str] = Counter()
    for round_index, record in records.items():
        expected = dispatch_mode(record.rows)
        assert record.all_decode_or_idle == (expected is not DispatchMode.NORMAL)
        for rank, trace in enumerate(traces):
            mode, tokens, collectives = trace[round_index]
            assert mode is expected, f"round {round_index} rank {rank}"
            assert tokens == record.rows[rank].num_tokens
            # Every rank joins every MoE collective of the round, with or without tokens (F2).
            assert collectives == per_layer[mode] * args.model_layers, f"round {round_index} rank {rank}"
        rows = record.rows
        if expected is DispatchMode.NORMAL and any(r.num_extends == 0 and r.batch_size > 0 for r in rows):
            seen["normal with a pure-decode rank"] += 1
        if expected is DispatchMode.LOW_LATENCY and any(r.batch_size == 0 for r in rows):
            seen["low latency with an idle rank"] += 1
        seen[expected.name] += 1
    assert seen["normal with a pure-decode rank"] and seen["low latency with an idle rank"], seen
    assert seen["NONE"], seen  # the group idled before the stop: no forward, no collective


def test_retraction_and_restore_keep_the_reference_tokens():  # rules S2, F1
    # 10 pages of 4 tokens per rank; each rank's requests need up to 9 pages each by their last token.
    args = torch_args(kv_pages=10)
    placed = [(i % 2, spec(f"r{i}", 5 + 3 * i, 6 + i % 5)) for i in range(8)]
    run = run_group(args, placed)
    assert run.retracted > 0
    assert dict(run.tokens) == expected_tokens(args, placed)


# -- one executor, driven directly ------------------------------------------------------------------------


def _single_rank_worker(rank: int, port: int) -> None:
    from engine.executor.torch_exec import TorchExecutor
    from engine.group import TorchGroup

    torch.set_num_threads(1)
    args = torch_args(dp_size=1, kv_pages=16)
    group = TorchGroup(0, 1, f"tcp://127.0.0.1:{port}")
    executor = TorchExecutor(args, 0, group)
    try:
        a, b = spec("a", 7, 3), spec("b", 5, 1)
        ref = expected_tokens(args, [(0, a), (0, b)])

        def row(batch: int, extends: int) -> tuple[Row, ...]:
            return (Row(rank=0, batch_size=batch, num_extends=extends, num_tokens=batch),)

        # Round 0: a's prompt fills pages 0-1 (7 of 8 slots).
        plan = Plan(round=0, extend_rows=[BatchRow("a", True, 0, 7, [0, 1], True, a.prompt)], prefill_tokens=7)
        result = executor.forward(plan, row(1, 1))
        assert result.mode is DispatchMode.NORMAL and result.tokens == {"a": ref["a"][0]}
        # Round 1: a decodes at position 7, the last slot of page 1.
        decode = BatchRow("a", False, 7, 1, [0, 1], True, (ref["a"][0],))
        plan = Plan(round=1, num_decodes=1, decode_rows_fn=lambda: [decode])
        result = executor.forward(plan, row(1, 0))
        assert result.mode is DispatchMode.LOW_LATENCY and result.tokens == {"a": ref["a"][1]}
        # Round 2: a moves to pages 5-6 (+9 to grow) through the host tier, and b takes its old pages in the
        # same round. The restore is listed first: offloads must still run first (S2 readmission).
        ops = [
            CacheOp(CacheOpKind.RESTORE, "a", (5, 6), 8),
            CacheOp(CacheOpKind.OFFLOAD, "a", (0, 1), 8),
        ]
        decode = BatchRow("a", False, 8, 1, [5, 6, 9], True, (ref["a"][1],))
        plan = Plan(
            round=2,
            extend_rows=[BatchRow("b", True, 0, 5, [0, 1], True, b.prompt)],
            prefill_tokens=5,
            num_decodes=1,
            decode_rows_fn=lambda: [decode],
            cache_ops=ops,
        )
        result = executor.forward(plan, row(2, 1))
        assert result.tokens == {"a": ref["a"][2], "b": ref["b"][0]}
        assert result.completed_ops == ops and executor.cache.host_images == 0
        # An all-idle round still runs its cache ops, with no forward (F2); release drops the host image.
        offload = CacheOp(CacheOpKind.OFFLOAD, "b", (0, 1), 5)
        result = executor.forward(Plan(round=3, cache_ops=[offload]), row(0, 0))
        assert (result.mode, result.tokens, result.completed_ops) == (DispatchMode.NONE, {}, [offload])
        assert executor.cache.host_images == 1
        executor.release("b")
        assert executor.cache.host_images == 0
        # The torch executor has no storage tier: a prefix load is a scheduler bug, reported clearly.
        load = CacheOp(CacheOpKind.LOAD_PREFIX, "c", (2,), 4)
        with pytest.raises(ValueError, match=r"LOAD_PREFIX.*no storage tier"):
            executor.forward(Plan(round=4, cache_ops=[load]), row(0, 0))
    finally:
        executor.close()
        group.close()


def test_cache_ops_run_offloads_first_and_prefix_loads_are_refused():  # rules S2, F2
    mp.spawn(_single_rank_worker, args=(free_port(),), nprocs=1, join=True)


# -- pieces, in process ------------------------------------------------------------------------------------


def test_paged_slots_follow_the_scheduler_pages_across_page_boundaries():
    cache = PagedKVCache(layers=1, pages=8, page_size=4, heads=1, head_dim=2)
    assert cache.slots([5, 2, 7], 2, 7).tolist() == [22, 23, 8, 9, 10, 11, 28]
    with pytest.raises(ValueError, match="do not fit in 2 pages"):
        cache.slots([5, 2], 6, 3)
    keys = torch.arange(20, dtype=torch.float64).view(10, 1, 2)
    cache.write(0, cache.slots([5, 2, 7], 0, 10), keys, -keys)
    cache.offload("r", [5, 2, 7], 10)
    cache.restore("r", [0, 3, 1], 10)
    restored, values = cache.read(0, cache.slots([0, 3, 1], 0, 10))
    assert torch.equal(restored, keys) and torch.equal(values, -keys)


def test_derived_prompts_do_not_depend_on_chunking():
    whole = synthetic_prompt_tokens(1, "r", 0, 20, VOCAB)
    assert synthetic_prompt_tokens(1, "r", 0, 7, VOCAB) + synthetic_prompt_tokens(1, "r", 7, 13, VOCAB) == whole
    assert whole != synthetic_prompt_tokens(2, "r", 0, 20, VOCAB)
    assert all(0 <= t < VOCAB for t in whole) and len(set(whole)) > 10


def test_reference_is_deterministic_and_depends_on_the_seed():
    prompts, lens = {"x": [1, 2, 3, 4, 5]}, {"x": 6}
    first = reference_generate(torch_args(), prompts, lens)
    assert first == reference_generate(torch_args(), prompts, lens)
    assert first != reference_generate(torch_args(seed=4), prompts, lens)
    derived = reference_generate(torch_args(), {"y": None}, {"y": 3}, prompt_lens={"y": 9})
    given = reference_generate(torch_args(), {"y": synthetic_prompt_tokens(3, "y", 0, 9, VOCAB)}, {"y": 3})
    assert derived == given


def test_decode_buckets_cover_every_batch_up_to_the_limit():
    assert decode_buckets(1) == [1]
    assert decode_buckets(6) == [1, 2, 4, 6]
    assert decode_buckets(8) == [1, 2, 4, 8]
