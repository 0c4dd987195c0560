"""Every key and click of the console, on fixed records (no server: the live paths are in
test_console_live.py): the grid's cursor, rank detail, help, the palette, sort, filter, the history
heatmap, alerts, and clicks on the timeline, the heatmap and the replay's seek bar."""

from __future__ import annotations

import re

import pytest
from textual.command import CommandPalette

from console.app import ConsoleApp
from console.screens.alerts import AlertsScreen
from console.screens.help import HelpScreen
from console.screens.rank_detail import RankDetail
from console.source import ReplaySource
from console.widgets import Heatmap, PlayerBar, RankGrid, SummaryLine, Timeline
from prefill_gate.v1 import types_pb2 as pb
from tests.console_pilot import (
    Clock,
    ScriptedLive,
    back_on_main,
    quick_idle,  # noqa: F401 - a fixture, used by pytestmark
    record,
    row,
    screen_text,
    settled,
    until,
)

pytestmark = pytest.mark.usefixtures("quick_idle")
DP_SIZE = 6


def rows_at(index: int) -> list[pb.RankRow]:
    """Six ranks: rank 1 stays above the watermark with growing waiting prompts; rank 4 extends every 12th round."""
    return [
        row(0, want_prefill=True, has_decode_work=True, batch_size=4, occupancy=0.3, waiting_prompts=1),
        row(1, want_prefill=False, has_decode_work=True, batch_size=9, occupancy=0.95, waiting_prompts=index // 4),
        row(2, want_prefill=False, has_decode_work=True, batch_size=6, occupancy=0.5, waiting_prompts=0),
        row(3, want_prefill=False, has_decode_work=False, batch_size=0, occupancy=0.1),
        row(4, want_prefill=index % 12 != 0, has_decode_work=True, batch_size=5, occupancy=0.7,
            num_extends=1 if index % 12 == 0 else 0, planned_prefill=index % 12 == 0, waiting_prompts=3),
        row(5, want_prefill=False, has_decode_work=True, batch_size=7, occupancy=0.6, waiting_prompts=2),
    ]


RECORDS = [record(i, rows_at(i), point=pb.GATE_POINT_ANY if i % 12 == 0 and i else pb.GATE_POINT_NONE,
                  opened=i % 12 == 0 and i > 0) for i in range(1, 121)]


def replay_app() -> ConsoleApp:
    clock = Clock()
    return ConsoleApp(ReplaySource(RECORDS, "fixed.pgrec", speed=0, clock=clock), clock=clock)


def listed(app: ConsoleApp) -> list[int]:
    return [view.row.rank for view in app.query_one(RankGrid).views]


async def test_grid_cursor_detail_help_and_palette() -> None:
    tuned = pb.GateConfig(epoch=4, attempt_interval=4, any_interval=24, enabled=True, policy="gate",
                          changed_by="tuner", reason="TTFT p99 1.8 s > 1.5 s budget -> K 12->24")
    records = [*RECORDS[:-1], record(120, rows_at(120), config=tuned)]
    clock = Clock()
    app = ConsoleApp(ScriptedLive(records), clock=clock)  # type: ignore[arg-type]
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        grid = app.query_one(RankGrid)
        await pilot.press("down", "down")
        assert grid.cursor == 2
        await pilot.press("up")
        assert grid.cursor == 1
        await pilot.press("end")
        assert grid.cursor == DP_SIZE - 1
        await pilot.press("home")
        assert grid.cursor == 0
        await pilot.press("pagedown")
        assert grid.cursor == DP_SIZE - 1
        await pilot.press("pageup")
        assert grid.cursor == 0

        # enter: the cursor rank's recent rows; up/down switch rank; escape (or enter) goes back
        await pilot.press("down", "enter")
        assert isinstance(app.screen, RankDetail) and app.screen.rank == 1
        await until(pilot, lambda: len(app.screen.lines) > 10, "rank 1's rows")
        assert all(line.plain.split()[0].isdigit() for line in app.screen.lines)
        assert "waiting (max 30)" in str(app.screen.query_one("#sparks").render())
        await pilot.press("down")
        assert app.screen.rank == 2
        await pilot.press("up", "up")
        assert app.screen.rank == 0
        await pilot.press("escape")
        await pilot.press("enter")
        assert isinstance(app.screen, RankDetail)
        await pilot.press("enter")
        assert not isinstance(app.screen, RankDetail)

        # help: every key the app binds, every column title of the grid
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await back_on_main(pilot, app)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.plain_text(width=200)
        for binding in app.BINDINGS:
            assert binding.tooltip in text
        for title in ("want", "dec", "pre", "batch", "run", "tokens", "ext", "since", "occupancy", "occ%", "chunks",
                      "wait", "reads", "retr", "history", "heatmap", "alerts", "summary line", "⚠"):
            assert re.search(rf"(^|[ /,]){re.escape(title)}([ /,]|$)", text, re.MULTILINE), title
        # under a dialog the dimmed main screen is redrawn once a second, not on every tick
        summary = app.screen_stack[0].query_one(SummaryLine)
        assert "want 1/6" in summary.render().plain  # round 120
        app.store.record(record(121, rows_at(121), config=tuned))
        app._tick()
        assert "want 1/6" in summary.render().plain and app.state.record.round == 121
        clock.now += 1.0
        app._tick()
        assert "want 2/6" in summary.render().plain
        await pilot.press("e", "d")  # the app's keys stay quiet over a dialog
        assert isinstance(app.screen, HelpScreen) and len(app.screen_stack) == 2
        await pilot.press("q")  # q closes help, and only help
        await back_on_main(pilot, app)
        assert app.is_running

        # the tuner's last change and reason: in the header and the alerts (listed, not counted)
        assert "changed by tuner at epoch 4: TTFT p99 1.8 s > 1.5 s budget -> K 12->24" in \
            "\n".join(screen_text(app)[:3]) or app.size.width < 140
        await pilot.press("a")
        assert isinstance(app.screen, AlertsScreen)
        alerts = str(app.screen.query_one("#list").render())
        assert "tuner at epoch 4: TTFT p99 1.8 s > 1.5 s budget" in alerts
        assert "rank 1: >0.9 for 50+ rounds (95% now)" in alerts
        assert "rank 1: waiting 22 → 30 over 30 rounds" in alerts
        await pilot.press("a")
        await back_on_main(pilot, app)

        # the command palette offers every action
        await pilot.press("ctrl+p")
        assert isinstance(app.screen, CommandPalette)
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert {"Pause or resume", "Back one round", "Go to round", "Sort ranks", "Filter ranks", "History heatmap",
                "Alerts", "Rank detail", "Edit gate intervals", "Disable the gate", "Help", "Quit"} <= titles
        await pilot.press("escape")


async def test_summary_sort_and_filter() -> None:
    app = replay_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        summary = screen_text(app)[3]
        assert summary.startswith(" ranks 6 · want 1/6 · blocks ALL 3 · >0.9 1 · extending 1 │")  # round 120
        assert listed(app) == [0, 1, 2, 3, 4, 5]
        await pilot.press("s")  # occupancy, highest first
        assert listed(app) == [1, 4, 5, 2, 0, 3]
        assert "sort occupancy ↓" in screen_text(app)[3]
        await pilot.press("S")  # reversed
        assert listed(app) == [3, 0, 2, 5, 4, 1]
        await pilot.press("s")  # waiting prompts
        assert listed(app)[0] == 1
        await pilot.press("s")  # blocking ALL first (rank 1, 2, 5 block; 0 and 4 want)
        assert listed(app)[:3] == [1, 2, 5]
        await pilot.press("s")  # rounds since the rank last extended, longest first
        assert listed(app)[-1] == 4
        await pilot.press("s")
        assert listed(app) == [0, 1, 2, 3, 4, 5]
        await pilot.click(RankGrid, offset=(1, 0))  # a click on the title sorted by: reversed
        await until(pilot, lambda: listed(app) == [5, 4, 3, 2, 1, 0], "reversed by a click on 'rank'")
        await pilot.click(RankGrid, offset=(1, 0))
        await until(pilot, lambda: listed(app) == [0, 1, 2, 3, 4, 5], "in rank order again")
        header = screen_text(app)[4]
        await pilot.click(RankGrid, offset=(header.index("occ%") + 1, 0))
        await until(pilot, lambda: listed(app) == [1, 4, 5, 2, 0, 3], "sorted by a click on 'occ%'")

        await pilot.press("slash", *"blocks", "enter")
        await back_on_main(pilot, app)
        assert sorted(listed(app)) == [1, 2, 5]
        assert "filter blocks: 3 of 6" in screen_text(app)[3]
        await pilot.press("slash")
        await pilot.press(*" wait>1", "enter")  # appended to the filter in force
        await back_on_main(pilot, app)
        assert sorted(listed(app)) == [1, 5]
        await pilot.press("slash", "ctrl+u", *"4-5", "enter")
        await back_on_main(pilot, app)
        assert sorted(listed(app)) == [4, 5]

        await pilot.press("slash", "ctrl+u", *"frobnicate", "enter")  # refused, said, nothing changes
        await pilot.pause()
        assert "'frobnicate' is not a filter word" in "\n".join(screen_text(app))
        await pilot.press("escape")
        await back_on_main(pilot, app)
        assert sorted(listed(app)) == [4, 5]
        await pilot.press("slash", "ctrl+u", "enter")  # empty: every rank
        await back_on_main(pilot, app)
        assert sorted(listed(app)) == [0, 1, 2, 3, 4, 5]


async def test_history_heatmap_and_clicks_that_move_in_time() -> None:
    app = replay_app()
    async with app.run_test(size=(80, 30)) as pilot:
        await settled(app, pilot)
        heat = app.query_one(Heatmap)
        assert heat.display  # 6 ranks leave room under the grid
        assert any("history · 6 ranks x" in line for line in screen_text(app))
        await pilot.press("h")  # the heatmap in place of the grid
        await pilot.pause()
        assert not app.query_one(RankGrid).display and heat.display
        await pilot.press("m")
        app.refresh_now()
        await pilot.pause()
        assert any("occupancy: dark 0" in line for line in screen_text(app)), screen_text(app)
        await pilot.press("m", "m", "h")
        assert app.query_one(RankGrid).display

        # a click on the timeline shows that round; one on the heatmap too. The click lands where the
        # widget is after layout: let the grid's return settle first (a fresh clone's loaded run once
        # waited 60 s for a click that never reached the timeline).
        await settled(app, pilot)
        timeline = app.query_one(Timeline)
        await pilot.click(Timeline, offset=(timeline.size.width - 3, 1))
        await until(pilot, lambda: app.state.paused, "the click on the timeline handled")
        assert app.state.record.round == 118
        await pilot.click(Heatmap, offset=(10, 4))  # the second line of rounds: two older than the newest shown
        await until(pilot, lambda: app.state.record.round != 118, "the click on the heatmap handled")
        assert app.state.record.round == 116

        # the seek bar: a click near its start goes near the start of the file
        bar = app.query_one(PlayerBar)
        text = screen_text(app)
        line = next(line for line in text if "round 116 of 120" in line)
        start = line.index("━") if "━" in line else line.index("●")
        await pilot.click(PlayerBar, offset=(start + 1, 0))
        await until(pilot, lambda: app.state.record.round < 20, "the click on the seek bar handled")
        assert bar.display
