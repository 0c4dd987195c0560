"""The replay's position line, as a video player has it: state, speed, `round 2,116 of 5,074`, a seek bar.

A click on the bar seeks there. Shown only while replaying a recording.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.message import Message
from textual.strip import Strip

from console.state import ConsoleState, Position
from console.widgets.base import ConsoleWidget

KEYS = "space play/pause · ←/→ step · g go to · +/- speed · click to seek"


def position_text(position: Position, round_: int | None) -> str:
    """`round 2,116 of 5,074`: the round shown and the last round of the file."""
    shown = f"{round_:,}" if round_ is not None else "-"
    return f"round {shown} of {position.last_round:,}"


def speed_text(speed: float) -> str:
    """`2x`, `0.25x`, or `max` (as fast as it reads)."""
    return f"{speed:g}x" if speed > 0 else "max"


class PlayerBar(ConsoleWidget):
    """Playing or paused, speed, position and a seek bar."""

    COMPONENT_CLASSES = {"player-bar--label", "player-bar--done", "player-bar--todo", "player-bar--head"}

    DEFAULT_CSS = """
    PlayerBar {
        height: 1;
        background: $panel;
        padding: 0 1;
    }
    PlayerBar > .player-bar--label { color: $accent; text-style: bold; }
    PlayerBar > .player-bar--done { color: $accent; }
    PlayerBar > .player-bar--todo { color: $text-disabled; }
    PlayerBar > .player-bar--head { color: $text; text-style: bold; }
    """

    class Seek(Message):
        """Seek to a fraction of the file (0..1)."""

        def __init__(self, fraction: float) -> None:
            super().__init__()
            self.fraction = fraction

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._position: Position | None = None
        self._round: int | None = None
        self._bar_at = (0, 0)  # x and width of the seek bar, for clicks
        self._key: tuple = ()

    def show(self, state: ConsoleState) -> None:
        """Take the replay's position."""
        round_ = state.record.round if state.record is not None else None
        key = (state.position, round_, state.paused)
        if key != self._key:
            self._key = key
            self._position, self._round = state.position, round_
            self.refresh_content()

    def _style(self, name: str) -> Style:
        return self.rich_style + self.get_component_rich_style(f"player-bar--{name}", partial=True)

    def render_line(self, y: int) -> Strip:
        width = self.content_region.width
        position = self._position
        if y or position is None or not position.total:
            return Strip.blank(width, self.rich_style)
        state = "▶ playing" if position.playing else "⏸ paused"
        head = f"{state} {speed_text(position.speed)} │ {position_text(position, self._round)} │ "
        tail = f" {(position.index + 1) / position.total:>4.0%} │ {KEYS}"
        room = width - len(head) - len(tail)
        if room < 10:
            tail = f" {(position.index + 1) / position.total:>4.0%}"
            room = width - len(head) - len(tail)
        room = max(room, 0)
        done = round(room * (position.index + 1) / position.total) if position.total else 0
        done = min(max(done, 1 if room else 0), room)
        self._bar_at = (len(head) + 1, room)  # +1: the left padding
        segments = [
            Segment(head, self._style("label")),
            Segment("━" * max(done - 1, 0), self._style("done")),
            Segment("●" if room else "", self._style("head")),
            Segment("─" * (room - done), self._style("todo")),
            Segment(tail, self._style("label")),
        ]
        return Strip(segments).adjust_cell_length(width, self.rich_style)

    def on_click(self, event: events.Click) -> None:
        """A click on the bar seeks to that point of the file."""
        start, room = self._bar_at
        if room and start <= event.x < start + room:
            self.post_message(self.Seek((event.x - start) / max(room - 1, 1)))
