"""The one bounded wait on an asyncio event (or a future), for every part, and the one bounded wait for a table to
change.

Not ``asyncio.wait_for(event.wait(), timeout)``: on Python 3.11 that runs the wait in a task of its own, and a cancel
that arrives as the event is set can be lost, so the waiting task waits on and a stop that cancels it never returns
(pop's reviver hung that way: tests/test_pop_service.py). ``asyncio.timeout`` waits in the caller's own task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` is set within ``timeout_s`` (it may be set already); a cancel of the caller propagates."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return False


_EXPIRED = "result_within: timed out"   # the cancel message of a future whose wait ran out


async def result_within(fut: asyncio.Future, timeout_s: float) -> object:
    """``fut``'s result, or TimeoutError after ``timeout_s`` (``fut`` is then cancelled); a cancel of the caller
    propagates. Awaited in the caller's task, so whoever resolves ``fut`` wakes the caller directly: through
    ``asyncio.wait_for``'s own future a raft answer woke its writer two loop callbacks later, behind the tick the
    loop had queued meanwhile (tests/test_loop_bridge.py). The wait of every proposal: a timer that cancels ``fut``
    itself costs ~0.5 us where ``asyncio.timeout`` (a context manager rescheduling a timer that cancels the task)
    cost ~3 us, ~2-3% of a leader's CPU under 32 writers."""
    timer = fut.get_loop().call_later(timeout_s, fut.cancel, _EXPIRED)
    try:
        return await fut
    except asyncio.CancelledError as e:
        # The caller's own cancel reaches ``fut`` as another message (Task.cancel cancels what its task awaits).
        if e.args and e.args[0] is _EXPIRED:
            raise TimeoutError(f"no result within {timeout_s} s") from None
        raise
    finally:
        timer.cancel()


class Changes:
    """Bounded waits for a condition that can turn true only when ``changed()`` is called (a table that follows a
    stream: a broker's routes, its lock table). Each wait is bounded in time, and the waits at once in number: past
    the bound a wait answers at once, so a flood of requests cannot pile up on a table that stopped following."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.waiting = 0

    def changed(self) -> None:
        # Waiters hold the event they wait on; a fresh one is for the next change
        self._event.set()
        self._event = asyncio.Event()

    async def until(self, reached: Callable[[], bool], timeout_s: float, waiters_max: int) -> bool:
        """Whether ``reached()`` holds within ``timeout_s``, asked again after each change; False at once when
        ``waiters_max`` wait already. ``reached`` may raise, which ends the wait with its error."""
        deadline = time.monotonic() + timeout_s
        while not reached():
            left = deadline - time.monotonic()
            # Harmless mutant: ``left < 0`` (at exactly 0 the wait below times out at once and the next turn refuses)
            if left <= 0 or self.waiting >= waiters_max:
                return False
            self.waiting += 1
            try:
                await wait_set(self._event, left)
            finally:
                self.waiting -= 1
        return True
