"""OpenTelemetry traces of the gate: one trace per sampled round across every rank, one span per request.

Round context without communication: every rank (and the controller) derives round r's trace id and
the id of its root span from a hash of `(run_id, r)`, and decides whether to trace the round with the
same function of data they all hold (the gathered rows and the trace id). So the ranks' `gate.round`
spans of one round land in one trace, under a root span that the controller exports with the same
derived id, and no rank ever asks another anything.

    round                      (controller: the gathered decision)
    ├── gate.round  rank 0     (point, open, counter, want/decodes, occupancy, epoch of this rank)
    │   ├── plan
    │   ├── all-gather
    │   └── forward
    └── gate.round  rank 1 ...

Always traced: rounds that adopted a config epoch and rounds in which some rank crossed the 0.9
watermark (both rare). Rounds whose vote opened a window are traced at their own rate
(`--trace-window-sample-rate`): at A=4 a quarter of busy rounds open one, and tracing each of them
cost the simulator ~30% of its round rate. Any round is traced when `TraceIdRatioBased(rate)` samples
its trace id. Both rates test the same trace id, so every rank and the controller agree.

Spans are built after the round from the phase marks (explicit start and end times) as `SpanData`
tuples, encoded on the exporter's thread (`otlp_wire`): the SDK tracer would cost ~65 us per rank-round
against a few us here (measured), and it cannot take a span id we derived. The root span must cover its
children, whose ends only the ranks know: each rank publishes in its row this round's start and the
previous round's end (`Row.span_start_ns`, `Row.previous_span_end_ns`), so the controller builds round
r's root from the rows of rounds r and r+1 (a lockstep group's tracer writes them after the round, for
traced rounds only: `GroupRoundTracer`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from control.telemetry.otlp_wire import KIND_INTERNAL, Attributes, Producer, SpanData, producer
from control.telemetry.trace_export import (
    DEFAULT_EXPORT_TIMEOUT_S,
    DEFAULT_QUEUE_SPANS,
    DropCounter,
    ShipperConfig,
    SpanShipper,
    parse_otlp_endpoint,
    shared_shipper,
)
from engine.gate import GatePoint
from engine.phases import MarkTimer, NullTimer, PhaseTimer
from engine.rows import Row
from engine.scheduler.plan import K_PREFILL_WATERMARK

if TYPE_CHECKING:
    from engine.rank import RankEngine, RoundOutcome

DEFAULT_SERVICE = "prefill-gate"
try:
    VERSION = importlib.metadata.version("prefill-gate")
except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
    VERSION = "0+unknown"
SCOPE_NAME = "prefill_gate.tracing"
_random_bits = random.getrandbits
_now = time.time_ns
_POINT_NAMES = {point.value: point.name for point in GatePoint} | {point: point.name for point in GatePoint}
_LOCKSTEP = {"gate.lockstep": True}
_log = logging.getLogger("prefill_gate.tracing")


# -- round context -----------------------------------------------------------------------------------


def _digest(kind: bytes, key: str, size: int) -> int:
    value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=size, person=kind).digest(), "big")
    return value or 1  # an all-zero id is invalid in OTLP


def _digest_state(kind: bytes, prefix: str, size: int) -> Any:
    """The hash state after `prefix`: `_digest(kind, prefix + rest)` is this state, copied, updated with rest."""
    return hashlib.blake2b(prefix.encode(), digest_size=size, person=kind)


_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def run_seed(run_id: str) -> int:
    """The 64-bit seed of a run's sampling keys."""
    return _digest(b"pg.round.seed", run_id, 8)


def sampling_key(seed: int, round_: int) -> int:
    """The low 64 bits of round `round_`'s trace id: what `TraceIdRatioBased` tests (key < rate * 2^64).

    SplitMix64 of the round: a bijective mix whose outputs are spread evenly, so any rate picks its share
    of rounds, at a fraction of a hash's cost. Whether a rate may pick a round is its key against the
    rates' bounds, computed for blocks of rounds at once (`timings`); the trace id's upper half, a hash,
    only for the rounds traced.
    """
    value = (seed + round_ * _GOLDEN64) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


TIMING_BLOCK = 4096  # rounds whose timing a sampler computes at once (vectorized: ~0.03 us a round, not ~0.9)


