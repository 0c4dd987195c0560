"""The interval editor: two fields, validated by the server, violations shown next to each field.

The console does not validate beyond "is it a whole number" (said as soon as a letter is typed): the
server applies the same rules as a launch (C2, C3), and its `BadRequest` names the field each message
belongs to; the console words it with the fields' labels, and a message about both fields is shown
once. Enter asks first (showing what changes), enter again applies. A change is sent with the epoch the
user was looking at, so a change someone else made meanwhile is reported instead of overwritten; the
"in force" line follows the engine while the editor is open. Keys typed before the first field has
focus (a loaded machine) go to it rather than nowhere.
"""

from __future__ import annotations

import contextlib

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from console.admin import AdminClient, AdminError, Applied
from console.screens.early_keys import EarlyKeys
from control.plane.auth import TOKEN_ENV
from engine.config import ANY_FLAG, ATTEMPT_FLAG
from prefill_gate.v1 import types_pb2 as pb

FIELDS = {"attempt_interval": "attempt", "any_interval": "any"}
LABELS = {"attempt_interval": "ALL interval A", "any_interval": "ANY interval K"}
# The server words its messages for the command line; the editor shows the fields' own labels.
_WORDING = (
    (ANY_FLAG, LABELS["any_interval"]),
    (ATTEMPT_FLAG, LABELS["attempt_interval"]),
    ("required unless disable is true", "required: give both intervals (or disable the gate with d)"),
    ("any_interval", LABELS["any_interval"]),
    ("attempt_interval", LABELS["attempt_interval"]),
)


def in_labels(text: str) -> str:
    """A server message with flag and field names replaced by the editor's labels."""
    for word, label in _WORDING:
        text = text.replace(word, label)
    return text


def check_whole(label: str, text: str) -> str:
    """An error for a field that is not a whole number ("" when it is, or empty)."""
    text = text.strip()
    if not text or text.lstrip("-").isdigit():
        return ""
    return f"✖ {label} takes a whole number; {text!r} is not one"


def parse_field(text: str) -> int | None:
    """An integer, or None for an empty field (the server says whether that is allowed)."""
    text = text.strip()
    return int(text) if text else None


def describe_config(config: pb.GateConfig) -> str:
    """`epoch 3 · ALL A=4 · ANY K=12`, or that the gate is off."""
    if not config.enabled:
        return f"epoch {config.epoch} · gate off"
    return f"epoch {config.epoch} · ALL A={config.attempt_interval} · ANY K={config.any_interval}"


