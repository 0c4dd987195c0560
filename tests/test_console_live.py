"""The console against a real in-process control plane: every key binding, the editor's paths, and the
link's bad days (unreachable, wrong token, a server that restarts mid-stream).

The engine is the lockstep simulator paced to wall time, behind the real gRPC server on an ephemeral
port, on the test's own event loop; the console connects to it over TCP like any client. Pilot's
CPU-idle wait is replaced (`quick_idle`, see tests/console_pilot.py): the simulator in the same process
never lets the test look idle, and that wait alone cost two seconds per key.
"""

from __future__ import annotations

import asyncio
import io
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from console.admin import AdminClient
from console.app import ConsoleApp
from console.endpoint import Endpoint
from console.sample import sample_args, sample_workload
from console.screens.confirm import Confirm
from console.screens.editor import IntervalEditor
from console.source import GrpcSource
from console.state import Link
from console.widgets import RankGrid
from control.host.backends import SimBackend
from control.host.controller import Controller
from control.plane.grpc_server import ControlPlane, PlaneOptions
from tests.console_pilot import (
    back_on_main,
    quick_idle,  # noqa: F401 - a fixture, used by pytestmark
    screen_text,
    until,
)

pytestmark = pytest.mark.usefixtures("quick_idle")

TOKEN = "console-test-token"
DP_SIZE = 4
PACE = 1.0  # virtual seconds per wall second: the sample group runs 20-40 rounds/s


@dataclass
class Server:
    """A controller with its control plane."""

    controller: Controller
    plane: ControlPlane
    run: asyncio.Task[None]

    async def stop(self) -> None:
        """Drain and stop, as SIGTERM would."""
        await self.plane.stop()
        self.controller.request_stop()
        try:
            await asyncio.wait_for(self.run, 30)
        finally:
            self.controller.backend.close()


async def start_server(port: int = 0, dp_size: int = DP_SIZE, **options: Any) -> Server:
    """The sample group (KV pressure, a closed loop) served on `port` (0: any free one)."""
    args = sample_args(dp_size)
    backend = SimBackend(args, sample_workload(dp_size), pace=PACE)
    controller = Controller(args, backend, stop_when_idle=False)
    await asyncio.get_running_loop().run_in_executor(None, controller.start)
    plane = ControlPlane(controller, PlaneOptions(port=port, token=TOKEN, **options), out=io.StringIO())
    await plane.start()
    return Server(controller, plane, asyncio.create_task(controller.run()))


@asynccontextmanager
async def served(dp_size: int = DP_SIZE) -> AsyncIterator[Server]:
    """A server for the length of a test."""
    server = await start_server(dp_size=dp_size)
    try:
        yield server
    finally:
        await server.stop()


def console(target: str, token: str | None = TOKEN) -> ConsoleApp:
    """The console on a live target."""
    return ConsoleApp(GrpcSource(Endpoint(target, token)))


def shown_link(app: ConsoleApp) -> Link:
    """The link state the screen shows now (a starved engine reads as stale: wait for live, never assume it)."""
    app.refresh_now()
    return app.state.connection.link


async def rounds_arrived(pilot: Pilot, count: int = 12) -> ConsoleApp:
    """Until the console holds `count` records and has drawn them."""
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await until(pilot, lambda: len(app.store.history) >= count, f"{count} rounds")
    app.refresh_now()
    await pilot.pause()
    return app


def header_text(app: ConsoleApp) -> str:
    """What the header shows."""
    return app.query_one("#header").compose_text(app.state).plain  # type: ignore[attr-defined]


async def test_live_view_and_navigation_keys() -> None:
    """Live data reaches every widget; space holds the view while rounds keep coming; left/right and the
    shift+arrows move through the rounds held; q quits. (The other screens' keys: test_console_keys.py.)"""
    async with served() as server:
        app = console(server.plane.target)
        async with app.run_test(size=(120, 40)) as pilot:
            await rounds_arrived(pilot)
            await until(pilot, lambda: shown_link(app) is Link.LIVE, "live")
            assert "● live" in header_text(app)
            assert f"{DP_SIZE} ranks" in header_text(app)
            grid = app.query_one(RankGrid)
            assert [row.rank for row in grid.rows] == list(range(DP_SIZE))
            await until(pilot, lambda: app.store.stats is not None, "a snapshot")

            # space pauses on the newest round, and the view stays there while rounds keep coming
            await pilot.press("space")
            paused_at = app.state.record.round
            assert app.state.paused and "PAUSED" in header_text(app)
            await until(pilot, lambda: app.store.newest.round > paused_at, "a round after the pause")
            app.refresh_now()
            assert app.state.record.round == paused_at

            # left/right and shift+left/right move through the held rounds
            await pilot.press("left")
            assert app.state.record.round == paused_at - 1
            await pilot.press("shift+left")
            assert app.state.record.round == paused_at - 11
            await pilot.press("right")
            assert app.state.record.round == paused_at - 10
            await pilot.press("shift+right")
            assert app.state.record.round == paused_at
            await pilot.press("space")
            assert not app.state.paused and "following the newest" in header_text(app)

            await pilot.press("q")
            await pilot.pause()
        assert app.return_code == 0


