"""`prefill-gate`: one command, one subcommand per part of the product."""

from __future__ import annotations

import argparse
import os
import sys

# gRPC's C core prints INFO lines straight to the terminal unless told otherwise before it is imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from console.cli import add_console_parser, console_main
from control.calibrate_cli import add_calibrate_parser, calibrate_main
from control.host.autotune import add_autotune_args, attach_autotune, check_autotune_args
from control.host.serve import Attachment, add_run_args, serve_main
from control.plane.ctl import add_ctl_parser, ctl_main
from control.plane.grpc_server import add_server_args, attach_grpc, check_server_args
from control.telemetry.telemetry_cli import add_telemetry_args, attach_telemetry
from control.tune_cli import add_tune_parser, tune_main
from engine.config import ServerArgs
from lab.cli import add_lab_parser, lab_main


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and its subcommand parsers."""
    parser = argparse.ArgumentParser(
        prog="prefill-gate",
        description="A gated multi-rank LLM serving engine, its control plane, console and policy lab.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the engine (rank processes, or the simulator) with a workload",
        description="Run the gated engine: --dp-size rank processes (torch executor) or the lockstep simulator "
        "(--executor sim), fed by a workload; Ctrl-C stops every rank after the same round.",
    )
    ServerArgs.add_cli_args(serve)
    add_run_args(serve)
    add_server_args(serve)
    add_telemetry_args(serve)
    add_autotune_args(serve)
    return parser, {
        "serve": serve,
        "ctl": add_ctl_parser(sub),
        "console": add_console_parser(sub),
        "lab": add_lab_parser(sub),
        "calibrate": add_calibrate_parser(sub),
        "tune": add_tune_parser(sub),
    }


def attachments() -> list[Attachment]:
    """Servers that attach to `serve` (the control plane, metrics), in start order."""
    return [attach_grpc, attach_telemetry, attach_autotune]


def main(argv: list[str] | None = None) -> int:
    """Console-script entry."""
    parser, subparsers = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        try:
            check_server_args(ns)
            check_autotune_args(ns)
        except ValueError as exc:
            subparsers["serve"].error(str(exc))
        return serve_main(ns, subparsers["serve"], attachments())
    if ns.command == "ctl":
        return ctl_main(ns)
    if ns.command == "console":
        return console_main(ns)
    if ns.command == "lab":
        return lab_main(ns)
    if ns.command == "calibrate":
        return calibrate_main(ns)
    if ns.command == "tune":
        return tune_main(ns)
    parser.error(f"unknown command {ns.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
