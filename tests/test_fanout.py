"""A route change reaches every long-poll and SSE subscriber of its topic on a real node, with the same new version,
wakes nobody watching another topic, and the write's own answer is not queued behind the subscribers."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from wire.sse import SseParser
from tests.support import cluster as cluster_mod
from tests.support.meta_http import wait_until
from tests.support.metrics import scrape, value

SUBSCRIBERS = 150   # per kind, all on one node: enough that a fan-out takes longer than the write's answer
WAIT_S = 30


async def test_a_change_reaches_every_subscriber_with_its_version_and_the_ack_goes_first(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000}) as c:
        m = c.meta_urls[0]
        s, b, _ = await c.call("PUT", m + "/v1/brokers/b1", "broker", json={"address": "http://127.0.0.1:1"})
        assert s == 200, b
        versions = {}
        for topic in ("t", "other"):
            s, b, _ = await c.call("POST", m + "/v1/topics", json={"topic": topic, "queues": 2})
            assert s == 201, b
            versions[topic] = b["version"]
        # every subscriber on the node that takes the write: it applies the change and answers the writer
        auth = c.headers("client")
        received: dict[str, tuple[float, int]] = {}   # subscriber -> (when read, version read)

        async def long_poll(s: aiohttp.ClientSession, name: str, topic: str) -> None:
            async with s.get(f"{m}/v1/routes/{topic}", headers=auth,
                             params={"after": str(versions[topic]), "wait": str(WAIT_S)}) as r:
                body = await r.read()
                assert r.status == 200, (name, r.status, body)
                received[name] = (time.monotonic(), json.loads(body)["version"])

        async def sse(s: aiohttp.ClientSession, name: str) -> None:
            async with s.get(f"{m}/v1/watch", headers=auth, params={"topics": "t", "after": str(versions["t"])}) as r:
                assert r.status == 200, (name, r.status)
                parser = SseParser()
                while True:
                    chunk = await r.content.readany()
                    assert chunk, f"{name}: the stream ended"
                    for event in parser.feed(chunk):
                        if event.event == "route":
                            received[name] = (time.monotonic(), json.loads(event.data)["version"])
                            assert int(event.id) == received[name][1]
                            return

        timeout = aiohttp.ClientTimeout(total=WAIT_S + 30)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
            subs = [asyncio.create_task(long_poll(s, f"lp{i}", "t")) for i in range(SUBSCRIBERS)]
            subs += [asyncio.create_task(sse(s, f"sse{i}")) for i in range(SUBSCRIBERS)]
            unrelated = asyncio.create_task(long_poll(s, "unrelated", "other"))

            async def all_waiting() -> bool:
                samples = await scrape(c.session, m)
                return (value(samples, "stator_meta_long_poll_waiters") == SUBSCRIBERS + 1
                        and value(samples, "stator_meta_watch_streams") == SUBSCRIBERS)
            await wait_until(all_waiting, 30, "every subscriber waiting")

            s_put, b_put, _ = await c.call("PUT", m + "/v1/topics/t/config", json={"k": "v"})
            acked = time.monotonic()
            assert s_put == 200, b_put
            await asyncio.wait_for(asyncio.gather(*subs), 30)
            assert {v for _, v in received.values()} == {b_put["version"]}, "a subscriber read another version"
            assert len(received) == 2 * SUBSCRIBERS
            # the ack was written after the first slices of the fan-out, not after all of it (it used to be last)
            before_ack = sum(t < acked for t, _ in received.values())
            assert before_ack <= SUBSCRIBERS, f"{before_ack} of {2 * SUBSCRIBERS} subscribers read the change " \
                                              "before the write was answered"
            # the change of t did not wake the long poll on other: it still waits
            assert not unrelated.done()
            samples = await scrape(c.session, m)
            assert value(samples, "stator_meta_long_poll_waiters") == 1
            unrelated.cancel()
            await asyncio.gather(unrelated, return_exceptions=True)
