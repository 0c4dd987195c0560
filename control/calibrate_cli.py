"""`prefill-gate calibrate`: fit a simulator preset to the torch executor on this machine."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from engine.config import ServerArgs
from engine.executor.presets import save_preset
from lab.calibrate import COEFFICIENTS, calibrate_torch


def add_calibrate_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the subcommand."""
    parser = sub.add_parser(
        "calibrate",
        help="fit a simulator cost preset to timings of the torch executor here",
        description="Run the torch executor's rank processes with a varied closed-loop workload, fit the cost "
        "model's coefficients to the measured rounds, and save them as a preset for --sim-preset PATH.json.",
    )
    ServerArgs.add_cli_args(parser)
    parser.set_defaults(dp_size=2, enable_dp_attention=True)
    parser.add_argument("--rounds", type=int, default=400, help="rounds to measure")
    parser.add_argument("--out", default="calibrated-preset.json", help="where to write the preset")
    parser.add_argument("--name", default="calibrated", help="the preset's name")
    return parser


def calibrate_main(ns: argparse.Namespace) -> int:
    """Run the calibration; prints the fit and where it was saved."""
    try:
        if ns.rounds < 50:
            raise ValueError(f"--rounds must be >= 50 for a fit, got {ns.rounds}")
        args = ServerArgs.from_cli_args(ns).replace(executor="torch")
    except ValueError as exc:
        print(f"prefill-gate calibrate: error: {exc}", file=sys.stderr)
        return 2
    result = calibrate_torch(args, rounds=ns.rounds, name=ns.name)
    save_preset(result.preset, ns.out)
    values = dataclasses.asdict(result.preset)
    print(f"fitted {result.preset.name} on {result.preset.hardware}")
    print(
        f"  {result.samples} rounds ({result.extend_samples} on the extend path), "
        f"median relative error {result.median_rel_error:.1%}"
    )
    for name in COEFFICIENTS:
        print(f"  {name:<22} {values[name] * 1e6:12.3f} us")
    print(f"saved to {ns.out}; simulate with --executor sim --sim-preset {ns.out}")
    return 0
