"""The decode set of one rank: every decoding request, advanced together one step per decode round.

Every decoding request decodes in every decode round, so progress is one step counter plus, per
request, the step at which it needs its next KV page and the step at which it finishes, kept in two
heaps. A decode round costs O(events), not O(requests): this is what lets the simulator step 8 ranks x
100k rounds in well under a minute. Inter-token latency is kept the same way, per cohort of requests
whose previous token came at the same time.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from engine.scheduler.plan import BatchRow
from engine.scheduler.request_state import Req
from engine.scheduler.states import ReqState

_Entry = tuple[int, int, int, Req]  # (step, sequence, request version, request)


class DecodeSet:
    """Decoding requests, their decode-step events and their inter-token latency cohorts."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.requests: dict[str, Req] = {}
        self.step = 0  # decode steps this rank has run
        self.finishing: list[Req] = []  # requests whose last token this step produces
        self._seq = 0
        self._growth: list[_Entry] = []
        self._finish: list[_Entry] = []
        self._last_step_time = 0.0
        self._cohorts: dict[float, int] = {}  # previous-token time -> requests

    def __len__(self) -> int:
        return len(self.requests)

    def has_work_after_this_step(self) -> bool:
        """Some request still has tokens to produce after the current step (P2, P3)."""
        return len(self.requests) > len(self.finishing)

    def generated(self, req: Req) -> int:
        """Tokens `req` (a member) has produced so far."""
        return req.generated + self.step - req.step_base

    def newest(self) -> Req:
        """The most recently admitted member: the victim of a decode-driven retraction."""
        return max(self.requests.values(), key=lambda r: r.admit_seq)

    # -- membership --------------------------------------------------------------------------------

    def join(self, req: Req, last_token_time: float) -> None:
        """Add a request whose last token came at `last_token_time`; it decodes from the next step."""
        req.move(ReqState.DECODING)
        req.step_base = self.step
        req.join_time = last_token_time
        self.requests[req.rid] = req
        self._cohorts[last_token_time] = self._cohorts.get(last_token_time, 0) + 1
        kv_len = req.prompt_len + req.generated - 1  # the last token's KV is written by the next step
        finish_step = req.step_base + req.output_len - req.generated
        grow_step = req.step_base + 1 + len(req.pages) * self.page_size - kv_len
        self._push(self._finish, finish_step, req)
        if grow_step <= finish_step:
            self._push(self._growth, grow_step, req)

    def leave(self, req: Req) -> None:
        """Remove a member, making its token count and last-token time exact."""
        del self.requests[req.rid]
        decoded = self.step > req.step_base
        req.generated += self.step - req.step_base
        last = max(req.join_time, self._last_step_time) if decoded else req.join_time
        left = self._cohorts[last] - 1
        if left:
            self._cohorts[last] = left
        else:
            del self._cohorts[last]
        req.join_time = last
        req.version += 1  # its heap entries are stale from now on

    # -- one decode step ---------------------------------------------------------------------------

    def growing(self) -> Iterator[Req]:
        """Members whose next step writes into a new page; call `grew` after giving one a page.

        Members may leave while this runs (a retraction to free a page); their entries are skipped.
        """
        upcoming = self.step + 1
        growth = self._growth
        while growth and growth[0][0] <= upcoming:
            _, _, version, req = heapq.heappop(growth)
            if version == req.version and req.state is ReqState.DECODING:
                yield req

    def grew(self, req: Req) -> None:
        """`req` got the page its next step needs; it needs another one page_size steps later."""
        self._push(self._growth, self.step + 1 + self.page_size, req)

    def begin_step(self) -> None:
        """The rank decodes this round: advance the step and note who finishes with it."""
        self.step += 1
        finish = self._finish
        while finish and finish[0][0] <= self.step:
            _, _, version, req = heapq.heappop(finish)
            if version == req.version and req.state is ReqState.DECODING:
                self.finishing.append(req)

    def rows(self) -> list[BatchRow]:
        """This step's decode rows (built only for executors that need them)."""
        rows = []
        for req in self.requests.values():
            produced = req.generated + (self.step - 1 - req.step_base)
            output = req.output
            rows.append(
                BatchRow(
                    rid=req.rid,
                    extend=False,
                    start=req.prompt_len + produced - 1,
                    num_tokens=1,
                    pages=req.pages,
                    samples=True,
                    input_tokens=(output[-1],) if output else None,
                )
            )
        return rows

    def end_step(self, now: float) -> list[tuple[float, int]]:
        """The step's tokens came at `now`: inter-token latency samples (seconds, requests)."""
        samples = [(now - last, count) for last, count in self._cohorts.items()]
        self._cohorts = {now: len(self.requests)} if self.requests else {}
        self._last_step_time = now
        return samples

    def open_gaps(self, now: float) -> list[tuple[float, int]]:
        """The gaps still open at `now` (seconds since each cohort's previous token, requests), before `now`
        only: what a decoding request that has not had its next token yet has waited so far."""
        return [(now - last, count) for last, count in self._cohorts.items() if last < now]

    def take_finishing(self) -> list[Req]:
        """The requests that produced their last token this step (still members)."""
        done, self.finishing = self.finishing, []
        return done

    def _push(self, heap: list[_Entry], step: int, req: Req) -> None:
        self._seq += 1
        heapq.heappush(heap, (step, self._seq, req.version, req))
