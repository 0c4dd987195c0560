"""How the controller runs the engine: rank processes (torch executor) or the lockstep simulator.

Both backends take commands (submit, abort, propose, stop) and hand back, on `poll`, the round
records rank 0 published and the request events of every rank. Whoever owns the engine's clock
feeds the workload: the simulator's thread on virtual time (so a run is deterministic), the
controller's loop on wall time for processes.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.config import PrefillDelay, ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.drivers.procs import ProcessDriver, RankExited, RankFailed, RankFailure, RankRound, load_object
from engine.record import RoundRecord
from engine.request import Abort, Finished, Refused, RequestEvent, RequestSpec, Submit


class Feeder(Protocol):
    """The workload seen by a backend (`workloads.Workload` is one): requests due by `now`,
    routed with the ranks' loads; finishes feed closed loops."""

    def due(self, now: float, loads: list[int]) -> list[tuple[int, RequestSpec]]: ...

    def on_finished(self, rid: str, now: float) -> None: ...

    @property
    def done(self) -> bool: ...

    @property
    def next_arrival(self) -> float:
        """Time of the next request; math.inf when none is scheduled now."""
        ...


@dataclass
class Polled:
    """What a backend produced since the previous poll."""

    records: list[RoundRecord] = field(default_factory=list)
    events: list[RequestEvent] = field(default_factory=list)
    itl: list[tuple[float, int]] = field(default_factory=list)
    submitted: list[tuple[int, RequestSpec]] = field(default_factory=list)  # fed from the workload
    workload_done: bool = False  # the workload will issue nothing more (as of these submissions)
    stopped: bool = False  # every rank left its loop
    # With the last poll of a run: each rank observer's final count of what it dropped, after it drained
    # its exports (None: not known to be final). How a simulator in another process reports it.
    observer_dropped: dict[int, int] | None = None

    def add(self, later: Polled) -> None:
        """Append what a later poll produced."""
        self.records += later.records
        self.events += later.events
        self.itl += later.itl
        self.submitted += later.submitted
        self.stopped |= later.stopped
        self.workload_done = later.workload_done
        if later.observer_dropped is not None:
            self.observer_dropped = later.observer_dropped


def loads_of(record: RoundRecord | None, size: int) -> list[int]:
    """Per-rank load for routing: waiting plus running requests of the latest rows."""
    if record is None:
        return [0] * size
    return [row.waiting_prompts + row.running for row in record.rows]


class Backend(Protocol):
    """The engine as the controller drives it."""

    dp_size: int
    origin: float  # engine-clock time at which the run (and its workload) started

    def start(self) -> None: ...
    def submit(self, rank: int, spec: RequestSpec) -> None: ...
    def abort(self, rank: int, rid: str) -> None: ...
    def propose(self, epoch: int, delay: PrefillDelay | None) -> None: ...
    def request_stop(self) -> None: ...
    def poll(self) -> Polled: ...
    def records_dropped(self) -> int: ...
    def now(self) -> float: ...
    def close(self) -> None: ...


# An idle paced group waits this long between rounds, as idle rank processes do (`ProcessDriver`).
IDLE_WAIT_S = 0.002


