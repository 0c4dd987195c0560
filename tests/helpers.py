"""Small builders shared by the tests (real engine parts, no doubles)."""

from __future__ import annotations

from typing import Any

from engine.config import ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.rank import RoundOutcome
from engine.request import RequestSpec


def sim_args(**overrides: Any) -> ServerArgs:
    """ServerArgs of a small simulated group with attention DP."""
    values: dict[str, Any] = {
        "executor": "sim",
        "dp_size": 2,
        "enable_dp_attention": True,
        "max_num_seqs": 64,
        "chunked_prefill_size": 256,
        "page_size": 16,
        "kv_pages": 256,
    }
    values.update(overrides)
    return ServerArgs(**values)


def req(rid: str, prompt_len: int = 64, output_len: int = 8, **extra: Any) -> RequestSpec:
    """A request with lengths only."""
    return RequestSpec(rid=rid, prompt_len=prompt_len, output_len=output_len, **extra)


def run_rounds(driver: LockstepDriver, rounds: int) -> list[list[RoundOutcome]]:
    """Step `rounds` rounds; outcomes per round, in rank order."""
    return [driver.step() for _ in range(rounds)]
