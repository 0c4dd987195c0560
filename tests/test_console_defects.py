"""Issue #15's defects, one Pilot test (or a few) each, read off the screen as an operator reads it.

Fast: fixed records, a replay or a scripted live source on a frozen clock; the defects about a real
connection (a server stopping, the editor against the server's validation) are in test_console_live.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from console.app import ConsoleApp
from console.source import ReplaySource
from console.state import Link
from prefill_gate.v1 import types_pb2 as pb
from tests.console_pilot import (
    CONFIG,
    Clock,
    ScriptedLive,
    back_on_main,
    quick_idle,  # noqa: F401 - a fixture, used by pytestmark
    record,
    row,
    screen_segments,
    screen_text,
    settled,
    until,
)

pytestmark = pytest.mark.usefixtures("quick_idle")

RANK_LINE = re.compile(r"^\s*(\d+)\s+[●·]\s")


def replay_app(records: list[pb.RoundRecord], clock: Clock | None = None) -> ConsoleApp:
    clock = clock or Clock()
    return ConsoleApp(ReplaySource(records, "fixed.pgrec", speed=0, clock=clock), limit=len(records), clock=clock)


def live_app(records: list[pb.RoundRecord], clock: Clock, **kwargs: object) -> ConsoleApp:
    return ConsoleApp(ScriptedLive(records, **kwargs), clock=clock)  # type: ignore[arg-type]


def rank_lines(app: ConsoleApp) -> dict[int, str]:
    """The grid's rank lines on screen, by rank."""
    out = {}
    for line in screen_text(app):
        match = RANK_LINE.match(line)
        if match and int(match.group(1)) not in out:
            out[int(match.group(1))] = line
    return out


# -- 1. "blocks ALL" is shown only where it is true --------------------------------------------------


async def test_a_rank_extending_in_the_window_round_does_not_block_all() -> None:
    """rule P4: a rank blocks ALL with decode work and no wish for prefill; one that took its prompt in this
    very round reads want=false after the plan, but it is extending, not blocking."""
    rows = [
        row(0, want_prefill=False, has_decode_work=True, num_extends=1, batch_size=5, occupancy=0.5),
        row(1, want_prefill=True, has_decode_work=True, batch_size=4, occupancy=0.4),
        row(2, want_prefill=False, has_decode_work=True, batch_size=6, occupancy=0.6),
    ]
    app = replay_app([record(12, rows, point=pb.GATE_POINT_ANY, opened=True)])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        lines = rank_lines(app)
        assert "blocks ALL" not in lines[0]
        assert "blocks ALL" in lines[2]
        assert any("ranks 3 · want 1/3 · blocks ALL 1 · >0.9 0 · extending 1" in line for line in screen_text(app))


async def test_nothing_blocks_all_while_the_gate_is_off() -> None:
    """rule R8: with the gate off every round is open; there is no ALL point to block."""
    off = pb.GateConfig(epoch=3, enabled=False, policy="gate")
    rows = [row(r, want_prefill=False, has_decode_work=True, batch_size=4, occupancy=0.5) for r in range(4)]
    app = replay_app([record(40, rows, config=off)])
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(app, pilot)
        text = "\n".join(screen_text(app))
        assert "gate OFF" in text
        assert "⊘ALL" not in text and "blocks ALL 0" in text
        assert len(rank_lines(app)) == 4


def test_help_explains_the_short_marks() -> None:
    from console.screens.help import HelpScreen

    text = HelpScreen([]).plain_text(width=120)
    assert "⊘ALL" in text
    assert re.search(r">0\.9, !\s", text)  # the narrow grid's "!" mark


# -- 2. notices do not outlive what they announced (the live half is in test_console_live) -------------


