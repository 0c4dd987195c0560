"""The scheduler's record of one request (mutable, owned by exactly one rank's scheduler)."""

from __future__ import annotations

from engine.request import RequestSpec
from engine.scheduler.states import ReqState, check_transition


class Req:
    """A request on a rank. `generated` is exact whenever the request is outside the decode set;
    inside it, the scheduler derives the count from its decode step (see `Scheduler.generated`)."""

    __slots__ = (
        "admit_seq",
        "computed",
        "generated",
        "host_tokens",
        "join_time",
        "output",
        "output_len",
        "pages",
        "prefix",
        "prompt",
        "prompt_len",
        "resume",
        "rid",
        "schedulable_round",
        "schedulable_time",
        "state",
        "step_base",
        "storage_done_round",
        "version",
    )

    def __init__(self, spec: RequestSpec, state: ReqState, keep_tokens: bool) -> None:
        self.rid = spec.rid
        self.prompt = spec.prompt
        self.prompt_len = spec.prompt_len
        self.output_len = spec.output_len
        self.prefix = spec.prefix_hit
        self.state = state
        self.computed = 0  # prompt tokens whose KV is on the Device, cached prefix included
        self.pages: list[int] = []
        self.generated = 0
        self.step_base = 0  # the scheduler's decode step when the request joined the decode set
        self.join_time = 0.0  # time of the last token it had when it joined the decode set
        self.host_tokens = 0  # KV entries of its image on the host tier while retracted
        self.resume: ReqState | None = None  # state to resume after a restore
        self.admit_seq = -1
        self.schedulable_round = -1
        self.schedulable_time = 0.0
        self.storage_done_round = -1
        self.version = 0  # bumped whenever the request leaves the decode set (stale heap entries)
        self.output: list[int] | None = [] if keep_tokens else None

    def move(self, new: ReqState) -> None:
        """Change state along a legal edge; raises InvalidTransition otherwise."""
        check_transition(self.rid, self.state, new)
        self.state = new

    @property
    def prefill_left(self) -> int:
        """Prompt tokens that still need prefill (the cached prefix needs none)."""
        return self.prompt_len - max(self.computed, self.prefix)
