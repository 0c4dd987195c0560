"""The tuner's command-line options, shared by `prefill-gate tune` and `serve --autotune-*`.

`add_tuning_args(parser, prefix)` adds the flags (`--ttft-p99`, or `--autotune-ttft-p99` with the prefix
"autotune-"); `tuning_from(ns, prefix)` builds the SLO and the settings, with errors that name the flag.
"""

from __future__ import annotations

import argparse
import math

from tuner.core import TunerSettings
from tuner.law import Slo

DEFAULTS = TunerSettings()


# (flag, type, default, help) of the guards; the budgets come first and have no default.
GUARDS: tuple[tuple[str, type, float, str], ...] = (
    ("respect-manual", float, DEFAULTS.respect_manual_s, "after someone else's change, change nothing for S engine s"),
    ("max-changes-per-min", float, DEFAULTS.max_changes_per_min, "at most N changes in any 60 engine seconds"),
    ("dwell-rounds", int, DEFAULTS.dwell_rounds, "rounds a config stays in force before the next change"),
    ("window-s", float, DEFAULTS.window_s, "the estimates' sliding window, engine seconds"),
)  # fmt: skip


def add_tuning_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The SLO and the guards of the tuner (docs/autotune.md)."""
    group = parser.add_argument_group("autotune" if prefix else "tuning")
    group.add_argument(f"--{prefix}ttft-p99", type=float, default=None, metavar="S", help="TTFT p99 budget, seconds")
    group.add_argument(f"--{prefix}itl-p99", type=float, default=None, metavar="S", help="ITL p99 budget, seconds")
    for name, kind, default, text in GUARDS:
        metavar = "N" if kind is int or name.endswith("per-min") else "S"
        group.add_argument(
            f"--{prefix}{name}", type=kind, default=default, metavar=metavar, help=f"{text} (default %(default)s)"
        )


def tuning_requested(ns: argparse.Namespace, prefix: str = "") -> bool:
    """Either budget was given."""
    dest = prefix.replace("-", "_")
    return getattr(ns, f"{dest}ttft_p99") is not None or getattr(ns, f"{dest}itl_p99") is not None


def tuning_from(ns: argparse.Namespace, prefix: str = "") -> tuple[Slo, TunerSettings]:
    """The SLO and settings the flags give; ValueError naming the flag otherwise."""
    dest = prefix.replace("-", "_")

    def value(name: str) -> object:
        return getattr(ns, dest + name.replace("-", "_"))

    for name in ("ttft-p99", "itl-p99"):
        given = value(name)
        if given is None:
            raise ValueError(f"--{prefix}{name} is required (seconds)")
        if not (math.isfinite(given) and given > 0):  # type: ignore[arg-type]
            raise ValueError(f"--{prefix}{name} must be a number of seconds > 0, got {given}")
    checks = (
        ("respect-manual", lambda v: math.isfinite(v) and v >= 0, ">= 0"),
        ("max-changes-per-min", lambda v: math.isfinite(v) and v > 0, "> 0"),
        ("dwell-rounds", lambda v: v >= 1, ">= 1"),
        ("window-s", lambda v: math.isfinite(v) and v > 0, "> 0"),
    )
    for name, ok, text in checks:
        if not ok(value(name)):
            raise ValueError(f"--{prefix}{name} must be {text}, got {value(name)}")
    slo = Slo(float(value("ttft-p99")), float(value("itl-p99")))  # type: ignore[arg-type]
    settings = TunerSettings(
        window_s=float(value("window-s")),  # type: ignore[arg-type]
        dwell_rounds=int(value("dwell-rounds")),  # type: ignore[call-overload]
        max_changes_per_min=float(value("max-changes-per-min")),  # type: ignore[arg-type]
        respect_manual_s=float(value("respect-manual")),  # type: ignore[arg-type]
    )
    return slo, settings
