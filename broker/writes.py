"""The broker's writes: sends into the queue's head segment, seals, and consumer offset commits.

A physical queue is written only while the route says this broker holds the queue's head, the head's logic start is
decided, the broker's session is live with routes as new as its last registration, and the write stays within the
offset budget the log granted (DESIGN.md invariants 4 and 5). Offsets in and out are logic offsets.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from wire import batch
from wire.errors import ApiError, invalid, rejection
from wire.names import parse_physical_queue_name

from .codec import TAG_JSON, encode_message
from .group_commit import GroupCommit
from .offsets import OffsetStore
from .peers import Peers
from .pop.wakeup import TopicSignals
from .producer_journal import ProducerJournal
from .producers import Batch, ProducerTable
from .replication.leader import ReplicaTracker
from .replication.offsets import OffsetCopies
from .replication.producer_handover import ProducerHandover
from .routing import RouteTable, Segment
from .metrics import BrokerMetrics
from .session import MetaSession
from .storage import (FLUSH_FSYNC, FLUSH_GROUP, InvalidArgument, PhysicalQueue, ProducerMark, QueueFailed,
                      QueueStore, Run, StorageError)
from .storage_threads import StorageThreads

MESSAGES_PER_SEND_MAX = 10_000
WRITER_THREADS = 16


def not_leader(topic: str, queue: int, head: Segment | None) -> ApiError:
    return rejection(409, "NOT_LEADER", "this broker does not hold the queue's writable segment", topic=topic,
                     queue=queue, broker=head.broker if head else None, address=head.address if head else None)


def _storage_unavailable(head: Segment, e: StorageError) -> ApiError:
    return rejection(503, "STORAGE_UNAVAILABLE", f"the broker could not store the batch: {e.code}",
                     topic=head.topic, queue=head.queue)


def unknown_topic(topic: str) -> ApiError:
    return rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} is unknown to this broker", topic=topic)


def stored_run(pq: PhysicalQueue, first: int, records: bytes, count: int, tag: int) -> Run:
    """The run an append just stored at ``first`` (the caller holds the queue's lock, so no other append came
    between), with the time storage stamped it with: raised to the last one when the clock went back."""
    return Run(first, pq.last_ts_ms, count, tag, records)


class Writer:
    def __init__(self, me: str, store: QueueStore, routes: RouteTable, session: MetaSession, offsets: OffsetStore,
                 appended: TopicSignals | None = None, metrics: BrokerMetrics | None = None,
                 producer_log: ProducerJournal | None = None, peers: Peers | None = None, driven: bool = False):
        """``producer_log``: where the producers' batches are kept across restarts (the broker's producers.log);
        without it (a writer alone in a unit test) they are kept in memory only. ``peers``: how committed offsets
        reach the queue's copies (replication/offsets.py); without it (a unit test) they stay here. ``driven``: no
        thread of its own (BrokerNode's)."""
        self.me = me
        self.metrics = metrics
        self.store = store
        self.routes = routes
        self.session = session
        self.offsets = offsets
        self._appended = appended   # wakes pops long-polling the topic
        self._locks: dict[str, asyncio.Lock] = {}
        self._sealed_here: set[str] = set()
        # Appends block in write or fsync; queues are independent files, so they may sync in parallel.
        self._threads = StorageThreads(WRITER_THREADS, "append", driven)
        # Storage's flush policy "group": appends only write, and one sync covers every queue's (group_commit.py).
        self._commit = (GroupCommit(store.root, store.config.observe_sync_s, driven=driven)
                        if store.config.flush_policy == FLUSH_GROUP else None)
        # The copies of the heads this broker leads: sends wait for them, consumers read below their high watermark
        self.replicas = ReplicaTracker(me, routes, self.max_physical)
        self.offset_copies = OffsetCopies(me, routes, self.replicas, offsets, peers) if peers is not None else None
        self.producers = ProducerTable()   # batches seen per producer: a resend is answered, not stored again
        self.producer_handover = (ProducerHandover(me, routes, peers, self.holds_sealed, self.producers.batches,
                                                   self.take_batches) if peers is not None else None)
        self._producer_log = producer_log
        self._flush_policy = store.config.flush_policy
        if producer_log is not None:
            for topic, queue, b in producer_log.load(self._holds):
                self.producers.record(topic, queue, b)
        # After a crash: a batch whose records outlived it while its line in producers.log did not (two files, no
        # order between what reaches the disk of each) is known by the mark its frame carries (the chaos runner,
        # seed 6: a keyed batch synced on b3, its line cut by the power loss, the resend stored again after it)
        for name, marks in store.recover():
            self._recovered(name, marks)

    def stop(self) -> None:
        if self.producer_handover is not None:
            self.producer_handover.stop()
        self._threads.stop()
        if self._commit is not None:
            self._commit.close()

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
        return self.store.open_or_create(seg.physical_queue, seg.physical_start) if create else None

    def max_physical(self, seg: Segment) -> int:
        """The segment's readable end here (``PhysicalQueue.max_offset``)."""
        q = self.local_queue(seg)
        return q.max_offset if q is not None else seg.physical_start

    def _holds(self, pq_name: str, end: int) -> bool:
        """Whether this broker's physical queue ``pq_name`` holds its records below ``end`` (at start, recovered)."""
        if pq_name not in self.store:
            return False
        try:
            return self.store.get(pq_name).next_offset >= end
        except StorageError:
            return False   # a queue that does not open answers nothing: its batches cannot be answered either

    def holds_sealed(self, seg: Segment) -> bool:
        """Whether this broker holds a sealed segment's records to its end (and so the producers' batches of them)."""
        return (seg.state == "sealed" and seg.logic_start is not None and seg.logic_end is not None
                and self._holds(seg.physical_queue, seg.physical(seg.logic_end)))

    def take_batches(self, topic: str, queue: int, batches: list[Batch]) -> None:
        """Batches of older segments of a queue, handed over by one of their holders (replication/producer_handover.py):
        remembered here and in producers.log, naming no physical queue of this broker. Those a seal left out go."""
        if self._remember_all(topic, queue, [b._replace(pq="", physical=-1) for b in batches]):
            self._forget_unkept(topic, queue)

    def _recovered(self, pq_name: str, marks: list[tuple[int, int, ProducerMark]]) -> None:
        """The producers' batches a recovery found in ``pq_name``'s last frames, remembered as if just stored."""
        parsed = parse_physical_queue_name(pq_name)
        if parsed is None:
            return
        topic, queue, gen = parsed
        self._remember_all(topic, queue, [Batch(m.producer, m.seq, m.logic, count, gen, pq_name, offset)
                                          for offset, count, m in marks])

    def _remember_all(self, topic: str, queue: int, batches: list[Batch]) -> bool:
        """``_remember`` each batch; False once the journal failed (idempotent sends are refused here until a
        restart anyway)."""
        try:
            for b in batches:
                self._remember(topic, queue, b)
        except StorageError:
            return False
        return True

    def _remember(self, topic: str, queue: int, batch: Batch) -> None:
        """Record a batch stored here, in the table and in producers.log (durable with the records: ``_durable``).
        The caller holds the queue's lock, but for a batch handed over (``take_batches``), which has no records here."""
        if self.producers.record(topic, queue, batch) and self._producer_log is not None:
            self._producer_log.append(topic, queue, batch)
            self._producer_log.maybe_compact(self.producers.entries)

    def forget_unkept_batches(self, topic: str) -> None:
        """Producers' batches stored past the end of a sealed segment were never kept (a failover's elected copy
        ended before them): a resend of one must be stored again, not answered."""
        route = self.routes.routes.get(topic)
        if route is None or not self.producers.holds(topic):
            return
        for q in route["queues"]:
            self._forget_unkept(topic, q["queue"])

    def _forget_unkept(self, topic: str, queue: int) -> None:
        for seg in self.routes.segments(topic, queue) or ():
            if seg.state == "sealed" and seg.logic_end is not None:
                self.producers.sealed(topic, queue, seg.gen, seg.logic_end)

    async def _resent(self, head: Segment, seen: Batch) -> list[int]:
        """A batch sent again: answered once it is on the copies in sync, like the first time, at its offsets."""
        if seen.gen == head.gen:
            pq = self.local_queue(head)
            end = head.physical(seen.first + seen.count)
            try:
                await self._durable(pq, end)
            except StorageError as e:
                raise _storage_unavailable(head, e) from None
            await self.replicas.replicated(head, end)
        return list(range(seen.first, seen.first + seen.count))

    def readable_physical(self, seg: Segment) -> int:
        """Where consumers of ``seg`` stop reading here: in an open head this broker leads, its high watermark (every
        copy in sync holds what is below); in a segment it seals, or a sealed one, its end, which the log keeps."""
        local = self.max_physical(seg)
        if seg.state == "sealed" and seg.logic_end is not None and seg.logic_start is not None:
            return min(local, seg.physical(seg.logic_end))
        if seg.broker == self.me and seg.state == "active":
            return self.replicas.readable_end(seg)
        return local

    def next_physical(self, seg: Segment) -> int:
        """Where the segment's next append lands here, synced or not (``PhysicalQueue.next_offset``)."""
        q = self.local_queue(seg)
        return q.next_offset if q is not None else seg.physical_start

    def next_offsets(self, segs: list[Segment]) -> dict[str, int]:
        """Each segment's next_physical: what its offset budget must cover (the heartbeat's renewal)."""
        return {s.physical_queue: self.next_physical(s) for s in segs}

    # -- send --------------------------------------------------------------------------------------------------
    def _refuse_stale_slot_table(self, topic: str, queue: int, keyed: bool, sender: int | None) -> None:
        """A keyed message chosen with a slot table older than this broker's must not land here: after a growth
        its key may belong to a new queue, and one written to the old queue after the split point would be
        consumed after the key's newer messages (DESIGN.md invariant 7). NOT_LEADER makes the sender re-read the
        route (at least this broker's version) and choose again; a sender that names no version is trusted."""
        route = self.routes.routes.get(topic)
        if sender is None or route is None or sender >= route.get("slot_table_version", 0):
            return
        if keyed:
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
                   plain: bool = False, producer: tuple[int, int] | None = None) -> list[int]:
        """A JSON send: each message stored as its JSON object (``codec.encode_message``). ``sender_route_version``:
        the route version the sender chose the queue with (``X-Route-Version``); ``plain``: the messages were parsed
        from a body ``codec.plain_json_text`` accepted."""
        if not messages or len(messages) > MESSAGES_PER_SEND_MAX:
            raise invalid(f"messages must hold 1 to {MESSAGES_PER_SEND_MAX} messages")
        payloads = [encode_message(m, plain) for m in messages]
        keyed = any(m.get("key") is not None for m in messages)   # every message is a dict: encode_message checked
        records = batch.Send(batch.sized(payloads), len(payloads), keyed, sum(map(len, payloads)))
        return await self.send_records(topic, queue, records, TAG_JSON, sender_route_version, checked=False,
                                       producer=producer)

    async def send_records(self, topic: str, queue: int, send: batch.Send, tag: int,
                           sender_route_version: int | None = None, checked: bool = True,
                           producer: tuple[int, int] | None = None) -> list[int]:
        """Append a send's records as one frame tagged with their form (``codec.TAG_*``): a binary batch's records
        as they came, walked already by ``wire.batch.check_send`` (``checked``), or a JSON send's objects, which
        storage walks for their sizes. Where both forms meet. ``producer``: (id, batch number) of an idempotent
        producer: a batch this queue has seen is answered with the offsets it was stored at (producers.py)."""
        if not 0 < send.count <= MESSAGES_PER_SEND_MAX:
            raise invalid(f"messages must hold 1 to {MESSAGES_PER_SEND_MAX} messages")
        if sender_route_version is not None and sender_route_version > self.routes.version:
            # The sender read a route this broker has not: decide on it, not on the older one (a bounded wait)
            await self.routes.reach(sender_route_version)
        self._refuse_stale_slot_table(topic, queue, send.keyed, sender_route_version)
        if producer is not None and self.producer_handover is not None:
            # A resend of a batch stored before a remap is answered, not stored again, once the old segment's
            # batches are here (bounded wait: replication/producer_handover.py)
            await self.producer_handover.ready(self._writable_head(topic, queue))
        seen: Batch | None = None
        while True:
            head = self._writable_head(topic, queue)
            self.replicas.check_writable(head)
            async with self._lock(head.physical_queue):
                # The route may have moved on while this send waited for the lock: the lock held must be that of
                # the segment written, or a seal of the new head could read its end while this append runs.
                if self._writable_head(topic, queue).physical_queue == head.physical_queue:
                    seen = (self.producers.find(topic, queue, producer[0], producer[1], send.count)
                            if producer is not None else None)
                    if seen is not None:
                        break
                    if producer is not None and self._producer_log is not None and self._producer_log.failed:
                        raise _storage_unavailable(head, QueueFailed("the producers journal failed"))
                    started = time.perf_counter()
                    pq, first = await self._append(head, send, tag, checked, producer)
                    written = stored_run(pq, first, send.records, send.count, tag)
                    if producer is not None:
                        try:
                            self._remember(topic, queue, Batch(producer[0], producer[1], head.logic(first),
                                                               send.count, head.gen, head.physical_queue, first))
                        except StorageError as e:   # stored, but a resend after a restart would store it again
                            raise _storage_unavailable(head, e) from None
                    break
        if seen is not None:
            return await self._resent(head, seen)
        self.replicas.appended(head.physical_queue, written)   # followers take it while it syncs here
        # Outside the lock, so the next send to this queue writes meanwhile and one sync covers both. A seal waits
        # for this sync too (seal), so a sealed end never holds a record that is not on disk.
        try:
            await self._durable(pq, first + send.count)
        except StorageError as e:
            raise _storage_unavailable(head, e) from None
        # On this disk: now on every copy in sync, as durably as their flush policy promises (DESIGN.md 12)
        on_disk = time.perf_counter()
        await self.replicas.replicated(head, first + send.count)
        if self.metrics is not None:
            done = time.perf_counter()
            self.metrics.append.observe(done - started)
            if len(head.replicas) > 1:
                self.metrics.copies_wait.observe(done - on_disk)
            self.metrics.stored(head.topic, send.count, send.record_bytes)
        if self._appended is not None:
            self._appended.notify(topic)
        first = head.logic(first)
        return list(range(first, first + send.count))

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
            pq = await self._threads.run(self.local_queue, seg, True)
        return pq

    async def _durable(self, pq: PhysicalQueue, end: int) -> None:
        """Returns once ``pq``'s records below ``end`` are on disk (at once unless storage's flush policy is
        "group": with "fsync" the append synced, with "interval" durability is the interval's), and with them the
        producers' batches recorded so far (producer_journal.py)."""
        log = self._producer_log
        if self._commit is not None:
            await self._commit.durable(pq, end)
            if log is not None and log.max_offset < log.next_offset:
                await self._commit.durable(log, log.next_offset)
        elif self._flush_policy == FLUSH_FSYNC and log is not None and log.max_offset < log.next_offset:
            try:
                await self._threads.run(log.sync)
            except OSError as e:
                raise QueueFailed(f"syncing the producers journal failed: {e}", path=log.path) from None

    async def _append(self, head: Segment, send: batch.Send, tag: int, checked: bool,
                      producer: tuple[int, int] | None = None) -> tuple[PhysicalQueue, int]:
        """Append within the segment's offset budget; the caller holds the segment's lock. ``producer``: the
        idempotent producer's (id, batch number), marked in the frame with the logic offset the batch gets."""
        pq = await self._create(head)
        budget = max(self.session.budgets.get(head.physical_queue, 0), head.budget_end)
        end = pq.next_offset + send.count
        if end > budget:
            self.session.beat_soon()
            raise rejection(503, "BUDGET_EXHAUSTED", "waiting for meta to renew this queue's offset budget",
                            topic=head.topic, queue=head.queue)
        if self.session.renewal_due(budget, end):
            self.session.beat_soon()  # renew early so writers never wait for the budget
        ts_ms = int(time.time() * 1000)
        try:
            # With group commit an append only writes to the page cache: on the loop it costs less than the hand-off
            # to a thread and back (0.08 ms against ~1.4 ms of latency and more CPU here, with 16 sends in flight).
            # What would wait (the queue's lock held elsewhere, a roll's syncs) still goes to a thread.
            # Under the queue's lock the batch lands at next_offset
            mark = ProducerMark(producer[0], producer[1], head.logic(pq.next_offset)) if producer is not None else None
            first = (pq.try_append_records(send.records, send.count, ts_ms, tag, checked, mark)
                     if self._commit is not None else None)
            if first is None:
                await self._before_roll(pq, len(send.records))
                first = await self._threads.run(pq.append_records, send.records, send.count, ts_ms, tag, checked,
                                                mark)
        except InvalidArgument as e:  # too large a record or batch, in storage's terms
            raise ApiError(str(e), code=e.code, status=413 if e.code == "TOO_LARGE" else 400) from None
        except StorageError as e:  # a failed write or fsync: the queue refuses writes until reopened
            raise _storage_unavailable(head, e) from None
        return pq, first

    async def append_copy(self, seg: Segment, runs: list, batches: list[Batch] = ()) -> int:
        """Append a leader's runs (``broker/replication``) to this broker's copy of ``seg``, at the offsets the leader
        stored them at, and return once they are written: the caller asks for their sync (``ask_sync``) once it has
        written every copy it was sent, and waits for it (``durable_copy``). Runs this copy holds already are
        skipped; a copy whose end was read (``seal``) takes nothing more. ``batches``: the producers' batches those
        records belong to, remembered here as the leader does. Returns the records taken."""
        async with self._lock(seg.physical_queue):
            if seg.physical_queue in self._sealed_here:
                return 0
            pq = await self._create(seg)
            taken = 0
            # A run that is one batch whole is marked as the leader marked its frame (a read cut inside a frame
            # brings its parts unmarked: their batch is known here by its line only)
            by_first = {b.first: b for b in batches} if seg.logic_start is not None else {}
            for run in runs:
                if run.offset + run.count <= pq.next_offset:
                    continue
                if run.offset != pq.next_offset:
                    raise StorageError(f"a run at {run.offset} does not continue the copy at {pq.next_offset}")
                b = by_first.get(seg.logic(run.offset)) if by_first else None
                mark = ProducerMark(b.producer, b.seq, b.first) if b is not None and b.count == run.count else None
                # As a leader's append: with group commit the write lands in the page cache, cheaper on the loop
                first = (pq.try_append_records(run.records, run.count, run.ts_ms, run.tag, True, mark)
                         if self._commit is not None else None)
                if first is None:
                    await self._before_roll(pq, len(run.records))
                    await self._threads.run(pq.append_records, run.records, run.count, run.ts_ms, run.tag, True,
                                            mark)
                taken += run.count
            for b in batches:   # of a sealed segment, only those within its end were kept
                if seg.logic_end is None or b.first + b.count <= seg.logic_end:
                    self._remember(seg.topic, seg.queue, b._replace(pq=seg.physical_queue,
                                                                     physical=seg.physical(b.first)))
        return taken

    async def _before_roll(self, pq: PhysicalQueue, records_bytes: int) -> None:
        """Before an append that seals ``pq``'s active file: the producers' lines written so far are synced first.
        The roll syncs that file, and a recovery walks the new one only: a batch at the old file's end whose line
        a crash then cut would be known by neither."""
        log = self._producer_log
        if log is not None and log.max_offset < log.next_offset and pq.would_roll(records_bytes):
            try:
                await self._threads.run(log.sync)
            except OSError as e:
                raise QueueFailed(f"syncing the producers journal failed: {e}", path=log.path) from None

    def ask_sync(self, seg: Segment) -> None:
        """The next group-commit round syncs what this broker's copy of ``seg`` has written, whether or not anything
        waits for it yet (``GroupCommit.ask``)."""
        pq = self.local_queue(seg)
        if pq is not None and self._commit is not None:
            self._commit.ask(pq)

    async def durable_copy(self, seg: Segment) -> None:
        """Returns once everything written to this broker's copy of ``seg`` is as durable as the flush policy
        promises."""
        pq = self.local_queue(seg)
        if pq is not None:
            await self._durable(pq, pq.next_offset)

    async def seal(self, seg: Segment) -> int:
        """Stop writes to a sealing segment and return its exact physical end: every record written and on disk.
        Sends still waiting for their sync are answered once it covers them; a record whose sync failed was never
        acknowledged, so the end then stops before it."""
        async with self._lock(seg.physical_queue):
            self._sealed_here.add(seg.physical_queue)
            pq = self.local_queue(seg)
            if pq is None:
                return seg.physical_start
            try:
                await self._durable(pq, pq.next_offset)
            except StorageError:
                pass   # failed or timed out: the readable end holds every record acknowledged (GroupCommit.durable)
            return pq.max_offset

    # -- consumer offsets --------------------------------------------------------------------------------------
    def offsets_head(self, topic: str, queue: int) -> Segment:
        """The queue's head, when this broker may speak for its committed offsets: the same conditions as a write.

        A commit is stored with its head's gen and the newest gen wins (reads.Reader.read_committed), so a commit
        accepted on a head that was sealed, or whose broker's session lapsed (meta may have moved the queue without
        it), could be acknowledged and then lose to an older value on the new head; and a read answered there could
        miss the new head's newer commits."""
        return self._writable_head(topic, queue)

    def still_offsets_head(self, head: Segment, what: str) -> None:
        """After an await that began at ``head``: 503 SEALING if the queue was sealed or moved on meanwhile (a newer
        head may hold a newer commit, which wins). The same physical queue is the same head: a budget renewal
        rewrites the route's segment too."""
        now = self.routes.head(head.topic, head.queue)
        if (head.physical_queue in self._sealed_here or now is None
                or now.physical_queue != head.physical_queue):
            raise rejection(503, "SEALING", f"the queue was remapped while {what}; retry at its new head",
                            topic=head.topic, queue=head.queue)

    async def commit_offset(self, group: str, topic: str, queue: int, offset: int) -> int:
        head = self.offsets_head(topic, queue)
        if self.offset_copies is not None:
            await self.offset_copies.commit(head, group, offset)
        else:
            await self.offsets.commit(group, topic, queue, offset, gen=head.gen)
        self.still_offsets_head(head, "the commit was stored")
        return offset
