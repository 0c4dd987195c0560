"""Autotuned runs checked like manual ones: the change rate under its cap on bursty traces (synthetic on/off
bursts, and the shared Azure conversation trace; the lab's lockstep harness), and a recorded
`serve --autotune-*` run through the per-round checks of G1-G2, R3-R5."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from control.plane.recording import read_recording
from lab.autotune import run_autotuned
from prefill_gate.v1 import types_pb2 as pb
from tests.helpers import sim_args
from tests.test_grpc_agreement import expected_vote
from tests.test_traces import AZURE, needs_shared
from tests.test_tuner_grpc import ARGS
from tuner.core import TunerSettings
from tuner.law import Slo
from workloads import Fixed, OnOff, Workload
from workloads.traces import trace_workload


def on_off_bursts() -> tuple[Workload, float]:
    """Bursts of ~100 prompts every 4 s: the estimates swing with every burst."""
    workload = Workload(OnOff(rate=1000.0, on_s=0.1, off_s=4.0), dp_size=4, prompt=Fixed(256), output=Fixed(64), seed=0)
    return workload, 170.0


def azure_conversation() -> tuple[Workload, float]:
    """The first 150 s of the Azure conversation trace (production arrivals, bursty at the second scale)."""
    return trace_workload(AZURE, duration=150.0, dp_size=4, seed=0), 150.0


@pytest.mark.parametrize(
    ("trace", "attempt"), [(on_off_bursts, 8), pytest.param(azure_conversation, 1, marks=needs_shared)]
)
def test_the_change_rate_stays_under_its_cap_on_a_bursty_trace(trace, attempt):  # guard: max changes per minute
    # A TTFT budget the bursts always break keeps the law asking for changes (from A=1 on the trace: room to
    # batch more); only the cap paces them.
    args = replace(ARGS, prefill_attempt_interval=attempt)
    workload, duration = trace()
    cap = 2
    settings = TunerSettings(window_s=5.0, min_rounds=30, min_ttft_samples=10, dwell_rounds=20, max_changes_per_min=cap)
    summary, extra, run = run_autotuned(args, workload, Slo(0.2, 10.0), settings, duration=duration)
    times = [clock for _, clock, _ in run.adoptions]
    assert [epoch for _, _, epoch in run.adoptions] == list(range(1, len(times) + 1))  # every change adopted
    assert len(times) >= 2 * cap  # not vacuous: the law wanted more than one minute's worth
    for i in range(len(times) - cap):
        assert times[i + cap] - times[i] > 60.0, times  # never cap + 1 adoptions within 60 engine seconds
    assert summary.requests_finished > 0 and extra.stopped_by == "duration"


def test_a_recorded_autotuned_run_passes_the_per_round_checks_of_a_manual_one(tmp_path: Path):  # G1, G2, R3-R5
    path = tmp_path / "tuned.pgrec"
    command = [
        *("serve", "--executor", "sim", "--pace", "10", "--dp-size", "3", "--enable-dp-attention"),
        *("--prefill-attempt-interval", "8", "--prefill-any-attempt-interval", "48", "--kv-pages", "1024"),
        *("--arrival", "bursts", "--rate", "200", "--on-s", "0.2", "--off-s", "1", "--requests", "0"),
        *("--prompt-len", "96", "--output-len", "48", "--rounds", "1800", "--port", "0", "--no-progress"),
        *("--record", str(path), "--autotune-ttft-p99", "0.15", "--autotune-itl-p99", "10"),
        *("--autotune-dwell-rounds", "60", "--autotune-window-s", "5", "--autotune-max-changes-per-min", "30"),
    ]
    argv = [sys.executable, "-m", "control.cli", *command]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    header, records = read_recording(path)
    changes = [r for r in records if r.adopted_epoch]
    assert len(changes) >= 2, result.stderr  # the tuner did change the intervals, more than once
    assert result.stderr.count("adopted by every rank after round") == len(changes)
    assert [r.round for r in records] == list(range(len(records)))  # the recording is every round
    epoch, previous = 0, None
    for record in records:
        assert record.run_id == header.run_id and record.config.epoch == epoch, record.round  # G2
        assert {row.config_epoch for row in record.ranks} == {epoch}, record.round  # G1: one epoch per round
        assert (record.point, record.open) == expected_vote(record, previous), record.round  # R4, R5
        if previous is not None:
            assert record.counter == previous.counter_after, record.round  # R3; G1 keeps the counter
        if record.adopted_epoch:
            assert record.adopted_epoch == epoch + 1
            config = record.adopted_config
            assert config.changed_by == "tuner" and config.reason.startswith("tuner: ")
            epoch = record.adopted_epoch
        previous = record
    # Not vacuous: after each change, ALL points only the new A explains.
    for change in changes:
        a = change.adopted_config.attempt_interval
        after = [r for r in records if r.round > change.round and r.config.epoch == change.adopted_epoch]
        assert all(r.counter % a == 0 for r in after if r.point == pb.GATE_POINT_ALL)


def test_gate_autotune_is_a_lab_policy_that_starts_cold_and_brings_its_tuner():
    from lab.autotune import AUTOTUNE, LAB_POLICIES, AutotunedGate
    from lab.capacity.knobs import configure, settings_of

    assert AUTOTUNE in LAB_POLICIES
    # Swept: only the launch config it starts from (the demo's or the least held) and the engine's mode;
    # choosing A and K from there is the tuner's job.
    grid = settings_of(AUTOTUNE, quick=True)
    assert {(dict(s)["A"], dict(s)["K"]) for s in grid} == {(8, 32), (1, 2)} and len(grid) == 4
    setting = grid[0]
    args, factory = configure(AUTOTUNE, setting, sim_args(dp_size=2))
    delay = args.prefill_delay
    assert (delay.attempt_interval, delay.any_interval) == (8, 32) and isinstance(factory, AutotunedGate)
    assert not args.enable_mixed_prefill_decode
    mixed_args, _ = configure(AUTOTUNE, grid[1], sim_args(dp_size=2))
    assert mixed_args.enable_mixed_prefill_decode
    client = factory.client(2.0, 0.2)
    assert (client.tuner.slo.ttft_p99_s, client.tuner.slo.itl_p99_s) == (2.0, 0.2)
    assert factory.client(2.0, 0.2).tuner is not client.tuner  # a fresh tuner per run: probes are independent
    assert factory(0, args).name == "gate"
