"""Scopes (issue 37): a broker names its cluster (RocketMQ's brokerClusterName), a topic the clusters its queues and
their copies stay in (RocketMQ's ``updateStaticTopic -c``), or "global". Placement, remaps, growth and failover stay
inside; a create or a remap naming a broker outside is refused 409 OUT_OF_SCOPE. The decisions alone first (the
state machine, in process), then the whole path on real processes."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.broker_http import admin, wait_route
from tests.support.cluster import running
from tests.support.state_machine_builders import Log
from tests.support.stator_cli import STATOR

EAST, WEST = {"a", "b"}, {"c", "d"}


def clusters() -> Log:
    """a, b in east; c, d in west; e names none (DefaultCluster)."""
    log = Log()
    for name in sorted(EAST):
        log.register(name, cluster="east")
    for name in sorted(WEST):
        log.register(name, cluster="west")
    log.register("e")
    return log


def placed(log: Log, topic: str) -> set[str]:
    """Every broker any segment of the topic leads or copies."""
    return {b for q in range(log.topic(topic)["queues"]) for s in log.segs(topic, q) for b in s["replicas"]}


def test_a_scoped_topic_is_placed_grown_and_remapped_within_its_clusters():
    log = clusters()
    assert log.sm.image.brokers["e"]["cluster"] == "DefaultCluster"
    r = log.create("t", 4, replicas=2, scope=["east"])
    assert r["scope"] == ["east"] and log.topic("t")["scope"] == ["east"]
    assert placed(log, "t") == EAST
    moved = log.ok({"type": "RemapTopic", "topic": "t", "brokers": ["b"]})["moved"]
    assert moved and all(m["to"] == "b" for m in moved)
    assert placed(log, "t") == EAST
    log.create("w", 2, replicas=1, scope=["west"])
    log.ok({"type": "GrowTopic", "topic": "w", "queues": 5})
    assert placed(log, "w") <= WEST
    both = log.create("u", 4, replicas=2, scope=["east", "west"])
    assert both["replicas"] == 2 and placed(log, "u") <= EAST | WEST
    log.create("g", 5, replicas=3)
    assert log.topic("g")["scope"] == "global" and placed(log, "g") == EAST | WEST | {"e"}


def test_naming_a_broker_outside_the_scope_is_refused_and_changes_nothing():
    log = clusters()
    err = log.reject({"type": "CreateTopic", "topic": "t", "queues": 2, "scope": ["east"], "brokers": ["a", "c"]},
                     "OUT_OF_SCOPE")
    assert err["details"]["broker"] == "c" and err["details"]["cluster"] == "west"
    log.create("t", 2, replicas=2, scope=["east"])
    log.reject({"type": "RemapTopic", "topic": "t", "brokers": ["d"]}, "OUT_OF_SCOPE")
    log.reject({"type": "RemapTopic", "topic": "t", "brokers": ["a", "e"]}, "OUT_OF_SCOPE")
    # more copies than the scope has brokers, and a scope with no broker at all
    log.reject({"type": "CreateTopic", "topic": "u", "queues": 1, "replicas": 3, "scope": ["east"]},
               "NOT_ENOUGH_BROKERS")
    log.reject({"type": "CreateTopic", "topic": "u", "queues": 1, "scope": ["north"]}, "NO_BROKERS")


@pytest.mark.parametrize("scope", ["", "everywhere", [], ["east", "east"], ["no spaces"], [f"c{i}" for i in range(17)],
                                   {"east": 1}, 3])
def test_a_malformed_scope_is_a_400(scope):
    log = clusters()
    err = log.reject({"type": "CreateTopic", "topic": "t", "queues": 1, "scope": scope}, "INVALID_ARGUMENT")
    assert err["details"].get("field") == "scope", err


def test_a_failover_elects_within_the_scope_and_waits_rather_than_leave_it():
    log = clusters()
    log.create("t", 1, replicas=2, scope=["east"])
    leader = log.head("t", 0)["broker"]
    log.fence(leader)
    head = log.head("t", 0)
    assert head["broker"] in EAST - {leader} and set(head["replicas"]) == EAST
    log.fence(head["broker"])   # no in-sync copy left in the scope: the queue waits; nothing moves west
    assert set(log.head("t", 0)["replicas"]) == EAST and placed(log, "t") == EAST


async def test_scopes_on_real_processes(tmp_path):
    """Four brokers in two clusters: a topic scoped to one keeps every copy there through a failover (kill -9 of
    its leader), is refused a remap to the other, and says its scope in its route, its description, the CLI's
    broker list and the console."""
    per_broker = {"b1": {"cluster": "east"}, "b2": {"cluster": "east"}, "b3": {"cluster": "west"},
                  "b4": {"cluster": "west"}}
    async with running(str(tmp_path), 3, 4, meta={"session_timeout_ms": 3_000, "heartbeat_interval_ms": 500},
                       per_broker=per_broker) as c:
        east = {"b1", "b2"}
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "t", "queues": 4, "replicas": 2,
                                                        "scope": ["east"]})
        assert s == 201 and b["scope"] == ["east"], b
        r = await wait_route(c, "t", lambda r: all(len(q["in_sync"]) == 2 and q["writable"] for q in r["queues"]))
        assert r["scope"] == ["east"]
        assert {x for q in r["queues"] for x in q["replicas"]} == east
        s, b = await admin(c, "POST", 0, "/v1/topics/t/remap", {"brokers": ["b3"]})
        assert s == 409 and b["error"]["code"] == "OUT_OF_SCOPE", (s, b)
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "u", "queues": 1, "scope": ["east"],
                                                        "brokers": ["b4"]})
        assert s == 409 and b["error"]["code"] == "OUT_OF_SCOPE", (s, b)
        c.kill9("b1")
        r = await wait_route(c, "t", lambda r: all(q["broker"] == "b2" and q["writable"] for q in r["queues"]),
                             timeout_s=30.0)
        assert {x for q in r["queues"] for x in q["replicas"]} == east
        s, b = await admin(c, "GET", 0, "/v1/topics/t")
        assert s == 200 and b["scope"] == ["east"]
        s, b = await admin(c, "GET", 0, "/v1/brokers")
        assert {x["broker"]: x["cluster"] for x in b["brokers"]} == {k: v["cluster"] for k, v in per_broker.items()}
        proc = await asyncio.create_subprocess_exec(
            STATOR, "topic", "create", "v", "--queues", "2", "--replicas", "2", "--scope", "west",
            "--endpoints", c.meta_urls[0], "--token", c.token("admin"), "-w", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60.0)
        assert proc.returncode == 0, err
        assert json.loads(out)["scope"] == ["west"]
        r = await wait_route(c, "v", lambda r: all(q["writable"] for q in r["queues"]))
        assert {x for q in r["queues"] for x in q["replicas"]} == {"b3", "b4"}
