"""The alerts pane: every alert of the round shown, worst first (the header counts them, the grid marks
the ranks)."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

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

    def show(self, state: ConsoleState) -> None:
        """Take the alerts of the round shown."""
        lines = alert_lines(state.alerts)
        if lines != self._lines:
            self._lines, self._count = lines, state.alert_count
            self.refresh_content()

    def _style(self, name: str) -> Style:
        return self.component_style(name)

    def render(self) -> Text:
        text = Text()
        text.append(f"alerts ({self._count}) · a: all of them\n", style=self._style("title"))
        if not self._lines:
            text.append("none", style=self._style("none"))
        for index, (severity, line) in enumerate(self._lines):
            if index:
                text.append("\n")
            text.append(line, style=self._style(severity))
        return fit_lines(text, self.content_region.width)
