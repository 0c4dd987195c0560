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
r's root from the rows of rounds r and r+1.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

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
    of rounds, at a fraction of a hash's cost. It is computed for every round (whether a rate may pick
    it); the trace id's upper half, a hash, only for the rounds traced.
    """
    value = (seed + round_ * _GOLDEN64) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def round_trace_id(run_id: str, round_: int) -> int:
    """The trace id of round `round_` of run `run_id`, the same on every rank and the controller: a hash
    of `(run id, round)` above the round's sampling key."""
    return _digest(b"pg.round.trace", f"{run_id}/{round_}", 8) << 64 | sampling_key(run_seed(run_id), round_)


def round_root_span_id(run_id: str, round_: int) -> int:
    """The span id of the round's root span (exported by the controller, parent of every rank's span)."""
    return _digest(b"pg.round.root", f"{run_id}/{round_}", 8)


def rank_span_id(run_id: str, round_: int, rank: int) -> int:
    """The span id of `rank`'s `gate.round` span of the round (so request spans can link to it)."""
    return _digest(b"pg.round.rank", f"{run_id}/{round_}/{rank}", 8)


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
    if key < window.bound and any(row.decision_open and row.decision_point != GatePoint.NONE for row in rows):
        return SampleReason.OPEN
    if key < ratio.bound:
        return SampleReason.RATIO
    return None


@dataclass(frozen=True, slots=True)
class RoundContext:
    """A traced round: its derived ids and why it is traced."""

    round: int
    trace_id: int
    root_span_id: int
    reason: SampleReason


