"""The per-rank continuous-batching scheduler: where the gate's permission meets real capacity.

Choices where SEMANTICS.md is silent (also in docs/scheduler.md):

- Prefill candidates are taken in the *blocker-redirect order*: resident chunks first (the head of the
  line), then new prompts in arrival order. A chunk takes what the round budget and the free pages
  allow; an incomplete chunk holds the head of the line (S8).
- Retraction victims are the newest-admitted running requests first (decoding requests and resident
  chunks), as vLLM and SGLang pick them. Decode growth retracts decoding requests only.
- Capacity retraction (S4) happens only for an eligible candidate that cannot get pages for a minimal
  chunk (one page, or its remainder). If the victims it would need include the candidate itself, the
  candidate is the blocker: the grant is redirected to the first alternative in the blocker-redirect
  order that passes the same eligibility checks and fits in what retracting up to the blocker frees.
  If none does, nothing is retracted.
- Readmission restores run on every plan, gate or not (S2), oldest retraction first, at most
  `max_readmissions_per_round`, only into a free batch slot and only while the pool stays at or under
  the watermark after the restore (so a restore never immediately forces another retraction) - unless
  nothing else runs on the rank, where a large image must come back whatever its size.
- Every decoding request decodes in every decode round: `DecodeSet` (decode_set.py) keeps their
  progress as one step counter plus per-request events, so a decode round costs O(events).
"""

from __future__ import annotations

from collections import deque

from engine.config import ServerArgs
from engine.executor.base import ForwardResult
from engine.policy import LocalView
from engine.request import (
    AbortIgnored,
    Admitted,
    ChunkPlanned,
    Finished,
    FinishReason,
    FirstToken,
    Refused,
    RequestError,
    RequestEvent,
    RequestSpec,
    Retracted,
    Tokens,
)
from engine.scheduler.decode_set import DecodeSet
from engine.scheduler.plan import (
    K_PREFILL_WATERMARK,
    BatchKind,
    BatchRow,
    CacheOp,
    CacheOpKind,
    Plan,
    PlanBuild,
    PlanOptions,
    PoolCounts,
    Probe,
)
from engine.scheduler.pool import DevicePool, pages_for
from engine.scheduler.request_state import Req
from engine.scheduler.states import ReqState

S = ReqState


