"""Each policy's own knobs: the settings the capacity lab sweeps, and how a setting becomes a runnable policy.

A setting (`Knobs`) is a sorted tuple of (name, value) pairs, hashable and picklable. Per policy a `KnobSpace`
lists its knobs' ladders (the values worth trying, in order), the coarse grid the full run starts from, the
smaller grid of `--quick`, and the upstream default (tried first). `refine(knobs)` gives the neighbours of a
setting: each knob one rung up or down its ladder, so the full run can walk from the best coarse setting
towards a better one.

The knobs and their upstream defaults (each module in `engine/policies/` cites its source):

- gate: A (`--prefill-attempt-interval`) and K (`--prefill-any-attempt-interval`), K >= A (C2).
- local-interval: N (`--prefill-decode-interval`).
- sglang-delayer: `max_delay_passes` (30) and `allow_on_none` (0: hold on NONE, the lab's default on rows
  one round old; 1: allow, as SGLang does on fresh flags).
- atom-coalescer: `target_fill` (0.9), `stall_ticks` (10) and `ttft_max_ticks` (200, the bound on its
  alignment hold); `max_queue_ms` too where the policy takes it (ATOM's wall-clock queue guard, off by
  default upstream).
- vllm-cadence: `interval` (`--prefill-schedule-interval`; 1 is vLLM's default, off; #44558 recommends 2).
- trtllm-balance: `timeout_iters` (50) and `batching_wait_iters` (10).
- gate-autotune: the launch config the tuner starts cold from, A=8 K=32 (the demo's), A=1 K=2 (the least
  held) or, in a full run, A=1 K=16, is the operator's knob; from there the tuner moves A and K itself to the
  SLO being searched (lab/autotune.py). A few starts, not the gate's grid: the tuner's own choice is what is
  measured. In a probe of 30-110 s it makes few changes (its dwell is 100 rounds), so the start it was given
  weighs on the capacity; the report names the start that won.
- ungated: no knobs of its own.
- `mixed` (0/1), for ungated, gate and gate-autotune: the engine's `--enable-mixed-prefill-decode`. The peers
  run in the mode of the engine they restate (vLLM and TensorRT-LLM mixed, `engine.policies.registry`); the
  engine the gate belongs to offers both modes (S3), so "the gate at its best" is swept over both, and so is
  ungated (its mixed setting is vLLM's scheduler with no cadence, `vllm-cadence` interval 1).
- any policy registered later without a space here: no knobs (one setting, its defaults).

To give a new policy knobs: add its `KnobSpace` to `SPACES` (its knob names are keyword arguments of its
factory in `engine.policies.registry`, unless `configure` maps them to server arguments as for the gate).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.config import PrefillDelay, ServerArgs
from engine.policies.registry import POLICIES, make_policy, policy_args
from engine.policy import PrefillPolicy
from lab.autotune import AUTOTUNE, COLD_START, LAB_POLICIES, LAB_TUNING, AutotunedGate

Knobs = tuple[tuple[str, float], ...]
PolicyFactory = Callable[[int, ServerArgs], PrefillPolicy]


def knobs(**values: float) -> Knobs:
    """A setting from keyword values, sorted by name."""
    return tuple(sorted(values.items()))


def describe(setting: Knobs) -> str:
    """`A=8 K=32`, or `defaults` for no knobs."""
    return " ".join(f"{name}={value:g}" for name, value in setting) or "defaults"


@dataclass(frozen=True)
class KnobSpace:
    """One policy's knobs (module docstring). `valid` rejects combinations that do not make sense (K < A)."""

    ladders: tuple[tuple[str, tuple[float, ...]], ...]
    default: Knobs
    coarse: tuple[Knobs, ...]
    quick: tuple[Knobs, ...]
    valid: Callable[[Knobs], bool] = lambda setting: True

    def grid(self, quick: bool) -> tuple[Knobs, ...]:
        """The settings a search starts from: the upstream default first, then the coarse grid; `--quick` takes
        its own short list as it is (it may leave the default out)."""
        if quick:
            return self.quick or (self.default,)
        return (self.default, *(s for s in self.coarse if s != self.default))

    def refine(self, setting: Knobs) -> tuple[Knobs, ...]:
        """Every valid setting one rung away from `setting` on one knob's ladder."""
        values = dict(setting)
        out: list[Knobs] = []
        for name, ladder in self.ladders:
            if values.get(name) not in ladder:
                continue
            at = ladder.index(values[name])
            for step in (-1, 1):
                if 0 <= at + step < len(ladder):
                    neighbour = knobs(**{**values, name: ladder[at + step]})
                    if self.valid(neighbour) and neighbour not in out:
                        out.append(neighbour)
        return tuple(out)


