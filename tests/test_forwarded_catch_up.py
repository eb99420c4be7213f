"""A request a follower forwards to the leader runs there once the leader has applied what the follower had
(meta/api/http.py on_the_leader), on real meta processes: a follower answers writes from its own apply, which may
run ahead of the leader's, and a broker that registered through a follower was refused its next heartbeat on the
leader as unknown (tests/test_openapi_live.py failed so once in a full suite)."""

from __future__ import annotations

import asyncio
import time

from meta.api.http import FORWARDED_APPLIED_HEADER, FORWARDED_CATCH_UP_S
from tests.support import cluster as cluster_mod

HEARTBEAT = {"epoch": 1, "queues": {}}


async def _leader_and_version(c) -> tuple[str, str, int]:
    leader = await c.leader()
    url = c.url(leader)
    s, b, _ = await c.call("GET", url + "/readyz", None)
    assert s == 200, b
    follower = next(m["node"] for m in c.info["meta"] if m["node"] != leader)
    return url, follower, b["applied_version"]


async def test_a_forwarded_heartbeat_waits_for_the_registration_the_forwarding_node_had_applied(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000}) as c:
        url, follower, version = await _leader_and_version(c)
        # As the follower forwards a broker's first heartbeat right after it applied that broker's registration
        headers = {"X-Forwarded-By": follower, FORWARDED_APPLIED_HEADER: str(version + 1)}
        heartbeat = asyncio.create_task(c.call("POST", url + "/v1/brokers/late/heartbeat", "broker",
                                               json=HEARTBEAT, headers=headers))
        await asyncio.sleep(0.3)
        assert not heartbeat.done(), heartbeat.result()[:2]
        s, b, _ = await c.call("PUT", url + "/v1/brokers/late", "broker", json={"address": "http://127.0.0.1:1"})
        assert s == 200 and b["epoch"] == 1, b
        s, b, _ = await heartbeat
        assert s == 200 and b["state"] == "active", b


async def test_the_wait_is_bounded_and_the_request_then_runs_as_it_is(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000}) as c:
        url, follower, version = await _leader_and_version(c)
        headers = {"X-Forwarded-By": follower, FORWARDED_APPLIED_HEADER: str(version + 1000)}
        started = time.monotonic()
        s, b, _ = await c.call("POST", url + "/v1/brokers/never/heartbeat", "broker", json=HEARTBEAT,
                               headers=headers)
        took = time.monotonic() - started
        assert (s, b["error"]["code"]) == (404, "BROKER_NOT_FOUND"), b
        assert FORWARDED_CATCH_UP_S <= took < FORWARDED_CATCH_UP_S + 10.0, took
        # Sent straight to the leader (no forwarding node), nothing waits
        started = time.monotonic()
        s, b, _ = await c.call("POST", url + "/v1/brokers/never/heartbeat", "broker", json=HEARTBEAT,
                               headers={FORWARDED_APPLIED_HEADER: str(version + 1000)})
        assert s == 404 and time.monotonic() - started < FORWARDED_CATCH_UP_S, b
