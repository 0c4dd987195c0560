"""Requests as submitted, the commands a rank takes in at intake, and the events it reports back."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from engine.config import PrefillDelay


class RequestError(ValueError):
    """A request refused at submit; nothing in the scheduler changed."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One generation request.

    `prompt` holds token ids when the executor needs them (torch); the simulator needs only the
    lengths. `prefix_hit` prompt tokens are cached on the host/storage tier: the prompt first waits
    on a storage read, then only the uncached suffix needs prefill.
    """

    rid: str
    prompt_len: int
    output_len: int
    arrival: float = 0.0
    prompt: tuple[int, ...] | None = None
    prefix_hit: int = 0

    def violations(
        self,
        *,
        usable_pages: int | None = None,
        page_size: int = 16,
        vocab: int | None = None,
        prefix_cache: bool = True,
    ) -> list[tuple[str, str]]:
        """Every reason no rank could serve this request, by SubmitRequest field name (empty: servable).

        The one place requests are validated: `check` raises on these, the scheduler adds its pool, the
        control plane reports them all at once as field violations.
        """
        out: list[tuple[str, str]] = []
        if not isinstance(self.rid, str) or not self.rid:
            out.append(("request_id", f"must be a non-empty string, got {self.rid!r}"))
        if self.prompt is not None and vocab is not None:
            bad = [token for token in self.prompt if not 0 <= token < vocab]
            if bad:
                out.append(("prompt", f"token ids must be in [0, {vocab}), got {bad[0]}"))
        prompt_ok = _is_int(self.prompt_len) and self.prompt_len >= 1
        if not prompt_ok:
            out.append(("prompt_len", f"must be >= 1 (the prompt must not be empty), got {self.prompt_len!r}"))
        elif self.prompt is not None and len(self.prompt) != self.prompt_len:
            out.append(("prompt_len", f"is {self.prompt_len} but prompt has {len(self.prompt)} tokens"))
        output_ok = _is_int(self.output_len) and self.output_len >= 1
        if not output_ok:
            out.append(("output_len", f"must be >= 1, got {self.output_len!r}"))
        if not _is_int(self.prefix_hit) or self.prefix_hit < 0 or (prompt_ok and self.prefix_hit >= self.prompt_len):
            bounds = f"[0, prompt_len) = [0, {self.prompt_len})"
            out.append(("prefix_hit", f"must be in {bounds}, got {self.prefix_hit!r}"))
        elif self.prefix_hit and not prefix_cache:
            out.append(("prefix_hit", "this executor has no storage tier to read a cached prefix from"))
        if usable_pages is not None and prompt_ok and output_ok:
            total = self.prompt_len + self.output_len
            needed = -(-total // page_size)
            if needed > usable_pages:
                text = (
                    f"prompt_len + output_len = {total} tokens need {needed} pages, more than the "
                    f"{usable_pages} a rank's pool can ever hold"
                )
                out += [("prompt_len", text), ("output_len", text)]
        return out

    def check(self, **limits: object) -> None:
        """Raise RequestError naming the request and its first violation (see `violations`)."""
        problems = self.violations(**limits)  # type: ignore[arg-type]
        if problems:
            field, message = problems[0]
            raise RequestError(f"request {self.rid}: {field}: {message}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- commands a rank takes in at intake (R1 step 1) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """A new request for this rank."""

    request: RequestSpec


@dataclass(frozen=True, slots=True)
class Abort:
    """Abort a request in whatever state it is."""

    rid: str


@dataclass(frozen=True, slots=True)
class UpdateWeights:
    """A weight update: the rank pauses for one round that is not prefill."""


@dataclass(frozen=True, slots=True)
class ProposeConfig:
    """A validated config change for rank 0 to propose in its row (G1). `delay` None turns the gate off."""

    epoch: int
    delay: PrefillDelay | None


@dataclass(frozen=True, slots=True)
class Stop:
    """Rank 0 proposes that every rank stops after the current round."""


Command = Submit | Abort | UpdateWeights | ProposeConfig | Stop


# -- events a rank reports (R1 step 10) ------------------------------------------------------------


class FinishReason(StrEnum):
    """Why a request ended."""

    LENGTH = "length"
    ABORT = "abort"
    CUT_OFF = "cut_off"  # the engine stopped (an agreed stop, a crash, a lost rank) before the request finished


@dataclass(frozen=True, slots=True)
class Admitted:
    """A prompt's first chunk was scheduled; `wait_*` is how long it waited while schedulable."""

    rid: str
    rank: int
    round: int
    time: float
    wait_rounds: int
    wait_seconds: float


@dataclass(frozen=True, slots=True)
class ChunkPlanned:
    """One prefill chunk of a request ran in `round`."""

    rid: str
    rank: int
    round: int
    tokens: int


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The request's first output token, at the end of its last prefill chunk."""

    rid: str
    rank: int
    round: int
    time: float


@dataclass(frozen=True, slots=True)
class Tokens:
    """Output token ids produced this round (only executors that sample real tokens report them)."""

    rid: str
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Finished:
    """The request ended; `output_len` tokens were produced. `detail` says why a request was cut off."""

    rid: str
    rank: int
    round: int
    time: float
    reason: FinishReason
    output_len: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Refused:
    """`submit` refused the request; the scheduler is unchanged."""

    rid: str
    rank: int
    error: str


@dataclass(frozen=True, slots=True)
class AbortIgnored:
    """An abort named a request this rank does not hold (already ended or never seen)."""

    rid: str
    rank: int


@dataclass(frozen=True, slots=True)
class Retracted:
    """A request was retracted to the host tier to free Device pages."""

    rid: str
    rank: int
    round: int


@dataclass(frozen=True, slots=True)
class ProposalRefused:
    """A config proposal the rank refused at intake (a stale epoch, or values startup would refuse):
    nothing changed. Not a request's event, but it travels with them to the controller."""

    epoch: int
    error: str
    rid: str = ""


RequestEvent = (
    Admitted | ChunkPlanned | FirstToken | Tokens | Finished | Refused | AbortIgnored | Retracted | ProposalRefused
)
