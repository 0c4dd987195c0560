"""The header: which run, how far, how fast, under which config, and how fresh the data is."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from console.state import Connection, ConsoleState, Link
from console.textfit import fit_lines

_LINK_STYLE = {
    Link.CONNECTING: ("◌ connecting", "warn"),
    Link.LIVE: ("● live", "good"),
    Link.STALE: ("◌ stale", "warn"),
    Link.RECONNECTING: ("↻ reconnecting", "bad"),
    Link.FAILED: ("✖ failed", "bad"),
    Link.REPLAY: ("▶ replay", "accent"),
    Link.ENDED: ("■ replay ended", "accent"),
}


def link_label(connection: Connection) -> str:
    """The link state in a few words: `live`, `stale for 4 s`, `reconnecting in 1.5 s`."""
    label = _LINK_STYLE[connection.link][0]
    if connection.link is Link.STALE:
        return f"{label} for {connection.stale_s:.0f} s"
    if connection.link is Link.RECONNECTING and connection.retry_in_s is not None:
        return f"{label} in {connection.retry_in_s:.0f} s" if connection.retry_in_s >= 1 else f"{label} now"
    return label


def config_label(state: ConsoleState) -> str:
    """The gate configuration in force, e.g. `gate ALL A=4 · ANY K=12 · epoch 2`."""
    config = state.config
    if config is None:
        return "gate config unknown"
    if not config.enabled:
        policy = f" ({config.policy})" if config.policy and config.policy != "gate" else ""
        return f"gate OFF{policy} · epoch {config.epoch}"
    return f"gate ON · ALL A={config.attempt_interval} · ANY K={config.any_interval} · epoch {config.epoch}"


class StatusHeader(Widget):
    """Three lines: run and progress; config, drops and view position; link detail or the latest notice."""

    COMPONENT_CLASSES = {
        "status-header--good",
        "status-header--warn",
        "status-header--bad",
        "status-header--accent",
        "status-header--dim",
    }

    DEFAULT_CSS = """
    StatusHeader {
        height: 3;
        background: $panel;
        color: $text;
        padding: 0 1;
    }
    StatusHeader > .status-header--good { color: $success; text-style: bold; }
    StatusHeader > .status-header--warn { color: $warning; text-style: bold; }
    StatusHeader > .status-header--bad { color: $error; text-style: bold; }
    StatusHeader > .status-header--accent { color: $accent; text-style: bold; }
    StatusHeader > .status-header--dim { color: $text-muted; }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._text = Text("")
        self._key: tuple = ()

    def show(self, state: ConsoleState) -> None:
        """Redraw when anything shown changed."""
        text = self.compose_text(state)
        key = (text.plain, tuple(text.spans))
        if key != self._key:
            self._key = key
            self._text = text
            self.refresh()

    def render(self) -> Text:
        return self._text

    def compose_text(self, state: ConsoleState) -> Text:
        """The header's text for `state`."""

        def style(name: str) -> Style:
            return self.get_component_rich_style(f"status-header--{name}", partial=True)

        text = Text()
        record = state.record
        text.append(link_label(state.connection), style=style(_LINK_STYLE[state.connection.link][1]))
        if state.server_state and state.server_state != "serving":
            text.append(f" [{state.server_state}]", style=style("warn"))
        text.append(" │ ")
        text.append(f"round {record.round:,}" if record is not None else "no rounds yet", style="bold")
        rate = f"{state.rounds_per_s:,.0f} rounds/s" if state.rounds_per_s is not None else "- rounds/s"
        text.append(f" │ {rate} │ {state.dp_size or '-'} ranks │ run {state.run_id or '-'} │ ")
        text.append(state.source, style=style("dim"))
        text.append("\n")
        text.append(config_label(state))
        text.append(" │ ")
        text.append(f"dropped {state.dropped:,}", style=style("bad") if state.dropped else "")
        text.append(" │ ")
        if state.paused and record is not None:
            where = f"⏸ PAUSED at round {record.round:,}"
            if state.behind:
                where += f" ({state.behind:,} behind)"
            text.append(where, style=style("warn"))
        else:
            text.append("following the newest", style=style("dim"))
        text.append("\n")
        if state.notice:
            text.append(state.notice, style=style("warn"))
        elif state.connection.detail:
            bad = state.connection.link in (Link.RECONNECTING, Link.FAILED, Link.STALE)
            text.append(state.connection.detail, style=style("bad") if bad else style("dim"))
        return fit_lines(text, self.content_region.width if self.is_mounted else 10_000)
