"""The tuner: round records in, at most one interval change out at a time, with its reason.

Pure, like the law it wraps: it reads no clock (time is the records' engine clock) and does no I/O;
whoever runs it (the gRPC client `prefill-gate tune`, `serve --autotune-*`, the lab) feeds it the
`prefill_gate.v1.RoundRecord`s a control-plane client reads and carries its proposals out.

What it guards, so that the law only ever sees steady estimates of the config in force:

- a new run (another `run_id`: the engine restarted) resets everything it knew;
- a gap in the stream (a dropped record, a skipped round) restarts the window;
- a new config in force restarts the window and starts a dwell of `dwell_rounds`;
- a change made by anyone else (an operator) holds the tuner for `respect_manual_s` engine seconds;
- estimates count only once the window spans `min_span` of `window_s` and holds `min_rounds` rounds (or
  spans the whole `window_s`), `min_ttft_samples` first tokens and `min_itl_tokens` decode tokens;
- at most `max_changes_per_min` of its own changes in any 60 engine seconds;
- one proposal in flight at a time: nothing new until the records show it adopted, or the runner
  says it failed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from prefill_gate.v1 import types_pb2 as pb
from tuner.estimates import Estimates, Window, facts_of
from tuner.law import FEWER, HOLD, SMALLER, Intervals, LawSettings, Memory, Slo, decide, itl_over, ttft_over

TUNER = "tuner"
LAUNCH = "launch"
# How long a K at which a budget broke keeps slack from growing K back to it (engine seconds).
BROKE_MEMORY_S = 120.0
# An ITL change that did not bring the p99 below this share of where it was counts as no help.
HELPED = 0.97
# A change toward fewer extend rounds made on a tail within the noise must cut the slow tokens by a quarter
# (it halves the extend rounds at best), or the next one is not worth its TTFT: one burst needs one round.
FEWER_HELPED = 0.75


@dataclass(frozen=True, slots=True)
class TunerSettings:
    """The guards around the law (module docstring); the law's own constants in `law`."""

    window_s: float = 30.0
    min_span: float = 0.5  # the window must span this share of window_s: a burst or a lull is not a trend
    min_rounds: int = 200
    min_ttft_samples: int = 40
    min_itl_tokens: int = 2000
    dwell_rounds: int = 300
    max_changes_per_min: float = 4.0
    respect_manual_s: float = 120.0
    hold_s: float = 120.0  # neither way moved the ITL p99: hold this long after the last change, then try again
    evaluate_every: int = 25  # rounds between two looks at the estimates (they cost a sort of the window)
    law: LawSettings = field(default_factory=LawSettings)

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if not 0 <= self.min_span <= 0.9:
            raise ValueError(f"min_span must be in [0, 0.9], got {self.min_span}")
        for name in ("min_rounds", "dwell_rounds", "evaluate_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("min_ttft_samples", "min_itl_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.max_changes_per_min > 0:
            raise ValueError(f"max_changes_per_min must be > 0, got {self.max_changes_per_min}")
        for name in ("respect_manual_s", "hold_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Proposal:
    """A change to ask for: the new intervals, the epoch they replace (expected_epoch) and why."""

    target: Intervals
    expected_epoch: int
    reason: str
    round: int  # the round whose estimates it was decided on


def intervals_of(config: pb.GateConfig) -> Intervals:
    """The intervals a GateConfig holds."""
    return Intervals(config.attempt_interval, config.any_interval) if config.enabled else Intervals(None, None)


class Tuner:
    """Feeds the law steady estimates and turns its verdicts into proposals (module docstring)."""

    def __init__(self, slo: Slo, settings: TunerSettings | None = None, name: str = TUNER) -> None:
        self.slo = slo
        self.settings = settings or TunerSettings()
        self.name = name
        self.window = Window(self.settings.window_s)
        self.status = "waiting for the first round"  # why it holds, in one line (printed when it changes)
        self.events: list[str] = []  # what happened to it (a new run, a gap, someone's change), for the log
        self.run_id: str | None = None
        self.config: pb.GateConfig | None = None  # the config in force, from the latest record
        self.pending: Proposal | None = None
        self.changes: deque[float] = deque()  # engine-clock times of its own adopted changes
        self.last_estimates: Estimates | None = None
        self._last_round: int | None = None
        self._config_round = 0
        self._manual_until = float("-inf")
        self._since_look = 0
        self._itl_change: tuple[str, float, float] | None = None  # (way, ITL p99, clock) of the last ITL change
        self._itl_failed: set[str] = set()  # ways that did not move the ITL p99 (both: stop trying)
        self._broke: tuple[int, float] | None = None  # (K, engine clock) where a budget last broke

    # -- inputs ------------------------------------------------------------------------------------

    def observe(self, record: pb.RoundRecord) -> Proposal | None:
        """One record of the stream; a proposal when the law wants a change and every guard agrees."""
        if record.run_id != self.run_id:
            self._reset(record.run_id)
        elif record.dropped_before or (self._last_round is not None and record.round != self._last_round + 1):
            self.window.clear()
            self._note(f"gap in the stream before round {record.round}: estimates restart")
        self._last_round = record.round
        self._follow(record)
        self.window.add(facts_of(record), len(record.ranks))
        if self.pending is not None:
            return None
        self._since_look += 1
        if self._since_look < self.settings.evaluate_every:
            return None
        self._since_look = 0
        return self._look(record)

    def settle(self, proposal: Proposal, error: str | None = None) -> None:
        """The runner's answer to `proposal`: accepted (None), or refused with `error`.

        An accepted change stays in flight until a record shows its epoch in force (nothing is decided
        on estimates of the config it replaced); a refused one frees the tuner at once.
        """
        if self.pending is not proposal or error is None:
            return
        self.pending = None
        self._itl_change = None  # it never happened
        # A refused attempt counts like a change (dwell, rate cap): a refusal is not answered every round.
        self.changes.append(self._clock())
        self._config_round = self._last_round or 0
        self.status = f"change refused: {error}"

    def dry_run_done(self, proposal: Proposal) -> None:
        """`proposal` was only printed: count it like a change (dwell, rate cap) without a new config."""
        if self.pending is not proposal:
            return
        self.pending = None
        self.changes.append(self._clock())
        self._config_round = proposal.round

    def retry(self, proposal: Proposal, config: pb.GateConfig) -> Proposal | None:
        """Someone changed the config first (FAILED_PRECONDITION): decide again against `config`.

        None when `config` already is what the law wants, or an operator made it (respected).
        """
        self._adopt_config(config, self._last_round or 0, self._clock())
        if self.pending is proposal:
            self.pending = None
        self._itl_change = None  # the change it remembered never happened
        if self._manual_until > self._clock():
            return None
        return self._decide(proposal.round, config)

    def lost(self, why: str) -> None:
        """The stream broke or went stale: keep the config in force, restart the estimates."""
        self.window.clear()
        self._last_round = None
        self._note(f"{why}: keeping {intervals_of(self.config) if self.config else 'the config in force'}")

    def take_events(self) -> list[str]:
        """What happened since the last call (oldest first)."""
        events, self.events = self.events, []
        return events

    # -- internals ---------------------------------------------------------------------------------

    def _reset(self, run_id: str) -> None:
        had = self.run_id is not None
        self.run_id = run_id
        self.window.clear()
        self.config = None
        self.pending = None
        self.changes.clear()
        self.last_estimates = None
        self._last_round = None
        self._manual_until = float("-inf")
        self._since_look = 0
        self._itl_change = None
        self._itl_failed = set()
        self._broke = None
        self._note(f"new run {run_id}: estimates reset" if had else f"run {run_id}: gathering estimates")

    def _clock(self) -> float:
        last = self.window.last
        return last.clock if last is not None else 0.0

    def _follow(self, record: pb.RoundRecord) -> None:
        config = record.config
        if self.config is None or config.epoch != self.config.epoch:
            self._adopt_config(config, record.round, record.clock_seconds)

    def _adopt_config(self, config: pb.GateConfig, round_: int, clock: float) -> None:
        """A config epoch not seen before is in force: restart the window, note who made it."""
        if self.config is not None and config.epoch == self.config.epoch:
            return
        self.config = config
        self._config_round = round_
        self.window.clear()
        if self.pending is not None and config.epoch > self.pending.expected_epoch:
            self.pending = None  # adopted (or overtaken): either way it is no longer in flight
        if config.changed_by == self.name:
            self.changes.append(clock)
            return
        self._itl_change = None  # what follows is not the effect of a change of its own
        self._itl_failed = set()
        if config.changed_by not in (LAUNCH, ""):  # found in force when the tuner joined: respected too
            self._manual_until = clock + self.settings.respect_manual_s
            self._note(
                f"{config.changed_by or 'someone'} changed the config to {intervals_of(config)} at round {round_}: "
                f"respecting it for {self.settings.respect_manual_s:g} s"
            )

    def _note(self, event: str) -> None:
        self.events.append(event)
        self.status = event

    def _look(self, record: pb.RoundRecord) -> Proposal | None:
        s = self.settings
        clock = record.clock_seconds
        if clock < self._manual_until:
            return None  # the status already says whose change is respected
        if record.round - self._config_round < s.dwell_rounds:
            self.status = f"dwelling: the config in force since round {self._config_round} ({s.dwell_rounds} rounds)"
            return None
        while self.changes and clock - self.changes[0] > 60.0:
            self.changes.popleft()
        if len(self.changes) >= s.max_changes_per_min:
            self.status = f"at the cap of {s.max_changes_per_min:g} changes per minute"
            return None
        est = self.window.estimates(self.slo.ttft_p99_s, self.slo.itl_p99_s)
        self.last_estimates = est
        full = est.span_s >= 0.9 * s.window_s  # a full window counts whatever its rounds (slow rounds)
        short = [
            f"{have:g}/{need:g} {what}"
            for what, have, need in (
                ("seconds", round(est.span_s, 1), s.min_span * s.window_s),
                ("rounds", est.rounds, 0 if full else s.min_rounds),
                ("first tokens", est.ttft_samples, s.min_ttft_samples),
                ("decode tokens", est.itl_tokens, s.min_itl_tokens),
            )
            if have < need
        ]
        if short:
            self.status = "gathering estimates: " + ", ".join(short)
            return None
        assert self.config is not None
        return self._decide(record.round, self.config)

    def _decide(self, round_: int, config: pb.GateConfig) -> Proposal | None:
        est = self.last_estimates
        if est is None:
            return None
        verdict = decide(est, intervals_of(config), self.slo, self.settings.law, self._memory(est, config))
        if verdict.target is None:
            self.status = verdict.reason
            return None
        if verdict.way is not None and est.itl_p99_s is not None:
            self._itl_change = (verdict.way, _itl_level(est), self._clock())
        self.pending = Proposal(verdict.target, config.epoch, f"{self.name}: {verdict.reason}", round_)
        return self.pending

    def _memory(self, est: Estimates, config: pb.GateConfig) -> Memory:
        """What earlier changes taught: which way answers ITL here, and a K not to grow back to."""
        clock = self._clock()
        law = self.settings.law
        over_itl = itl_over(est, self.slo, law)
        if config.enabled and (ttft_over(est, self.slo, law) or over_itl):
            k = config.any_interval
            if self._broke is None or clock - self._broke[1] > BROKE_MEMORY_S or k <= self._broke[0]:
                self._broke = (k, clock)
        grow_below = self._broke[0] if self._broke and clock - self._broke[1] <= BROKE_MEMORY_S else None
        if not over_itl:
            self._itl_failed = set()
        held = self._itl_failed >= {SMALLER, FEWER}
        if held and self._itl_change is not None and clock - self._itl_change[2] > self.settings.hold_s:
            self._itl_failed, self._itl_change = set(), None  # held long enough: the model decides afresh
        if self._itl_change is None or not over_itl:
            fewer_failed = (
                self._itl_change is not None
                and self._itl_change[0] == FEWER
                and _itl_level(est) >= FEWER_HELPED * self._itl_change[1]
            )
            return Memory(grow_below=grow_below, fewer_failed=fewer_failed)
        way, before, _ = self._itl_change
        itl = _itl_level(est)
        change = f"{_level_text(before, itl, est)} after the last change toward {way}"
        if itl < HELPED * before:
            self._itl_failed.discard(way)
            return Memory(way, f"it went {change}", grow_below)
        self._itl_failed.add(way)
        if self._itl_failed >= {SMALLER, FEWER}:
            return Memory(HOLD, f"it went {change}, and neither way moved it", grow_below)
        other = FEWER if way == SMALLER else SMALLER
        return Memory(other, f"it went {change}: the other way", grow_below)


def _itl_level(est: Estimates) -> float:
    """What an ITL change is judged by: the share of decode tokens past the budget when the window counted
    it (it moves smoothly where the p99 jumps between a decode round and an extend round), else the p99."""
    return est.itl_tail.share if est.itl_tail is not None else (est.itl_p99_s or 0.0)


def _level_text(before: float, after: float, est: Estimates) -> str:
    if est.itl_tail is not None:
        return f"{before * 100:.2g}% -> {after * 100:.2g}% of decode tokens past the budget"
    return f"{before * 1e3:.0f} -> {after * 1e3:.0f} ms"
