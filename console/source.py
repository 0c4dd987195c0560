"""Where records come from: a live server's WatchRounds stream, or a recording replayed at its own pace.

Both sources have one shape: `await source.run(sink, limit)` runs in an async worker on the app's
loop and calls the sink (the store) as data arrives; it returns when the data ends, after `limit`
records (deterministic tests), or when the worker is cancelled. Nothing here renders: the app's tick does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import grpc

from console.admin import AdminClient
from console.endpoint import Endpoint, describe_rpc_error
from console.state import Link
from console.store import TIMELINE
from control.plane.recording import RecordingError, RecordingReader
from prefill_gate.v1 import telemetry_pb2
from prefill_gate.v1 import types_pb2 as pb

SNAPSHOT_EVERY_S = 1.0  # run-level figures change slowly; the stream carries everything per round
CALL_TIMEOUT_S = 3.0
BACKFILL = TIMELINE  # rounds asked from the server's history on a fresh connection
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 5.0)  # reconnect delays; the last repeats
_PERMANENT = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)


class Sink(Protocol):
    """What a source feeds (the console's `Store`)."""

    run_id: str
    dp_size: int
    paused: bool

    @property
    def newest(self) -> pb.RoundRecord | None: ...

    def record(self, record: pb.RoundRecord) -> None: ...

    def snapshot(self, snapshot: pb.Snapshot) -> None: ...

    def status(self, link: Link, detail: str = "", retry_in_s: float | None = None) -> None: ...

    def notice(self, text: str) -> None: ...


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
        poller = asyncio.create_task(self._poll_snapshots(sink))
        try:
            while limit is None or received < limit:
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
                    async for record in call:
                        sink.record(record)
                        attempt = 0
                        received += 1
                        if limit is not None and received >= limit:
                            call.cancel()
                            return
                    reason = "the server ended the stream (draining or stopped)"
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
                delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                attempt += 1
                sink.status(Link.RECONNECTING, f"{reason}; attempt {attempt}", retry_in_s=delay)
                await asyncio.sleep(delay)
        finally:
            poller.cancel()

    def _watch_request(self, sink: Sink, snapshot: pb.Snapshot) -> telemetry_pb2.WatchRoundsRequest:
        request = telemetry_pb2.WatchRoundsRequest(mode=telemetry_pb2.WATCH_MODE_LOSSLESS_BOUNDED)
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


class ReplaySource:
    """A recording played back on its own clock (`speed` x; 0: as fast as possible). Playback holds while
    the view is paused, so space pauses a replay the way it pauses a video."""

    live = False
    admin: AdminClient | None = None

    def __init__(
        self,
        records: Iterator[pb.RoundRecord],
        name: str,
        *,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        header: pb.RecordingHeader | None = None,
    ) -> None:
        self.records = records
        self.name = name
        self.speed = speed
        self.clock = clock
        self.header = header

    @classmethod
    def from_file(cls, path: str | Path, *, speed: float = 1.0) -> ReplaySource:
        """Open a recording; raises RecordingError or OSError (messages fit for the user) when it is not one."""
        reader = RecordingReader(path)
        return cls(iter(reader), str(path), speed=speed, header=reader.header)

    async def run(self, sink: Sink, limit: int | None = None) -> None:
        """Deliver records on the recording's clock until the end, or `limit` records."""
        if self.header is not None:
            sink.run_id = self.header.run_id
            sink.dp_size = self.header.dp_size
        sink.status(Link.REPLAY, f"{self.name} at {self.speed:g}x" if self.speed > 0 else f"{self.name} at full speed")
        count = 0
        origin_ns: int | None = None
        started = self.clock()
        try:
            for record in self.records:
                while sink.paused:
                    held = self.clock()
                    await asyncio.sleep(0.05)
                    started += self.clock() - held
                if origin_ns is None:
                    origin_ns = record.unix_nanos
                if self.speed > 0:
                    due = started + (record.unix_nanos - origin_ns) / 1e9 / self.speed
                    wait = due - self.clock()
                    if wait > 0.002:  # deliver everything already due in one go; sleep only for the future
                        # A recording with an idle stretch would otherwise hold the replay for its whole length.
                        await asyncio.sleep(min(wait, 1.0))
                        if wait > 1.0:
                            started -= wait - 1.0
                elif count % 256 == 255:
                    await asyncio.sleep(0)  # full speed still lets the UI breathe
                sink.record(record)
                count += 1
                if limit is not None and count >= limit:
                    return
        except RecordingError as exc:
            # A recording of a killed run ends inside a record: what came before it is still worth showing.
            sink.notice(f"{exc}; replayed the {count} rounds before it")
        sink.status(Link.ENDED, f"end of {self.name}: {count} rounds replayed")

    async def close(self) -> None:
        """Close the recording (also when the app quits before its end)."""
        close = getattr(self.records, "close", None)  # a generator over the reader closes the file
        if close is not None:
            close()
