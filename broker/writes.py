"""The broker's writes: sends into the queue's head segment, seals, and consumer offset commits.

A physical queue is written only while the route says this broker holds the queue's head, the head's logic start is
decided, the broker's session is live with routes as new as its last registration, and the write stays within the
offset budget the log granted (DESIGN.md invariants 4 and 5). Offsets in and out are logic offsets.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from client.wire.errors import ApiError, invalid, rejection

from .codec import encode_message
from .offsets import OffsetStore
from .pop.wakeup import TopicSignals
from .routing import RouteTable, Segment
from .metrics import BrokerMetrics
from .session import MetaSession
from .storage import InvalidArgument, PhysicalQueue, QueueStore, StorageError, check_batch, limits

MESSAGES_PER_SEND_MAX = 10_000
WRITER_THREADS = 16


def not_leader(topic: str, queue: int, head: Segment | None) -> ApiError:
    return rejection(409, "NOT_LEADER", "this broker does not hold the queue's writable segment", topic=topic,
                     queue=queue, broker=head.broker if head else None, address=head.address if head else None)


class _Batch:
    """One send's payloads waiting in its physical queue's group; ``done`` gets its first physical offset."""
    __slots__ = ("payloads", "done", "taken")

    def __init__(self, payloads: list[bytes], done: asyncio.Future):
        self.payloads = payloads
        self.done = done
        self.taken = False       # in a group whose append has started: it will be answered by that group


def _invalid_batch(e: InvalidArgument) -> ApiError:
    """A batch storage refuses (too large a record or batch), in the API's terms."""
    return ApiError(str(e), code=e.code, status=413 if e.code == "TOO_LARGE" else 400)


def unknown_topic(topic: str) -> ApiError:
    return rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} is unknown to this broker", topic=topic)


