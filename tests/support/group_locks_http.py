"""Exclusive-group locks on real brokers: a cluster of three meta nodes and two brokers with short sessions (the
``two_brokers`` fixture), a topic with messages, and a member's pulls and commits with its token.
"""

from __future__ import annotations

import pytest

from tests.support import cluster as cluster_mod
from tests.support.broker_http import admin, all_writable, send, wait_route
from tests.support.group_members import beat, held

SESSION = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


@pytest.fixture
async def two_brokers(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 2, meta=SESSION) as c:
        yield c


async def topic(c, name: str, queues: int, messages: int, slots: int = 16, replicas: int | None = None) -> dict:
    body = {"topic": name, "queues": queues, "slots": slots}
    if replicas is not None:
        body["replicas"] = replicas
    s, b = await admin(c, "POST", 0, "/v1/topics", json=body)
    assert s == 201, b
    await wait_route(c, name, all_writable)
    for q in range(queues):
        await send(c, name, q, [f"{name}{q}-{i}" for i in range(messages)])
    return await wait_route(c, name, all_writable)


def head(r: dict, queue: int) -> str:
    return r["queues"][queue]["address"]


async def pull(c, r: dict, queue: int, token=None, group: str | None = "g", offset: int = 0) -> tuple[int, dict]:
    query = f"offset={offset}&max=100" + (f"&group={group}" if group else "") + (
        f"&token={token}" if token is not None else "")
    s, b, _ = await c.call("GET", f"{head(r, queue)}/v1/messages/{r['topic']}/{queue}?{query}", "client")
    return s, b


async def commit(c, r: dict, queue: int, offset: int, token=None) -> tuple[int, dict]:
    body = {"offset": offset} if token is None else {"offset": offset, "token": token}
    s, b, _ = await c.call("PUT", f"{head(r, queue)}/v1/offsets/g/{r['topic']}/{queue}", "client", json=body)
    return s, b


def code(s: int, b) -> tuple[int, str | None]:
    return s, b.get("error", {}).get("code") if isinstance(b, dict) else None


async def a_owns_all(c, queues: int) -> dict[int, int] | None:
    got = held(await beat(c, "a"))
    return got if sorted(got) == list(range(queues)) else None