class SimBackend:
    """The lockstep simulator stepped in a background thread on its virtual clock.

    With `pace` the thread sleeps so that virtual time runs at `pace` x wall time (for watching);
    without it the simulator runs as fast as it can. Commands from other threads go through a queue
    and are applied between rounds, so a round never sees half a command.
    """

    def __init__(
        self,
        args: ServerArgs,
        feeder: Feeder | None = None,
        *,
        pace: float | None = None,
        max_rounds: int | None = None,
        engine_factory: Callable | None = None,
        observer: str | None = None,
        observer_kwargs: dict[str, Any] | None = None,
        record_queue_size: int = 8192,
        sink: Callable[[Polled], None] | None = None,
        owns_observers: bool = False,
    ) -> None:
        self.args = args
        # The process ends with the run (sim_child.py): the last round closes the rank observers, as a rank
        # process does, so their counts are final even when the collector never answered.
        self.owns_observers = owns_observers
        self.dp_size = args.dp_size
        self.driver = LockstepDriver(args, engine_factory)
        if observer:  # the same "module:function" factory rank processes load
            make = load_object(observer)
            for engine in self.driver.engines:
                engine.observer = make(engine, **(observer_kwargs or {}))
        self.feeder = feeder
        self.pace = pace
        self.max_rounds = max_rounds
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._out: queue.SimpleQueue[Polled] = queue.SimpleQueue()
        self._put = sink or self._out.put  # each round's output: to `poll`, or to the sink (sim_child.py)
        self._thread = threading.Thread(target=self._loop, name="prefill-gate-sim", daemon=True)
        self._stop_now = threading.Event()
        self._error: BaseException | None = None
        self._latest: RoundRecord | None = None
        self.record_queue_size = record_queue_size
        self._records_lock = threading.Lock()
        self._records_waiting = 0
        self._records_dropped = 0
        self.origin = 0.0  # the virtual clock starts with the run

    def start(self) -> None:
        self._thread.start()

    def run(self) -> None:
        """Step the simulator in the calling thread until it stops (what `start` runs in a thread)."""
        self._loop()

    def submit(self, rank: int, spec: RequestSpec) -> None:
        self._commands.put(lambda: self.driver.submit(rank, spec))

    def abort(self, rank: int, rid: str) -> None:
        self._commands.put(lambda: self.driver.abort(rank, rid))

    def propose(self, epoch: int, delay: PrefillDelay | None) -> None:
        self._commands.put(lambda: self.driver.propose(epoch, delay))

    def request_stop(self) -> None:
        self._commands.put(self.driver.request_stop)

    def now(self) -> float:
        return self.driver.now()

    @property
    def observer_dropped(self) -> dict[int, int]:
        """Each rank's round observer's count of dropped items (in this process, so always current)."""
        return {e.rank: getattr(e.observer, "dropped", 0) for e in self.driver.engines if e.observer is not None}

    def records_dropped(self) -> int:
        with self._records_lock:
            return self._records_dropped

    def poll(self) -> Polled:
        if self._error is not None:
            raise RankFailure(0, f"simulator thread failed: {self._error!r}") from self._error
        merged = Polled()
        while True:
            try:
                part = self._out.get_nowait()
            except queue.Empty:
                break
            merged.add(part)
        with self._records_lock:
            self._records_waiting -= len(merged.records)
        return merged

    def close(self) -> None:
        self._stop_now.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _loop(self) -> None:
        try:
            started = time.perf_counter()
            rounds = 0
            while not self._stop_now.is_set():
                self._run_commands()
                outcomes, submitted = self.driver.step_with(self.feeder, loads_of(self._latest, self.dp_size))
                rounds += 1
                polled = Polled(submitted=submitted, workload_done=self.feeder is not None and self.feeder.done)
                for outcome in outcomes:
                    polled.events += outcome.events
                    polled.itl += outcome.itl
                record = outcomes[0].record
                if record is not None:
                    self._latest = record
                    self._hand_off(record, polled)
                polled.stopped = outcomes[0].stop or (self.max_rounds is not None and rounds >= self.max_rounds)
                if polled.stopped:
                    polled.observer_dropped = self._observers_final()
                self._put(polled)
                if polled.stopped:
                    return
                if self.driver.idle(outcomes):
                    self._idle(started)
                elif self.pace:
                    self._keep_pace(started)
            self._put(Polled(stopped=True))  # closed from outside: whoever polls learns it stopped
        except BaseException as exc:  # surfaced to the controller on its next poll
            self._error = exc
            self._put(Polled(stopped=True))

    def _observers_final(self) -> dict[int, int] | None:
        """After the last round: drain the rank observers' exports (bounded), then their counts are final;
        None when some export is still unanswered (then they are not). Observers this backend owns are
        closed instead (bounded: what is still queued counts as refused, an export in flight as
        unconfirmed), so their counts are always final."""
        observers = [e.observer for e in self.driver.engines if e.observer is not None]
        end = "close" if self.owns_observers else "flush"
        if not observers or not all(hasattr(o, end) for o in observers):
            return None
        drained = [getattr(o, end)() for o in observers]  # a close returns nothing: its counts are final
        if not self.owns_observers and not all(drained):
            return None
        return self.observer_dropped

    def _run_commands(self, wait_s: float = 0.0) -> None:
        """Apply queued commands between rounds; wait up to `wait_s` for the first."""
        try:
            command = self._commands.get(timeout=wait_s) if wait_s > 0 else self._commands.get_nowait()
        except queue.Empty:
            return
        command()
        while True:
            try:
                self._commands.get_nowait()()
            except queue.Empty:
                return

    def _hand_off(self, record: RoundRecord, polled: Polled) -> None:
        """Records wait for the controller in a bounded queue; beyond it they are dropped and counted."""
        with self._records_lock:
            if self._records_waiting >= self.record_queue_size:
                self._records_dropped += 1
                return
            self._records_waiting += 1
        polled.records.append(record)

    def _keep_pace(self, started: float) -> None:
        ahead = self.driver.now() / self.pace - (time.perf_counter() - started)
        if ahead > 0:
            time.sleep(ahead)

    def _idle(self, started: float) -> None:
        """Nothing runs and nothing is held: never spin idle rounds.

        Unpaced, virtual time jumps to the next arrival; with none scheduled the thread waits for a
        command. Paced, virtual time follows the wall clock (up to the next arrival) while it waits, so a
        request submitted later arrives at a sensible time.
        """
        target = self.feeder.next_arrival if self.feeder is not None else math.inf
        if not self.pace:
            if math.isfinite(target):
                self.driver.skip_to(target)
            else:
                self._run_commands(wait_s=0.05)
            return
        self.driver.skip_to(min(target, (time.perf_counter() - started) * self.pace))
        self._run_commands(wait_s=IDLE_WAIT_S)


