"""A one-line question at the bottom of the screen (the filter after `/`, the round after `g`).

The answer is checked by the caller's `check`, which returns an error message or "" (accepted): a bad
answer is explained under the field and nothing changes; escape leaves everything as it was.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from console.screens.early_keys import EarlyKeys


class Prompt(EarlyKeys, ModalScreen[str | None]):
    """Dismisses with the accepted text, or None on escape."""

    DEFAULT_CSS = """
    Prompt { align: left bottom; background: $background 30%; }
    Prompt > Vertical { height: auto; background: $panel; border-top: hkey $accent; padding: 0 1; }
    Prompt #hint { color: $text-muted; }
    Prompt #error { color: $error; text-style: bold; height: auto; }
    Prompt Input { border: none; height: 1; padding: 0; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, hint: str, check: Callable[[str], str], value: str = "") -> None:
        super().__init__()
        self.title = title
        self.hint = hint
        self.check = check
        self.value = value
        self.error = ""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"{self.title} · {self.hint} · enter: apply · esc: cancel", id="hint")
            yield Input(self.value, id="answer", select_on_focus=False)
            yield Static("", id="error")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.error = self.check(event.value)
        self.query_one("#error", Static).update(self.error)
        if not self.error:
            self.dismiss(event.value)

    def action_cancel(self) -> None:
        """Leave everything as it was."""
        self.dismiss(None)