def _gate_valid(setting: Knobs) -> bool:
    values = dict(setting)
    return values["A"] <= values["K"]


def _atom_space() -> KnobSpace:
    # TTFT_MAX_TICKS bounds ATOM's alignment hold: at 200 ticks of ~30 ms a lone prompt can wait 6 s, so a
    # TTFT bound of seconds needs it lower; it is swept with the fill target and the stall give-up.
    ladders: list[tuple[str, tuple[float, ...]]] = [
        ("stall_ticks", (1, 3, 10, 30)),
        ("target_fill", (0.1, 0.3, 0.6, 0.9)),
        ("ttft_max_ticks", (12, 25, 50, 100, 200)),
    ]
    default = {"stall_ticks": 10, "target_fill": 0.9, "ttft_max_ticks": 200}
    triples = ((0.9, 10, 50), (0.6, 10, 50), (0.3, 3, 50), (0.3, 3, 200))
    coarse = [knobs(stall_ticks=s, target_fill=f, ttft_max_ticks=t) for f, s, t in triples]
    quick = [
        knobs(stall_ticks=3, target_fill=0.3, ttft_max_ticks=50),
        knobs(stall_ticks=10, target_fill=0.9, ttft_max_ticks=50),
    ]
    if "max_queue_ms" in inspect.signature(POLICIES["atom-coalescer"]).parameters:
        # ATOM's queue guard: off upstream (None); swept where the policy models it.
        ladders.append(("max_queue_ms", (0, 250, 500, 1000)))
        default["max_queue_ms"] = 0
        coarse = [knobs(**dict(s), max_queue_ms=q) for s in coarse for q in (0, 500)]
        quick = [knobs(**dict(s), max_queue_ms=500) for s in quick]
    return KnobSpace(tuple(ladders), knobs(**default), tuple(coarse), tuple(quick))


MIXED: tuple[str, tuple[float, ...]] = ("mixed", (0, 1))
# A=1 with a larger K (the ALL point every round, the ANY point bounding a lone prompt's wait) is its own
# regime: the full run of 2026-12-01 found A=1 K=16-32 (mixed) 5% above every coarse setting on scattered
# and osl-variance, out of reach of a refinement that walks one rung from A=1 K=2.
_GATE_COARSE = ((1, 2), (1, 8), (1, 32), (2, 8), (4, 16), (8, 32), (16, 64))
_GATE_QUICK = ((1, 2), (4, 16))

