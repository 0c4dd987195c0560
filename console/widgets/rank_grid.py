"""The rank grid: one line per rank, drawn with the Line API so 64+ ranks stay cheap at 10 Hz.

Each line is built from segments (no Rich layout per cell) and cached by the values it shows; a new
state refreshes only the lines whose values changed. The column header stays on the first line while
the ranks scroll under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console.state import WATERMARK, ConsoleState
from prefill_gate.v1 import types_pb2 as pb

_EIGHTHS = " ▏▎▍▌▋▊▉"


@dataclass(frozen=True, slots=True)
class Columns:
    """Column widths for one terminal width: the occupancy bar takes what the others leave."""

    bar: int
    wide: bool

    @classmethod
    def fit(cls, width: int) -> Columns:
        """The layout for `width` cells."""
        wide = width >= 104
        fixed = _FIXED_WIDE if wide else _FIXED_NARROW
        return cls(bar=max(8, min(40, width - fixed)), wide=wide)


# Cells taken by everything but the bar (separators included), in each layout.
_FIXED_NARROW = 67
_FIXED_WIDE = 86
_FLAG_WIDE = 15
_FLAG_NARROW = 5
_BAR_TITLES = (f"occupancy, ┃ = {WATERMARK} watermark", f"occupancy ┃={WATERMARK}", f"occ ┃={WATERMARK}", "occ")


def row_key(row: pb.RankRow) -> tuple:
    """The values a line shows, as shown: equal keys draw identical lines, so a key that did not change
    costs no redraw (occupancy counts at the finest step a 40-cell bar with eighths can show)."""
    return (
        row.rank, row.want_prefill, row.has_decode_work, row.planned_prefill, row.batch_size, row.num_tokens,
        row.num_extends, int(row.occupancy * 320), round(row.occupancy * 100), row.resident_chunks,
        row.waiting_prompts, row.storage_reads, row.retracted, row.above_watermark, row.blocks_all, row.running,
    )


class RankGrid(ScrollView, can_focus=True, inherit_bindings=False):
    """Votes, plan and pressure of every rank in the shown round.

    Scroll bindings are not inherited: left and right belong to the app (rounds back and forward).
    """

    COMPONENT_CLASSES = {
        "rank-grid--header",
        "rank-grid--cursor",
        "rank-grid--dim",
        "rank-grid--yes",
        "rank-grid--blocks",
        "rank-grid--blocks-moot",
        "rank-grid--hot",
        "rank-grid--bar",
        "rank-grid--bar-hot",
        "rank-grid--watermark",
        "rank-grid--planned",
    }

    DEFAULT_CSS = """
    RankGrid {
        height: 1fr;
        scrollbar-size-vertical: 1;
        overflow-x: hidden;
        background: $surface;
    }
    RankGrid > .rank-grid--header { color: $text-muted; text-style: bold; background: $panel; }
    RankGrid > .rank-grid--cursor { background: $accent 30%; }
    RankGrid:focus > .rank-grid--cursor { background: $accent 50%; }
    RankGrid > .rank-grid--dim { color: $text-disabled; }
    RankGrid > .rank-grid--yes { color: $success; text-style: bold; }
    RankGrid > .rank-grid--blocks { color: $text; background: $error 70%; text-style: bold; }
    RankGrid > .rank-grid--blocks-moot { color: $warning 80%; }
    RankGrid > .rank-grid--hot { color: $error; text-style: bold; }
    RankGrid > .rank-grid--bar { color: $primary; }
    RankGrid > .rank-grid--bar-hot { color: $error; }
    RankGrid > .rank-grid--watermark { color: $warning; text-style: bold; }
    RankGrid > .rank-grid--planned { color: $accent; text-style: bold; }
    """

    BINDINGS = [
        Binding("up", "cursor(-1)", "Rank up", show=False, tooltip="Move the rank cursor up"),
        Binding("down", "cursor(1)", "Rank down", show=False, tooltip="Move the rank cursor down"),
        Binding("pageup", "cursor(-10)", "Page up", show=False, tooltip="Ten ranks up"),
        Binding("pagedown", "cursor(10)", "Page down", show=False, tooltip="Ten ranks down"),
        Binding("home", "cursor_to(0)", "First rank", show=False, tooltip="Cursor to the first rank"),
        Binding("end", "cursor_to(-1)", "Last rank", show=False, tooltip="Cursor to the last rank"),
        Binding("enter", "open_detail", "Detail", tooltip="Recent rows of the rank under the cursor"),
    ]

    cursor: reactive[int] = reactive(0)

    class DetailRequested(Message):
        """The user asked for one rank's recent rows."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._rows: tuple[pb.RankRow, ...] = ()
        self._keys: tuple[tuple, ...] = ()
        self._contested = False  # some rank wants prefill: blocking ALL then delays its prompts
        self._lines: LRUCache[tuple, Strip] = LRUCache(1024)
        self._styles: dict[str, Style] = {}  # resolved once per style change, not once per cell

    # -- state in ----------------------------------------------------------------------------------

    def show(self, state: ConsoleState) -> None:
        """Take the shown round's rows; refresh only the lines that changed."""
        rows = state.ranks
        # A rank blocking ALL matters when another rank wants prefill; when none does, the shut ALL point
        # holds nothing back, and painting every rank red would only hide the rank that matters later.
        contested = state.record is not None and state.record.ranks_wanting > 0
        keys = tuple((row_key(row), contested and row.blocks_all) for row in rows)
        if keys == self._keys:
            return
        old = self._keys
        self._rows, self._keys, self._contested = rows, keys, contested
        if len(keys) != len(old):
            self.virtual_size = Size(self.size.width, len(keys) + 1)
            self.cursor = min(self.cursor, max(len(keys) - 1, 0))
            self.refresh()
            return
        for index, (before, after) in enumerate(zip(old, keys, strict=True)):
            if before != after:
                self.refresh_line(index + 1)

    @property
    def rows(self) -> tuple[pb.RankRow, ...]:
        """The rows on screen."""
        return self._rows

    # -- actions -----------------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        """Move the rank cursor."""
        self.action_cursor_to(self.cursor + delta)

    def action_cursor_to(self, index: int) -> None:
        """Put the cursor on a rank (negative: from the end)."""
        if not self._rows:
            return
        if index < 0:
            index = len(self._rows) + index
        self.cursor = min(max(index, 0), len(self._rows) - 1)

    def action_open_detail(self) -> None:
        """Ask the app for the cursor rank's detail."""
        if self._rows:
            self.post_message(self.DetailRequested(self._rows[self.cursor].rank))

    def watch_cursor(self, old: int, new: int) -> None:
        visible = max(self.size.height - 1, 1)  # the header line does not scroll
        top = int(self.scroll_y)
        if new < top:
            self.scroll_to(y=new, animate=False)
        elif new >= top + visible:
            self.scroll_to(y=new - visible + 1, animate=False)
        self.refresh_line(old + 1)
        self.refresh_line(new + 1)

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self._keys) + 1)
        self._lines.clear()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()  # a theme, focus or CSS change: resolve the styles again
        self._lines.clear()

    # -- lines out ---------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        columns = Columns.fit(width)
        if y == 0:
            return self._header(columns, width)
        index = int(self.scroll_y) + y - 1
        if index >= len(self._rows):
            return Strip.blank(width, self._style("base"))
        key = (self._keys[index], width, index == self.cursor, self.has_focus)
        strip = self._lines.get(key)
        if strip is None:
            strip = self._line(self._rows[index], columns, width, index == self.cursor)
            self._lines[key] = strip
        return strip

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self.rich_style if name == "base" else self.get_component_rich_style(f"rank-grid--{name}")
            self._styles[name] = style
        return style

    def _header(self, columns: Columns, width: int) -> Strip:
        bar_title = next((title for title in _BAR_TITLES if len(title) <= columns.bar), "")
        if columns.wide:
            text = (
                f"{'rank':>4} {'want':>4} {'dec':>3} {'pre':>3} {'batch':>5} {'run':>4} {'tokens':>6} {'ext':>3}  "
                f"{bar_title:<{columns.bar}} {'occ%':>4} {'chunks':>6} {'wait':>4} {'reads':>5} "
                f"{'retr':>4}  {'flags':<{_FLAG_WIDE}}"
            )
        else:
            text = (
                f"{'rank':>4} {'want':>4} {'dec':>3} {'pre':>3} {'batch':>5} {'tokens':>6} {'ext':>3} "
                f"{bar_title:<{columns.bar}} {'occ%':>4} {'chunk':>5} "
                f"{'wait':>4} {'read':>4} {'retr':>4} {'':<{_FLAG_NARROW}}"
            )
        style = self._style("header")
        return Strip([Segment(text[:width].ljust(width), style)], width)

    def _line(self, row: pb.RankRow, columns: Columns, width: int, cursor: bool) -> Strip:
        base = self._style("base")
        if cursor:
            base = base + self._style("cursor")
        dim = base + self._style("dim")
        yes = base + self._style("yes")
        hot = base + self._style("hot")
        planned = base + self._style("planned")
        segments: list[Segment] = []

        def cell(text: str, style: Style = base) -> None:
            segments.append(Segment(text, style))

        contested = self._contested and row.blocks_all
        cell(f"{row.rank:>4}", base + self._style("blocks") if contested else base)
        cell("    ")
        cell("●" if row.want_prefill else "·", yes if row.want_prefill else (hot if contested else dim))
        cell("   ")
        cell("●" if row.has_decode_work else "·", base if row.has_decode_work else dim)
        cell("   ")
        cell("▶" if row.planned_prefill else "·", planned if row.planned_prefill else dim)
        cell(f" {row.batch_size:>5}")
        if columns.wide:
            cell(f" {row.running:>4}")
        cell(f" {_count(row.num_tokens, 6)}")
        cell(f" {row.num_extends:>3}", planned if row.num_extends else base)
        cell("  " if columns.wide else " ")
        segments.extend(self._bar(row.occupancy, columns.bar, base, row.above_watermark))
        cell(f" {row.occupancy:>4.0%}", hot if row.above_watermark else base)
        chunk_width = 6 if columns.wide else 5
        cell(f" {row.resident_chunks:>{chunk_width}}", base if row.resident_chunks else dim)
        cell(f" {row.waiting_prompts:>4}", base if row.waiting_prompts else dim)
        cell(f" {row.storage_reads:>{5 if columns.wide else 4}}", base if row.storage_reads else dim)
        cell(f" {row.retracted:>4}", hot if row.retracted else dim)
        cell("  " if columns.wide else " ")
        segments.extend(self._flags(row, columns.wide, base))
        return Strip(segments).adjust_cell_length(width, base).simplify()

    def _bar(self, occupancy: float, width: int, base: Style, hot: bool) -> list[Segment]:
        """A bar of `width` cells with eighth-cell resolution; the watermark cell is always drawn."""
        fill = base + self._style("bar-hot" if hot else "bar")
        mark = base + self._style("watermark")
        empty = base + self._style("dim")
        mark_at = min(int(WATERMARK * width), width - 1)  # the cell that holds 0.9
        eighths = round(max(0.0, min(occupancy, 1.0)) * width * 8)
        out: list[Segment] = []
        for index in range(width):
            if index == mark_at:
                out.append(Segment("┃", mark))
                continue
            filled = min(max(eighths - index * 8, 0), 8)
            if filled == 8:
                out.append(Segment("█", fill))
            elif filled:
                out.append(Segment(_EIGHTHS[filled], fill))
            else:
                out.append(Segment("·", empty))
        return out

    def _flags(self, row: pb.RankRow, wide: bool, base: Style) -> list[Segment]:
        blocks = base + self._style("blocks" if self._contested else "blocks-moot")
        hot = base + self._style("hot")
        out = []
        if row.blocks_all:
            out.append(Segment("blocks ALL" if wide else "⊘ALL", blocks))
        if row.above_watermark:
            if out and wide:
                out.append(Segment(" ", base))
            out.append(Segment(f">{WATERMARK}" if wide else "!", hot))
        return out


def _count(value: int, width: int) -> str:
    """A count in `width` cells: exact while it fits, then k/M."""
    text = str(value)
    if len(text) <= width:
        return text.rjust(width)
    for unit, scale in (("k", 1_000), ("M", 1_000_000), ("G", 1_000_000_000)):
        text = f"{value / scale:.0f}{unit}"
        if len(text) <= width:
            return text.rjust(width)
    return text[:width]
