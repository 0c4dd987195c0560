"""Peer fidelity choices of issue 11, measured side by side (SIMULATED, default preset unless named).

1. `sglang-delayer` on rows one round old: holding on NONE (the default) against allowing on NONE (SGLang's
   literal rule, `allow_on_none=True`), with `ungated` beside them, on the long-chunked scenarios and two
   short-prompt ones. Allowing on rows a round old never lets a MIXED state become visible, so the delayer
   then behaves like `ungated`; holding applies SGLang's rule one round late.
2. sglang#35241's stagger: `long-chunked-offset` against its healthy twin (no offset), input tokens per
   second, for every policy; then the sglang-delayer, ungated and gate with 8, 12, 16 and 24 clients.
3. `vllm-cadence` and `trtllm-balance` on the mixed engine (`MIXED_PREFILL_DECODE`, as those engines run)
   against the non-mixed one, at vllm#44558's own operating point: gb200-dp8-vllm, DP8, 1k in / 200 out,
   Poisson 24 req/s (the PR: cadence interval 2 gives P50 ITL 32.1 ms, TTFT p99 1.48 s).

    .venv/bin/python -m bench.bench_peer_fidelity [--scale 0.3]   # prints and writes bench/results/peer_fidelity.md
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from engine.config import ServerArgs
from engine.metrics import Summary
from engine.policies.registry import POLICIES, make_policy, policy_args
from lab.scenarios import DP_SIZE, LONG_BUDGET, LONG_ISL, long_chunked_offset_workload, scenario
from lab.simrun import run_sim
from workloads import ClosedLoop, Fixed, Poisson, Workload

RESULTS = Path(__file__).parent / "results" / "peer_fidelity.md"
SCENARIOS = ("long-chunked", "long-chunked-offset", "long-chunked-decode", "scattered", "osl-variance")


def row(label: str, s: Summary) -> str:
    ttft = f"{s.ttft_p99_s:.2f}" if s.ttft_p99_s is not None else "-"
    itl = f"{s.itl_p50_s * 1e3:.1f}" if s.itl_p50_s is not None else "-"
    tps = f"{s.output_tokens_per_s:,.0f}" if s.output_tokens_per_s is not None else "-"
    share = f"{s.extend_round_share:.3f}" if s.extend_round_share is not None else "-"
    return (
        f"| {label} | {s.extend_rounds} | {share} | {s.mean_ranks_extending or 0:.2f} | {tps} | "
        f"{s.prompt_tokens / max(s.elapsed_s, 1e-9):,.0f} | {ttft} | {itl} | {s.requests_finished} |"
    )


HEADER = (
    "| run | extend rounds | extend share | ranks/extend round | output tok/s | submitted prompt tok/s | TTFT p99 s "
    "| ITL p50 ms | finished |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def sglang_none(scale: float) -> list[str]:
    lines = ["## sglang-delayer: NONE on rows a round old", "", HEADER]
    for name in SCENARIOS:
        sc = scenario(name, scale=scale)
        for label, policy, extra in (
            ("hold on NONE (default)", "sglang-delayer", {}),
            ("allow on NONE", "sglang-delayer", {"allow_on_none": True}),
            ("ungated", "ungated", {}),
        ):
            args = policy_args(policy, sc.server_args())
            summary, _ = run_sim(
                args,
                sc.workload(),
                rounds=sc.rounds,
                duration=sc.duration_s,
                policy_factory=lambda rank, a, p=policy, kw=extra: make_policy(p, a, rank, **kw),
            )
            lines.append(row(f"{name}: {label}", summary))
            print(lines[-1], flush=True)
    return lines


def input_rate(policy: str, workload: Workload, duration: float) -> float:
    """Prompt tokens extended per virtual second (OSL 1: the input throughput sglang#35241 reports)."""
    sc = scenario("long-chunked-offset")
    args = policy_args(policy, sc.server_args(prefill_attempt_interval=8, prefill_any_attempt_interval=32))
    extended = [0]

    def hook(record, outcomes) -> None:
        extended[0] += sum(row.prefill_tokens for row in record.rows)

    summary, _ = run_sim(
        args,
        workload,
        duration=duration,
        rounds=sc.rounds,
        on_round=hook,
        policy_factory=lambda rank, a: make_policy(policy, a, rank),
    )
    return extended[0] / summary.elapsed_s


def stagger(duration: float) -> list[str]:
    lines = [
        "## sglang#35241: a one-chunk stagger, offset over healthy input throughput",
        "",
        "| policy | clients | healthy tok/s | offset tok/s | offset / healthy |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]

    def loop(clients: int, offset: bool) -> Workload:
        short = {s: LONG_ISL - LONG_BUDGET for s in range(clients) if s % DP_SIZE == 1} if offset else {}
        return Workload(
            ClosedLoop(clients, first_prompt_lens=short),
            dp_size=DP_SIZE,
            prompt=Fixed(LONG_ISL),
            output=Fixed(1),
            sticky_sessions=False,
            seed=0,
        )

    cases = [(policy, 16, long_chunked_offset_workload) for policy in POLICIES]
    cases += [(p, c, None) for c in (8, 12, 24) for p in ("sglang-delayer", "ungated", "gate")]
    for policy, clients, builder in cases:
        if builder is not None:
            healthy = input_rate(policy, builder(0, offset=False), duration)
            offset = input_rate(policy, builder(0), duration)
        else:
            healthy = input_rate(policy, loop(clients, False), duration)
            offset = input_rate(policy, loop(clients, True), duration)
        lines.append(f"| {policy} | {clients} | {healthy:,.0f} | {offset:,.0f} | {offset / healthy:.3f} |")
        print(lines[-1], flush=True)
    return lines


def mixed_peers(duration: float) -> list[str]:
    lines = ["## vLLM and TensorRT-LLM peers, mixed against non-mixed (vllm#44558's point)", "", HEADER]
    base = ServerArgs(
        executor="sim",
        dp_size=8,
        enable_dp_attention=True,
        max_num_seqs=8 * 256,
        chunked_prefill_size=8192,
        page_size=64,
        kv_pages=8192,
        sim_preset="gb200-dp8-vllm",
    )
    for policy in ("vllm-cadence", "trtllm-balance", "ungated"):
        for mixed in (True, False):
            args = policy_args(policy, base).replace(enable_mixed_prefill_decode=mixed)
            workload = Workload(Poisson(24.0), dp_size=8, prompt=Fixed(1024), output=Fixed(200), seed=0)
            summary, _ = run_sim(
                args, workload, duration=duration, policy_factory=lambda rank, a, p=policy: make_policy(p, a, rank)
            )
            lines.append(row(f"{policy} {'mixed' if mixed else 'non-mixed'}", summary))
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.3, help="scenario scale (run length)")
    parser.add_argument("--duration", type=float, default=120.0, help="virtual seconds at vllm#44558's point")
    parser.add_argument("--stagger-duration", type=float, default=300.0, help="virtual seconds per stagger run")
    ns = parser.parse_args()
    command = (
        f"PYTHONPATH=. .venv/bin/python -m bench.bench_peer_fidelity --scale {ns.scale} --duration {ns.duration} "
        f"--stagger-duration {ns.stagger_duration}"
    )
    out = [
        "# Peer fidelity (issue 11): SIMULATED",
        "",
        f"Command: `{command}` on a shared 2-core machine ({os.cpu_count()} CPUs visible); every figure is the",
        "simulator's cost model (default preset h200-dp8-ep8, or the preset named), not a hardware measurement.",
        "",
    ]
    out += [*sglang_none(ns.scale), "", *stagger(ns.stagger_duration), "", *mixed_peers(ns.duration), ""]
    RESULTS.write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
