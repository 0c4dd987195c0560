"""The rank grid: one line per rank, drawn with the Line API so 64+ ranks stay cheap at 10 Hz.

Each line is built from segments (no Rich layout per cell) and cached by the values it shows; a new
state refreshes only the lines whose values changed. The column header stays on the first line while
the ranks scroll under it. Columns are laid out for the width exactly (`Columns.fit`): every column
and flag is whole at any width the layout chooses, and what a wide terminal has to spare goes to each
rank's history strip, not to padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.color import Color
from textual.filter import ANSIToTruecolor, LineFilter
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console.digest import Digest
from console.selection import RankView
from console.state import WATERMARK, ConsoleState
from prefill_gate.v1 import types_pb2 as pb

_EIGHTHS = " ▏▎▍▌▋▊▉"
SPARK = "▁▂▃▄▅▆▇█"
ALERT = "⚠"
METRICS = ("state", "occupancy", "waiting")  # what the history strips and the heatmap show (m cycles)


@dataclass(frozen=True, slots=True)
class Columns:
    """Column widths for one grid width: `layout` picks the columns, the bar and the strip share the rest."""

    layout: str  # "wide", "narrow" or "compact"
    bar: int
    strip: int  # history strip cells (0: none)

    @property
    def wide(self) -> bool:
        """The wide layout (words rather than marks in the flags)."""
        return self.layout == "wide"

    @classmethod
    def fit(cls, width: int) -> Columns:
        """The layout for `width` cells: the widest whose columns all fit with a bar of 10 or more."""
        for layout in ("wide", "narrow", "compact"):
            spare = width - FIXED[layout]
            if spare >= 10 or layout == "compact":
                break
        if spare >= BAR_MAX + 1 + STRIP_MIN:
            return cls(layout=layout, bar=BAR_MAX, strip=spare - BAR_MAX - 1)
        return cls(layout=layout, bar=max(spare, 4), strip=0)


STRIP_HZ = 2.0  # frames a second of the history strips (the rest of the grid follows the tick)
BAR_MAX = 30  # a wider occupancy bar shows nothing more; the rest goes to the history strip
STRIP_MIN = 12
# Cells taken by everything but the bar (separators included), in each layout.
FIXED = {"wide": 93, "narrow": 74, "compact": 67}
FLAGS = {"wide": 16, "narrow": 6, "compact": 6}  # "blocks ALL >0.9 ⚠" / "⊘ALL!⚠"
_BAR_TITLES = (f"occupancy, ┃ = {WATERMARK} watermark", f"occupancy ┃={WATERMARK}", f"occ ┃={WATERMARK}", "occ", "")
# Header cells of the columns a click sorts by (x ranges are found in the header text).
SORT_BY_TITLE = {"rank": "rank", "since": "since", "occ%": "occupancy", "wait": "waiting", "flags": "blocking"}


def row_key(row: pb.RankRow) -> tuple:
    """The values a line shows, as shown: equal keys draw identical lines, so a key that did not change
    costs no redraw (occupancy counts at the finest step a 40-cell bar with eighths can show)."""
    return (
        row.rank, row.want_prefill, row.has_decode_work, row.planned_prefill, row.batch_size, row.num_tokens,
        row.num_extends, int(row.occupancy * 320), round(row.occupancy * 100), row.resident_chunks,
        row.waiting_prompts, row.storage_reads, row.retracted, row.running,
    )


def header_text(columns: Columns, width: int, metric: str = "state", stride: int = 1) -> str:
    """The column titles for `columns` (also what a click on the header is matched against)."""
    bar_title = next(title for title in _BAR_TITLES if len(title) <= columns.bar)
    flags = "flags"
    if columns.layout == "wide":
        text = (
            f"{'rank':>4} {'want':>4} {'dec':>3} {'pre':>3} {'batch':>5} {'run':>4} {'tokens':>6} {'ext':>3} "
            f"{'since':>5}  {bar_title:<{columns.bar}} {'occ%':>4} {'chunks':>6} {'wait':>4} {'reads':>5} "
            f"{'retr':>4}  {flags:<{FLAGS['wide']}}"
        )
    elif columns.layout == "narrow":
        text = (
            f"{'rank':>4} {'want':>4} {'dec':>3} {'pre':>3} {'batch':>5} {'tokens':>6} {'ext':>3} {'since':>5} "
            f"{bar_title:<{columns.bar}} {'occ%':>4} {'chunk':>5} {'wait':>4} {'read':>4} {'retr':>4} "
            f"{flags:<{FLAGS['narrow']}}"
        )
    else:
        text = (
            f"{'rank':>4} {'w':>1} {'d':>1} {'p':>1} {'batch':>5} {'tokens':>6} {'ext':>3} {'since':>5} "
            f"{bar_title:<{columns.bar}} {'occ%':>4} {'chunk':>5} {'wait':>4} {'read':>4} {'retr':>4} "
            f"{flags:<{FLAGS['compact']}}"
        )
    if columns.strip:
        title = {"state": "history: occupancy, coloured by state", "occupancy": "history: occupancy",
                 "waiting": "history: waiting prompts"}[metric]
        if stride > 1:
            title += f", every {stride}th round"
        text += " " + title[: columns.strip].ljust(columns.strip)
    return text[:width].ljust(width)


class RankGrid(ScrollView, can_focus=True, inherit_bindings=False):
    """Votes, plan, pressure and recent history of every rank listed (sorted and filtered by the app).

    Scroll bindings are not inherited: left and right belong to the app (rounds back and forward).
    """

    COMPONENT_CLASSES = {
        "rank-grid--header",
        "rank-grid--header-frozen",
        "rank-grid--cursor",
        "rank-grid--dim",
        "rank-grid--yes",
        "rank-grid--blocks",
        "rank-grid--blocks-moot",
        "rank-grid--hot",
        "rank-grid--alert",
        "rank-grid--bar",
        "rank-grid--bar-hot",
        "rank-grid--watermark",
        "rank-grid--planned",
        "rank-grid--frozen",
    }

    DEFAULT_CSS = """
    RankGrid {
        height: 1fr;
        scrollbar-size-vertical: 1;
        overflow-x: hidden;
        background: $surface;
    }
    RankGrid > .rank-grid--header { color: $text-muted; text-style: bold; background: $panel; }
    RankGrid > .rank-grid--header-frozen { color: $text; text-style: bold; background: $warning 45%; }
    RankGrid > .rank-grid--cursor { background: $primary 35%; }
    RankGrid:focus > .rank-grid--cursor { background: $primary 55%; }
    RankGrid > .rank-grid--dim { color: $text-disabled; }
    RankGrid > .rank-grid--yes { color: $success; text-style: bold; }
    RankGrid > .rank-grid--blocks { color: $text; background: $error 70%; text-style: bold; }
    RankGrid > .rank-grid--blocks-moot { color: $warning 80%; }
    RankGrid > .rank-grid--hot { color: $error; text-style: bold; }
    RankGrid > .rank-grid--alert { color: $warning; text-style: bold reverse; }
    RankGrid > .rank-grid--bar { color: $primary; }
    RankGrid > .rank-grid--bar-hot { color: $error; }
    RankGrid > .rank-grid--watermark { color: $warning; text-style: bold; }
    RankGrid > .rank-grid--planned { color: $accent; text-style: bold; }
    RankGrid > .rank-grid--frozen { text-style: dim; }
    """

    BINDINGS = [
        Binding("up", "cursor(-1)", "Rank up", show=False, tooltip="Move the rank cursor up"),
        Binding("down", "cursor(1)", "Rank down", show=False, tooltip="Move the rank cursor down"),
        Binding("pageup", "cursor(-10)", "Page up", show=False, tooltip="Ten ranks up"),
        Binding("pagedown", "cursor(10)", "Page down", show=False, tooltip="Ten ranks down"),
        Binding("home", "cursor_to(0)", "First rank", show=False, tooltip="Cursor to the first rank"),
        Binding("end", "cursor_to(-1)", "Last rank", show=False, tooltip="Cursor to the last rank"),
        Binding("enter", "open_detail", "Detail", tooltip="Recent rows of the rank under the cursor (or click it)"),
    ]

    cursor: reactive[int] = reactive(0)

    class DetailRequested(Message):
        """The user asked for one rank's recent rows."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    class SortRequested(Message):
        """The user clicked a column title."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._views: tuple[RankView, ...] = ()
        self._keys: tuple[tuple, ...] = ()
        self._history: tuple[Digest, ...] = ()
        self._frozen = ""  # the not-live badge, "" while live
        self._held = 0  # rounds held up to the shown one: "since" reaches back that far
        self._stride = 1
        self._metric = "state"
        self._waiting_top = 0
        self._cell_cache: dict[tuple, tuple[tuple[str, str], ...]] = {}
        self._by_position: list[tuple[tuple[str, str], ...]] = []
        self._strip_source: tuple[Digest, ...] = ()
        self._strip_segments: dict[tuple, list[Segment]] = {}
        self._strip_at = -1e9
        self._lines: LRUCache[tuple, tuple[list[Segment], list[Segment]]] = LRUCache(1024)
        self._styles: dict[str, Style] = {}  # resolved once per style change, not once per cell
        self._header_key: tuple = ()
        self._own_filters: tuple[LineFilter, ...] = ()  # applied here, to cached parts (get_line_filters)
        self._filter_background: Color | None = None

    # -- state in ----------------------------------------------------------------------------------

    def show(self, state: ConsoleState, metric: str = "state", now: float | None = None) -> None:
        """Take the listed ranks; refresh only the lines that changed. The history strips move at most
        STRIP_HZ times a second (`now`: the app's clock): drawing them costs more than the rest of a line."""
        views = state.views
        columns = Columns.fit(self.scrollable_content_region.width)
        history = state.history[-columns.strip:] if columns.strip else ()
        if (now is not None and self._history and history and metric == self._metric and not state.paused
                and now - self._strip_at < 1 / STRIP_HZ and len(history) == len(self._history)):
            history = self._history  # keep the strips as they are until their next frame
        elif now is not None:
            self._strip_at = now
        # A strip moves with every round, so its end round is part of each line's key.
        end = (history[-1].round, len(history), metric) if history else None
        keys = tuple((row_key(v.row), v.blocks, v.contested, v.since, v.alert, v.position, end) for v in views)
        frozen = state.freshness()
        header_key = (frozen, metric, columns, state.stride)
        if keys == self._keys and header_key == self._header_key:
            return
        old = self._keys
        self._views, self._keys, self._history, self._metric = views, keys, history, metric
        # One scale for every rank's waiting strip (the most any rank had in the rounds shown).
        self._waiting_top = max((max(entry.waiting, default=0) for entry in history), default=0) \
            if metric == "waiting" else 0
        if not history or history is not self._strip_source:
            # Each round's cells once, then turned into one column of cells per rank (zip does it in C).
            self._by_position = list(zip(*(self._cells(entry) for entry in history), strict=False)) if history else []
            self._strip_source = history
            self._strip_segments.clear()
        self._held = state.held
        self._stride = state.stride
        if frozen != self._frozen:
            self._frozen = frozen
            self._lines.clear()
            self.refresh()
        if header_key != self._header_key:
            self._header_key = header_key
            self.refresh_line(0)
        if len(keys) != len(old):
            self.virtual_size = Size(self.size.width, len(keys) + 1)
            self.cursor = min(self.cursor, max(len(keys) - 1, 0))
            self.refresh()
            return
        changed = [index for index, (before, after) in enumerate(zip(old, keys, strict=True)) if before != after]
        if len(changed) > 8:
            self.refresh()  # one repaint is cheaper than many line regions (history strips move every round)
        else:
            for index in changed:
                self.refresh_line(index + 1)

    @property
    def views(self) -> tuple[RankView, ...]:
        """The ranks listed, in order."""
        return self._views

    @property
    def rows(self) -> tuple[pb.RankRow, ...]:
        """The rows listed, in order."""
        return tuple(view.row for view in self._views)

    def in_view(self) -> tuple[int, int] | None:
        """The first and last rows on screen (1-based) when some are out of view, else None."""
        visible = max(self.size.height - 1, 0)
        if not self._views or visible >= len(self._views):
            return None
        top = int(self.scroll_y)
        return top + 1, min(top + visible, len(self._views))

    @property
    def cursor_rank(self) -> int | None:
        """The rank under the cursor."""
        return self._views[self.cursor].row.rank if self._views else None

    # -- actions -----------------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        """Move the rank cursor (a page up from near the top stops at the first rank)."""
        if self._views:
            self.cursor = min(max(self.cursor + delta, 0), len(self._views) - 1)

    def action_cursor_to(self, index: int) -> None:
        """Put the cursor on a listed rank (negative: from the end)."""
        if not self._views:
            return
        if index < 0:
            index = len(self._views) + index
        self.cursor = min(max(index, 0), len(self._views) - 1)

    def action_open_detail(self) -> None:
        """Ask the app for the cursor rank's detail."""
        if self._views:
            self.post_message(self.DetailRequested(self._views[self.cursor].row.rank))

    def on_click(self, event: events.Click) -> None:
        """A click on a rank moves the cursor there; on the cursor's rank (or a double click) opens it. A
        click on a column title sorts by that column."""
        if event.y == 0:
            key = self._sort_key_at(event.x)
            if key is not None:
                self.post_message(self.SortRequested(key))
            return
        index = int(self.scroll_y) + event.y - 1
        if not 0 <= index < len(self._views):
            return
        if index == self.cursor or event.chain >= 2:
            self.cursor = index
            self.action_open_detail()
        else:
            self.cursor = index

    def _sort_key_at(self, x: int) -> str | None:
        text = header_text(Columns.fit(self.scrollable_content_region.width), self.scrollable_content_region.width)
        for title, key in SORT_BY_TITLE.items():
            start = text.find(title)
            if start >= 0 and start <= x < start + len(title):
                return key
        return None

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
            return self._filtered_strip(self._header(columns, width))
        index = int(self.scroll_y) + y - 1
        if index >= len(self._views):
            return self._filtered_strip(Strip.blank(width, self._style("base")))
        cursor = index == self.cursor
        view = self._views[index]
        base = self._base(cursor)
        # A line is built from parts cached on what they show: the rounds since the last extend and the
        # history strip move with every round, the rest only when the rank's values change.
        key = (self._keys[index][0], view.blocks, view.contested, view.alert, width, cursor, self.has_focus)
        parts = self._lines.get(key)
        if parts is None:
            left, right = self._parts(view, columns, base)
            parts = self._lines[key] = (self._filtered(left), self._filtered(right))
        left, right = parts
        since = Segment(f" {_since(view.since, self._held)}", base + self._style("planned") if view.since == 0
                        else base)
        segments = [*left, *self._filtered([since]), *right]
        if columns.strip:
            segments.extend(self._filtered([Segment(" ", base)]))
            segments.extend(self._strip(view.position, columns.strip, base))
        strip = Strip(segments)
        if strip.cell_length != width:
            strip = self._filtered_strip(strip.adjust_cell_length(width, base))
        return strip

    def get_line_filters(self) -> Sequence[LineFilter]:
        """The app's line filters less the colour conversion, which the grid applies itself to the parts it
        caches: Textual converts every segment of every line it is handed, and under a 1 kHz stream every
        line is new each frame (about a third of the grid's cost at 250x70). Only where Textual hands the
        filter the line's own segments untouched (no tint, opacity, hatch, border or padding), so the result
        is the same; otherwise every filter is left to Textual. A view that is not live (dimmed: the filter
        blends every colour) is drawn at most once a second and leaves it to Textual too."""
        filters = super().get_line_filters()
        styles = self.styles
        untouched = (
            not self._frozen and styles.tint.a == 0 and self.opacity == 1 and styles.text_opacity == 1
            and styles.gutter == (0, 0, 0, 0)
            and not (styles.has_rule("hatch") and styles.hatch != "none")
        )
        own = tuple(f for f in filters if isinstance(f, ANSIToTruecolor)) if untouched else ()
        background = self.background_colors[1]
        if own != self._own_filters or background != self._filter_background:
            self._own_filters, self._filter_background = own, background
            self._lines.clear()
            self._strip_segments.clear()
        return [f for f in filters if f not in own]

    def _filtered(self, segments: list[Segment]) -> list[Segment]:
        for line_filter in self._own_filters:
            segments = line_filter.apply(segments, self._filter_background)
        return segments

    def _filtered_strip(self, strip: Strip) -> Strip:
        for line_filter in self._own_filters:
            strip = strip.apply_filter(line_filter, self._filter_background)
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
        text = header_text(columns, width, self._metric, self._stride)
        if not self._frozen or not columns.strip:
            return Strip([Segment(text, self._style("header"))], width)
        # The badge takes the history strip's title (never a column's: every title stays readable).
        badge = f" {self._frozen}: not live "[: columns.strip]
        cut = max(width - len(badge), 0)
        return Strip([Segment(text[:cut], self._style("header")), Segment(badge[: width - cut],
                                                                          self._style("header-frozen"))], width)

    def _base(self, cursor: bool) -> Style:
        base = self._style("base")
        if cursor:
            base = base + self._style("cursor")
        if self._frozen:
            base = base + self._style("frozen")
        return base

    def _parts(self, view: RankView, columns: Columns, base: Style) -> tuple[list[Segment], list[Segment]]:
        """The line's cells before the `since` column (rank to ext) and after it (the bar to the flags)."""
        row = view.row
        dim = base + self._style("dim")
        yes = base + self._style("yes")
        hot = base + self._style("hot")
        planned = base + self._style("planned")
        segments: list[Segment] = []

        def cell(text: str, style: Style = base) -> None:
            segments.append(Segment(text, style))

        if view.contested:
            rank_style = base + self._style("blocks")
        elif view.alert:
            rank_style = base + self._style("alert")
        else:
            rank_style = base
        cell(f"{row.rank:>4}", rank_style)
        gap = "" if columns.layout == "compact" else "   "
        cell(" " + gap)
        cell("●" if row.want_prefill else "·", yes if row.want_prefill else (hot if view.contested else dim))
        cell(" " + gap[:2])
        cell("●" if row.has_decode_work else "·", base if row.has_decode_work else dim)
        cell(" " + gap[:2])
        cell("▶" if row.planned_prefill else "·", planned if row.planned_prefill else dim)
        cell(f" {row.batch_size:>5}")
        if columns.wide:
            cell(f" {row.running:>4}")
        cell(f" {_count(row.num_tokens, 6)}")
        cell(f" {row.num_extends:>3}", planned if row.num_extends else base)
        left, segments = segments, []
        cell("  " if columns.wide else " ")
        segments.extend(self._bar(row.occupancy, columns.bar, base, row.occupancy > WATERMARK))
        cell(f" {row.occupancy:>4.0%}", hot if row.occupancy > WATERMARK else base)
        chunk_width = 6 if columns.wide else 5
        cell(f" {row.resident_chunks:>{chunk_width}}", base if row.resident_chunks else dim)
        cell(f" {row.waiting_prompts:>4}", base if row.waiting_prompts else dim)
        cell(f" {row.storage_reads:>{5 if columns.wide else 4}}", base if row.storage_reads else dim)
        cell(f" {row.retracted:>4}", hot if row.retracted else dim)
        cell("  " if columns.wide else " ")
        flags = self._flags(view, columns.wide, base)
        segments.extend(flags)
        used = sum(len(segment.text) for segment in flags)
        cell(" " * (FLAGS[columns.layout] - used))
        # Neighbouring cells of one style become one segment: fewer segments for Textual to process.
        return list(Strip(left).simplify()), list(Strip(segments).simplify())

    def _bar(self, occupancy: float, width: int, base: Style, hot: bool) -> list[Segment]:
        """A bar of `width` cells with eighth-cell resolution; the watermark cell is always drawn. Runs of
        one glyph are one segment (a bar is at most five segments, not one per cell)."""
        fill = base + self._style("bar-hot" if hot else "bar")
        mark = base + self._style("watermark")
        empty = base + self._style("dim")
        mark_at = min(int(WATERMARK * width), width - 1)  # the cell that holds 0.9
        eighths = round(max(0.0, min(occupancy, 1.0)) * width * 8)
        cells = []
        for index in range(width):
            if index == mark_at:
                cells.append(("┃", mark))
                continue
            filled = min(max(eighths - index * 8, 0), 8)
            cells.append(("█", fill) if filled == 8 else (_EIGHTHS[filled], fill) if filled else ("·", empty))
        out: list[Segment] = []
        run, run_style = "", None
        for glyph, style in cells:
            if style is run_style and (glyph == run[-1:] or not run):
                run += glyph
                continue
            if run:
                out.append(Segment(run, run_style))
            run, run_style = glyph, style
        if run:
            out.append(Segment(run, run_style))
        return out

    def _flags(self, view: RankView, wide: bool, base: Style) -> list[Segment]:
        blocks = base + self._style("blocks" if view.contested else "blocks-moot")
        hot = base + self._style("hot")
        out = []
        if view.blocks:
            out.append(Segment("blocks ALL" if wide else "⊘ALL", blocks))
        if view.row.occupancy > WATERMARK:
            if out and wide:
                out.append(Segment(" ", base))
            out.append(Segment(f">{WATERMARK}" if wide else "!", hot))
        if view.alert:
            if out and wide:
                out.append(Segment(" ", base))
            out.append(Segment(ALERT, base + self._style("alert")))
        return out

    def _strip(self, position: int, width: int, base: Style) -> list[Segment]:
        """The rank's last `width` rounds, newest at the right: height from the metric, colour from its state."""
        key = (position, width, base)
        cached = self._strip_segments.get(key)
        if cached is not None:
            return cached
        column = self._by_position[position] if position < len(self._by_position) else ()
        pad = width - len(column)
        out = [Segment(" " * pad, base)] if pad > 0 else []
        for name, cells in groupby(column, key=itemgetter(1)):
            out.append(Segment("".join(glyph for glyph, _ in cells), base + self._style(name)))
        out = self._strip_segments[key] = self._filtered(out)
        return out

    def _cells(self, entry: Digest) -> tuple[tuple[str, str], ...]:
        """(glyph, style name) of every rank in one round, worked out once per round and metric."""
        key = (entry.round, self._metric, self._waiting_top)
        cells = self._cell_cache.get(key)
        if cells is None:
            if len(self._cell_cache) > 8192:
                self._cell_cache.clear()
            waiting = self._metric == "waiting"
            top = self._waiting_top if waiting else 1.0
            out = []
            for position in range(entry.size):
                value = entry.waiting[position] if waiting else entry.occupancy[position]
                glyph = SPARK[min(int(value / top * len(SPARK)), len(SPARK) - 1)] if top and value > 0 else " "
                out.append((glyph, state_style(entry, position) if self._metric == "state" else "bar"))
            cells = self._cell_cache[key] = tuple(out)
        return cells


def state_style(entry: Digest, position: int) -> str:
    """The style name of a rank's state in one round: extending, blocking a wanted ALL, wanting, above the
    watermark, decoding, idle (in that order of precedence)."""
    bit = 1 << position
    if entry.extend & bit:
        return "planned"
    if entry.blocks & bit:
        return "blocks" if entry.want else "blocks-moot"
    if entry.want & bit:
        return "yes"
    if entry.above & bit:
        return "hot"
    if entry.decode & bit:
        return "bar"
    return "dim"


def _since(value: int | None, held: int) -> str:
    """Rounds since the rank last extended, in 5 cells; `>N` when not within the N rounds held."""
    if value is None:
        return f">{held - 1}".rjust(5) if 1 < held <= 10_000 else "    -"
    return str(value).rjust(5) if value < 100_000 else " 99k+"


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
