"""The console app: a source feeds the store in an async worker; a fixed tick draws the latest state.

Records can arrive a thousand times a second; the screen changes ten times a second at most. The
worker only appends to the store (`console.store`), and `refresh_now`, called by the tick, builds one
immutable `ConsoleState` and hands it to every widget, each of which redraws only what changed.
A replay is driven like a video player (`console.source.ReplaySource`): pause, step, seek, speed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from console.admin import AdminError
from console.alerts import Bounds
from console.screens.alerts import AlertsScreen
from console.screens.confirm import Confirm
from console.screens.editor import IntervalEditor, describe_config
from console.screens.help import HelpScreen
from console.screens.prompt import Prompt
from console.screens.rank_detail import ROWS, RankDetail
from console.selection import FILTER_HELP, SORT_KEYS, FilterError, parse_filter
from console.source import ReplaySource, Source
from console.state import ConsoleState, Link, Position
from console.store import Store
from console.widgets import (
    AlertsPanel,
    Heatmap,
    PlayerBar,
    RankGrid,
    StatusHeader,
    SummaryLine,
    ThroughputPanel,
    Timeline,
)
from console.widgets.rank_grid import METRICS, Columns
from prefill_gate.v1 import types_pb2 as pb

TICK_HZ = 10.0
# Keys of the main view that must stay quiet over a dialog (a `q` or `d` typed there is the dialog's).
_VIEW_ACTIONS = frozenset({
    "quit", "pause", "step", "edit", "disable", "help", "detail", "goto", "speed", "sort", "reverse_sort",
    "filter", "history", "metric", "alerts",
})
_LIVE_ONLY = frozenset({"edit", "disable"})
_REPLAY_ONLY = frozenset({"speed"})
IDLE_REDRAW_S = 1.0  # with nothing new, the header still ages ("stale for N s", reconnect countdown)
DETAIL_REFRESH_S = 1.0  # a live rank detail redraws its rows once a second: readable, not a blur
COVERED_REFRESH_S = 1.0  # the dimmed screen under a dialog: redrawn once a second (each redraw re-tints it all)
HEAT_MIN = 8  # lines the heatmap needs below the grid before it is shown there
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 0.0)  # + and - step through; 0: as fast as it reads


@dataclasses.dataclass(frozen=True, slots=True)
class _Panels:
    """The main screen's panels that every frame hands the state to."""

    screen: Screen
    header: StatusHeader
    summary: SummaryLine
    timeline: Timeline
    player: PlayerBar
    alerts: AlertsPanel
    figures: tuple[ThroughputPanel, ...]


