"""The tuner's loop: a record stream in, interval changes out, through any `Plane`.

The same loop runs `prefill-gate tune` (a gRPC client, `tuner.client.GrpcPlane`) and
`serve --autotune-*` (the controller's own stream and admin call). It is the I/O edge around the pure
`Tuner`: it keeps reading while a change is being adopted (the engine never waits for the tuner),
retries a change whose expected epoch went stale against the config that replaced it, reconnects a lost
stream while the engine keeps serving on the last config, and prints one line per change and per new
reason to hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from prefill_gate.v1 import types_pb2 as pb
from tuner.core import Proposal, Tuner, intervals_of

RETRIES = 3  # stale-epoch retries of one change before it is given up (someone else keeps changing it)


class PlaneLost(RuntimeError):
    """The stream or a call failed for a reason that reconnecting may fix (engine gone, restarted)."""


class StaleConfig(RuntimeError):
    """The expected epoch was not the latest: someone else changed the config first."""


class Refused(RuntimeError):
    """The change was refused (invalid, unauthenticated): retrying the same call cannot help."""


@dataclass(frozen=True, slots=True)
class Adopted:
    """A change every rank adopted."""

    config: pb.GateConfig
    adopted_round: int


class Plane(Protocol):
    """What the loop needs of a control plane."""

    def watch(self) -> AsyncIterator[pb.RoundRecord]:
        """Every record from the next round on (raises PlaneLost when the stream breaks or ends)."""
        ...

    async def get_config(self) -> pb.GateConfig:
        """The config in force."""
        ...

    async def update(self, proposal: Proposal, changed_by: str) -> Adopted:
        """Ask for the change with `expected_epoch`; StaleConfig, Refused or PlaneLost when it fails."""
        ...


Say = Callable[[str], None]


async def run_tuner(
    plane: Plane,
    tuner: Tuner,
    say: Say,
    *,
    dry_run: bool = False,
    stale_after_s: float = 5.0,
    reconnect_max_s: float = 5.0,
    reconnect: bool = True,
) -> None:
    """Run until cancelled (or, with `reconnect=False`, until the stream is lost)."""
    backoff = 0.25
    shown = ""
    applying: set[asyncio.Task[None]] = set()
    try:
        while True:
            try:
                async for record in _fresh(plane.watch(), stale_after_s, tuner, say):
                    backoff = 0.25
                    proposal = tuner.observe(record)
                    for event in tuner.take_events():
                        say(f"round {record.round}  {event}")
                        shown = re.sub(r"\d+(\.\d+)?", "#", event)
                    if proposal is not None:
                        if dry_run:
                            tuner.dry_run_done(proposal)
                            say(f"round {record.round}  would change (dry run): {proposal.reason}")
                        else:
                            task = asyncio.create_task(_apply(plane, tuner, proposal, say))
                            applying.add(task)
                            task.add_done_callback(applying.discard)
                    shape = re.sub(r"\d+(\.\d+)?", "#", tuner.status)
                    if shape != shown:
                        shown = shape
                        say(f"round {record.round}  holding: {tuner.status}")
                raise PlaneLost("the stream ended: the engine stopped")
            except PlaneLost as exc:
                tuner.lost(f"stream lost ({exc})")
                for event in tuner.take_events():
                    say(event)
                shown = ""
                if not reconnect:
                    return
                await asyncio.sleep(backoff)
                backoff = min(reconnect_max_s, backoff * 2)
    finally:
        for task in applying:
            task.cancel()
        for task in list(applying):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _fresh(
    records: AsyncIterator[pb.RoundRecord], stale_after_s: float, tuner: Tuner, say: Say
) -> AsyncIterator[pb.RoundRecord]:
    """The stream's records; a stall longer than `stale_after_s` is reported once and restarts the estimates."""
    iterator = aiter(records)
    stalled = False
    try:
        while True:
            try:
                # Not asyncio.wait_for: on 3.11 it can swallow a cancellation that lands as the record does.
                async with asyncio.timeout(stale_after_s):
                    record = await anext(iterator)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not stalled:
                    stalled = True
                    tuner.lost(f"no record for {stale_after_s:g} s (stale)")
                    for event in tuner.take_events():
                        say(event)
                continue
            stalled = False
            yield record
    finally:
        with contextlib.suppress(Exception):
            await iterator.aclose()  # type: ignore[attr-defined]


async def _apply(plane: Plane, tuner: Tuner, proposal: Proposal, say: Say) -> None:
    """One change, retried against the new config while someone else's change keeps overtaking it."""
    for _ in range(RETRIES + 1):
        try:
            adopted = await plane.update(proposal, tuner.name)
        except StaleConfig as exc:
            try:
                config = await plane.get_config()
            except PlaneLost as lost:
                tuner.settle(proposal, str(lost))
                return
            say(f"epoch moved under the change ({exc}); now {intervals_of(config)} by {config.changed_by or '?'}")
            retried = tuner.retry(proposal, config)
            if retried is None:
                say(f"not retried: {tuner.status}")
                return
            proposal = retried
            continue
        except (Refused, PlaneLost) as exc:
            tuner.settle(proposal, str(exc))
            say(f"change refused: {exc}")
            return
        tuner.settle(proposal)
        say(
            f"round {proposal.round}  {proposal.reason}  "
            f"[epoch {adopted.config.epoch}, adopted by every rank after round {adopted.adopted_round}]"
        )
        return
    tuner.settle(proposal, f"the epoch moved {RETRIES + 1} times in a row")
    say(f"given up: the epoch moved {RETRIES + 1} times in a row under {proposal.reason}")
