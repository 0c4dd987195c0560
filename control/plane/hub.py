"""The round hub: a history ring and one bounded queue per stream subscriber.

The engine never waits for a subscriber: `publish` only appends. A subscriber that falls behind loses
its oldest records (LOSSLESS_BOUNDED) or everything but the newest (LATEST_ONLY). What a stream
skipped is exact: every record carries `dropped_before = round - previous round - 1`, whether the
rounds were lost to the subscriber's bound or to the engine's hand-off. A resume replays every held
round from `from_round` on, whatever the bound; the bound applies to what is published meanwhile.

Records are converted to protobuf and serialized once, lazily, when someone reads them; a stream's
frame is those shared bytes plus a few bytes of its own (`dropped_before`, and the freshness fields
`latest_round` and `sent_unix_nanos`), which protobuf merges on parsing. Taps are the lossless
exception: synchronous consumers of every record's protobuf form (the recorder), called inside
`publish`, so they must be quick and must not raise.

A stream ends cleanly (`close_all`, after what it has queued) or with a failure (`fail_all`, at once,
with the reason) when the engine crashed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable

from engine.record import RoundRecord
from prefill_gate.convert import OriginOf, round_record
from prefill_gate.v1 import types_pb2 as pb

DEFAULT_QUEUE = 1024
MAX_QUEUE = 65536

Tap = Callable[[pb.RoundRecord], None]


class OutOfHistory(LookupError):
    """A resume point older than the history ring holds."""

    def __init__(self, wanted: int, first: int | None) -> None:
        where = "no rounds are held yet" if first is None else f"history starts at round {first}"
        super().__init__(f"round {wanted} is no longer held: {where}")
        self.wanted = wanted
        self.first = first


class StreamFailed(RuntimeError):
    """The engine stopped abnormally; the message says why."""


class _Entry:
    """A record with its protobuf form and bytes, built on first use and shared by every reader."""

    __slots__ = ("_bytes", "_pb", "origin_of", "record", "run_id")

    def __init__(self, record: RoundRecord, run_id: str, origin_of: OriginOf | None = None) -> None:
        self.record = record
        self.run_id = run_id
        self.origin_of = origin_of
        self._pb: pb.RoundRecord | None = None
        self._bytes: bytes | None = None

    @property
    def pb(self) -> pb.RoundRecord:
        if self._pb is None:
            self._pb = round_record(self.record, self.run_id, self.origin_of)
        return self._pb

    @property
    def bytes(self) -> bytes:
        if self._bytes is None:
            self._bytes = self.pb.SerializeToString()
        return self._bytes


class Subscriber:
    """One stream: the history it asked to replay, then a bounded queue of live records."""

    def __init__(
        self,
        hub: RoundHub,
        latest_only: bool,
        max_queue: int,
        ranks: Iterable[int] = (),
        *,
        previous_round: int = -1,
        replay: Iterable[_Entry] = (),
    ) -> None:
        self.hub = hub
        self.latest_only = latest_only
        self.max_queue = 1 if latest_only else max_queue
        self.ranks = frozenset(ranks)
        self._replay: deque[_Entry] = deque(replay)
        self._queue: deque[_Entry] = deque()
        self._previous = previous_round  # the round before the first this stream wants
        self.dropped_total = 0
        self.closed = False
        self.failure: str | None = None
        self.min_round = previous_round + 1
        self._ready = asyncio.Event()

    def offer(self, entry: _Entry) -> None:
        """Queue a live record, dropping the oldest beyond the bound."""
        if self.closed or entry.record.round < self.min_round:
            return
        queue = self._queue
        if len(queue) >= self.max_queue:
            queue.popleft()
            if self.latest_only:
                self._replay.clear()  # the newest is all this stream wants
        queue.append(entry)
        self._ready.set()

    def close(self) -> None:
        """End the stream after what is queued."""
        self.closed = True
        self._ready.set()

    def fail(self, reason: str) -> None:
        """End the stream at once: the engine stopped abnormally."""
        self.failure = reason
        self.closed = True
        self._ready.set()

    async def next_frame(self) -> bytes | None:
        """The next record's wire bytes (None once closed and drained); raises StreamFailed.

        The record is chosen now, when the caller is ready to write it: the newest in LATEST_ONLY.
        """
        while True:
            if self.failure is not None:
                raise StreamFailed(self.failure)
            if self._replay:
                entry = self._replay.popleft()
                break
            if self._queue:
                entry = self._queue.popleft()
                break
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        round_index = entry.record.round
        dropped = max(0, round_index - self._previous - 1)
        self._previous = round_index
        self.dropped_total += dropped
        body = entry.bytes if not self.ranks else self._filtered(entry)
        own = pb.RoundRecord(
            dropped_before=dropped,
            latest_round=self.hub.last_round or 0,
            sent_unix_nanos=time.time_ns(),
        )
        return body + own.SerializeToString()

    async def next(self) -> pb.RoundRecord | None:
        """The next record as a message (None once closed and drained); raises StreamFailed."""
        frame = await self.next_frame()
        return None if frame is None else pb.RoundRecord.FromString(frame)

    def _filtered(self, entry: _Entry) -> bytes:
        copy = pb.RoundRecord()
        copy.CopyFrom(entry.pb)
        del copy.ranks[:]
        copy.ranks.extend(row for row in entry.pb.ranks if row.rank in self.ranks)
        return copy.SerializeToString()


class RoundHub:
    """History ring plus subscribers; all methods run on the controller's event loop."""

    def __init__(self, run_id: str, history: int = 4096, origin_of: OriginOf | None = None) -> None:
        if history < 1:
            raise ValueError(f"history must hold at least one round, got {history}")
        self.run_id = run_id
        self.origin_of = origin_of  # who made each config epoch and why, for the records' GateConfig
        self._history: deque[_Entry] = deque(maxlen=history)
        self._subscribers: set[Subscriber] = set()
        self._taps: list[Tap] = []
        self.closed = False
        self.failure: str | None = None

    def publish(self, record: RoundRecord) -> None:
        """Append a round; never blocks."""
        entry = _Entry(record, self.run_id, self.origin_of)
        self._history.append(entry)
        for subscriber in self._subscribers:
            subscriber.offer(entry)
        for tap in self._taps:
            tap(entry.pb)

    def add_tap(self, tap: Tap) -> None:
        """Call `tap` with every record published from now on (lossless, on the publishing loop)."""
        self._taps.append(tap)

    def remove_tap(self, tap: Tap) -> None:
        """Stop calling `tap`."""
        self._taps.remove(tap)

    def resize(self, history: int) -> None:
        """Hold up to `history` rounds from now on, keeping the newest already held."""
        if history < 1:
            raise ValueError(f"history must hold at least one round, got {history}")
        self._history = deque(self._history, maxlen=history)

    @property
    def capacity(self) -> int:
        """Rounds the history ring holds at most."""
        return self._history.maxlen or 0

    @property
    def first_round(self) -> int | None:
        """Oldest round held."""
        return self._history[0].record.round if self._history else None

    @property
    def last_round(self) -> int | None:
        """Newest round held."""
        return self._history[-1].record.round if self._history else None

    def latest(self) -> pb.RoundRecord | None:
        """The newest record as protobuf."""
        return self._history[-1].pb if self._history else None

    def subscribe(
        self, *, from_round: int | None = None, latest_only: bool = False, max_queue: int = 0, ranks: Iterable[int] = ()
    ) -> Subscriber:
        """A new subscriber, replaying history from `from_round` when given; raises OutOfHistory.

        After `close_all` the subscriber is closed at once (it still receives the history it asked
        for); after `fail_all` it fails at once.
        """
        if max_queue < 0 or max_queue > MAX_QUEUE:
            raise ValueError(f"max_queue must be in [0, {MAX_QUEUE}], got {max_queue}")
        replay: list[_Entry] = []
        last = self.last_round
        previous = last if last is not None else -1
        if from_round is not None:
            first = self.first_round
            if first is not None and from_round < first:
                raise OutOfHistory(from_round, first)
            previous = from_round - 1  # a future round: the stream starts when it happens
            replay = [entry for entry in self._history if entry.record.round >= from_round]
            if latest_only:
                replay = replay[-1:]
        subscriber = Subscriber(
            self, latest_only, max_queue or DEFAULT_QUEUE, ranks, previous_round=previous, replay=replay
        )
        subscriber.min_round = max(previous, last if last is not None else -1) + 1
        if self.failure is not None:
            subscriber.fail(self.failure)
        elif self.closed:
            subscriber.close()
        else:
            self._subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Forget a subscriber (its stream ended)."""
        self._subscribers.discard(subscriber)

    def close_all(self) -> None:
        """End every stream cleanly after what it has queued (drain); later subscribers end at once."""
        self.closed = True
        for subscriber in self._subscribers:
            subscriber.close()

    def fail_all(self, reason: str) -> None:
        """End every stream at once with `reason` (the engine crashed); later subscribers fail at once."""
        self.failure = reason
        self.closed = True
        for subscriber in self._subscribers:
            subscriber.fail(reason)

    def rounds(self, first: int, last: int | None, ranks: Iterable[int] = ()) -> list[pb.RoundRecord]:
        """Held records with `first <= round <= last` (last None: up to the newest)."""
        keep = frozenset(ranks)
        out = []
        for entry in self._history:
            round_index = entry.record.round
            if round_index < first or (last is not None and round_index > last):
                continue
            message = entry.pb
            if keep:
                copy = pb.RoundRecord()
                copy.CopyFrom(message)
                del copy.ranks[:]
                copy.ranks.extend(row for row in message.ranks if row.rank in keep)
                message = copy
            out.append(message)
        return out

    @property
    def subscriber_count(self) -> int:
        """Streams attached now."""
        return len(self._subscribers)