class ProcessBackend:
    """One OS process per rank (`ProcessDriver`); the workload is fed here on wall time."""

    def __init__(
        self,
        args: ServerArgs,
        feeder: Feeder | None = None,
        *,
        max_rounds: int | None = None,
        vote_log_dir: str | None = None,
        observer: str | None = None,
        observer_kwargs: dict[str, Any] | None = None,
        driver: Any = None,  # a driver with ProcessDriver's interface (ranks on several nodes); default: one
    ) -> None:
        self.args = args
        self.dp_size = args.dp_size
        self.feeder = feeder
        self.driver = driver or ProcessDriver(
            args,
            max_rounds=max_rounds,
            vote_log_dir=vote_log_dir,
            observer=observer,
            observer_kwargs=observer_kwargs,
        )
        self._latest: RoundRecord | None = None
        self._exited: set[int] = set()
        self._pending = Polled()
        # Each exited rank's final count of what its round observer dropped (its last row precedes its flush).
        self.observer_dropped: dict[int, int] = {}
        self.origin = 0.0

    def start(self) -> None:
        self.driver.start(go=False)
        # The run (its workload, its --duration) starts when the ranks can serve, not when their spawn began.
        self.origin = self.now()
        # What is due at the start reaches round 0 on every rank (a run's start is then deterministic).
        self._feed(self._pending)
        self.driver.go()

    def now(self) -> float:
        if self.args.executor == "sim":
            # Simulated ranks run on virtual clocks: arrivals follow the latest round's clock.
            return self._latest.clock if self._latest is not None else 0.0
        # The ranks' wall clocks share this origin, so event times and arrivals compare directly.
        return time.perf_counter() - self.driver.clock_origin

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, in rank order."""
        return [process.pid for process in self.driver.processes]

    def submit(self, rank: int, spec: RequestSpec) -> None:
        self.driver.send(rank, Submit(spec))

    def abort(self, rank: int, rid: str) -> None:
        self.driver.send(rank, Abort(rid))

    def propose(self, epoch: int, delay: PrefillDelay | None) -> None:
        self.driver.propose(epoch, delay)

    def request_stop(self) -> None:
        self.driver.request_stop()

    def records_dropped(self) -> int:
        return int(self.driver.records_dropped.value)

    def poll(self) -> Polled:
        polled, self._pending = self._pending, Polled()
        polled.records = self.driver.poll_records()
        if polled.records:
            self._latest = polled.records[-1]
        for message in self.driver.poll_events():
            if isinstance(message, RankRound):
                polled.events += message.events
                polled.itl += message.itl
            elif isinstance(message, RankFailed):
                raise RankFailure(message.rank, message.error, message.detail)
            elif isinstance(message, RankExited):
                self._exited.add(message.rank)
                self.observer_dropped[message.rank] = message.observer_dropped
        self.driver.raise_if_failed()
        self._feed(polled)
        polled.stopped = len(self._exited) == self.dp_size
        if polled.stopped:
            # Every rank said goodbye; wait for the processes so that rank 0's last records are flushed.
            self.driver.join(10)
            polled.records += self.driver.poll_records()
        return polled

    def _feed(self, polled: Polled) -> None:
        """Tell the workload what finished, submit what it has due now."""
        if self.feeder is None:
            return
        origin = self.origin
        now = self.now() - origin
        for event in polled.events:
            if isinstance(event, Finished | Refused):
                self.feeder.on_finished(event.rid, now)
        for rank, spec in self.feeder.due(now, loads_of(self._latest, self.dp_size)):
            spec = dataclasses.replace(spec, arrival=spec.arrival + origin)  # onto the engine's clock
            self.submit(rank, spec)
            polled.submitted.append((rank, spec))
        polled.workload_done = self.feeder.done

    def close(self) -> None:
        self.driver.terminate()