def timings(seed: int, first: int, count: int, ratio_bound: int, bound: int) -> bytes:
    """`RoundSampler.timing` of rounds `first` .. `first + count - 1`: `sampling_key` of each (the same
    SplitMix64, in numpy's wrapping 64-bit arithmetic) against the sample rate's and the larger rate's
    bounds (TIMED below the first, CANDIDATE below the second, else UNTIMED)."""
    with np.errstate(over="ignore"):
        value = np.uint64(seed) + np.arange(first, first + count, dtype=np.uint64) * np.uint64(_GOLDEN64)
        value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        value ^= value >> np.uint64(31)

    def below(limit: int) -> Any:  # a bound is at most 2^64 (rate 1), one past uint64's range
        return np.ones(count, dtype=bool) if limit > _MASK64 else value < np.uint64(limit)

    return (below(ratio_bound).astype(np.uint8) + below(bound)).tobytes()


def round_trace_id(run_id: str, round_: int) -> int:
    """The trace id of round `round_` of run `run_id`, the same on every rank and the controller: a hash
    of `(run id, round)` above the round's sampling key."""
    return _digest(b"pg.round.trace", f"{run_id}/{round_}", 8) << 64 | sampling_key(run_seed(run_id), round_)


def round_root_span_id(run_id: str, round_: int) -> int:
    """The span id of the round's root span (exported by the controller, parent of every rank's span)."""
    return _digest(b"pg.round.root", f"{run_id}/{round_}", 8)


def rank_span_id(run_id: str, round_: int, rank: int) -> int:
    """The span id of `rank`'s `gate.round` span of the round (so request spans can link to it)."""
    return rank_span_of(round_root_span_id(run_id, round_), rank)


def rank_span_of(root_span_id: int, rank: int) -> int:
    """`rank_span_id` from the round's root span id: a SplitMix64 step of the rank keyed by the root's id,
    a bijection of the rank (no two ranks of a round share an id) that costs no hash on a traced round."""
    return sampling_key(root_span_id, rank + 1) or 1


def request_trace_id(run_id: str, rid: str) -> int:
    """The trace id of one request's span."""
    return _digest(b"pg.request", f"{run_id}/{rid}", 16)


class SampleReason(StrEnum):
    """Why a round was traced: the first rule that applies, rarest first (a config change that lands on
    a window-open round says `config`)."""

    CONFIG = "config"  # every rank adopted a new config epoch after this round's gather
    WATERMARK = "watermark"  # some rank went above the 0.9 watermark this round
    OPEN = "open"  # the vote opened a window at an ANY or ALL point, sampled at the window rate
    RATIO = "ratio"  # TraceIdRatioBased(--trace-sample-rate) sampled the trace id


def hot_ranks(rows: Sequence[Row]) -> int:
    """Which ranks are above the 0.9 watermark (rule P1's threshold), as a bit mask by rank (cheap: the
    sampler asks every round)."""
    mask = 0
    for row in rows:
        if row.pool_pages_used > K_PREFILL_WATERMARK * row.pool_pages_usable > 0:  # `Row.occupancy` > 0.9
            mask |= 1 << row.rank
    return mask


def crossed_watermark(hot: int, previous: int | None) -> bool:
    """Some rank is above the watermark now and was not in the previous round.

    `previous` 0: none was (or there was no previous round). None: it is unknown (a record was lost), and
    any rank above the watermark counts, so the controller never leaves a traced round without its root.
    """
    return bool(hot if previous is None else hot & ~previous)


def sample_reason(
    trace_id: int,
    rows: Sequence[Row],
    hot: int,
    previous_hot: int | None,
    adopted_epoch: int | None,
    ratio: TraceIdRatioBased,
    window: TraceIdRatioBased,
) -> SampleReason | None:
    """Whether a round is traced: a pure function of what every rank and the controller hold alike.

    `hot` / `previous_hot`: `hot_ranks` of this round's and the previous round's rows (see `crossed_watermark`).
    `ratio` samples any round, `window` the rounds whose vote opened a window; both test the trace id.
    """
    if adopted_epoch:
        return SampleReason.CONFIG
    if crossed_watermark(hot, previous_hot):
        return SampleReason.WATERMARK
    # TraceIdRatioBased.should_sample's own test, without building its result objects every round.
    key = trace_id & TraceIdRatioBased.TRACE_ID_LIMIT
    if key < window.bound and window_opened(rows):
        return SampleReason.OPEN
    if key < ratio.bound:
        return SampleReason.RATIO
    return None


