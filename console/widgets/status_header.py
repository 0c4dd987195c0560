"""The header: which run, how far, how fast, under which config, and how fresh the data is."""

from __future__ import annotations

from collections.abc import Callable

from rich.style import Style
from rich.text import Text

from console.alerts import last_change
from console.state import Connection, ConsoleState, Link
from console.textfit import Part, fit_parts
from console.widgets.base import ConsoleWidget

_LINK_STYLE = {
    Link.CONNECTING: ("◌ connecting", "warn"),
    Link.LIVE: ("● live", "good"),
    Link.STALE: ("◌ stale", "warn"),
    Link.RECONNECTING: ("↻ reconnecting", "bad"),
    Link.STOPPED: ("■ engine stopped", "bad"),
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


class StatusHeader(ConsoleWidget):
    """Three lines: run and progress; config, alerts, drops and view position; link detail or the latest notice."""

    COMPONENT_PREFIX = "status-header"

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
            self.refresh_content()

    def render(self) -> Text:
        return self._text

    def compose_text(self, state: ConsoleState) -> Text:
        """The header's text for `state`, every line fitted to the width (parts dropped, not cut)."""

        def style(name: str) -> Style:
            return self.component_style(name)

        width = self.content_region.width if self.is_mounted else 10_000
        lines = [fit_parts(line, width) for line in self.parts(state, style)]
        return Text("\n").join(lines)

    @staticmethod
    def parts(state: ConsoleState, style: Callable[[str], Style]) -> list[list[Part]]:
        """The three lines as parts with priorities (what stays when the terminal is narrow)."""
        record = state.record
        link = state.connection.link
        first = [Part(link_label(state.connection), style(_LINK_STYLE[link][1]), 9)]
        if state.server_state and state.server_state != "serving" and link is not Link.STOPPED:
            first.append(Part(state.server_state, style("warn"), 7))
        first.append(Part(f"round {record.round:,}" if record is not None else "no rounds yet", "bold", 9))
        if link in (Link.LIVE, Link.REPLAY, Link.ENDED) or record is None:
            rate = f"{state.rounds_per_s:,.0f} rounds/s" if state.rounds_per_s is not None else "- rounds/s"
            first.append(Part(rate, "", 5))
        elif state.age_s is not None:
            first.append(Part(f"last round received {_age(state.age_s)} ago", style("bad"), 8))
        first.append(Part(f"{state.dp_size or '-'} ranks", "", 4))
        first.append(Part(f"run {state.run_id or '-'}", "", 2))
        first.append(Part(state.source, style("dim"), 3))

        second = [Part(config_label(state), "", 9)]
        if state.alert_count:
            count = state.alert_count
            second.append(Part(f"⚠ {count} alert{'s' if count != 1 else ''} (a)", style("bad"), 7))
        change = last_change(state.config)
        if change:
            second.append(Part(f"changed by {change}", style("accent"), 1))
        second.append(Part(f"dropped {state.dropped:,}", style("bad") if state.dropped else "", 6))
        second.append(where_part(state, style))

        third = []
        if state.notice:
            third.append(Part(state.notice, style("warn"), 9))
        elif state.connection.detail:
            bad = link in (Link.RECONNECTING, Link.FAILED, Link.STALE, Link.STOPPED)
            third.append(Part(state.connection.detail, style("bad") if bad else style("dim"), 9))
        return [first, second, third]


def where_part(state: ConsoleState, style: Callable[[str], Style]) -> Part:
    """Which round the view shows and whether it moves: the part an operator must never misread."""
    record = state.record
    if state.paused and record is not None:
        where = f"⏸ PAUSED at round {record.round:,}"
        if state.behind:
            where += f" ({state.behind:,} behind)"
        return Part(where, style("warn"), 8)
    link = state.connection.link
    if link is Link.ENDED:
        return Part("■ end of the recording", style("accent"), 8)
    if link is Link.REPLAY:
        playing = state.position is None or state.position.playing
        return Part("▶ playing" if playing else "⏸ not playing", style("accent"), 8)
    if record is not None and link is not Link.LIVE:
        return Part("frozen on the last round received", style("bad"), 8)
    return Part("following the newest", style("dim"), 7)


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
