"""What the console's main screen looks like, at three terminal sizes and two group sizes, and in the
states an operator must not misread (paused, disconnected, the history heatmap).

The data is a seeded simulator run (the real engine, converted by the control plane's converter) with a
deterministic wall clock; ingest stops after a fixed number of records, the app's clock is frozen, and
the first state is drawn only after the ingest worker finished. Update with `pytest --snapshot-update`.
"""

from __future__ import annotations

from functools import cache

import pytest
from textual.pilot import Pilot

from console.app import ConsoleApp
from console.sample import sample_records
from console.source import ReplaySource
from console.state import Link
from prefill_gate.v1 import types_pb2 as pb
from tests.console_pilot import Clock, ScriptedLive

ROUNDS = 300


@cache
def records(dp_size: int) -> tuple[pb.RoundRecord, ...]:
    """The same seeded run for every test that asks."""
    return tuple(sample_records(dp_size, ROUNDS))


def frozen() -> float:
    return 1000.0


def replay_app(dp_size: int) -> ConsoleApp:
    """The console replaying the sample run at full speed, stopping after every record."""
    source = ReplaySource(records(dp_size), f"sample-{dp_size}.pgrec", speed=0, clock=frozen)
    return ConsoleApp(source, limit=ROUNDS, clock=frozen)


async def settle(pilot: Pilot) -> None:
    """Wait for the ingest to end, then draw its final state (twice: the layout settles after the first)."""
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await app.workers.wait_for_complete()
    for _ in range(2):
        app.refresh_now()
        await pilot.pause()


@pytest.mark.parametrize("dp_size", [8, 64])
@pytest.mark.parametrize("size", [(80, 24), (120, 40), (250, 70)], ids=["80x24", "120x40", "250x70"])
def test_main_screen(snap_compare, dp_size: int, size: tuple[int, int]) -> None:
    """Header, summary line, rank grid (with history strips when wide), heatmap (when there is room),
    replay position line, timeline and figures of a replayed run."""
    assert snap_compare(replay_app(dp_size), terminal_size=size, run_before=settle)


def test_paused_scrolled_back(snap_compare) -> None:
    """Paused ten rounds back: the header says so, the grid and timeline show that round."""
    assert snap_compare(replay_app(8), terminal_size=(80, 24), run_before=settle, press=["shift+left"])


def test_history_heatmap_of_64_ranks_in_80x24(snap_compare) -> None:
    """h: 64 ranks x the last rounds in an 80x24 terminal."""

    async def history(pilot: Pilot) -> None:
        await settle(pilot)
        await pilot.press("h")
        await settle(pilot)

    assert snap_compare(replay_app(64), terminal_size=(80, 24), run_before=history)


def test_disconnected(snap_compare) -> None:
    """A live view whose server went away 12 s ago: no part of the screen reads as live."""
    clock = Clock(1000.0)
    app = ConsoleApp(ScriptedLive(list(records(8))), clock=clock)  # type: ignore[arg-type]

    async def disconnect(pilot: Pilot) -> None:
        await settle(pilot)
        clock.now += 12
        app.store.status(Link.RECONNECTING, "cannot reach 127.0.0.1:50151: connection refused (is the server "
                                            "running on that port?); attempt 4", retry_in_s=4.0)
        await settle(pilot)

    assert snap_compare(app, terminal_size=(120, 40), run_before=disconnect)