def window_opened(rows: Sequence[Row]) -> bool:
    """The round's vote opened a window at an ANY or ALL point (what the window rate samples)."""
    return any(row.decision_open and row.decision_point != GatePoint.NONE for row in rows)


def rates_pick(timing: int, rows: Sequence[Row]) -> bool:
    """A rate picks the round (RATIO or OPEN), whatever the rules: it is TIMED, or a CANDIDATE whose vote
    opened. `timing` is `RoundSampler.timing` of the round."""
    return timing == TIMED or (timing == CANDIDATE and window_opened(rows))


@dataclass(frozen=True, slots=True)
class RoundContext:
    """A traced round: its derived ids and why it is traced."""

    round: int
    trace_id: int
    root_span_id: int
    reason: SampleReason


# How a round's phases are timed, known before it runs from its sampling key (`RoundSampler.timing`).
UNTIMED = 0  # no rate can pick it: only a rule (config, watermark) can, after it ran; its start is kept
CANDIDATE = 1  # only the window rate can pick it, and only if its vote opens: timed from the decide phase on
TIMED = 2  # the sample rate picks it: every phase timed


class RoundSampler:
    """Decides round by round which rounds are traced; remembers the previous rows for the watermark rule.

    One sampler serves every rank of a process (a lockstep group decides each round once; rank
    processes, each its own). Deciding round r also tells how round r + 1's phases are timed
    (`next_timing`, from its trace id, known before it runs). With `publish` (the ranks'), it also logs
    its decisions when the run's controller is in the same process (an in-process simulator): the
    controller's sampler then takes a logged decision instead of deciding the same round again.
    """

    # Slots: asked once per round between ~300 us of simulator work, it should touch little memory.
    __slots__ = (
        "_bound",
        "_hot",
        "_log",
        "_publish",
        "_ratio_bound",
        "_seed",
        "_timings",
        "_timings_first",
        "_trace_key",
        "context",
        "next_timing",
        "rates_only",
        "ratio",
        "round",
        "run_id",
        "window",
    )

    def __init__(self, run_id: str, sample_rate: float, window_rate: float, *, publish: bool = False) -> None:
        self.run_id = run_id
        self.ratio = TraceIdRatioBased(sample_rate)
        self.window = TraceIdRatioBased(window_rate)
        self._publish = publish
        # Only the rates decide (`leave_rule_rounds_to_controller`): the rules' rounds are the controller's.
        self.rates_only = False
        # The controller's sampler subscribes to the run's decisions; ranks publish there only then (a
        # simulator in a process of its own has no reader).
        self._log = _decision_logs.setdefault(run_id, {}) if not publish else None
        self.round = -1  # the round decided last
        self.context: RoundContext | None = None  # its decision
        self._hot: int | None = 0
        self._bound = max(self.ratio.bound, self.window.bound)
        self._ratio_bound = self.ratio.bound
        self._seed = run_seed(run_id)
        self._trace_key = _digest_state(b"pg.round.trace", f"{run_id}/", 8)
        self._timings = b""  # `timings` of a block of rounds from `_timings_first`
        self._timings_first = 0
        self.next_timing = self.timing(0)  # how the round after `round` is timed

    def _trace_id(self, round_: int) -> int:
        """`round_trace_id(self.run_id, round_)`, hashing the run id once."""
        state = self._trace_key.copy()
        state.update(str(round_).encode())
        return (int.from_bytes(state.digest(), "big") or 1) << 64 | sampling_key(self._seed, round_)

    def timing(self, round_: int) -> int:
        """How round `round_`'s phases are timed (UNTIMED, CANDIDATE, TIMED), known before it runs: a round
        the sample rate picks is timed whole; one only the window rate may pick, from its vote on (most
        such votes do not open, and the round is then not traced)."""
        index = round_ - self._timings_first
        if not 0 <= index < len(self._timings):
            self._timings_first, index = round_, 0
            self._timings = timings(self._seed, round_, TIMING_BLOCK, self._ratio_bound, self._bound)
        return self._timings[index]

    def next_timed(self, after: int) -> int:
        """The first round after `after` that a rate may pick (timing not UNTIMED), or, when none is in the
        block of timings at hand, the first round past it."""
        timings = self._timings
        start = after + 1 - self._timings_first
        if not 0 <= start < len(timings):
            return after + 1
        found = [index for index in (timings.find(b"\x01", start), timings.find(b"\x02", start)) if index >= 0]
        return self._timings_first + (min(found) if found else len(timings))

    def decide(self, round_: int, rows: Sequence[Row], adopted_epoch: int | None) -> RoundContext | None:
        """The round's context when it is traced, else None.

        Asked every round, so the common answer (no rule applies) costs a look-up of the round's timing
        (a rate can pick only a timed round) and one pass over the rows; the rules are spelled out
        (`sample_reason`) only for the rounds some rule may pick.
        """
        if round_ == self.round:
            return self.context
        if self.rates_only:
            return self._decide_by_rates(round_, rows)
        if self._log is not None:
            logged = self._log.get(round_, _UNDECIDED)  # one lookup: the deciding thread may trim the log
            if logged is not _UNDECIDED:
                self.round, self._hot, self.context = round_, None, logged
                self.next_timing = self.timing(round_ + 1)
                return logged
        if self.round == round_ - 1:  # the previous round was decided here (round 0: none was)
            previous, timing = self._hot, self.next_timing
        else:
            previous, timing = None, self.timing(round_)
        hot = hot_ranks(rows)
        context = None
        # A CANDIDATE round is picked only when its vote opened (most do not): the vote before the hash.
        if (
            adopted_epoch
            or timing == TIMED
            or (timing and window_opened(rows))
            or (hot and crossed_watermark(hot, previous))
        ):
            trace_id = self._trace_id(round_)
            reason = sample_reason(trace_id, rows, hot, previous, adopted_epoch, self.ratio, self.window)
            if reason is not None:
                context = RoundContext(round_, trace_id, round_root_span_id(self.run_id, round_), reason)
        self.round, self._hot, self.context = round_, hot, context
        self.next_timing = self.timing(round_ + 1)
        if self._publish:
            log = _decision_logs.get(self.run_id)
            if log is not None:
                log[round_] = context
                log.pop(round_ - DECISION_MEMORY, None)
        return context

    def _decide_by_rates(self, round_: int, rows: Sequence[Row]) -> RoundContext | None:
        """`decide` by the rates alone (no pass over the rows' pools, no memory of the previous round):
        a lookup of the round's timing, and the vote on the rounds only the window rate may pick."""
        timing = self.next_timing if self.round == round_ - 1 else self.timing(round_)
        context = None
        if rates_pick(timing, rows):
            trace_id = self._trace_id(round_)
            # OPEN or RATIO: a rate picked it, and the rules are not asked.
            reason = sample_reason(trace_id, rows, 0, 0, None, self.ratio, self.window) or SampleReason.RATIO
            context = RoundContext(round_, trace_id, round_root_span_id(self.run_id, round_), reason)
        self.round, self.context = round_, context
        self.next_timing = self.timing(round_ + 1)
        return context


