"""Server arguments: one dataclass, one set of kebab-case flags, one validation (rules C1-C4).

`ServerArgs.prefill_delay` is the gate's configuration. It is a property that validates on every
read (C2), so a programmatic change that leaves the arguments inconsistent is caught at the next
read, and a hot reload validates a candidate copy made with `replace` before anything changes (C3).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

DISAGGREGATION_MODES = ("null", "prefill", "decode")
EXECUTORS = ("torch", "sim")
DEVICES = ("cpu", "cuda")

# Flags whose values are intervals of rounds; their errors name the flag as a user typed it.
ATTEMPT_FLAG = "--prefill-attempt-interval"
ANY_FLAG = "--prefill-any-attempt-interval"
DECODE_INTERVAL_FLAG = "--prefill-decode-interval"
# The control plane reports intervals as uint32 (GateConfig); a larger one could never be shown.
MAX_INTERVAL = 2**32 - 1


def flag_name(field_name: str) -> str:
    """The command-line flag of a `ServerArgs` field (kebab-case)."""
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class PrefillDelay:
    """The gate's two intervals, as validated by `ServerArgs.prefill_delay`."""

    attempt_interval: int
    any_interval: int


class IntervalError(ValueError):
    """An invalid gate configuration; the message names the flag(s), `flags` lists the ones at fault."""

    def __init__(self, message: str, *flags: str) -> None:
        super().__init__(message)
        self.flags = flags


def check_intervals(attempt: object, any_: object) -> PrefillDelay | None:
    """The two intervals on their own (C2): None when both are unset; raises IntervalError.

    `ServerArgs.prefill_delay` reads this first, and `PrefillGate` refuses the same values with the
    same words, so no path can build a gate startup would refuse.
    """
    if attempt is None and any_ is None:
        return None
    if attempt is None or any_ is None:
        missing, given = (ATTEMPT_FLAG, ANY_FLAG) if attempt is None else (ANY_FLAG, ATTEMPT_FLAG)
        raise IntervalError(
            f"{given} is set ({attempt if any_ is None else any_}) but {missing} is not: "
            f"the prefill delay gate needs both intervals",
            missing,
        )
    for flag, value in ((ATTEMPT_FLAG, attempt), (ANY_FLAG, any_)):
        if not _is_positive_int(value) or value > MAX_INTERVAL:  # type: ignore[operator]
            raise IntervalError(f"{flag} must be an integer in [1, {MAX_INTERVAL}], got {value!r}", flag)
    if any_ < attempt:  # type: ignore[operator]
        raise IntervalError(
            f"{ANY_FLAG} ({any_}) must be >= {ATTEMPT_FLAG} ({attempt}): otherwise the ALL points "
            f"a burst relies on could never be reached twice in a row",
            ANY_FLAG,
            ATTEMPT_FLAG,
        )
    return PrefillDelay(attempt_interval=attempt, any_interval=any_)  # type: ignore[arg-type]


def _opt(help_text: str, default: Any = None, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help_text, **extra})


