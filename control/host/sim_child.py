"""The lockstep simulator in a child process of its own, behind the same `Backend` interface.

`SimBackend` steps the simulator in a thread of the controller's process, so the engine and the gRPC
loop share one interpreter lock: every stream write takes time from the engine. Here the same
`SimBackend` runs in the main thread of a spawned child process, and the controller talks to it over
two queues:

- commands (submit, abort, propose, stop) go down one queue; a small thread of the child hands them to
  the simulator, which applies them between rounds, as before;
- what the engine produced comes back in batches (about RELAY_INTERVAL_S of rounds each), with the
  engine's clock and its drop count.

The price is the hand-off: pickling the batches (rows pickle as plain tuples to keep it small) and the
queue's feeder thread. Measured once at 8 ranks on the shared 2-CPU machine: about 1.1 ms of the
child's CPU per round against about 0.7 ms for the simulator alone, plus about 0.4 ms of the
controller's for unpickling and the pump.

The engine never waits for the controller: request events always travel (a request is never lost),
but round records beyond `record_queue_size` in flight are dropped in the child and counted, exactly
as `SimBackend` drops at its own hand-off. A child that fails reports its error; a child that dies
(killed, out of memory) is noticed at the next poll: either way `poll` raises `RankFailure`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from control.host.backends import Feeder, Polled, SimBackend
from engine.config import PrefillDelay, ServerArgs
from engine.drivers.lifeline import die_with_parent
from engine.drivers.procs import RankFailure
from engine.executor.presets import preset_named
from engine.request import RequestSpec

# What the engine produced leaves the child in batches of about this many seconds of rounds, so that the
# hand-off costs the engine little per round.
RELAY_INTERVAL_S = 0.01


@dataclass(frozen=True)
class _Ready:
    """The child built the engine and started it; whether its rank observers left the rounds only a
    tracing rule picks to the controller (`leave_rule_rounds_to_controller`)."""

    rule_rounds_to_controller: bool = False


@dataclass(frozen=True)
class _Batch:
    """What the engine produced since the previous batch, the clock after it, and drops so far."""

    polled: Polled
    now: float
    records_dropped: int


@dataclass(frozen=True)
class _Failed:
    """The simulator raised: one line, and the traceback."""

    error: str
    detail: str = ""


@dataclass(frozen=True)
class _ChildSpec:
    args: ServerArgs
    feeder: Feeder | None
    pace: float | None
    max_rounds: int | None
    observer: str | None
    observer_kwargs: dict[str, Any] = field(default_factory=dict)
    record_queue_size: int = 8192
    parent_pid: int = 0


class _Forwarder:
    """The simulator's sink in the child: rounds collect into a batch that leaves every RELAY_INTERVAL_S
    (or when the run stops). Runs in the engine's own thread, so nothing else contends for its lock;
    pickling and the pipe are the queue's feeder thread's work."""

    def __init__(self, backend: SimBackend, out: Any, received: Any, bound: int) -> None:
        self.backend = backend
        self.out = out
        self.received = received  # records the controller took so far (only the controller writes it)
        self.sent = 0  # records put on the queue so far (only this forwarder counts them)
        self.bound = bound
        self.pending = Polled()
        self.sent_at = time.monotonic()
        self.dropped = 0

    def __call__(self, polled: Polled) -> None:
        self.pending.add(polled)
        now = time.monotonic()
        if polled.stopped or now - self.sent_at >= RELAY_INTERVAL_S:
            self.flush()
            self.sent_at = now

    def flush(self) -> None:
        batch, self.pending = self.pending, Polled()
        # Beyond the bound the controller is behind: drop records, count them. Each counter has one writer,
        # so the engine never waits for a lock the controller's process holds.
        room = max(0, self.bound - (self.sent - self.received.value))
        if len(batch.records) > room:
            self.dropped += len(batch.records) - room
            del batch.records[room:]
        self.sent += len(batch.records)
        if batch.records or batch.events or batch.itl or batch.submitted or batch.stopped:
            self.out.put(_Batch(batch, self.backend.now(), self.dropped))


def _relay_commands(backend: SimBackend, commands: Any) -> None:
    """Thread body: hand the controller's commands to the simulator, which applies them between rounds."""
    while True:
        name, *arguments = commands.get()
        if name == "close":
            backend.close()
            return
        getattr(backend, name)(*arguments)


def _leave_rule_rounds_to_controller(backend: SimBackend) -> bool:
    """Hand the rounds only a tracing rule picks to the controller, which sees every round's record and
    decides every round anyway (its roots): the simulated ranks' process then pays no pass over the rows
    per round for it. Only when every rank's observer can (the tracer's); True when they did."""
    observers = [engine.observer for engine in backend.driver.engines]
    hands = [getattr(observer, "leave_rule_rounds_to_controller", None) for observer in observers]
    if not observers or any(hand is None for hand in hands):
        return False
    return all([hand() for hand in hands])  # type: ignore[misc]


