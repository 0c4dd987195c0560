"""Where records come from: a live server's WatchRounds stream, or a recording replayed at its own pace.

Both sources have one shape: `await source.run(sink, limit)` runs in an async worker on the app's
loop and calls the sink (the store) as data arrives; it returns when the data ends, after `limit`
records (deterministic tests), or when the worker is cancelled. Nothing here renders: the app's tick does.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import grpc

from console.admin import AdminClient
from console.endpoint import Endpoint, describe_rpc_error
from console.state import Link
from console.store import TIMELINE
from control.plane.recording import RecordingError, RecordingIndex
from prefill_gate.v1 import telemetry_pb2
from prefill_gate.v1 import types_pb2 as pb

SNAPSHOT_EVERY_S = 1.0  # run-level figures change slowly; the stream carries everything per round
CALL_TIMEOUT_S = 3.0
BACKFILL = TIMELINE  # rounds asked from the server's history on a fresh connection
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 5.0)  # reconnect delays; the last repeats
# Rounds per WatchRounds message: gRPC's client spends ~0.2 ms of CPU per message, a fifth of a core
# at 1,000 rounds/s one by one. A batch waits at most WATCH_BATCH_DELAY_MS for company, half a frame
# at 10 frames/s; a server without batching ignores both fields and sends one record per message.
WATCH_BATCH = 128
WATCH_BATCH_DELAY_MS = 50
_PERMANENT = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)


class Sink(Protocol):
    """What a source feeds (the console's `Store`)."""

    run_id: str
    dp_size: int
    executor: str
    paused: bool
    cursor: int | None
    link: Link
    history: deque[pb.RoundRecord]

    @property
    def newest(self) -> pb.RoundRecord | None: ...

    def record(self, record: pb.RoundRecord) -> None: ...

    def snapshot(self, snapshot: pb.Snapshot) -> None: ...

    def status(self, link: Link, detail: str = "", retry_in_s: float | None = None) -> None: ...

    def notice(self, text: str, epoch: int | None = None) -> None: ...

    def reset(self) -> None: ...

    def truncate_after(self, round_: int) -> None: ...


class Source(Protocol):
    """A live server or a recording."""

    name: str
    live: bool
    admin: AdminClient | None

    async def run(self, sink: Sink, limit: int | None = None) -> None: ...

    async def close(self) -> None: ...


class GrpcSource:
    """WatchRounds (lossless-bounded: the timeline needs every round) plus a GetSnapshot poll, reconnecting
    with backoff and resuming from the next round when the same run is still there."""

    live = True

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.name = endpoint.target
        self.admin: AdminClient | None = AdminClient(endpoint)
        self._resume = True  # False once: the server no longer holds the resume point

    async def run(self, sink: Sink, limit: int | None = None) -> None:
        """Stream until cancelled, a permanent error, or `limit` records."""
        attempt = 0
        received = 0
        stopped = ""  # set when the server ended the stream cleanly: the engine stopped
        poller = asyncio.create_task(self._poll_snapshots(sink))
        try:
            while limit is None or received < limit:
                if not stopped:
                    sink.status(Link.CONNECTING if attempt == 0 else Link.RECONNECTING, f"connecting to {self.name}")
                try:
                    snapshot = await self.endpoint.telemetry().GetSnapshot(
                        telemetry_pb2.GetSnapshotRequest(), metadata=self.endpoint.metadata, timeout=CALL_TIMEOUT_S
                    )
                    sink.snapshot(snapshot)
                    call = self.endpoint.telemetry().WatchRounds(
                        self._watch_request(sink, snapshot), metadata=self.endpoint.metadata
                    )
                    sink.status(Link.LIVE, f"streaming from {self.name}")
                    stopped = ""
                    async for message in call:
                        attempt = 0
                        for record in unbatch(message):
                            sink.record(record)
                            received += 1
                            if limit is not None and received >= limit:
                                call.cancel()
                                return
                    newest = sink.newest
                    stopped = "stream ended: the engine stopped" + (
                        f" after round {newest.round:,}" if newest is not None else ""
                    )
                except grpc.aio.AioRpcError as exc:
                    if exc.code() in _PERMANENT:
                        sink.status(Link.FAILED, describe_rpc_error(exc, self.name))
                        return
                    if exc.code() is grpc.StatusCode.OUT_OF_RANGE:
                        # The resume point left the server's history: start from the next round instead;
                        # the jump in round numbers is counted as dropped.
                        sink.notice(f"resume point no longer held by the server: {exc.details()}")
                        self._resume = False
                        continue
                    reason = describe_rpc_error(exc, self.name)
                    if not stopped and getattr(sink, "server_state", "") in ("draining", "stopped"):
                        # The server said it was stopping, then the stream broke (a console that fell
                        # behind is cut off when the drain's grace ends): the engine stopped all the same.
                        newest = sink.newest
                        stopped = "stream ended: the engine stopped" + (
                            f" after round {newest.round:,}" if newest is not None else ""
                        )
                delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                attempt += 1
                if stopped:
                    # Stays "stopped" while nothing answers: a restart shows up as a new run.
                    detail = f"{stopped}; watching for a restart"  # what answers meanwhile is beside the point
                    sink.status(Link.STOPPED, detail, retry_in_s=delay)
                else:
                    sink.status(Link.RECONNECTING, f"{reason}; attempt {attempt}", retry_in_s=delay)
                await asyncio.sleep(delay)
        finally:
            poller.cancel()

    def _watch_request(self, sink: Sink, snapshot: pb.Snapshot) -> telemetry_pb2.WatchRoundsRequest:
        request = telemetry_pb2.WatchRoundsRequest(
            mode=telemetry_pb2.WATCH_MODE_LOSSLESS_BOUNDED,
            max_batch=WATCH_BATCH,
            max_batch_delay_ms=WATCH_BATCH_DELAY_MS,
        )
        newest = sink.newest
        if self._resume and newest is not None and snapshot.run_id == sink.run_id:
            request.from_round = newest.round + 1  # same run: fill what was missed while away
        elif self._resume and newest is None and snapshot.HasField("latest"):
            # A fresh view: start from the server's history so the timeline is full at once.
            request.from_round = max(snapshot.history_first_round, snapshot.history_last_round - BACKFILL + 1)
        self._resume = True
        return request

    async def _poll_snapshots(self, sink: Sink) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_EVERY_S)
            try:
                snapshot = await self.endpoint.telemetry().GetSnapshot(
                    telemetry_pb2.GetSnapshotRequest(), metadata=self.endpoint.metadata, timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError:
                continue  # the stream reports the link's state; a missed snapshot only ages the figures
            if snapshot.run_id == sink.run_id:  # a restart is the stream's to notice, in order
                sink.snapshot(snapshot)

    async def close(self) -> None:
        """Close the channel."""
        await self.endpoint.close()


def unbatch(message: pb.RoundRecord) -> list[pb.RoundRecord]:
    """The records of one WatchRounds message, in round order: the message, then those that follow it."""
    if not message.following:
        return [message]
    following = list(message.following)
    message.ClearField("following")  # a stored record does not hold the rest of its batch
    return [message, *following]


class Records(Protocol):
    """Random access to a replay's records: a recording's index, or a list in memory."""

    error: RecordingError | None

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> pb.RoundRecord: ...

    def round_at(self, index: int) -> int: ...

    def index_of(self, round_: int) -> int: ...

    def close(self) -> None: ...


class RecordList:
    """Records held in memory (tests, samples), with the index's interface."""

    error: RecordingError | None = None

    def __init__(self, records: Sequence[pb.RoundRecord]) -> None:
        self.records = list(records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> pb.RoundRecord:
        return self.records[index]

    def round_at(self, index: int) -> int:
        """The round of the record at `index`."""
        return self.records[index].round

    def index_of(self, round_: int) -> int:
        """The last record whose round is <= `round_`."""
        return max(bisect.bisect_right([record.round for record in self.records], round_) - 1, 0)

    def close(self) -> None:
        """Nothing to release."""


class ReplaySource:
    """A recording played like a video: on its own clock (`speed` x; 0: as fast as it reads), paused while
    the view is paused, with its speed changeable while playing and any round reachable (`seek`).

    The records are read from the file's index as they are needed; the store holds only the rounds
    around the position (the timeline's and the history views' worth), never the whole file.
    """

    live = False
    admin: AdminClient | None = None

    def __init__(
        self,
        records: Records | Sequence[pb.RoundRecord],
        name: str,
        *,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        header: pb.RecordingHeader | None = None,
    ) -> None:
        self.records: Records = records if hasattr(records, "round_at") else RecordList(records)  # type: ignore[arg-type]
        self.name = name
        self.speed = speed
        self.clock = clock
        self.header = header
        self.next_index = 0  # the next record playback delivers
        self.playing = False
        self._timing = 0  # bumped by a seek or a speed change: playback restarts its clock

    @classmethod
    def from_file(cls, path: str | Path, *, speed: float = 1.0) -> ReplaySource:
        """Open and index a recording; raises RecordingError or OSError (messages fit for the user)."""
        index = RecordingIndex(path)
        return cls(index, str(path), speed=speed, header=index.header)

    def __len__(self) -> int:
        return len(self.records)

    def describe(self) -> str:
        """`run.pgrec at 2x`: the link line of a replay."""
        return f"{self.name} at {self.speed:g}x" if self.speed > 0 else f"{self.name} at full speed"

    def set_speed(self, speed: float, sink: Sink) -> None:
        """Play at `speed` x from now on (0: as fast as it reads)."""
        self.speed = max(speed, 0.0)
        self._timing += 1
        if sink.link is Link.REPLAY:
            sink.status(Link.REPLAY, self.describe())

    async def run(self, sink: Sink, limit: int | None = None) -> None:
        """Deliver records on the recording's clock from `next_index` to the end, or `limit` records."""
        if self.header is not None:
            sink.run_id = self.header.run_id
            sink.dp_size = self.header.dp_size
            sink.executor = self.header.executor
        sink.status(Link.REPLAY, self.describe())
        count = 0
        timing = -1
        origin_ns = started = 0.0
        self.playing = True
        try:
            while self.next_index < len(self.records):
                while sink.paused:
                    await asyncio.sleep(0.05)
                    timing = -1  # resume on a fresh clock: a pause is not time to catch up on
                record = self.records[self.next_index]
                if timing != self._timing:
                    timing, origin_ns, started = self._timing, record.unix_nanos, self.clock()
                if self.speed > 0:
                    due = started + (record.unix_nanos - origin_ns) / 1e9 / self.speed
                    wait = due - self.clock()
                    if wait > 0.002:  # deliver everything already due in one go; sleep only for the future
                        # An idle stretch in the recording plays as one second at most, and a seek or a
                        # speed change during the sleep takes effect within a tenth of a second.
                        await asyncio.sleep(min(wait, 0.1))
                        if wait > 1.0:
                            started -= wait - 1.0
                        continue
                elif count % 256 == 255:
                    await asyncio.sleep(0)  # full speed still lets the UI breathe
                self.next_index += 1
                sink.record(record)
                count += 1
                if limit is not None and count >= limit:
                    return
        except RecordingError as exc:
            # A record that does not parse ends playback; what came before it is still worth showing.
            sink.notice(f"{exc}; replayed the {self.next_index} rounds before it")
        finally:
            self.playing = False
        if self.records.error is not None:
            # A recording of a killed run ends inside a record: what came before it is still worth showing.
            sink.notice(f"{self.records.error}; replayed the {len(self.records)} rounds before it")
        sink.status(Link.ENDED, f"end of {self.name}: {len(self.records):,} rounds in the file")

    def seek(self, sink: Sink, index: int) -> int:
        """Show the record at `index` (clamped to the file): from the rounds held when it is there, else by
        reading the rounds before it from the file. Playback continues after it. Returns the index."""
        index = min(max(index, 0), len(self.records) - 1)
        if index < 0:
            return index
        target = self.records.round_at(index)
        history = sink.history
        if history and history[0].round <= target <= history[-1].round:
            sink.truncate_after(target)
        elif history and target > history[-1].round and index - self.records.index_of(history[-1].round) <= BACKFILL:
            for position in range(self.records.index_of(history[-1].round) + 1, index + 1):
                sink.record(self.records[position])  # a short step forward: read on
        else:
            sink.reset()
            for position in range(max(index - BACKFILL, 0), index + 1):
                sink.record(self.records[position])
        self.next_index = index + 1
        self._timing += 1
        if sink.paused:
            sink.cursor = target
        return index

    def shown_index(self, round_: int) -> int:
        """The file index of a round held."""
        return self.records.index_of(round_)

    async def close(self) -> None:
        """Close the recording (also when the app quits before its end)."""
        self.records.close()
