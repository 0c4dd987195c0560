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

from console.selection import FILTER_HELP
from console.state import WATERMARK
from console.widgets.timeline import LEGEND

GLOSSARY = (
    ("summary line", "ranks · want N/ranks · blocks ALL · >0.9 · extending: counts of the round shown; then a badge "
                     "when the view is not live, the alert count, and the sort and filter in force"),
    ("1-11/64↓", "in the summary line when the grid cannot show every rank: the rows in view, of how many, and "
                 "that more are below (↓) or above (↑)"),
    ("want", "the rank's probe wants prefill (P1): a resident chunk waits, or a new prompt waits and the pool "
             f"is at most {WATERMARK} full"),
    ("dec", "the rank has decode work (P2)"),
    ("pre", "the rank planned prefill this round (▶)"),
    ("w d p", "want, dec and pre in a narrow terminal"),
    ("batch / run", "requests in this round's batch / running on the rank"),
    ("tokens / ext", "tokens in the round's forward / prompts extended this round"),
    ("since", "rounds since the rank last extended a prompt (0: this round; >N: not within the N rounds held)"),
    ("occupancy", f"Device KV pool in use or reserved; ┃ marks the {WATERMARK} watermark, red above it"),
    ("occ%", "the same occupancy as a percentage"),
    ("chunks / chunk", "resident chunks: prompts whose prefill started and still have chunks to extend"),
    ("wait / reads / read", "new prompts waiting (storage reads included) / storage reads in flight"),
    ("retr", "requests retracted and waiting to be readmitted"),
    ("blocks ALL, ⊘ALL", "the gate is on and the rank has decode work, wants no prefill and is not extending: it "
                         "keeps the ALL point shut for the whole group (P4). Red, with the rank number on red, "
                         "while another rank wants prefill (the block then delays its prompts), muted otherwise. "
                         "Never shown while the gate is off (there is no ALL point) nor on a rank extending"),
    (f">{WATERMARK}, !", f"occupancy above the {WATERMARK} watermark: the rank wants no new prompts"),
    ("⚠", "the rank has an alert (the alerts pane, or a for the whole list); its rank number is highlighted"),
    ("history", "the rank's last rounds, newest at the right: height = occupancy (m: or waiting prompts), colour "
                "= state: orange extending, red blocking a wanted ALL, green wants prefill, magenta above the "
                "watermark, blue decoding, grey idle"),
    ("heatmap", "h: ranks across, rounds down (newest at the top, two rounds per line, ▀ = the newer above the "
                "older), coloured as the history; m: state, occupancy or waiting prompts. Click a line: that round"),
    ("alerts", "a rank above the watermark or with waiting prompts growing for many rounds, gate wait p99 over "
               "its bound, records or spans dropped (engine, exporter, this console), and the last config change "
               "by the tuner with its reason (listed, not counted)"),
    ("ANY point", "counter != 0 and counter % K == 0: opens if any rank wants prefill"),
    ("ALL point", "counter % A == 0: opens if every rank wants prefill or has no decode work"),
    ("counter", "rounds since the last prefill round; resets when a rank extends or every rank is idle"),
    ("timeline", LEGEND + "; extend: ranks extending; counter: sparkline. Click a round to show it"),
    ("link", "● live · ◌ stale (no round for a second) · ↻ reconnecting · ■ engine stopped (the stream ended; "
             "watching for a restart) · ✖ failed · ▶ replay · ■ replay ended"),
    ("not live", "stale, disconnected, stopped, paused and replayed views say so on every part of the screen: a "
                 "badge in the summary line, the grid's title row and the timeline; the grid is dimmed and the "
                 "header gives the age of the last round received"),
    ("replay", "the position line: playing or paused, speed, round R of LAST, a seek bar (click it); space "
               "plays and pauses, ←/→ step, g goes to any round of the file, + and - change the speed"),
    ("sort / filter", "s: rank, occupancy, waiting prompts, blocking ALL first, rounds since extend (S reverses; "
                      "click a column title). /: " + FILTER_HELP + " (words combine: all must match)"),
)

DETAIL_GLOSSARY = (
    ("pt", "the round's attempt point: ▲/△ ANY opened/shut, ■/□ ALL opened/shut, · none"),
    ("prefill", "prompt tokens the rank extended this round"),
    ("pending", "prefill tokens waiting on the rank, capped at one round's budget"),
    ("retr Σ", "requests retracted on this rank since the run started"),
    ("fwd µs", "the rank's measured forward time of the previous round, in microseconds"),
    ("round ms", "a simulated run has no forward to time: the simulated round time, in milliseconds"),
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


def glossary_table(glossary: tuple[tuple[str, str], ...] = GLOSSARY) -> Table:
    """What the words and glyphs on screen mean."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for word, meaning in glossary:
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
        console.print(glossary_table(DETAIL_GLOSSARY))
        return console.export_text()

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("prefill-gate console: help"), classes="section")
            yield Static("Keys (ctrl+p opens the command palette with every action)", classes="section")
            yield Static(key_table(self.bindings))
            yield Static("What you see", classes="section")
            yield Static(glossary_table())
            yield Static("One rank's rows (enter)", classes="section")
            yield Static(glossary_table(DETAIL_GLOSSARY))
