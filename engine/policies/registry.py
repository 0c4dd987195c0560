"""The lab's policies by name: `make_policy(name, args, rank)` and the arguments each one needs.

Every factory takes `(args, rank)` plus keyword overrides of the policy's own defaults, and returns one
rank's policy. Group policies must be built alike on every rank (same name, args and overrides).

The gate and the local interval read their configuration from `ServerArgs`, and `ServerArgs` refuses the
gate intervals together with `--prefill-decode-interval` (C2). A lab run therefore builds one
`ServerArgs` per policy with `policy_args(name, base, ...)`: for "gate" it sets the two intervals and
clears the local one; for "local-interval" it sets the local interval (`DEFAULT_LOCAL_INTERVAL` when
neither the caller nor `base` gives one) and clears the gate's; for every other policy it clears all
three, so that no launch record claims a gate that did not run. Peers take their knobs as keyword
overrides instead (`make_policy("atom-coalescer", args, rank, target_fill=0.7)`).

The engines that mix prefill into their decode batches run mixed here too: `policy_args` turns on
`enable_mixed_prefill_decode` for every policy in `MIXED_PREFILL_DECODE` (vLLM's scheduler always batches
prefill chunks beside running decodes, vllm/v1/core/sched/scheduler.py; TensorRT-LLM's inflight batching
schedules context and generation requests in one batch), so a runner needs no special case. The others keep
what `base` says (SGLang, ATOM and this project run prefill and decode in separate rounds by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.config import PrefillDelay, ServerArgs
from engine.policies.atom_coalescer import AtomCoalescerPolicy
from engine.policies.local_interval import LocalIntervalPolicy
from engine.policies.sglang_delayer import SGLangDelayerPolicy
from engine.policies.trtllm_balance import TrtllmBalancePolicy
from engine.policies.vllm_cadence import VllmCadencePolicy
from engine.policy import GatePolicy, PrefillPolicy, UngatedPolicy

PolicyFactory = Callable[..., PrefillPolicy]

# L1's interval when neither the lab nor the arguments give one: a chosen value, in the range public
# local knobs are run at (https://github.com/ROCm/ATOM/pull/2238 recommends 4 for its prefill/decode interval).
DEFAULT_LOCAL_INTERVAL = 4


def _ungated(args: ServerArgs, rank: int) -> PrefillPolicy:
    return UngatedPolicy()


def _gate(args: ServerArgs, rank: int) -> PrefillPolicy:
    return GatePolicy(args.prefill_delay)


def _local_interval(args: ServerArgs, rank: int, *, interval: int | None = None) -> PrefillPolicy:
    return LocalIntervalPolicy(interval or args.prefill_decode_interval or DEFAULT_LOCAL_INTERVAL, rank)


# Policies whose engines run prefill inside decode batches (mixed rounds).
MIXED_PREFILL_DECODE = frozenset({"vllm-cadence", "trtllm-balance"})

POLICIES: dict[str, PolicyFactory] = {
    "ungated": _ungated,
    "gate": _gate,
    "local-interval": _local_interval,
    "sglang-delayer": SGLangDelayerPolicy,
    "atom-coalescer": AtomCoalescerPolicy,
    "vllm-cadence": VllmCadencePolicy,
    "trtllm-balance": TrtllmBalancePolicy,
}


def _factory(name: str) -> PolicyFactory:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown prefill policy {name!r}; known: {', '.join(POLICIES)}") from None


def make_policy(name: str, args: ServerArgs, rank: int = 0, **overrides: Any) -> PrefillPolicy:
    """Rank `rank`'s policy called `name`; raises ValueError listing the names on an unknown one."""
    return _factory(name)(args, rank, **overrides)


def policy_args(
    name: str,
    base: ServerArgs,
    *,
    prefill_delay: PrefillDelay | None = None,
    decode_interval: int | None = None,
) -> ServerArgs:
    """A validated copy of `base` configured for policy `name` (see the module docstring)."""
    _factory(name)
    if name in MIXED_PREFILL_DECODE and not base.enable_mixed_prefill_decode:
        base = base.replace(enable_mixed_prefill_decode=True)
    if name == "gate":
        delay = prefill_delay or base.prefill_delay
        if delay is None:
            raise ValueError(
                "policy 'gate' needs --prefill-attempt-interval and --prefill-any-attempt-interval; "
                "without them it is 'ungated' (R8)"
            )
        return base.replace(
            prefill_decode_interval=None,
            prefill_attempt_interval=delay.attempt_interval,
            prefill_any_attempt_interval=delay.any_interval,
        )
    if name == "local-interval":
        interval = decode_interval or base.prefill_decode_interval or DEFAULT_LOCAL_INTERVAL
        return base.replace(
            prefill_attempt_interval=None, prefill_any_attempt_interval=None, prefill_decode_interval=interval
        )
    return base.replace(prefill_attempt_interval=None, prefill_any_attempt_interval=None, prefill_decode_interval=None)
