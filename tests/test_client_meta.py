"""The client against a real three-node meta cluster (processes on loopback): admin calls, idempotent retries,
route subscriptions by SSE and long poll (prompt, never going back, failing over when their node is killed).

Brokers are simulated: registered with the broker token and kept alive by heartbeats every 0.5 s (the fixture's
sessions expire after 3 s). Their address leads nowhere; these tests only need meta to place queues on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from client import (AdminClient, RouteSubscription, StatorError, SyncAdminClient, TopicExists, TopicNotFound,
                    VersionMismatch)

pytestmark = pytest.mark.slow

HEARTBEAT_S = 0.5
SEEN_WITHIN_S = 5.0          # a change must reach a subscriber within this (it takes milliseconds when healthy)
FAILOVER_WITHIN_S = 20.0     # includes an election when the killed node led


class SimBrokers:
    """Registers brokers and heartbeats them through whichever meta node answers."""

    def __init__(self, cluster, names=("b1", "b2")):
        self.cluster = cluster
        self.names = names
        self.epochs: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    async def _call(self, method: str, path: str, body: dict) -> dict:
        last: Exception | None = None
        for url in self.cluster.meta_urls:
            try:
                status, data, _ = await self.cluster.call(method, url + path, role="broker", json=body, timeout_s=2.0)
                if status == 200:
                    return data
                last = RuntimeError(f"{status} {data}")
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                last = e
        raise RuntimeError(f"no meta node took {method} {path}: {last!r}")

    async def __aenter__(self) -> SimBrokers:
        for b in self.names:
            self.epochs[b] = (await self._call("PUT", f"/v1/brokers/{b}", {"address": "http://127.0.0.1:1"}))["epoch"]
        self._task = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        while True:
            for b, epoch in self.epochs.items():
                with contextlib.suppress(RuntimeError):
                    await self._call("POST", f"/v1/brokers/{b}/heartbeat", {"epoch": epoch, "queues": {}})
            await asyncio.sleep(HEARTBEAT_S)

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def node_of(cluster, url: str) -> str:
    return next(m["node"] for m in cluster.info["meta"] if m["url"] == url)


async def test_admin_calls(meta_cluster):
    c = meta_cluster
    async with SimBrokers(c), AdminClient(c.meta_urls, c.token("admin")) as admin:
        info = await admin.cluster()
        assert info["leader"] in {"m1", "m2", "m3"} and len(info["members"]) == 3
        assert {(b["broker"], b["state"]) for b in await admin.brokers()} == {("b1", "active"), ("b2", "active")}

        created = await admin.create_topic("orders", 4, order="strict", config={"retention": "7d"})
        assert created["topic"] == "orders" and created["queues"] == 4
        with pytest.raises(TopicExists):
            await admin.create_topic("orders", 4)
        assert "orders" in [t["topic"] for t in await admin.list_topics()]
        d = await admin.describe_topic("orders")
        assert (d["queues"], d["order"], d["slots"], d["config"]) == (4, "strict", 1024, {"retention": "7d"})
        assert len(d["logic_queues"]) == 4

        with pytest.raises(VersionMismatch) as e:
            await admin.set_config("orders", {"retention": "1d"}, expected_version=d["version"] - 1)
        assert e.value.current_version == d["version"] and e.value.status == 409
        changed = await admin.set_config("orders", {"retention": "1d"}, expected_version=d["version"])
        assert changed["config"] == {"retention": "1d"} and changed["version"] > d["version"]

        grown = await admin.grow_topic("orders", 6)
        assert grown["queues"] == 6
        # Growing sealed the split queues (0 and 1); these simulated brokers never finish a seal, so those stay
        # SEALING (a 503 the admin sees, not a retry loop).
        with pytest.raises(StatorError) as e:
            await admin.remap("orders", ["b2"], queues=[0])
        assert e.value.code == "SEALING"
        moved = await admin.remap("orders", ["b2"], queues=[2, 3, 4, 5])
        assert all(m["to"] == "b2" for m in moved["moved"])
        d = await admin.describe_topic("orders", consistency="linearizable")
        assert d["queues"] == 6 and d["version"] == moved["version"]

        types = [e["type"] for e in (await admin.history(topic="orders"))["events"]]
        assert types[0] == "TopicCreated" and "TopicConfigChanged" in types and "TopicGrown" in types
        all_events = [e async for e in admin.iter_history(page=3)]
        assert [e["version"] for e in all_events] == sorted(e["version"] for e in all_events)

        with pytest.raises(StatorError) as e:
            await admin.create_topic("bad name!", 1)
        assert e.value.code == "INVALID_ARGUMENT"
        await admin.delete_topic("orders")
        with pytest.raises(TopicNotFound):
            await admin.describe_topic("orders")


class Proxy:
    """Forwards to one meta node; with ``drop_first_answer`` it loses the first answer (the write is applied, the
    client never hears). Closing it makes the node look gone to a client that talks through it."""

    def __init__(self, upstream: str, *, drop_first_answer: bool = False):
        self.upstream = upstream
        self.drop_first_answer = drop_first_answer
        self.seen_keys: list[str] = []
        self.dropped_answer: dict | None = None
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def _forward(self, request: web.Request) -> web.Response:
        self.seen_keys.append(request.headers.get("Idempotency-Key", ""))
        headers = {h: request.headers[h] for h in ("Authorization", "Idempotency-Key", "Content-Type")
                   if h in request.headers}
        async with aiohttp.ClientSession() as s:
            async with s.request(request.method, self.upstream + request.path_qs, data=await request.read(),
                                 headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
                body = await r.read()
                status = r.status
                meta_version = r.headers.get("X-Meta-Version")
        if self.drop_first_answer and self.dropped_answer is None:
            self.dropped_answer = json.loads(body)
            request.transport.close()
            raise ConnectionResetError("answer lost on purpose")
        return web.Response(body=body, status=status, content_type="application/json",
                            headers={"X-Meta-Version": meta_version} if meta_version else None)


async def test_retries_never_apply_twice(meta_cluster):
    c = meta_cluster
    async with SimBrokers(c):
        # The same key twice: the second call gets the first outcome and appends nothing.
        async with AdminClient(c.meta_urls, c.token("admin")) as admin:
            first = await admin.create_topic("once", 2, idempotency_key="create-once-1")
            again = await admin.create_topic("once", 2, idempotency_key="create-once-1")
            assert again == first
            # A lost answer: the first try reaches m1 through the proxy and is applied, its answer is lost; the
            # retry goes to m2 with the same key and gets the first outcome.
            proxy = Proxy(c.meta_urls[0], drop_first_answer=True)
            await proxy.server.start_server()
            try:
                proxied = AdminClient([proxy.url, c.meta_urls[1]], c.token("admin"))
                async with proxied:
                    created = await proxied.create_topic("lost-answer", 3)
            finally:
                await proxy.server.close()
            assert created == proxy.dropped_answer
            assert len(proxy.seen_keys) == 1 and proxy.seen_keys[0]
            events = [e async for e in admin.iter_history()]
            created_events = [(e["topic"], e["version"]) for e in events if e["type"] == "TopicCreated"]
            assert created_events == [("once", first["version"]), ("lost-answer", created["version"])]


LAGGING_WRITES = 5
IN_FLIGHT_S = 0.3  # long enough for a request to sit in a stopped node's socket before the node runs again


async def test_reads_never_go_back_after_failing_over_to_a_lagging_node(meta_cluster):
    """A read after failover to a node that missed writes shows at least the state the client saw before (invariant
    3): the client sends the newest version it has seen, read or written, and the lagging node waits for it."""
    c = meta_cluster
    leader = await c.leader()
    lagging = next(m["node"] for m in c.info["meta"] if m["node"] != leader)
    lagging_pid = c.pid(lagging)
    async with SimBrokers(c), AdminClient([c.url(leader)], c.token("admin")) as writer:
        created = await writer.create_topic("mono", 2)
        s, _, _ = await c.call("GET", f"{c.url(lagging)}/v1/topics/mono?min_version={created['version']}")
        assert s == 200
        proxy = Proxy(c.url(leader))
        await proxy.server.start_server()
        os.kill(lagging_pid, signal.SIGSTOP)
        try:
            for i in range(LAGGING_WRITES):
                await writer.set_config("mono", {"n": str(i)})
            # The reader only ever read: it learns the newest version from the answer's header, not from a write.
            async with AdminClient([proxy.url, c.url(lagging)], c.token("admin")) as reader:
                seen = await reader.describe_topic("mono")
                assert seen["config"] == {"n": str(LAGGING_WRITES - 1)}
                await proxy.server.close()  # the node it talked to is gone: the next read fails over
                read = asyncio.create_task(reader.describe_topic("mono"))
                await asyncio.sleep(IN_FLIGHT_S)
                os.kill(lagging_pid, signal.SIGCONT)
                after = await asyncio.wait_for(read, 30)
                assert reader.meta.url == c.url(lagging)
        finally:
            os.kill(lagging_pid, signal.SIGCONT)
            await proxy.server.close()
    assert after["config"] == seen["config"] and after["version"] >= seen["version"], (seen, after)


@pytest.mark.parametrize("mode", ["sse", "long_poll"])
async def test_subscription_sees_changes_made_through_another_node(meta_cluster, mode):
    c = meta_cluster
    async with SimBrokers(c), AdminClient(c.meta_urls[1:], c.token("admin")) as admin:
        created = await admin.create_topic("watched", 2)
        seen: list[int] = []
        async with RouteSubscription(c.meta_urls[:1], c.token("client"), ["watched"], mode, poll_wait_s=5) as sub:
            sub.add_listener(lambda topic, route: seen.append(route["version"]))
            first = await sub.get("watched", min_version=created["version"])  # m1 may not have applied it yet
            assert first["topic"] == "watched" and len(first["queues"]) == 2
            for i in range(4):
                written = (await admin.set_config("watched", {"n": str(i)}))["version"]
                t0 = time.monotonic()
                r = await sub.wait_for("watched", lambda r: r["version"] >= written, SEEN_WITHIN_S)
                assert r["config"] == {"n": str(i)}
                assert time.monotonic() - t0 < SEEN_WITHIN_S
            # Never back: an older route is ignored, whichever way it comes.
            held = sub.route("watched")
            assert not sub._offer(first)
            assert (await sub.refresh("watched")) is held or (await sub.refresh("watched"))["version"] >= held["version"]
            assert sub.route("watched")["version"] == held["version"]
    assert seen == sorted(set(seen)) and len(seen) >= 5


@pytest.mark.parametrize("mode", ["sse", "long_poll"])
async def test_subscription_fails_over_when_its_node_is_killed(meta_cluster, mode):
    c = meta_cluster
    async with SimBrokers(c), AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.create_topic("failover", 2)
        async with RouteSubscription(c.meta_urls, c.token("client"), ["failover"], mode, poll_wait_s=5) as sub:
            await sub.wait_for("failover", lambda r: True, SEEN_WITHIN_S)
            if mode == "sse":
                deadline = time.monotonic() + SEEN_WITHIN_S
                while sub.connected_url is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                victim_url = sub.connected_url
            else:
                victim_url = sub.meta.url
            assert victim_url is not None
            c.kill9(node_of(c, victim_url))
            written = (await admin.set_config("failover", {"after": "kill"}))["version"]
            r = await sub.wait_for("failover", lambda r: r["version"] >= written, FAILOVER_WITHIN_S)
            assert r["config"] == {"after": "kill"}
            assert sub.meta.url != victim_url
            if mode == "sse":
                assert sub.connected_url != victim_url


def test_blocking_admin_client(meta_cluster):
    c = meta_cluster
    with SyncAdminClient(c.meta_urls, c.token("admin")) as admin:
        assert admin.cluster()["leader"] is not None
        assert admin.list_topics() == []
        with pytest.raises(TopicNotFound):
            admin.describe_topic("nothing")
