"""Fitting Rich text into a widget: one line per line, cut with an ellipsis, never wrapped."""

from __future__ import annotations

from rich.text import Text


def fit_lines(text: Text, width: int) -> Text:
    """`text` with every line cut to `width` cells (a wrapped line would push the layout around)."""
    lines = text.split("\n")
    for line in lines:
        line.truncate(max(width, 1), overflow="ellipsis")
    return Text("\n").join(lines)