_decision_logs: dict[str, dict[int, RoundContext | None]] = {}
_UNDECIDED: Any = object()
DECISION_MEMORY = 8192  # rounds a published decision is kept (the controller trails the simulator by a few)


def forget_run(run_id: str) -> None:
    """Drop this process's per-run tracing state (decision log, rank samplers) once the run is over."""
    _decision_logs.pop(run_id, None)
    for key in [key for key in _rank_samplers if key[0] == run_id]:
        del _rank_samplers[key]


def new_span_id() -> int:
    """A random span id (for spans nobody needs to find by derivation); never the invalid 0."""
    return _random_bits(64) or 1


# -- the rank side -----------------------------------------------------------------------------------


class RoundMarks(MarkTimer):
    """MarkTimer without the per-phase totals (1 us instead of 4 us a round; the sim's rank-round is
    ~30 us): the timer of the rounds the sample rate picks."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def start(self) -> None:
        self.started = started = _now()
        self.marks = [("start", started)]

    def lap(self, phase: str) -> None:
        self.marks.append((phase, _now()))


class CandidateMarks(PhaseTimer):
    """The timer of a round only the window rate may pick (`CANDIDATE`): its start, then, once the rank's
    vote is known at the "decide" lap, every phase if the vote opened a window and none if not (then no
    rule but config or watermark can trace the round, and its span has no phases). At the defaults such
    rounds are 4% of all and a quarter of their votes open: the other three quarters cost a clock read."""

    def __init__(self, engine: RankEngine) -> None:
        super().__init__()
        self.engine = engine
        self.started = 0
        self.live: bool | None = None  # None: the vote is not known yet; then whether it opened
        self.marks: list[tuple[str, int]] = []

    def start(self) -> None:
        self.started = _now()
        self.live = None

    def lap(self, phase: str) -> None:
        live = self.live
        if live:
            self.marks.append((phase, _now()))
        elif live is None and phase == "decide":
            decision = self.engine.decision
            self.live = decision.allow_prefill and decision.point != GatePoint.NONE
            if self.live:
                self.marks = [("start", self.started), (phase, _now())]


class ProfiledMarks(MarkTimer):
    """MarkTimer with `started`: phase profiling's timer, every round timed, when tracing is on too."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def start(self) -> None:
        super().start()
        self.started = self.marks[0][1]


