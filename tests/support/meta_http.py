"""Helpers for the meta-cluster integration tests: calls that survive a dead node, simulated brokers, checks.

A simulated broker is nothing but HTTP calls with the broker token (API.md): register, heartbeat every 0.5 s in the
background so its 3 s session stays alive, and seal reports on demand.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from typing import Any

import aiohttp

from wire.sse import SseEvent, SseParser
from meta.raft import snapshot_file
from tests.support.cluster import Cluster

NET_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)
SIM_ADDRESS = "http://127.0.0.1:1"


async def call_any(c: Cluster, method: str, path: str, role: str | None = "admin", json: Any = None,
                   headers: dict[str, str] | None = None, start: int = 0, timeout_s: float = 30.0,
                   per_try_s: float = 10.0, urls: list[str] | None = None) -> tuple[int, Any, dict]:
    """The first answer other than 503 / a network error, trying the nodes in turn (same request each time)."""
    urls = urls or c.meta_urls
    deadline = time.monotonic() + timeout_s
    i = start
    last: Any = None
    while True:
        url = urls[i % len(urls)]
        try:
            s, b, h = await c.call(method, url + path, role, json=json, headers=headers, timeout_s=per_try_s)
            if s != 503:
                return s, b, h
            last = (s, b)
        except NET_ERRORS as e:
            last = repr(e)
        i += 1
        if time.monotonic() > deadline:
            raise AssertionError(f"{method} {path}: no usable answer within {timeout_s} s; last: {last}")
        await asyncio.sleep(0.1)


async def ok(c: Cluster, method: str, path: str, role: str | None = "admin", json: Any = None,
             headers: dict[str, str] | None = None, url: str | None = None, expect: tuple[int, ...] = (200,),
             timeout_s: float = 15.0) -> dict:
    """One call that must succeed (on ``url`` if given, else on any node); returns the body."""
    if url is not None:
        s, b, _ = await c.call(method, url + path, role, json=json, headers=headers, timeout_s=timeout_s)
    else:
        s, b, _ = await call_any(c, method, path, role, json=json, headers=headers)
    assert s in expect, f"{method} {url or ''}{path} {json!r}: expected {expect}, got {s} {b!r}"
    return b


async def cluster_status(c: Cluster, url: str) -> dict:
    return await ok(c, "GET", "/v1/cluster", url=url)


async def node_urls(c: Cluster) -> tuple[str, str, list[str]]:
    """(leader name, leader url, follower urls)."""
    leader = await c.leader()
    lurl = c.url(leader)
    return leader, lurl, [u for u in c.meta_urls if u != lurl]


def name_of(c: Cluster, url: str) -> str:
    return next(m["node"] for m in c.info["meta"] if m["url"] == url)


def assert_error_shape(body: Any, where: str) -> None:
    assert isinstance(body, dict) and set(body) == {"error"}, f"{where}: error body is not {{'error': ...}}: {body!r}"
    err = body["error"]
    assert isinstance(err, dict) and {"code", "message", "details"} <= set(err), f"{where}: bad error: {body!r}"
    assert isinstance(err["code"], str) and err["code"] and err["code"] == err["code"].upper(), f"{where}: {body!r}"
    assert isinstance(err["message"], str) and err["message"], f"{where}: empty message: {body!r}"
    assert isinstance(err["details"], dict), f"{where}: details not an object: {body!r}"


async def wait_until(pred, timeout_s: float, what: str, interval_s: float = 0.1):
    """Poll an async predicate until it returns a truthy value; returns that value."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            last = await pred()
        except NET_ERRORS as e:
            last = repr(e)
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last: {last}") from None
            await asyncio.sleep(interval_s)
            continue
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval_s)


async def history(c: Cluster, url: str, min_version: int) -> list[dict]:
    """Every event the node holds, in version order, once it has applied ``min_version``."""
    events: list[dict] = []
    after = 0
    while True:
        s, d, _ = await c.call("GET", f"{url}/v1/history?after={after}&limit=10000&min_version={min_version}&wait=10",
                               "client")
        assert s == 200, (url, s, d)
        events += d["events"]
        if not d["events"] or d["next_after"] <= after:
            return events
        after = d["next_after"]


def log_tail(c: Cluster, name: str, lines: int = 40, grep: str | None = None) -> str:
    import os
    path = os.path.join(c.dir, "logs", f"{name}.log")
    try:
        with open(path, errors="replace") as f:
            text = f.read().splitlines()
    except OSError as e:
        return f"<no log {path}: {e}>"
    if grep:
        text = [t for t in text if grep in t]
    return "\n".join(text[-lines:])


