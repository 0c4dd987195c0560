"""The immutable snapshot of everything the console shows, built once per tick and handed to the widgets.

Widgets read a `ConsoleState` and nothing else, so what is on screen is a pure function of it (the
snapshot tests rely on that). The protobuf messages it holds are shared with the store and never
mutated by anyone: the store only appends new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from console.alerts import Alert
from console.digest import WATERMARK, Digest, Summary
from console.selection import RankFilter, RankView
from prefill_gate.v1 import types_pb2 as pb

__all__ = ["WATERMARK", "Connection", "ConsoleState", "Link", "Mark", "Position", "WindowFigures"]

# Every field the console shows, by message: a contract test checks that the control plane fills each
# one from the engine, so the console never shows a field nobody emits.
ROW_FIELDS_READ = (
    "rank", "num_tokens", "batch_size", "num_extends", "want_prefill", "has_decode_work", "planned_prefill",
    "occupancy", "resident_chunks", "waiting_prompts", "storage_reads", "retracted", "running",
    "prefill_tokens", "pending_prefill_tokens", "retractions_total", "forward_us",
)
RECORD_FIELDS_READ = (
    "round", "unix_nanos", "counter", "point", "open", "ranks", "config", "run_id", "adopted_epoch",
    "ranks_extending", "ranks_wanting",
)
STATS_FIELDS_READ = (
    "output_tokens_per_second", "ttft_p50_seconds", "ttft_p99_seconds", "gate_wait_p99_seconds",
    "gate_wait_p99_rounds", "extend_round_share", "ranks_extending_per_window", "requests_finished",
    "requests_submitted", "records_dropped", "trace_spans_dropped",
)


class Link(Enum):
    """Where the data comes from and how fresh it is."""

    CONNECTING = "connecting"
    LIVE = "live"
    STALE = "stale"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"  # the server ended the stream cleanly (the engine stopped); checking again
    FAILED = "failed"  # a permanent error (wrong token): the console stops retrying
    REPLAY = "replay"
    ENDED = "ended"  # the replay reached the end of its file


# Links whose data is current; anything else is shown as not live on every part of the screen.
CURRENT = frozenset({Link.LIVE, Link.REPLAY})


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
class Position:
    """Where a replay is in its file."""

    index: int  # 0-based record index of the round shown
    total: int  # records in the file (whole ones)
    first_round: int
    last_round: int
    speed: float  # x the recorded pace; 0: as fast as it reads
    playing: bool


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
    executor: str = ""  # "sim", "torch", ... when the server or the recording says
    summary: Summary = field(default_factory=Summary)
    views: tuple[RankView, ...] = ()  # the ranks listed, sorted and filtered
    history: tuple[Digest, ...] = ()  # the rounds up to the shown one, oldest first
    alerts: tuple[Alert, ...] = ()
    sort_key: str = "rank"
    sort_reverse: bool = False
    rank_filter: RankFilter = field(default_factory=RankFilter)
    position: Position | None = None  # replay only
    age_s: float | None = None  # seconds since the newest record arrived (live)
    held: int = 0  # rounds held up to the shown one
    stride: int = 1  # the history views show every stride-th round (a fast stream is sampled)

    @property
    def current(self) -> bool:
        """The screen shows data as it happens: live and following, or a replay playing."""
        return self.connection.link in CURRENT and not self.paused

    @property
    def alert_count(self) -> int:
        """Alerts the header counts."""
        return sum(1 for alert in self.alerts if alert.counts)

    def freshness(self) -> str:
        """A short, loud word for a view that is not live now; empty when it is."""
        link = self.connection.link
        if link is Link.STALE:
            return f"STALE {self.connection.stale_s:.0f} s"
        if link in (Link.RECONNECTING, Link.CONNECTING):
            return "DISCONNECTED" if self.record is not None else "CONNECTING"
        if link is Link.STOPPED:
            return "ENGINE STOPPED"
        if link is Link.FAILED:
            return "FAILED"
        if link is Link.ENDED:
            return "REPLAY ENDED" if not self.paused else "REPLAY PAUSED"
        if link is Link.REPLAY:
            return "REPLAY PAUSED" if self.paused else "REPLAY"
        return "PAUSED" if self.paused else ""

    @property
    def ranks(self) -> tuple[pb.RankRow, ...]:
        """The shown round's rows, in rank order."""
        return tuple(self.record.ranks) if self.record is not None else ()
