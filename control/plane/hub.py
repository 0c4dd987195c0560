"""The round hub: a history ring and one bounded queue per stream subscriber.

The engine never waits for a subscriber: `publish` only appends. A subscriber that falls behind loses
its oldest records (LOSSLESS_BOUNDED) or everything but the newest (LATEST_ONLY), and the next record
it receives says how many it lost (`dropped_before`). Records are converted to protobuf once, lazily,
when someone reads them. Taps are the lossless exception: synchronous consumers of every record's
protobuf form (the recorder), called inside `publish`, so they must be quick and must not raise.
"""

from __future__ import annotations

import asyncio
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


class _Entry:
    """A record with its protobuf form, built on first use and shared by every reader."""

    __slots__ = ("_pb", "origin_of", "record", "run_id")

    def __init__(self, record: RoundRecord, run_id: str, origin_of: OriginOf | None = None) -> None:
        self.record = record
        self.run_id = run_id
        self.origin_of = origin_of
        self._pb: pb.RoundRecord | None = None

    @property
    def pb(self) -> pb.RoundRecord:
        if self._pb is None:
            self._pb = round_record(self.record, self.run_id, self.origin_of)
        return self._pb


class Subscriber:
    """One stream's bounded queue."""

    def __init__(self, latest_only: bool, max_queue: int, ranks: Iterable[int] = ()) -> None:
        self.latest_only = latest_only
        self.max_queue = 1 if latest_only else max_queue
        self.ranks = frozenset(ranks)
        self._queue: deque[_Entry] = deque()
        self._dropped = 0
        self.dropped_total = 0
        self.closed = False
        self.min_round = 0
        self._ready = asyncio.Event()

    def offer(self, entry: _Entry) -> None:
        """Queue a record, dropping the oldest beyond the bound."""
        if self.closed or entry.record.round < self.min_round:
            return
        while len(self._queue) >= self.max_queue:
            self._queue.popleft()
            self._dropped += 1
            self.dropped_total += 1
        self._queue.append(entry)
        self._ready.set()

    def close(self) -> None:
        """End the stream after what is queued."""
        self.closed = True
        self._ready.set()

    async def next(self) -> pb.RoundRecord | None:
        """The next record (None once closed and drained), with `dropped_before` and the rank filter applied."""
        while not self._queue:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        entry = self._queue.popleft()
        message = entry.pb
        if self._dropped or self.ranks:
            copy = pb.RoundRecord()
            copy.CopyFrom(message)
            copy.dropped_before = self._dropped
            if self.ranks:
                kept = [row for row in message.ranks if row.rank in self.ranks]
                del copy.ranks[:]
                copy.ranks.extend(kept)
            self._dropped = 0
            message = copy
        return message


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
        """A new subscriber, primed from history when `from_round` is given; raises OutOfHistory.

        After `close_all` the subscriber is closed at once: it still receives what history it asked for.
        """
        if max_queue < 0 or max_queue > MAX_QUEUE:
            raise ValueError(f"max_queue must be in [0, {MAX_QUEUE}], got {max_queue}")
        subscriber = Subscriber(latest_only, max_queue or DEFAULT_QUEUE, ranks)
        if from_round is not None:
            first = self.first_round
            if first is not None and from_round < first:
                raise OutOfHistory(from_round, first)
            subscriber.min_round = from_round  # a future round: the stream starts when it happens
            for entry in self._history:
                subscriber.offer(entry)
        if self.closed:
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
