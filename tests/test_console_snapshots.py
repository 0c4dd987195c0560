"""What the console's main screen looks like, at two terminal sizes and two group sizes.

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
from prefill_gate.v1 import types_pb2 as pb

ROUNDS = 300


@cache
def records(dp_size: int) -> tuple[pb.RoundRecord, ...]:
    """The same seeded run for every test that asks."""
    return tuple(sample_records(dp_size, ROUNDS))


def frozen() -> float:
    return 1000.0


def replay_app(dp_size: int) -> ConsoleApp:
    """The console replaying the sample run at full speed, stopping after every record."""
    source = ReplaySource(iter(records(dp_size)), f"sample-{dp_size}.pgrec", speed=0, clock=frozen)
    return ConsoleApp(source, limit=ROUNDS, clock=frozen)


async def settle(pilot: Pilot) -> None:
    """Wait for the ingest to end, then draw its final state once."""
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await app.workers.wait_for_complete()
    app.refresh_now()
    await pilot.pause()


@pytest.mark.parametrize("dp_size", [4, 64])
@pytest.mark.parametrize("size", [(80, 24), (160, 50)], ids=["80x24", "160x50"])
def test_main_screen(snap_compare, dp_size: int, size: tuple[int, int]) -> None:
    """Header, rank grid, timeline and figures of a replayed run."""
    assert snap_compare(replay_app(dp_size), terminal_size=size, run_before=settle)


def test_paused_scrolled_back(snap_compare) -> None:
    """Paused ten rounds back: the header says so, the grid and timeline show that round."""
    assert snap_compare(replay_app(4), terminal_size=(80, 24), run_before=settle, press=["shift+left"])
