"""The process driver: one OS process per rank, a real `torch.distributed` group, queues to the controller.

Each rank process runs `rank_main`: join the group, build its `RankEngine`, say it is ready, wait for
the driver's `Go` (commands sent before it are all taken in at round 0, on every node alike), then
loop `drain inbox -> run_round -> publish` until rank 0 publishes a stop (every rank stops after the
same round) or the round bound is reached. Request events travel on one unbounded queue (a request must
never be lost); rank 0's round records travel on a bounded queue with drop counting, so the engine
never waits for a slow consumer. Rank processes ignore SIGINT: the controller turns Ctrl-C into an
agreed stop, and kills whatever does not stop in time.

A driver may host only some ranks of a larger group (`ranks`): node 0's controller and every node
agent run one each, for the ranks of their node (`engine/drivers/cluster.py`).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import PrefillDelay, ServerArgs
from engine.drivers.lifeline import die_with_parent
from engine.record import RoundRecord
from engine.request import Command, ProposeConfig, RequestEvent, Stop


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a rank process needs besides its rank."""

    args: ServerArgs
    init_method: str
    backend: str = "gloo"
    max_rounds: int | None = None
    vote_log_dir: str | None = None
    idle_wait_s: float = 0.002
    threads_per_rank: int = 1
    profile_phases: bool = False
    clock_origin: float | None = None  # the controller's perf_counter origin, shared by the ranks
    # "module:function" called in the rank process as function(engine, **observer_kwargs) -> RoundObserver
    observer: str | None = None
    observer_kwargs: dict[str, Any] = field(default_factory=dict)
    controller_pid: int = 0


@dataclass(frozen=True)
class Go:
    """Every rank of the group is ready: start round 0. `clock_origin` (a `perf_counter` value of this
    machine), when set, replaces the wall clock's origin so that the ranks of a remote node stamp
    events on the controller's engine clock."""

    clock_origin: float | None = None


@dataclass(frozen=True)
class RankReady:
    """The rank joined the group and built its engine."""

    rank: int
    pid: int


@dataclass(frozen=True)
class RankRound:
    """One round's request events and latency samples of a rank (sent only when non-empty)."""

    rank: int
    round: int
    events: list[RequestEvent] = field(default_factory=list)
    itl: list[tuple[float, int]] = field(default_factory=list)


@dataclass(frozen=True)
class RankFailed:
    """The rank's loop raised: `error` is one line, `detail` the traceback."""

    rank: int
    error: str
    detail: str = ""


@dataclass(frozen=True)
class RankExited:
    """The rank left its loop cleanly after `rounds` rounds and `gathers` all-gathers; `phases` are
    seconds per round phase when phase profiling was on."""

    rank: int
    rounds: int
    gathers: int
    phases: dict[str, float] = field(default_factory=dict)
    observer_dropped: int = 0  # the round observer's final count, after it flushed (trace spans not delivered)


RankMessage = RankReady | RankRound | RankFailed | RankExited


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def vote_line(outcome: Any, epoch: int) -> str:
    """One round of a rank's vote log: round, point, open, counter before and after, config epoch."""
    d = outcome.decision
    return f"{outcome.round} {int(d.point)} {int(d.allow_prefill)} {d.counter} {outcome.counter_after} {epoch}"


