"""The one bounded wait on an asyncio event, for every part.

Not ``asyncio.wait_for(event.wait(), timeout)``: on Python 3.11 that runs the wait in a task of its own, and a cancel
that arrives as the event is set can be lost, so the waiting task waits on and a stop that cancels it never returns
(pop's reviver hung that way: tests/test_pop_service.py). ``asyncio.timeout`` waits in the caller's own task.
"""

from __future__ import annotations

import asyncio


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` is set within ``timeout_s`` (it may be set already); a cancel of the caller propagates."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return False