class ConsoleApp(App[int]):
    """Votes, windows, pressure and history of a running engine (or a recording)."""

    CSS_PATH = "console.tcss"
    TITLE = "prefill-gate console"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (140, "-wide")]

    BINDINGS = [
        Binding("q", "quit", "Quit", tooltip="Quit the console (the engine keeps running)"),
        Binding("question_mark,f1", "help", "Help", priority=True, tooltip="Keys and what the columns mean"),
        Binding("space", "pause", "Pause", tooltip="Freeze the view on this round (a replay: pause playback); "
                                                   "again: follow the newest (play)"),
        Binding("left", "step(-1)", "Back", tooltip="One round back (pauses the view)"),
        Binding("right", "step(1)", "Fwd", show=False, tooltip="One round forward"),
        Binding("shift+left", "step(-10)", "Back 10", show=False, tooltip="Ten rounds back (pauses the view)"),
        Binding("shift+right", "step(10)", "Fwd 10", show=False, tooltip="Ten rounds forward"),
        Binding("g", "goto", "Go to", priority=True,
                tooltip="Go to a round (a replay: anywhere in the file; live: the rounds held)"),
        Binding("s", "sort", "Sort", tooltip="Sort the ranks: rank, occupancy, waiting prompts, blocking ALL, "
                                             "rounds since extend (or click a column title)"),
        Binding("S", "reverse_sort", "Reverse", show=False, tooltip="Reverse the sort order"),
        Binding("slash", "filter", "Filter", priority=True,
                tooltip="Filter the ranks, e.g. blocks, >0.9, wait>3, 8-15"),
        Binding("h", "history", "History", tooltip="The ranks x rounds heatmap in place of the grid, and back"),
        Binding("m", "metric", "Metric", show=False, tooltip="What the history shows: state, occupancy, waiting"),
        Binding("a", "alerts", "Alerts", priority=True, tooltip="Every alert, in full"),
        Binding("e", "edit", "Edit", priority=True, tooltip="Edit the ALL and ANY intervals on the running engine"),
        Binding("d", "disable", "Disable", priority=True, tooltip="Disable the gate on every rank (asks first)"),
        Binding("plus", "speed(1)", "Faster", tooltip="Replay faster (0.25x ... 64x, then as fast as it reads)"),
        Binding("minus", "speed(-1)", "Slower", tooltip="Replay slower"),
    ]

    def __init__(
        self,
        source: Source,
        *,
        limit: int | None = None,
        tick_hz: float = TICK_HZ,
        clock: Callable[[], float] = time.monotonic,
        bounds: Bounds | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.player = source if isinstance(source, ReplaySource) else None
        self.limit = limit  # stop reading after this many records (deterministic tests)
        self.tick_hz = tick_hz
        self.clock = clock
        self.store = Store(source.name, source.live, clock, bounds)
        self.state: ConsoleState = self.store.view()
        self.frames = 0  # states drawn, for the benchmark's refresh rate
        self.history_view = False  # the heatmap in place of the grid
        self.metric = METRICS[0]
        self._drawn_version = -1
        self._panels_of: _Panels | None = None
        self._drawn_at = 0.0
        self._detail_at = -1e9
        self._main_drawn_at = -1e9
        self._covered = False
        self.ingest: Worker[None] | None = None

    # -- layout and lifecycle ----------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="header")
        yield SummaryLine(id="summary")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield RankGrid(id="grid")
                yield Heatmap(id="heat")
            with Vertical(id="side"):
                yield ThroughputPanel(id="side-figures")
                yield AlertsPanel(id="alerts")
        yield PlayerBar(id="player")
        yield Timeline(id="timeline")
        yield ThroughputPanel(id="figures")
        yield Footer()

    def on_mount(self) -> None:
        self.screen.set_class(self.player is not None, "-replay")
        self._start_ingest()
        self.set_interval(1 / self.tick_hz, self._tick, name="tick")
        self.query_one(RankGrid).focus()
        self.refresh_now()

    def _start_ingest(self) -> None:
        self.ingest = self.run_worker(self._read(), name="ingest", group="ingest", exit_on_error=False)

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
        covered = len(self.screen_stack) > 1
        if covered == self._covered and self.store.version == self._drawn_version \
                and now - self._drawn_at < IDLE_REDRAW_S:
            return
        self._covered = covered
        self.refresh_now(periodic=True)

    def refresh_now(self, *, periodic: bool = False) -> None:
        """Build the state of this instant and hand it to every widget (`periodic`: the tick's redraw,
        which spares the screen under a dialog; a key's redraw shows its effect everywhere at once)."""
        if not self.screen_stack:  # starting up or shutting down: nothing to draw on
            return
        main = self.screen_stack[0]
        if not main.is_mounted:
            return
        try:
            grid = main.query_one(RankGrid)
            heat = main.query_one(Heatmap)
        except NoMatches:  # composing, or being torn down
            return
        self._drawn_version = self.store.version
        self._drawn_at = self.clock()
        state = self.store.view(self._history_needed(grid, heat))
        if self.player is not None:
            state = dataclasses.replace(state, position=self._position(state))
        self.state = state
        # A dialog's dimmed background costs a full re-tint per redraw: under one, the main screen moves
        # once a second, while the dialog itself (the editor's "in force" line, the rank detail) keeps up.
        if not periodic or self.screen is main or self._drawn_at - self._main_drawn_at >= COVERED_REFRESH_S:
            self._main_drawn_at = self._drawn_at
            self._show_main(main, state, grid, heat)
        self._show_dialog(state)
        self.frames += 1

    def _show_main(self, main: Screen, state: ConsoleState, grid: RankGrid, heat: Heatmap) -> None:
        self._layout_body(main, len(state.views))
        panels = self._panels(main)
        panels.header.show(state)
        panels.summary.show(state, grid.in_view() if grid.display else None)
        grid.show(state, self.metric, self.clock())
        if heat.display:
            heat.show(state, self.metric)
        panels.timeline.show(state)
        panels.player.show(state)
        panels.alerts.show(state)
        for panel in panels.figures:
            panel.show(state)

    def _panels(self, main: Screen) -> _Panels:
        """The main screen's panels, looked up once (a query on every frame cost about 1 ms)."""
        panels = self._panels_of
        if panels is None or panels.screen is not main:
            panels = self._panels_of = _Panels(
                main, main.query_one(StatusHeader), main.query_one(SummaryLine), main.query_one(Timeline),
                main.query_one(PlayerBar), main.query_one(AlertsPanel), tuple(main.query(ThroughputPanel)),
            )
        return panels

    def _show_dialog(self, state: ConsoleState) -> None:
        screen = self.screen
        if isinstance(screen, RankDetail):
            now = self.clock()
            if not state.current or not state.live or now - self._detail_at >= DETAIL_REFRESH_S or not screen.lines:
                self._detail_at = now
                screen.show(self.store.rank_rows(screen.rank, ROWS), state)
        elif isinstance(screen, IntervalEditor):
            screen.show_in_force(self.config_in_force())
        elif isinstance(screen, AlertsScreen):
            screen.show(state)

    def _history_needed(self, grid: RankGrid, heat: Heatmap) -> int:
        bounds = self.store.bounds
        strip = Columns.fit(grid.scrollable_content_region.width).strip if grid.display else 0
        return max(strip, heat.rounds_needed if heat.display else 0, bounds.above_rounds, bounds.growing_rounds + 1)

    def _layout_body(self, main: Screen, ranks: int) -> None:
        """The grid as tall as its ranks, the heatmap in the room left (or in place of the grid: `h`)."""
        grid = main.query_one(RankGrid)
        heat = main.query_one(Heatmap)
        room = main.query_one("#left").size.height
        if self.history_view:
            show_grid, show_heat, grid_height = False, True, None
        elif room - (ranks + 1) >= HEAT_MIN:
            show_grid, show_heat, grid_height = True, True, ranks + 1
        else:
            show_grid, show_heat, grid_height = True, False, None
        if grid.display != show_grid:
            grid.display = show_grid
        if heat.display != show_heat:
            heat.display = show_heat
        wanted = f"{grid_height}" if grid_height is not None else "1fr"
        if str(grid.styles.height) != wanted:
            grid.styles.height = grid_height if grid_height is not None else "1fr"

    def _position(self, state: ConsoleState) -> Position | None:
        player = self.player
        if player is None or not len(player) or state.record is None:
            return None
        return Position(
            index=player.shown_index(state.record.round),
            total=len(player),
            first_round=player.records.round_at(0),
            last_round=player.records.round_at(len(player) - 1),
            speed=player.speed,
            playing=player.playing and not self.store.paused,
        )

    # -- actions -----------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Over a dialog (editor, confirmation, help) the app's keys stay quiet: a `q` or `d` typed
        # there must not quit the console or stack a second dialog.
        over_dialog = bool(self.screen_stack) and isinstance(self.screen, ModalScreen)
        if over_dialog and action in _VIEW_ACTIONS:
            return False
        # A recording cannot be changed, and a live stream has no speed: such keys are not offered.
        if action in _LIVE_ONLY and self.player is not None:
            return False
        return not (action in _REPLAY_ONLY and self.player is None)

    def action_pause(self) -> None:
        """Freeze the view on the current round, or follow the newest again (a replay: pause or play)."""
        store = self.store
        if self.player is not None and store.paused:
            # Play on from the round shown, not from the newest read.
            shown = self.state.record
            if shown is not None:
                store.truncate_after(shown.round)
                self.player.next_index = self.player.shown_index(shown.round) + 1
        paused = store.toggle_pause()
        if self.player is not None and not paused and self.ingest is not None and self.ingest.is_finished \
                and self.player.next_index < len(self.player):
            self._start_ingest()  # the end was reached, then the user went back: play from there
        self.refresh_now()
        if not paused and not store.history:
            self.notify("nothing to pause yet: no rounds have arrived")

    def action_step(self, records: int) -> None:
        """Move back (negative) or forward by rounds; pauses. A replay steps anywhere in its file."""
        if self.player is not None and self.state.record is not None:
            index = self.player.shown_index(self.state.record.round) + records
            self.store.paused = True
            self.player.seek(self.store, index)
            self.store.version += 1
        else:
            self.store.step(records)
        self.refresh_now()

    def show_round(self, round_: int) -> str:
        """Show `round_` (paused there); an error message when it cannot be shown, else ""."""
        player = self.player
        if player is not None:
            first, last = player.records.round_at(0), player.records.round_at(len(player) - 1)
            if not first <= round_ <= last:
                return f"round {round_:,} is not in the recording: it holds rounds {first:,} to {last:,}"
            self.store.paused = True
            player.seek(self.store, player.records.index_of(round_))
            self.store.version += 1
        else:
            history = self.store.history
            if not history:
                return "no rounds have arrived yet"
            first, last = history[0].round, history[-1].round
            if not first <= round_ <= last:
                return (f"round {round_:,} is not held: the console holds rounds {first:,} to {last:,} "
                        f"(the newest {len(history):,})")
            self.store.paused = True
            self.store.cursor = round_
            self.store.version += 1
        self.refresh_now()
        return ""

    async def action_goto(self) -> None:
        """Ask for a round and show it."""

        def check(text: str) -> str:
            cleaned = text.replace(",", "").replace("_", "").strip()
            if not cleaned.isdigit():
                return f"a round number, e.g. 2116 (got {text!r})"
            return self.show_round(int(cleaned))

        if self.player is not None:
            records = self.player.records
            where = f"rounds {records.round_at(0):,} to {records.round_at(len(records) - 1):,}"
        elif self.store.history:
            where = f"held: rounds {self.store.history[0].round:,} to {self.store.history[-1].round:,}"
        else:
            where = "no rounds yet"
        await self._open(Prompt("go to round", where, check))

    async def _open(self, screen: Screen, callback: Callable | None = None) -> None:
        """Push a dialog and return once it is shown.

        The keys that open dialogs are priority bindings, run as the key arrives rather than after it
        bubbled up from the focused widget, and this waits for the dialog: so the keys typed after it
        reach the dialog instead of the screen below (an operator typing `e 1 6` fast lost the digits).
        Over a dialog those keys are refused by `check_action` and go to the dialog's field."""
        await self.push_screen(screen, callback)

    def action_speed(self, direction: int) -> None:
        """Replay faster (1) or slower (-1), while playing."""
        if self.player is None:
            return
        current = self.player.speed
        index = min(range(len(SPEEDS)), key=lambda i: abs((SPEEDS[i] or 1e9) - (current or 1e9)))
        index = min(max(index + direction, 0), len(SPEEDS) - 1)
        self.player.set_speed(SPEEDS[index], self.store)
        self.notify(f"replay speed {SPEEDS[index]:g}x" if SPEEDS[index] else "replay as fast as it reads",
                    timeout=1.5)
        self.refresh_now()

    def action_sort(self, key: str | None = None) -> None:
        """Sort by the next key (or by `key`)."""
        store = self.store
        if key is None:
            key = SORT_KEYS[(SORT_KEYS.index(store.sort_key) + 1) % len(SORT_KEYS)]
            store.set_sort(key, False)
        else:
            store.set_sort(key, store.sort_reverse if key == store.sort_key else False)
        self.refresh_now()

    def action_reverse_sort(self) -> None:
        """Reverse the order."""
        self.store.set_sort(self.store.sort_key, not self.store.sort_reverse)
        self.refresh_now()

    def on_rank_grid_sort_requested(self, message: RankGrid.SortRequested) -> None:
        if message.key == self.store.sort_key:
            self.action_reverse_sort()
        else:
            self.action_sort(message.key)

    async def action_filter(self) -> None:
        """Ask for a filter; an empty one lists every rank."""

        def check(text: str) -> str:
            try:
                rank_filter = parse_filter(text)
            except FilterError as error:
                return str(error)
            self.store.set_filter(rank_filter)
            self.query_one(RankGrid).cursor = 0
            self.refresh_now()
            return ""

        await self._open(Prompt("filter ranks", FILTER_HELP, check, self.store.rank_filter.text))

    def action_history(self) -> None:
        """The heatmap in place of the grid, or back."""
        self.history_view = not self.history_view
        self.screen_stack[0].set_class(self.history_view, "-history")
        self.refresh_now()
        self.call_after_refresh(self.refresh_now)  # the heatmap knows its height after the layout

    def action_metric(self) -> None:
        """What the history strips and the heatmap show: state, occupancy, waiting prompts."""
        self.metric = METRICS[(METRICS.index(self.metric) + 1) % len(METRICS)]
        self.refresh_now()

    async def action_alerts(self) -> None:
        """Every alert in full."""
        if not isinstance(self.screen, AlertsScreen):
            await self._open(AlertsScreen(self.state))

    def on_timeline_round_clicked(self, message: Timeline.RoundClicked) -> None:
        error = self.show_round(message.round)
        if error:
            self.notify(error, severity="warning")

    def on_heatmap_round_clicked(self, message: Heatmap.RoundClicked) -> None:
        self.on_timeline_round_clicked(message)  # type: ignore[arg-type]

    def on_player_bar_seek(self, message: PlayerBar.Seek) -> None:
        if self.player is not None and len(self.player):
            index = round(message.fraction * (len(self.player) - 1))
            self.player.seek(self.store, index)
            self.store.version += 1
            self.refresh_now()

    async def action_help(self) -> None:
        """Show keys and the glossary."""
        if not isinstance(self.screen, HelpScreen):
            await self._open(HelpScreen(self._all_bindings()))

    def action_detail(self, rank: int | None = None) -> None:
        """Show one rank's recent rows (the grid's cursor rank by default)."""
        grid = self.screen_stack[0].query_one(RankGrid)
        if rank is None:
            rank = grid.cursor_rank
            if rank is None:
                self.notify("no ranks to show yet")
                return
        self._detail_at = -1e9
        self.push_screen(RankDetail(rank, self.state.dp_size or len(grid.views), self.store.executor))

    def on_rank_grid_detail_requested(self, message: RankGrid.DetailRequested) -> None:
        self.action_detail(message.rank)

    async def action_edit(self) -> None:
        """Open the interval editor (live servers only)."""
        admin = self.source.admin
        if admin is None:
            self.notify("the interval editor needs a live server; this is a replay", severity="warning")
            return
        await self._open(IntervalEditor(admin, self.config_in_force(), self.store.last_enabled))

    async def action_disable(self) -> None:
        """Ask, then turn the gate off on every rank."""
        if self.source.admin is None:
            self.notify("disabling the gate needs a live server; this is a replay", severity="warning")
            return
        question = (
            "Disable the prefill gate?\n\nEvery rank then plans prefill on every round (plain continuous "
            "batching) from the round all ranks adopt the change. Re-enable it with e."
        )
        await self._open(Confirm(question, yes="Disable"), self._disable_answered)

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
        self.store.notice(text, epoch=applied.config.epoch)  # holds while that config is in force
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
        yield SystemCommand("Go to round", "Show one round (a replay: anywhere in the file)", self.action_goto)
        yield SystemCommand("Sort ranks", "Next sort key", self.action_sort)
        yield SystemCommand("Filter ranks", "Blocks, >0.9, wait>3, a rank range...", self.action_filter)
        yield SystemCommand("History heatmap", "Ranks x rounds in place of the grid", self.action_history)
        yield SystemCommand("Alerts", "Every alert in full", self.action_alerts)
        yield SystemCommand("Rank detail", "Recent rows of the rank under the cursor", self.action_detail)
        if self.player is None:
            yield SystemCommand("Edit gate intervals", "Change A and K on the running engine", self.action_edit)
            yield SystemCommand("Disable the gate", "Turn the prefill gate off (asks first)", self.action_disable)
        else:
            yield SystemCommand("Replay faster", "Double the speed", lambda: self.action_speed(1))
            yield SystemCommand("Replay slower", "Halve the speed", lambda: self.action_speed(-1))
        yield SystemCommand("Help", "Keys and what the columns mean", self.action_help)
