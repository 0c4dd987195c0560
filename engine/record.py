"""The round record rank 0 publishes each round (R1 step 11, G2)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.gate import GatePoint
from engine.rows import Row


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """Everything a round decided, with every rank's row and the config it was decided under."""

    round: int
    unix_nanos: int
    clock: float
    counter: int
    point: GatePoint
    open: bool
    counter_after: int
    all_decode_or_idle: bool
    round_seconds: float
    rows: tuple[Row, ...]
    policy: str
    config_epoch: int
    attempt_interval: int | None
    any_interval: int | None
    adopted_epoch: int | None = None  # a config epoch adopted after this round's gather (G1)
    # Latency samples the ranks reported since the previous record, attached by whoever collects every
    # rank's events (the controller, the lab); rank 0 alone does not know its peers'.
    ttft: tuple[float, ...] = ()  # time to first token of each request whose first token came
    itl: tuple[tuple[float, int], ...] = ()  # (seconds since the previous token, tokens that waited so long)

    @property
    def enabled(self) -> bool:
        """Whether the gate held prefill this round."""
        return self.attempt_interval is not None
