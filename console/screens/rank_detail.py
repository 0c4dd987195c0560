"""One rank's recent rows, newest first, following the round the main view shows (paused or live).

Live, the rows are redrawn once a second (the app's DETAIL_REFRESH_S): at 30 rounds a second a table
that moves every round cannot be read. Sparklines of the rank's occupancy and waiting prompts above the
table move with every round. The simulator runs no forward, so its `fwd µs` would be a meaningless 0 or 1:
a simulated run shows the simulated round time (`round ms`, sim) in that column instead.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import ScrollableContainer
from textual.screen import Screen
from textual.widgets import Footer, Static

from console.digest import digest
from console.state import WATERMARK, ConsoleState
from console.store import mark_of
from console.widgets.rank_grid import SPARK
from console.widgets.timeline import point_glyph
from prefill_gate.v1 import types_pb2 as pb

ROWS = 60  # rounds listed


def columns(simulated: bool) -> str:
    """The column titles (`round ms` for a simulated run, see the module's docstring)."""
    last = "round ms" if simulated else "fwd µs"
    return (
        f"{'round':>9} {'pt':>2} {'want':>4} {'dec':>3} {'pre':>3} {'batch':>5} {'run':>4} {'tokens':>6} {'ext':>3} "
        f"{'prefill':>7} {'pending':>7} {'occ%':>6} {'chunks':>6} {'wait':>4} {'reads':>5} {'retr':>4} "
        f"{'retr Σ':>6} {last:>8}  flags"
    )


def sparkline(values: list[float], top: float) -> str:
    """Block glyphs for `values` on a 0..top scale (blank for 0)."""
    return "".join(SPARK[min(int(v / top * len(SPARK)), len(SPARK) - 1)] if top and v > 0 else " " for v in values)


def detail_line(record: pb.RoundRecord, row: pb.RankRow, simulated: bool = False) -> Text:
    """One round of one rank."""
    glyph, kind = point_glyph(mark_of(record, None))
    text = Text(no_wrap=True)
    text.append(f"{record.round:>9} ")
    text.append(f"{glyph:>2}", style={"open": "bold green", "shut": "yellow"}.get(kind, "dim"))
    text.append(f" {'●' if row.want_prefill else '·':>4} {'●' if row.has_decode_work else '·':>3}")
    text.append(f" {'▶' if row.planned_prefill else '·':>3}", style="bold cyan" if row.planned_prefill else "")
    text.append(f" {row.batch_size:>5} {row.running:>4} {row.num_tokens:>6} {row.num_extends:>3}")
    text.append(f" {row.prefill_tokens:>7} {row.pending_prefill_tokens:>7}")
    text.append(f" {row.occupancy:>6.1%}", style="bold red" if row.above_watermark else "")
    text.append(f" {row.resident_chunks:>6} {row.waiting_prompts:>4} {row.storage_reads:>5} {row.retracted:>4}")
    last = f"{record.round_seconds * 1e3:.2f}" if simulated else f"{row.forward_us}"
    text.append(f" {row.retractions_total:>6} {last:>8}  ")
    entry = digest(record)
    position = next((i for i, rank in enumerate(entry.ranks) if rank == row.rank), 0)
    if entry.blocks >> position & 1:
        text.append("blocks ALL", style="bold white on red" if entry.want else "yellow")
    if row.occupancy > WATERMARK:
        text.append(f" >{WATERMARK}", style="bold red")
    return text


class RankDetail(Screen[None]):
    """The recent rows of one rank; up/down switch rank, escape goes back."""

    DEFAULT_CSS = """
    RankDetail #title { background: $panel; text-style: bold; padding: 0 1; }
    RankDetail #columns { color: $text-muted; text-style: bold; padding: 0 1; }
    RankDetail #sparks { padding: 0 1; height: 2; }
    RankDetail ScrollableContainer { padding: 0 1; }
    RankDetail #rows { width: auto; }  /* no wrapping: a wide table scrolls sideways instead */
    """

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("enter", "app.pop_screen", "Back", show=False),
        # Priority: the scrolling list below would take up/down for itself otherwise.
        Binding("up", "rank(-1)", "Previous rank", priority=True),
        Binding("down", "rank(1)", "Next rank", priority=True),
    ]

    def __init__(self, rank: int, dp_size: int, executor: str = "") -> None:
        super().__init__()
        self.rank = rank
        self.dp_size = dp_size
        self.simulated = executor == "sim"
        self._key: tuple = ()
        self.lines: list[Text] = []
        self.title_text = ""

    def compose(self) -> ComposeResult:
        yield Static("", id="title")
        yield Static("", id="sparks")
        yield Static(columns(self.simulated), id="columns")
        with ScrollableContainer():
            yield Static("", id="rows")
        yield Footer()

    def show(self, rows: list[tuple[pb.RoundRecord, pb.RankRow]], state: ConsoleState) -> None:
        """Take the rank's recent rows (newest first); redraw when they changed."""
        key = (self.rank, rows[0][0].round if rows else None, len(rows), state.paused, state.freshness())
        if key == self._key or not self.is_mounted:
            return
        self._key = key
        newest = rows[0][0].round if rows else None
        where = f"up to round {newest:,}" if newest is not None else "no rounds yet"
        freshness = state.freshness()
        if freshness:
            how = f" · {freshness}"
        elif state.live:
            how = " · live, redrawn every second"
        else:
            how = ""
        self.title_text = (f"rank {self.rank} of {self.dp_size} · last {len(rows)} rounds {where}{how} · "
                           "↑/↓ other rank · space pause · esc back")
        self.query_one("#title", Static).update(self.title_text)
        self.query_one("#sparks", Static).update(self._sparks(state))
        self.lines = [detail_line(record, row, self.simulated) for record, row in rows]
        self.query_one("#rows", Static).update(Text("\n").join(self.lines))

    def _sparks(self, state: ConsoleState) -> Text:
        width = max(self.size.width - 24, 10)
        history = [entry for entry in state.history[-width:] if self.rank in entry.ranks]
        position = history[-1].ranks.index(self.rank) if history else 0
        occupancy = [entry.occupancy[position] for entry in history]
        waiting = [float(entry.waiting[position]) for entry in history]
        top = max(waiting, default=0.0)
        text = Text(no_wrap=True)
        text.append(f"{'occupancy':>20} ", style="dim")
        text.append(sparkline(occupancy, 1.0), style="cyan")
        text.append(f"\n{f'waiting (max {top:.0f})':>20} ", style="dim")
        text.append(sparkline(waiting, top), style="yellow")
        return text

    def on_mount(self) -> None:
        # Draw at once (after this screen's first refresh), not at the next tick with something new.
        self.call_after_refresh(self.app.refresh_now)  # type: ignore[attr-defined]

    def action_rank(self, delta: int) -> None:
        """Show the previous or next rank."""
        if self.dp_size:
            self.rank = (self.rank + delta) % self.dp_size
            self._key = ()
            self.lines = []  # redraw now, not at the next once-a-second refresh
            self.app.refresh_now()  # type: ignore[attr-defined]
