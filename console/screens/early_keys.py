"""Keys typed while a dialog is still being shown must not be lost.

On a loaded machine a dialog's first field gets focus a moment after the dialog is pushed; keys typed
in between reach the dialog with nothing focused and would be dropped (an operator typing `e 1 6`
fast lost the digits). The dialog keeps them and hands them to its first field once it is shown.
"""

from __future__ import annotations

from textual import events
from textual.screen import Screen
from textual.widgets import Input


class EarlyKeys:
    """Mixin for a Screen with a first `Input`: printable keys and enter typed before any widget has
    focus go to that field, in order (enter submits it)."""

    FIRST_FIELD = "Input"

    def on_key(self, event: events.Key) -> None:
        screen: Screen = self  # type: ignore[assignment]
        if screen.focused is not None or not (event.is_printable or event.key == "enter"):
            return
        event.stop()
        held: list[events.Key] = screen.__dict__.setdefault("_early_keys", [])
        held.append(event)
        if len(held) == 1:
            screen.call_after_refresh(self._hand_over_early_keys)

    def _hand_over_early_keys(self) -> None:
        screen: Screen = self  # type: ignore[assignment]
        held: list[events.Key] = screen.__dict__.pop("_early_keys", [])
        field = screen.query(self.FIRST_FIELD).first(Input)
        field.focus()
        for key in held:
            if key.key == "enter":
                field.post_message(Input.Submitted(field, field.value))
            elif key.character:
                field.insert_text_at_cursor(key.character)
