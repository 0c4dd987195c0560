"""The console's one piece of mutable state: what the source delivered, and where the user is looking.

A source calls `record`, `snapshot`, `status` and `notice` as data arrives (once per record, so those
stay cheap: an append and a few counters). The app's tick calls `view` about ten times a second to build
the immutable `ConsoleState` the widgets draw; the per-rank digests it needs are computed once per
record, only for records a tick looks at. Everything runs on the app's event loop, so nothing here
needs a lock.

A notice belongs to the situation that raised it: a live notice gives way when the link is lost (the
link's own line says what is wrong now), a config notice when another config is in force, and any
live notice after a minute.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice, pairwise

from console.alerts import Alert, Bounds, rank_alerts, run_alerts
from console.digest import Digest, Summary, digest
from console.selection import RankFilter, RankView, sort_views
from console.state import CURRENT, Connection, ConsoleState, Link, Mark, WindowFigures
from prefill_gate.v1 import types_pb2 as pb

HISTORY = 2048  # records kept for scrolling back and for rank detail
TIMELINE = 240  # marks handed to the timeline; it draws as many as fit its width
RATE_WINDOW = 256  # rounds/s is measured over this many of the newest records, on the server's clock
STALE_AFTER_S = 1.0  # the engine publishes every round, idle ones included: a second of silence is a stall
NOTICE_S = 60.0  # a live notice gives way to the link's detail after this long; a replay's stays
HISTORY_VIEW = 512  # digests handed to the history strips and the heatmap (they draw what fits)
# Reading a 64-rank record's rows costs about a third of a millisecond (protobuf field access), so the
# history views and the per-rank alerts look at every round only up to this rate; a faster stream is
# sampled every k-th round (said on screen), which keeps a 1 kHz stream affordable.
HISTORY_RATE = 100.0


class Store:
    """History ring, connection state and the pause/scroll cursor."""

    def __init__(
        self, source: str, live: bool, clock: Callable[[], float] = time.monotonic, bounds: Bounds | None = None
    ) -> None:
        self.source = source
        self.live = live
        self.clock = clock
        self.history: deque[pb.RoundRecord] = deque(maxlen=HISTORY)
        self.run_id = ""
        self.dp_size = 0
        self.server_state = ""
        self.stats: pb.RunStats | None = None
        self.config: pb.GateConfig | None = None
        self.dropped = 0
        self.records_seen = 0
        self.link = Link.CONNECTING if live else Link.REPLAY
        self.detail = ""
        self.retry_at: float | None = None
        self.last_record_at: float | None = None
        self.notice_text = ""
        self.notice_at = 0.0
        self.notice_epoch: int | None = None  # a config notice holds while this epoch is in force
        self.paused = False
        self.cursor: int | None = None  # the round shown while paused; None: the newest
        self.version = 0  # bumped on every change, so a tick with nothing new can skip its work
        self.executor = ""
        self.last_enabled: pb.GateConfig | None = None  # for re-enabling: the intervals last in force
        self.bounds = bounds or Bounds()
        self.sort_key = "rank"
        self.sort_reverse = False
        self.rank_filter = RankFilter()
        self._digests: dict[int, Digest] = {}  # by round, for the records held
        self._marks: dict[int, Mark] = {}  # by round: the timeline's view of each record, read once

    # -- what sources call ---------------------------------------------------------------------------

    def record(self, record: pb.RoundRecord) -> None:
        """One round from the stream or the file."""
        if record.run_id and self.run_id and record.run_id != self.run_id:
            self._new_run(record.run_id)
        if not self.run_id:
            self.run_id = record.run_id
        if self.history:
            # dropped_before counts the server's drops; a jump in round numbers also covers drops before
            # the server (the engine's hand-off) and a resume that could not be served from history.
            missing = record.round - self.history[-1].round - 1
            self.dropped += max(record.dropped_before, missing, 0)
        if len(self.history) == self.history.maxlen:
            self._digests.pop(self.history[0].round, None)
            self._marks.pop(self.history[0].round, None)
        self.history.append(record)
        if record.config.enabled:  # an unset config reads as disabled: nothing to remember
            self.last_enabled = record.config
        self.dp_size = len(record.ranks) or self.dp_size
        self.records_seen += 1
        self.last_record_at = self.clock()
        self.version += 1

    def snapshot(self, snapshot: pb.Snapshot) -> None:
        """A GetSnapshot answer (live only): run-level figures and the config in force."""
        if snapshot.run_id and self.run_id and snapshot.run_id != self.run_id:
            self._new_run(snapshot.run_id)
        self.run_id = snapshot.run_id or self.run_id
        self.dp_size = snapshot.dp_size or self.dp_size
        self.server_state = snapshot.state
        self.stats = snapshot.stats if snapshot.HasField("stats") else None
        self.config = snapshot.config if snapshot.HasField("config") else self.config
        self.executor = snapshot.executor or self.executor
        if self.config is not None and self.config.enabled:
            self.last_enabled = self.config
        self.version += 1

    def status(self, link: Link, detail: str = "", retry_in_s: float | None = None) -> None:
        """The source's link changed (connected, lost, failed for good, replay ended)."""
        if self.live and self.link is Link.LIVE and link is not Link.LIVE:
            self.notice_text = ""  # it described the connection that is gone
        self.link = link
        self.detail = detail
        self.retry_at = self.clock() + retry_in_s if retry_in_s is not None else None
        if link is Link.LIVE:
            # A fresh connection is not stale because of the time it took to come back.
            self.last_record_at = self.clock()
        self.version += 1

    def notice(self, text: str, epoch: int | None = None) -> None:
        """One line worth reading now; replaces the previous one. With `epoch`, it holds only while that
        config epoch is the one shown."""
        self.notice_text = text
        self.notice_at = self.clock()
        self.notice_epoch = epoch
        self.version += 1

    def reset(self) -> None:
        """Forget every record held (a replay seeking far away loads the rounds around its new position)."""
        self.history.clear()
        self._digests.clear()
        self._marks.clear()
        self.cursor = None
        self.version += 1

    def truncate_after(self, round_: int) -> None:
        """Drop the records after `round_` (a replay resumes playing from the round shown)."""
        while self.history and self.history[-1].round > round_:
            dropped = self.history.pop().round
            self._digests.pop(dropped, None)
            self._marks.pop(dropped, None)
        self.version += 1

    def digest_at(self, index: int) -> Digest:
        """The digest of the held record at `index`, computed on first use."""
        record = self.history[index]
        entry = self._digests.get(record.round)
        if entry is None:
            entry = digest(record)
            self._digests[record.round] = entry
        return entry

    def set_sort(self, key: str, reverse: bool) -> None:
        """List the ranks by `key` (see console.selection.SORT_KEYS)."""
        self.sort_key, self.sort_reverse = key, reverse
        self.version += 1

    def set_filter(self, rank_filter: RankFilter) -> None:
        """List only the ranks the filter matches."""
        self.rank_filter = rank_filter
        self.version += 1

    @property
    def newest(self) -> pb.RoundRecord | None:
        """The newest record held."""
        return self.history[-1] if self.history else None

    def _new_run(self, run_id: str) -> None:
        # A different run id means the server restarted: its rounds start over, so old history would lie.
        previous = self.run_id
        self.history.clear()
        self._digests.clear()
        self._marks.clear()
        self.paused = False
        self.cursor = None
        self.stats = None
        self.run_id = run_id
        self.notice(f"the server restarted: run {previous} ended, now showing run {run_id}")

    # -- what the user does --------------------------------------------------------------------------

    def toggle_pause(self) -> bool:
        """Freeze or unfreeze the view (ingest goes on underneath); returns whether now paused."""
        if self.paused:
            self.paused = False
            self.cursor = None
        elif self.history:
            self.paused = True
            self.cursor = self.history[-1].round
        self.version += 1
        return self.paused

    def step(self, records: int) -> int | None:
        """Move the paused view by `records` (negative: back in time); pauses first. Returns the round shown."""
        if not self.history:
            return None
        index = self._shown_index()
        target = min(max(index + records, 0), len(self.history) - 1)
        self.paused = True
        self.cursor = self.history[target].round
        self.version += 1
        return self.cursor

    def rank_rows(self, rank: int, count: int) -> list[tuple[pb.RoundRecord, pb.RankRow]]:
        """Up to `count` recent (record, row) pairs of one rank up to the shown round, newest first."""
        index = self._shown_index()
        out = []
        for offset in range(index, max(index - count, -1), -1):
            record = self.history[offset]
            row = _row_of(record, rank)
            if row is not None:
                out.append((record, row))
        return out

    # -- the tick ------------------------------------------------------------------------------------

    def view(self, history: int = HISTORY_VIEW) -> ConsoleState:
        """The immutable state of this instant, with up to `history` digests for the history views."""
        index = self._shown_index() if self.history else -1
        record = self.history[index] if index >= 0 else None
        window = _before(self.history, index, TIMELINE) if record is not None else []
        marks = [self._mark(current, previous) for previous, current in pairwise(window)]
        if 0 < len(window) <= TIMELINE:  # the window reaches the oldest record held: nothing precedes it
            marks.insert(0, mark_of(window[0], None))
        config = record.config if record is not None and record.HasField("config") else self.config
        rate = _rate(window[-RATE_WINDOW:])
        stride = max(1, math.ceil(rate / HISTORY_RATE)) if rate else 1
        newest_first = self._digests_back(index, history, stride)
        alerts = self._alerts(newest_first, config, stride)
        views = self._views(record, index, newest_first, alerts)
        return ConsoleState(
            source=self.source,
            live=self.live,
            connection=self._connection(),
            run_id=self.run_id,
            dp_size=self.dp_size,
            server_state=self.server_state,
            record=record,
            newest_round=self.history[-1].round if self.history else None,
            rounds_per_s=rate,
            dropped=self.dropped,
            config=config,
            stats=self.stats,
            marks=tuple(marks),
            figures=figures(marks),
            paused=self.paused,
            behind=len(self.history) - 1 - index if record is not None else 0,
            notice=self._notice(config),
            executor=self.executor,
            summary=Summary.of(newest_first[0] if newest_first else None),
            views=tuple(views),
            history=tuple(reversed(newest_first)),
            alerts=tuple(alerts),
            sort_key=self.sort_key,
            sort_reverse=self.sort_reverse,
            rank_filter=self.rank_filter,
            age_s=self.clock() - self.last_record_at if self.live and self.last_record_at is not None else None,
            held=index + 1,
            stride=stride,
        )

    def _digests_back(self, index: int, count: int, stride: int = 1) -> list[Digest]:
        """Up to `count` digests ending at `index`, newest first: every round, or every `stride`-th (the
        shown one first, then rounds that are multiples of the stride, so a tick reuses the last one's)."""
        if index < 0:
            return []
        out = [self.digest_at(index)]
        if stride > 1:
            index -= (self.history[index].round % stride) or stride
        else:
            index -= 1
        while index >= 0 and len(out) < count:
            out.append(self.digest_at(index))
            index -= stride
        return out

    def _mark(self, record: pb.RoundRecord, previous: pb.RoundRecord) -> Mark:
        mark = self._marks.get(record.round)
        if mark is None:
            mark = mark_of(record, previous)
            self._marks[record.round] = mark
        return mark

    def _alerts(self, newest_first: list[Digest], config: pb.GateConfig | None, stride: int) -> list[Alert]:
        return rank_alerts(newest_first, self.bounds, stride) + run_alerts(self.stats, self.dropped, config,
                                                                          self.bounds)

    def _since(self, index: int, size: int) -> tuple[int | None, ...]:
        """Rounds since each rank last extended, exactly (every record, not a sample): a record's
        `ranks_extending` says whether its rows need reading at all."""
        out: list[int | None] = [None] * size
        remaining = size
        shown = self.history[index].round
        for offset, record in enumerate(islice(reversed(self.history), len(self.history) - 1 - index, None)):
            if not record.ranks_extending and offset:
                continue
            for position, row in enumerate(record.ranks):
                if position < size and out[position] is None and row.num_extends:
                    out[position] = shown - record.round
                    remaining -= 1
            if not remaining:
                break
        return tuple(out)

    def _views(
        self, record: pb.RoundRecord | None, index: int, newest_first: list[Digest], alerts: list[Alert]
    ) -> list[RankView]:
        if record is None or not newest_first:
            return []
        shown = newest_first[0]
        since = self._since(index, shown.size)
        alerting = {alert.rank for alert in alerts if alert.rank is not None}
        views = [
            RankView(
                row=row,
                position=position,
                blocks=bool(shown.blocks >> position & 1),
                contested=bool(shown.blocks >> position & 1) and bool(shown.want & ~(1 << position)),
                since=since[position],
                alert=row.rank in alerting,
            )
            for position, row in enumerate(record.ranks)
        ]
        views = [view for view in views if self.rank_filter(view)]
        return sort_views(views, self.sort_key, self.sort_reverse)

    def _notice(self, config: pb.GateConfig | None) -> str:
        if self.live and self.link not in CURRENT:
            return ""  # the link's own detail says what matters now
        if self.live and self.clock() - self.notice_at > NOTICE_S:
            return ""
        if self.notice_epoch is not None and (config is None or config.epoch != self.notice_epoch):
            return ""
        return self.notice_text

    def _connection(self) -> Connection:
        now = self.clock()
        retry = max(self.retry_at - now, 0.0) if self.retry_at is not None else None
        if self.link is Link.LIVE and self.last_record_at is not None:
            silent = now - self.last_record_at
            if silent > STALE_AFTER_S:
                return Connection(Link.STALE, self.detail, stale_s=silent)
        return Connection(self.link, self.detail, retry_in_s=retry)

    def _shown_index(self) -> int:
        last = len(self.history) - 1
        if self.cursor is None or not self.history:
            return last
        # Rounds are consecutive unless records were dropped: try the arithmetic guess, then search.
        guess = self.cursor - self.history[0].round
        if 0 <= guess <= last and self.history[guess].round == self.cursor:
            return guess
        if self.cursor < self.history[0].round:
            return 0
        for index in range(last, -1, -1):
            if self.history[index].round <= self.cursor:
                return index
        return 0