class Writer:
    def __init__(self, me: str, store: QueueStore, routes: RouteTable, session: MetaSession, offsets: OffsetStore,
                 appended: TopicSignals | None = None, metrics: BrokerMetrics | None = None):
        self.me = me
        self.metrics = metrics
        self.store = store
        self.routes = routes
        self.session = session
        self.offsets = offsets
        self._appended = appended   # wakes pops long-polling the topic
        self._locks: dict[str, asyncio.Lock] = {}
        # Sends waiting for their physical queue's lock, in arrival order: the sender that gets the lock appends
        # them all with one write and one fsync (group commit) instead of one fsync per batch, one after another.
        self._waiting: dict[str, list[_Batch]] = {}
        self._sealed_here: set[str] = set()
        # Appends block in fsync; queues are independent files, so they may sync in parallel.
        self._threads = ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix="append")

    def stop(self) -> None:
        self._threads.shutdown(wait=True)

    def forget(self, physical_queues: set[str]) -> None:
        """Drop per-queue state of physical queues the routes no longer host here."""
        for pq in physical_queues:
            lock = self._locks.get(pq)
            if lock is not None and not lock.locked():
                del self._locks[pq]
            self._sealed_here.discard(pq)
        self.session.forget(physical_queues)

    def _lock(self, pq: str) -> asyncio.Lock:
        lock = self._locks.get(pq)
        if lock is None:
            lock = self._locks[pq] = asyncio.Lock()
        return lock

    def local_queue(self, seg: Segment, create: bool = False) -> PhysicalQueue | None:
        if seg.physical_queue in self.store:
            return self.store.get(seg.physical_queue)
        return self.store.create(seg.physical_queue, seg.physical_start) if create else None

    def max_physical(self, seg: Segment) -> int:
        q = self.local_queue(seg)
        return q.max_offset if q is not None else seg.physical_start

    def max_offsets(self, segs: list[Segment]) -> dict[str, int]:
        return {s.physical_queue: self.max_physical(s) for s in segs}

    # -- send --------------------------------------------------------------------------------------------------
    def _refuse_stale_slot_table(self, topic: str, queue: int, messages: list[Any], sender: int | None) -> None:
        """A keyed message chosen with a slot table older than this broker's must not land here: after a growth
        its key may belong to a new queue, and one written to the old queue after the split point would be
        consumed after the key's newer messages (DESIGN.md invariant 7). NOT_LEADER makes the sender re-read the
        route (at least this broker's version) and choose again; a sender that names no version is trusted."""
        route = self.routes.routes.get(topic)
        if sender is None or route is None or sender >= route.get("slot_table_version", 0):
            return
        if any(isinstance(m, dict) and m.get("key") is not None for m in messages):
            raise rejection(409, "NOT_LEADER", "the sender's route predates the topic's slot table: re-read the "
                            "route and choose the queue again", topic=topic, queue=queue,
                            slot_table_version=route.get("slot_table_version", 0))

    def _writable_head(self, topic: str, queue: int) -> Segment:
        if topic not in self.routes.routes:
            raise unknown_topic(topic)
        head = self.routes.head(topic, queue)
        if head is None:
            raise rejection(404, "QUEUE_NOT_FOUND", f"queue {queue} does not exist", topic=topic, queue=queue)
        if head.broker != self.me:
            raise not_leader(topic, queue, head)
        if head.state != "active" or head.logic_start is None or head.physical_queue in self._sealed_here:
            raise rejection(503, "SEALING", "the queue is being remapped; retry shortly", topic=topic, queue=queue)
        if not self.session.writable(self.routes.version):
            raise rejection(503, "FENCED", "this broker's meta session has lapsed or its routes are behind the log; "
                            "it takes no writes until both are current")
        return head

    async def send(self, topic: str, queue: int, messages: list[Any], sender_route_version: int | None = None,
                   plain: bool = False) -> list[int]:
        """``sender_route_version``: the route version the sender chose the queue with (``X-Route-Version``);
        ``plain``: the messages were parsed from a body ``codec.plain_json_text`` accepted."""
        if not messages or len(messages) > MESSAGES_PER_SEND_MAX:
            raise invalid(f"messages must hold 1 to {MESSAGES_PER_SEND_MAX} messages")
        self._refuse_stale_slot_table(topic, queue, messages, sender_route_version)
        payloads = [encode_message(m, plain) for m in messages]
        while True:
            head = self._writable_head(topic, queue)
            first = await self._commit(head, payloads)
            if first is not None:
                break
        if self._appended is not None:
            self._appended.notify(topic)
        start = head.logic(first)   # a segment maps physical to logic offsets by one shift
        return list(range(start, start + len(payloads)))

    async def prepare(self, seg: Segment) -> None:
        """Create a new segment's physical queue as soon as the route opens it, on a writer thread.

        Creating one costs two directory fsyncs; done lazily on the first send, on the event loop, it stalled the
        broker's whole loop (watch stream, heartbeats, every other queue) inside each remap's pause.
        """
        async with self._lock(seg.physical_queue):
            await self._create(seg)

    async def _create(self, seg: Segment) -> PhysicalQueue:
        pq = self.local_queue(seg)
        if pq is None:
            pq = await asyncio.get_running_loop().run_in_executor(self._threads, self.local_queue, seg, True)
        return pq

    async def _commit(self, head: Segment, payloads: list[bytes]) -> int | None:
        """Store one send's batch in the head's physical queue and return its first physical offset; None when the
        route moved on while the send waited (the caller starts again from the new head).

        Group commit: the batch waits in the queue's list; whichever sender holds the queue's lock appends every
        batch waiting then, in arrival order, as one storage batch (one write, one fdatasync), and each sender is
        answered only once that fdatasync returned. A sender that finds its batch answered, or taken by a group whose
        append runs, just waits for its answer."""
        pq_name = head.physical_queue
        batch = _Batch(payloads, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(pq_name, []).append(batch)
        try:
            while not batch.taken and not batch.done.done():
                async with self._lock(pq_name):
                    if batch.taken or batch.done.done():
                        break
                    # The route may have moved on while this send waited for the lock: the lock held must be that
                    # of the segment written, or a seal of the new head could read its end while this append runs.
                    current = self._writable_head(head.topic, head.queue)
                    if current.physical_queue != pq_name:
                        return None
                    await self._append_group(current)
            return await batch.done
        finally:
            if not batch.taken:
                waiting = self._waiting.get(pq_name)
                if waiting is not None and batch in waiting:
                    waiting.remove(batch)
                    if not waiting:
                        del self._waiting[pq_name]

    def _take_group(self, head: Segment, pq: PhysicalQueue) -> tuple[list[_Batch], list[bytes]]:
        """The waiting batches that go into one append, from the oldest: as many as one storage batch holds. A batch
        past the offset budget or refused by storage's checks is answered with its error here, as it was when each
        batch was appended alone: the budget first, then the sizes."""
        waiting = self._waiting.pop(head.physical_queue, [])
        budget = max(self.session.budgets.get(head.physical_queue, 0), head.budget_end)
        end = pq.max_offset
        group: list[_Batch] = []
        records: list[bytes] = []
        group_bytes = 0
        for i, batch in enumerate(waiting):
            if batch.done.done():
                continue
            count = len(batch.payloads)
            if end + count > budget:
                self.session.beat_soon()
                batch.done.set_exception(rejection(503, "BUDGET_EXHAUSTED", "waiting for meta to renew this "
                                                   "queue's offset budget", topic=head.topic, queue=head.queue))
                continue
            try:
                size = check_batch(batch.payloads)
            except InvalidArgument as e:
                batch.done.set_exception(_invalid_batch(e))
                continue
            if group and (len(records) + count > limits.BATCH_RECORDS_MAX
                          or group_bytes + size > limits.BATCH_BYTES_MAX):
                self._waiting[head.physical_queue] = waiting[i:]   # the next lock holder appends these
                break
            batch.taken = True
            group.append(batch)
            records.extend(batch.payloads)
            group_bytes += size
            end += count
        if group and self.session.renewal_due(budget, end):
            self.session.beat_soon()  # renew early so writers never wait for the budget
        return group, records

    async def _append_group(self, head: Segment) -> None:
        """Append one group of waiting batches; the caller holds the segment's lock. Every batch of the group is
        answered when the append ends, even if the caller is cancelled while it runs (a done-callback answers)."""
        pq = await self._create(head)
        group, records = self._take_group(head, pq)
        if not group:
            return
        started = time.perf_counter()
        job = asyncio.get_running_loop().run_in_executor(self._threads, pq.append, records, int(time.time() * 1000))
        job.add_done_callback(lambda job: self._answer(head, group, job, started))
        await asyncio.wait([job])

    def _answer(self, head: Segment, group: list[_Batch], job: asyncio.Future, started: float) -> None:
        error: Callable[[], BaseException] | None = None
        if job.cancelled():
            error = lambda: rejection(503, "STORAGE_UNAVAILABLE", "the append was cancelled",  # noqa: E731
                                      topic=head.topic, queue=head.queue)
        elif isinstance(job.exception(), InvalidArgument):  # the queue ran out of offsets, in storage's terms
            e = job.exception()
            error = lambda: _invalid_batch(e)  # noqa: E731
        elif isinstance(job.exception(), StorageError):  # a failed write or fsync: no writes until reopened
            code = job.exception().code
            error = lambda: rejection(503, "STORAGE_UNAVAILABLE",  # noqa: E731
                                      f"the broker could not store the batch: {code}", topic=head.topic,
                                      queue=head.queue)
        elif job.exception() is not None:
            e = job.exception()
            error = lambda: e  # noqa: E731
        if error is not None:
            for batch in group:
                if not batch.done.done():
                    batch.done.set_exception(error())
            return
        first = job.result()
        seconds = time.perf_counter() - started
        for batch in group:
            if not batch.done.done():   # a sender cancelled meanwhile has no one to answer
                batch.done.set_result(first)
            first += len(batch.payloads)
            if self.metrics is not None:
                self.metrics.append.observe(seconds)
                self.metrics.stored(head.topic, batch.payloads)

    async def seal(self, seg: Segment) -> int:
        """Stop writes to a sealing segment and return its exact physical end."""
        async with self._lock(seg.physical_queue):
            self._sealed_here.add(seg.physical_queue)
            return self.max_physical(seg)

    # -- consumer offsets --------------------------------------------------------------------------------------
    async def commit_offset(self, group: str, topic: str, queue: int, offset: int) -> int:
        head = self.routes.head(topic, queue)
        if head is None:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} queue {queue} is unknown to this broker")
        if head.broker != self.me:
            raise not_leader(topic, queue, head)
        await self.offsets.commit(group, topic, queue, offset)
        return offset
