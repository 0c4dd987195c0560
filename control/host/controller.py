"""The controller: drives one engine backend, keeps history and metrics, and serves the control plane.

Everything here runs on one asyncio loop (the gRPC server's). `pump` moves what the backend
produced into the history ring, the round hub (stream subscribers), the metrics, per-request streams
and any listeners (recorder, tracing). Admin changes are validated exactly like startup (C3) on a
candidate copy of the server arguments and handed to rank 0 (G1); the caller is answered once the
round record shows every rank adopted the new epoch.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from control.host.backends import Backend, Polled, loads_of
from control.plane.hub import RoundHub
from engine.config import ANY_FLAG, ATTEMPT_FLAG, MAX_INTERVAL, PrefillDelay, ServerArgs
from engine.metrics import RunMetrics, Summary
from engine.record import RoundRecord
from engine.request import (
    Admitted,
    Finished,
    FinishReason,
    FirstToken,
    Refused,
    RequestError,
    RequestEvent,
    RequestSpec,
    Tokens,
)
from prefill_gate.convert import Origin

# Proto field names of the admin request, by the flag a ServerArgs error names.
FIELD_OF_FLAG = {ATTEMPT_FLAG: "attempt_interval", ANY_FLAG: "any_interval"}
_FLAG_PATTERN = re.compile("|".join(re.escape(flag) + r"(?![-\w])" for flag in FIELD_OF_FLAG))

Violations = list[tuple[str, str]]

# Who made a config: the startup flags, a human (ctl, console, grpcurl) unless the caller names itself.
LAUNCH, OPERATOR = "launch", "operator"
MAX_CHANGED_BY, MAX_REASON = 64, 512


class ConfigRejected(ValueError):
    """An interval change failed validation; `violations` are (field, description) pairs."""

    def __init__(self, message: str, violations: Violations) -> None:
        super().__init__(message)
        self.violations = violations


class RequestRejected(RequestError):
    """A submission no rank could serve; `violations` are (SubmitRequest field, description) pairs."""

    def __init__(self, violations: Violations) -> None:
        super().__init__("; ".join(f"{name}: {text}" for name, text in violations))
        self.violations = violations


class DuplicateRequest(RequestError):
    """A live request already has this id."""


class StaleEpoch(RuntimeError):
    """The caller's expected epoch is not the latest accepted one."""

    def __init__(self, expected: int, current: int) -> None:
        super().__init__(f"expected config epoch {expected}, but the latest accepted epoch is {current}")
        self.expected = expected
        self.current = current


class Draining(RuntimeError):
    """The controller is stopping and takes no new work."""


@dataclass(frozen=True)
class ConfigView:
    """The gate configuration as the control plane reports it."""

    epoch: int
    delay: PrefillDelay | None
    policy: str
    origin: Origin | None = None  # who made it and why (None: not known to this controller)


@dataclass(frozen=True)
class IntervalUpdate:
    """An accepted (or validated-only) interval change."""

    config: ConfigView
    adopted_round: int
    validated_only: bool


@dataclass
class RequestStream:
    """Events of one submitted request, for whoever streams them to a client."""

    rid: str
    rank: int
    arrival: float
    queue: asyncio.Queue[RequestEvent] = field(default_factory=asyncio.Queue)
    admitted: Admitted | None = None
    first_token: FirstToken | None = None


Listener = Callable[[RoundRecord], None]


