"""Which ranks the grid lists, in which order: sort keys (as htop's) and a filter typed after `/` (as k9s's).

A filter is words joined by spaces, every one of which a rank must match:

    blocks  want  extending  alert  idle      the rank's state in the round shown
    >0.9                                      above the watermark
    occ>0.5  occ<50%  wait>3  since>100       a column compared with a number
    12   8-15                                 a rank, or a range of ranks
    !blocks                                   not

A word the console cannot read is refused with a message naming it, and the filter in force stays.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from console.digest import WATERMARK
from prefill_gate.v1 import types_pb2 as pb

SORT_KEYS = ("rank", "occupancy", "waiting", "blocking", "since")
SORT_TITLES = {
    "rank": "rank",
    "occupancy": "occupancy ↓",
    "waiting": "waiting prompts ↓",
    "blocking": "blocking ALL first",
    "since": "rounds since extend ↓",
}


class RankView(NamedTuple):
    """One rank as the grid shows it: its row and what the console worked out about it (a named tuple:
    64 of them are built every tick)."""

    row: pb.RankRow
    position: int  # the row's index in the record
    blocks: bool  # blocks the ALL point (see console.digest)
    contested: bool  # ... while another rank wants prefill
    since: int | None  # rounds since it last extended; None: not within the rounds held
    alert: bool


class FilterError(ValueError):
    """A filter the console cannot read; the message names the word."""


Predicate = Callable[[RankView], bool]
_COMPARE = re.compile(r"^(occ|wait|since|batch|chunks|retr)(>=|<=|>|<|=)(\d+(?:\.\d+)?)(%?)$")
_OPS = {">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "=": operator.eq}
_WORDS: dict[str, Predicate] = {
    "blocks": lambda view: view.blocks,
    "want": lambda view: view.row.want_prefill,
    "extending": lambda view: view.row.num_extends > 0,
    "ext": lambda view: view.row.num_extends > 0,
    "alert": lambda view: view.alert,
    "idle": lambda view: view.row.batch_size == 0,
    "decode": lambda view: view.row.has_decode_work,
    f">{WATERMARK}": lambda view: view.row.occupancy > WATERMARK,
}
FILTER_HELP = "blocks · want · extending · alert · idle · >0.9 · occ>0.5 · wait>3 · since>100 · 12 · 8-15 · !word"


def _value(view: RankView, column: str) -> float:
    row = view.row
    if column == "occ":
        return row.occupancy
    if column == "wait":
        return row.waiting_prompts
    if column == "since":
        return float("inf") if view.since is None else view.since
    if column == "batch":
        return row.batch_size
    if column == "chunks":
        return row.resident_chunks
    return row.retracted


@dataclass(frozen=True, slots=True)
class RankFilter:
    """A parsed filter: its text and one predicate per word."""

    text: str = ""
    predicates: tuple[Predicate, ...] = ()

    def __call__(self, view: RankView) -> bool:
        return all(predicate(view) for predicate in self.predicates)

    @property
    def active(self) -> bool:
        """Anything to filter."""
        return bool(self.predicates)


def parse_filter(text: str) -> RankFilter:
    """The filter typed after `/`; raises FilterError naming the first word it cannot read."""
    predicates = [_word(word) for word in text.split()]
    return RankFilter(" ".join(text.split()), tuple(predicates))


def _word(word: str) -> Predicate:
    if word.startswith("!") and len(word) > 1:
        inner = _word(word[1:])
        return lambda view: not inner(view)
    lowered = word.lower()
    if lowered in _WORDS:
        return _WORDS[lowered]
    if re.fullmatch(r"[0-9]+", lowered):  # ASCII digits: str.isdigit() also takes '²', which int() refuses
        rank = int(lowered)
        return lambda view: view.row.rank == rank
    if re.fullmatch(r"[0-9]+-[0-9]+", lowered):
        low, high = (int(part) for part in lowered.split("-"))
        if low > high:
            raise FilterError(f"{word!r}: a rank range goes low-high, e.g. {high}-{low}")
        return lambda view: low <= view.row.rank <= high
    match = _COMPARE.match(lowered)
    if match is not None:
        column, op, number, percent = match.groups()
        bound = float(number) / 100 if percent else float(number)
        if column == "occ" and not percent and bound > 1:
            raise FilterError(f"{word!r}: occupancy is 0..1 (or a percentage, e.g. occ>{number}%)")
        compare = _OPS[op]
        return lambda view: compare(_value(view, column), bound)
    raise FilterError(f"{word!r} is not a filter word; try: {FILTER_HELP}")


def sort_views(views: list[RankView], key: str, reverse: bool = False) -> list[RankView]:
    """The views in the order of `key` (see SORT_KEYS); ties in rank order; `reverse` flips the order."""
    if key == "rank":
        ordered = sorted(views, key=lambda view: view.row.rank)
    elif key == "occupancy":
        ordered = sorted(views, key=lambda view: (-view.row.occupancy, view.row.rank))
    elif key == "waiting":
        ordered = sorted(views, key=lambda view: (-view.row.waiting_prompts, view.row.rank))
    elif key == "blocking":
        ordered = sorted(views, key=lambda view: (not view.blocks, not view.contested, view.row.rank))
    elif key == "since":
        ordered = sorted(views, key=lambda view: (-(view.since if view.since is not None else 1 << 62),
                                                  view.row.rank))
    else:
        raise ValueError(f"unknown sort key {key!r}; one of {', '.join(SORT_KEYS)}")
    if reverse:
        ordered.reverse()
    return ordered