class BrokerSim:
    """Simulated brokers: register, keep their sessions alive with background heartbeats, report seals."""

    def __init__(self, c: Cluster, interval_s: float = 0.5):
        self.c = c
        self.interval_s = interval_s
        self.epochs: dict[str, int] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.bad_answers: list[tuple[str, str, int, Any]] = []  # (broker, url, status, body) of 5xx other than 503
        self.beats = 0
        self.last_ok: dict[str, float] = {}  # broker -> monotonic time of its last acknowledged heartbeat

    async def register(self, name: str, address: str = SIM_ADDRESS, heartbeat: bool = True) -> int:
        b = await ok(self.c, "PUT", f"/v1/brokers/{name}", role="broker", json={"address": address})
        assert b["broker"] == name and isinstance(b["epoch"], int) and isinstance(b["version"], int), b
        self.epochs[name] = b["epoch"]
        if heartbeat:
            await self.heartbeat(name)
            self.start(name)
        return b["epoch"]

    def start(self, name: str) -> None:
        if name not in self.tasks or self.tasks[name].done():
            self.tasks[name] = asyncio.create_task(self._loop(name), name=f"heartbeat-{name}")

    async def heartbeat(self, name: str, start: int = 0) -> dict | None:
        urls = self.c.meta_urls
        for k in range(len(urls)):
            url = urls[(start + k) % len(urls)]
            try:
                s, b, _ = await self.c.call("POST", f"{url}/v1/brokers/{name}/heartbeat", "broker",
                                            json={"epoch": self.epochs[name], "queues": {}}, timeout_s=2.0)
            except NET_ERRORS:
                continue
            if s == 200:
                self.beats += 1
                self.last_ok[name] = time.monotonic()
                return b
            if s >= 500 and s != 503:
                self.bad_answers.append((name, url, s, b))
        return None

    async def heartbeat_at(self, name: str, url: str) -> tuple[int | None, Any]:
        """One heartbeat sent to one node, whatever it answers."""
        try:
            s, b, _ = await self.c.call("POST", f"{url}/v1/brokers/{name}/heartbeat", "broker",
                                        json={"epoch": self.epochs[name], "queues": {}}, timeout_s=10.0)
        except NET_ERRORS as e:
            return None, repr(e)
        return s, b

    async def _loop(self, name: str) -> None:
        i = 0
        while True:
            await self.heartbeat(name, i)
            i += 1
            await asyncio.sleep(self.interval_s)

    async def stop(self, name: str) -> None:
        t = self.tasks.pop(name, None)
        if t is not None:
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)

    async def close(self) -> None:
        for name in list(self.tasks):
            await self.stop(name)

    async def seal(self, name: str, topic: str, queue: int, gen: int, end_offset: int,
                   url: str | None = None) -> tuple[int, Any]:
        body = {"epoch": self.epochs[name], "topic": topic, "queue": queue, "gen": gen, "end_offset": end_offset}
        if url is not None:
            s, b, _ = await self.c.call("POST", f"{url}/v1/brokers/{name}/seal", "broker", json=body)
        else:
            s, b, _ = await call_any(self.c, "POST", f"/v1/brokers/{name}/seal", role="broker", json=body)
        return s, b


class SseReader:
    """Reads the events of an open SSE response, parsed by the production parser (wire/sse.py): each a dict of
    ``event``, ``data``, ``id`` (when the stream has one) and ``json`` (when the data is JSON)."""

    def __init__(self, resp: aiohttp.ClientResponse):
        self.resp = resp
        self._parser = SseParser()
        self._ready: collections.deque[SseEvent] = collections.deque()

    async def next_event(self, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while not self._ready:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                chunk = await asyncio.wait_for(self.resp.content.readany(), left)
            except asyncio.TimeoutError:
                return None
            if not chunk:
                raise AssertionError("SSE stream closed by the server")
            self._ready.extend(self._parser.feed(chunk))   # keepalive comments complete no event
        return as_dict(self._ready.popleft())


def as_dict(event: SseEvent) -> dict[str, Any]:
    ev: dict[str, Any] = {"event": event.event, "data": event.data}
    if event.id is not None:
        ev["id"] = event.id
    try:
        ev["json"] = json.loads(event.data)
    except ValueError:
        pass
    return ev


async def write_through(c: Cluster, urls: list[str], method: str, path: str, body: dict, role: str = "admin") -> dict:
    """One write that must succeed, through any of ``urls`` (e.g. only the live nodes)."""
    s, b, _ = await call_any(c, method, path, role, json=body, urls=urls)
    assert s in (200, 201), (method, path, s, b)
    return b


async def config_writes(c: Cluster, urls: list[str], topic: str, writes: int) -> int:
    """A stand-in broker, a one-queue ``topic`` on it and ``writes`` config changes, each through ``urls``; returns
    the version of the last: a log of known length for the snapshot, journal and projection tests."""
    await write_through(c, urls, "PUT", "/v1/brokers/b1", {"address": "http://127.0.0.1:1"}, role="broker")
    await write_through(c, urls, "POST", "/v1/topics", {"topic": topic, "queues": 1, "brokers": ["b1"]})
    b = None
    for i in range(writes):
        b = await write_through(c, urls, "PUT", f"/v1/topics/{topic}/config", {"n": str(i)})
    return b["version"]


async def write_configs_until(c: Cluster, topic: str, writers: int, stop: asyncio.Event,
                              acked: dict[int, tuple[str, str]], pad: int = 0) -> None:
    """``writers`` loops of ``PUT /v1/topics/{topic}/config`` until ``stop`` is set, writer w through node w % 3
    with ``{"w<w>": "<seq>"}`` (the value padded with ``pad`` x's); each acknowledged write goes into ``acked`` as
    version -> (key, value). Nodes may die meanwhile: a write may fail on the network or with 503 (no leader,
    unknown outcome), nothing else. A writer's assertion is raised here once every writer stopped."""
    async def writer(w: int) -> None:
        url, key, seq = c.meta_urls[w % len(c.meta_urls)], f"w{w}", 0
        while not stop.is_set():
            seq += 1
            value = str(seq) + "x" * pad
            try:
                s, b, _ = await c.call("PUT", f"{url}/v1/topics/{topic}/config", json={key: value}, timeout_s=5.0)
            except NET_ERRORS:
                await asyncio.sleep(0.05)   # a dead node refuses at once: no busy loop
                continue
            if s == 200:
                acked[b["version"]] = (key, value)
            else:
                assert s == 503, (s, b)

    await asyncio.gather(*(writer(w) for w in range(writers)))


def snapshot_or_none(path: str) -> snapshot_file.Snapshot | None:
    """A node's Raft snapshot, or None before it wrote one."""
    try:
        return snapshot_file.read(path)
    except FileNotFoundError:
        return None
