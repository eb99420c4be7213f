"""The broker's writer over a real queue store: what its asyncio side must survive (cancelled sends)."""

from __future__ import annotations

import asyncio
import threading

from broker.storage import QueueStore
from broker.writes import Writer
from wire.route import Segment


def _segment(physical_queue: str, physical_start: int = 0) -> Segment:
    return Segment("orders", 3, 1, "b1", None, physical_queue, physical_start, 0, None, "active", 1000)


async def _until(cond, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_a_send_cancelled_while_its_queue_is_created_does_not_fail_the_next_one(tmp_path):
    # A creation runs on a writer thread; cancelling the send that started it leaves that thread running. The next
    # send must get the queue that thread creates, not QueueExists (it used to: check, then create, not atomic).
    with QueueStore(str(tmp_path / "root")) as store:
        writer = Writer("b1", store, None, None, None)
        seg = _segment("orders.q3.g1", physical_start=40)
        try:
            # Hold the store's lock (a private detail, taken here only to hold both creations at the same point) so
            # the first creation is certainly still running when the second send asks for the queue.
            held = threading.Event()
            release = threading.Event()

            def hold() -> None:
                with store._lock:
                    held.set()
                    release.wait(10)

            holder = threading.Thread(target=hold)
            holder.start()
            assert held.wait(5)
            first = asyncio.create_task(writer.prepare(seg))
            await asyncio.sleep(0.05)   # first is now on a writer thread, waiting for the store's lock
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            assert first.cancelled()
            second = asyncio.create_task(writer.prepare(seg))
            await asyncio.sleep(0.05)
            release.set()
            holder.join(5)
            await asyncio.wait_for(second, 10)
            await _until(lambda: seg.physical_queue in store)
            queue = store.get(seg.physical_queue)
            assert queue.max_offset == 40
            assert store.names() == [seg.physical_queue]
        finally:
            writer.stop()


async def test_the_producers_lines_are_synced_before_an_append_seals_a_queue_s_active_file(tmp_path):
    """A start walks only the active file of a queue for producer marks (writes.py ``_recovered``): a roll syncs the
    old file, so the lines of the batches it holds must be durable before it, or a crash right after keeps their
    records and loses their lines, and nothing names those batches any more."""
    from broker.producer_journal import ProducerJournal
    from broker.producers import Batch
    from broker.storage import QueueConfig, Run
    from broker.storage.record import pack_records

    config = QueueConfig(segment_bytes_max=4096)
    with QueueStore(str(tmp_path / "root"), config) as store:
        log = ProducerJournal(str(tmp_path / "producers.log"))
        writer = Writer("b1", store, None, None, None, producer_log=log)
        seg = Segment("orders", 3, 1, "b2", None, "orders.q3.g1.i1", 0, 100, None, "active", 1_000_000)
        records = pack_records([b"x" * 1000] * 3)
        try:
            def run(offset: int) -> Run:
                return Run(offset, 1, 3, 0, records)

            def batch(offset: int, seq: int) -> Batch:
                return Batch(7, seq, seg.logic(offset), 3, seg.gen)

            assert await writer.append_copy(seg, [run(0)], [batch(0, 0)]) == 3
            assert log.next_offset > 0 and log.max_offset == 0, "a line is written, not synced, by a copy's append"
            written = log.next_offset
            await writer.append_copy(seg, [run(3)], [batch(3, 1)])   # the file rolls
            assert len(list((tmp_path / "root").rglob("*.log"))) == 2, "the second append rolled to a new file"
            assert log.max_offset >= written, "the first batch's line was not durable when its file was sealed"
        finally:
            writer.stop()
            log.close()


async def test_a_copy_s_append_only_writes_and_its_sync_comes_when_asked(tmp_path):
    """The follower writes every section a push brought, then asks for one sync round (replication/follower.py
    ``_take``): an append that asked by itself woke the syncer, whose round could start before the next section was
    written. With group commit, a copy's records stay unsynced (unreadable) until ``ask_sync``."""
    from broker.storage import QueueConfig, Run
    from broker.storage.config import FLUSH_GROUP
    from broker.storage.record import pack_records

    with QueueStore(str(tmp_path / "root"), QueueConfig(flush_policy=FLUSH_GROUP)) as store:
        writer = Writer("b1", store, None, None, None)
        segs = [Segment("orders", q, 1, "b2", None, f"orders.q{q}.g1.i1", 0, 0, None, "active", 1_000_000)
                for q in (0, 1)]
        try:
            for seg in segs:
                assert await writer.append_copy(seg, [Run(0, 1, 3, 0, pack_records([b"x" * 100] * 3))]) == 3
            await asyncio.sleep(0.2)   # a round asked for would have run by now
            queues = [writer.local_queue(seg) for seg in segs]
            assert [(q.next_offset, q.max_offset) for q in queues] == [(3, 0), (3, 0)], "synced before it was asked"
            for seg in segs:
                writer.ask_sync(seg)
            await _until(lambda: all(q.max_offset == 3 for q in queues))
            await asyncio.wait_for(asyncio.gather(*(writer.durable_copy(seg) for seg in segs)), 10)
        finally:
            writer.stop()