SPACES: dict[str, KnobSpace] = {
    "ungated": KnobSpace((MIXED,), knobs(mixed=0), (knobs(mixed=1),), (knobs(mixed=0), knobs(mixed=1))),
    "gate": KnobSpace(
        (("A", (1, 2, 4, 8, 16, 32)), ("K", (2, 4, 8, 16, 32, 64, 128)), MIXED),
        knobs(A=8, K=32, mixed=0),
        tuple(knobs(A=a, K=k, mixed=m) for m in (0, 1) for a, k in _GATE_COARSE),
        tuple(knobs(A=a, K=k, mixed=m) for m in (0, 1) for a, k in _GATE_QUICK),
        _gate_valid,
    ),
    "local-interval": KnobSpace(
        (("N", (1, 2, 4, 8, 16)),), knobs(N=4), (knobs(N=2), knobs(N=8)), (knobs(N=2), knobs(N=4))
    ),
    "sglang-delayer": KnobSpace(
        (("allow_on_none", (0, 1)), ("max_delay_passes", (2, 5, 10, 30, 60, 120))),
        knobs(allow_on_none=0, max_delay_passes=30),
        tuple(knobs(allow_on_none=a, max_delay_passes=m) for a, m in ((0, 5), (0, 10), (0, 60), (1, 30), (1, 5))),
        (knobs(allow_on_none=0, max_delay_passes=5), knobs(allow_on_none=1, max_delay_passes=30)),
    ),
    "atom-coalescer": _atom_space(),
    "vllm-cadence": KnobSpace(
        (("interval", (1, 2, 3, 4, 8)),),
        knobs(interval=2),
        (knobs(interval=1), knobs(interval=4)),
        (knobs(interval=2), knobs(interval=1)),
    ),
    "trtllm-balance": KnobSpace(
        (("batching_wait_iters", (0, 2, 5, 10, 20)), ("timeout_iters", (5, 10, 20, 50, 100))),
        knobs(batching_wait_iters=10, timeout_iters=50),
        tuple(knobs(batching_wait_iters=w, timeout_iters=t) for t, w in ((20, 5), (10, 0), (100, 20))),
        (knobs(batching_wait_iters=0, timeout_iters=10), knobs(batching_wait_iters=10, timeout_iters=50)),
    ),
}

_STARTS = ((COLD_START.attempt_interval, COLD_START.any_interval), (1, 2))
# A full run also starts the tuner at A=1 K=16, the static gate's regime of A=1 with a larger K.
_FULL_STARTS = (*_STARTS, (1, 16))
_AUTOTUNE_GRID = tuple(knobs(A=a, K=k, mixed=m) for a, k in _FULL_STARTS for m in (0, 1))
_AUTOTUNE_QUICK = tuple(knobs(A=a, K=k, mixed=m) for a, k in _STARTS for m in (0, 1))
SPACES[AUTOTUNE] = KnobSpace((MIXED,), _AUTOTUNE_GRID[0], _AUTOTUNE_GRID[1:], _AUTOTUNE_QUICK)

_NONE = KnobSpace((), (), (), ())


def space_of(policy: str) -> KnobSpace:
    """The policy's knob space; a registered policy without one has no knobs."""
    if policy not in LAB_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known policies: {', '.join(LAB_POLICIES)}")
    return SPACES.get(policy, _NONE)


def _int_if_whole(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def configure(policy: str, setting: Knobs, base: ServerArgs) -> tuple[ServerArgs, PolicyFactory]:
    """Server arguments and a per-rank policy factory for `policy` at `setting` (ValueError on a bad one)."""
    values = {name: _int_if_whole(value) for name, value in setting}
    if values.pop("mixed", 0):
        base = base.replace(enable_mixed_prefill_decode=True)
    if policy == AUTOTUNE:
        tuned = AutotunedGate(PrefillDelay(int(values["A"]), int(values["K"])), LAB_TUNING)
        return tuned.args(base), tuned
    if policy == "gate":
        args = policy_args("gate", base, prefill_delay=PrefillDelay(int(values["A"]), int(values["K"])))
        return args, lambda rank, rank_args: make_policy("gate", rank_args, rank)
    if policy == "local-interval":
        args = policy_args(policy, base, decode_interval=int(values["N"]))
        return args, lambda rank, rank_args: make_policy(policy, rank_args, rank)
    if "allow_on_none" in values:
        values["allow_on_none"] = bool(values["allow_on_none"])
    if policy == "atom-coalescer" and values.get("max_queue_ms") == 0:
        values["max_queue_ms"] = None  # 0 on the ladder is the guard switched off, as upstream
    args = policy_args(policy, base)
    make_policy(policy, args, 0, **values)  # fail here, once, on a bad setting
    return args, lambda rank, rank_args: make_policy(policy, rank_args, rank, **values)


def settings_of(policy: str, quick: bool, extra: Sequence[Knobs] = ()) -> tuple[Knobs, ...]:
    """The policy's starting grid plus `extra` settings, without repeats."""
    out = list(space_of(policy).grid(quick))
    out += [setting for setting in extra if setting not in out]
    return tuple(out)
