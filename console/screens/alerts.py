"""Every alert in full, worst first (the side pane cuts them to its width)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from console.alerts import Bounds
from console.state import ConsoleState
from console.widgets.alerts_panel import alert_lines

_STYLE = {"bad": "bold red", "warn": "yellow", "info": "cyan"}


def bounds_text(bounds: Bounds) -> str:
    """When each kind of alert is raised (the flags that set it)."""
    return (
        f"raised for: a rank above the watermark for {bounds.above_rounds} rounds in a row (--alert-above-rounds); "
        f"a rank's waiting prompts growing by 3+ over {bounds.growing_rounds} rounds (--alert-growing-rounds); "
        f"the run's gate wait p99 over {bounds.gate_wait_p99_s:g} s (--alert-gate-wait-p99); round records or "
        "trace spans dropped anywhere, or the trace exporter failing; and, listed, the last config change made "
        "by someone other than the launch (the tuner)"
    )


class AlertsScreen(ModalScreen[None]):
    """The alerts of the round shown; escape, q or a closes."""

    DEFAULT_CSS = """
    AlertsScreen { align: center middle; }
    AlertsScreen > VerticalScroll {
        width: 90%;
        max-width: 120;
        height: 80%;
        border: thick $warning;
        background: $surface;
        padding: 0 1;
    }
    AlertsScreen #about { color: $text-muted; margin-bottom: 1; }
    """

    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
        Binding("a", "dismiss", "Close", show=False),
    ]

    def __init__(self, state: ConsoleState) -> None:
        super().__init__()
        self.state = state
        self.text = ""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("", id="title")
            yield Static(Text(bounds_text(self.app.store.bounds)), id="about")  # type: ignore[attr-defined]
            yield Static("", id="list")

    def on_mount(self) -> None:
        self.show(self.state)

    def show(self, state: ConsoleState) -> None:
        """The alerts of `state`."""
        self.state = state
        where = f"round {state.record.round:,}" if state.record is not None else "no rounds yet"
        freshness = state.freshness()
        title = f"alerts at {where}: {state.alert_count} counted" + (f" · {freshness}" if freshness else "")
        text = Text()
        for index, (severity, line) in enumerate(alert_lines(state.alerts)):
            if index:
                text.append("\n")
            text.append(line, style=_STYLE[severity])
        if not state.alerts:
            text.append("none", style="dim italic")
        if text.plain != self.text:
            self.text = text.plain
            self.query_one("#title", Static).update(Text(title, style="bold"))
            self.query_one("#list", Static).update(text)