class StartMark(PhaseTimer):
    """Only the round's start: the timer of rounds no rate can pick (most of them). A round has eight
    phases, and a clock read plus a list entry each cost the in-process simulator ~8% of its round
    rate (measured). The start stays: a round picked after it ran (config, watermark) needs it."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def start(self) -> None:
        self.started = _now()

    def lap(self, phase: str) -> None:
        return None


class RankRoundTracer:
    """The `RoundObserver` of one rank: a `gate.round` span tree for each traced round, built after it.

    In a rank process, a round nobody traces costs the rank one clock read (its start) and two short
    calls: the decision is made once per round (`RoundSampler`), the phases are timed only in the rounds
    a rate may pick (`RoundSampler.timing`), and nothing is built or allocated. Its row fields
    (`fill_row`): the spans it could not deliver so far, this round's start and, when the previous round
    was traced, its end (the controller's root of a round covers every rank's span with them). The ranks
    of a lockstep group are observed by one `GroupRoundTracer` instead (`group_observer`).
    """

    __slots__ = (
        "_candidate",
        "_phases",
        "_previous_end",
        "_profiling",
        "_reported",
        "_start_only",
        "_timer",
        "_timing",
        "close_timeout_s",
        "counter",
        "producer",
        "rank",
        "run_id",
        "sampler",
        "shipper",
    )

    def __init__(
        self,
        engine: RankEngine,
        sampler: RoundSampler,
        shipper: SpanShipper,
        resource: Attributes,
        *,
        close_timeout_s: float = 2.0,
    ) -> None:
        self.rank = engine.rank
        self.run_id = sampler.run_id
        self.sampler = sampler
        self.shipper = shipper
        self.producer: Producer = producer(resource, SCOPE_NAME, VERSION)
        self.counter = DropCounter()
        self.close_timeout_s = close_timeout_s
        self._previous_end = 0  # the end of the previous round when it was traced, else 0
        self._reported = False
        # Phase profiling keeps its totals (every round timed); otherwise the lean marks time the
        # rounds the sample rate picks, the candidate marks those the window rate may, the others only start.
        self._profiling = not isinstance(engine.timer, NullTimer)
        self._phases: RoundMarks | ProfiledMarks = ProfiledMarks() if self._profiling else RoundMarks()
        self._candidate = CandidateMarks(engine)
        self._start_only = StartMark()
        self._timer: PhaseTimer = self._start_only
        self._timing = -1
        self._arm(engine, sampler.timing(engine.round))

    def _arm(self, engine: RankEngine, timing: int) -> None:
        """Choose the timer of the next round before it starts."""
        self._timing = timing
        if self._profiling or timing == TIMED:
            self._timer = engine.timer = self._phases
        elif timing == CANDIDATE:
            self._timer = engine.timer = self._candidate
        else:
            self._timer = engine.timer = self._start_only

    @property
    def dropped(self) -> int:
        """Spans of this rank not confirmed delivered (published in the row as `spans_dropped`)."""
        return self.counter.total

    @property
    def timer(self) -> PhaseTimer:
        """The timer armed for the rank's next round (what `engine.timer` is while this observes it)."""
        return self._timer

    def group_observer(self, engines: Sequence[RankEngine]) -> GroupRoundTracer | None:
        """The observer of a lockstep group whose ranks this tracer's kind observes with one sampler (what
        `LockstepDriver` calls once per round instead of each rank's hooks); None if some rank's is not."""
        tracers = [engine.observer for engine in engines]
        if all(isinstance(t, RankRoundTracer) and t.sampler is self.sampler for t in tracers):
            return GroupRoundTracer(engines, tracers)  # type: ignore[arg-type]
        return None

    def leave_rule_rounds_to_controller(self) -> bool:
        """From now on trace only the rounds a rate picks (`rates_pick`); the rounds only a rule picks
        (config, watermark) are traced by the run's controller from their records, with no phases. For
        a simulator in a process of its own, whose controller sees every round's record: the pass over
        every round's rows that the rules need is then the controller's, not the simulated ranks'.
        Shared by every rank of the process (one sampler). Returns True: done."""
        self.sampler.rates_only = True
        return True

    def fill_row(self, row: Row) -> None:
        """Publish the drop count and the span bounds the controller's root needs."""
        row.span_start_ns = self._timer.started  # type: ignore[attr-defined]
        counter = self.counter  # `counter.total`, without a property call on every rank-round
        row.spans_dropped = counter.refused + counter.failed + counter.unconfirmed
        row.previous_span_end_ns = self._previous_end

    def round_done(self, engine: RankEngine, outcome: RoundOutcome) -> None:
        """Trace the round if it is sampled. Never flushes: a flush here would stretch the round (and, in a
        lockstep group, show up as the next ranks' all-gather); the process flushes when it ends."""
        sampler = self.sampler
        try:
            if outcome.round != sampler.round:
                sampler.decide(outcome.round, outcome.rows, outcome.adopted_epoch)
            if sampler.context is not None:
                self._previous_end = self._offer(sampler.context, outcome, self._marks(_now()))
            elif self._previous_end:
                self._previous_end = 0
            if sampler.next_timing != self._timing:
                self._arm(engine, sampler.next_timing)
        except Exception:  # a tracing bug must never stop a rank: count the round's spans as lost
            self._failed()
            self._previous_end = 0

    def _failed(self) -> None:
        self.counter.failed += 4
        if not self._reported:
            self._reported = True
            _log.exception("rank %d: tracing a round failed; the rank continues untraced rounds", self.rank)

    def _marks(self, end: int, start: int = 0) -> list[tuple[str, int]]:
        """The traced round's phase marks when they were timed, else its start (the timer's, or `start`
        when the timer kept none) and `end`."""
        timer = self._timer
        if timer is self._phases or (timer is self._candidate and self._candidate.live):
            return timer.marks  # type: ignore[attr-defined]
        return [("start", getattr(timer, "started", 0) or start), ("commit", end)]

    def _offer(self, context: RoundContext, outcome: RoundOutcome, marks: list[tuple[str, int]]) -> int:
        """Offer the round's span tree (with its phases when they were timed); returns the span's end."""
        self.shipper.offer(self._spans(context, marks, outcome), self.producer, self.counter)
        return marks[-1][1]

    def flush(self) -> bool:
        """Wait (bounded, as `close`) until every span offered was answered: then `dropped` is final."""
        return self.shipper.flush(self.close_timeout_s)

    def close(self) -> None:
        """End of the rank process: flush and close its shipper (bounded), so that `dropped` is final."""
        self.shipper.close(self.close_timeout_s)

    def _spans(self, context: RoundContext, marks: list[tuple[str, int]], outcome: RoundOutcome) -> list[SpanData]:
        row = outcome.rows[self.rank]
        decision = outcome.decision
        trace_id = context.trace_id
        own_span = rank_round_span(
            context,
            row,
            (decision.point, decision.allow_prefill, decision.counter, outcome.adopted_epoch),
            marks[0][1],
            marks[-1][1],
            phases_timed=len(marks) > 2,
            parent_remote=True,  # the controller exports the root
        )
        if len(marks) == 2:
            return [own_span]
        own = own_span.span_id
        spans = [own_span]
        ends = dict(marks)  # phase -> when it ended; a phase starts when the previous one ended
        # Lockstep groups have no gather lap: their "observe" lap is this rank waiting for its peers' rows.
        gathered = "gather" in ends
        children = (
            (
                "plan",
                ends.get("decide"),
                ends.get("plan"),
                {
                    "gate.batch_size": row.batch_size,
                    "gate.num_extends": row.num_extends,
                    "gate.prefill_tokens": row.prefill_tokens,
                },
            ),
            (
                "all-gather",
                ends.get("probe"),
                ends.get("gather" if gathered else "observe"),
                {"gate.ranks": len(outcome.rows)} if gathered else _LOCKSTEP,
            ),
            ("forward", ends.get("observe"), ends.get("forward"), {"gate.dispatch": outcome.mode.name}),
        )
        for name, child_start, child_end, extra in children:
            if child_start is not None and child_end is not None:
                spans.append(SpanData(trace_id, new_span_id(), own, name, KIND_INTERNAL, child_start, child_end, extra))
        return spans