class Scheduler:
    """One rank's requests, Device pool and host tier; `plan` and `probe_prefill_gate` per round."""

    def __init__(
        self,
        args: ServerArgs,
        rank: int = 0,
        *,
        prefix_cache: bool = True,
        keep_tokens: bool = False,
    ) -> None:
        self.rank = rank
        self.page_size = args.page_size
        self.max_batch_size = args.max_batch_size
        self.budget = args.chunked_prefill_size
        self.mixed = args.enable_mixed_prefill_decode
        self.storage_read_ticks = args.storage_read_ticks
        self.max_readmissions = args.max_readmissions_per_round
        self.prefix_cache = prefix_cache
        self.keep_tokens = keep_tokens
        self.pool = DevicePool(args.kv_pages, args.page_size)
        self.round = 0
        self.now = 0.0
        self.retractions_total = 0
        self._live: dict[str, Req] = {}
        self._storage: deque[Req] = deque()
        self._waiting: deque[Req] = deque()
        self._resident: deque[Req] = deque()
        self._prefill_done: list[Req] = []
        self._decode = DecodeSet(args.page_size)
        self._restoring: dict[str, Req] = {}
        self._retracting: dict[str, Req] = {}
        self._retracted: deque[Req] = deque()
        self._pending_tokens = 0
        self._admit_seq = 0
        self._paused = False
        self._events: list[RequestEvent] = []
        self._itl: list[tuple[float, int]] = []

    # -- intake ------------------------------------------------------------------------------------

    def start_round(self, round_index: int, now: float) -> None:
        """Set the round and clock the scheduler stamps its events with."""
        self.round = round_index
        self.now = now

    def submit(self, spec: RequestSpec) -> None:
        """Accept a request, or raise RequestError and change nothing."""
        spec.check(usable_pages=self.pool.usable, page_size=self.page_size, prefix_cache=self.prefix_cache)
        if spec.rid in self._live:
            raise RequestError(f"request {spec.rid}: duplicate request id (a live request has it)")
        reading = spec.prefix_hit > 0 and self.storage_read_ticks > 0
        req = Req(spec, S.STORAGE_READ if reading else S.NEW, self.keep_tokens)
        if reading:
            req.storage_done_round = self.round + self.storage_read_ticks
            self._storage.append(req)
        else:
            self._make_schedulable(req)
        self._live[spec.rid] = req
        self._pending_tokens += req.prefill_left

    def refuse(self, rid: str, error: str) -> None:
        """Report a refused submit."""
        self._events.append(Refused(rid, self.rank, error))

    def abort(self, rid: str) -> bool:
        """Abort a request in any state, freeing what it holds; an unknown id is a reported no-op."""
        req = self._live.get(rid)
        if req is None:
            self._events.append(AbortIgnored(rid, self.rank))
            return False
        self._detach(req)
        self._end(req, S.ABORTED, FinishReason.ABORT)
        return True

    def cut_off(self, detail: str) -> None:
        """The engine stops with requests still live: each ends as cut off, with what it generated."""
        for req in list(self._live.values()):
            self._detach(req)
            self._end(req, S.ABORTED, FinishReason.CUT_OFF, detail)

    def _detach(self, req: Req) -> None:
        """Take a live request out of whatever queue or set holds it."""
        rid, state = req.rid, req.state
        if state is S.STORAGE_READ:
            self._storage.remove(req)
        elif state is S.NEW:
            self._waiting.remove(req)
        elif state is S.PREFILLING:
            self._resident.remove(req)
        elif state is S.DECODING:
            self._decode.leave(req)
        elif state is S.RETRACTING:
            del self._retracting[rid]
        elif state is S.RETRACTED:
            self._retracted.remove(req)
        elif state is S.RESTORING:
            del self._restoring[rid]
        self._pending_tokens -= req.prefill_left  # 0 once its prefill is done

    def pause_for_weight_update(self) -> None:
        """The next plan is a pause: no prefill, no decode, one round."""
        self._paused = True

    def storage_tick(self) -> None:
        """Complete storage reads whose ticks have passed; their prompts become schedulable."""
        while self._storage and self._storage[0].storage_done_round <= self.round:
            req = self._storage.popleft()
            req.move(S.NEW)
            self._make_schedulable(req)

    def acknowledge(self, ops: list[CacheOp]) -> None:
        """Cache operations the executor completed: offloads end retraction, restores readmit."""
        for op in ops:
            req = self._live.get(op.rid)
            if req is None:
                continue  # aborted while its operation was in flight
            if op.kind is CacheOpKind.OFFLOAD and req.state is S.RETRACTING:
                del self._retracting[req.rid]
                req.move(S.RETRACTED)
                self._retracted.append(req)
            elif op.kind is CacheOpKind.RESTORE and req.state is S.RESTORING:
                del self._restoring[req.rid]
                if req.resume is S.DECODING:
                    self._decode.join(req, req.join_time)
                else:
                    req.move(S.PREFILLING)
                    self._resident.append(req)

    # -- the probe (P1-P3) ---------------------------------------------------------------------------

    def probe_prefill_gate(self) -> Probe:
        """wants_prefill (P1) and has_decode_work (P2) on the current state."""
        new_waiting = bool(self._waiting or self._storage)
        wants = bool(self._resident) or (new_waiting and self.pool.occupancy <= K_PREFILL_WATERMARK)
        return Probe(wants_prefill=wants, has_decode_work=self._has_decode_work())

    def local_view(self) -> LocalView:
        """What the policy may read of this rank before the plan."""
        probe = self.probe_prefill_gate()
        return LocalView(
            wants_prefill=probe.wants_prefill,
            has_decode_work=probe.has_decode_work,
            oldest_wait_rounds=self.round - self._waiting[0].schedulable_round if self._waiting else -1,
        )

    def _has_decode_work(self) -> bool:
        if self._decode.has_work_after_this_step():
            return True
        if any(req.output_len > 1 for req in self._prefill_done):
            return True  # its prefill just finished: it runs its first decode next round
        return any(req.resume is S.DECODING for req in self._restoring.values())

    # -- the plan ----------------------------------------------------------------------------------

    def plan(self, options: PlanOptions) -> Plan:
        """Build this round's batch under `options` (S1-S8)."""
        plan = Plan(round=self.round)
        if self._paused:
            self._paused = False
            plan.kind, plan.build = BatchKind.PAUSED, PlanBuild.PAUSED
        else:
            self._readmit(plan)
            if self.mixed:
                self._plan_decode(plan)
                # S3: what the decode rows leave is at least one page of tokens for the pending prefill,
                # because startup refuses a budget below the per-rank batch plus one page.
                self._plan_prefill(plan, options, self.budget - plan.num_decodes)
            else:
                self._plan_prefill(plan, options, self.budget)
                if not plan.extend_rows:
                    self._plan_decode(plan)  # without mixed mode a round is prefill or decode
            plan.kind = _kind(plan)
        plan.counts = self.counts()
        return plan

    def _readmit(self, plan: Plan) -> None:
        """S2: restore retracted requests; cache operations that take no prefill tokens."""
        restored = 0
        while self._retracted and restored < self.max_readmissions:
            req = self._retracted[0]
            count = pages_for(req.host_tokens, self.page_size)
            if self.running >= self.max_batch_size or count > self.pool.free:
                break
            if self.running and (self.pool.used + count) / self.pool.usable > K_PREFILL_WATERMARK:
                break  # on an otherwise empty rank a large image must still come back, or it waits forever
            self._retracted.popleft()
            req.pages = self.pool.allocate(count)
            req.move(S.RESTORING)
            self._restoring[req.rid] = req
            plan.cache_ops.append(CacheOp(CacheOpKind.RESTORE, req.rid, tuple(req.pages), req.host_tokens))
            restored += 1

    def _plan_prefill(self, plan: Plan, options: PlanOptions, budget: int) -> None:
        """Chunks in blocker-redirect order under the permission (S1, S4, S5, S7, S8)."""
        chunks_ok, new_ok = options.chunks_allowed, options.allow_prefill
        while budget > 0:
            cand = self._resident[0] if self._resident else (self._waiting[0] if self._waiting else None)
            if cand is None:
                return
            refusal = self._ineligible(cand, chunks_ok, new_ok)
            if refusal is not None:
                plan.build = refusal
                return
            granted = cand if self._chunk_fits(cand, budget) else self._capacity_retract(cand, plan, options)
            if granted is None:
                plan.build = PlanBuild.NO_MEMORY
                return
            chunk = self._extend(plan, granted, budget)
            budget -= chunk
            if granted.state is S.PREFILLING:
                return  # S8: an incomplete chunk holds the head of the line

    def _ineligible(self, req: Req, chunks_ok: bool, new_ok: bool, freed_slots: int = 0) -> PlanBuild | None:
        """Why `req` may not prefill now, or None (S1, S5, S7; re-checked for every redirect, S4)."""
        if req.state is S.PREFILLING:
            return None if chunks_ok else PlanBuild.GATED
        if not new_ok:
            return PlanBuild.GATED
        if self.pool.occupancy > K_PREFILL_WATERMARK:
            return PlanBuild.WATERMARK
        if self.running - freed_slots >= self.max_batch_size:
            return PlanBuild.FULL
        return None

    def _min_pages(self, req: Req, extra_free: int = 0) -> int:
        """Pages `req` still lacks for a minimal chunk (one page of tokens, or its remainder)."""
        base = max(req.computed, req.prefix)
        minimal = min(req.prefill_left, self.page_size)
        return max(0, pages_for(base + minimal, self.page_size) - len(req.pages) - extra_free)

    def _chunk_fits(self, req: Req, budget: int) -> bool:
        return self._min_pages(req) <= self.pool.free and budget > 0

    def _capacity_retract(self, cand: Req, plan: Plan, options: PlanOptions) -> Req | None:
        """S4: free pages for an eligible candidate, redirecting the grant if it is the blocker."""
        victims = self._victims(self._min_pages(cand) - self.pool.free, protect=plan)
        if victims is None:
            return None
        if cand not in victims:
            for victim in victims:
                self._retract(victim, plan)
            return cand
        # The candidate would be retracted to make room for itself: it is the blocker. Redirect the
        # grant to the first alternative that passes the same checks and fits in what that frees.
        upto = victims[: victims.index(cand) + 1]
        freed = self.pool.free + sum(len(v.pages) for v in upto)
        chunks_ok, new_ok = options.chunks_allowed, options.allow_prefill
        for alt in self._redirect_order(cand):
            if alt in upto or self._ineligible(alt, chunks_ok, new_ok, freed_slots=len(upto)) is not None:
                continue
            if self._min_pages(alt) <= freed:
                for victim in upto:
                    self._retract(victim, plan)
                return alt
        return None

    def _redirect_order(self, blocker: Req) -> list[Req]:
        """Alternatives after `blocker`: the other resident chunks, then new prompts in arrival order."""
        return [req for req in self._resident if req is not blocker] + list(self._waiting)

    def _victims(self, deficit: int, protect: Plan) -> list[Req] | None:
        """Newest-admitted running requests whose pages cover `deficit`, or None if all cannot."""
        if deficit <= 0:
            return []
        movable = [req for req in self._resident if req.pages]
        if not (self.mixed and protect.num_decodes):
            movable += self._decode.requests.values()  # mixed mode: this round's decode rows are already planned
        chosen: list[Req] = []
        for req in sorted(movable, key=lambda r: r.admit_seq, reverse=True):
            chosen.append(req)
            deficit -= len(req.pages)
            if deficit <= 0:
                return chosen
        return None

    def _extend(self, plan: Plan, req: Req, budget: int) -> int:
        """Schedule one chunk of `req`: as much as the budget and the free pages allow."""
        base = max(req.computed, req.prefix)
        room = (len(req.pages) + self.pool.free) * self.page_size - base
        chunk = min(req.prefill_left, budget, room)
        if req.state is S.NEW:
            self._admit(plan, req)
        req.pages.extend(self.pool.allocate(pages_for(base + chunk, self.page_size) - len(req.pages)))
        done = base + chunk == req.prompt_len
        prompt = req.prompt
        plan.extend_rows.append(
            BatchRow(
                rid=req.rid,
                extend=True,
                start=base,
                num_tokens=chunk,
                pages=req.pages,
                samples=done,
                input_tokens=prompt[base : base + chunk] if prompt is not None else None,
            )
        )
        plan.prefill_tokens += chunk
        req.computed = base + chunk
        self._pending_tokens -= chunk
        self._events.append(ChunkPlanned(req.rid, self.rank, self.round, chunk))
        if done:
            if req.state is S.PREFILLING:
                self._resident.remove(req)
            req.move(S.PREFILL_DONE)
            self._prefill_done.append(req)
        elif req.state is not S.PREFILLING:
            req.move(S.PREFILLING)
            self._resident.append(req)
        return chunk

    def _admit(self, plan: Plan, req: Req) -> None:
        """A new prompt gets its first chunk: it leaves the queue and loads its cached prefix."""
        self._waiting.remove(req)
        req.admit_seq = self._admit_seq
        self._admit_seq += 1
        if req.prefix:
            req.pages = self.pool.allocate(pages_for(req.prefix, self.page_size))
            req.computed = req.prefix
            plan.cache_ops.append(CacheOp(CacheOpKind.LOAD_PREFIX, req.rid, tuple(req.pages), req.prefix))
        self._events.append(
            Admitted(
                req.rid,
                self.rank,
                self.round,
                self.now,
                self.round - req.schedulable_round,
                self.now - req.schedulable_time,
            )
        )

    def _plan_decode(self, plan: Plan) -> None:
        """Every decoding request decodes; requests due a new page get one or cause a retraction."""
        decode = self._decode
        if not decode:
            return
        for req in decode.growing():
            if self._free_a_page_for(req, plan):
                req.pages.extend(self.pool.allocate(1))
                decode.grew(req)
        if not decode:
            return
        decode.begin_step()
        plan.num_decodes = len(decode)
        plan.decode_rows_fn = decode.rows

    def _free_a_page_for(self, req: Req, plan: Plan) -> bool:
        """Decode-driven retraction: newest decoding requests first; False if `req` itself went."""
        while self.pool.free < 1:
            victim = self._decode.newest()
            self._retract(victim, plan)
            if victim is req:
                return False
        return True

    # -- retraction --------------------------------------------------------------------------------

    def _retract(self, req: Req, plan: Plan) -> None:
        """Move a running request's KV image to the host tier and free its pages now.

        The executor runs offloads before restores and before the forward, so the freed pages can be
        granted within the same round.
        """
        if req.state is S.DECODING:
            self._decode.leave(req)
            req.host_tokens = req.prompt_len + req.generated - 1
            req.resume = S.DECODING
        else:
            self._resident.remove(req)
            req.host_tokens = req.computed
            req.resume = S.PREFILLING
        plan.cache_ops.append(CacheOp(CacheOpKind.OFFLOAD, req.rid, tuple(req.pages), req.host_tokens))
        self.pool.release(req.pages)
        req.pages = []
        req.move(S.RETRACTING)
        self._retracting[req.rid] = req
        self.retractions_total += 1
        self._events.append(Retracted(req.rid, self.rank, self.round))

    # -- commit ------------------------------------------------------------------------------------

    def commit(self, plan: Plan, result: ForwardResult, now: float) -> None:
        """Apply the forward's results: decode progress, first tokens, finishes."""
        self.now = now
        tokens = result.tokens
        if plan.num_decodes:
            self._itl += self._decode.end_step(now)
            if tokens is not None:
                for req in self._decode.requests.values():
                    self._emit_tokens(req, tokens)
            for req in self._decode.take_finishing():
                self._decode.leave(req)
                self._end(req, S.FINISHED, FinishReason.LENGTH)
        for req in self._prefill_done:
            req.generated = 1
            self._emit_tokens(req, tokens)
            self._events.append(FirstToken(req.rid, self.rank, self.round, now))
            if req.output_len == 1:
                self._end(req, S.FINISHED, FinishReason.LENGTH)
            else:
                self._decode.join(req, now)
        self._prefill_done.clear()

    def _emit_tokens(self, req: Req, tokens: dict[str, int] | None) -> None:
        if tokens is None or req.output is None:
            return
        token = tokens[req.rid]
        req.output.append(token)
        self._events.append(Tokens(req.rid, (token,)))

    def _end(self, req: Req, state: ReqState, reason: FinishReason, detail: str = "") -> None:
        """Finish or abort: free every page, forget the request, report it."""
        if req.pages:
            self.pool.release(req.pages)
            req.pages = []
        req.move(state)
        req.version += 1
        del self._live[req.rid]
        self._events.append(Finished(req.rid, self.rank, self.round, self.now, reason, req.generated, detail))

    # -- views -------------------------------------------------------------------------------------

    def _make_schedulable(self, req: Req) -> None:
        req.schedulable_round = self.round
        req.schedulable_time = self.now
        self._waiting.append(req)

    @property
    def running(self) -> int:
        """Requests holding a batch slot."""
        return len(self._resident) + len(self._prefill_done) + len(self._decode) + len(self._restoring)

    def counts(self) -> PoolCounts:
        """The counts a round row publishes."""
        return PoolCounts(
            pool_pages_used=self.pool.used,
            pool_pages_usable=self.pool.usable,
            resident_chunks=len(self._resident),
            waiting_prompts=len(self._waiting) + len(self._storage),
            storage_reads=len(self._storage),
            retracted=len(self._retracting) + len(self._retracted),
            running=self.running,
            pending_prefill_tokens=min(self._pending_tokens, self.budget),
            retractions_total=self.retractions_total,
        )

    def state_of(self, rid: str) -> ReqState | None:
        """A live request's state, or None once it ended."""
        req = self._live.get(rid)
        return req.state if req else None

    @property
    def live(self) -> int:
        """Requests not yet finished or aborted."""
        return len(self._live)

    def take_events(self) -> list[RequestEvent]:
        """Events since the last call."""
        events, self._events = self._events, []
        return events

    def open_itl(self, now: float) -> list[tuple[float, int]]:
        """Inter-token gaps still open at `now` (seconds, requests): decoding requests waiting for a token."""
        return self._decode.open_gaps(now)

    def take_itl(self) -> list[tuple[float, int]]:
        """Inter-token latency samples (seconds, requests) since the last call."""
        itl, self._itl = self._itl, []
        return itl


def _kind(plan: Plan) -> BatchKind:
    if plan.extend_rows:
        return BatchKind.MIXED if plan.num_decodes else BatchKind.EXTEND
    return BatchKind.DECODE if plan.num_decodes else BatchKind.IDLE