class IntervalEditor(EarlyKeys, ModalScreen[None]):
    """Edit the ALL and ANY intervals of the running engine."""

    FIRST_FIELD = "#attempt"

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

    def __init__(
        self, admin: AdminClient, config: pb.GateConfig | None, last_enabled: pb.GateConfig | None = None
    ) -> None:
        super().__init__()
        self.admin = admin
        self.config = config  # the config the user is editing (its epoch is sent as the expected one)
        self.in_force = config  # the engine's config now (follows the stream while the editor is open)
        # Re-enabling starts from the intervals last in force, not from empty fields.
        self.start = config if config is not None and config.enabled else last_enabled
        self.applied: Applied | None = None
        self.status_text = ""
        self.shown_violations: dict[str, str] = {}  # proto field -> the text next to it
        self.pending: tuple[int | None, int | None] | None = None  # asked, waiting for the second enter

    def compose(self) -> ComposeResult:
        config = self.start
        with Vertical():
            yield Static("Gate intervals", id="title")
            yield Static("The server validates them as at launch; every rank adopts them on the same round.",
                         id="about")
            yield Static(self._in_force_text(), id="in-force")
            with Grid():
                yield Label("ALL interval A")
                yield Input(
                    str(config.attempt_interval) if config and config.enabled else "",
                    id="attempt",
                    placeholder="A",
                )
                yield Static("", id="attempt-error", classes="violation")
                yield Label("ANY interval K")
                yield Input(
                    str(config.any_interval) if config and config.enabled else "",
                    id="any",
                    placeholder="K",
                )
                yield Static("", id="any-error", classes="violation")
            yield Static(self._opening_status(), id="status")
            with Horizontal():
                yield Button("Apply", id="apply", variant="primary")
                yield Button("Close", id="close")

    def _opening_status(self) -> str:
        lines = []
        if self.config is not None and not self.config.enabled and self.start is not None:
            last = describe_config(self.start)
            lines.append(f"the gate is off; the fields hold the intervals last in force ({last})")
        if self.admin.endpoint.token is None:
            lines.append(f"no admin token: a server started with --admin-token will refuse changes (start the "
                         f"console with --token or ${TOKEN_ENV})")
        lines.append("enter: review the change, enter again: apply · escape closes")
        return "\n".join(lines)

    def _in_force_text(self) -> str:
        if self.in_force is None:
            return "in force: unknown (no config seen yet)"
        text = f"in force: {describe_config(self.in_force)}"
        if self.config is not None and self.in_force.epoch != self.config.epoch and self.applied is None:
            text += f" (changed while you edit: you opened epoch {self.config.epoch})"
        return text

    def show_in_force(self, config: pb.GateConfig | None) -> None:
        """The engine's config now (the app calls this every tick while the editor is open)."""
        if config is None or (self.in_force is not None and config.SerializeToString() ==
                              self.in_force.SerializeToString()):
            return
        if self.in_force is not None and config.epoch < self.in_force.epoch:
            return  # the stream is behind what the server just answered (a refusal fetches the config)
        self.in_force = config
        with contextlib.suppress(NoMatches):  # not composed yet, or being dismissed
            self.query_one("#in-force", Static).update(self._in_force_text())

    def on_mount(self) -> None:
        self.query_one("#attempt", Input).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.pending = None  # an edit after the review: review again
        edited = [next(name for name, target in FIELDS.items() if target == event.input.id)]
        if self.status_text and not self.status_text.startswith("applying"):
            # What the status said (a review, a refusal, a result) was about the values before this edit.
            self._status(self._opening_status(), ok=None)
            edited = list(FIELDS)  # the server's messages go; each field's own check stays
        for field in edited:
            error = check_whole(LABELS[field], self.query_one(f"#{FIELDS[field]}", Input).value)
            self.query_one(f"#{FIELDS[field]}-error", Static).update(Text(error))
            if error:
                self.shown_violations[field] = error
            else:
                self.shown_violations.pop(field, None)

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
        """First time: say what would change. Second time (nothing edited between): send it."""
        values = {}
        for field, target in FIELDS.items():
            text = self.query_one(f"#{target}", Input).value
            error = check_whole(LABELS[field], text)
            if error:
                self._clear()
                self.shown_violations[field] = error
                self.query_one(f"#{target}-error", Static).update(Text(error))
                self._status(f"not applied: {error[2:]}", ok=False)
                self.query_one(f"#{target}", Input).focus()
                return
            values[field] = parse_field(text)
        attempt, any_ = values["attempt_interval"], values["any_interval"]
        if self.pending != (attempt, any_):
            self.pending = (attempt, any_)
            self._clear()
            now = describe_config(self.in_force) if self.in_force is not None else "unknown"
            self._status(f"apply ALL A={_shown(attempt)} · ANY K={_shown(any_)} to every rank? (in force: {now})\n"
                         "enter again (or ctrl+s): apply · edit a field or escape: not now", ok=None)
            return
        self.pending = None
        self._clear()
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
        self.config = self.in_force = applied.config
        self.query_one("#in-force", Static).update(self._in_force_text())
        self._status(
            f"applied: {describe_config(applied.config)} · every rank adopted it after round "
            f"{applied.adopted_round:,}",
            ok=True,
        )

    async def _refused(self, error: AdminError) -> None:
        placed = set()
        # In the editor's order (A, then K): a message about both is said once, under the last of them.
        texts = {field: in_labels("; ".join(error.violations[field])) for field in FIELDS if field in error.violations}
        shared = len(texts) > 1 and len(set(texts.values())) == 1  # one message about both fields
        for index, (field, text) in enumerate(texts.items()):
            if shared and index < len(texts) - 1:
                shown = f"✖ see {LABELS[list(texts)[-1]]}, below"  # said once, under the last field
            else:
                shown = "✖ " + text
            self.shown_violations[field] = shown
            self.query_one(f"#{FIELDS[field]}-error", Static).update(Text(shown))
            placed.add(field)
        others = [f"{LABELS.get(field, field)}: {in_labels('; '.join(m))}" for field, m in error.violations.items()
                  if field not in placed]
        if error.code == "FAILED_PRECONDITION":
            # Someone else changed the config since it was shown: show theirs, let the user decide again.
            with contextlib.suppress(AdminError):  # without it the user still sees the refusal
                self.config = self.in_force = await self.admin.get_config()
            self.query_one("#in-force", Static).update(self._in_force_text())
            self._status(f"not applied: {in_labels(error.message)}. The config in force is shown above; apply "
                         "again to replace it.", ok=False)
            return
        for field, target in FIELDS.items():
            if field in placed:  # straight back to the first field to fix
                self.query_one(f"#{target}", Input).focus()
                break
        if placed and not others:
            self._status("not applied: the server refused the values marked above", ok=False)
        else:
            detail = "; ".join(others) if others else in_labels(error.message)
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


def _shown(value: int | None) -> str:
    return "(empty)" if value is None else str(value)
