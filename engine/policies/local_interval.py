"""L1, the local interval policy: per rank, no communication (`--prefill-decode-interval N`)."""

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
