"""The client library against real processes: 3 meta nodes, 3 brokers. Keys keep their queue and their order across
remaps; the producer follows routes by itself (NOT_LEADER / SEALING); the consumer reads every queue's whole history
across segments and resumes from committed offsets."""

from __future__ import annotations

import asyncio
import collections


from client import AdminClient, KeySelector, Message, Producer, PullConsumer, Sealing, queue_for_key


async def test_keys_keep_queue_and_order_across_remaps_and_the_consumer_resumes(full_cluster):
    c = full_cluster
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.create_topic("keyed", queues=4)
        route = await admin.describe_topic("keyed")
        assert route["queues"] == 4
        async with Producer(c.meta_urls, c.token("client"), "keyed", selector=KeySelector()) as producer:
            sent: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)  # key -> [(queue, offset)]
            stop = asyncio.Event()

            async def produce():
                i = 0
                while not stop.is_set():
                    key = f"user-{i % 10}"
                    r = await producer.send(f"{key}:{i}", key=key)
                    sent[key].append((r.queue, r.offsets[0]))
                    i += 1

            task = asyncio.create_task(produce())
            for targets in (["b1"], ["b2", "b3"], ["b3"], ["b1", "b2", "b3"]):
                await asyncio.sleep(0.4)
                for _ in range(50):  # SEALING while a previous move of some queue is still completing
                    try:
                        await admin.remap("keyed", targets)
                        break
                    except Sealing:
                        await asyncio.sleep(0.1)
            await asyncio.sleep(0.4)
            stop.set()
            await task
        topic = await admin.describe_topic("keyed")
    route = {"slots": topic["slots"],
             "slot_table": sorted([r[0], r[1], q["queue"]] for q in topic["logic_queues"] for r in q["slot_ranges"])}
    for key, placed in sent.items():
        queues = {q for q, _ in placed}
        assert queues == {queue_for_key(route, key)}, (key, queues)
        offsets = [o for _, o in placed]
        assert offsets == sorted(offsets), f"{key}: offsets of one key must grow in send order"
    assert max(len(q["segments"]) for q in topic["logic_queues"]) >= 3

    total = sum(len(v) for v in sent.values())
    print(f"{total} messages over {len(sent)} keys; segments per queue {[len(q['segments']) for q in topic['logic_queues']]}")
    by_queue: dict[int, list[str]] = collections.defaultdict(list)
    async with PullConsumer(c.meta_urls, c.token("client"), "keyed", "g1") as consumer:
        got = []
        for _ in range(200):
            batch = await consumer.poll(timeout_s=0.5)
            got += batch
            if len(got) >= total:
                break
        assert len(got) == total, (len(got), total)
        for m in got:
            by_queue[m.queue].append(m.text)
        await consumer.commit_positions()
        committed = {q: await consumer.committed(q) for q in range(4)}
    for q, bodies in by_queue.items():
        seqs = [int(b.split(":")[1]) for b in bodies]
        assert seqs == sorted(seqs), f"queue {q} not in send order"
    assert sum(committed.values()) == total  # one offset past the last message of each queue: offsets are continuous

    # A new consumer of the same group starts where the group committed: nothing left, nothing repeated.
    async with Producer(c.meta_urls, c.token("client"), "keyed", selector=KeySelector()) as producer:
        late = await producer.send("late", key="user-3")
    async with PullConsumer(c.meta_urls, c.token("client"), "keyed", "g1") as consumer:
        again = []
        for _ in range(20):
            again += await consumer.poll(timeout_s=0.3)
            if again:
                break
        assert [(m.queue, m.offset, m.text) for m in again] == [(late.queue, late.offsets[0], "late")]


async def test_what_one_form_sends_the_other_reads_byte_identical(full_cluster):
    c = full_cluster
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.create_topic("forms", queues=1)
    sent = [Message(b"\x00\xff raw", "k1", {"p": "1"}), Message("héllo", None, None), Message(b"", "k2", None)]
    for form in ("binary", "json"):
        async with Producer(c.meta_urls, c.token("client"), "forms", wire_format=form) as producer:
            await producer.send_batch(sent, queue=0)
    read = {}
    for form in ("binary", "json"):
        async with PullConsumer(c.meta_urls, c.token("client"), "forms", "g-forms", wire_format=form) as consumer:
            read[form] = [(m.offset, m.body, m.is_text, m.key, dict(m.props))
                          for m in (await consumer.pull(0, offset=0, max_messages=10)).messages]
    expected = [(i, m.body.encode() if isinstance(m.body, str) else m.body, isinstance(m.body, str), m.key,
                 dict(m.props or {})) for i, m in enumerate(sent + sent)]
    assert read["binary"] == expected
    assert read["json"] == expected