async def test_editor_errors_then_success_and_disable() -> None:
    """e: violations land next to their fields; a good change shows its epoch and adoption round; d disables."""
    async with served() as server:
        app = console(server.plane.target)
        async with app.run_test(size=(120, 40)) as pilot:
            await rounds_arrived(pilot, 5)
            await pilot.press("e")
            editor = app.screen
            assert isinstance(editor, IntervalEditor)

            # ANY below ALL: refused by the server's validation (C2). The message is about both fields: it is
            # shown once, in the fields' own words (the server words it with the launch flags)
            await fill(pilot, editor, "8", "2")
            await until(pilot, lambda: editor.shown_violations, "violations")
            assert "any_interval" in editor.shown_violations
            assert "not applied" in editor.status_text
            shown = "\n".join(str(editor.query_one(f"#{name}-error").render()) for name in ("attempt", "any"))
            assert "ANY interval K (2) must be >= ALL interval A (8)" in shown
            assert "--prefill" not in shown and shown.count("must be >=") == 1

            # a negative interval: its own field
            await fill(pilot, editor, "-3", "12", submit="ctrl+s")
            await until(pilot, lambda: editor.shown_violations, "violations")
            assert "attempt_interval" in editor.shown_violations
            assert "any_interval" not in editor.shown_violations

            # an empty field: required
            await fill(pilot, editor, "", "12")
            await until(pilot, lambda: editor.shown_violations, "violations")
            assert set(editor.shown_violations) >= {"attempt_interval"}

            # valid: applied, with the epoch and the round after which every rank adopted it
            await fill(pilot, editor, "2", "6")
            await until(pilot, lambda: editor.status_text.startswith("applied"), "the change applied")
            assert not editor.shown_violations
            assert "epoch 1" in editor.status_text and "ALL A=2" in editor.status_text
            assert "after round" in editor.status_text
            await pilot.press("escape")
            await until(pilot, lambda: "A=2 · ANY K=6 · epoch 1" in header_text(app), "the header's new config")

            # d asks first; n (or escape) keeps the gate
            await pilot.press("d")
            assert isinstance(app.screen, Confirm)
            await pilot.press("n")
            assert not isinstance(app.screen, Confirm)
            await pilot.press("d", "escape")
            assert not isinstance(app.screen, Confirm)
            assert server.controller.config.delay is not None

            # d, y: disabled on every rank
            await pilot.press("d")
            await pilot.press("y")
            await until(pilot, lambda: "gate disabled" in app.store.notice_text, "the gate disabled")
            assert server.controller.config.delay is None
            await until(pilot, lambda: "gate OFF" in header_text(app), "the header shows the gate off")
            assert "gate disabled" in header_text(app).splitlines()[2]

            # e re-enables from the intervals last in force; the "disabled" notice goes with the config it
            # announced (it used to stay for a minute under a header reading "gate ON")
            await pilot.press("e")
            editor = app.screen
            assert isinstance(editor, IntervalEditor)
            assert (editor.query_one("#attempt").value, editor.query_one("#any").value) == ("2", "6")
            await pilot.press("enter", "enter")
            await until(pilot, lambda: editor.status_text.startswith("applied"), "re-enabled")
            await pilot.press("escape")
            await back_on_main(pilot, app)
            await until(pilot, lambda: "gate ON" in header_text(app), "the header shows the gate on")
            app.refresh_now()
            assert "gate disabled" not in header_text(app)


async def fill(pilot: Pilot, editor: IntervalEditor, attempt: str, any_: str, submit: str = "enter") -> None:
    """Type both fields and submit (enter in a field, or ctrl+s)."""
    editor.shown_violations.clear()
    editor.status_text = ""
    for selector, value in (("#attempt", attempt), ("#any", any_)):
        field = editor.query_one(selector)
        field.value = ""  # type: ignore[attr-defined]
        field.focus()
        await pilot.press(*list(value) or ["backspace"])
    await pilot.press(submit, submit)  # the first shows what would change, the second applies


