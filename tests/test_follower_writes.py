"""A command sent to a follower reaches the leader through the raft transport (meta/forwarder.py through_log):
the leader stamps its own time into it, the answer is the follower's own apply (read-your-writes there at once),
and a retry with the same Idempotency-Key through another node applies nothing twice."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.meta_http import BrokerSim, history, node_urls, ok

pytestmark = pytest.mark.slow

TOPIC = "fwd"
# The last event before the follower's write is at least this much older than the write: a command that reached the
# log with ts 0 would carry that older time (the state machine keeps log time monotonic), the leader's stamp cannot.
QUIET_S = 1.5
CLOCK_SLACK_MS = 500  # the leader's and the test's clock are the same machine's; this only covers rounding


async def test_follower_write_goes_through_the_log_with_the_leaders_time(meta_cluster):
    c = meta_cluster
    sim = BrokerSim(c)
    try:
        await sim.register("b1")
        await ok(c, "POST", "/v1/topics", json={"topic": TOPIC, "queues": 2, "brokers": ["b1"]}, expect=(201,))
        _leader, _lurl, followers = await node_urls(c)
        await asyncio.sleep(QUIET_S)

        versions = []
        for i, f in enumerate(followers):
            before_ms = int(time.time() * 1000)
            s, b, _ = await c.call("PUT", f"{f}/v1/topics/{TOPIC}/config", json={"k": f"v{i}"},
                                   headers={"Idempotency-Key": f"fwd-{i}"})
            assert s == 200 and b["config"] == {"k": f"v{i}"}, (f, s, b)
            versions.append(b["version"])
            # Answered from the follower's own apply: the write is there without waiting for anything.
            s, d, _ = await c.call("GET", f"{f}/v1/topics/{TOPIC}", "client")
            assert s == 200 and d["config"] == {"k": f"v{i}"}, (f, s, d)
            events = [e for e in await history(c, f, b["version"]) if e["version"] == b["version"]]
            assert len(events) == 1 and events[0]["type"] == "TopicConfigChanged", events
            assert events[0]["ts"] >= before_ms - CLOCK_SLACK_MS, ("not the leader's time", events[0], before_ms)
        assert versions[0] < versions[1], versions

        # The same key again, through the other follower: the first outcome, nothing applied twice.
        s, b, _ = await c.call("PUT", f"{followers[1]}/v1/topics/{TOPIC}/config", json={"k": "v0"},
                               headers={"Idempotency-Key": "fwd-0"})
        assert s == 200 and b["version"] == versions[0], (s, b, versions)
        changes = [e for e in await history(c, followers[0], versions[1]) if e["type"] == "TopicConfigChanged"]
        assert [e["version"] for e in changes] == versions, changes
    finally:
        await sim.close()
