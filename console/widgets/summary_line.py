"""The summary line above the grid: the shown round's counts in one greppable form, and how the ranks are listed.

    ranks 64 · want 45/64 · blocks ALL 19 · >0.9 1 · extending 0 │ sort occupancy ↓ │ filter blocks: 19 of 64

When the view is not live (stale, disconnected, paused, a replay, ended) the line says so in a badge.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from console.selection import SORT_TITLES
from console.state import ConsoleState
from console.textfit import Part, fit_parts
from console.widgets.base import ConsoleWidget


class SummaryLine(ConsoleWidget):
    """Counts of the round shown, the sort and filter in force, and a not-live badge."""

    COMPONENT_PREFIX = "summary-line"

    COMPONENT_CLASSES = {"summary-line--badge", "summary-line--dim", "summary-line--bad", "summary-line--count"}

    DEFAULT_CSS = """
    SummaryLine {
        height: 1;
        padding: 0 1;
        background: $boost;
    }
    SummaryLine > .summary-line--count { text-style: bold; }
    SummaryLine > .summary-line--badge { color: $text; background: $warning 60%; text-style: bold; }
    SummaryLine > .summary-line--bad { color: $error; text-style: bold; }
    SummaryLine > .summary-line--dim { color: $text-muted; }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._text = Text("")
        self._key: tuple = ()

    def show(self, state: ConsoleState, in_view: tuple[int, int] | None = None) -> None:
        """Redraw when the line changed. `in_view`: the first and last grid rows on screen (1-based), when
        some rows are out of view."""
        text = self.compose_text(state, in_view)
        key = (text.plain, tuple(text.spans))
        if key != self._key:
            self._key, self._text = key, text
            self.refresh_content()

    def render(self) -> Text:
        return self._text

    def _style(self, name: str) -> Style:
        return self.component_style(name)

    def compose_text(self, state: ConsoleState, in_view: tuple[int, int] | None = None) -> Text:
        """The line for `state`."""
        parts = [Part(state.summary.line(), self._style("count"), 9)]
        if in_view is not None:
            first, last = in_view
            more = "↓" if last < len(state.views) else ""
            more = ("↑" if first > 1 else "") + more
            parts.append(Part(f"{first}-{last}/{len(state.views)}{more}", self._style("bad"), 7))
        badge = state.freshness()
        if badge:
            parts.append(Part(f" {badge} ", self._style("badge"), 8))
        if state.alert_count:
            parts.append(Part(f"⚠ {state.alert_count}", self._style("bad"), 7))
        if state.sort_key != "rank" or state.sort_reverse:
            title = SORT_TITLES[state.sort_key] + (" (reversed)" if state.sort_reverse else "")
            parts.append(Part(f"sort {title}", self._style("dim"), 5))
        if state.rank_filter.active:
            parts.append(Part(f"filter {state.rank_filter.text}: {len(state.views)} of {state.summary.ranks}",
                              self._style("bad") if not state.views else "", 6))
        width = self.content_region.width if self.is_mounted else 10_000
        return fit_parts(parts, width, separator_style=self._style("dim"))
