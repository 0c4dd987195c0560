"""Ranks across nodes: node 0's side of the node transport.

Node 0 runs the controller and hosts rank 0 (which publishes the round records); every other node runs
an agent (`engine/drivers/agent.py`) that hosts its ranks as child processes. `ClusterDriver` gives
the controller the `ProcessDriver` interface over both: its own ranks through a local `ProcessDriver`,
the others through one gRPC link per agent (`RemoteNode`, `protos/prefill_gate/v1/nodes.proto`).

The ranks meet in torch's own rendezvous, a TCPStore at MASTER_ADDR:MASTER_PORT (hosted by node 0's
controller, or by torchrun's agent under torchrun); the agents publish their gRPC address in the same
store (`NodeDirectory`). The round's one all-gather stays torch.distributed's: nothing here is on the
round's path. A link that breaks, an agent that refuses, a remote rank that fails: the controller sees
a `NodeFailure` naming the node at its next poll, and the run ends on every node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc

from engine.config import PrefillDelay, ServerArgs
from engine.drivers.procs import (
    ProcessDriver,
    RankExited,
    RankFailed,
    RankFailure,
    RankMessage,
    note_start,
)
from engine.drivers.wire import WireError, command_to_pb, report_from_pb
from engine.record import RoundRecord
from engine.request import Command, ProposeConfig, Stop
from prefill_gate.v1 import nodes_pb2 as pb
from prefill_gate.v1 import nodes_pb2_grpc

AGENT_KEY = "prefill_gate/agents/{node}"
RANKS_PREFIX = "prefill_gate/ranks"
LINK_METHOD = "/prefill_gate.v1.NodeAgent/Link"
# Both ends ping an idle link, so a silent partition ends the run in seconds rather than never.
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_time_between_pings_ms", 1_000),  # else a ping may wait minutes after the last one
    ("grpc.http2.ping_timeout_ms", 5_000),  # else an unanswered ping is given a minute
    ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
]


class NodeFailure(RankFailure):
    """A node failed or its link did; the message is one line naming the node and its ranks."""

    def __init__(self, name: str, ranks: Sequence[int], error: str, detail: str = "") -> None:
        RuntimeError.__init__(self, f"{name} failed: {error}")
        self.rank = min(ranks)
        self.name = name
        self.detail = detail


class StartInterrupted(RankFailure):
    """Ctrl-C (or SIGTERM) while node 0 waited for the other nodes: nothing ran yet."""

    def __init__(self, sig: int, waiting_for: str) -> None:
        RuntimeError.__init__(self, f"interrupted by {signal.Signals(sig).name} while waiting for {waiting_for}")
        self.rank = 0
        self.detail = ""


@contextlib.contextmanager
def interruptible() -> Iterator[list[int]]:
    """While node 0 blocks its event loop waiting for agents, Ctrl-C and SIGTERM are noted here (the
    list gets the signal) instead of waiting for a loop that cannot run; the old handlers come back."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    wakeup_fd = signal.set_wakeup_fd(-1)  # an event loop's signal pipe: it must not act on these later
    for sig in previous:
        signal.signal(sig, lambda number, _frame: caught.append(number))
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(wakeup_fd)


