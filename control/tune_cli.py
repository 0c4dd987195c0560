"""`prefill-gate tune`: the autotuner as an ordinary client of a running engine's control plane.

    prefill-gate tune --target HOST:PORT --ttft-p99 S --itl-p99 S [--token T | --token-file F] [--tls-ca F]
                      [--dry-run] [--respect-manual S] [--max-changes-per-min N] [--dwell-rounds N] [--window-s S]

It reads `WatchRounds` and changes A and K only through `UpdateIntervals` (changed_by "tuner", a reason
per change). Killed, it leaves the engine serving on the last config; a lost stream is reconnected.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TextIO

from control.plane.auth import bearer_metadata
from control.plane.ctl import add_endpoint_args, admin_token, open_channel
from tuner.client import GrpcPlane
from tuner.core import Tuner
from tuner.loop import run_tuner
from tuner.options import add_tuning_args, tuning_from


def add_tune_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `tune` to the top-level subparsers."""
    tune = subparsers.add_parser(
        "tune",
        help="move the gate's intervals live to a latency SLO (a control-plane client)",
        description="Watch a running engine's rounds and move A and K to meet a TTFT and an ITL p99 budget "
        "(docs/autotune.md). Every change is adopted by every rank on one round and says why.",
    )
    add_endpoint_args(tune)
    add_tuning_args(tune)
    tune.add_argument("--dry-run", action="store_true", help="print what would change; change nothing")
    return tune


def tune_main(ns: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run until Ctrl-C; returns the exit code (2 for bad flags, 1 for an unreadable token file)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        slo, settings = tuning_from(ns)
    except ValueError as exc:
        print(f"prefill-gate tune: error: {exc}", file=err)
        return 2
    try:
        token = admin_token(ns)
    except OSError as exc:
        print(f"error: {exc}", file=err)
        return 1
    if token is None and not ns.dry_run:
        print("note: no admin token given; an engine that requires one will refuse the changes", file=err)

    def say(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')}  {line}", file=out, flush=True)

    async def main() -> None:
        try:
            channel = open_channel(ns.target, ns.tls_ca, watch=True, aio=True)
        except OSError as exc:
            raise SystemExit(f"error: {exc}") from exc
        async with channel:
            mode = "dry run: nothing will change" if ns.dry_run else "changes go through UpdateIntervals"
            say(f"tuning {ns.target}: TTFT p99 <= {slo.ttft_p99_s:g} s, ITL p99 <= {slo.itl_p99_s * 1e3:g} ms ({mode})")
            await run_tuner(GrpcPlane(channel, bearer_metadata(token)), Tuner(slo, settings), say, dry_run=ns.dry_run)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        say("stopped: the engine keeps the config in force")
        return 130
    return 0
