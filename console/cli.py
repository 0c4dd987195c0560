"""`prefill-gate console`: the flags, and the checks that turn bad input into one line instead of a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from console.alerts import Bounds
from console.endpoint import Endpoint, TargetError
from console.hangup import watch_for_hangup
from console.source import GrpcSource, ReplaySource, Source
from control.plane.auth import DEFAULT_PORT, TOKEN_ENV
from control.plane.recording import RecordingError


def add_console_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `console` on the `prefill-gate` subcommands; returns its parser."""
    parser = subparsers.add_parser(
        "console",
        help="watch a running engine (or replay a recording) in a terminal dashboard",
        description="A live terminal view of the gate: every rank's votes and pressure, the ANY/ALL window "
        "timeline, throughput and latency; edit the intervals (e) or disable the gate (d) on a live server.",
    )
    add_console_args(parser)
    return parser


def add_console_args(parser: argparse.ArgumentParser) -> None:
    """The console's flags."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--target", metavar="HOST:PORT", default=None,
        help=f"the control plane's gRPC address (default: 127.0.0.1:{DEFAULT_PORT})",
    )
    where.add_argument("--replay", metavar="FILE", help="a recording made with `prefill-gate serve --record FILE`")
    parser.add_argument(
        "--token", default=None, help=f"admin token for the editor and disable (default: ${TOKEN_ENV})"
    )
    parser.add_argument("--tls-ca", metavar="FILE", default=None, help="PEM root certificates: connect with TLS")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="replay: x the recorded pace (0: as fast as possible)"
    )
    parser.add_argument("--tick-hz", type=float, default=10.0, help="screen refreshes per second (at most)")
    defaults = Bounds()
    parser.add_argument("--alert-above-rounds", type=int, default=defaults.above_rounds, metavar="N",
                        help="alert when a rank stays above the 0.9 watermark for N rounds (default %(default)s)")
    parser.add_argument("--alert-growing-rounds", type=int, default=defaults.growing_rounds, metavar="N",
                        help="alert when a rank's waiting prompts grow for N rounds (default %(default)s)")
    parser.add_argument("--alert-gate-wait-p99", type=float, default=defaults.gate_wait_p99_s, metavar="SECONDS",
                        help="alert when the run's gate wait p99 exceeds this (default %(default)s)")


def build_bounds(ns: argparse.Namespace) -> Bounds:
    """The alert thresholds the flags give; raises ValueError on one that makes no sense."""
    for flag, value in (("--alert-above-rounds", ns.alert_above_rounds),
                        ("--alert-growing-rounds", ns.alert_growing_rounds)):
        if not 1 <= value <= 2000:
            raise ValueError(f"{flag} must be in [1, 2000] (the console holds 2,048 rounds), got {value}")
    if not ns.alert_gate_wait_p99 > 0:
        raise ValueError(f"--alert-gate-wait-p99 must be > 0 seconds, got {ns.alert_gate_wait_p99}")
    return Bounds(ns.alert_above_rounds, ns.alert_growing_rounds, ns.alert_gate_wait_p99)


def build_source(ns: argparse.Namespace) -> Source:
    """The source the flags name; raises TargetError, RecordingError, OSError or ValueError."""
    if ns.tick_hz <= 0 or ns.tick_hz > 60:
        raise ValueError(f"--tick-hz must be in (0, 60], got {ns.tick_hz}")
    if ns.replay is not None:
        if ns.speed < 0:
            raise ValueError(f"--speed must be >= 0, got {ns.speed}")
        return ReplaySource.from_file(ns.replay, speed=ns.speed)
    target = ns.target or f"127.0.0.1:{DEFAULT_PORT}"
    return GrpcSource(Endpoint(target, ns.token or os.environ.get(TOKEN_ENV) or None, ns.tls_ca))


def console_main(ns: argparse.Namespace, err: TextIO = sys.stderr) -> int:
    """Entry of `prefill-gate console` after parsing: 0 on a normal quit, 2 on bad input."""
    try:
        bounds = build_bounds(ns)
        source = build_source(ns)
    except (TargetError, RecordingError, ValueError) as exc:
        print(f"prefill-gate console: error: {exc}", file=err)
        return 2
    except OSError as exc:
        print(f"prefill-gate console: error: {ns.replay}: {exc.strerror or exc}", file=err)
        return 2
    from console.app import ConsoleApp  # Textual loads only once the input is known to be good

    app = ConsoleApp(source, tick_hz=ns.tick_hz, bounds=bounds)
    watch_for_hangup()
    app.run()
    return app.return_code or 0
