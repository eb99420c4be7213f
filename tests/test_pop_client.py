"""client/pop.py against real processes (3 meta nodes, 2 brokers): consumers of one group share a topic spread over
both brokers; every message is handled to success once; a failing handler is nacked and the message comes back
with attempt + 1 after the backoff; a handler slower than the invisible time keeps its message (no second delivery).
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from client import AdminClient, Backoff, PopConsumer, PoppedMessage, Producer
from client.selection import RoundRobinSelector
from tests.support import cluster as cluster_mod
from tests.support.meta_http import wait_until


HANDLE_S = 0.1   # each job's work


async def test_pop_consumers_share_a_topic_ack_on_success_extend_slow_handlers_and_nack_failures(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 2,
                                   meta={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}) as c:
        async with AdminClient(c.meta_urls, c.token("admin")) as admin:
            await admin.create_topic("jobs", queues=4)
        async with Producer(c.meta_urls, c.token("client"), "jobs", selector=RoundRobinSelector()) as p:
            for i in range(40):
                await p.send(f"job-{i}")

        calls: collections.Counter = collections.Counter()
        done: dict[str, tuple[str, int]] = {}
        failures: list[BaseException] = []

        def handler_of(name: str):
            async def handle(m: PoppedMessage) -> None:
                try:
                    calls[m.text] += 1
                    if m.text == "job-7" and m.attempt == 1:
                        raise RuntimeError("first attempt fails")
                    if m.text == "job-3":
                        await asyncio.sleep(2.5)          # past the 1 s invisible time: kept by extensions
                    else:
                        await asyncio.sleep(HANDLE_S)
                    assert m.text not in done, f"{m.text} handled again after success"
                    done[m.text] = (name, m.attempt)
                except RuntimeError:
                    raise
                except BaseException as e:              # an assertion in a handler must fail the test
                    failures.append(e)
                    raise
            return handle

        # Each consumer takes at most a few messages at a time and a handler takes a moment: whichever consumer
        # starts first cannot take all 40 before the others ask, however the machine schedules them (with the
        # defaults, one consumer popping 32 per broker sometimes did, and the share check failed under load).
        consumers = [PopConsumer(c.meta_urls, c.token("client"), "jobs", "workers", handler_of(f"c{i}"),
                                 invisible_ms=1000, wait_ms=1000, nack_backoff=Backoff(1.0, 1.0),
                                 max_messages=2, concurrency=4)
                     for i in range(3)]
        runs = [asyncio.create_task(x.run()) for x in consumers]
        try:
            started = time.monotonic()
            await wait_until(lambda: _true(len(done) == 40), 60, "every job handled")
            await asyncio.sleep(1.5)                      # time for a wrong second delivery to show up
        finally:
            for x in consumers:
                await x.close()
            await asyncio.gather(*runs)
        assert not failures, failures
        assert sorted(done) == sorted(f"job-{i}" for i in range(40))
        assert done["job-7"][1] == 2 and calls["job-7"] == 2, "nacked, then back with attempt 2"
        assert calls["job-3"] == 1, "extended while slow: never delivered to anyone else"
        assert all(calls[f"job-{i}"] == 1 for i in range(40) if i != 7)
        assert len({name for name, _ in done.values()}) >= 2, "the consumers share the work"
        assert time.monotonic() - started < 60


async def _true(v: bool) -> bool:
    return v


def test_a_popped_body_is_bytes_whichever_form_carried_it():
    from multidict import CIMultiDict

    from client import Unavailable
    from client.formats import popped
    from client.pop import _decode
    from wire import batch
    from wire.caller import Answer
    common = {"queue": 0, "offset": 3, "attempt": 1, "handle": "h"}
    as_json = popped(Answer(200, {"messages": [{**common, "body": "héllo"}, {**common, "key": "k", "props": {"p": "1"},
                                                                             "body_b64": "AP8="}]},
                            CIMultiDict(), "http://b"))
    raw = batch.encode_popped([batch.Popped(0, 3, 1, "h", batch.record(batch.Message(None, None, "héllo".encode(), True))),
                               batch.Popped(0, 3, 1, "h", batch.record(batch.Message("k", {"p": "1"}, b"\x00\xff")))])
    as_batch = popped(Answer(200, raw, CIMultiDict(), "http://b"))
    assert as_json == as_batch
    text, binary = (_decode("t", "http://b", d) for d in as_batch)
    assert (text.body, text.text, text.is_text) == ("héllo".encode(), "héllo", True)
    assert (binary.body, binary.is_text, binary.sent_body, binary.key) == (b"\x00\xff", False, b"\x00\xff", "k")
    with pytest.raises(Unavailable, match="cannot be read"):
        popped(Answer(200, raw[:-1] + bytes([raw[-1] ^ 1]), CIMultiDict(), "http://b"))