def _before(history: deque[pb.RoundRecord], index: int, count: int) -> list[pb.RoundRecord]:
    """Up to `count + 1` records ending at `index`, oldest first (one extra to see the gap before the first)."""
    if index == len(history) - 1:
        newest_first = list(islice(reversed(history), count + 1))
        newest_first.reverse()
        return newest_first
    return list(islice(history, max(index - count, 0), index + 1))


def mark_of(record: pb.RoundRecord, previous: pb.RoundRecord | None) -> Mark:
    """The timeline's view of one record (`previous`: the record before it, to see a gap)."""
    gap = record.dropped_before > 0 or (previous is not None and record.round != previous.round + 1)
    return Mark(record.round, record.point, record.open, record.counter, record.ranks_extending, gap)


def _row_of(record: pb.RoundRecord, rank: int) -> pb.RankRow | None:
    rows = record.ranks
    if rank < len(rows) and rows[rank].rank == rank:
        return rows[rank]
    return next((row for row in rows if row.rank == rank), None)


def _rate(window: list[pb.RoundRecord]) -> float | None:
    """Rounds per second of server time across `window` (None until two records span some time)."""
    if len(window) < 2:
        return None
    seconds = (window[-1].unix_nanos - window[0].unix_nanos) / 1e9
    return (window[-1].round - window[0].round) / seconds if seconds > 0 else None


def figures(marks: Iterable[Mark]) -> WindowFigures:
    """Counts and shares over the timeline's rounds."""
    rounds = extend = opened = extending = 0
    counts = {(pb.GATE_POINT_ANY, True): 0, (pb.GATE_POINT_ANY, False): 0, (pb.GATE_POINT_ALL, True): 0,
              (pb.GATE_POINT_ALL, False): 0}
    for mark in marks:
        rounds += 1
        if mark.ranks_extending:
            extend += 1
        if mark.open:
            opened += 1
            extending += mark.ranks_extending
        key = (mark.point, mark.open)
        if key in counts:
            counts[key] += 1
    return WindowFigures(
        rounds=rounds,
        extend_share=extend / rounds if rounds else None,
        ranks_per_window=extending / opened if opened else None,
        any_open=counts[(pb.GATE_POINT_ANY, True)],
        any_shut=counts[(pb.GATE_POINT_ANY, False)],
        all_open=counts[(pb.GATE_POINT_ALL, True)],
        all_shut=counts[(pb.GATE_POINT_ALL, False)],
    )
