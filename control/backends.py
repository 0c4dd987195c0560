"""How the controller runs the engine: rank processes (torch executor) or the lockstep simulator.

Both backends take commands (submit, abort, propose, stop) and hand back, on `poll`, the round
records rank 0 published and the request events of every rank. Whoever owns the engine's clock
feeds the workload: the simulator's thread on virtual time (so a run is deterministic), the
controller's loop on wall time for processes.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.config import PrefillDelay, ServerArgs
from engine.lockstep import LockstepDriver
from engine.procs import ProcessDriver, RankExited, RankFailed, RankFailure, RankRound, load_object
from engine.record import RoundRecord
from engine.request import Abort, Finished, ProposeConfig, Refused, RequestEvent, RequestSpec, Stop, Submit


class Feeder(Protocol):
    """The workload seen by a backend (`engine.workload.Workload` is one): requests due by `now`,
    routed with the ranks' loads; finishes feed closed loops."""

    def due(self, now: float, loads: list[int]) -> list[tuple[int, RequestSpec]]: ...

    def on_finished(self, rid: str, now: float) -> None: ...

    @property
    def done(self) -> bool: ...


@dataclass
class Polled:
    """What a backend produced since the previous poll."""

    records: list[RoundRecord] = field(default_factory=list)
    events: list[RequestEvent] = field(default_factory=list)
    itl: list[tuple[float, int]] = field(default_factory=list)
    submitted: list[tuple[int, RequestSpec]] = field(default_factory=list)  # fed from the workload
    stopped: bool = False  # every rank left its loop


def loads_of(record: RoundRecord | None, size: int) -> list[int]:
    """Per-rank load for routing: waiting plus running requests of the latest rows."""
    if record is None:
        return [0] * size
    return [row.waiting_prompts + row.running for row in record.rows]


class Backend(Protocol):
    """The engine as the controller drives it."""

    dp_size: int

    def start(self) -> None: ...
    def submit(self, rank: int, spec: RequestSpec) -> None: ...
    def abort(self, rank: int, rid: str) -> None: ...
    def propose(self, epoch: int, delay: PrefillDelay | None) -> None: ...
    def request_stop(self) -> None: ...
    def poll(self) -> Polled: ...
    def records_dropped(self) -> int: ...
    def now(self) -> float: ...
    def close(self) -> None: ...


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
    ) -> None:
        self.args = args
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
        self._thread = threading.Thread(target=self._loop, name="prefill-gate-sim", daemon=True)
        self._stop_now = threading.Event()
        self._error: BaseException | None = None
        self._latest: RoundRecord | None = None

    def start(self) -> None:
        self._thread.start()

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

    def records_dropped(self) -> int:
        return 0  # the in-process hand-off is an unbounded queue drained every poll

    def poll(self) -> Polled:
        if self._error is not None:
            raise RankFailure(0, f"simulator thread failed: {self._error!r}") from self._error
        merged = Polled()
        while True:
            try:
                part = self._out.get_nowait()
            except queue.Empty:
                return merged
            merged.records += part.records
            merged.events += part.events
            merged.itl += part.itl
            merged.submitted += part.submitted
            merged.stopped |= part.stopped

    def close(self) -> None:
        self._stop_now.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _loop(self) -> None:
        try:
            started = time.perf_counter()
            rounds = 0
            while not self._stop_now.is_set():
                while True:
                    try:
                        self._commands.get_nowait()()
                    except queue.Empty:
                        break
                polled = Polled()
                if self.feeder is not None:
                    for rank, spec in self.feeder.due(self.driver.now(), loads_of(self._latest, self.dp_size)):
                        self.driver.submit(rank, spec)
                        polled.submitted.append((rank, spec))
                outcomes = self.driver.step()
                rounds += 1
                for outcome in outcomes:
                    polled.events += outcome.events
                    polled.itl += outcome.itl
                record = outcomes[0].record
                if record is not None:
                    self._latest = record
                    polled.records.append(record)
                if self.feeder is not None:
                    for event in polled.events:
                        if isinstance(event, Finished | Refused):
                            self.feeder.on_finished(event.rid, self.driver.now())
                polled.stopped = outcomes[0].stop or (self.max_rounds is not None and rounds >= self.max_rounds)
                self._out.put(polled)
                if polled.stopped:
                    return
                if self.pace:
                    ahead = self.driver.now() / self.pace - (time.perf_counter() - started)
                    if ahead > 0:
                        time.sleep(ahead)
        except BaseException as exc:  # surfaced to the controller on its next poll
            self._error = exc
            self._out.put(Polled(stopped=True))


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
    ) -> None:
        self.args = args
        self.dp_size = args.dp_size
        self.feeder = feeder
        self.driver = ProcessDriver(
            args,
            max_rounds=max_rounds,
            vote_log_dir=vote_log_dir,
            observer=observer,
            observer_kwargs=observer_kwargs,
        )
        self._latest: RoundRecord | None = None
        self._exited: set[int] = set()
        self._workload_origin = 0.0

    def start(self) -> None:
        self.driver.start()
        # The workload's time starts when the ranks can serve, not when their spawn began.
        self._workload_origin = self.now()

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
        self.driver.send(0, ProposeConfig(epoch, delay))

    def request_stop(self) -> None:
        self.driver.send(0, Stop())

    def records_dropped(self) -> int:
        return int(self.driver.records_dropped.value)

    def poll(self) -> Polled:
        polled = Polled()
        polled.records = self.driver.poll_records()
        if polled.records:
            self._latest = polled.records[-1]
        for message in self.driver.poll_events():
            if isinstance(message, RankRound):
                polled.events += message.events
                polled.itl += message.itl
            elif isinstance(message, RankFailed):
                raise RankFailure(message.rank, message.error)
            elif isinstance(message, RankExited):
                self._exited.add(message.rank)
        self.driver.raise_if_failed()
        if self.feeder is not None:
            origin = self._workload_origin
            now = self.now() - origin
            for event in polled.events:
                if isinstance(event, Finished | Refused):
                    self.feeder.on_finished(event.rid, now)
            for rank, spec in self.feeder.due(now, loads_of(self._latest, self.dp_size)):
                spec = dataclasses.replace(spec, arrival=spec.arrival + origin)  # onto the engine's clock
                self.submit(rank, spec)
                polled.submitted.append((rank, spec))
        polled.stopped = len(self._exited) == self.dp_size
        return polled

    def close(self) -> None:
        self.driver.terminate()
