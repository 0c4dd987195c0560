"""`serve --autotune-ttft-p99 S --autotune-itl-p99 S`: the tuner inside the controller.

The same `tuner.loop.run_tuner` as `prefill-gate tune`, on the controller's own plane: the records come
from the round hub exactly as `WatchRounds` streams them, and changes go through
`Controller.update_intervals` (validated like startup, C3; `expected_epoch`; adopted by every rank on
one round, G1) with `changed_by` "tuner". An operator's change (ctl, console) is respected as it is for
an outside tuner.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

from control.host.controller import ConfigRejected, Controller, Draining, StaleEpoch
from control.plane.services import config_message
from prefill_gate.v1 import types_pb2 as pb
from tuner.client import WATCH_QUEUE
from tuner.core import Proposal, Tuner
from tuner.loop import Adopted, PlaneLost, Refused, StaleConfig, run_tuner
from tuner.options import add_tuning_args, tuning_from, tuning_requested

PREFIX = "autotune-"


class ControllerPlane:
    """`tuner.loop.Plane` on a controller in the same process."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    async def watch(self) -> AsyncIterator[pb.RoundRecord]:
        hub = self.controller.hub
        subscriber = hub.subscribe(max_queue=WATCH_QUEUE)
        try:
            while (record := await subscriber.next()) is not None:
                yield record
        finally:
            hub.unsubscribe(subscriber)

    async def get_config(self) -> pb.GateConfig:
        return config_message(self.controller.config)

    async def update(self, proposal: Proposal, changed_by: str) -> Adopted:
        target = proposal.target
        try:
            update = await self.controller.update_intervals(
                target.attempt,
                target.any,
                disable=not target.enabled,
                expected_epoch=proposal.expected_epoch,
                changed_by=changed_by,
                reason=proposal.reason,
            )
        except StaleEpoch as exc:
            raise StaleConfig(str(exc)) from exc
        except ConfigRejected as exc:
            raise Refused(str(exc)) from exc
        except Draining as exc:
            raise PlaneLost(str(exc)) from exc
        return Adopted(config_message(update.config), update.adopted_round)


def add_autotune_args(parser: argparse.ArgumentParser) -> None:
    """`--autotune-ttft-p99`, `--autotune-itl-p99` and the tuner's guards."""
    add_tuning_args(parser, PREFIX)


def check_autotune_args(ns: argparse.Namespace) -> None:
    """Refuse a half-given SLO or bad guards before anything starts (ValueError naming the flag)."""
    if not tuning_requested(ns, PREFIX):
        return
    tuning_from(ns, PREFIX)
    if getattr(ns, "prefill_decode_interval", None) is not None:
        raise ValueError("--autotune-* tunes the gate; it cannot run with --prefill-decode-interval")


async def attach_autotune(controller: Controller, ns: argparse.Namespace) -> Callable[[], Awaitable[None]]:
    """`serve` attachment: run the tuner on the controller when an SLO was given."""
    if not tuning_requested(ns, PREFIX):
        return _nothing
    slo, settings = tuning_from(ns, PREFIX)
    tuner = Tuner(slo, settings)

    def say(line: str) -> None:
        print(f"autotune: {line}", file=sys.stderr, flush=True)

    say(f"on: TTFT p99 <= {slo.ttft_p99_s:g} s, ITL p99 <= {slo.itl_p99_s * 1e3:g} ms")
    task = asyncio.create_task(run_tuner(ControllerPlane(controller), tuner, say, reconnect=False))

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return stop


async def _nothing() -> None:
    return None