def rank_round_span(
    context: RoundContext,
    row: Row,
    decision: tuple[GatePoint | int, bool, int, int | None],
    start_ns: int,
    end_ns: int,
    *,
    phases_timed: bool,
    parent_remote: bool,
) -> SpanData:
    """One rank's `gate.round` span of a traced round, child of the round's root: what a reader of the
    round needs, no more. `decision`: the rank's (point, open, counter) of the round and the epoch every
    rank adopted after it. Without `phases_timed` (a round picked after it ran: config, watermark) it
    says so."""
    point, allow_prefill, counter, adopted_epoch = decision
    attributes: dict[str, Any] = {
        "gate.rank": row.rank,
        "gate.round": context.round,
        "gate.point": _POINT_NAMES[point],
        "gate.open": allow_prefill,
        "gate.counter": counter,
        "gate.want_prefill": row.want_prefill,
        "gate.has_decode_work": row.has_decode_work,
        "gate.occupancy": round(row.occupancy, 4),
        "gate.config_epoch": row.config_epoch,
    }
    if adopted_epoch:
        attributes["gate.adopted_epoch"] = adopted_epoch
    if not phases_timed:
        attributes["gate.phases_timed"] = False
    span_id = rank_span_of(context.root_span_id, row.rank)
    return SpanData(
        context.trace_id,
        span_id,
        context.root_span_id,
        "gate.round",
        KIND_INTERNAL,
        start_ns,
        end_ns,
        attributes,
        parent_remote=parent_remote,
    )


