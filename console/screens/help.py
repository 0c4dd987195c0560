"""The help screen: every key (from the bindings themselves) and what the columns and glyphs mean."""

from __future__ import annotations

import io
from collections.abc import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from console.state import WATERMARK
from console.widgets.timeline import LEGEND

GLOSSARY = (
    ("want", "the rank's probe wants prefill (P1): a resident chunk waits, or a new prompt waits and the pool "
             f"is at most {WATERMARK} full"),
    ("dec", "the rank has decode work (P2)"),
    ("pre", "the rank planned prefill this round (▶)"),
    ("batch / run", "requests in this round's batch / running on the rank"),
    ("tokens / ext", "tokens in the round's forward / prompts extended this round"),
    ("occupancy", f"Device KV pool in use or reserved; ┃ marks the {WATERMARK} watermark, red above it"),
    ("chunks", "resident chunks: prompts whose prefill started and still have chunks to extend"),
    ("wait / reads", "new prompts waiting (storage reads included) / storage reads in flight"),
    ("retr", "requests retracted and waiting to be readmitted"),
    ("blocks ALL", "want=false and dec=true: this rank keeps the ALL point shut for the whole group (P4); red "
                   "while another rank wants prefill (the block then delays its prompts), muted otherwise"),
    ("ANY point", "counter != 0 and counter % K == 0: opens if any rank wants prefill"),
    ("ALL point", "counter % A == 0: opens if every rank wants prefill or has no decode work"),
    ("counter", "rounds since the last prefill round; resets when a rank extends or every rank is idle"),
    ("timeline", LEGEND + "; extend: ranks extending; counter: sparkline"),
)


def key_table(bindings: Iterable[tuple[str, BindingType]]) -> Table:
    """Keys and descriptions, one row per binding with a description."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_column(style="dim")
    seen = set()
    for where, binding in bindings:
        if not isinstance(binding, Binding) or not binding.description:
            continue
        keys = ", ".join(key.strip() for key in binding.key.split(","))
        if (keys, binding.description) in seen:
            continue
        seen.add((keys, binding.description))
        table.add_row(keys.replace("question_mark", "?"), binding.tooltip or binding.description, where)
    return table


def glossary_table() -> Table:
    """What the words and glyphs on screen mean."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for word, meaning in GLOSSARY:
        table.add_row(word, meaning)
    return table


class HelpScreen(ModalScreen[None]):
    """Keys and glossary; any of escape, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%;
        max-width: 110;
        height: 90%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    HelpScreen .section { text-style: bold; color: $accent; margin-top: 1; }
    """

    BINDINGS = [
        Binding("escape", "dismiss", "Close help"),
        Binding("q", "dismiss", "Close help", show=False),
        Binding("question_mark", "dismiss", "Close help", show=False),
    ]

    def __init__(self, bindings: Iterable[tuple[str, BindingType]]) -> None:
        super().__init__()
        self.bindings = list(bindings)

    def plain_text(self, width: int = 100) -> str:
        """The help's keys and glossary as plain text (what the screen shows, for tests and docs)."""
        console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
        console.print(key_table(self.bindings))
        console.print(glossary_table())
        return console.export_text()

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("prefill-gate console: help"), classes="section")
            yield Static("Keys (ctrl+p opens the command palette with every action)", classes="section")
            yield Static(key_table(self.bindings))
            yield Static("What you see", classes="section")
            yield Static(glossary_table())
