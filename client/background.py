"""The background tasks of one long-running client object (the exclusive consumer, the pop consumer).

The first task to fail is kept as ``failure`` and sets ``done``, so the object's ``run()`` wakes, cleans up and
raises it: an exception in a background task is never lost in the event loop's log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from typing import Any


class BackgroundTasks:
    def __init__(self, log: logging.Logger, what: str, **context: Any):
        self._log = log
        self._what = what                  # the log event of a failure, e.g. "exclusive_consumer_task_failed"
        self._context = context
        self._tasks: set[asyncio.Task] = set()
        self.done = asyncio.Event()        # a task failed, or the owner closed
        self.failure: BaseException | None = None

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def __iter__(self) -> Iterator[asyncio.Task]:
        return iter(list(self._tasks))

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        e = task.exception()
        if e is not None and self.failure is None:
            self.failure = e
            self._log.error(self._what, exc_info=(type(e), e, e.__traceback__),
                            extra={**self._context, "task": task.get_name()})
            self.done.set()


class InBackground:
    """What a client object that keeps ``BackgroundTasks`` as ``_background`` shows of them."""

    _background: BackgroundTasks

    @property
    def failure(self) -> BaseException | None:
        """The first failure of a background task (``run()`` raises it)."""
        return self._background.failure

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        return self._background.spawn(coro, name)
