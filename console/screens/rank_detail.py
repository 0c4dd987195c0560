"""One rank's recent rows, newest first, following the round the main view shows (paused or live)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import ScrollableContainer
from textual.screen import Screen
from textual.widgets import Footer, Static

from console.state import WATERMARK
from console.store import mark_of
from console.widgets.timeline import point_glyph
from prefill_gate.v1 import types_pb2 as pb

ROWS = 60  # rounds listed
COLUMNS = (
    f"{'round':>9} {'pt':>2} {'want':>4} {'dec':>3} {'pre':>3} {'batch':>5} {'run':>4} {'tokens':>6} {'ext':>3} "
    f"{'prefill':>7} {'pending':>7} {'occ%':>6} {'chunks':>6} {'wait':>4} {'reads':>5} {'retr':>4} {'retr Σ':>6} "
    f"{'fwd µs':>7}  flags"
)


def detail_line(record: pb.RoundRecord, row: pb.RankRow) -> Text:
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
    text.append(f" {row.retractions_total:>6} {row.forward_us:>7}  ")
    if row.blocks_all:
        text.append("blocks ALL", style="bold white on red")
    if row.above_watermark:
        text.append(f" >{WATERMARK}", style="bold red")
    return text


class RankDetail(Screen[None]):
    """The recent rows of one rank; up/down switch rank, escape goes back."""

    DEFAULT_CSS = """
    RankDetail #title { background: $panel; text-style: bold; padding: 0 1; }
    RankDetail #columns { color: $text-muted; text-style: bold; padding: 0 1; }
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

    def __init__(self, rank: int, dp_size: int) -> None:
        super().__init__()
        self.rank = rank
        self.dp_size = dp_size
        self._key: tuple = ()
        self.lines: list[Text] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="title")
        yield Static(COLUMNS, id="columns")
        with ScrollableContainer():
            yield Static("", id="rows")
        yield Footer()

    def show(self, rows: list[tuple[pb.RoundRecord, pb.RankRow]], paused: bool) -> None:
        """Take the rank's recent rows (newest first); redraw when they changed."""
        key = (self.rank, rows[0][0].round if rows else None, len(rows), paused)
        if key == self._key or not self.is_mounted:
            return
        self._key = key
        newest = rows[0][0].round if rows else None
        where = f"up to round {newest:,}" if newest is not None else "no rounds yet"
        state = " (paused)" if paused else ""
        self.query_one("#title", Static).update(
            f"rank {self.rank} of {self.dp_size} · last {len(rows)} rounds {where}{state} · "
            "↑/↓ other rank · esc back"
        )
        self.lines = [detail_line(record, row) for record, row in rows]
        self.query_one("#rows", Static).update(Text("\n").join(self.lines))

    def on_mount(self) -> None:
        # Draw at once (after this screen's first refresh), not at the next tick with something new.
        self.call_after_refresh(self.app.refresh_now)  # type: ignore[attr-defined]

    def action_rank(self, delta: int) -> None:
        """Show the previous or next rank."""
        if self.dp_size:
            self.rank = (self.rank + delta) % self.dp_size
            self._key = ()
            self.app.refresh_now()  # type: ignore[attr-defined]