@dataclass
class ServerArgs:
    """Everything a launch is configured with. Construction validates (C2, C4)."""

    # The gate (C1, C2).
    prefill_attempt_interval: int | None = _opt(
        "ALL interval A: every A rounds since the last prefill round the gate opens if every decoding "
        "rank also wants prefill. Set together with --prefill-any-attempt-interval."
    )
    prefill_any_attempt_interval: int | None = _opt(
        "ANY interval K (>= A): every K rounds the gate opens if any rank wants prefill."
    )
    prefill_decode_interval: int | None = _opt(
        "Local policy (L1): a rank with decode work prefills at most every N rounds. Refused with the gate."
    )
    disaggregation_mode: str = _opt("Role: null (fused), prefill or decode.", "null", choices=DISAGGREGATION_MODES)
    # The group and the batch (C4).
    dp_size: int = _opt("Number of attention-DP ranks (one process each with the torch executor).", 1)
    enable_dp_attention: bool = _opt("Ranks gather their rows and vote as one group (attention DP).", False)
    max_num_seqs: int = _opt("Running requests over the whole group; divided by --dp-size with DP attention.", 256)
    chunked_prefill_size: int = _opt("Per-round prompt-token budget of a rank (max_scheduled_tokens).", 8192)
    enable_mixed_prefill_decode: bool = _opt("Run decode rows and prefill chunks in one batch.", False)
    # The Device KV pool and the host tier of every rank.
    page_size: int = _opt("Tokens per KV page.", 16)
    kv_pages: int = _opt("Usable Device KV pages per rank.", 4096)
    storage_read_ticks: int = _opt("Storage ticks a prefix read takes before its prompt can be scheduled.", 4)
    max_readmissions_per_round: int = _opt("Retracted requests restored per round at most.", 4)
    # The executor.
    executor: str = _opt("Forward implementation: torch (real model) or sim (cost model).", "torch", choices=EXECUTORS)
    device: str = _opt("Torch device of the torch executor.", "cpu", choices=DEVICES)
    sim_preset: str = _opt("Cost-model preset of the sim executor.", "h200-dp8-ep8")
    seed: int = _opt("Seed of model weights and synthetic workloads.", 0)
    collective_timeout_s: float = _opt("Seconds a collective may wait for a peer before the run fails.", 60.0)
    # The torch executor's model: a small MoE transformer, experts sharded over the ranks.
    model_layers: int = _opt("Transformer layers of the torch executor's model.", 2)
    model_hidden: int = _opt("Hidden size of the model.", 64)
    model_heads: int = _opt("Attention heads of the model.", 4)
    model_ffn: int = _opt("Expert FFN width of the model.", 128)
    model_vocab: int = _opt("Vocabulary size of the model.", 512)
    model_experts: int = _opt("Routed experts in total, sharded evenly over the ranks.", 8)
    model_top_k: int = _opt("Experts each token is routed to.", 2)
    moe_low_latency_capacity: int = _opt(
        "Tokens per rank pair in a low-latency dispatch; 0: the per-rank batch times top-k (never overflows).", 0
    )
    cuda_graph_max_batch: int = _opt("Largest decode batch captured in a CUDA graph (CUDA only).", 64)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def prefill_delay(self) -> PrefillDelay | None:
        """The gate's intervals, or None when both are unset. Validates on every read (C2)."""
        delay = check_intervals(self.prefill_attempt_interval, self.prefill_any_attempt_interval)
        if delay is None:
            return None
        if self.disaggregation_mode != "null":
            raise IntervalError(
                f"{ATTEMPT_FLAG}/{ANY_FLAG} apply to the fused role only; "
                f"--disaggregation-mode is {self.disaggregation_mode!r}",
                ATTEMPT_FLAG,
                ANY_FLAG,
            )
        if self.prefill_decode_interval is not None:
            raise IntervalError(
                f"{ATTEMPT_FLAG}/{ANY_FLAG} cannot be combined with {DECODE_INTERVAL_FLAG} "
                f"({self.prefill_decode_interval}): the local interval would break the group's alignment",
                ATTEMPT_FLAG,
                ANY_FLAG,
            )
        return delay

    @property
    def max_batch_size(self) -> int:
        """Running requests per rank (C4)."""
        return self.max_num_seqs // self.dp_size if self.enable_dp_attention else self.max_num_seqs

    def validate(self) -> None:
        """Raise ValueError naming the flag(s) and value(s) of the first inconsistency found."""
        for name in (
            "dp_size",
            "max_num_seqs",
            "chunked_prefill_size",
            "page_size",
            "kv_pages",
            "max_readmissions_per_round",
            "model_layers",
            "model_hidden",
            "model_heads",
            "model_ffn",
            "model_vocab",
            "model_experts",
            "model_top_k",
            "cuda_graph_max_batch",
        ):
            value = getattr(self, name)
            if not _is_positive_int(value):
                raise ValueError(f"{flag_name(name)} must be an integer >= 1, got {value!r}")
        if not _is_int(self.storage_read_ticks) or self.storage_read_ticks < 0:
            raise ValueError(f"--storage-read-ticks must be an integer >= 0, got {self.storage_read_ticks!r}")
        if not _is_int(self.seed):
            raise ValueError(f"--seed must be an integer, got {self.seed!r}")
        if not isinstance(self.collective_timeout_s, int | float) or not self.collective_timeout_s > 0:
            raise ValueError(f"--collective-timeout-s must be > 0, got {self.collective_timeout_s!r}")
        for name, choices in (
            ("disaggregation_mode", DISAGGREGATION_MODES),
            ("executor", EXECUTORS),
            ("device", DEVICES),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"{flag_name(name)} must be one of {', '.join(choices)}, got {value!r}")
        if self.prefill_decode_interval is not None and not _is_positive_int(self.prefill_decode_interval):
            raise ValueError(f"{DECODE_INTERVAL_FLAG} must be an integer >= 1, got {self.prefill_decode_interval!r}")
        if self.enable_dp_attention and self.max_num_seqs < self.dp_size:
            raise ValueError(
                f"--max-num-seqs ({self.max_num_seqs}) must be >= --dp-size ({self.dp_size}) "
                f"with --enable-dp-attention: every rank needs at least one batch slot"
            )
        if self.enable_mixed_prefill_decode and self.chunked_prefill_size < self.max_batch_size + self.page_size:
            # Decode rows and the pending prefill share the round budget; the reserve must always fit.
            raise ValueError(
                f"--chunked-prefill-size ({self.chunked_prefill_size}) must be >= the per-rank batch "
                f"({self.max_batch_size}) + --page-size ({self.page_size}) with --enable-mixed-prefill-decode"
            )
        if self.executor == "torch":
            self._validate_model()
        self.prefill_delay  # noqa: B018 - the property is the single validation of the gate (C2)

    def _validate_model(self) -> None:
        """The torch executor's model must fit the group: experts shard evenly over the ranks."""
        if not _is_int(self.moe_low_latency_capacity) or self.moe_low_latency_capacity < 0:
            raise ValueError(
                f"--moe-low-latency-capacity must be an integer >= 0, got {self.moe_low_latency_capacity!r}"
            )
        if self.model_hidden % self.model_heads:
            raise ValueError(
                f"--model-hidden ({self.model_hidden}) must be divisible by --model-heads ({self.model_heads})"
            )
        if self.model_experts % self.dp_size:
            raise ValueError(
                f"--model-experts ({self.model_experts}) must be divisible by --dp-size ({self.dp_size}): "
                f"experts are sharded evenly over the ranks"
            )
        if self.model_top_k > self.model_experts:
            raise ValueError(f"--model-top-k ({self.model_top_k}) must be <= --model-experts ({self.model_experts})")

    def replace(self, **changes: Any) -> ServerArgs:
        """A validated copy with `changes` applied; raises ValueError and leaves `self` unchanged (C3)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ValueError(f"unknown server argument(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    # -- command line -------------------------------------------------------------------------

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add one kebab-case flag per field."""
        group = parser.add_argument_group("server arguments")
        for f in dataclasses.fields(cls):
            flag = flag_name(f.name)
            help_text = f.metadata.get("help", "")
            if f.type in ("bool", bool):
                group.add_argument(flag, action="store_true", default=f.default, help=help_text)
                continue
            kind = _cli_type(f)
            kwargs: dict[str, Any] = {"type": kind, "default": f.default, "help": f"{help_text} (default: %(default)s)"}
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
            group.add_argument(flag, **kwargs)

    @classmethod
    def from_cli_args(cls, namespace: argparse.Namespace) -> ServerArgs:
        """Build from parsed flags; raises ValueError naming the flags on an invalid combination."""
        values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)}
        return cls(**values)


def _cli_type(f: dataclasses.Field[Any]) -> type:
    text = str(f.type)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_int(value: object) -> bool:
    return _is_int(value) and value >= 1  # type: ignore[operator]