class Controller:
    """One run: the backend, its history, its metrics, its admin state."""

    def __init__(
        self,
        args: ServerArgs,
        backend: Backend,
        *,
        run_id: str | None = None,
        history: int = 4096,
        stall_after_s: float = 5.0,
        duration: float | None = None,
        stop_when_idle: bool = True,
    ) -> None:
        self.args = args
        self.backend = backend
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.hub = RoundHub(self.run_id, history, origin_of=self.origin_of)
        self.metrics = RunMetrics(max_samples=500_000)  # a server runs for days: percentiles of the recent past
        self.stall_after_s = stall_after_s
        self.duration = duration
        self.stop_when_idle = stop_when_idle
        self.state = "starting"
        self.listeners: list[Listener] = []
        self.latest: RoundRecord | None = None
        self.policy = "gate" if args.prefill_decode_interval is None else "local-interval"
        self._origins: dict[int, Origin] = {0: Origin(LAUNCH, _launch_reason(args.prefill_delay, self.policy))}
        self.config = ConfigView(0, args.prefill_delay, self.policy, self._origins[0])
        self._ttft: list[float] = []  # latency samples not yet attached to a record
        self._itl: list[tuple[float, int]] = []
        self._accepted_epoch = 0
        self._accepted_args = args
        self._waiters: dict[int, asyncio.Future[int]] = {}
        self._streams: dict[str, RequestStream] = {}
        self._live: dict[str, int] = {}  # request id -> rank, until it ends
        self._ids = itertools.count()
        self._last_record_wall = 0.0
        self._started_wall = time.monotonic()
        self._stop_requested = False
        self._killed = False
        self._workload_done = False
        self.draining = asyncio.Event()  # set by request_stop: health flips at once, not at the next poll
        self.stopped = asyncio.Event()
        self.recent_rates: deque[tuple[float, int]] = deque(maxlen=64)

    # -- the pump ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the backend (spawns rank processes or the simulator thread)."""
        self.backend.start()
        self._started_wall = time.monotonic()

    async def run(self, poll_interval_s: float = 0.002) -> None:
        """Pump until every rank stopped; the backend is closed on the way out."""
        try:
            while not self._killed:
                polled = self.pump()
                if polled.stopped:
                    self.pump()  # the rank processes' last records may trail their exit notices
                    break
                self._check_bounds()
                await asyncio.sleep(poll_interval_s if not polled.records else 0)
        finally:
            self.state = "stopped"
            self.backend.close()
            for waiter in self._waiters.values():
                if not waiter.done():
                    waiter.set_exception(Draining("the engine stopped before adopting the change"))
            now = self.backend.now()
            for stream in self._streams.values():  # their ranks are gone: end every open stream
                stream.queue.put_nowait(Finished(stream.rid, stream.rank, -1, now, FinishReason.ABORT, 0))
            self.stopped.set()

    def pump(self) -> Polled:
        """Move one poll's worth of engine output to every consumer."""
        polled = self.backend.poll()
        self._workload_done = polled.workload_done
        for rank, spec in polled.submitted:
            self.metrics.add_submitted(spec)
            self._live[spec.rid] = rank
        if polled.events:
            self._ttft += self._ttfts(polled.events)
            self.metrics.add_events(polled.events)
            self._route_events(polled.events)
        if polled.itl:
            self.metrics.add_itl(polled.itl)
            self._itl += polled.itl
        if polled.records:
            # The poll's samples ride its last record: they came at or before that round.
            *earlier, last = polled.records
            for record in earlier:
                self._on_record(record)
            self._on_record(replace(last, ttft=tuple(self._ttft), itl=tuple(self._itl)))
            self._ttft, self._itl = [], []
        return polled

    def _ttfts(self, events: list[RequestEvent]) -> list[float]:
        """Time to first token of the first tokens among `events` (requests whose arrival is known)."""
        out = []
        for event in events:
            if isinstance(event, FirstToken) and (arrival := self.metrics.arrival(event.rid)) is not None:
                out.append(event.time - arrival)
        return out

    def origin_of(self, epoch: int) -> Origin | None:
        """Who made config `epoch` and why (None for an epoch this controller never accepted)."""
        return self._origins.get(epoch)

    def _on_record(self, record: RoundRecord) -> None:
        if self.state == "starting":
            self.state = "serving"
        self.latest = record
        self.policy = record.policy
        self._last_record_wall = time.monotonic()
        self.metrics.add_record(record)
        self.hub.publish(record)
        self._follow_config(record)
        for listener in self.listeners:
            listener(record)

    def _follow_config(self, record: RoundRecord) -> None:
        """The config in force, from any record (G2), so a dropped adoption record cannot leave a caller
        of `update_intervals` waiting: the adoption record names its round; otherwise the first record
        decided under the new epoch shows it was adopted by the round before."""
        if record.adopted_epoch:
            epoch, delay, adopted_round = record.adopted_epoch, _delay_of(record.rows[0]), record.round
        elif record.config_epoch > self.config.epoch:
            delay = PrefillDelay(record.attempt_interval, record.any_interval) if record.enabled else None
            epoch, adopted_round = record.config_epoch, record.round - 1
        else:
            return
        self.config = ConfigView(epoch, delay, record.policy, self._origins.get(epoch))
        for waiting in [e for e in self._waiters if e <= epoch]:
            waiter = self._waiters.pop(waiting)
            if not waiter.done():
                waiter.set_result(adopted_round)

    def _route_events(self, events: list[RequestEvent]) -> None:
        for event in events:
            stream = self._streams.get(event.rid)
            if isinstance(event, Finished | Refused):
                self._live.pop(event.rid, None)
            if stream is None:
                continue
            if isinstance(event, Admitted):
                stream.admitted = event
            elif isinstance(event, FirstToken):
                stream.first_token = event
            if isinstance(event, Admitted | FirstToken | Tokens | Finished | Refused):
                stream.queue.put_nowait(event)
            if isinstance(event, Finished | Refused):
                del self._streams[event.rid]

    def _check_bounds(self) -> None:
        if self._stop_requested:
            return
        if self.duration is not None and self.backend.now() - self.backend.origin >= self.duration:
            self.request_stop()
        # `workload_done` comes with the submissions it covers, so a request issued but not yet polled
        # can never look finished.
        if self.stop_when_idle and self._workload_done and not self._live and self.latest:
            self.request_stop()

    def kill(self) -> None:
        """Stop now, without the agreed last round: the ranks are killed and `run` returns."""
        self._killed = True
        self.backend.close()

    def request_stop(self) -> None:
        """Drain: take no new work, and have every rank stop after the same round (no-op once stopped)."""
        if self._stop_requested or self.state == "stopped":
            return
        self._stop_requested = True
        self.state = "draining"
        self.draining.set()
        self.backend.request_stop()

    # -- health and views --------------------------------------------------------------------------

    def serving(self) -> bool:
        """Rounds are happening: the first round came and the latest is recent."""
        if self.state != "serving":
            return False
        return time.monotonic() - self._last_record_wall <= self.stall_after_s

    def summary(self) -> Summary:
        """The run's figures so far."""
        return self.metrics.summary()

    def records_dropped(self) -> int:
        """Round records lost between rank 0 and this controller."""
        return self.backend.records_dropped()

    def progress_line(self) -> str:
        """One line for a terminal: round, rounds/s, windows, tokens/s."""
        record = self.latest
        if record is None:
            return f"{self.state}: waiting for the first round"
        now = time.monotonic()
        self.recent_rates.append((now, record.round))
        first_t, first_round = self.recent_rates[0]
        rate = (record.round - first_round) / (now - first_t) if now > first_t else 0.0
        s = self.summary()
        tps = f"{s.output_tokens_per_s:,.0f}" if s.output_tokens_per_s else "-"
        return (
            f"round {record.round:>8}  {rate:>8,.0f} rounds/s  windows ANY {s.windows_any} ALL {s.windows_all}  "
            f"tokens/s {tps}  done {s.requests_finished}/{s.requests_submitted}  [{self.state}]"
        )

    # -- admin -------------------------------------------------------------------------------------

    def validate_intervals(self, attempt: int | None, any_: int | None, *, disable: bool = False) -> ServerArgs:
        """A candidate copy of the arguments with the new intervals, validated like startup (C3).

        Each field's own range is checked first so that every bad field is named at once; the read of
        `prefill_delay` on the candidate stays the final word on the combination.
        """
        given = (("attempt_interval", attempt), ("any_interval", any_))
        if disable and (attempt is not None or any_ is not None):
            violations = [(name, "must be unset when disable is true") for name, v in given if v is not None]
            raise ConfigRejected("disable cannot be combined with intervals", violations)
        if not disable and attempt is None and any_ is None:
            raise ConfigRejected(
                "give attempt_interval and any_interval, or disable",
                [(name, "required unless disable is true") for name, _ in given],
            )
        out_of_range = [
            (name, f"must be an integer in [1, {MAX_INTERVAL}], got {value}")
            for name, value in given
            if value is not None and not 1 <= value <= MAX_INTERVAL
        ]
        if out_of_range:
            raise ConfigRejected("; ".join(f"{name} {text}" for name, text in out_of_range), out_of_range)
        try:
            candidate = self._accepted_args.replace(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)
            candidate.prefill_delay  # noqa: B018 - the read is the validation
        except ValueError as exc:
            message = str(exc)
            fields = sorted({FIELD_OF_FLAG[m.group(0)] for m in _FLAG_PATTERN.finditer(message)})
            raise ConfigRejected(message, [(name, message) for name in fields or ["attempt_interval"]]) from exc
        return candidate

    async def update_intervals(
        self,
        attempt: int | None,
        any_: int | None,
        *,
        disable: bool = False,
        expected_epoch: int | None = None,
        validate_only: bool = False,
        changed_by: str = "",
        reason: str = "",
    ) -> IntervalUpdate:
        """Validate, then have every rank adopt the change on the same round (G1).

        `changed_by` (default "operator") and `reason` (default: what changed) travel with the config.
        """
        if self._stop_requested or self.state == "stopped":
            raise Draining("the engine is draining")
        violations = _origin_violations(changed_by, reason)
        if violations:
            raise ConfigRejected("; ".join(f"{name} {text}" for name, text in violations), violations)
        candidate = self.validate_intervals(attempt, any_, disable=disable)
        if expected_epoch is not None and expected_epoch != self._accepted_epoch:
            raise StaleEpoch(expected_epoch, self._accepted_epoch)
        delay = candidate.prefill_delay
        changed_by = changed_by or OPERATOR
        origin = Origin(changed_by, reason or _change_reason(changed_by, self._accepted_args.prefill_delay, delay))
        if validate_only:
            view = ConfigView(self._accepted_epoch, delay, self.policy, origin)
            return IntervalUpdate(view, self.latest.round if self.latest else 0, True)
        self._accepted_epoch += 1
        self._accepted_args = candidate
        epoch = self._accepted_epoch
        self._origins[epoch] = origin  # before rank 0 can propose it: every record of the epoch finds it
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters[epoch] = waiter
        self.backend.propose(epoch, delay)
        adopted_round = await waiter
        return IntervalUpdate(ConfigView(epoch, delay, self.policy, origin), adopted_round, False)

    # -- requests ----------------------------------------------------------------------------------

    def submit(self, spec: RequestSpec | None = None, *, rank: int | None = None, **fields: object) -> RequestStream:
        """Route a request to a rank and return the stream of its events.

        Raises Draining, RequestRejected (every bad field named) or DuplicateRequest. A request reaches a
        rank only once it passes the checks the rank would make, so no rank refuses it later.
        """
        if self._stop_requested or self.state == "stopped":
            raise Draining("the engine is draining")
        if spec is None:
            rid = str(fields.pop("rid", "") or f"req-{self.run_id}-{next(self._ids)}")
            spec = RequestSpec(rid=rid, arrival=self.backend.now(), **fields)  # type: ignore[arg-type]
        violations = self.request_violations(spec, rank)
        if violations:
            raise RequestRejected(violations)
        if spec.rid in self._live:
            raise DuplicateRequest(f"request {spec.rid}: a live request already has this id")
        if rank is None:
            loads = loads_of(self.latest, self.backend.dp_size)
            rank = min(range(len(loads)), key=lambda r: (loads[r], r))
        stream = RequestStream(spec.rid, rank, spec.arrival)
        self._streams[spec.rid] = stream
        self._live[spec.rid] = rank
        self.metrics.add_submitted(spec)
        self.backend.submit(rank, spec)
        return stream

    def request_violations(self, spec: RequestSpec, rank: int | None) -> Violations:
        """What is wrong with a submission, by SubmitRequest field (empty: a rank would accept it)."""
        args = self.args
        out = spec.violations(
            usable_pages=args.kv_pages,
            page_size=args.page_size,
            vocab=args.model_vocab,
            prefix_cache=args.executor == "sim",
        )
        if rank is not None and not 0 <= rank < self.backend.dp_size:
            out.append(("rank", f"must be in [0, {self.backend.dp_size}), got {rank}"))
        return out

    def abort(self, rid: str) -> bool:
        """Abort a live request; False when none has that id."""
        rank = self._live.get(rid)
        if rank is None:
            return False
        self.backend.abort(rank, rid)
        return True