def rank_main(
    rank: int, spec: LaunchSpec, inbox: Any, events: Any, records: Any, dropped: Any, local_rank: int | None = None
) -> None:
    """Body of one rank process; `local_rank` is its index among the ranks of its node (its GPU)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A controller killed outright (SIGKILL, OOM) must not leave its ranks stepping idle rounds forever.
    die_with_parent(spec.controller_pid)
    import torch

    from engine.build import build_engine
    from engine.clock import WallClock
    from engine.group import TorchGroup
    from engine.phases import PhaseTimer

    torch.set_num_threads(spec.threads_per_rank)
    args = spec.args
    if args.device == "cuda":
        # Without this every rank lands on cuda:0 and NCCL refuses the group.
        torch.cuda.set_device((rank if local_rank is None else local_rank) % torch.cuda.device_count())
    group = None
    engine = None
    log = None
    rounds = 0
    try:
        group = TorchGroup(
            rank,
            args.dp_size,
            spec.init_method,
            backend=spec.backend,
            timeout_s=args.collective_timeout_s,
            device=args.device,
        )
        clock = WallClock(spec.clock_origin) if args.executor != "sim" else None
        engine = build_engine(rank, args, group=group, clock=clock)
        if spec.profile_phases:
            engine.timer = PhaseTimer()
        if spec.observer:
            engine.observer = load_object(spec.observer)(engine, **spec.observer_kwargs)
        if spec.vote_log_dir:
            # Line-buffered: a rank killed with its node keeps every round it logged.
            log = (Path(spec.vote_log_dir) / f"rank{rank}.log").open("w", buffering=1)
        events.put(RankReady(rank, os.getpid()))
        go = _await_go(inbox, engine.inbox)
        if go.clock_origin is not None and isinstance(engine.clock, WallClock):
            engine.clock = WallClock(go.clock_origin)
        while True:
            _drain(inbox, engine.inbox)
            outcome = engine.run_round(group)
            rounds += 1
            if log is not None:
                log.write(vote_line(outcome, engine.epoch) + "\n")
            if outcome.events or outcome.itl:
                events.put(RankRound(rank, outcome.round, outcome.events, outcome.itl))
            if outcome.record is not None:
                try:
                    records.put_nowait(outcome.record)
                except queue.Full:
                    with dropped.get_lock():
                        dropped.value += 1
            if outcome.stop or (spec.max_rounds is not None and rounds >= spec.max_rounds):
                break
            if outcome.all_idle and not engine.inbox:
                _wait(inbox, engine.inbox, spec.idle_wait_s)
        # Rank 0's last records reach the pipe before the goodbye that tells the controller to stop reading.
        records.close()
        records.join_thread()
        observer = engine.observer
        if observer is not None and hasattr(observer, "close"):
            observer.close()  # after the loop, never inside a round: a flush there would hold the peers' gather
        dropped = getattr(observer, "dropped", 0)
        events.put(RankExited(rank, rounds, group.gathers, dict(engine.timer.totals), dropped))
    except BaseException as exc:  # report anything, including a collective timeout, then exit non-zero
        events.put(RankFailed(rank, f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=6)))
        events.close()
        events.join_thread()
        os._exit(1)
    finally:
        if log is not None:
            log.close()
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.executor.close()  # frees DeepEP buffers and captured graphs
        if group is not None:
            with contextlib.suppress(Exception):
                group.close()
    events.close()
    events.join_thread()
    records.close()
    records.join_thread()


def load_object(path: str) -> Any:
    """The object `module:name` names (picklable references to factories across processes)."""
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        raise ValueError(f"expected 'module:name', got {path!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)


def _drain(source: Any, target: Any) -> None:
    while True:
        try:
            target.append(source.get_nowait())
        except queue.Empty:
            return


def _await_go(source: Any, target: Any) -> Go:
    """Hold round 0 until the driver says go; commands that come first wait in the engine's inbox."""
    while True:
        try:
            message = source.get(timeout=1.0)
        except queue.Empty:
            continue
        if isinstance(message, Go):
            return message
        target.append(message)


def _wait(source: Any, target: Any, seconds: float) -> None:
    """An idle group sleeps briefly, waking as soon as a command arrives."""
    try:
        target.append(source.get(timeout=seconds))
    except queue.Empty:
        return


class RankFailure(RuntimeError):
    """A rank process failed or died; the message is one line naming the rank, `detail` the traceback."""

    def __init__(self, rank: int, error: str, detail: str = "") -> None:
        super().__init__(f"rank {rank} failed: {error}")
        self.rank = rank
        self.detail = detail


def note_start(message: RankMessage, ready: set[int], backlog: list[RankMessage]) -> None:
    """Sort a message read while the ranks start: a failure raises, a ready rank is noted, the rest kept."""
    if isinstance(message, RankFailed):
        raise RankFailure(message.rank, message.error, message.detail)
    if isinstance(message, RankReady):
        ready.add(message.rank)
    else:
        backlog.append(message)


