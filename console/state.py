"""The immutable snapshot of everything the console shows, built once per tick and handed to the widgets.

Widgets read a `ConsoleState` and nothing else, so what is on screen is a pure function of it (the
snapshot tests rely on that). The protobuf messages it holds are shared with the store and never
mutated by anyone: the store only appends new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from prefill_gate.v1 import types_pb2 as pb

# kPrefillWatermark (SEMANTICS.md): a rank is under the watermark while occupancy <= 0.9.
WATERMARK = 0.9

# Every field the console shows, by message: a contract test checks that the control plane fills each
# one from the engine, so the console never shows a field nobody emits.
ROW_FIELDS_READ = (
    "rank", "num_tokens", "batch_size", "num_extends", "want_prefill", "has_decode_work", "planned_prefill",
    "occupancy", "resident_chunks", "waiting_prompts", "storage_reads", "retracted", "running",
    "prefill_tokens", "pending_prefill_tokens", "retractions_total", "forward_us", "above_watermark", "blocks_all",
)
RECORD_FIELDS_READ = (
    "round", "unix_nanos", "counter", "point", "open", "ranks", "config", "run_id", "adopted_epoch",
    "ranks_extending", "ranks_wanting",
)
STATS_FIELDS_READ = (
    "output_tokens_per_second", "ttft_p50_seconds", "ttft_p99_seconds", "gate_wait_p99_seconds",
    "gate_wait_p99_rounds", "extend_round_share", "ranks_extending_per_window", "requests_finished",
    "requests_submitted",
)


class Link(Enum):
    """Where the data comes from and how fresh it is."""

    CONNECTING = "connecting"
    LIVE = "live"
    STALE = "stale"
    RECONNECTING = "reconnecting"
    FAILED = "failed"  # a permanent error (wrong token): the console stops retrying
    REPLAY = "replay"
    ENDED = "ended"  # the replay reached the end of its file


@dataclass(frozen=True, slots=True)
class Connection:
    """The link state with what a user needs to read about it."""

    link: Link
    detail: str = ""
    stale_s: float = 0.0  # seconds since the last record, for STALE
    retry_in_s: float | None = None  # RECONNECTING: seconds until the next attempt


@dataclass(frozen=True, slots=True)
class Mark:
    """One round of the window timeline."""

    round: int
    point: int  # pb.GatePoint
    open: bool
    counter: int  # the counter as the vote used it (R4)
    ranks_extending: int
    gap_before: bool  # records were dropped right before this one


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """What the timeline's rounds add up to (computed from the stream, so replays have them too)."""

    rounds: int = 0
    extend_share: float | None = None  # share of rounds on the extend path (F1)
    ranks_per_window: float | None = None  # ranks extending per open window
    any_open: int = 0
    any_shut: int = 0
    all_open: int = 0
    all_shut: int = 0


@dataclass(frozen=True, slots=True)
class ConsoleState:
    """Everything on screen at one tick."""

    source: str  # "HOST:PORT" or the replay file
    live: bool  # a server (True) or a recording (False)
    connection: Connection
    run_id: str = ""
    dp_size: int = 0
    server_state: str = ""  # from GetSnapshot: starting, serving, draining, stopped
    record: pb.RoundRecord | None = None  # the round shown: the newest, or the one scrolled back to
    newest_round: int | None = None
    rounds_per_s: float | None = None
    dropped: int = 0  # records this console lost (dropped_before summed, plus gaps on resume)
    config: pb.GateConfig | None = None
    stats: pb.RunStats | None = None  # from GetSnapshot (live only)
    marks: tuple[Mark, ...] = ()  # the timeline up to the shown round, oldest first
    figures: WindowFigures = field(default_factory=WindowFigures)
    paused: bool = False
    behind: int = 0  # records between the shown round and the newest
    notice: str = ""  # one line worth reading now (a restart, a truncated file)

    @property
    def ranks(self) -> tuple[pb.RankRow, ...]:
        """The shown round's rows, in rank order."""
        return tuple(self.record.ranks) if self.record is not None else ()
