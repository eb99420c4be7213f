"""One contract suite, run against the fakes (tests/support/client_fakes.py) and against real servers (the
``full_cluster`` fixture: three meta nodes and three brokers), so the fakes the client tests rely on cannot drift from
what the servers answer. It checks only what the client relies on: route shape and long-poll 200/304, history pages,
send / pull / commit answers, NOT_LEADER from a broker that does not hold the queue, and the error body shape.
"""

from __future__ import annotations

import abc

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from tests.support.client_fakes import TOKEN, Fakes, make_route

ROUTE_KEYS = {"topic", "version", "slots", "slot_table", "barriers", "queues"}
ROUTE_QUEUE_KEYS = {"queue", "broker", "address", "physical_queue", "gen", "writable", "segments"}
ROUTE_SEGMENT_KEYS = {"broker", "address", "physical_queue", "physical_start", "logic_start", "logic_end"}
EVENT_KEYS = {"version", "ts", "type", "topic", "data"}
MESSAGE_KEYS = {"offset", "ts", "key", "props"}      # plus exactly one of body and body_b64
LONG_POLL_S = 10.0           # a long poll that must end early, when the route changes
NO_CHANGE_WAIT_S = 0.2       # a long poll that must end with 304
PROMPT_S = 5.0               # a change reaches a waiting long poll well within this
BROKER_CATCH_UP_S = 10.0     # a real broker learns a new route from meta's watch stream within this
CALL_TIMEOUT_S = 15.0


class Target(abc.ABC):
    """A meta URL and broker URLs behind one interface; every queue of a topic made here lives on broker_urls[0]."""

    meta_url: str
    broker_urls: list[str]
    token: str

    @abc.abstractmethod
    async def create_topic(self, topic: str, queues: int) -> int:
        """Create the topic with every queue on broker_urls[0]; returns the route's version."""

    @abc.abstractmethod
    async def change_topic(self, topic: str) -> int:
        """A new version of the topic's route; returns it."""


class FakeTarget(Target):
    def __init__(self, fakes: Fakes):
        self.fakes = fakes
        self.meta_url = fakes.meta.url
        self.broker_urls = [fakes.b1.url, fakes.b2.url]
        self.token = TOKEN

    async def create_topic(self, topic: str, queues: int) -> int:
        return self.fakes.meta.set_route(make_route(topic, [("b1", self.fakes.b1.url)] * queues))

    async def change_topic(self, topic: str) -> int:
        return self.fakes.meta.set_route(self.fakes.meta.routes[topic])


class RealTarget(Target):
    def __init__(self, cluster):
        self.cluster = cluster
        self.meta_url = cluster.meta_urls[0]
        self.broker_urls = [cluster.url(b) for b in ("b1", "b2")]
        self.token = cluster.token("client")
        self._changes = 0

    async def create_topic(self, topic: str, queues: int) -> int:
        s, body, _ = await self.cluster.call("POST", self.meta_url + "/v1/topics",
                                             json={"topic": topic, "queues": queues, "brokers": ["b1"]})
        assert s == 201, body
        await self._broker_knows(body["version"])
        return body["version"]

    async def change_topic(self, topic: str) -> int:
        self._changes += 1
        s, body, _ = await self.cluster.call("PUT", f"{self.meta_url}/v1/topics/{topic}/config",
                                             json={"change": str(self._changes)})
        assert s == 200, body
        return body["version"]

    async def _broker_knows(self, version: int) -> None:
        """Wait until the topic's broker has the route of ``version`` from meta's watch stream."""
        deadline = time.monotonic() + BROKER_CATCH_UP_S
        while True:
            _, _, h = await self.cluster.call("GET", self.broker_urls[0] + "/v1/queues/-", role="client")
            if int(h.get("X-Route-Version", -1)) >= version:
                return
            assert time.monotonic() < deadline, f"broker did not learn version {version} in {BROKER_CATCH_UP_S} s"
            await asyncio.sleep(0.05)


@pytest.fixture
async def fakes():
    async with Fakes() as f:
        yield f


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.slow)])
def target(request) -> Target:
    if request.param == "fake":
        return FakeTarget(request.getfixturevalue("fakes"))
    return RealTarget(request.getfixturevalue("full_cluster"))


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as s:
        yield s


