"""Fitting Rich text into a widget: one line per line, never wrapped; parts dropped by priority, not cut."""

from __future__ import annotations

from dataclasses import dataclass

from rich.style import Style
from rich.text import Text


def fit_lines(text: Text, width: int) -> Text:
    """`text` with every line cut to `width` cells (a wrapped line would push the layout around)."""
    lines = text.split("\n")
    for line in lines:
        line.truncate(max(width, 1), overflow="ellipsis")
    return Text("\n").join(lines)


@dataclass(frozen=True, slots=True)
class Part:
    """A piece of a line: dropped whole when the line is too narrow, lowest `keep` first."""

    text: str
    style: Style | str = ""
    keep: int = 0  # higher stays longer; parts of equal keep go right to left


def fit_parts(parts: list[Part], width: int, separator: str = " │ ", separator_style: Style | str = "") -> Text:
    """The parts that fit in `width` cells, in order, joined by `separator`.

    Parts go lowest `keep` first (the rightmost of equal ones first) until the rest fits; only a line
    whose every remaining part is needed is cut, with an ellipsis.
    """
    given = [part for part in parts if part.text]
    kept = [given[index] for index in keep_fitting([(p.keep, len(p.text)) for p in given], width, len(separator))]
    text = Text(no_wrap=True, overflow="ellipsis")
    for index, part in enumerate(kept):
        if index:
            text.append(separator, style=separator_style)
        text.append(part.text, style=part.style)
    text.truncate(max(width, 1), overflow="ellipsis")
    return text


def keep_fitting(items: list[tuple[int, int]], width: int, separator: int) -> list[int]:
    """Indexes of the (keep, length) items that fit in `width` joined by `separator` cells: the lowest keep
    goes first (the rightmost of equals), and one item always stays."""
    kept = list(range(len(items)))

    def length() -> int:
        return sum(items[index][1] for index in kept) + separator * max(len(kept) - 1, 0)

    while len(kept) > 1 and length() > width:
        lowest = min(items[index][0] for index in kept)
        kept.remove(max(index for index in kept if items[index][0] == lowest))
    return kept