def _intervals(delay: PrefillDelay | None) -> str:
    return f"A={delay.attempt_interval} K={delay.any_interval}" if delay else "gate off"


def _launch_reason(delay: PrefillDelay | None, policy: str) -> str:
    return f"{LAUNCH}: startup flags, " + (_intervals(delay) if policy == "gate" else f"policy {policy}")


def _change_reason(changed_by: str, before: PrefillDelay | None, after: PrefillDelay | None) -> str:
    """What a change does, for a caller that gave no reason: `operator: A 8->4, K 32->16`."""
    if before is None or after is None:
        return f"{changed_by}: {_intervals(before)} -> {_intervals(after)}"
    moved = [
        f"{name} {old}->{new}"
        for name, old, new in (
            ("A", before.attempt_interval, after.attempt_interval),
            ("K", before.any_interval, after.any_interval),
        )
        if old != new
    ]
    return f"{changed_by}: " + (", ".join(moved) if moved else f"{_intervals(after)} again")


def _origin_violations(changed_by: str, reason: str) -> Violations:
    """A name and a reason must be short, printable, one line: they are shown on every surface."""
    out: Violations = []
    for name, value, limit in (("changed_by", changed_by, MAX_CHANGED_BY), ("reason", reason, MAX_REASON)):
        if len(value) > limit:
            out.append((name, f"must be at most {limit} characters, got {len(value)}"))
        elif not value.isprintable():
            out.append((name, "must be printable text on one line"))
    return out


def _delay_of(row: object) -> PrefillDelay | None:
    """The intervals rank 0 proposed in its row (the adopted epoch's values)."""
    attempt = getattr(row, "proposal_attempt_interval", -1)
    any_ = getattr(row, "proposal_any_interval", -1)
    return PrefillDelay(attempt, any_) if attempt > 0 and any_ > 0 else None