class RoundSampler:
    """Decides round by round which rounds are traced; remembers the previous rows for the watermark rule.

    One sampler serves every rank of a process (a lockstep group decides each round once, the first
    rank to finish it; the others read `round` and `context`). Deciding round r also tells whether a rate
    may pick round r + 1 (`next_timed`, from its trace id, known before it runs), so that the ranks time
    that round's phases. With `publish`, it also logs its decisions for the run; a sampler without it
    (the controller's) takes a logged decision when the ranks run in its own process (the simulator),
    instead of deciding the same round again.
    """

    # Slots: asked once per round between ~300 us of simulator work, it should touch little memory.
    __slots__ = (
        "_bound",
        "_hot",
        "_log",
        "_publish",
        "_seed",
        "_trace_key",
        "context",
        "next_timed",
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
        self._log = _decision_logs.setdefault(run_id, {})
        self.round = -1  # the round decided last
        self.context: RoundContext | None = None  # its decision
        self.next_timed = False  # whether a rate may pick the round after it
        self._hot: int | None = 0
        self._bound = max(self.ratio.bound, self.window.bound)
        self._seed = run_seed(run_id)
        self._trace_key = _digest_state(b"pg.round.trace", f"{run_id}/", 8)

    def _trace_id(self, round_: int) -> int:
        """`round_trace_id(self.run_id, round_)`, hashing the run id once."""
        state = self._trace_key.copy()
        state.update(str(round_).encode())
        return (int.from_bytes(state.digest(), "big") or 1) << 64 | sampling_key(self._seed, round_)

    def timed(self, round_: int) -> bool:
        """Whether a rate may pick round `round_` (its trace id falls under the larger rate), known before
        it runs: such rounds get their phases timed."""
        return sampling_key(self._seed, round_) < self._bound

    def decide(self, round_: int, rows: Sequence[Row], adopted_epoch: int | None) -> RoundContext | None:
        """The round's context when it is traced, else None.

        Asked every round, so the common answer (no rule applies) costs a sampling key and one pass over
        the rows; the rules are spelled out (`sample_reason`) only for the rounds some rule may pick.
        """
        if round_ == self.round:
            return self.context
        if not self._publish:
            logged = self._log.get(round_, _UNDECIDED)  # one lookup: the deciding thread may trim the log
            if logged is not _UNDECIDED:
                self.round, self._hot, self.context = round_, None, logged
                return logged
        if round_ == 0:
            previous: int | None = 0
        else:
            previous = self._hot if self.round == round_ - 1 else None
        hot = hot_ranks(rows)
        key = sampling_key(self._seed, round_)
        context = None
        if adopted_epoch or key < self._bound or (hot and crossed_watermark(hot, previous)):
            trace_id = self._trace_id(round_)
            reason = sample_reason(trace_id, rows, hot, previous, adopted_epoch, self.ratio, self.window)
            if reason is not None:
                context = RoundContext(round_, trace_id, round_root_span_id(self.run_id, round_), reason)
        self.round, self._hot, self.context = round_, hot, context
        if self._publish:
            self.next_timed = self.timed(round_ + 1)
            self._log[round_] = context
            self._log.pop(round_ - DECISION_MEMORY, None)
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
    ~30 us): the timer of the rounds a rate may pick."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def start(self) -> None:
        self.started = started = _now()
        self.marks = [("start", started)]

    def lap(self, phase: str) -> None:
        self.marks.append((phase, _now()))


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

    A round nobody traces costs a rank one clock read (its start) and two short calls: the decision is
    made once per round for every rank of the process (`RoundSampler`), the phases are timed only in
    the rounds a rate may pick, and nothing is built or allocated. Its row fields (`fill_row`): the
    spans it could not deliver so far, this round's start and, when the previous round was traced, its
    end (the controller's root of a round covers every rank's span with them).
    """

    __slots__ = (
        "_phases",
        "_previous_end",
        "_profiling",
        "_reported",
        "_start_only",
        "_timer",
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
        # rounds a rate may pick, and the others only start.
        self._profiling = not isinstance(engine.timer, NullTimer)
        self._phases: RoundMarks | ProfiledMarks = ProfiledMarks() if self._profiling else RoundMarks()
        self._start_only = StartMark()
        self._timer: RoundMarks | ProfiledMarks | StartMark = self._start_only
        self._arm(engine, self._profiling or sampler.timed(engine.round))

    def _arm(self, engine: RankEngine, timed: bool) -> None:
        """Choose the timer of the next round before it starts."""
        self._timer = engine.timer = self._phases if timed else self._start_only

    @property
    def dropped(self) -> int:
        """Spans of this rank not confirmed delivered (published in the row as `spans_dropped`)."""
        return self.counter.total

    @property
    def timer(self) -> PhaseTimer:
        """The timer armed for the rank's next round (what `engine.timer` is while this observes it)."""
        return self._timer

    def fill_row(self, row: Row) -> None:
        """Publish the drop count and the span bounds the controller's root needs."""
        row.span_start_ns = self._timer.started
        counter = self.counter  # `counter.total`, without a property call on every rank-round
        row.spans_dropped = counter.refused + counter.failed + counter.unconfirmed
        row.previous_span_end_ns = self._previous_end

    def round_done(self, engine: RankEngine, outcome: RoundOutcome) -> None:
        """Trace the round if it is sampled. Never flushes: a flush here would stretch the round (and, in a
        lockstep group, show up as the next ranks' all-gather); the process flushes when it ends."""
        sampler = self.sampler
        try:
            if outcome.round != sampler.round:  # the first rank of the group to finish the round decides
                sampler.decide(outcome.round, outcome.rows, outcome.adopted_epoch)
            if sampler.context is not None:
                self._trace(sampler.context, outcome)
            elif self._previous_end:
                self._previous_end = 0
            timed = self._profiling or sampler.next_timed
            if timed is not (self._timer is self._phases):
                self._arm(engine, timed)
        except Exception:  # a tracing bug must never stop a rank: count the round's spans as lost
            self.counter.failed += 4
            self._previous_end = 0
            if not self._reported:
                self._reported = True
                _log.exception("rank %d: tracing a round failed; the rank continues untraced rounds", self.rank)

    def _trace(self, context: RoundContext, outcome: RoundOutcome) -> None:
        """Offer the round's span tree: with its phases when they were timed, else the rank's span alone."""
        if self._timer is self._phases:
            marks = self._phases.marks
            end = marks[-1][1]
        else:
            end = _now()
            marks = [("start", self._start_only.started), ("commit", end)]
        self._previous_end = end
        self.shipper.offer(self._spans(context, marks, outcome), self.producer, self.counter)

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
        own = rank_span_id(self.run_id, context.round, self.rank)
        attributes: dict[str, Any] = {  # what a reader of the round needs, no more
            "gate.rank": self.rank,
            "gate.round": context.round,
            "gate.point": _POINT_NAMES[decision.point],
            "gate.open": decision.allow_prefill,
            "gate.counter": decision.counter,
            "gate.want_prefill": row.want_prefill,
            "gate.has_decode_work": row.has_decode_work,
            "gate.occupancy": round(row.occupancy, 4),
            "gate.config_epoch": row.config_epoch,
        }
        if outcome.adopted_epoch:
            attributes["gate.adopted_epoch"] = outcome.adopted_epoch
        if len(marks) == 2:
            attributes["gate.phases_timed"] = False  # picked after it ran (config, watermark): no phase marks
        own_span = SpanData(
            trace_id,
            own,
            context.root_span_id,
            "gate.round",
            KIND_INTERNAL,
            marks[0][1],
            marks[-1][1],
            attributes,
            parent_remote=True,  # the controller exports the root
        )
        if len(marks) == 2:
            return [own_span]
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
) -> RankRoundTracer:
    """Observer factory a rank process (or the simulator) loads as `control.telemetry.tracing:rank_observer`.

    The ranks of one process share one shipper and one sampler (a lockstep group decides each round once).
    `window_sample_rate` None: window-open rounds at `sample_rate` like any other.
    """
    if window_sample_rate is None:
        window_sample_rate = sample_rate
    config = ShipperConfig(max_queue_spans=queue_spans, export_timeout_s=export_timeout_s)
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
