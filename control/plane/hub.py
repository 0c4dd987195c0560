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

A stream may ask for batches (`max_batch` > 1, LOSSLESS_BOUNDED only): a frame then carries up to
`max_batch` records, the first as the message and the rest in its `following` field (each a nested
record with its own freshness fields). A batch leaves when it is full or `max_delay_s` after its first
record was published, whichever comes first; what is already queued goes out at once. While a batch
waits, the stream is woken once (full, or the delay passed), not per record: that is where batching
saves the server's work, and the client's.

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
MAX_BATCH = 1024
DEFAULT_BATCH_DELAY_S = 0.050
MAX_BATCH_DELAY_S = 1.0
# A batch stops growing past this many bytes: well under gRPC's default 4 MiB receive limit.
MAX_BATCH_BYTES = 1 << 20
# The tag of RoundRecord.following (field 60, length-delimited): the frame of a batch is built from
# the records' shared bytes without parsing them.
_FOLLOWING_TAG = bytes([0xE2, 0x03])

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

    __slots__ = ("_bytes", "_pb", "origin_of", "published", "record", "run_id")

    def __init__(self, record: RoundRecord, run_id: str, origin_of: OriginOf | None = None) -> None:
        self.record = record
        self.run_id = run_id
        self.origin_of = origin_of
        self.published = time.monotonic()  # when the hub got it: a batch's delay counts from here
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
        max_batch: int = 1,
        max_delay_s: float = DEFAULT_BATCH_DELAY_S,
    ) -> None:
        self.hub = hub
        self.latest_only = latest_only
        self.max_queue = 1 if latest_only else max_queue
        self.max_batch = 1 if latest_only else max(1, max_batch)
        self.max_delay_s = max_delay_s
        self._wake_at = 1  # queued records that wake the writer: more while a batch waits to fill
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
        if len(queue) >= self._wake_at:
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
        """The next message's wire bytes (None once closed and drained); raises StreamFailed.

        The records are chosen now, when the caller is ready to write: the newest in LATEST_ONLY; with
        batching, what is queued, then what arrives until the batch is full or its delay passed.
        """
        while True:
            if self.failure is not None:
                raise StreamFailed(self.failure)
            entry = self._pop()
            if entry is not None:
                break
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        batch = [entry]
        if self.max_batch > 1:
            await self._fill(batch)
        # One write: every record of it has the same freshness fields, serialized once (dropped_before 0
        # is protobuf's default, so a record that skipped nothing needs no bytes of its own beyond these).
        fresh = pb.RoundRecord(latest_round=self.hub.last_round or 0, sent_unix_nanos=time.time_ns())
        fresh_bytes = fresh.SerializeToString()
        first = self._encode(batch[0], fresh_bytes)
        if len(batch) == 1:
            return first
        parts = [first]
        for entry in batch[1:]:
            body = self._encode(entry, fresh_bytes)
            parts += (_FOLLOWING_TAG, _varint(len(body)), body)
        return b"".join(parts)

    def _pop(self) -> _Entry | None:
        if self._replay:
            return self._replay.popleft()
        if self._queue:
            return self._queue.popleft()
        return None

    async def _fill(self, batch: list[_Entry]) -> None:
        """Add records to `batch` until it is full, about MAX_BATCH_BYTES, or its delay passed."""
        deadline = batch[0].published + self.max_delay_s
        size = len(batch[0].bytes)
        loop = asyncio.get_running_loop()
        while len(batch) < self.max_batch and size < MAX_BATCH_BYTES:
            if self.failure is not None:
                raise StreamFailed(self.failure)
            entry = self._pop()
            if entry is not None:
                batch.append(entry)
                size += len(entry.bytes)
                continue
            wait_s = deadline - time.monotonic()
            if self.closed or wait_s <= 0:
                return
            # Woken once: when the rest of the batch is queued (or the queue is full: taking it then loses
            # nothing to the bound), at the deadline, or on close/fail.
            self._wake_at = min(self.max_batch - len(batch), self.max_queue)
            self._ready.clear()
            timer = loop.call_later(wait_s, self._ready.set)
            try:
                await self._ready.wait()
            finally:
                timer.cancel()
                self._wake_at = 1

    def _encode(self, entry: _Entry, fresh: bytes) -> bytes:
        """One record's bytes with this stream's own fields (dropped_before, then `fresh`) merged in."""
        round_index = entry.record.round
        dropped = max(0, round_index - self._previous - 1)
        self._previous = round_index
        self.dropped_total += dropped
        body = entry.bytes if not self.ranks else self._filtered(entry)
        if dropped:
            body += pb.RoundRecord(dropped_before=dropped).SerializeToString()
        return body + fresh

    async def next(self) -> pb.RoundRecord | None:
        """The next message (None once closed and drained); raises StreamFailed."""
        frame = await self.next_frame()
        return None if frame is None else pb.RoundRecord.FromString(frame)

    def _filtered(self, entry: _Entry) -> bytes:
        copy = pb.RoundRecord()
        copy.CopyFrom(entry.pb)
        del copy.ranks[:]
        copy.ranks.extend(row for row in entry.pb.ranks if row.rank in self.ranks)
        return copy.SerializeToString()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def watch_violations(
    max_queue: int, max_batch: int, max_batch_delay_s: float, latest_only: bool
) -> list[tuple[str, str]]:
    """(field, problem) for each bad stream parameter; empty when all are good."""
    out = []
    if not 0 <= max_queue <= MAX_QUEUE:
        out.append(("max_queue", f"must be in [0, {MAX_QUEUE}] (0: the default {DEFAULT_QUEUE}), got {max_queue}"))
    if not 0 <= max_batch <= MAX_BATCH:
        out.append(("max_batch", f"must be in [0, {MAX_BATCH}] (0 or 1: one record per message), got {max_batch}"))
    elif max_batch > 1 and latest_only:
        out.append(("max_batch", f"must be 0 or 1 in LATEST_ONLY (it sends the newest record alone), got {max_batch}"))
    if not 0 <= max_batch_delay_s <= MAX_BATCH_DELAY_S:
        limit, default, got = (round(s * 1000) for s in (MAX_BATCH_DELAY_S, DEFAULT_BATCH_DELAY_S, max_batch_delay_s))
        out.append(("max_batch_delay_ms", f"must be in [0, {limit}] (0: the default {default}), got {got}"))
    return out


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
        self,
        *,
        from_round: int | None = None,
        latest_only: bool = False,
        max_queue: int = 0,
        ranks: Iterable[int] = (),
        max_batch: int = 0,
        max_batch_delay_s: float = 0.0,
    ) -> Subscriber:
        """A new subscriber, replaying history from `from_round` when given; raises OutOfHistory.

        `max_batch` (0 or 1: one record per frame) and `max_batch_delay_s` (0: the default) batch the
        frames. After `close_all` the subscriber is closed at once (it still receives the history it
        asked for); after `fail_all` it fails at once. Bad parameters raise ValueError, nothing changed.
        """
        for problem in watch_violations(max_queue, max_batch, max_batch_delay_s, latest_only):
            raise ValueError(f"{problem[0]} {problem[1]}")
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
            self,
            latest_only,
            max_queue or DEFAULT_QUEUE,
            ranks,
            previous_round=previous,
            replay=replay,
            max_batch=max_batch,
            max_delay_s=max_batch_delay_s or DEFAULT_BATCH_DELAY_S,
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