async def test_wrong_token_and_stale_epoch_are_reported_in_the_editor() -> None:
    """A wrong token is PERMISSION_DENIED, shown in the editor; a change made meanwhile is not overwritten."""
    async with served() as server:
        app = console(server.plane.target, token="not-the-token")
        async with app.run_test(size=(120, 40)) as pilot:
            await rounds_arrived(pilot, 5)
            await pilot.press("e")
            editor = app.screen
            assert isinstance(editor, IntervalEditor)
            await fill(pilot, editor, "2", "6")
            await until(pilot, lambda: "not applied" in editor.status_text, "the refusal")
            assert "PERMISSION_DENIED" in editor.status_text and "--token" in editor.status_text

        app = console(server.plane.target)
        async with app.run_test(size=(120, 40)) as pilot:
            await rounds_arrived(pilot, 5)
            await pilot.press("e")
            editor = app.screen
            assert isinstance(editor, IntervalEditor)
            other = AdminClient(Endpoint(server.plane.target, TOKEN))
            await other.update_intervals(3, 9)  # someone else, while the editor is open
            await other.endpoint.close()
            await fill(pilot, editor, "2", "6")
            await until(pilot, lambda: "not applied" in editor.status_text, "the stale epoch")
            assert "epoch" in editor.status_text
            assert "ALL A=3 · ANY K=9" in str(editor.query_one("#in-force").render())
            assert server.controller.config.delay.attempt_interval == 3


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_unreachable_target_then_server_appears_then_restarts() -> None:
    """Nothing listening: reconnecting with the reason on screen; a server comes up: live; it restarts
    mid-stream: reconnecting, then live on the new run with a notice."""
    port = free_port()
    app = console(f"127.0.0.1:{port}")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.store.link is Link.RECONNECTING, "reconnecting")
        app.refresh_now()
        assert "connection refused" in header_text(app)
        assert "↻ reconnecting" in header_text(app)

        first = await start_server(port)
        try:
            await until(pilot, lambda: len(app.store.history) >= 5, "rounds from the first run")
            first_run = app.store.run_id
            assert first_run == first.controller.run_id
        finally:
            await first.stop()
        await until(pilot, lambda: app.store.link is Link.STOPPED, "the stream ended")
        app.refresh_now()
        assert header_text(app).startswith("■ engine stopped")

        second = await start_server(port)
        try:
            await until(pilot, lambda: app.store.run_id == second.controller.run_id and app.store.history,
                        "rounds from the restarted server")
            await until(pilot, lambda: shown_link(app) is Link.LIVE, "live on the restarted server")
            assert "the server restarted" in app.store.notice_text and first_run in app.store.notice_text
            assert "the server restarted" in header_text(app).splitlines()[2]
            assert all(record.run_id == second.controller.run_id for record in app.store.history)
        finally:
            await second.stop()

        # a clean stop: the stream ended, and every part of the screen says the engine stopped; nothing
        # still reads as live (the old notice, the rate, "following the newest", full colour)
        await until(pilot, lambda: app.store.link is Link.STOPPED, "the engine stopped")
        app.refresh_now()
        await pilot.pause()
        header = header_text(app).splitlines()
        assert header[0].startswith("■ engine stopped") and "rounds/s" not in header[0]
        assert "last round received" in header[0]
        assert "frozen on the last round received" in header[1] and "following the newest" not in header[1]
        assert header[2].startswith("stream ended: the engine stopped after round")
        assert "restarted" not in header[2]
        text = screen_text(app)
        assert "ENGINE STOPPED" in text[3]
        assert "ENGINE STOPPED" in next(line for line in text if "window timeline" in line)


@pytest.mark.parametrize("dp_size", [64])
async def test_sixty_four_ranks_scroll(dp_size: int) -> None:
    """64 ranks: the grid scrolls to keep the cursor visible."""
    async with served(dp_size) as server:
        app = console(server.plane.target)
        async with app.run_test(size=(80, 24)) as pilot:
            await rounds_arrived(pilot, 3)
            grid = app.query_one(RankGrid)
            assert len(grid.rows) == dp_size
            await pilot.press("end")
            assert grid.cursor == dp_size - 1 and grid.scroll_y > 0
            await pilot.press("home")
            assert grid.scroll_y == 0


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A key and certificate for 127.0.0.1 (the openssl CLI: `cryptography` is not installed here)."""
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return key, cert


async def test_tls_with_and_without_the_ca(tmp_path: Path) -> None:
    """--tls-ca connects to a TLS control plane; a plaintext console says it cannot get through."""
    key, cert = self_signed(tmp_path)
    server = await start_server(tls_cert=str(cert), tls_key=str(key))
    try:
        app = ConsoleApp(GrpcSource(Endpoint(server.plane.target, TOKEN, tls_ca=str(cert))))
        async with app.run_test(size=(100, 30)) as pilot:
            await rounds_arrived(pilot, 3)
            await until(pilot, lambda: shown_link(app) is Link.LIVE, "live over TLS")
        app = console(server.plane.target)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.store.link is Link.RECONNECTING, "refused in plaintext")
            assert "closed the connection at once (a TLS server? then pass --tls-ca)" in app.store.detail
    finally:
        await server.stop()
