"""The control plane's send budget: at most N WatchRounds messages per second, in total, shared fairly.

gRPC's Python server (and its client) spend a fixed ~0.2 ms of CPU per message. Without a bound, 32
streams at the engine's ~1,500 rounds/s would ask for more CPU than two cores have, and the engine,
which shares the CPUs, would pay for it. The budget makes the control plane's CPU its own bound: every
WatchRounds stream takes a token before each message (a batch is one message) and waits while none is
left. Tokens refill at `rate` per second, at most `burst` of them saved (BURST_S of the rate), so over
any window of T seconds the streams together send at most `burst + rate * T` messages.

Fair: the streams that wait are served in turn (first come, first served, and a stream that got a token
queues behind the others for the next), so while S streams all want to send each gets rate / S; a stream
that does not want to send (idle, or writing to a slow client) takes nothing, and its share goes to the
others. A stream that waits for its token keeps its queue: records beyond its bound are dropped exactly
as a full queue drops them (LOSSLESS_BOUNDED: the oldest, and `dropped_before` tells; LATEST_ONLY: all
but the newest), and the hub counts those as dropped by the budget.

`TokenTurns` is the arithmetic, on an explicit clock (deterministic tests); `SendBudget` puts it on the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable

# The default, from the 2-CPU development machine (bench/results/watch.md): gRPC's Python server spends
# ~0.2 ms of CPU per message, so 1,000 messages/s is at most ~0.2 of a core for the server's writes (and
# as much for clients on the same machine); 32 console-like subscribers (batches of up to 128, 50 ms)
# need at most 32 x 20 = 640 messages/s, so they stay below it and lose nothing to it.
DEFAULT_SEND_BUDGET = 1000
MAX_SEND_BUDGET = 1_000_000
BURST_S = 0.02  # tokens saved while nobody sends: this many seconds of the rate (at least one)
TICK_S = 0.005  # tokens are handed out at most this often while streams wait (one timer per tick)


def budget_violation(rate: int) -> str | None:
    """Why `rate` is not a send budget (None when it is one)."""
    if isinstance(rate, bool) or not isinstance(rate, int) or not 0 <= rate <= MAX_SEND_BUDGET:
        return (
            f"--watch-send-budget must be an integer in [0, {MAX_SEND_BUDGET}] messages per second "
            f"(0: no budget), got {rate!r}"
        )
    return None


class TokenTurns:
    """A token bucket whose waiters take turns; every method takes the time `now` (seconds)."""

    def __init__(self, rate: float, now: float, burst_s: float = BURST_S) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.rate = rate
        self.burst = max(1.0, rate * burst_s)
        self._tokens = self.burst
        self._stamp = now
        self._waiting: deque[Hashable] = deque()

    def _refill(self, now: float) -> None:
        if now > self._stamp:
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now

    def take(self, now: float) -> bool:
        """A token at once, if one is left and nobody waits for one (else: wait your turn)."""
        self._refill(now)
        if self._waiting or self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def wait(self, key: Hashable) -> None:
        """Queue `key` for a token (behind those already waiting)."""
        self._waiting.append(key)

    def leave(self, key: Hashable) -> None:
        """`key` no longer waits."""
        with contextlib.suppress(ValueError):  # it already had its token
            self._waiting.remove(key)

    def grant(self, now: float) -> list[Hashable]:
        """The waiters that get a token now, in turn."""
        self._refill(now)
        out = []
        while self._waiting and self._tokens >= 1:
            self._tokens -= 1
            out.append(self._waiting.popleft())
        return out

    @property
    def waiting(self) -> int:
        """Waiters in the queue."""
        return len(self._waiting)

    def next_token_s(self) -> float:
        """Seconds (from the last refill) until the next whole token."""
        return max(0.0, (1 - self._tokens) / self.rate)


class SendBudget:
    """`TokenTurns` on the event loop: `await acquire()` before each message of a stream."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        problem = budget_violation(rate)
        if problem is not None or rate == 0:
            raise ValueError(problem or "a send budget needs a rate > 0 (0 means none: use no SendBudget)")
        self.rate = rate
        self._clock = clock
        self._turns = TokenTurns(rate, clock())
        self._timer: asyncio.TimerHandle | None = None

    async def acquire(self) -> None:
        """Wait for this stream's turn and a token."""
        if self._turns.take(self._clock()):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns.wait(future)
        self._arm()
        try:
            await future
        except asyncio.CancelledError:
            self._turns.leave(future)
            raise

    def _arm(self) -> None:
        if self._timer is None and self._turns.waiting:
            delay = max(TICK_S, self._turns.next_token_s())
            self._timer = asyncio.get_running_loop().call_later(delay, self._hand_out)

    def _hand_out(self) -> None:
        self._timer = None
        for future in self._turns.grant(self._clock()):
            if not future.done():  # type: ignore[attr-defined]
                future.set_result(None)  # type: ignore[attr-defined]
        self._arm()
