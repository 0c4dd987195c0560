"""Helpers for the console's Pilot tests: fixed records, a frozen clock, a scripted live source, the
screen as text, and a quick idle wait.

Pilot's `press` waits, after every key, until the process looks CPU-idle (at most a second, twice):
with a simulator and a gRPC server in the same process the test never looks idle, so every key cost
two seconds. `quick_idle` replaces that heuristic with some event-loop turns; Pilot still waits for
the screen's widgets to process every message queued before it returns, which is what the tests need.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from console.app import ConsoleApp
from console.state import Link
from prefill_gate.v1 import types_pb2 as pb

CONFIG = pb.GateConfig(epoch=2, attempt_interval=4, any_interval=12, enabled=True, policy="gate")


async def _few_turns(min_sleep: float = 0.0, max_sleep: float = 1.0) -> None:
    # A key bubbles from the focused widget through its screen to the app: a message hop per turn.
    for _ in range(25):
        await asyncio.sleep(0)


@pytest.fixture
def quick_idle(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pilot without its CPU-idle heuristic (see the module's docstring)."""
    import textual.app
    import textual.pilot

    monkeypatch.setattr(textual.app, "wait_for_idle", _few_turns)
    monkeypatch.setattr(textual.pilot, "wait_for_idle", _few_turns)
    yield


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def row(rank: int, **fields: object) -> pb.RankRow:
    """A rank row; `blocks_all` and `above_watermark` as the control plane's converter sets them."""
    message = pb.RankRow(rank=rank, **fields)
    message.blocks_all = message.has_decode_work and not message.want_prefill
    message.above_watermark = message.occupancy > 0.9
    return message


def record(round_index: int, rows: list[pb.RankRow], *, point: int = pb.GATE_POINT_NONE, opened: bool = False,
           counter: int = 0, dropped_before: int = 0, run_id: str = "run-a",
           config: pb.GateConfig = CONFIG) -> pb.RoundRecord:
    """A round record at 100 rounds/s of server time (counts as the control plane fills them)."""
    return pb.RoundRecord(
        round=round_index, unix_nanos=1_000_000_000 + round_index * 10_000_000, counter=counter, point=point,
        open=opened, ranks=rows, config=config, dropped_before=dropped_before, run_id=run_id,
        ranks_extending=sum(1 for r in rows if r.num_extends),
        ranks_wanting=sum(1 for r in rows if r.want_prefill),
        ranks_blocking_all=sum(1 for r in rows if r.blocks_all),
    )


class ScriptedLive:
    """A live source driven by the test: it delivers `records`, then holds the link as the test sets it
    (the store's `status` is what a real source calls when its stream drops)."""

    live = True
    name = "127.0.0.1:50151"

    def __init__(self, records: list[pb.RoundRecord], admin: object = None, snapshot: pb.Snapshot | None = None):
        self.records = records
        self.admin = admin
        self.snapshot = snapshot
        self.done = asyncio.Event()

    async def run(self, sink, limit=None) -> None:
        sink.status(Link.LIVE, f"streaming from {self.name}")
        if self.snapshot is not None:
            sink.snapshot(self.snapshot)
        for message in self.records:
            sink.record(message)
        self.done.set()

    async def close(self) -> None:
        """Nothing to close."""


async def settled(app: ConsoleApp, pilot) -> None:
    """Wait for the source to deliver, then draw its state (twice: the layout settles after the first)."""
    source = app.source
    if isinstance(source, ScriptedLive):
        await asyncio.wait_for(source.done.wait(), 10)
    else:
        await app.workers.wait_for_complete()
    for _ in range(2):
        app.refresh_now()
        await pilot.pause()


def screen_text(app: ConsoleApp) -> list[str]:
    """What the terminal shows, one string per line."""
    strips = app.screen._compositor.render_strips()
    return ["".join(segment.text for segment in strip) for strip in strips]


def screen_segments(app: ConsoleApp) -> list[list]:
    """The terminal's lines as Rich segments (text with its style)."""
    return [list(strip) for strip in app.screen._compositor.render_strips()]


async def until(pilot, condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Let the app run until `condition` holds (a generous bound: a loaded machine is slow, never wrong)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await pilot.pause(0.05)
    assert condition(), what


async def back_on_main(pilot, app: ConsoleApp) -> None:
    """Until every dialog has closed (a dismissed screen leaves on a later turn of the loop)."""
    await until(pilot, lambda: len(app.screen_stack) == 1, "the dialog closed")