class ProcessDriver:
    """Spawns and supervises the rank processes of one group (or of one node's share of it: `ranks`).

    `init_method` is how the ranks meet (default: a fresh `tcp://127.0.0.1` port, one node).
    `clock_origin` is the `perf_counter` value the ranks' wall clocks count from (default: now).
    """

    def __init__(
        self,
        args: ServerArgs,
        *,
        max_rounds: int | None = None,
        vote_log_dir: str | None = None,
        record_queue_size: int = 8192,
        idle_wait_s: float = 0.002,
        profile_phases: bool = False,
        observer: str | None = None,
        observer_kwargs: dict[str, Any] | None = None,
        ranks: Sequence[int] | None = None,
        init_method: str | None = None,
        clock_origin: float | None = None,
        first_local_rank: int = 0,
    ) -> None:
        import torch.multiprocessing as mp

        self.ranks = list(range(args.dp_size) if ranks is None else ranks)
        if not self.ranks or any(not 0 <= rank < args.dp_size for rank in self.ranks):
            raise ValueError(f"ranks {self.ranks} are not ranks of a --dp-size {args.dp_size} group")
        cpus = os.cpu_count() or 1
        if len(self.ranks) > max(64, 8 * cpus):
            raise ValueError(
                f"--dp-size {len(self.ranks)} is more rank processes than this machine can host "
                f"({cpus} CPUs; at most {max(64, 8 * cpus)})"
            )
        self.args = args
        self.first_local_rank = first_local_rank  # torchrun's LOCAL_RANK: the GPU of this driver's first rank
        self.clock_origin = time.perf_counter() if clock_origin is None else clock_origin
        self._ctx = mp.get_context("spawn")
        backend = "nccl" if args.device == "cuda" else "gloo"
        self.spec = LaunchSpec(
            args=args,
            init_method=init_method or f"tcp://127.0.0.1:{free_port()}",
            backend=backend,
            max_rounds=max_rounds,
            vote_log_dir=vote_log_dir,
            idle_wait_s=idle_wait_s,
            profile_phases=profile_phases,
            clock_origin=self.clock_origin,
            observer=observer,
            observer_kwargs=observer_kwargs or {},
            controller_pid=os.getpid(),
        )
        self.inboxes = {rank: self._ctx.Queue() for rank in self.ranks}
        self.events = self._ctx.Queue()
        self.records = self._ctx.Queue(maxsize=record_queue_size)
        self.records_dropped = self._ctx.Value("q", 0)
        self.processes: list[Any] = []
        self.exited: set[int] = set()

    def start(self, ready_timeout_s: float = 180.0, *, go: bool = True) -> list[RankMessage]:
        """Spawn every rank and wait until all joined the group; returns messages read meanwhile.

        With `go` the ranks then start their rounds; without, whoever drives them calls `go()` (after
        queueing what round 0 must already see).
        """
        self.launch()
        backlog = self.wait_ready(ready_timeout_s)
        if go:
            self.go()
        return backlog

    def launch(self) -> None:
        """Spawn the rank processes (from the thread that outlives them: see `die_with_parent`)."""
        for local_rank, rank in enumerate(self.ranks, start=self.first_local_rank):
            process = self._ctx.Process(
                target=rank_main,
                args=(rank, self.spec, self.inboxes[rank], self.events, self.records, self.records_dropped, local_rank),
                name=f"prefill-gate-rank{rank}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)

    def wait_ready(self, ready_timeout_s: float = 180.0) -> list[RankMessage]:
        """Wait until every rank joined the group and built its engine; returns other messages read."""
        ready: set[int] = set()
        backlog: list[RankMessage] = []
        deadline = time.monotonic() + ready_timeout_s
        while len(ready) < len(self.ranks):
            self.raise_if_failed()
            try:
                message = self.events.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RankFailure(min(set(self.ranks) - ready), "did not start in time") from None
                continue
            note_start(message, ready, backlog)
        return backlog

    def go(self, clock_origin: float | None = None) -> None:
        """Let every rank start round 0 (see `Go`)."""
        for inbox in self.inboxes.values():
            inbox.put(Go(clock_origin))

    def send(self, rank: int, command: Command) -> None:
        """Queue a command for `rank`'s next intake."""
        self.inboxes[rank].put(command)

    def propose(self, epoch: int, delay: PrefillDelay | None) -> None:
        """Hand a validated config change to rank 0 (G1)."""
        self.send(0, ProposeConfig(epoch, delay))  # rank 0 is always local: on node 0

    def request_stop(self) -> None:
        """Every rank stops after the round in which rank 0 publishes the stop."""
        self.send(0, Stop())

    def poll_events(self, timeout_s: float = 0.0) -> list[RankMessage]:
        """Messages from the ranks; waits up to `timeout_s` for the first one."""
        out: list[RankMessage] = []
        try:
            out.append(self.events.get(timeout=timeout_s) if timeout_s > 0 else self.events.get_nowait())
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                break
        for message in out:
            if isinstance(message, RankExited):
                self.exited.add(message.rank)
        return out

    def poll_records(self, limit: int = 100_000) -> list[RoundRecord]:
        """Round records published by rank 0 since the last call."""
        out: list[RoundRecord] = []
        while len(out) < limit:
            try:
                out.append(self.records.get_nowait())
            except queue.Empty:
                break
        return out

    def raise_if_failed(self) -> None:
        """Raise RankFailure naming the first rank process that died with a non-zero code."""
        for rank, process in zip(self.ranks, self.processes, strict=False):
            code = process.exitcode
            if code not in (None, 0):
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                raise RankFailure(rank, f"process {process.pid} ended ({how})")

    def alive(self) -> bool:
        """Whether any rank process still runs."""
        return any(process.is_alive() for process in self.processes)

    def join(self, timeout_s: float) -> bool:
        """Wait for every rank to exit; True when all did."""
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        return not self.alive()

    def terminate(self) -> None:
        """Kill every rank process that is still alive and reap them all."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(5)
        for q in (*self.inboxes.values(), self.events, self.records):
            q.cancel_join_thread()
            q.close()
