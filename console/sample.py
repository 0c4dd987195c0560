"""Seeded simulator runs in the wire form the console reads: for tests, the benchmark and the docs.

The records come from the real lockstep simulator (the same engine code a server runs) converted by
`prefill_gate.convert`, so the console is exercised on fields the engine actually emits. Only the wall-clock
stamp is rewritten, from the virtual clock, so that two runs of the same seed are byte-identical.
"""

from __future__ import annotations

from engine.config import ServerArgs
from engine.record import RoundRecord
from lab.simrun import run_sim
from prefill_gate.v1 import types_pb2 as pb
from workloads import ClosedLoop, LogNormal, Workload

SAMPLE_RUN_ID = "sample-run"
# 2026-01-01T00:00:00Z: a fixed epoch for the rewritten wall clock.
SAMPLE_EPOCH_NS = 1_767_225_600_000_000_000


def sample_args(dp_size: int, *, seed: int = 7) -> ServerArgs:
    """A small simulated group under KV pressure: some ranks cross the watermark, some block ALL."""
    return ServerArgs(
        executor="sim",
        dp_size=dp_size,
        enable_dp_attention=True,
        max_num_seqs=24 * dp_size,
        chunked_prefill_size=2048,
        page_size=64,
        kv_pages=224,
        prefill_attempt_interval=4,
        prefill_any_attempt_interval=12,
        seed=seed,
    )


def sample_workload(dp_size: int, *, seed: int = 7) -> Workload:
    """A closed loop with spread prompt and output lengths, so arrivals land one rank at a time."""
    return Workload(
        ClosedLoop(8 * dp_size),
        dp_size=dp_size,
        prompt=LogNormal(900, 0.6, low=64, high=4000),
        output=LogNormal(150, 0.6, low=16, high=1500),
        sticky_sessions=False,
        seed=seed,
    )


def sample_engine_records(dp_size: int, rounds: int, *, seed: int = 7) -> list[RoundRecord]:
    """`rounds` engine records of a seeded simulated run of `dp_size` ranks."""
    out: list[RoundRecord] = []
    run_sim(
        sample_args(dp_size, seed=seed),
        sample_workload(dp_size, seed=seed),
        rounds=rounds,
        on_round=lambda record, _outcomes: out.append(record),
    )
    return out


def sample_records(dp_size: int, rounds: int, *, seed: int = 7, run_id: str = SAMPLE_RUN_ID) -> list[pb.RoundRecord]:
    """`rounds` records of a seeded simulated run of `dp_size` ranks; deterministic to the byte."""
    from prefill_gate.convert import round_record  # the control plane's converter: one mapping, one contract

    out = []
    for record in sample_engine_records(dp_size, rounds, seed=seed):
        message = round_record(record, run_id)
        message.unix_nanos = SAMPLE_EPOCH_NS + int(record.clock * 1e9)
        out.append(message)
    return out
