"""L1, the local interval policy: per rank, no communication (`--prefill-decode-interval N`).

L1 is this project's rule (SEMANTICS.md). The public knob it resembles (PEERS.md policy 3; restated, not
copied): SGLang `--prefill-decode-interval N`, https://github.com/sgl-project/sglang/pull/35017,
`python/sglang/srt/managers/scheduler.py` (`Scheduler.get_next_batch_to_run`): default 0 (off); after an
EXTEND batch new prefill is deferred for the next N scheduler rounds; under DP attention the interval is
armed from the MLP-sync all-gather's `is_extend_in_batch`, so every rank defers together after any rank
extended. L1 differs on purpose: it counts the rank's own extends only, and a prompt that has waited N
rounds is let through (its delay budget).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.policy import Decision, LocalView, PrefillPolicy
from engine.rows import Row


class LocalIntervalPolicy(PrefillPolicy):
    """A rank with decode work prefills only when N rounds have passed since its own last prefill
    round, or when its longest-waiting prompt has used up its delay budget of N rounds; a rank
    without decode work prefills freely."""

    name = "local-interval"

    def __init__(self, interval: int, rank: int = 0) -> None:
        if interval < 1:
            raise ValueError(f"--prefill-decode-interval must be >= 1, got {interval}")
        self.interval = interval
        self.rank = rank
        # As if the last prefill round were long ago: the first prompt is not held.
        self.rounds_since_prefill = interval

    def decide(self, local: LocalView) -> Decision:
        allow = (
            not local.has_decode_work
            or self.rounds_since_prefill >= self.interval
            or local.oldest_wait_rounds >= self.interval
        )
        return Decision(allow_prefill=allow, counter=self.rounds_since_prefill)

    def observe(self, rows: Sequence[Row]) -> None:
        # With attention DP the rank sees every rank's row; without it only its own (R7).
        own = rows[self.rank] if len(rows) > 1 else rows[0]
        self.rounds_since_prefill = 0 if own.num_extends > 0 else self.rounds_since_prefill + 1

    @property
    def counter(self) -> int:
        return self.rounds_since_prefill
