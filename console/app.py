"""The console app: a source feeds the store in an async worker; a fixed tick draws the latest state.

Records can arrive a thousand times a second; the screen changes ten times a second at most. The
worker only appends to the store (`console.store`), and `refresh_now`, called by the tick, builds one
immutable `ConsoleState` and hands it to every widget, each of which redraws only what changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from console.admin import AdminError
from console.screens.confirm import Confirm
from console.screens.editor import IntervalEditor, describe_config
from console.screens.help import HelpScreen
from console.screens.rank_detail import ROWS, RankDetail
from console.source import Source
from console.state import ConsoleState, Link
from console.store import Store
from console.widgets import RankGrid, StatusHeader, ThroughputPanel, Timeline
from prefill_gate.v1 import types_pb2 as pb

TICK_HZ = 10.0
_VIEW_ACTIONS = frozenset({"quit", "pause", "step", "edit", "disable", "help", "detail"})
IDLE_REDRAW_S = 1.0  # with nothing new, the header still ages ("stale for N s", reconnect countdown)


class ConsoleApp(App[int]):
    """Votes, windows and pressure of a running engine (or a recording)."""

    CSS_PATH = "console.tcss"
    TITLE = "prefill-gate console"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]

    BINDINGS = [
        Binding("q", "quit", "Quit", tooltip="Quit the console (the engine keeps running)"),
        Binding("space", "pause", "Pause", tooltip="Freeze the view on this round; again: follow the newest"),
        Binding("left", "step(-1)", "Back", tooltip="One round back (pauses the view)"),
        Binding("right", "step(1)", "Fwd", show=False, tooltip="One round forward"),
        Binding("shift+left", "step(-10)", "Back 10", show=False, tooltip="Ten rounds back (pauses the view)"),
        Binding("shift+right", "step(10)", "Fwd 10", show=False, tooltip="Ten rounds forward"),
        Binding("e", "edit", "Edit", tooltip="Edit the ALL and ANY intervals on the running engine"),
        Binding("d", "disable", "Disable", tooltip="Disable the gate on every rank (asks first)"),
        Binding("question_mark,f1", "help", "Help", tooltip="Keys and what the columns mean"),
    ]

    def __init__(
        self,
        source: Source,
        *,
        limit: int | None = None,
        tick_hz: float = TICK_HZ,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.source = source
        self.limit = limit  # stop reading after this many records (deterministic tests)
        self.tick_hz = tick_hz
        self.clock = clock
        self.store = Store(source.name, source.live, clock)
        self.state: ConsoleState = self.store.view()
        self.frames = 0  # states drawn, for the benchmark's refresh rate
        self._drawn_version = -1
        self._drawn_at = 0.0
        self.ingest: Worker[None] | None = None

    # -- layout and lifecycle ----------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="header")
        with Horizontal(id="body"):
            yield RankGrid(id="grid")
            yield ThroughputPanel(id="side")
        yield Timeline(id="timeline")
        yield ThroughputPanel(id="figures")
        yield Footer()

    def on_mount(self) -> None:
        self.ingest = self.run_worker(self._read(), name="ingest", group="ingest", exit_on_error=False)
        self.set_interval(1 / self.tick_hz, self._tick, name="tick")
        self.query_one(RankGrid).focus()
        self.refresh_now()

    async def _read(self) -> None:
        await self.source.run(self.store, self.limit)

    async def on_unmount(self) -> None:
        await self.source.close()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state is not WorkerState.ERROR:
            return
        # Failures are shown, never raised: exit_on_error=False keeps the app (and the terminal) alive.
        error = event.worker.error
        if event.worker.group == "ingest":
            self.store.status(Link.FAILED, f"reading stopped: {type(error).__name__}: {error}")
        else:
            self.store.notice(f"{event.worker.name or 'task'} failed: {type(error).__name__}: {error}")

    # -- the tick ----------------------------------------------------------------------------------

    def _tick(self) -> None:
        now = self.clock()
        if self.store.version == self._drawn_version and now - self._drawn_at < IDLE_REDRAW_S:
            return
        self.refresh_now()

    def refresh_now(self) -> None:
        """Build the state of this instant and hand it to every widget."""
        if not self.screen_stack:  # starting up or shutting down: nothing to draw on
            return
        self._drawn_version = self.store.version
        self._drawn_at = self.clock()
        state = self.store.view()
        self.state = state
        main = self.screen_stack[0]
        if main.is_mounted and main.query(StatusHeader):  # none while the app tears its widgets down
            main.query_one(StatusHeader).show(state)
            main.query_one(RankGrid).show(state)
            main.query_one(Timeline).show(state)
            for panel in main.query(ThroughputPanel):
                panel.show(state)
        if isinstance(self.screen, RankDetail):
            self.screen.show(self.store.rank_rows(self.screen.rank, ROWS), state.paused)
        self.frames += 1

    # -- actions -----------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Over a dialog (editor, confirmation, help) the app's keys stay quiet: a `q` or `d` typed
        # there must not quit the console or stack a second dialog.
        over_dialog = bool(self.screen_stack) and isinstance(self.screen, ModalScreen)
        return not (over_dialog and action in _VIEW_ACTIONS)

    def action_pause(self) -> None:
        """Freeze the view on the current round, or follow the newest again."""
        paused = self.store.toggle_pause()
        self.refresh_now()
        if not paused and not self.store.history:
            self.notify("nothing to pause yet: no rounds have arrived")

    def action_step(self, records: int) -> None:
        """Scroll back (negative) or forward through the rounds held; pauses the view."""
        self.store.step(records)
        self.refresh_now()

    def action_help(self) -> None:
        """Show keys and the glossary."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self._all_bindings()))

    def action_detail(self, rank: int | None = None) -> None:
        """Show one rank's recent rows (the grid's cursor rank by default)."""
        grid = self.screen_stack[0].query_one(RankGrid)
        if rank is None:
            if not grid.rows:
                self.notify("no ranks to show yet")
                return
            rank = grid.rows[grid.cursor].rank
        self.push_screen(RankDetail(rank, self.state.dp_size or len(grid.rows)))

    def on_rank_grid_detail_requested(self, message: RankGrid.DetailRequested) -> None:
        self.action_detail(message.rank)

    def action_edit(self) -> None:
        """Open the interval editor (live servers only)."""
        admin = self.source.admin
        if admin is None:
            self.notify("the interval editor needs a live server; this is a replay", severity="warning")
            return
        self.push_screen(IntervalEditor(admin, self.config_in_force()))

    def action_disable(self) -> None:
        """Ask, then turn the gate off on every rank."""
        if self.source.admin is None:
            self.notify("disabling the gate needs a live server; this is a replay", severity="warning")
            return
        question = (
            "Disable the prefill gate?\n\nEvery rank then plans prefill on every round (plain continuous "
            "batching) from the round all ranks adopt the change. Re-enable it with e."
        )
        self.push_screen(Confirm(question, yes="Disable"), self._disable_answered)

    def _disable_answered(self, yes: bool | None) -> None:
        if yes:
            self._disable()

    @work(exclusive=True, exit_on_error=False, group="admin", name="disable")
    async def _disable(self) -> None:
        admin = self.source.admin
        assert admin is not None
        config = self.config_in_force()
        try:
            applied = await admin.disable(expected_epoch=config.epoch if config is not None else None)
        except AdminError as error:
            text = f"the gate was not disabled ({error.code}): {error.message}"
            self.store.notice(text)
            self.notify(text, severity="error")
            return
        text = f"gate disabled: {describe_config(applied.config)}, adopted by every rank after round " \
               f"{applied.adopted_round:,}"
        self.store.notice(text)
        self.notify(text)

    def config_in_force(self) -> pb.GateConfig | None:
        """The newest config known: the newest record's (with an adoption it announces), else the snapshot's."""
        newest = self.store.newest
        if newest is None or not newest.HasField("config"):
            return self.store.config
        if newest.adopted_epoch > newest.config.epoch and self.store.config is not None:
            return self.store.config  # the record announces an adoption; the snapshot has its values
        return newest.config

    # -- help and the command palette --------------------------------------------------------------

    def _all_bindings(self) -> list[tuple[str, BindingType]]:
        pairs: list[tuple[str, BindingType]] = [("console", b) for b in self.BINDINGS]
        pairs += [("rank grid", b) for b in RankGrid.BINDINGS]
        pairs += [("rank detail", b) for b in RankDetail.BINDINGS]
        pairs += [("interval editor", b) for b in IntervalEditor.BINDINGS]
        pairs.append(("console", Binding("ctrl+p", "command_palette", "Command palette")))
        return pairs

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Pause or resume", "Freeze the view on this round, or follow the newest", self.action_pause)
        yield SystemCommand("Back one round", "Scroll back one round (pauses)", lambda: self.action_step(-1))
        yield SystemCommand("Forward one round", "Scroll forward one round", lambda: self.action_step(1))
        yield SystemCommand("Back ten rounds", "Scroll back ten rounds (pauses)", lambda: self.action_step(-10))
        yield SystemCommand("Forward ten rounds", "Scroll forward ten rounds", lambda: self.action_step(10))
        yield SystemCommand("Rank detail", "Recent rows of the rank under the cursor", self.action_detail)
        yield SystemCommand("Edit gate intervals", "Change A and K on the running engine", self.action_edit)
        yield SystemCommand("Disable the gate", "Turn the prefill gate off (asks first)", self.action_disable)
        yield SystemCommand("Help", "Keys and what the columns mean", self.action_help)
