"""A node agent's end of the node transport: the `NodeAgent.Link` service over a local `ProcessDriver`.

The agent of node N hosts that node's ranks as child processes (they die with it). Node 0's
controller opens one link: the first command is a `LinkHello` that must match this node (its index,
its ranks, the engine flags); then rank commands go to the ranks' inboxes, `Go` starts round 0 on the
controller's clock, and `EndLink` ends the run. Everything the ranks report travels back in order.
The run's outcome is `done`: None for a clean end, else one line saying what failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from engine.config import ServerArgs
from engine.drivers.cluster import NodeLayout, args_difference, describe_ranks, shared_flags
from engine.drivers.procs import ProcessDriver, RankFailed, RankFailure, RankMessage
from engine.drivers.wire import WireError, command_from_pb, report_to_pb
from prefill_gate.v1 import nodes_pb2 as pb
from prefill_gate.v1 import nodes_pb2_grpc


class NodeAgentService(nodes_pb2_grpc.NodeAgentServicer):
    """Serves the one link of a run from node 0's controller to this node's ranks."""

    def __init__(self, driver: ProcessDriver, layout: NodeLayout, args: ServerArgs, poll_s: float = 0.02) -> None:
        self.driver = driver
        self.layout = layout
        self.args = args
        self.poll_s = poll_s
        self.linked = False
        self.done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.link_ended = asyncio.Event()
        self._reported_dead: set[int] = set()

    def finish(self, failure: str | None) -> None:
        """Settle the run's outcome (the first word counts)."""
        if not self.done.done():
            self.done.set_result(failure)

    def refusal(self, hello: pb.LinkHello) -> str | None:
        """Why this agent cannot serve the run `hello` describes (None: it can)."""
        layout = self.layout
        if hello.nnodes != layout.nnodes or hello.node != layout.node:
            return (
                f"{layout.controller} expects {layout.unit} {hello.node} of {hello.nnodes}, "
                f"this agent is {layout.unit} {layout.node} of {layout.nnodes}"
            )
        if tuple(hello.ranks) != layout.ranks:
            return (
                f"{layout.controller} expects {describe_ranks(hello.ranks)} here, "
                f"this agent hosts {describe_ranks(layout.ranks)}"
            )
        try:
            theirs = json.loads(hello.server_args_json)
        except ValueError:
            return f"{layout.controller} sent unreadable engine flags"
        ours = json.loads(json.dumps(shared_flags(self.args, self.driver.spec.max_rounds)))
        differences = args_difference(ours, theirs)
        if differences:
            return f"engine flags differ from {layout.controller}'s: " + "; ".join(differences)
        return None

    async def Link(  # the gRPC method's name
        self, request_iterator: AsyncIterator[pb.NodeCommand], context: Any
    ) -> AsyncIterator[pb.NodeReport]:
        """The run's link: hello, then commands in and reports out until node 0 ends it."""
        if self.linked or self.done.done():
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS, f"{self.layout.describe(self.layout.node)} is already linked"
            )
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("command") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first command on a link must be a LinkHello")
        refused = self.refusal(first.hello)
        if refused is not None:
            self.finish(f"refused {self.layout.controller}'s link: {refused}")
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused)
        self.linked = True
        # However the call ends, node 0's side of the run is over. The handler's own checks below do not
        # see every end: after `kill -9` of node 0 the connection was gone while the handler no longer ran
        # (suspended where gRPC's cancellation does not reach it), and the agent waited for its 20 s
        # silent-link fallback. The first word counts: a clean end has settled `done` already.
        loop = asyncio.get_running_loop()
        lost = f"lost the link to {self.layout.controller} (its controller died or the network failed)"
        context.add_done_callback(lambda _: loop.call_soon_threadsafe(self.finish, lost))
        yield pb.NodeReport(
            hello=pb.AgentHello(
                node=self.layout.node, ranks=self.layout.ranks, hostname=socket.gethostname(), pid=os.getpid()
            )
        )
        reader = asyncio.create_task(self._read(request_iterator))
        try:
            while True:
                messages = await loop.run_in_executor(None, self.driver.poll_events, self.poll_s)
                self._reported_dead.update(m.rank for m in messages if isinstance(m, RankFailed))
                for message in [*messages, *self._dead_ranks()]:
                    yield report_to_pb(message)
                if reader.done():
                    self.finish(reader.result())
                    return
                if self.done.done():  # ended on this node (Ctrl-C, or its ranks gone): node 0 hears why
                    await context.abort(grpc.StatusCode.ABORTED, str(self.done.result()))
                if context.done():  # node 0 hung up without a word
                    self.finish(lost)
                    return
        except asyncio.CancelledError:
            self.finish(lost)
            raise
        finally:
            reader.cancel()
            self.link_ended.set()

    async def _read(self, requests: AsyncIterator[pb.NodeCommand]) -> str | None:
        """Apply node 0's commands until it ends the link; returns the run's outcome."""
        controller = self.layout.controller
        try:
            async for command in requests:
                kind = command.WhichOneof("command")
                if kind == "go":
                    # perf_counter() - clock: the origin that makes this machine's ranks read node 0's clock.
                    self.driver.go(time.perf_counter() - command.go.clock)
                elif kind == "end":
                    end = command.end
                    return f"{controller} ended the run: {end.reason or 'no reason given'}" if end.failed else None
                else:
                    rank, rank_command = command_from_pb(command)
                    if rank not in self.layout.ranks:
                        return f"{controller} sent a command for rank {rank}, which is not on this {self.layout.unit}"
                    self.driver.send(rank, rank_command)
        except WireError as exc:
            return f"unreadable command from {controller}: {exc}"
        except grpc.RpcError as exc:
            return f"lost the link to {controller} ({exc})"
        return f"{controller} closed the link without ending the run"

    def _dead_ranks(self) -> list[RankMessage]:
        """A rank process that ended without a word (killed) is reported once as failed; one that
        reported its own failure first is not reported again."""
        out: list[RankMessage] = []
        for rank, process in zip(self.driver.ranks, self.driver.processes, strict=False):
            code = process.exitcode
            if code not in (None, 0) and rank not in self._reported_dead:
                self._reported_dead.add(rank)
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                out.append(RankFailed(rank, f"process {process.pid} ended ({how})"))
        return out


async def supervise(service: NodeAgentService, link_timeout_s: float, orphaned_after_s: float = 20.0) -> None:
    """What the link cannot say. Before node 0 links: a rank that dies, or no link within
    `link_timeout_s`, ends the agent. After: every rank of this node gone while node 0 still has not
    ended the link (a link that went silent) ends it `orphaned_after_s` later."""
    deadline = time.monotonic() + link_timeout_s
    ranks_gone_at: float | None = None
    while not service.done.done():
        processes = service.driver.processes
        if not service.linked:
            try:
                service.driver.raise_if_failed()
            except RankFailure as exc:
                errors = [m.error for m in service.driver.poll_events() if isinstance(m, RankFailed)]
                service.finish(f"{exc}" + (f": {errors[0]}" if errors else ""))
                return
            if time.monotonic() > deadline:
                service.finish(f"{service.layout.controller} did not link within {link_timeout_s:.0f} s")
                return
        elif processes and all(p.exitcode is not None for p in processes):
            ranks_gone_at = ranks_gone_at or time.monotonic()
            if time.monotonic() - ranks_gone_at > orphaned_after_s:
                service.finish(
                    f"every rank of this {service.layout.unit} ended and {service.layout.controller} "
                    f"has not ended the run for {orphaned_after_s:.0f} s (a silent link?)"
                )
                return
        await asyncio.sleep(0.1)