def describe_ranks(ranks: Sequence[int]) -> str:
    """'rank 3' or 'ranks 2-3'."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


@dataclass(frozen=True)
class NodeLayout:
    """Which global ranks each node hosts, and which node this process is."""

    nodes: tuple[tuple[int, ...], ...]
    node: int = 0
    unit: str = "node"  # what a member of the layout is called: a node, or a torchrun worker

    @classmethod
    def even(cls, dp_size: int, nnodes: int, node: int) -> NodeLayout:
        """`dp_size / nnodes` consecutive ranks per node (`--nnodes`, `--node-rank`)."""
        if nnodes < 1:
            raise ValueError(f"--nnodes must be >= 1, got {nnodes}")
        if not 0 <= node < nnodes:
            raise ValueError(f"--node-rank must be in [0, {nnodes}), got {node}")
        if dp_size % nnodes:
            raise ValueError(f"--dp-size ({dp_size}) must be divisible by --nnodes ({nnodes}): ranks per node")
        per = dp_size // nnodes
        return cls(tuple(tuple(range(n * per, (n + 1) * per)) for n in range(nnodes)), node)

    @classmethod
    def one_rank_each(cls, world_size: int, rank: int) -> NodeLayout:
        """Under torchrun every worker process hosts its one rank (RANK, WORLD_SIZE)."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"RANK must be in [0, WORLD_SIZE={world_size}), got {rank}")
        return cls(tuple((r,) for r in range(world_size)), rank, unit="worker")

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks this node hosts."""
        return self.nodes[self.node]

    def describe(self, node: int) -> str:
        """'node 1 (ranks 2-3)', or 'worker 3 (rank 3)' under torchrun."""
        return f"{self.unit} {node} ({describe_ranks(self.nodes[node])})"

    @property
    def controller(self) -> str:
        """How messages name the member that runs the controller: 'node 0' or 'worker 0'."""
        return f"{self.unit} 0"


class NodeDirectory:
    """Where each agent listens, published in the rendezvous TCPStore (torch's, not a new one)."""

    def __init__(self, host: str, port: int, *, host_store: bool, timeout_s: float, prefix: str = "") -> None:
        import torch.distributed as dist

        self.host, self.port, self.prefix = host, port, prefix
        try:
            self.store = dist.TCPStore(
                host,
                port,
                is_master=host_store,
                wait_for_workers=False,
                timeout=timedelta(seconds=timeout_s),
            )
        except Exception as exc:  # torch raises DistStoreError / RuntimeError subclasses
            verb = "host" if host_store else "reach"
            raise OSError(f"cannot {verb} the rendezvous store at {host}:{port}: {exc}") from exc

    def key(self, node: int) -> str:
        return self.prefix + AGENT_KEY.format(node=node)

    def publish(self, node: int, target: str) -> None:
        """Say where `node`'s agent listens."""
        self.store.set(self.key(node), target)

    def lookup(self, node: int, timeout_s: float, stop: Callable[[], bool] = lambda: False) -> str | None:
        """Where `node`'s agent listens; waits up to `timeout_s` for it to publish (None once `stop()`)."""
        deadline = time.monotonic() + timeout_s
        while not self.store.check([self.key(node)]):
            if stop():
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no agent published its address within {timeout_s:.0f} s")
            time.sleep(0.05)
        return self.store.get(self.key(node)).decode()


def route_address(master_addr: str, master_port: int) -> str:
    """The address of this machine's interface toward `master_addr` (what an agent advertises)."""
    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((master_addr, master_port))  # UDP: no packet is sent, the kernel picks the route
        return str(probe.getsockname()[0])


def dial_target(host: str, port: int) -> str:
    """HOST:PORT for a gRPC channel, IPv6 bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RemoteNode:
    """Node 0's end of one agent's link: commands go out in order, reports come back into a queue.

    A thread reads the report stream until it ends; `failure` then says why unless the end was asked
    for (every rank of the node exited, or node 0 abandoned the run).
    """

    def __init__(
        self,
        node: int,
        ranks: Sequence[int],
        target: str,
        *,
        token: str | None = None,
        tls_ca: str | None = None,
        name: str = "",
    ) -> None:
        self.node = node
        self.name = name or f"node {node} ({describe_ranks(ranks)})"
        self.ranks = tuple(ranks)
        self.target = target
        self.failure: str | None = None
        self.hello: Any = None
        self.exited: set[int] = set()
        self.reports: queue.SimpleQueue[RankMessage] = queue.SimpleQueue()
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._said_hello = threading.Event()
        self._closing = False
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        if tls_ca:
            with open(tls_ca, "rb") as handle:
                credentials = grpc.ssl_channel_credentials(root_certificates=handle.read())
            self._channel = grpc.secure_channel(target, credentials, options=KEEPALIVE_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(target, options=KEEPALIVE_OPTIONS)
        self._stub = nodes_pb2_grpc.NodeAgentStub(self._channel)
        self._call: Any = None
        self._thread = threading.Thread(target=self._read, name=f"prefill-gate-link{node}", daemon=True)

    def open(self, hello: Any, timeout_s: float) -> None:
        """Open the link with `hello` (a LinkHello) and wait for the agent's answer."""
        self._commands.put(pb.NodeCommand(hello=hello))
        self._call = self._stub.Link(self._outgoing(), metadata=self._metadata)
        self._thread.start()
        if not self._said_hello.wait(timeout_s):
            self.failure = self.failure or f"its agent at {self.target} did not answer within {timeout_s:.0f} s"
        if self.failure:
            raise NodeFailure(self.name, self.ranks, self.failure)

    def send(self, rank: int, command: Command) -> None:
        self._commands.put(command_to_pb(rank, command))

    def go(self, clock: float) -> None:
        self._commands.put(pb.NodeCommand(go=pb.GoCommand(clock=clock)))

    @property
    def ended(self) -> bool:
        """The report stream is over."""
        return self._thread.ident is not None and not self._thread.is_alive()

    def close(self, failed: bool, reason: str = "", timeout_s: float = 5.0) -> None:
        """End the link: clean (every rank exited) or abandoned; waits for the agent to hang up."""
        self._closing = True
        if self._call is not None:
            self._commands.put(pb.NodeCommand(end=pb.EndLink(failed=failed, reason=reason)))
            self._commands.put(None)
            self._thread.join(timeout_s)
            self._call.cancel()
        self._channel.close()

    def _outgoing(self) -> Iterator[Any]:
        while True:
            command = self._commands.get()
            if command is None:
                return
            yield command

    def _read(self) -> None:
        try:
            for report in self._call:
                if report.WhichOneof("report") == "hello":
                    self.hello = report.hello
                    self._said_hello.set()
                    continue
                message = report_from_pb(report)
                if isinstance(message, RankExited):
                    self.exited.add(message.rank)
                self.reports.put(message)
            if not self._closing and self.exited != set(self.ranks):
                self.failure = "its agent ended the link before its ranks exited"
        except grpc.RpcError as exc:
            if not self._closing:
                self.failure = _link_error(exc, self.target)
        except WireError as exc:
            self.failure = f"unreadable report from its agent: {exc}"
        finally:
            self._said_hello.set()


def _link_error(exc: Any, target: str) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "ERROR"
    if name == "FAILED_PRECONDITION":
        return f"its agent refused the link: {details}"
    if name == "ABORTED":
        return f"its agent ended the link: {details}"
    if name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return f"its agent at {target} refused node 0's token ({name}: {details})"
    return f"lost the link to its agent at {target} ({name}: {details})"


class ClusterDriver:
    """The `ProcessDriver` interface over node 0's ranks and every other node's agent.

    Node 0 (this process) must host rank 0: it publishes the round records, takes config proposals
    and the stop (G1), so those never cross a link.
    """

    def __init__(
        self,
        args: ServerArgs,
        layout: NodeLayout,
        directory: NodeDirectory,
        *,
        init_method: str,
        run_id: str,
        token: str | None = None,
        tls_ca: str | None = None,
        ready_timeout_s: float = 300.0,
        log: Callable[[str], None] = lambda line: None,
        **local_kwargs: Any,
    ) -> None:
        if layout.node != 0 or 0 not in layout.ranks:
            raise ValueError(f"the controller runs on {layout.controller}, which hosts rank 0")
        self.args = args
        self.layout = layout
        self.directory = directory
        self.run_id = run_id
        self.token = token
        self.tls_ca = tls_ca
        self.ready_timeout_s = ready_timeout_s
        self.log = log
        self.local = ProcessDriver(args, ranks=layout.ranks, init_method=init_method, **local_kwargs)
        self.remotes: dict[int, RemoteNode] = {}
        self.exited: set[int] = set()
        self.failure: str | None = None  # the first failure seen: the reason every link is ended with
        self._remote_of = {rank: node for node in range(1, layout.nnodes) for rank in layout.nodes[node]}

    # -- what the backend reads off a ProcessDriver ------------------------------------------------

    @property
    def clock_origin(self) -> float:
        return self.local.clock_origin

    @property
    def processes(self) -> list[Any]:
        return self.local.processes

    @property
    def records_dropped(self) -> Any:
        return self.local.records_dropped

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, ready_timeout_s: float | None = None, *, go: bool = True) -> list[RankMessage]:
        """Spawn node 0's ranks, link every agent, wait until every rank of the group is ready."""
        self.local.launch()  # first, on this thread: the ranks' parent-death signal is tied to it
        with interruptible() as caught:
            return self._start(self.ready_timeout_s if ready_timeout_s is None else ready_timeout_s, go, caught)

    def _start(self, timeout_s: float, go: bool, caught: list[int]) -> list[RankMessage]:
        deadline = time.monotonic() + timeout_s
        args_json = json.dumps(shared_flags(self.args, self.local.spec.max_rounds), sort_keys=True)
        store = f"{self.directory.host}:{self.directory.port}"
        for node in range(1, self.layout.nnodes):
            ranks, name = self.layout.nodes[node], self.layout.describe(node)
            self.log(f"waiting for {name}: its agent's address in the rendezvous store at {store}")
            try:
                target = self.directory.lookup(node, max(1.0, deadline - time.monotonic()), lambda: bool(caught))
            except TimeoutError as exc:
                raise NodeFailure(name, ranks, f"{exc} (is its agent running?)") from exc
            if target is None:
                raise StartInterrupted(caught[0], name)
            remote = RemoteNode(node, ranks, target, token=self.token, tls_ca=self.tls_ca, name=name)
            self.remotes[node] = remote
            hello = pb.LinkHello(
                run_id=self.run_id, node=node, nnodes=self.layout.nnodes, ranks=ranks, server_args_json=args_json
            )
            remote.open(hello, max(1.0, deadline - time.monotonic()))
            scheme = "grpcs" if self.tls_ca else "grpc"
            self.log(f"linked {name}: agent at {scheme}://{target} on {remote.hello.hostname} (pid {remote.hello.pid})")
        ready: set[int] = set()
        backlog: list[RankMessage] = []
        while len(ready) < self.args.dp_size:
            if caught:
                raise StartInterrupted(caught[0], "every rank to join the group")
            self.raise_if_failed()
            for message in self.poll_events(0.1):
                note_start(message, ready, backlog)
            if time.monotonic() > deadline:
                missing = min(set(range(self.args.dp_size)) - ready)
                raise RankFailure(missing, "did not start in time")
        if go:
            self.go()
        return backlog

    def go(self) -> None:
        """Every rank of the group starts round 0; remote ranks take node 0's engine clock."""
        for remote in self.remotes.values():
            remote.go(time.perf_counter() - self.local.clock_origin)
        self.local.go()

    def send(self, rank: int, command: Command) -> None:
        node = self._remote_of.get(rank)
        if node is None:
            self.local.send(rank, command)
        else:
            self.remotes[node].send(rank, command)

    def propose(self, epoch: int, delay: PrefillDelay | None) -> None:
        self.local.send(0, ProposeConfig(epoch, delay))

    def request_stop(self) -> None:
        self.local.send(0, Stop())

    def poll_events(self, timeout_s: float = 0.0) -> list[RankMessage]:
        out = self._collect(timeout_s)
        if any(isinstance(m, RankFailed) for m in out):
            out = self._cause_first(out)
            first = next(m for m in out if isinstance(m, RankFailed))
            self.failure = self.failure or f"rank {first.rank} failed: {first.error}"
        return out

    def _collect(self, timeout_s: float) -> list[RankMessage]:
        out = self.local.poll_events(timeout_s)
        for remote in self.remotes.values():
            while True:
                try:
                    message = remote.reports.get_nowait()
                except queue.Empty:
                    break
                if isinstance(message, RankFailed):  # whoever reads it learns which node failed
                    message = RankFailed(message.rank, f"on {remote.name}: {message.error}", message.detail)
                out.append(message)
        self.exited.update(m.rank for m in out if isinstance(m, RankExited))
        return out

    def _cause_first(self, out: list[RankMessage], wait_s: float = 2.0) -> list[RankMessage]:
        """A collective that failed is a symptom: its peers see it the moment one rank or node dies.
        Wait briefly for the cause (a broken link, a dead process, a rank's own error) and put it first."""
        deadline = time.monotonic() + wait_s
        while all(_symptom(m) for m in out if isinstance(m, RankFailed)) and time.monotonic() < deadline:
            self._raise_if_killed()
            out += self._collect(0.02)
        causes = [m for m in out if isinstance(m, RankFailed) and not _symptom(m)]
        return causes + [m for m in out if m not in causes]

    def poll_records(self, limit: int = 100_000) -> list[RoundRecord]:
        return self.local.poll_records(limit)

    def _raise_if_killed(self) -> None:
        """A node whose link broke, or a local rank killed by a signal (not one that reported and exited)."""
        for remote in self.remotes.values():
            if remote.failure is not None:
                failure = NodeFailure(remote.name, remote.ranks, remote.failure)
                self.failure = self.failure or str(failure)
                raise failure
        for rank, process in zip(self.local.ranks, self.local.processes, strict=False):
            if process.exitcode is not None and process.exitcode < 0:
                failure = RankFailure(rank, f"process {process.pid} ended (killed by signal {-process.exitcode})")
                self.failure = self.failure or str(failure)
                raise failure

    def raise_if_failed(self) -> None:
        """Raise RankFailure for a dead local rank, NodeFailure for a node whose link failed."""
        try:
            self.local.raise_if_failed()
            for remote in self.remotes.values():
                # Reports read before the link failed come first: a rank's own error names the rank.
                if remote.failure is not None and remote.reports.empty():
                    raise NodeFailure(remote.name, remote.ranks, remote.failure)
        except RankFailure as exc:
            self.failure = self.failure or str(exc)
            raise

    def alive(self) -> bool:
        remote_live = any(not r.ended and r.exited != set(r.ranks) for r in self.remotes.values())
        return self.local.alive() or remote_live

    def join(self, timeout_s: float) -> bool:
        return self.local.join(timeout_s)

    def terminate(self) -> None:
        """Kill node 0's ranks; end every link, clean only when every rank of the group exited."""
        clean = self.exited == set(range(self.args.dp_size))
        reason = "" if clean else self.failure or "it stopped before every rank exited (killed or interrupted)"
        for remote in self.remotes.values():
            with contextlib.suppress(Exception):
                remote.close(failed=not clean, reason=reason)
        self.local.terminate()