class GroupRoundTracer:
    """The `GroupObserver` of a lockstep group's ranks (`LockstepDriver`): their tracers, called once per
    round for the whole group instead of twice per rank.

    A round nobody traces costs the group one clock read (the group's start, which a round picked after
    it ran takes as every untimed rank's start), the decision (`RoundSampler.decide`, once) and a few
    calls: no rank's tracer is touched. The ranks' timers are switched only when the timing of the next
    round differs (`RoundSampler.timing`). The rows' tracing fields are set after the gather, before
    anyone reads them (the records leave the group after the round): this round's start of each rank
    and the previous round's end only when that round is traced, the drop counts only once this
    process lost some span.
    """

    __slots__ = (
        "_ends",
        "_null",
        "_profiling",
        "_reported",
        "_timing",
        "_totals",
        "engines",
        "quiet_until",
        "sampler",
        "started",
        "tracers",
    )

    def __init__(self, engines: Sequence[RankEngine], tracers: Sequence[RankRoundTracer]) -> None:
        self.engines = list(engines)
        self.tracers = list(tracers)
        self.sampler = tracers[0].sampler
        self._totals = tracers[0].shipper.totals  # the process's losses, read every round
        self.started = 0  # the group's start of the round (before its first rank begins)
        self._profiling = any(tracer._profiling for tracer in tracers)
        self._null = NullTimer()
        self._timing = -1
        self._ends: list[int] | None = None  # each rank's end of the previous round when it was traced
        self._reported = False
        # The driver skips both hooks before this round (`GroupObserver`): see `_go_quiet`.
        self.quiet_until = 0

    def round_begins(self, round_: int) -> None:
        """Take the group's start; arm the ranks' timers when this round is timed otherwise than the last."""
        self.started = _now()
        sampler = self.sampler
        timing = sampler.next_timing if sampler.round == round_ - 1 else sampler.timing(round_)
        if timing != self._timing:
            self._arm(timing)

    def _arm(self, timing: int) -> None:
        self._timing = timing
        for engine, tracer in zip(self.engines, self.tracers, strict=True):
            if self._profiling or timing == TIMED:
                timer: PhaseTimer = tracer._phases
            elif timing == CANDIDATE:
                timer = tracer._candidate
            else:
                timer = self._null  # the group's start stands for the rank's
            tracer._timer = engine.timer = timer
            tracer._timing = timing

    def round_done(self, rows: tuple[Row, ...], outcomes: list[RoundOutcome]) -> None:
        """Decide the round once; trace it on every rank when sampled; annotate the rows (see the class)."""
        first = outcomes[0]
        try:
            context = self.sampler.decide(first.round, rows, first.adopted_epoch)
            ends = self._ends
            if ends is not None:
                self._ends = None
                for row, end in zip(rows, ends, strict=True):
                    row.previous_span_end_ns = end
            if context is not None:
                end = _now()
                self._ends = ends = []
                for tracer, row, outcome in zip(self.tracers, rows, outcomes, strict=True):
                    marks = tracer._marks(end, self.started)
                    row.span_start_ns = marks[0][1]
                    ends.append(tracer._offer(context, outcome, marks))
            totals = self._totals  # some span of this process was lost: publish each count
            if totals.refused or totals.failed or totals.unconfirmed:
                for row, tracer in zip(rows, self.tracers, strict=True):
                    row.spans_dropped = tracer.counter.total
            elif self.sampler.rates_only and self._ends is None and not self._profiling:
                self._go_quiet(first.round)
        except Exception:  # a tracing bug must never stop the group: count the round's spans as lost
            self._ends = None
            for tracer in self.tracers:
                tracer._failed()

    def _go_quiet(self, round_: int) -> None:
        """When the ranks trace only what a rate picks (`leave_rule_rounds_to_controller`), the rounds
        before the next one a rate may pick have nothing to observe: no start to take (a rule's round is
        the controller's), no end or drop count to publish (none pending; a span lost meanwhile shows in
        the rows from the next round observed, and from then on every round is). Run them untimed, and let
        the driver skip both hooks in them: most rounds then cost the group nothing at all."""
        quiet = self.sampler.next_timed(round_)
        if quiet > round_ + 1:
            if self._timing != UNTIMED:
                self._arm(UNTIMED)
            self.quiet_until = quiet

    def detach(self) -> None:
        """The driver stopped observing the group: untimed ranks again, as before any tracer."""
        if not self._profiling:
            for engine, tracer in zip(self.engines, self.tracers, strict=True):
                tracer._timer = tracer._start_only
                tracer._timing = -1
                engine.timer = NullTimer()


