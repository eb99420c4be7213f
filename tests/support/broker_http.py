"""A cluster's brokers over HTTP for the end-to-end tests: admin calls through meta, routes, sends that follow them,
reads of a whole queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp


async def admin(c, method: str, node: int, path: str, json=None) -> tuple[int, dict]:
    """An admin write through meta node `node`; later route reads on any node wait for its version."""
    s, b, _ = await c.call(method, c.meta_urls[node] + path, json=json)
    if isinstance(b, dict) and "version" in b:
        c.extra["version"] = max(c.extra.get("version", 0), b["version"])
    return s, b


async def route(c, topic: str) -> dict:
    v = c.extra.get("version", 0)
    s, b, _ = await c.call("GET", f"{c.meta_urls[0]}/v1/routes/{topic}?min_version={v}", "client")
    assert s == 200, b
    return b


async def wait_route(c, topic: str, pred, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        r = await route(c, topic)
        if pred(r):
            return r
        assert time.monotonic() < deadline, f"route never satisfied the condition: {r}"
        await asyncio.sleep(0.05)


async def broker_has_route(c, address: str, version: int, timeout_s: float = 20.0) -> None:
    """Until the broker at ``address`` has read meta's routes up to ``version`` (its X-Route-Version, on every
    answer). A route read from meta may be ahead of the broker's: a call that X-Route-Version does not hold back (an
    ack, a change of invisible time, unlike a send) is answered from the broker's older view meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, _, headers = await c.call("GET", f"{address}/healthz", None)
        if int(headers.get("X-Route-Version", -1)) >= version:
            return
        assert time.monotonic() < deadline, f"the broker at {address} never read route version {version}"
        await asyncio.sleep(0.05)


def all_writable(r: dict) -> bool:
    return all(q["writable"] for q in r["queues"])


async def send(c, topic: str, queue: int, bodies: list[str], deadline_s: float = 30.0,
               next_route: Callable[[dict | None], Awaitable[dict]] | None = None,
               unknown: list[list[str]] | None = None) -> list[int]:
    """Send to the queue's writable head, following the route on NOT_LEADER / SEALING / FENCED / connection errors.
    ``next_route(held)`` gives a newer route than the one held (default: read it again after a short pause).

    A send is at least once: an attempt that timed out or lost its connection may have been written, and the retry
    writes the bodies again. Each such attempt's bodies are added to ``unknown`` when the caller passes a list."""
    async def poll(held: dict | None) -> dict:
        if held is not None:
            await asyncio.sleep(0.05)
        return await route(c, topic)
    next_route = next_route or poll
    deadline = time.monotonic() + deadline_s
    r = await next_route(None)
    while True:
        q = r["queues"][queue]
        if q["writable"]:
            try:
                # The route's version, as a producer sends it: the broker decides on at least that route
                s, b, _ = await c.call("POST", f"{q['address']}/v1/messages/{topic}/{queue}", "client",
                                       json={"messages": [{"body": x} for x in bodies]}, timeout_s=5.0,
                                       headers={"X-Route-Version": str(r["version"])})
                if s == 200:
                    return b["offsets"]
                assert s in (409, 503), (s, b)
                if unknown is not None and b["error"]["code"] == "REPLICATION_UNCONFIRMED":
                    unknown.append(bodies)   # stored on the leader, not confirmed by its copies: maybe kept
            except (aiohttp.ClientError, asyncio.TimeoutError):
                if unknown is not None:
                    unknown.append(bodies)
        assert time.monotonic() < deadline, f"could not send to {topic}/{queue} (route version {r['version']})"
        r = await next_route(r)


async def read_all(c, topic: str, queue: int, start: int = 0) -> list[dict]:
    r = await wait_route(c, topic, lambda r: r["queues"][queue]["writable"])
    addr = r["queues"][queue]["address"]
    out, offset = [], start
    for _ in range(10_000):
        s, b, _ = await c.call("GET", f"{addr}/v1/messages/{topic}/{queue}?offset={offset}&max=500", "client")
        assert s == 200, b
        out += b["messages"]
        if b["next_offset"] == offset or b["next_offset"] >= b["max_offset"]:
            offset = b["next_offset"]
            if offset >= b["max_offset"]:
                return out
        assert b["next_offset"] >= offset, "next_offset went back"
        offset = b["next_offset"]
    raise AssertionError("read did not finish")