async def call(http: aiohttp.ClientSession, target: Target, method: str, url: str, *, json: Any = None,
               auth: bool = True) -> tuple[int, Any, dict[str, str]]:
    headers = {"Authorization": f"Bearer {target.token}"} if auth else {}
    async with http.request(method, url, json=json, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as r:
        body = await r.json(content_type=None) if await r.read() else None
        return r.status, body, dict(r.headers)


def assert_error(answer: tuple[int, Any, dict], status: int, code: str) -> dict:
    """The API's error shape; returns its details."""
    s, body, _ = answer
    assert s == status, answer
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code and isinstance(body["error"]["message"], str), body
    assert isinstance(body["error"]["details"], dict), body
    return body["error"]["details"]


def header_int(answer: tuple[int, Any, dict], name: str) -> int:
    value = answer[2].get(name)
    assert value is not None and value.isdigit(), (name, answer)
    return int(value)


# -- meta ----------------------------------------------------------------------------------------------------
async def test_route_answer_and_long_poll(target, http):
    v = await target.create_topic("c-route", 2)
    routes = target.meta_url + "/v1/routes/"
    got = await call(http, target, "GET", f"{routes}c-route?min_version={v}")
    s, route, _ = got
    assert s == 200 and ROUTE_KEYS <= set(route) and route["topic"] == "c-route" and route["version"] >= v
    assert header_int(got, "X-Meta-Version") >= route["version"]
    assert [q["queue"] for q in route["queues"]] == [0, 1]
    for q in route["queues"]:
        assert ROUTE_QUEUE_KEYS <= set(q) and q["address"] == target.broker_urls[0] and q["writable"] is True
        assert q["segments"] and all(ROUTE_SEGMENT_KEYS <= set(seg) for seg in q["segments"])
    ranges = sorted((lo, hi) for lo, hi, _ in route["slot_table"])
    assert ranges[0][0] == 0 and ranges[-1][1] == route["slots"]

    unchanged = await call(http, target, "GET", f"{routes}c-route?after={route['version']}&wait={NO_CHANGE_WAIT_S}")
    assert unchanged[0] == 304 and header_int(unchanged, "X-Meta-Version") >= route["version"]
    older = await call(http, target, "GET", f"{routes}c-route?after={route['version'] - 1}&wait={LONG_POLL_S}")
    assert older[0] == 200 and older[1]["version"] == route["version"]

    t0 = time.monotonic()
    poll = asyncio.create_task(call(http, target, "GET", f"{routes}c-route?after={route['version']}&wait={LONG_POLL_S}"))
    await asyncio.sleep(NO_CHANGE_WAIT_S)
    v2 = await target.change_topic("c-route")
    s, changed, _ = await asyncio.wait_for(poll, LONG_POLL_S + 1)
    assert s == 200 and changed["version"] >= v2 > route["version"] and time.monotonic() - t0 < PROMPT_S

    missing = await call(http, target, "GET", routes + "c-nope")
    assert_error(missing, 404, "TOPIC_NOT_FOUND")
    assert header_int(missing, "X-Meta-Version") >= v2
    ahead = await call(http, target, "GET", f"{routes}c-route?min_version={10**9}&wait={NO_CHANGE_WAIT_S}")
    assert_error(ahead, 503, "VERSION_NOT_REACHED")
    assert header_int(ahead, "X-Meta-Version") >= v2
    # the watch stream is a read too: a node behind the reader's version refuses it instead of streaming older routes
    watch_ahead = await call(http, target, "GET", f"{target.meta_url}/v1/watch?topics=c-route&min_version={10**9}"
                                                  f"&wait={NO_CHANGE_WAIT_S}")
    assert_error(watch_ahead, 503, "VERSION_NOT_REACHED")
    assert_error(await call(http, target, "GET", routes + "c-route", auth=False), 401, "UNAUTHENTICATED")


async def test_history_pages(target, http):
    va = await target.create_topic("c-hist-a", 1)
    vb = await target.create_topic("c-hist-b", 1)
    va2 = await target.change_topic("c-hist-a")
    history = f"{target.meta_url}/v1/history?min_version={va2}&after={va - 1}"

    got = await call(http, target, "GET", history + "&topic=c-hist-a")
    s, page, _ = got
    assert s == 200 and set(page) == {"events", "next_after"}
    assert all(EVENT_KEYS <= set(e) and e["topic"] == "c-hist-a" for e in page["events"]), page
    assert [e["version"] for e in page["events"]] == [va, va2]
    applied = header_int(got, "X-Meta-Version")
    # A filtered page scans on past its last match: next_after is where the scan stopped.
    assert va2 <= page["next_after"] <= applied

    s, one, _ = await call(http, target, "GET", history + "&topic=c-hist-a&limit=1")
    assert s == 200 and [e["version"] for e in one["events"]] == [va] and one["next_after"] == va

    s, unrelated, _ = await call(http, target, "GET", history + "&topic=c-hist-none")
    assert s == 200 and unrelated["events"] == [] and va2 <= unrelated["next_after"] <= applied

    s, every, _ = await call(http, target, "GET", history + "&limit=2")
    assert s == 200 and [e["version"] for e in every["events"]] == [va, va + 1] and every["next_after"] == va + 1
    assert va < vb < va2

    s, end, _ = await call(http, target, "GET", f"{target.meta_url}/v1/history?after={applied + 5}")
    assert s == 200 and end == {"events": [], "next_after": applied + 5}


# -- brokers -------------------------------------------------------------------------------------------------
async def test_send_and_pull_answers(target, http):
    v = await target.create_topic("c-data", 2)
    holder, other = target.broker_urls
    send = f"{holder}/v1/messages/c-data/0"
    sent = await call(http, target, "POST", send, json={"messages": [
        {"body": "a"}, {"body": "b", "key": "k", "props": {"p": "1"}}, {"body_b64": "AAE="}]})
    assert sent[:2] == (200, {"queue": 0, "offsets": [0, 1, 2]}) and header_int(sent, "X-Route-Version") >= v

    wrong = await call(http, target, "POST", f"{other}/v1/messages/c-data/0", json={"messages": [{"body": "x"}]})
    details = assert_error(wrong, 409, "NOT_LEADER")
    assert details["address"] == holder and header_int(wrong, "X-Route-Version") >= v
    assert_error(await call(http, target, "POST", send, json={"messages": [{"body": "x"}]}, auth=False),
                 401, "UNAUTHENTICATED")

    pulled = await call(http, target, "GET", f"{send}?offset=0&max=10&group=g")
    s, page, _ = pulled
    assert s == 200 and set(page) == {"messages", "next_offset", "min_offset", "max_offset"}
    assert (page["next_offset"], page["min_offset"], page["max_offset"]) == (3, 0, 3)
    assert header_int(pulled, "X-Route-Version") >= v
    a, b, binary = page["messages"]
    assert set(a) == MESSAGE_KEYS | {"body"} and (a["offset"], a["body"], a["key"], a["props"]) == (0, "a", None, {})
    assert (b["offset"], b["body"], b["key"], b["props"]) == (1, "b", "k", {"p": "1"})
    assert set(binary) == MESSAGE_KEYS | {"body_b64"} and binary["body_b64"] == "AAE="
    assert all(isinstance(m["ts"], int) for m in page["messages"])

    s, one, _ = await call(http, target, "GET", f"{send}?offset=1&max=1&group=g")
    assert s == 200 and [m["offset"] for m in one["messages"]] == [1] and one["next_offset"] == 2
    s, at_end, _ = await call(http, target, "GET", f"{send}?offset=3&max=5&group=g")
    assert s == 200 and at_end["messages"] == [] and at_end["next_offset"] == 3 and at_end["max_offset"] == 3
    s, empty, _ = await call(http, target, "GET", f"{holder}/v1/messages/c-data/1?offset=0&max=5&group=g")
    assert s == 200 and (empty["messages"], empty["next_offset"], empty["min_offset"], empty["max_offset"]) == (
        [], 0, 0, 0)
    assert_error(await call(http, target, "GET", f"{other}/v1/messages/c-data/0?offset=0&max=1"), 409, "NOT_LEADER")
    assert_error(await call(http, target, "GET", f"{holder}/v1/messages/c-nope/0?offset=0&max=1"),
                 404, "TOPIC_NOT_FOUND")


async def test_commit_and_read_offsets(target, http):
    await target.create_topic("c-offsets", 1)
    holder, other = target.broker_urls
    offsets = f"{holder}/v1/offsets/g/c-offsets/0"
    assert (await call(http, target, "GET", offsets))[:2] == (200, {"offset": -1})
    committed = await call(http, target, "PUT", offsets, json={"offset": 2})
    assert committed[:2] == (200, {"offset": 2}) and header_int(committed, "X-Route-Version") >= 0
    assert (await call(http, target, "GET", offsets))[:2] == (200, {"offset": 2})
    assert_error(await call(http, target, "PUT", f"{other}/v1/offsets/g/c-offsets/0", json={"offset": 3}),
                 409, "NOT_LEADER")
    assert_error(await call(http, target, "PUT", offsets, json={"offset": -2}), 400, "INVALID_ARGUMENT")
