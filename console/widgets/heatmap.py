"""The history heatmap: ranks across, rounds down (newest at the top), two rounds per text line.

Each cell is one rank in one round, coloured by the metric `m` chooses: its state (extending, blocking a
wanted ALL point, wanting prefill, above the watermark, decoding, idle), its occupancy, or its waiting
prompts. A rank is one column, so 64 ranks fit an 80-column terminal; with few ranks each rank gets
several columns. The upper half of a cell is the newer round (▀ with the newer colour in front).
"""

from __future__ import annotations

from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from console.digest import WATERMARK, Digest
from console.state import ConsoleState
from console.widgets.rank_grid import state_style

_LABEL = 8  # "  12,345" round labels on the left
HEAD = 3  # title, legend and rank axis above the cells
_STATE_COLOURS = {
    "planned": "#ffa62b",  # extending (the accent)
    "blocks": "#e0405f",  # blocking ALL while another rank wants prefill
    "blocks-moot": "#8a6d3b",
    "yes": "#4ebf71",  # wants prefill
    "hot": "#c050c0",  # above the watermark
    "bar": "#2a5d8a",  # decoding
    "dim": "#202428",  # idle
}
LEGENDS = {
    "occupancy": f"dark 0 → bright {WATERMARK}, magenta above it",
    "waiting": "waiting prompts, dark 0 → bright = the most here",
}
STATE_LEGEND = (("planned", "extending"), ("blocks", "blocks ALL"), ("yes", "wants"), ("hot", f">{WATERMARK}"),
                ("bar", "decoding"), ("dim", "idle"))


def _ramp(value: float) -> Color:
    """Dark blue to bright cyan for 0..1."""
    value = max(0.0, min(value, 1.0))
    return Color.from_rgb(20 + 40 * value, 30 + 190 * value, 50 + 200 * value)


class Heatmap(Widget):
    """Ranks x rounds, up to the round shown."""

    DEFAULT_CSS = """
    Heatmap {
        height: 1fr;
        background: $surface;
    }
    """

    class RoundClicked(Message):
        """The user clicked a round (to show it)."""

        def __init__(self, round_: int) -> None:
            super().__init__()
            self.round = round_

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._history: tuple[Digest, ...] = ()
        self._positions: tuple[int, ...] = ()
        self._ranks: tuple[int, ...] = ()
        self._metric = "state"
        self._frozen = ""
        self._stride = 1
        self._cell_styles: dict[tuple, Style] = {}
        self._key: tuple = ()
        self._strips: list[Strip] = []

    @property
    def rounds_needed(self) -> int:
        """How many rounds fill the widget."""
        return max(self.size.height - HEAD, 0) * 2

    def show(self, state: ConsoleState, metric: str = "state") -> None:
        """Take the rounds to draw (the listed ranks, in rank order)."""
        history = state.history[-self.rounds_needed:] if self.rounds_needed else ()
        views = sorted(state.views, key=lambda view: view.row.rank)
        positions = tuple(view.position for view in views)
        key = (history[-1].round if history else None, len(history), positions, metric, state.freshness())
        if key == self._key:
            return
        self._key = key
        self._history, self._positions, self._metric = history, positions, metric
        self._ranks = tuple(view.row.rank for view in views)
        self._frozen = state.freshness()
        self._stride = state.stride
        self._strips = []
        self.refresh()

    def on_resize(self) -> None:
        self._strips = []
        self._cell_styles.clear()

    def render_line(self, y: int) -> Strip:
        if not self._strips:
            self._strips = self._build(self.size.width, self.size.height)
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.size.width, self.rich_style)

    def on_click(self, event: events.Click) -> None:
        """A click on a line shows its newer round."""
        line = event.y - HEAD
        newest_first = self._history[::-1]
        if line >= 0 and line * 2 < len(newest_first):
            self.post_message(self.RoundClicked(newest_first[line * 2].round))

    def _colour(self, entry: Digest, position: int, top: float) -> Color:
        if position >= entry.size:
            return Color.parse(_STATE_COLOURS["dim"])
        if self._metric == "occupancy":
            value = entry.occupancy[position]
            return Color.parse(_STATE_COLOURS["hot"]) if value > WATERMARK else _ramp(value / WATERMARK)
        if self._metric == "waiting":
            return _ramp(entry.waiting[position] / top if top else 0.0)
        return Color.parse(_STATE_COLOURS[state_style(entry, position)])

    def _build(self, width: int, height: int) -> list[Strip]:
        base = self.rich_style
        muted = base + Style(color="grey62")
        ranks = len(self._positions)
        columns = max(width - _LABEL - 1, 0)
        cell = max(min(columns // ranks, 6), 1) if ranks else 1
        shown = min(ranks, columns // cell) if cell else 0
        every = f" (every {self._stride}th)" if self._stride > 1 else ""
        plural = "s" if ranks != 1 else ""
        rounds = len(self._history)
        title = f" history · {ranks} rank{plural} x {rounds} rounds{every}, newest on top, two a line · m: metric"
        if self._frozen:
            title = f" {self._frozen} ·" + title
        legend = [Segment(f" {self._metric}: ", muted)]
        if self._metric == "state":
            for name, word in STATE_LEGEND:
                legend += [Segment("■", base + Style(color=_STATE_COLOURS[name])), Segment(f" {word}  ", muted)]
        else:
            legend.append(Segment(LEGENDS[self._metric], muted))
        strips = [Strip([Segment(title[:width].ljust(width), muted)], width),
                  Strip(legend).crop(0, width).adjust_cell_length(width, base)]
        strips.append(Strip([Segment(self._axis(shown, cell, width), muted)], width))
        if shown < ranks:
            strips[-1] = Strip([Segment(self._axis(shown, cell, width - 14) + f" +{ranks - shown} ranks →",
                                        muted)], width)
        newest_first = self._history[::-1]
        top = max((max(entry.waiting) for entry in newest_first if entry.waiting), default=0)
        for line in range(max(height - HEAD, 0)):
            newer = newest_first[line * 2] if line * 2 < len(newest_first) else None
            older = newest_first[line * 2 + 1] if line * 2 + 1 < len(newest_first) else None
            label = f"{newer.round:>{_LABEL - 1},} " if newer is not None and line % 4 == 0 else " " * _LABEL
            segments = [Segment(label[:_LABEL], muted)]
            for position in self._positions[:shown]:
                upper = self._colour(newer, position, top) if newer is not None else None
                lower = self._colour(older, position, top) if older is not None else None
                glyph = "▀" if upper is not None else " "
                style = self._cell_styles.get((upper, lower))
                if style is None:
                    style = self._cell_styles[(upper, lower)] = base + Style(color=upper, bgcolor=lower)
                segments.append(Segment(glyph * cell, style))
            strips.append(Strip(segments).adjust_cell_length(width, base).simplify())
        return strips

    def _axis(self, shown: int, cell: int, width: int) -> str:
        """Rank numbers under every eighth column (or every column when each rank is wide)."""
        out = [" "] * max(width, 0)
        step = 1 if cell >= 4 else 8
        for index in range(0, shown, step):
            label = str(self._ranks[index])
            at = _LABEL + index * cell
            if at + len(label) <= len(out):
                out[at : at + len(label)] = label
        prefix = "rank"
        out[: len(prefix) + 1] = prefix + " "
        return "".join(out)