def _symptom(message: RankFailed) -> bool:
    """A rank's all-gather failed (a peer is gone): what every other rank reports when one dies."""
    return "CollectiveError" in message.error


def server_args_fields(args: ServerArgs) -> dict[str, Any]:
    """The engine flags every node must share, as plain values."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}


def shared_flags(args: ServerArgs, max_rounds: int | None) -> dict[str, Any]:
    """What every node must agree on: the engine flags and the round bound (`--rounds`)."""
    return {**server_args_fields(args), "rounds": max_rounds}


def args_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """'--flag (node 0: a, this node: b)' for each engine flag that differs."""
    out = []
    for name in sorted(set(ours) | set(theirs)):
        if ours.get(name) != theirs.get(name):
            flag = "--" + name.replace("_", "-")
            out.append(f"{flag} (node 0: {theirs.get(name)!r}, this node: {ours.get(name)!r})")
    return out


def torchrun_env(environ: dict[str, str] | None = None) -> dict[str, int | str] | None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT when torchrun started this process."""
    env = os.environ if environ is None else environ
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if "TORCHELASTIC_RUN_ID" not in env and not all(name in env for name in needed):
        return None
    try:
        return {
            "rank": int(env["RANK"]),
            "world_size": int(env["WORLD_SIZE"]),
            "local_rank": int(env.get("LOCAL_RANK", "0")),
            "master_addr": env["MASTER_ADDR"],
            "master_port": int(env["MASTER_PORT"]),
            "restart": int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        }
    except (KeyError, ValueError) as exc:
        raise ValueError(f"torchrun environment incomplete or malformed: {exc}") from exc
