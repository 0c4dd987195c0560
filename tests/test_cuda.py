"""The CUDA paths on hardware: the NCCL group, decode CUDA graphs, the torch executor, MoE dispatch.

Skipped without a CUDA device (this project's CI has none); `bench/gpu/check.sh` runs them on a GPU
machine and writes `bench/results/gpu.md`. Each test appends what it measured to the JSON lines file
named by $PREFILL_GATE_GPU_FIGURES (when set), for that report.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.drivers.procs import ProcessDriver, RankExited, RankFailed, free_port
from engine.executor.dispatch import DeepEPDispatcher, deep_ep_available
from engine.executor.torch_exec import DecodeInputs, TorchExecutor
from engine.group import TorchGroup
from engine.request import Submit
from tests.helpers import req, sim_args
from tests.test_torch_executor import expected_tokens, run_group, spec, torch_args

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (bench/gpu/check.sh runs these)")
FIGURES_ENV = "PREFILL_GATE_GPU_FIGURES"


def record(check: str, **figures: Any) -> None:
    """Append one check's figures for bench/gpu/report.py."""
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"check": check, **figures}) + "\n")


def group_size() -> int:
    """One rank per GPU, a power of two up to 8 (the test model's 8 experts shard evenly)."""
    gpus = min(torch.cuda.device_count(), 8)
    return 1 << (gpus.bit_length() - 1)


def test_nccl_group_votes_agree_every_round(tmp_path: Path):  # rules R2, R6 over NCCL
    size = group_size()
    args = sim_args(dp_size=size, device="cuda", prefill_attempt_interval=2, prefill_any_attempt_interval=8)
    driver = ProcessDriver(args, vote_log_dir=str(tmp_path), max_rounds=400, idle_wait_s=0.0)
    exits: list[RankExited] = []
    try:
        driver.start()
        started = time.perf_counter()
        for i in range(8 * size):
            driver.send(i % size, Submit(req(f"r{i}", prompt_len=40 + 9 * i, output_len=20 + i % 7)))
        while len(exits) < size:
            for message in driver.poll_events(0.05):
                assert not isinstance(message, RankFailed), message
                if isinstance(message, RankExited):
                    exits.append(message)
            driver.poll_records()
            driver.raise_if_failed()
        seconds = time.perf_counter() - started
    finally:
        driver.terminate()
    logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(size)]
    assert all(log == logs[0] for log in logs) and len(logs[0].splitlines()) == 400
    assert sorted((e.rounds, e.gathers) for e in exits) == [(400, 400)] * size  # one all-gather per round (R2)
    record("nccl-group", ranks=size, rounds=400, rounds_per_s=round(400 / seconds, 1))


def test_decode_cuda_graphs_replay_the_eager_step():
    torch.cuda.set_device(0)
    args = torch_args(dp_size=1, device="cuda", model_experts=8, max_num_seqs=32, cuda_graph_max_batch=16)
    group = TorchGroup(0, 1, f"tcp://127.0.0.1:{free_port()}", backend="nccl", device="cuda")
    timings: dict[str, float] = {}
    try:
        with torch.inference_mode():  # as `forward` runs, and as the graphs were captured
            executor = TorchExecutor(args, 0, group)
            assert executor.graphs is not None and all(executor.graphs.has(b) for b in executor.buckets)
            bucket = max(executor.buckets)
            inputs = _decode_inputs(executor, bucket)
            eager, _ = executor.decode_step(inputs, check=False)
            replayed, overflow = executor.graphs.run(inputs)
            assert torch.equal(eager, replayed) and not bool(overflow.any())
            for name, step in (
                ("eager", lambda: executor.decode_step(inputs, check=False)),
                ("graph", lambda: executor.graphs.run(inputs)),
            ):
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
                started = time.perf_counter()
                for _ in range(50):
                    step()
                torch.cuda.synchronize()
                timings[name] = (time.perf_counter() - started) / 50
            executor.close()
    finally:
        group.close()
    record(
        "decode-graphs",
        bucket=bucket,
        eager_ms=round(timings["eager"] * 1e3, 3),
        graph_ms=round(timings["graph"] * 1e3, 3),
        speedup=round(timings["eager"] / timings["graph"], 2),
    )


def _decode_inputs(executor: TorchExecutor, bucket: int) -> DecodeInputs:
    """`bucket` real rows, one page each, at position 0 (the KV writes they make are idempotent)."""
    inputs = executor._padding_inputs(bucket, executor.args.kv_pages)
    generator = torch.Generator().manual_seed(7)
    inputs.ids.copy_(torch.randint(0, executor.args.model_vocab, (bucket,), generator=generator))
    pages = torch.arange(bucket, dtype=torch.int64)
    inputs.slots.copy_(pages * executor.page_size)
    inputs.block_table[:, 0].copy_(pages)
    inputs.valid.fill_(True)
    return inputs


def test_torch_executor_on_cuda_serves_every_request_and_is_compared_with_the_reference():  # rules F1, F2
    size = group_size()
    args = torch_args(
        dp_size=size,
        device="cuda",
        model_experts=8,
        max_num_seqs=8 * size,
        prefill_attempt_interval=2,
        prefill_any_attempt_interval=4,
    )
    placed = [(i % size, spec(f"q{i}", 6 + 5 * i, 8 + 3 * (i % 4))) for i in range(4 * size)]
    started = time.perf_counter()
    run = run_group(args, placed, timeout_s=300)
    seconds = time.perf_counter() - started
    assert run.finished == {r.rid: r.output_len for _, r in placed}
    assert {rid: len(tokens) for rid, tokens in run.tokens.items()} == run.finished
    # bfloat16 on CUDA against the float64 CPU reference: agreement is measured, not required (model.py).
    expected = expected_tokens(args, placed)
    pairs = [(a, b) for rid in expected for a, b in zip(run.tokens[rid], expected[rid], strict=True)]
    first = [run.tokens[rid][0] == expected[rid][0] for rid in expected]
    record(
        "torch-executor",
        ranks=size,
        requests=len(placed),
        token_agreement=round(sum(a == b for a, b in pairs) / len(pairs), 4),
        first_token_agreement=round(sum(first) / len(first), 4),
        seconds=round(seconds, 2),
    )


def test_moe_dispatch_is_deep_ep_when_installed_else_all_to_all():
    torch.cuda.set_device(0)
    args = torch_args(dp_size=1, device="cuda", model_experts=8)
    group = TorchGroup(0, 1, f"tcp://127.0.0.1:{free_port()}", backend="nccl", device="cuda")
    try:
        executor = TorchExecutor(args, 0, group)
        chosen = type(executor.dispatcher).__name__
        executor.close()
    finally:
        group.close()
    assert isinstance(executor.dispatcher, DeepEPDispatcher) == deep_ep_available()
    record("moe-dispatch", dispatcher=chosen, deep_ep_installed=deep_ep_available())
