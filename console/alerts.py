"""Alerts: conditions an operator must not miss, computed from the rounds held and the latest snapshot.

Pure functions of digests, stats and the config: counted in the header, marked on the rank, listed in
the alerts pane. Thresholds are `Bounds` (flags of `prefill-gate console`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from console.digest import WATERMARK, Digest
from prefill_gate.v1 import types_pb2 as pb

MIN_GROWTH = 3  # waiting prompts must grow by this many over the window to raise an alert


@dataclass(frozen=True, slots=True)
class Bounds:
    """When a condition becomes an alert."""

    above_rounds: int = 50  # a rank above the watermark for this many rounds in a row
    growing_rounds: int = 30  # a rank's waiting prompts grew (by 3+) over this many rounds, never falling
    gate_wait_p99_s: float = 2.0  # the run's gate wait p99 above this


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert: what, where (a rank or the whole run), how bad."""

    kind: str  # "watermark", "waiting", "gate-wait", "dropped", "tuner"
    text: str
    severity: str = "warn"  # "bad", "warn", "info"
    rank: int | None = None

    @property
    def counts(self) -> bool:
        """Counted in the header (information, such as the tuner's last change, is listed only)."""
        return self.severity != "info"


def rank_alerts(digests_newest_first: list[Digest], bounds: Bounds, stride: int = 1) -> list[Alert]:
    """Ranks above the watermark for `above_rounds`, and ranks whose waiting prompts keep growing.

    The digests are every round, or every `stride`-th of a fast stream: the same spans of rounds are then
    judged on the rounds sampled."""
    if not digests_newest_first:
        return []
    newest = digests_newest_first[0]
    out: list[Alert] = []
    samples = max(math.ceil(bounds.above_rounds / stride), 2)
    window = digests_newest_first[:samples]
    if len(window) == samples and all(entry.ranks == newest.ranks for entry in window):
        above = newest.above
        for entry in window:
            above &= entry.above
        for position in _positions(above):
            out.append(Alert(
                "watermark",
                f"rank {newest.ranks[position]}: >{WATERMARK} for {bounds.above_rounds}+ rounds "
                f"({newest.occupancy[position]:.0%} now)",
                "bad",
                newest.ranks[position],
            ))
    samples = max(math.ceil(bounds.growing_rounds / stride), 2) + 1
    window = digests_newest_first[:samples]
    if len(window) == samples and all(entry.ranks == newest.ranks for entry in window):
        oldest = window[-1]
        for position in range(newest.size):
            if newest.waiting[position] < oldest.waiting[position] + MIN_GROWTH:
                continue
            # newest first: each round's count is at least the one before it (one prompt arriving and
            # waiting for its window is not a queue building up: at least MIN_GROWTH more are)
            if all(later.waiting[position] >= earlier.waiting[position] for later, earlier in pairwise(window)):
                out.append(Alert(
                    "waiting",
                    f"rank {newest.ranks[position]}: waiting {oldest.waiting[position]} → "
                    f"{newest.waiting[position]} over {bounds.growing_rounds} rounds",
                    "warn",
                    newest.ranks[position],
                ))
    return out


def run_alerts(stats: pb.RunStats | None, console_dropped: int, config: pb.GateConfig | None,
               bounds: Bounds) -> list[Alert]:
    """Gate wait p99 over its bound; records or spans dropped anywhere; the tuner's last change."""
    out: list[Alert] = []
    if stats is not None:
        if stats.gate_wait_p99_seconds > bounds.gate_wait_p99_s:
            out.append(Alert(
                "gate-wait",
                f"gate wait p99 {stats.gate_wait_p99_seconds:.2f} s over the {bounds.gate_wait_p99_s:g} s bound "
                f"({stats.gate_wait_p99_rounds:.0f} rounds)",
                "bad",
            ))
        if stats.records_dropped:
            out.append(Alert("dropped", f"the engine dropped {stats.records_dropped:,} round records "
                                        "(its hand-off to the control plane fell behind)", "bad"))
        if stats.trace_spans_dropped:
            out.append(Alert("dropped", f"the trace exporter dropped {stats.trace_spans_dropped:,} spans", "warn"))
        tracing = stats.tracing
        if tracing.enabled and tracing.exporter_state in ("failing", "stalled"):
            detail = f": {tracing.exporter_detail}" if tracing.exporter_detail else ""
            out.append(Alert("dropped", f"the trace exporter is {tracing.exporter_state} "
                                        f"({tracing.exporter_queued:,} spans queued){detail}", "warn"))
    if console_dropped:
        out.append(Alert("dropped", f"this console lost {console_dropped:,} round records (it fell behind the "
                                    "stream, or the server's history could not fill a gap)", "warn"))
    change = last_change(config)
    if change:
        out.append(Alert("tuner", change, "info"))
    return out


def last_change(config: pb.GateConfig | None) -> str:
    """Who made the config in force and why, e.g. `tuner at epoch 3: TTFT p99 1.8 s > 1.5 s ... -> K 32->24`."""
    if config is None or not config.changed_by or config.changed_by == "launch":
        return ""
    text = f"{config.changed_by} at epoch {config.epoch}"
    return f"{text}: {config.reason}" if config.reason else text


def _positions(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
