"""The one task of a meta node that writes what waits on a topic (parked long polls, parked watch streams) after each
change of it: it follows the change feed and hands each changed topic to every writer with something parked on it.
``Waiters`` is the writers' one record of what waits on which topic."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import structlog

from wire.waits import wait_set

from ..changefeed import TOPICS, ChangeFeed

log = structlog.get_logger("meta.topic_changes")

IDLE_WAIT_S = 60.0      # the task's wait for a change; it only bounds the wait, nothing is polled
FAILURE_PAUSE_S = 0.2


class Parked(Protocol):
    def topics(self) -> Iterable[str]:
        """The topics something waits on here."""

    async def answer(self, topic: str) -> None:
        """Write what ``topic``'s change owes to whoever waits on it."""

    def wake_all(self, topic: str) -> None:
        """After a failed ``answer``: every waiter of ``topic`` answers for itself."""

    def on_park(self, callback: Callable[[], None]) -> None:
        """``callback()`` each time something parks here."""


async def answer_changes(feed: ChangeFeed, writers: Sequence[Parked]) -> None:
    """Until cancelled. A writer's failure on one topic wakes that topic's waiters, whose handlers answer; the task
    goes on. With nothing parked anywhere it waits for something to park, not for the next change: woken at every
    change with nothing to write, it cost ~2% of a node's CPU at one writer. What changed meanwhile is answered once
    something parks (the changes since the last pass: a superset of what the newly parked can be owed)."""
    parking = asyncio.Event()
    for writer in writers:
        writer.on_park(parking.set)
    scanned = feed.version
    while True:
        if all(next(iter(writer.topics()), None) is None for writer in writers):
            parking.clear()
            await wait_set(parking, IDLE_WAIT_S)
            continue
        if feed.version == scanned:
            await feed.wait(TOPICS, IDLE_WAIT_S)
        changed = feed.changed_since(scanned)
        scanned = feed.version
        for writer in writers:
            parked = writer.topics()
            topics = list(parked) if changed is None else [t for t in changed if t in parked]
            for topic in topics:
                try:
                    await writer.answer(topic)
                except Exception:  # noqa: BLE001 - one topic's failure must not leave everything else parked
                    log.exception("parked_answer_failed", writer=type(writer).__name__, topic=topic)
                    writer.wake_all(topic)
                    await asyncio.sleep(FAILURE_PAUSE_S)


class Waiters:
    """What waits on each topic, in the order it began waiting: the bookkeeping of both writers. A waiter has a
    future ``fut``, which ``cancel_all`` cancels."""

    def __init__(self) -> None:
        self._by_topic: dict[str, dict[Any, None]] = {}
        self.on_park: Callable[[], None] | None = None   # called as each waiter parks (answer_changes wakes)

    def topics(self) -> Iterable[str]:
        return self._by_topic

    def of(self, topic: str) -> list:
        """The waiters of ``topic`` as they are now (a writer that yields the loop goes on over this list)."""
        return list(self._by_topic.get(topic, ()))

    def count(self) -> int:
        return sum(len(w) for w in self._by_topic.values())

    @contextlib.contextmanager
    def parked(self, topic: str, waiter: Any) -> Iterator[None]:
        """``waiter`` waits on ``topic`` while the block runs."""
        waiters = self._by_topic.get(topic)
        if waiters is None:
            waiters = self._by_topic[topic] = {}
        waiters[waiter] = None
        if self.on_park is not None:
            self.on_park()
        try:
            yield
        finally:
            waiters.pop(waiter, None)
            if not waiters and self._by_topic.get(topic) is waiters:
                del self._by_topic[topic]

    def cancel_all(self) -> None:
        for waiters in self._by_topic.values():
            for waiter in waiters:
                if not waiter.fut.done():
                    waiter.fut.cancel()
        self._by_topic.clear()