def _child_main(spec: _ChildSpec, commands: Any, out: Any, received: Any) -> None:
    """Body of the child: the simulator in this process's main thread until it stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller turns Ctrl-C into an agreed stop
    die_with_parent(spec.parent_pid)
    try:
        forwarder: _Forwarder | None = None
        backend = SimBackend(
            spec.args,
            spec.feeder,
            pace=spec.pace,
            max_rounds=spec.max_rounds,
            observer=spec.observer,
            observer_kwargs=spec.observer_kwargs,
            record_queue_size=2**62,  # the bound is the forwarder's, on records in flight to the controller
            sink=lambda polled: forwarder(polled),  # type: ignore[misc]
            owns_observers=True,
        )
        forwarder = _Forwarder(backend, out, received, spec.record_queue_size)
        threading.Thread(target=_relay_commands, args=(backend, commands), name="sim-commands", daemon=True).start()
        out.put(_Ready(_leave_rule_rounds_to_controller(backend)))
        backend.run()
        backend.poll()  # raises RankFailure when the simulator's loop failed
    except BaseException as exc:  # reported to the controller, which raises it as a RankFailure
        out.put(_Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=8)))
    finally:
        out.close()
        out.join_thread()


class SimProcessBackend:
    """`SimBackend` in a spawned child process: the engine does not share the controller's interpreter lock."""

    def __init__(
        self,
        args: ServerArgs,
        feeder: Feeder | None = None,
        *,
        pace: float | None = None,
        max_rounds: int | None = None,
        observer: str | None = None,
        observer_kwargs: dict[str, Any] | None = None,
        record_queue_size: int = 8192,
    ) -> None:
        preset_named(args.sim_preset)  # a bad preset is a usage error here, not a failure of the child
        self.args = args
        self.dp_size = args.dp_size
        self.origin = 0.0  # the virtual clock starts with the run
        # The child's tracer traces only the rounds a rate picks; the controller's the rules' (see `_Ready`).
        self.rule_rounds_to_controller = False
        context = mp.get_context("spawn")
        self._commands = context.Queue()
        self._out = context.Queue()
        self._received = context.RawValue("q", 0)  # records taken off the queue; the child reads it, lock-free
        spec = _ChildSpec(
            args, feeder, pace, max_rounds, observer, observer_kwargs or {}, record_queue_size, os.getpid()
        )
        self._process = context.Process(
            target=_child_main,
            args=(spec, self._commands, self._out, self._received),
            name="prefill-gate-sim",
            daemon=True,
        )
        self._inbox: deque[_Batch | _Failed] = deque()
        self._receiver = threading.Thread(target=self._receive, name="sim-child-receiver", daemon=True)
        self._now = 0.0
        self._dropped = 0
        self._stopped = False
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The child's process id (None before start)."""
        return self._process.pid

    def start(self, ready_timeout_s: float = 120.0) -> None:
        """Spawn the child and wait until its engine runs; raises RankFailure when it cannot start."""
        self._process.start()
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                message = self._out.get(timeout=0.2)
                break
            except queue.Empty:
                code = self._process.exitcode
                if code is not None or time.monotonic() > deadline:
                    self.close()
                    why = f"ended with code {code}" if code is not None else "did not start in time"
                    raise RankFailure(0, f"the simulator process {why}") from None
        if isinstance(message, _Failed):
            self.close()
            raise RankFailure(0, f"the simulator process failed: {message.error}", message.detail)
        self.rule_rounds_to_controller = message.rule_rounds_to_controller
        self._receiver.start()

    def _receive(self) -> None:
        """Thread body: take the child's batches off the pipe as they come. A controller whose loop is
        busy (serving many streams) must not leave the pipe full: the child's engine would pay for it."""
        while not self._closed:
            try:
                message = self._out.get(timeout=0.2)
            except queue.Empty:
                continue
            except (EOFError, OSError, ValueError):  # closed under us
                return
            self._inbox.append(message)
            if isinstance(message, _Failed) or message.polled.stopped:
                return

    def submit(self, rank: int, spec: RequestSpec) -> None:
        self._send("submit", rank, spec)

    def abort(self, rank: int, rid: str) -> None:
        self._send("abort", rank, rid)

    def propose(self, epoch: int, delay: PrefillDelay | None) -> None:
        self._send("propose", epoch, delay)

    def request_stop(self) -> None:
        self._send("request_stop")

    def now(self) -> float:
        """The engine's clock as of the last batch (virtual seconds)."""
        return self._now

    def records_dropped(self) -> int:
        return self._dropped

    def poll(self) -> Polled:
        merged = Polled()
        received = 0
        while self._inbox:
            message = self._inbox.popleft()
            if isinstance(message, _Failed):
                raise RankFailure(0, f"the simulator process failed: {message.error}", message.detail)
            merged.add(message.polled)
            received += len(message.polled.records)
            self._now = message.now
            self._dropped = message.records_dropped
        if received:
            self._received.value += received
        self._stopped |= merged.stopped
        if not merged.stopped and not self._stopped and not self._closed:
            code = self._process.exitcode
            if code is not None:  # it died without saying goodbye
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                raise RankFailure(0, f"the simulator process {self._process.pid} ended ({how})")
        return merged

    def close(self) -> None:
        """Stop the child (at once, without an agreed last round) and reap it."""
        if self._closed:
            return
        self._closed = True
        if self._receiver.is_alive():
            self._receiver.join(1)
        if self._process.is_alive():
            self._send("close")
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        for channel in (self._commands, self._out):
            channel.cancel_join_thread()
            channel.close()

    def _send(self, *command: object) -> None:
        if not self._closed:
            self._commands.put(command)
