"""Short background tasks of a broker part (a seal report, a segment prepared off the loop, a pop handover): each is
cancelled when its owner stops, and a failure is logged, never lost in the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog


class Chores:
    def __init__(self, event: str):
        self._event = event                 # the log event of a failure, e.g. "broker_chore_failed"
        self._tasks: dict[asyncio.Task, None] = {}   # an ordered set: cancelled in the order spawned
        self._log = structlog.get_logger("broker.chores")

    def spawn(self, work: Coroutine[Any, Any, Any], what: str | None = None) -> None:
        """Run ``work`` as a task of its own, named ``what`` (by default its function's name, e.g.
        "PopService._dead_letter"), in the failure's log event too."""
        what = what or work.__qualname__
        task = asyncio.create_task(work, name=what)
        self._tasks[task] = None

        def done(t: asyncio.Task) -> None:
            self._tasks.pop(t, None)
            if not t.cancelled() and t.exception() is not None:
                self._log.warning(self._event, what=what, error=repr(t.exception()))
        task.add_done_callback(done)

    def running(self) -> list[asyncio.Task]:
        return list(self._tasks)

    async def cancel_all(self) -> None:
        tasks = self.running()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