async def test_a_notice_about_a_config_gives_way_to_the_next_config() -> None:
    clock = Clock()
    app = live_app([record(1, [row(0, has_decode_work=True, want_prefill=True)])], clock)
    async with app.run_test(size=(120, 30)) as pilot:
        await settled(app, pilot)
        off = pb.GateConfig(epoch=3, enabled=False, policy="gate")
        app.store.record(record(2, [row(0, has_decode_work=True, want_prefill=True)], config=off))
        app.store.notice("gate disabled: epoch 3 · gate off, adopted by every rank after round 2", epoch=3)
        app.refresh_now()
        await pilot.pause()
        assert "gate disabled" in screen_text(app)[2]
        on = pb.GateConfig(epoch=4, attempt_interval=4, any_interval=12, enabled=True, policy="gate")
        app.store.record(record(3, [row(0, has_decode_work=True, want_prefill=True)], config=on))
        app.refresh_now()
        await pilot.pause()
        header = screen_text(app)[:3]
        assert "gate ON" in header[1]
        assert "gate disabled" not in header[2]


# -- 3. data that is not live never looks live --------------------------------------------------------


async def test_a_disconnected_view_says_so_everywhere() -> None:
    clock = Clock()
    rows = [row(r, want_prefill=r == 0, has_decode_work=True, batch_size=4, occupancy=0.5) for r in range(4)]
    app = live_app([record(i, rows) for i in range(50)], clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        assert "rounds/s" in screen_text(app)[0] and "following the newest" in screen_text(app)[1]
        live_colour = rank_colour(app)
        clock.now += 12
        app.store.status(Link.RECONNECTING, "cannot reach 127.0.0.1:50151: connection refused; attempt 3",
                         retry_in_s=2.0)
        app.refresh_now()
        await pilot.pause()
        text = screen_text(app)
        assert "↻ reconnecting" in text[0]
        assert "rounds/s" not in text[0] and "last round received 12 s ago" in text[0]
        assert "following the newest" not in text[1]
        assert "DISCONNECTED" in text[3]  # the summary line
        timeline_title = next(line for line in text if "window timeline" in line)
        assert "DISCONNECTED" in timeline_title
        # the grid's rows are drawn dim
        assert brightness(rank_colour(app)) < brightness(live_colour) * 0.8


def rank_colour(app: ConsoleApp) -> tuple[int, int, int]:
    """The colour the first rank number is drawn in."""
    text = screen_text(app)
    index = next(i for i, line in enumerate(text) if RANK_LINE.match(line))
    segment = next(s for s in screen_segments(app)[index] if s.text.strip())
    return segment.style.color.get_truecolor()


def brightness(colour: tuple[int, int, int]) -> float:
    return sum(colour) / 3


async def test_a_stale_stream_is_not_followed() -> None:
    clock = Clock()
    app = live_app([record(i, [row(0, has_decode_work=True)]) for i in range(20)], clock)
    async with app.run_test(size=(120, 30)) as pilot:
        await settled(app, pilot)
        clock.now += 3.2
        app.refresh_now()
        await pilot.pause()
        text = screen_text(app)
        assert "◌ stale for 3 s" in text[0]
        assert "following the newest" not in text[1]
        assert "STALE 3 s" in text[3]


# -- 4. layout: nothing cut, no blank acres ------------------------------------------------------------


def busy_rows(count: int) -> list[pb.RankRow]:
    """Ranks in every state: wanting, blocking, above the watermark (blocking too), extending."""
    out = []
    for rank in range(count):
        kind = rank % 4
        out.append(row(
            rank, want_prefill=kind == 0, has_decode_work=True, num_extends=1 if kind == 3 else 0,
            planned_prefill=kind == 3, batch_size=8 + rank % 5, running=9, num_tokens=12 + rank,
            occupancy=0.95 if kind == 2 else 0.3 + rank % 7 / 10, waiting_prompts=rank % 3, resident_chunks=kind % 2,
        ))
    return out


def snapshot_with_stats() -> pb.Snapshot:
    stats = pb.RunStats(output_tokens_per_second=12819, ttft_p50_seconds=0.3745, ttft_p99_seconds=1.37,
                        gate_wait_p99_seconds=0.65, gate_wait_p99_rounds=17, extend_round_share=0.08,
                        ranks_extending_per_window=31.26, requests_finished=6127, requests_submitted=6636)
    return pb.Snapshot(run_id="run-a", dp_size=64, executor="sim", state="serving", config=CONFIG, stats=stats)


@pytest.mark.parametrize("ranks", [8, 64])
async def test_no_text_in_the_header_or_grid_is_cut_at_120x40(ranks: int) -> None:
    clock = Clock()
    records = [record(i, busy_rows(ranks)) for i in range(100)]
    app = live_app(records, clock, snapshot=snapshot_with_stats())
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        for paused in (False, True):
            text = screen_text(app)
            header = text[:4]
            assert not any("…" in line for line in header), header
            assert "127.0.0.1:50151" in header[0]  # the target, whole
            for rank, line in rank_lines(app).items():
                assert "…" not in line
                flags = ("blocks ALL" if rank % 4 in (1, 2) else "") + (" >0.9" if rank % 4 == 2 else "")
                assert flags.strip() in line
                if rank % 4 == 2:  # the flags column holds both marks whole (a scrollbar cell may follow)
                    assert re.search(r"blocks ALL >0\.9 *.?$", line.rstrip()), line
            if not paused:
                await pilot.press("space")


async def test_80x24_keeps_whole_words_and_says_how_many_ranks_are_out_of_view() -> None:
    clock = Clock()
    app = live_app([record(i, busy_rows(64)) for i in range(100)], clock, snapshot=snapshot_with_stats())
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(app, pilot)
        text = screen_text(app)
        assert not any("…" in line for line in text[:4]), text[:4]
        figures = [line for line in text if "gate wait p99" in line]
        assert figures and not any("…" in line for line in figures)
        summary = text[3]
        shown = re.search(r"│ (\d+)-(\d+)/64↓", summary)  # the grid rows in view, more below
        assert shown is not None, summary
        assert int(shown.group(2)) - int(shown.group(1)) + 1 == len(rank_lines(app))


async def test_few_ranks_on_a_tall_terminal_leave_no_blank_rows() -> None:
    app = replay_app([record(i, busy_rows(8)) for i in range(200)])
    async with app.run_test(size=(160, 50)) as pilot:
        await settled(app, pilot)
        text = screen_text(app)
        body = text[4:-6]  # between the summary line and the timeline
        left = [line[:110] for line in body]
        assert sum(1 for line in left if not line.strip()) <= 2, "\n".join(left)
        assert any("history" in line for line in body)


async def test_a_very_wide_terminal_gives_its_room_to_history_not_padding() -> None:
    app = replay_app([record(i, busy_rows(64)) for i in range(300)])
    async with app.run_test(size=(250, 70)) as pilot:
        await settled(app, pilot)
        for rank, line in rank_lines(app).items():
            grid_part = line.split("▏")[0]  # the grid, before the side panel's border
            longest_blank = max(len(run) for run in re.findall(r" +", grid_part.rstrip()))
            assert longest_blank < 20, (rank, grid_part)  # at most an empty flags column (16 cells)


# -- 5. the editor (its server-side half is in test_console_live) ---------------------------------------


def editor_app(clock: Clock, records: list[pb.RoundRecord]) -> ConsoleApp:
    from console.admin import AdminClient
    from console.endpoint import Endpoint

    # Nothing listens there: these tests never send (a send would show a connection error in the status).
    return live_app(records, clock, admin=AdminClient(Endpoint("127.0.0.1:9")))


def editor_status(app: ConsoleApp) -> str:
    return str(app.screen.query_one("#status").render())


async def test_editor_says_at_once_that_a_letter_is_not_a_number_and_that_no_token_was_given() -> None:
    app = editor_app(Clock(), [record(1, [row(0, has_decode_work=True)])])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        await pilot.press("e")
        await pilot.pause()
        assert "no admin token" in editor_status(app)
        field = app.screen.query_one("#attempt")
        field.value = ""
        field.focus()
        await pilot.press("1", "x")
        await pilot.pause()
        error = str(app.screen.query_one("#attempt-error").render())
        assert "ALL interval A takes a whole number" in error and "'1x'" in error


async def test_editor_asks_before_applying() -> None:
    app = editor_app(Clock(), [record(1, [row(0, has_decode_work=True)])])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        await pilot.press("e")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        status = editor_status(app)
        assert "apply ALL A=4 · ANY K=12 to every rank?" in status and "enter again" in status
        assert "applying" not in status

        # an edit after the review withdraws the question (it was about the values before the edit)
        await pilot.press("backspace", "x")
        await pilot.pause()
        status = editor_status(app)
        assert "to every rank?" not in status and "enter: review the change" in status
        assert "takes a whole number" in str(app.screen.query_one("#attempt-error").render())


async def test_editor_reopens_a_disabled_gate_with_the_intervals_last_in_force() -> None:
    off = pb.GateConfig(epoch=3, enabled=False, policy="gate")
    records = [record(1, [row(0, has_decode_work=True)]), record(2, [row(0, has_decode_work=True)], config=off)]
    app = editor_app(Clock(), records)
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        await pilot.press("e")
        await pilot.pause()
        assert app.screen.query_one("#attempt").value == "4"
        assert app.screen.query_one("#any").value == "12"


async def test_editor_in_force_line_follows_the_engine() -> None:
    app = editor_app(Clock(), [record(1, [row(0, has_decode_work=True)])])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        await pilot.press("e")
        await pilot.pause()
        changed = pb.GateConfig(epoch=5, attempt_interval=8, any_interval=24, enabled=True, policy="gate",
                                changed_by="tuner", reason="TTFT p99 over budget")
        app.store.record(record(2, [row(0, has_decode_work=True)], config=changed))
        app.refresh_now()
        await pilot.pause()
        in_force = str(app.screen.query_one("#in-force").render())
        assert "epoch 5 · ALL A=8 · ANY K=24" in in_force and "changed while you edit" in in_force


async def test_keys_typed_right_after_opening_the_editor_reach_its_field() -> None:
    """A terminal delivers fast typing as one burst: `e`, `1`, `6` arrive before the editor is shown."""
    from textual import events

    off = pb.GateConfig(epoch=3, enabled=False, policy="gate")
    app = editor_app(Clock(), [record(1, [row(0, has_decode_work=True)], config=off)])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        for _ in range(3):
            for key in "e16":
                app._driver.send_message(events.Key(key, key))  # no wait between them: one read's worth
            await until(pilot, lambda: app.screen.query("#attempt"), "the editor")
            await pilot.pause()
            assert app.screen.query_one("#attempt").value == "16"
            await pilot.press("escape")
            await back_on_main(pilot, app)


# -- 6. replay like a player ---------------------------------------------------------------------------


def long_recording(path: Path, rounds: int = 5074) -> Path:
    from control.plane.recording import RecordingWriter

    writer = RecordingWriter(path, pb.RecordingHeader(run_id="rec", dp_size=2, executor="sim"))
    rows = [row(0, want_prefill=True, has_decode_work=True), row(1, has_decode_work=True)]
    for index in range(1, rounds + 1):
        writer.write(record(index, rows, run_id="rec"))
    writer.close()
    return path


async def test_replay_seeks_anywhere_in_a_long_file(tmp_path: Path) -> None:
    source = ReplaySource.from_file(long_recording(tmp_path / "long.pgrec"), speed=0)
    app = ConsoleApp(source, clock=Clock())
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        assert app.store.link is Link.ENDED
        await pilot.press("g", *"2116", "enter")
        await back_on_main(pilot, app)
        text = screen_text(app)
        assert "round 2,116" in text[0]
        assert any("round 2,116 of 5,074" in line for line in text)  # the position line
        assert len(app.store.history) <= 2048 and app.store.history[0].round > 1  # the file is not held
        await pilot.press("g", *"5", "enter")
        await back_on_main(pilot, app)
        assert "round 5" in screen_text(app)[0]
        await pilot.press("left")
        assert app.state.record.round == 4
        await pilot.press("g", *"9999", "enter")  # not in the file: said, nothing moves
        await pilot.pause()
        assert "not in the recording: it holds rounds 1 to 5,074" in "\n".join(screen_text(app))
        await pilot.press("escape")
        await back_on_main(pilot, app)
        assert app.state.record.round == 4


async def test_replay_speed_changes_while_playing_and_admin_keys_are_not_offered() -> None:
    records = [record(i, [row(0, has_decode_work=True)]) for i in range(2000)]
    source = ReplaySource(records, "slow.pgrec", speed=1.0)
    app = ConsoleApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("plus")
        assert source.speed == 2.0
        await pilot.press("plus", "plus", "minus")
        assert source.speed == 4.0
        app.refresh_now()
        await pilot.pause()
        text = screen_text(app)
        assert "at 4x" in text[2]
        footer = text[-1]
        assert "Edit" not in footer and "Disable" not in footer
        assert "Faster" in footer or "Go to" in footer


# -- 7. rank detail ------------------------------------------------------------------------------------


async def test_rank_detail_of_a_simulated_run_shows_the_simulated_round_time(tmp_path: Path) -> None:
    source = ReplaySource.from_file(long_recording(tmp_path / "sim.pgrec", 100), speed=0)
    app = ConsoleApp(source, clock=Clock())
    async with app.run_test(size=(160, 40)) as pilot:
        await settled(app, pilot)
        await pilot.press("enter")
        await pilot.pause()
        app.refresh_now()
        await pilot.pause()
        text = "\n".join(screen_text(app))
        assert "round ms" in text and "fwd µs" not in text


def test_help_explains_every_rank_detail_column() -> None:
    from console.screens.help import HelpScreen
    from console.screens.rank_detail import columns

    text = HelpScreen([]).plain_text(width=160)
    for title in ("prefill", "pending", "retr Σ", "fwd µs", "round ms", "pt"):
        assert re.search(rf"^\s*{re.escape(title)}\s", text, re.MULTILINE), title
        assert title in columns(False) + columns(True)


async def test_live_rank_detail_is_redrawn_once_a_second_not_every_round() -> None:
    clock = Clock()
    rows = [row(r, has_decode_work=True, batch_size=4) for r in range(2)]
    app = live_app([record(i, rows) for i in range(30)], clock)
    async with app.run_test(size=(160, 40)) as pilot:
        await settled(app, pilot)
        await pilot.press("enter")
        await pilot.pause()
        app.refresh_now()
        await pilot.pause()
        first = app.screen.lines[0].plain.split()[0]
        for index in range(30, 60):  # a second's worth of rounds at 30 rounds/s
            app.store.record(record(index, rows))
            clock.now += 0.03
            app.refresh_now()
        assert app.screen.lines[0].plain.split()[0] == first
        clock.now += 0.2
        app.refresh_now()
        assert app.screen.lines[0].plain.split()[0] == "59"


async def test_the_cursor_does_not_look_like_a_blocking_rank_and_follows_a_click() -> None:
    import colorsys

    from console.widgets import RankGrid

    app = replay_app([record(1, busy_rows(8))])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        grid = app.query_one(RankGrid)
        cursor = grid.get_component_rich_style("rank-grid--cursor").bgcolor.get_truecolor()
        blocks = grid.get_component_rich_style("rank-grid--blocks").bgcolor.get_truecolor()

        def hue(colour) -> float:
            return colorsys.rgb_to_hsv(*(channel / 255 for channel in colour))[0] * 360

        distance = abs(hue(cursor) - hue(blocks))
        assert min(distance, 360 - distance) > 90
        await pilot.click(RankGrid, offset=(2, 4))  # the header line, then ranks 0, 1, 2, 3
        await until(pilot, lambda: grid.cursor == 3, "the cursor on the rank clicked")
        await pilot.click(RankGrid, offset=(2, 4))  # the cursor's rank again: its detail
        from console.screens.rank_detail import RankDetail

        await until(pilot, lambda: isinstance(app.screen, RankDetail), "the rank's detail")
        assert app.screen.rank == 3
