"""Request states of the per-rank scheduler and every legal transition, in one table."""

from __future__ import annotations

from enum import Enum


class ReqState(Enum):
    """Where a request is in its life on a rank."""

    STORAGE_READ = "storage_read"  # a new prompt whose cached prefix is still being read
    NEW = "new"  # a new prompt: no chunk scheduled, no Device reservation
    PREFILLING = "prefilling"  # a resident chunk: prefill started, chunks left
    PREFILL_DONE = "prefill_done"  # last chunk planned this round; first decode next round
    DECODING = "decoding"
    RETRACTING = "retracting"  # KV image being offloaded to the host tier
    RETRACTED = "retracted"  # suspended, KV image on the host tier
    RESTORING = "restoring"  # KV image being restored to Device pages (readmission)
    FINISHED = "finished"
    ABORTED = "aborted"


S = ReqState

TRANSITIONS: dict[ReqState, frozenset[ReqState]] = {
    S.STORAGE_READ: frozenset({S.NEW, S.ABORTED}),
    S.NEW: frozenset({S.PREFILLING, S.PREFILL_DONE, S.ABORTED}),
    S.PREFILLING: frozenset({S.PREFILL_DONE, S.RETRACTING, S.ABORTED}),
    S.PREFILL_DONE: frozenset({S.DECODING, S.FINISHED, S.ABORTED}),
    S.DECODING: frozenset({S.RETRACTING, S.FINISHED, S.ABORTED}),
    S.RETRACTING: frozenset({S.RETRACTED, S.ABORTED}),
    S.RETRACTED: frozenset({S.RESTORING, S.ABORTED}),
    S.RESTORING: frozenset({S.DECODING, S.PREFILLING, S.ABORTED}),
    S.FINISHED: frozenset(),
    S.ABORTED: frozenset(),
}

TERMINAL = frozenset({S.FINISHED, S.ABORTED})


class InvalidTransition(RuntimeError):
    """A scheduler bug: a request was moved along an edge the table does not have."""


def check_transition(rid: str, old: ReqState, new: ReqState) -> None:
    """Raise InvalidTransition unless `old -> new` is in the table."""
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(f"request {rid}: {old.value} -> {new.value} is not a legal transition")
