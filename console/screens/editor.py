"""The interval editor: two fields, validated by the server, violations shown next to each field.

The console does not validate beyond "is it an integer": the server applies the same rules as a launch
(C2, C3), and its `BadRequest` names the field each message belongs to. A change is sent with the epoch
the user was looking at, so a change someone else made meanwhile is reported instead of overwritten.
"""

from __future__ import annotations

import contextlib

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from console.admin import AdminClient, AdminError, Applied
from prefill_gate.v1 import types_pb2 as pb

FIELDS = {"attempt_interval": "attempt", "any_interval": "any"}


def parse_field(text: str) -> int | None:
    """An integer, or None for an empty field (the server says whether that is allowed)."""
    text = text.strip()
    return int(text) if text else None


def describe_config(config: pb.GateConfig) -> str:
    """`epoch 3 · ALL A=4 · ANY K=12`, or that the gate is off."""
    if not config.enabled:
        return f"epoch {config.epoch} · gate off"
    return f"epoch {config.epoch} · ALL A={config.attempt_interval} · ANY K={config.any_interval}"


class IntervalEditor(ModalScreen[None]):
    """Edit the ALL and ANY intervals of the running engine."""

    DEFAULT_CSS = """
    IntervalEditor { align: center middle; }
    IntervalEditor > Vertical {
        width: 100;
        max-width: 100%;
        height: auto;
        border: thick $accent;
        background: $surface;
        padding: 0 2;
    }
    IntervalEditor #title { text-style: bold; }
    IntervalEditor #about { color: $text-muted; }
    IntervalEditor #in-force { color: $text-muted; margin-bottom: 1; }
    IntervalEditor Grid {
        grid-size: 3;
        grid-columns: 18 12 1fr;
        grid-rows: auto;
        height: auto;
    }
    IntervalEditor Grid Label { padding: 1 0; }
    IntervalEditor .violation { color: $error; padding: 0 1; height: auto; min-height: 3; content-align: left middle; }
    IntervalEditor #status { margin: 1 0; height: auto; min-height: 1; }
    IntervalEditor #status.ok { color: $success; }
    IntervalEditor #status.bad { color: $error; }
    IntervalEditor Horizontal { height: auto; align-horizontal: right; margin-bottom: 1; }
    IntervalEditor Button { margin-left: 2; }
    """

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("ctrl+s", "apply", "Apply"),
    ]

    def __init__(self, admin: AdminClient, config: pb.GateConfig | None) -> None:
        super().__init__()
        self.admin = admin
        self.config = config
        self.applied: Applied | None = None
        self.status_text = ""
        self.shown_violations: dict[str, str] = {}  # proto field -> the text next to it

    def compose(self) -> ComposeResult:
        config = self.config
        with Vertical():
            yield Static("Gate intervals", id="title")
            yield Static("The server validates them as at launch; every rank adopts them on the same round.",
                         id="about")
            yield Static(self._in_force_text(), id="in-force")
            with Grid():
                yield Label("ALL interval A")
                yield Input(
                    str(config.attempt_interval) if config and config.enabled else "",
                    type="integer",
                    id="attempt",
                    placeholder="A",
                )
                yield Static("", id="attempt-error", classes="violation")
                yield Label("ANY interval K")
                yield Input(
                    str(config.any_interval) if config and config.enabled else "",
                    type="integer",
                    id="any",
                    placeholder="K",
                )
                yield Static("", id="any-error", classes="violation")
            yield Static("enter or ctrl+s applies · escape closes", id="status")
            with Horizontal():
                yield Button("Apply", id="apply", variant="primary")
                yield Button("Close", id="close")

    def _in_force_text(self) -> str:
        if self.config is None:
            return "in force: unknown (no config seen yet)"
        return f"in force: {describe_config(self.config)}"

    def on_mount(self) -> None:
        self.query_one("#attempt", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.dismiss(None)

    def action_close(self) -> None:
        """Leave the editor."""
        self.dismiss(None)

    def action_apply(self) -> None:
        """Send the two fields to the server."""
        self._clear()
        try:
            attempt = parse_field(self.query_one("#attempt", Input).value)
            any_ = parse_field(self.query_one("#any", Input).value)
        except ValueError:
            self._status("each field takes a whole number", ok=False)
            return
        self._status("applying… (answered once every rank adopted it)", ok=None)
        self._send(attempt, any_)

    @work(exclusive=True, exit_on_error=False, group="admin")
    async def _send(self, attempt: int | None, any_: int | None) -> None:
        expected = self.config.epoch if self.config is not None else None
        try:
            applied = await self.admin.update_intervals(attempt, any_, expected_epoch=expected)
        except AdminError as error:
            await self._refused(error)
            return
        self.applied = applied
        self.config = applied.config
        self.query_one("#in-force", Static).update(self._in_force_text())
        self._status(
            f"applied: {describe_config(applied.config)} · every rank adopted it after round "
            f"{applied.adopted_round:,}",
            ok=True,
        )

    async def _refused(self, error: AdminError) -> None:
        placed = set()
        for field, messages in error.violations.items():
            target = FIELDS.get(field)
            if target is not None:
                self.shown_violations[field] = "✖ " + "; ".join(messages)
                self.query_one(f"#{target}-error", Static).update(Text(self.shown_violations[field]))
                placed.add(field)
        others = [f"{field}: {'; '.join(m)}" for field, m in error.violations.items() if field not in placed]
        if error.code == "FAILED_PRECONDITION":
            # Someone else changed the config since it was shown: show theirs, let the user decide again.
            with contextlib.suppress(AdminError):  # without it the user still sees the refusal
                self.config = await self.admin.get_config()
            self.query_one("#in-force", Static).update(self._in_force_text())
            self._status(f"not applied: {error.message}. The config in force is shown above; apply again "
                         "to replace it.", ok=False)
            return
        for field, target in FIELDS.items():
            if field in placed:  # straight back to the first field to fix
                self.query_one(f"#{target}", Input).focus()
                break
        if placed and not others:
            self._status("not applied: the server refused the values marked above", ok=False)
        else:
            detail = "; ".join(others) if others else error.message
            self._status(f"not applied ({error.code}): {detail}", ok=False)

    def _clear(self) -> None:
        self.shown_violations.clear()
        for target in FIELDS.values():
            self.query_one(f"#{target}-error", Static).update("")

    def _status(self, text: str, *, ok: bool | None) -> None:
        self.status_text = text
        status = self.query_one("#status", Static)
        status.update(Text(text))
        status.set_class(ok is True, "ok")
        status.set_class(ok is False, "bad")
