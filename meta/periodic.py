"""One loop for the leader's periodic duties (broker sessions, group leases): a step every interval, a failed step
logged and the loop going on, cancelled on stop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("meta.periodic")


async def run_every(interval_s: float, step: Callable[[], Awaitable[None]], failure_event: str) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(failure_event)
