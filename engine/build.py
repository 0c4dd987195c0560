"""Wiring one rank: scheduler, executor, policy and clock from `ServerArgs`."""

from __future__ import annotations

from engine.clock import Clock, VirtualClock, WallClock
from engine.config import ServerArgs
from engine.executor.base import Executor
from engine.group import Group
from engine.policy import PrefillPolicy, policy_for
from engine.rank import RankEngine
from engine.scheduler.scheduler import Scheduler


def make_clock(args: ServerArgs) -> Clock:
    """Virtual time for the simulator, wall time otherwise."""
    return VirtualClock() if args.executor == "sim" else WallClock()


def make_executor(args: ServerArgs, rank: int, clock: Clock, group: Group | None) -> Executor:
    """The executor `args.executor` names; the torch one needs the rank's process group."""
    if args.executor == "sim":
        from engine.executor.sim import SimExecutor

        if not isinstance(clock, VirtualClock):
            raise ValueError("the sim executor runs on a virtual clock")
        return SimExecutor.named(args.sim_preset, clock, page_size=args.page_size)
    from engine.executor.torch_exec import TorchExecutor

    if group is None:
        raise ValueError("the torch executor needs a torch.distributed group (run ranks as processes)")
    return TorchExecutor(args, rank, group)


def build_engine(
    rank: int,
    args: ServerArgs,
    *,
    group: Group | None = None,
    executor: Executor | None = None,
    policy: PrefillPolicy | None = None,
    clock: Clock | None = None,
) -> RankEngine:
    """A `RankEngine` for `rank` of an `args.dp_size` group; pass parts to replace the defaults."""
    clock = clock if clock is not None else make_clock(args)
    scheduler = Scheduler(
        args,
        rank,
        prefix_cache=args.executor == "sim",
        keep_tokens=args.executor == "torch",
    )
    return RankEngine(
        rank=rank,
        size=args.dp_size,
        args=args,
        scheduler=scheduler,
        executor=executor if executor is not None else make_executor(args, rank, clock, group),
        policy=policy if policy is not None else policy_for(args, rank),
        clock=clock,
    )