def rank_resource(run_id: str, rank: int, size: int, service_name: str = DEFAULT_SERVICE) -> dict[str, Any]:
    """Resource attributes of one rank's spans."""
    return resource_of(
        {
            SERVICE_NAME: service_name,
            SERVICE_VERSION: VERSION,
            SERVICE_INSTANCE_ID: f"{run_id}/rank{rank}",
            "prefill_gate.rank": rank,
            "prefill_gate.run_id": run_id,
            "prefill_gate.dp_size": size,
        }
    )


def resource_of(attributes: dict[str, object]) -> dict[str, Any]:
    """`Resource.create`'s attributes (SDK defaults, OTEL_RESOURCE_ATTRIBUTES) with ours winning."""
    return dict(Resource.create(attributes).attributes)  # type: ignore[arg-type]


_rank_samplers: dict[tuple[str, float, float], RoundSampler] = {}


def rank_observer(
    engine: RankEngine,
    *,
    endpoint: str,
    run_id: str,
    sample_rate: float,
    window_sample_rate: float | None = None,
    service_name: str = DEFAULT_SERVICE,
    queue_spans: int = DEFAULT_QUEUE_SPANS,
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S,
    close_timeout_s: float = 2.0,
    schedule_delay_s: float | None = None,
) -> RankRoundTracer:
    """Observer factory a rank process (or the simulator) loads as `control.telemetry.tracing:rank_observer`.

    The ranks of one process share one shipper and one sampler (a lockstep group decides each round once).
    `window_sample_rate` None: window-open rounds at `sample_rate` like any other.
    """
    if window_sample_rate is None:
        window_sample_rate = sample_rate
    config = ShipperConfig(max_queue_spans=queue_spans, export_timeout_s=export_timeout_s)
    if schedule_delay_s is not None:  # None: the shipper's default batching delay
        config = replace(config, schedule_delay_s=schedule_delay_s)
    shipper = shared_shipper(parse_otlp_endpoint(endpoint), config)
    key = (run_id, sample_rate, window_sample_rate)
    sampler = _rank_samplers.get(key)
    if sampler is None:
        sampler = _rank_samplers[key] = RoundSampler(run_id, sample_rate, window_sample_rate, publish=True)
    return RankRoundTracer(
        engine,
        sampler,
        shipper,
        rank_resource(run_id, engine.rank, engine.size, service_name),
        close_timeout_s=close_timeout_s,
    )
