"""The alerts pane: every alert of the round shown, worst first (the header counts them, the grid marks
the ranks)."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.geometry import Region

from console.alerts import Alert
from console.state import ConsoleState
from console.textfit import fit_lines
from console.widgets.base import ConsoleWidget

_ORDER = {"bad": 0, "warn": 1, "info": 2}
_MARK = {"bad": "✖", "warn": "⚠", "info": "•"}


def alert_lines(alerts: tuple[Alert, ...] | list[Alert]) -> list[tuple[str, str]]:
    """(severity, text) per alert, worst first, ranks in order."""
    ordered = sorted(alerts, key=lambda alert: (_ORDER[alert.severity], alert.rank if alert.rank is not None else -1))
    return [(alert.severity, f"{_MARK[alert.severity]} {alert.text}") for alert in ordered]


class AlertsPanel(ConsoleWidget):
    """The alerts, one per line (cut to the width; the alerts screen, `a`, wraps them whole)."""

    COMPONENT_PREFIX = "alerts-panel"

    COMPONENT_CLASSES = {"alerts-panel--title", "alerts-panel--bad", "alerts-panel--warn", "alerts-panel--info",
                         "alerts-panel--none"}

    DEFAULT_CSS = """
    AlertsPanel {
        height: 1fr;
        padding: 0 1;
        background: $surface;
    }
    AlertsPanel > .alerts-panel--title { color: $text-muted; text-style: bold; }
    AlertsPanel > .alerts-panel--bad { color: $error; text-style: bold; }
    AlertsPanel > .alerts-panel--warn { color: $warning; }
    AlertsPanel > .alerts-panel--info { color: $accent; }
    AlertsPanel > .alerts-panel--none { color: $text-disabled; text-style: italic; }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._lines: list[tuple[str, str]] = []
        self._count = 0
        self._drawn: list[tuple[str, str]] = []

    def show(self, state: ConsoleState) -> None:
        """Take the alerts of the round shown; repaint only the lines that changed (a 64-rank run raises
        many alerts whose round counts move every frame, most of them below the panel's last line)."""
        self._lines, self._count = alert_lines(state.alerts), state.alert_count
        drawn = self._drawn_lines()
        if drawn == self._drawn:
            return
        changed = [y for y in range(max(len(drawn), len(self._drawn)))
                   if y >= len(drawn) or y >= len(self._drawn) or drawn[y] != self._drawn[y]]
        self._drawn = drawn
        if len(changed) * 2 > self.content_region.height or not self.is_on_screen:
            self.refresh_content()
        else:
            width = self.content_region.width
            self.refresh(*(Region(0, y, width, 1) for y in changed))

    def _drawn_lines(self) -> list[tuple[str, str]]:
        """(style name, text) of each line the panel shows: the title, then the alerts that fit."""
        title = ("title", f"alerts ({self._count}) · a: all of them")
        if not self._lines:
            return [title, ("none", "none")]
        room = max(self.content_region.height - 1, 0) if self.is_mounted else len(self._lines)
        return [title, *self._lines[:room]]

    def _style(self, name: str) -> Style:
        return self.component_style(name)

    def render(self) -> Text:
        text = Text("\n").join(Text(line, style=self._style(name)) for name, line in self._drawn_lines())
        return fit_lines(text, self.content_region.width)
