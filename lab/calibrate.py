"""Fit a cost preset to measured rounds: least squares over (gathered rows, round seconds) samples.

The preset's round time is linear in its coefficients once the rank whose attention is slowest is
known (F3 makes the round a max over ranks). `fit_preset` therefore alternates: pick each sample's
slowest rank under the current coefficients, solve a non-negative least-squares problem for all
coefficients, and repeat until the picks stop changing. Non-negativity keeps every coefficient a cost;
a coefficient the samples cannot see (a column of zeros) stays 0.

`calibrate_torch` measures the rounds: it launches the torch executor's rank processes
(`ProcessDriver`, `executor="torch"`) on this machine's device, keeps a closed-loop workload of varied
prompt and output lengths running ungated (so both decode-only and extend rounds occur, with varied
shapes), drains rank 0's round records continuously and fits a `CostPreset` to them. Only
`RoundRecord.rows` and `RoundRecord.round_seconds` are read.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.config import ServerArgs
from engine.drivers.procs import ProcessDriver, RankFailed, RankFailure, RankRound
from engine.executor.base import DispatchMode, dispatch_mode
from engine.executor.presets import DEFAULT_PRESET, CostPreset, preset_named
from engine.request import Finished, Refused, Submit
from engine.rows import Row
from workloads import ClosedLoop, Uniform, Workload

Sample = tuple[Sequence[Row], float]

# Coefficient order of the fit; the columns of `_design` follow it.
COEFFICIENTS: tuple[str, ...] = (
    "decode_fixed_s",
    "extend_fixed_s",
    "attn_per_seq_s",
    "attn_per_kv_token_s",
    "prefill_per_token_s",
    "moe_per_token_s",
    "ll_per_token_s",
    "normal_per_token_s",
)


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Non-negative least squares, min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active set)."""
    rows, cols = a.shape
    x = np.zeros(cols)
    passive = np.zeros(cols, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.abs(a).sum(axis=0).max(initial=0.0) * max(rows, cols)
    limit = max_iter if max_iter is not None else 3 * cols + 10
    gradient = a.T @ (b - a @ x)
    for _ in range(limit):
        candidates = ~passive & (gradient > tol)
        if not candidates.any():
            break
        passive[int(np.argmax(np.where(candidates, gradient, -np.inf)))] = True
        while True:
            trial = np.zeros(cols)
            trial[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (trial[passive] > tol).all():
                break
            # Step from x toward the trial until the first passive coefficient reaches 0, and drop it.
            blocked = passive & (trial <= tol)
            gap = x[blocked] - trial[blocked]
            # A coefficient already at 0 whose trial is 0 too blocks at once (step 0), never 0/0.
            alpha = float(np.min(np.where(gap > 0, x[blocked] / np.where(gap > 0, gap, 1.0), 0.0)))
            x = x + alpha * (trial - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = trial
        gradient = a.T @ (b - a @ x)
    return x


def _rank_terms(rows: Sequence[Row], page_size: int) -> list[tuple[int, int, int]]:
    """(decodes, kv tokens read, prompt tokens) of every rank, as `CostPreset.round_seconds` counts them."""
    terms = []
    for row in rows:
        decodes = row.num_tokens - row.prefill_tokens
        kv = row.pool_pages_used * page_size if decodes else 0
        terms.append((decodes, kv, row.prefill_tokens))
    return terms


def _design(samples: Sequence[Sample], page_size: int, attention: np.ndarray) -> np.ndarray:
    """One row of features per sample, with the slowest rank chosen under `attention` coefficients."""
    matrix = np.zeros((len(samples), len(COEFFICIENTS)))
    for index, (rows, _) in enumerate(samples):
        terms = _rank_terms(rows, page_size)
        slowest = max(terms, key=lambda t: attention @ np.asarray(t, dtype=float))
        tokens = [row.num_tokens for row in rows]
        extend = dispatch_mode(rows) is DispatchMode.NORMAL
        matrix[index] = (
            0.0 if extend else 1.0,
            1.0 if extend else 0.0,
            *slowest,
            sum(tokens) / len(tokens),
            0.0 if extend else max(tokens),
            max(tokens) if extend else 0.0,
        )
    return matrix


def fit_preset(
    samples: Sequence[Sample],
    *,
    name: str = "calibrated",
    hardware: str = "this machine",
    model: str = "the measured model",
    source: str | None = None,
    page_size: int = 16,
    start: CostPreset | None = None,
    iterations: int = 20,
) -> CostPreset:
    """Fit every coefficient of a `CostPreset` to measured rounds.

    Idle rounds (no rank has a batch) set `idle_s` (their median); the rest need both decode-only and
    extend rounds, and at least as many as there are coefficients, else ValueError. `start` gives the
    first guess of the attention coefficients (default: the default preset's).
    """
    busy = [(rows, seconds) for rows, seconds in samples if dispatch_mode(rows) is not DispatchMode.NONE]
    idle = [seconds for rows, seconds in samples if dispatch_mode(rows) is DispatchMode.NONE]
    extend = sum(1 for rows, _ in busy if dispatch_mode(rows) is DispatchMode.NORMAL)
    if extend == 0 or extend == len(busy):
        raise ValueError(
            f"calibration needs both decode-only and extend rounds; got {len(busy) - extend} decode-only "
            f"and {extend} extend rounds"
        )
    if len(busy) < len(COEFFICIENTS):
        raise ValueError(f"calibration needs at least {len(COEFFICIENTS)} busy rounds, got {len(busy)}")
    first = start if start is not None else preset_named(DEFAULT_PRESET)
    attention = np.array([first.attn_per_seq_s, first.attn_per_kv_token_s, first.prefill_per_token_s])
    target = np.array([seconds for _, seconds in busy])
    picks: np.ndarray | None = None
    coefficients = np.zeros(len(COEFFICIENTS))
    for _ in range(iterations):
        design = _design(busy, page_size, attention)
        if picks is not None and np.array_equal(design, picks):
            break
        picks = design
        # Columns differ by orders of magnitude (indicators vs KV tokens): scale them to unit norm first.
        norms = np.linalg.norm(design, axis=0)
        norms[norms == 0] = 1.0
        coefficients = nnls(design / norms, target) / norms
        attention = coefficients[2:5]
    fitted = dict(zip(COEFFICIENTS, (float(c) for c in coefficients), strict=True))
    return CostPreset(
        name=name,
        hardware=hardware,
        model=model,
        source=source or f"least-squares fit to {len(busy)} measured rounds ({extend} on the extend path)",
        idle_s=float(np.median(idle)) if idle else first.idle_s,
        **fitted,
    )


def fit_error(preset: CostPreset, samples: Sequence[Sample], page_size: int = 16) -> float:
    """Median relative error of `preset` on the busy samples (0.05 = 5%)."""
    errors = []
    for rows, seconds in samples:
        mode = dispatch_mode(rows)
        if mode is DispatchMode.NONE or seconds <= 0:
            continue
        errors.append(abs(preset.round_seconds(rows, mode, page_size) - seconds) / seconds)
    return float(np.median(errors)) if errors else float("nan")


# -- measuring the torch executor ------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """A fitted preset, the samples it was fitted to, and how well it reproduces them."""

    preset: CostPreset
    samples: int
    extend_samples: int
    median_rel_error: float


def calibration_workload(args: ServerArgs, seed: int = 0) -> Workload:
    """Varied shapes without overload: a closed loop of 4 clients per rank, prompts of 16 to the round
    budget (at most 512) tokens, 8 to 96 output tokens, prompt token ids for the real model."""
    longest = max(16, min(512, args.chunked_prefill_size))
    return Workload(
        ClosedLoop(4 * args.dp_size),
        dp_size=args.dp_size,
        prompt=Uniform(16, longest),
        output=Uniform(8, 96),
        seed=seed,
        token_ids=True,
        vocab=args.model_vocab,
        rid_prefix="cal",
    )


def collect_torch_samples(
    args: ServerArgs,
    workload: Workload,
    *,
    rounds: int = 400,
    warmup_rounds: int = 30,
    timeout_s: float = 600.0,
) -> list[Sample]:
    """Run the torch executor's rank processes for `warmup_rounds + rounds` rounds and return rank 0's
    `(rows, round_seconds)` of the last `rounds` (the first ones include graph capture and warm-up)."""
    if args.executor != "torch":
        raise ValueError(f"calibration measures the torch executor; got --executor {args.executor!r}")
    driver = ProcessDriver(args, max_rounds=warmup_rounds + rounds, idle_wait_s=0.0)
    samples: list[Sample] = []
    try:
        driver.start()
        began = time.monotonic()
        while True:
            now = time.monotonic() - began
            for rank, spec in workload.due(now):
                driver.send(rank, Submit(spec))
            for message in driver.poll_events(timeout_s=0.002):
                if isinstance(message, RankFailed):
                    raise RankFailure(message.rank, message.error)
                if isinstance(message, RankRound):
                    for event in message.events:
                        if isinstance(event, Finished | Refused):
                            workload.on_finished(event.rid, now)
            # Drain continuously: the record queue is bounded and drops what nobody reads.
            samples += [(r.rows, r.round_seconds) for r in driver.poll_records() if r.round >= warmup_rounds]
            driver.raise_if_failed()
            if len(driver.exited) == args.dp_size:
                break
            if now > timeout_s:
                raise TimeoutError(f"calibration did not finish {warmup_rounds + rounds} rounds in {timeout_s} s")
        # A rank reports its exit before its record queue is flushed, and cannot exit until it is: keep
        # reading until every rank process is gone, then read what is left.
        deadline = time.monotonic() + 30.0
        while driver.alive() and time.monotonic() < deadline:
            samples += [(r.rows, r.round_seconds) for r in driver.poll_records() if r.round >= warmup_rounds]
            time.sleep(0.01)
        samples += [(r.rows, r.round_seconds) for r in driver.poll_records() if r.round >= warmup_rounds]
    finally:
        driver.terminate()
    return samples


def calibrate_torch(
    args: ServerArgs | None = None,
    *,
    rounds: int = 400,
    seed: int = 0,
    name: str = "calibrated",
    timeout_s: float = 600.0,
) -> Calibration:
    """Measure the torch executor on this machine (`args.device`) and fit a preset to it.

    `args` defaults to a 2-rank attention-DP group of the torch executor on the CPU; the gate and the
    local interval are cleared so that prompts extend as they arrive and the samples cover many shapes.
    Save the result with `save_preset` and run the simulator on it with ``--sim-preset PATH.json``.
    """
    base = args if args is not None else ServerArgs(executor="torch", dp_size=2, enable_dp_attention=True)
    run_args = base.replace(
        prefill_attempt_interval=None, prefill_any_attempt_interval=None, prefill_decode_interval=None
    )
    samples = collect_torch_samples(run_args, calibration_workload(run_args, seed), rounds=rounds, timeout_s=timeout_s)
    preset = fit_preset(
        samples,
        name=name,
        hardware=_hardware(run_args),
        model=(
            f"torch executor MoE: {run_args.model_layers} layers, hidden {run_args.model_hidden}, "
            f"{run_args.model_experts} experts top-{run_args.model_top_k}, dp {run_args.dp_size}"
        ),
        page_size=run_args.page_size,
    )
    extend = sum(1 for rows, _ in samples if dispatch_mode(rows) is DispatchMode.NORMAL)
    return Calibration(preset, len(samples), extend, fit_error(preset, samples, run_args.page_size))


def _hardware(args: ServerArgs) -> str:
    if args.device == "cuda":
        import torch

        return f"{args.dp_size} rank(s) on {torch.cuda.get_device_name()}"
    return f"{args.dp_size} rank(s) on CPU ({platform.processor() or platform.machine()})"
