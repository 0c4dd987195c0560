"""The window timeline: one column per round, newest (or the round scrolled back to) at the right.

Row 1 marks the attempt points and whether each opened, row 2 how many ranks extended (so a window's
batching shows as one tall column instead of a scatter), row 3 the counter as a sparkline on the same
columns. Built from segments once per new state and drawn with the Line API.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.message import Message
from textual.strip import Strip

from console.state import ConsoleState, Mark
from console.widgets.base import ConsoleWidget
from prefill_gate.v1 import types_pb2 as pb

_BLOCKS = "▁▂▃▄▅▆▇█"
_LABEL = 9  # "  counter" column on the left
GAP = "\u2573"  # a diagonal cross: records were lost right before this round
LEGEND = f"▲/△ ANY open/shut  ■/□ ALL open/shut  {GAP} lost"


def point_glyph(mark: Mark) -> tuple[str, str]:
    """The glyph of a round's point and the component style it takes."""
    if mark.point == pb.GATE_POINT_ANY:
        return ("▲", "open") if mark.open else ("△", "shut")
    if mark.point == pb.GATE_POINT_ALL:
        return ("■", "open") if mark.open else ("□", "shut")
    # With the gate off every round is NONE; an extending round is still worth seeing.
    return ("·", "extend" if mark.ranks_extending else "none")


def level(value: float, top: float) -> str:
    """A block glyph for `value` on a 0..top scale; blank for 0 so quiet rounds stay quiet."""
    if value <= 0 or top <= 0:
        return " "
    index = min(int(value / top * len(_BLOCKS)), len(_BLOCKS) - 1)
    return _BLOCKS[index]


class Timeline(ConsoleWidget):
    """ANY/ALL points, ranks extending and the counter over the last rounds; a click on a round shows it."""

    class RoundClicked(Message):
        """The user clicked a round's column."""

        def __init__(self, round_: int) -> None:
            super().__init__()
            self.round = round_

    COMPONENT_CLASSES = {
        "timeline--title",
        "timeline--label",
        "timeline--open",
        "timeline--shut",
        "timeline--none",
        "timeline--extend",
        "timeline--counter",
        "timeline--gap",
        "timeline--frozen",
    }

    DEFAULT_CSS = """
    Timeline {
        height: 4;
        background: $surface;
    }
    Timeline > .timeline--title { color: $text-muted; background: $panel; }
    Timeline > .timeline--frozen { color: $text; background: $warning 45%; text-style: bold; }
    Timeline > .timeline--label { color: $text-muted; }
    Timeline > .timeline--open { color: $success; text-style: bold; }
    Timeline > .timeline--shut { color: $warning; }
    Timeline > .timeline--none { color: $text-disabled; }
    Timeline > .timeline--extend { color: $accent; }
    Timeline > .timeline--counter { color: $primary; }
    Timeline > .timeline--gap { color: $text; background: $error 60%; }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._state: ConsoleState | None = None
        self._key: tuple = ()
        self._strips: list[Strip] = []
        self._styles: dict[str, Style] = {}

    def show(self, state: ConsoleState) -> None:
        """Take a new state; rebuilt only when the rounds shown changed."""
        marks = state.marks
        last = marks[-1] if marks else None
        config = state.config
        key = (len(marks), last, config.any_interval if config else 0, state.dp_size, state.freshness())
        if key != self._key:
            self._key = key
            self._state = state
            self._strips = []
            self.refresh_content()

    def on_resize(self) -> None:
        self._strips = []

    def on_click(self, event: events.Click) -> None:
        """A click on a round's column asks the app to show that round."""
        state = self._state
        columns = max(self.size.width - _LABEL - 1, 0)
        if state is None or not columns or event.x < _LABEL + 1:
            return
        marks = state.marks[-columns:]
        index = event.x - (_LABEL + 1) - (columns - len(marks))
        if 0 <= index < len(marks):
            self.post_message(self.RoundClicked(marks[index].round))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._strips = []

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if not self._strips:
            self._strips = self._build(width)
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, self._style("base"))

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self.rich_style
            if name != "base":
                style = style + self.get_component_rich_style(f"timeline--{name}")
            self._styles[name] = style
        return style

    def _build(self, width: int) -> list[Strip]:
        state = self._state
        columns = max(width - _LABEL - 1, 0)
        marks = state.marks[-columns:] if state is not None and columns else ()
        if marks:
            title = f" window timeline · rounds {marks[0].round:,}-{marks[-1].round:,} · {LEGEND}"
        else:
            title = " window timeline · no rounds yet"
        frozen = state.freshness() if state is not None else ""
        if frozen:
            badge = f" {frozen} "
            title = title[: max(width - len(badge), 0)].ljust(max(width - len(badge), 0))
            strips = [Strip([Segment(title, self._style("title")), Segment(badge[:width], self._style("frozen"))],
                            width)]
        else:
            strips = [Strip([Segment(title[:width].ljust(width), self._style("title"))], width)]
        dp_size = state.dp_size if state is not None else 0
        any_interval = state.config.any_interval if state is not None and state.config is not None else 0
        counter_top = max([mark.counter for mark in marks] + [any_interval])
        rows = [
            ("   points", point_glyph),
            ("   extend", lambda mark: (level(mark.ranks_extending, dp_size), "extend")),
            ("  counter", lambda mark: (level(mark.counter + 1, counter_top + 1), "counter")),
        ]
        for index, (name, glyph_of) in enumerate(rows):
            # Runs of one style become one segment: a line is a handful of segments, not one per round.
            pad = " " * (columns - len(marks))  # right-aligned: the newest round sits at the right edge
            runs: list[tuple[str, list[str]]] = [("label", [f"{name:<{_LABEL}} "]), ("base", [pad])]
            for mark in marks:
                glyph, style_name = glyph_of(mark)
                if index == 0 and mark.gap_before:
                    glyph, style_name = GAP, "gap"
                if runs[-1][0] == style_name:
                    runs[-1][1].append(glyph)
                else:
                    runs.append((style_name, [glyph]))
            segments = [Segment("".join(glyphs), self._style(style_name)) for style_name, glyphs in runs]
            strips.append(Strip(segments).adjust_cell_length(width, self._style("base")))
        return strips
