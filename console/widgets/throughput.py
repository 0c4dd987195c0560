"""Throughput and latency: the run's figures from GetSnapshot, and what the timeline's rounds add up to."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from console.state import ConsoleState
from console.textfit import fit_lines, keep_fitting
from console.widgets.base import ConsoleWidget
from prefill_gate.v1 import types_pb2 as pb

_WIDE = 60  # below this width the panel is a side column: one figure per line


def ms(seconds: float) -> str:
    """A duration for a human: milliseconds below a second, seconds above."""
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def latency(seconds: float) -> str:
    """A latency percentile; the server sends 0 until the first sample, and no real latency is 0."""
    return ms(seconds) if seconds > 0 else "-"


def share(value: float | None) -> str:
    """A share as a percentage, `-` when unknown."""
    return f"{value:.0%}" if value is not None else "-"


def figure(value: float | None, fmt: str = "{:.1f}") -> str:
    """A number, `-` when unknown."""
    return fmt.format(value) if value is not None else "-"


class ThroughputPanel(ConsoleWidget):
    """Output tokens/s, TTFT, gate wait, extend share and ranks per window."""

    COMPONENT_PREFIX = "throughput"

    COMPONENT_CLASSES = {
        "throughput--title", "throughput--label", "throughput--value", "throughput--note", "throughput--stale",
    }

    DEFAULT_CSS = """
    ThroughputPanel {
        height: auto;
        min-height: 3;
        padding: 0 1;
        background: $surface;
    }
    ThroughputPanel > .throughput--title { color: $text-muted; text-style: bold; }
    ThroughputPanel > .throughput--label { color: $text-muted; }
    ThroughputPanel > .throughput--value { color: $text; text-style: bold; }
    ThroughputPanel > .throughput--note { color: $text-disabled; text-style: italic; }
    ThroughputPanel > .throughput--stale { color: $warning; text-style: bold; }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._state: ConsoleState | None = None
        self._key: tuple = ()

    def show(self, state: ConsoleState) -> None:
        """Redraw when a figure shown changed."""
        stats = state.stats
        key = (stats.SerializeToString() if stats is not None else b"", state.figures, state.live, state.freshness(),
               state.record is not None and state.record.round)
        if key != self._key:
            self._key = key
            self._state = state
            self.refresh_content()

    def _style(self, name: str) -> Style:
        return self.component_style(name)

    def render(self) -> Text:
        state = self._state
        if state is None:
            return Text("")
        if self.size.width >= _WIDE:
            text = self._inline(state)
        else:
            text = self._column(self.run_pairs(state.stats), self.window_pairs(state), state)
        return fit_lines(text, self.content_region.width)

    @staticmethod
    def run_pairs(stats: pb.RunStats | None) -> list[tuple[str, str]]:
        """The run's figures as (label, value), or none when no snapshot is there."""
        if stats is None:
            return []
        wait = f"{ms(stats.gate_wait_p99_seconds)} ({stats.gate_wait_p99_rounds:.0f} rounds)"
        return [
            ("output tokens/s", f"{stats.output_tokens_per_second:,.0f}"),
            ("TTFT p50 / p99", f"{latency(stats.ttft_p50_seconds)} / {latency(stats.ttft_p99_seconds)}"),
            ("gate wait p99", wait),
            ("extend path", f"{share(stats.extend_round_share)} of rounds"),
            ("ranks extending/window", f"{stats.ranks_extending_per_window:.2f}"),
            ("requests done", f"{stats.requests_finished:,} / {stats.requests_submitted:,}"),
        ]

    @staticmethod
    def window_pairs(state: ConsoleState) -> list[tuple[str, str]]:
        """What the timeline's rounds add up to, as (label, value)."""
        f = state.figures
        return [
            ("extend path", f"{share(f.extend_share)} of rounds"),
            ("ranks extending/window", figure(f.ranks_per_window, "{:.2f}")),
            ("ANY opened / shut", f"{f.any_open} / {f.any_shut}"),
            ("ALL opened / shut", f"{f.all_open} / {f.all_shut}"),
        ]

    def _column(self, pairs: list[tuple[str, str]], window: list[tuple[str, str]], state: ConsoleState) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        label_width = max(len(label) for label, _ in pairs + window)
        text.append("throughput and latency (run)", style=self._style("title"))
        frozen = state.freshness()
        if frozen and state.live:
            text.append(f" · {frozen}", style=self._style("stale"))
        text.append("\n")
        if pairs:
            for label, value in pairs:
                text.append(f"{label:<{label_width}} ", style=self._style("label"))
                text.append(f"{value}\n", style=self._style("value"))
        else:
            text.append(self._missing(state, "\n") + "\n", style=self._style("note"))
        upto = f" to round {state.record.round:,}" if state.record is not None else ""
        text.append(f"\nlast {state.figures.rounds} rounds{upto}\n", style=self._style("title"))
        for label, value in window:
            text.append(f"{label:<{label_width}} ", style=self._style("label"))
            text.append(f"{value}\n", style=self._style("value"))
        text.rstrip()
        return text

    def _inline(self, state: ConsoleState) -> Text:
        """Three dense lines for a panel as wide as the screen (narrow terminals): the items that do not fit
        are left out whole, least important first, never cut."""
        stats = state.stats
        f = state.figures
        width = self.content_region.width - 9  # after the row titles
        # (label, value, keep): a higher keep stays longer on a narrow terminal
        rows: list[tuple[str, list[tuple[str, str, int]] | None]] = [("run", None), ("", [])]
        if stats is not None:
            rows = [
                ("run", [
                    ("out", f"{stats.output_tokens_per_second:,.0f} tok/s", 6),
                    ("TTFT p50/p99", f"{latency(stats.ttft_p50_seconds)} / {latency(stats.ttft_p99_seconds)}", 5),
                ]),
                ("", [
                    ("gate wait p99", f"{ms(stats.gate_wait_p99_seconds)} / {stats.gate_wait_p99_rounds:.0f} rounds",
                     7),
                    ("extend path", share(stats.extend_round_share), 4),
                    ("ranks/window", f"{stats.ranks_extending_per_window:.2f}", 3),
                    ("done", f"{stats.requests_finished:,}/{stats.requests_submitted:,}", 2),
                ]),
            ]
        rows.append((f"last {f.rounds}", [
            ("extend path", share(f.extend_share), 5),
            ("ranks/window", figure(f.ranks_per_window, "{:.2f}"), 4),
            ("ANY", f"▲{f.any_open} △{f.any_shut}", 3),
            ("ALL", f"■{f.all_open} □{f.all_shut}", 3),
        ]))
        text = Text()
        frozen = state.freshness()
        if frozen and state.live and stats is not None:
            first = rows[0][1] or []
            rows[0] = (rows[0][0], [("", frozen, 9), *first])
        for number, (title, items) in enumerate(rows):
            if number:
                text.append("\n")
            text.append(f"{title:<9}", style=self._style("title"))
            if items is None:
                text.append(self._missing(state), style=self._style("note"))
                continue
            lengths = [(keep, len(label) + 1 + len(value) if label else len(value)) for label, value, keep in items]
            for index, position in enumerate(keep_fitting(lengths, width, 3)):
                label, value, _ = items[position]
                if index:
                    text.append(" · ")
                if not label:  # the not-live word leads the run's figures
                    text.append(value, style=self._style("stale"))
                    continue
                text.append(f"{label} ", style=self._style("label"))
                text.append(value, style=self._style("value"))
        return text

    @staticmethod
    def _missing(state: ConsoleState, separator: str = ": ") -> str:
        if not state.live:
            return separator.join(("a recording holds rounds only", "request figures need a live server"))
        return "waiting for the first snapshot"
