"""Integration tests of the three-node meta cluster over HTTP (API.md meta section, DESIGN.md invariants 1, 3, 5, 9).

Every test gets its own cluster of three real meta processes on loopback (the ``meta_cluster`` fixture, broker
sessions of 3 s). Brokers are simulated with the broker token (tests/support/meta_http.BrokerSim). Blocking cluster
tools (kill, start, restart) run in a thread so background heartbeats and writers keep running meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from ops import devcluster
from tests.support.meta_http import (
    NET_ERRORS, SIM_ADDRESS, BrokerSim, SseReader, assert_error_shape, call_any, cluster_status, history, log_tail,
    name_of, node_urls, ok, wait_until,
)

pytestmark = pytest.mark.slow


@pytest.fixture
async def sim(meta_cluster):
    s = BrokerSim(meta_cluster)
    try:
        yield s
    finally:
        await s.close()


async def create_topic(c, topic: str, queues: int, brokers: list[str] | None = None, url: str | None = None,
                       **extra: Any) -> dict:
    body: dict[str, Any] = {"topic": topic, "queues": queues, **extra}
    if brokers is not None:
        body["brokers"] = brokers
    b = await ok(c, "POST", "/v1/topics", json=body, url=url, expect=(201,))
    assert b["topic"] == topic and b["queues"] == queues and isinstance(b["version"], int), b
    return b


def _meta_version(h: dict) -> int:
    assert "X-Meta-Version" in h, f"response without X-Meta-Version: {h}"
    return int(h["X-Meta-Version"])


# ---------------------------------------------------------------------------------------------------------------
# 1. read-your-writes on every node
# ---------------------------------------------------------------------------------------------------------------
async def test_follower_write_is_readable_everywhere_with_min_version_and_linearizable(meta_cluster, sim):
    c = meta_cluster
    await sim.register("b1")
    await sim.register("b2")
    created = await create_topic(c, "orders", 4, ["b1", "b2"])
    leader, lurl, followers = await node_urls(c)
    f = followers[0]

    s, b, h = await c.call("PUT", f + "/v1/topics/orders/config", json={"retention": "7d"})
    assert s == 200, (s, b)
    v = b["version"]
    assert v > created["version"] and b["config"] == {"retention": "7d"} and b["topic"] == "orders", b

    for url in c.meta_urls:
        who = name_of(c, url)
        s, d, h = await c.call("GET", f"{url}/v1/topics/orders?min_version={v}", "client")
        assert s == 200, (who, s, d)
        assert d["version"] == v and d["config"] == {"retention": "7d"} and d["queues"] == 4, (who, d)
        assert len(d["logic_queues"]) == 4 and _meta_version(h) >= v, (who, d, h)

        s, d, h = await c.call("GET", f"{url}/v1/topics?min_version={v}", "client")
        assert s == 200 and {"topic": "orders", "queues": 4, "version": v} in d["topics"], (who, s, d)

        s, r, h = await c.call("GET", f"{url}/v1/routes/orders?min_version={v}", "client")
        assert s == 200, (who, s, r)
        assert r["version"] == v and r["topic"] == "orders" and len(r["queues"]) == 4, (who, r)
        assert r.get("config", {}).get("retention") == "7d", (who, r)
        assert all(q["writable"] for q in r["queues"]), (who, r)
        assert _meta_version(h) >= v

        s, hist, h = await c.call("GET", f"{url}/v1/history?topic=orders&min_version={v}", "client")
        assert s == 200, (who, s, hist)
        mine = [e for e in hist["events"] if e["version"] == v]
        assert len(mine) == 1 and mine[0]["type"] == "TopicConfigChanged" and mine[0]["topic"] == "orders", (who, hist)
        assert mine[0]["data"]["config"] == {"retention": "7d"} and isinstance(mine[0]["ts"], int), (who, mine)
        assert [e["version"] for e in hist["events"]] == sorted(e["version"] for e in hist["events"]), hist

        s, cl, h = await c.call("GET", f"{url}/v1/cluster?min_version={v}", "client")
        assert s == 200 and cl["applied_version"] >= v and cl["node"] == who and cl["leader"] == leader, (who, cl)

    # Linearizable reads: write on one node, read at once (no min_version) on another node.
    urls = c.meta_urls
    for i, reader in enumerate(urls):
        writer = urls[(i + 1) % len(urls)]
        key = f"lin{i}"
        s, b, _ = await c.call("PUT", f"{writer}/v1/topics/orders/config", json={key: str(i)})
        assert s == 200, (s, b)
        vi = b["version"]
        s, d, h = await c.call("GET", f"{reader}/v1/topics/orders?consistency=linearizable", "client")
        assert s == 200 and d["version"] >= vi and d["config"].get(key) == str(i), \
            (name_of(c, writer), name_of(c, reader), vi, s, d)
        assert _meta_version(h) >= vi
        s, r, _ = await c.call("GET", f"{reader}/v1/routes/orders?consistency=linearizable", "client")
        assert s == 200 and r["version"] >= vi, (s, r)
        s, hist, _ = await c.call("GET", f"{reader}/v1/history?topic=orders&after={vi - 1}&consistency=linearizable",
                                  "client")
        assert s == 200 and any(e["version"] == vi for e in hist["events"]), (s, hist)

    # One log, one truth: every node holds the same events at the same versions.
    last = (await cluster_status(c, lurl))["applied_version"]
    hs = [await history(c, u, last) for u in urls]
    assert all(h_[:last] == hs[0][:last] for h_ in hs) and len(hs[0]) >= last, "the nodes' histories differ"


# ---------------------------------------------------------------------------------------------------------------
# 2. kill -9 of the leader under load
# ---------------------------------------------------------------------------------------------------------------
async def test_leader_kill9_under_write_load_loses_no_acknowledged_write(meta_cluster, sim):
    c = meta_cluster
    await sim.register("b1")
    await sim.register("b2")
    writers, topics_per_writer, keys_per_topic = 4, 2, 60   # a topic holds at most 64 config keys
    topics = {w: [f"load{w}x{j}" for j in range(topics_per_writer)] for w in range(writers)}
    for w in range(writers):
        for t in topics[w]:
            await create_topic(c, t, 2, ["b1", "b2"])
    leader = await c.leader()
    urls = list(c.meta_urls)
    acks: list[dict[str, Any]] = []
    unexpected: list[Any] = []
    stop = asyncio.Event()
    hard_stop = time.monotonic() + 90

    async def writer(w: int) -> None:
        node = w
        n = 0
        while not stop.is_set() and n < topics_per_writer * keys_per_topic:
            topic = topics[w][n // keys_per_topic]
            key, val, idem = f"w{w}k{n}", f"v{n}", f"load-{w}-{n}"
            attempts = 0
            while True:
                attempts += 1
                url = urls[node % len(urls)]
                sent = time.monotonic()
                try:
                    s, b, _ = await c.call("PUT", f"{url}/v1/topics/{topic}/config", json={key: val},
                                           headers={"Idempotency-Key": idem}, timeout_s=8.0)
                except NET_ERRORS as e:
                    s, b = None, repr(e)
                if s == 200:
                    acks.append({"t": time.monotonic(), "sent": sent, "writer": w, "topic": topic, "key": key,
                                 "value": val, "version": b.get("version"), "attempts": attempts,
                                 "node": name_of(c, url)})
                    if not isinstance(b.get("version"), int) or b.get("config", {}).get(key) != val:
                        unexpected.append(("bad ack body", w, key, b))
                    break
                if s is None or s == 503:
                    node += 1
                    if time.monotonic() > hard_stop:
                        unexpected.append(("gave up", w, key, s, b))
                        return
                    await asyncio.sleep(0.05)
                    continue
                unexpected.append(("unexpected answer", w, key, name_of(c, url), s, b))
                break
            n += 1
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(writer(w)) for w in range(writers)]
    try:
        await asyncio.sleep(2.0)
        before_kill = len(acks)
        assert before_kill >= 10, f"the load did not get going: {before_kill} acks, {unexpected}"
        t_kill = time.monotonic()
        await asyncio.to_thread(c.kill9, leader)
        t_dead = time.monotonic()
        # A broker heartbeat reaching a follower that still believes in the dead leader (the election takes
        # 0.3-0.6 s) must get 503 NO_LEADER or a late 200, never a 500.
        probes = await asyncio.gather(*(sim.heartbeat_at("b1", u) for u in urls if u != c.url(leader)))

        def resumed():
            fresh = [a for a in acks if a["sent"] > t_dead]
            return min(fresh, key=lambda a: a["t"]) if fresh else None

        async def pred():
            return resumed()
        first = await wait_until(pred, 20.0, "a write acknowledged after the leader was killed", 0.02)
        resume_s = first["t"] - t_kill
        await asyncio.sleep(2.0)  # keep writing on the new leader for a while
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)

    times = sorted(a["t"] for a in acks)
    max_gap = max((b - a for a, b in zip(times, times[1:]) if b > t_kill - 1.0), default=0.0)
    after = [a for a in acks if a["t"] > t_dead]
    new_leader = await c.leader()
    print(f"\n[failover] killed leader {leader} (kill took {t_dead - t_kill:.3f} s); new leader {new_leader}; "
          f"first write sent after the kill acknowledged {resume_s:.3f} s after the kill "
          f"(via {first['node']}); largest gap between acknowledgements {max_gap:.3f} s; "
          f"acks: {before_kill} before, {len(after)} after, {len(acks)} total; "
          f"writes needing retries: {sum(1 for a in acks if a['attempts'] > 1)}")

    assert not unexpected, f"writers saw unexpected answers: {unexpected[:10]}"
    assert new_leader != leader
    assert resume_s < 5.0, f"writes resumed only {resume_s:.3f} s after the leader was killed"
    assert len(after) >= 5, f"too few writes after the failover: {len(after)}"
    versions = [a["version"] for a in acks]
    assert len(set(versions)) == len(versions), "two different acknowledged writes answered with the same version"

    max_v = max(versions)
    live = [u for u in urls if u != c.url(leader)]
    by_topic: dict[str, dict[str, str]] = {}
    for a in acks:
        by_topic.setdefault(a["topic"], {})[a["key"]] = a["value"]
    for url in live:
        for topic, expected in by_topic.items():
            s, d, h = await c.call("GET", f"{url}/v1/topics/{topic}?min_version={max_v}&wait=10", "client")
            assert s == 200, (name_of(c, url), topic, s, d)
            missing = {k: v for k, v in expected.items() if d["config"].get(k) != v}
            assert not missing, (f"{name_of(c, url)} lost {len(missing)} acknowledged writes of {topic}: "
                                 f"{sorted(missing)[:10]}")
            assert _meta_version(h) >= max_v
    # one log, one truth: the surviving nodes hold the same events at the same versions
    h1, h2 = [await history(c, u, max_v) for u in live]
    n = min(len(h1), len(h2))
    assert n >= max_v and h1[:n] == h2[:n], f"the live nodes' histories differ (lengths {len(h1)}, {len(h2)})"
    assert [e["version"] for e in h1] == list(range(1, len(h1) + 1)), "history versions are not 1..N"
    assert all(p[0] in (200, 503) for p in probes), \
        f"heartbeats sent to the followers right after the leader died: {probes}"
    assert not sim.bad_answers, f"broker heartbeats got 5xx answers during the failover: {sim.bad_answers[:5]}"


# ---------------------------------------------------------------------------------------------------------------
# 3. a killed follower restarts from its own data and catches up
# ---------------------------------------------------------------------------------------------------------------
async def test_killed_follower_restarts_and_catches_up(meta_cluster, sim):
    c = meta_cluster
    await sim.register("b1")
    await create_topic(c, "t3", 2, ["b1"])
    v0 = (await ok(c, "PUT", "/v1/topics/t3/config", json={"before": "yes"}))["version"]
    leader, lurl, followers = await node_urls(c)
    f = followers[0]
    fname = name_of(c, f)
    await ok(c, "GET", f"/v1/topics/t3?min_version={v0}", role="client", url=f)

    await asyncio.to_thread(c.kill9, fname)
    live = [u for u in c.meta_urls if u != f]
    expected = {"before": "yes"}
    versions = [v0]
    for i in range(10):
        b = await ok(c, "PUT", "/v1/topics/t3/config", json={f"down{i}": str(i)}, url=live[i % 2])
        expected[f"down{i}"] = str(i)
        versions.append(b["version"])
    versions.append((await create_topic(c, "t3b", 1, ["b1"], url=live[0]))["version"])
    await sim.register("b9")
    versions.append((await cluster_status(c, lurl))["applied_version"])
    vd = max(versions)

    t0 = time.monotonic()
    await asyncio.to_thread(c.start, fname)
    print(f"\n[restart] {fname} ready again after {time.monotonic() - t0:.2f} s")

    s, d, h = await c.call("GET", f"{f}/v1/topics/t3?min_version={vd}&wait=10", "client")
    assert s == 200, (s, d)
    assert d["config"] == expected, (d["config"], expected)
    assert _meta_version(h) >= vd
    s, d, _ = await c.call("GET", f"{f}/v1/topics/t3b?min_version={vd}", "client")
    assert s == 200 and d["topic"] == "t3b", (s, d)
    s, d, _ = await c.call("GET", f"{f}/v1/brokers?min_version={vd}", "client")
    assert s == 200 and {"b1", "b9"} <= {b["broker"] for b in d["brokers"]}, (s, d)

    leader_applied = (await cluster_status(c, c.url(await c.leader())))["applied_version"]

    async def caught_up():
        st = await cluster_status(c, f)
        return st if st["applied_version"] >= leader_applied else None
    st = await wait_until(caught_up, 10.0, f"{fname} to reach the leader's applied_version {leader_applied}")
    assert st["role"] == "follower" and st["leader"] is not None, st
    # the restarted node also serves the history it missed
    s, hist, _ = await c.call("GET", f"{f}/v1/history?topic=t3&after={v0}&min_version={vd}", "client")
    assert s == 200 and len([e for e in hist["events"] if e["type"] == "TopicConfigChanged"]) == 10, (s, hist)
    mine, theirs = await history(c, f, leader_applied), await history(c, lurl, leader_applied)
    assert mine[:leader_applied] == theirs[:leader_applied], f"{fname}'s history differs from the leader's"


# ---------------------------------------------------------------------------------------------------------------
# 4. full-cluster restart
# ---------------------------------------------------------------------------------------------------------------
async def _snapshot(c, url: str, v: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    s, d, h = await c.call("GET", f"{url}/v1/topics?min_version={v}&wait=15", "client")
    assert s == 200, (url, s, d)
    out["topics"] = d["topics"]
    out["detail"] = {}
    for t in d["topics"]:
        s, td, _ = await c.call("GET", f"{url}/v1/topics/{t['topic']}", "client")
        assert s == 200, (url, t, s, td)
        out["detail"][t["topic"]] = td
    s, d, _ = await c.call("GET", f"{url}/v1/brokers", "client")
    assert s == 200
    out["brokers"] = [{k: b[k] for k in ("broker", "address", "epoch", "state")} for b in d["brokers"]]
    s, d, _ = await c.call("GET", f"{url}/v1/history?after=0&limit=10000", "client")
    assert s == 200
    out["history"] = d["events"]
    out["applied_version"] = (await cluster_status(c, url))["applied_version"]
    out["header_version"] = _meta_version(h)
    return out


async def test_full_cluster_restart_keeps_everything_and_versions_only_grow(meta_cluster, sim):
    c = meta_cluster
    e1 = await sim.register("b1")
    await sim.register("b2")
    await create_topic(c, "alpha", 3, ["b1", "b2"], config={"owner": "team-a"})
    await create_topic(c, "beta", 1, ["b2"])
    await ok(c, "PUT", "/v1/topics/alpha/config", json={"retention": "3d"})
    moved = (await ok(c, "POST", "/v1/topics/beta/remap", json={"brokers": ["b1"]}))["moved"]
    assert moved == [{"queue": 0, "from": "b2", "to": "b1", "gen": 1}], moved
    s, b = await sim.seal("b2", "beta", 0, 0, 42)
    assert s == 200, (s, b)
    v_last = b["version"]

    before = {u: await _snapshot(c, u, v_last) for u in c.meta_urls}
    first = before[c.meta_urls[0]]
    for u, snap in before.items():
        assert {k: snap[k] for k in ("topics", "detail", "history")} == \
               {k: first[k] for k in ("topics", "detail", "history")}, f"nodes differ before the restart ({u})"
    v_before = max(s["applied_version"] for s in before.values())
    assert v_before >= v_last

    for m in ("m1", "m2", "m3"):
        await asyncio.to_thread(c.kill9, m)
    t0 = time.monotonic()
    await asyncio.to_thread(devcluster.restart_all, c.dir)
    c.reload()
    print(f"\n[full restart] all three ready after {time.monotonic() - t0:.2f} s; version before {v_before}")

    seen_versions = []
    for u in c.meta_urls:
        s, cl, h = await c.call("GET", f"{u}/v1/cluster", "client")
        assert s == 200, (u, s, cl)
        seen_versions.append((name_of(c, u), cl["applied_version"], _meta_version(h)))
    assert all(av >= v_before and hv >= v_before for _, av, hv in seen_versions), \
        f"a node answers with a version older than before the restart ({v_before}): {seen_versions}"

    for u in c.meta_urls:
        after = await _snapshot(c, u, v_before)
        who = name_of(c, u)
        assert after["applied_version"] >= v_before and after["header_version"] >= v_before, (who, after)
        assert after["topics"] == first["topics"], (who, after["topics"], first["topics"])
        assert after["detail"] == first["detail"], (who, after["detail"], first["detail"])
        assert [b["broker"] for b in after["brokers"]] == ["b1", "b2"], (who, after["brokers"])
        assert [{k: b[k] for k in ("broker", "address", "epoch")} for b in after["brokers"]] == \
               [{k: b[k] for k in ("broker", "address", "epoch")} for b in first["brokers"]], who
        assert after["history"][:len(first["history"])] == first["history"], f"{who}: history changed"
        vs = [e["version"] for e in after["history"]]
        assert vs == list(range(1, len(vs) + 1)), f"{who}: history versions not 1..N: {vs}"

    # New writes continue from where the log was, never back.
    w = await ok(c, "PUT", "/v1/topics/alpha/config", json={"after": "restart"})
    assert w["version"] > v_before, (w, v_before)
    e1b = (await ok(c, "PUT", "/v1/brokers/b1", role="broker", json={"address": SIM_ADDRESS}))["epoch"]
    assert e1b == e1 + 1, (e1, e1b)
    sim.epochs["b1"] = e1b
    g = await create_topic(c, "gamma", 2, ["b1", "b2"])
    assert g["version"] > w["version"], (g, w)
    for u in c.meta_urls:
        s, d, h = await c.call("GET", f"{u}/v1/topics/alpha?min_version={g['version']}", "client")
        assert s == 200 and d["config"] == {"owner": "team-a", "retention": "3d", "after": "restart"}, (u, d)
        assert _meta_version(h) >= g["version"]


# ---------------------------------------------------------------------------------------------------------------
# 5. bad input: the right 4xx, the error shape, no state change, never a 500
# ---------------------------------------------------------------------------------------------------------------
BIG = 2 * 1024 * 1024
INVALID = (400, "INVALID_ARGUMENT")


def _bad_input_cases(tv: int, b1_epoch: int) -> list[tuple]:
    """(label, method, path, role, json, data, headers, expected status, expected code or set of codes)."""
    T = "/v1/topics/t"
    new = {"topic": "fresh", "queues": 2, "brokers": ["b1"]}
    J = "application/json"
    raw = {"Content-Type": J}
    hb = "/v1/brokers/b1/heartbeat"
    seal = {"epoch": b1_epoch, "topic": "t", "queue": 0, "gen": 0, "end_offset": 5}
    cases = [
        # malformed JSON
        ("malformed create", "POST", "/v1/topics", "admin", None, b'{"topic": "x", "queues": ', raw, *INVALID),
        ("malformed config", "PUT", f"{T}/config", "admin", None, b"{not json}", raw, *INVALID),
        ("malformed remap", "POST", f"{T}/remap", "admin", None, b'{"brokers": ["b2"]', raw, *INVALID),
        ("invalid utf-8 register", "PUT", "/v1/brokers/bz", "broker", None, b'\xff\xfe{"a', raw, *INVALID),
        ("empty body create", "POST", "/v1/topics", "admin", None, b"", raw, *INVALID),
        ("malformed heartbeat", "POST", hb, "broker", None, b"{'epoch': 1}", raw, *INVALID),
        # non-object bodies
        ("array create", "POST", "/v1/topics", "admin", [new], None, None, *INVALID),
        ("string create", "POST", "/v1/topics", "admin", "fresh", None, None, *INVALID),
        ("null create", "POST", "/v1/topics", "admin", None, b"null", raw, *INVALID),
        ("number create", "POST", "/v1/topics", "admin", None, b"42", raw, *INVALID),
        ("array config", "PUT", f"{T}/config", "admin", ["a", "b"], None, None, *INVALID),
        ("array grow", "PATCH", T, "admin", [8], None, None, *INVALID),
        ("array heartbeat", "POST", hb, "broker", [1], None, None, *INVALID),
        ("array seal", "POST", "/v1/brokers/b1/seal", "broker", [seal], None, None, *INVALID),
        # wrong types
        ("bool queues", "POST", "/v1/topics", "admin", {**new, "queues": True}, None, None, *INVALID),
        ("string queues", "POST", "/v1/topics", "admin", {**new, "queues": "2"}, None, None, *INVALID),
        ("float queues", "POST", "/v1/topics", "admin", {**new, "queues": 2.5}, None, None, *INVALID),
        ("int topic", "POST", "/v1/topics", "admin", {**new, "topic": 5}, None, None, *INVALID),
        ("bool slots", "POST", "/v1/topics", "admin", {**new, "slots": True}, None, None, *INVALID),
        ("string slots", "POST", "/v1/topics", "admin", {**new, "slots": "1024"}, None, None, *INVALID),
        ("string brokers", "POST", "/v1/topics", "admin", {**new, "brokers": "b1"}, None, None, *INVALID),
        ("bad order", "POST", "/v1/topics", "admin", {**new, "order": "random"}, None, None, *INVALID),
        ("int config value on create", "POST", "/v1/topics", "admin", {**new, "config": {"k": 5}}, None, None, *INVALID),
        ("bool grow", "PATCH", T, "admin", {"queues": True}, None, None, *INVALID),
        ("string grow", "PATCH", T, "admin", {"queues": "8"}, None, None, *INVALID),
        ("int config value", "PUT", f"{T}/config", "admin", {"k": 1}, None, None, *INVALID),
        ("bool config value", "PUT", f"{T}/config", "admin", {"k": True}, None, None, *INVALID),
        ("list config value", "PUT", f"{T}/config", "admin", {"k": ["x"]}, None, None, *INVALID),
        ("string remap brokers", "POST", f"{T}/remap", "admin", {"brokers": "b2"}, None, None, *INVALID),
        ("bool remap queue", "POST", f"{T}/remap", "admin", {"brokers": ["b2"], "queues": [True]}, None, None, *INVALID),
        ("string remap queue", "POST", f"{T}/remap", "admin", {"brokers": ["b2"], "queues": ["0"]}, None, None, *INVALID),
        ("duplicate remap queues", "POST", f"{T}/remap", "admin", {"brokers": ["b2"], "queues": [0, 0]}, None, None,
         *INVALID),
        ("bool epoch", "POST", hb, "broker", {"epoch": True, "queues": {}}, None, None, *INVALID),
        ("string epoch", "POST", hb, "broker", {"epoch": str(b1_epoch), "queues": {}}, None, None, *INVALID),
        ("string offset", "POST", hb, "broker", {"epoch": b1_epoch, "queues": {"t.q0.g0.i1": "5"}}, None, None,
         *INVALID),
        ("list queues", "POST", hb, "broker", {"epoch": b1_epoch, "queues": []}, None, None, *INVALID),
        ("string seal epoch", "POST", "/v1/brokers/b1/seal", "broker", {**seal, "epoch": str(b1_epoch)}, None, None,
         *INVALID),
        ("int address", "PUT", "/v1/brokers/bz", "broker", {"address": 5}, None, None, *INVALID),
        ("empty address", "PUT", "/v1/brokers/bz", "broker", {"address": ""}, None, None, *INVALID),
        # unknown fields
        ("unknown field create", "POST", "/v1/topics", "admin", {**new, "colour": "red"}, None, None, *INVALID),
        ("unknown field grow", "PATCH", T, "admin", {"queues": 8, "colour": "red"}, None, None, *INVALID),
        ("unknown field remap", "POST", f"{T}/remap", "admin", {"brokers": ["b2"], "colour": "red"}, None, None,
         *INVALID),
        ("unknown field register", "PUT", "/v1/brokers/bz", "broker", {"address": SIM_ADDRESS, "colour": "red"},
         None, None, *INVALID),
        ("not a disk id register", "PUT", "/v1/brokers/bz", "broker", {"address": SIM_ADDRESS, "disk": "ab" * 15},
         None, None, *INVALID),
        ("upper-case disk id register", "PUT", "/v1/brokers/bz", "broker", {"address": SIM_ADDRESS, "disk": "AB" * 16},
         None, None, *INVALID),
        # negative / huge numbers
        ("negative queues", "POST", "/v1/topics", "admin", {**new, "queues": -1}, None, None, *INVALID),
        ("zero queues", "POST", "/v1/topics", "admin", {**new, "queues": 0}, None, None, *INVALID),
        ("huge queues", "POST", "/v1/topics", "admin", {**new, "queues": 10 ** 30}, None, None, *INVALID),
        ("too many queues", "POST", "/v1/topics", "admin", {**new, "queues": 16_385, "slots": 65_536}, None, None,
         *INVALID),
        ("negative slots", "POST", "/v1/topics", "admin", {**new, "slots": -5}, None, None, *INVALID),
        ("huge slots", "POST", "/v1/topics", "admin", {**new, "slots": 2 ** 40}, None, None, *INVALID),
        ("queues above slots", "POST", "/v1/topics", "admin", {**new, "queues": 8, "slots": 4}, None, None, *INVALID),
        ("NaN queues", "POST", "/v1/topics", "admin", None, b'{"topic": "fresh", "queues": NaN}', raw, *INVALID),
        ("Infinity slots", "POST", "/v1/topics", "admin", None,
         b'{"topic": "fresh", "queues": 1, "slots": Infinity}', raw, *INVALID),
        ("negative grow", "PATCH", T, "admin", {"queues": -4}, None, None, *INVALID),
        ("huge grow", "PATCH", T, "admin", {"queues": 10 ** 20}, None, None, *INVALID),
        ("grow above slots", "PATCH", T, "admin", {"queues": 2000}, None, None, *INVALID),
        ("negative expected_version", "PUT", f"{T}/config?expected_version=-1", "admin", {"k": "v"}, None, None,
         *INVALID),
        ("huge expected_version", "PUT", f"{T}/config?expected_version={10 ** 25}", "admin", {"k": "v"}, None, None,
         *INVALID),
        ("text expected_version", "PUT", f"{T}/config?expected_version=abc", "admin", {"k": "v"}, None, None,
         *INVALID),
        ("negative min_version", "GET", f"{T}?min_version=-1", "client", None, None, None, *INVALID),
        ("text min_version", "GET", f"{T}?min_version=abc", "client", None, None, None, *INVALID),
        ("negative wait", "GET", f"{T}?min_version=1&wait=-1", "client", None, None, None, *INVALID),
        ("huge wait", "GET", f"{T}?min_version=1&wait=1e9", "client", None, None, None, *INVALID),
        ("bad consistency", "GET", f"{T}?consistency=eventual-ish", "client", None, None, None, *INVALID),
        ("negative after", "GET", "/v1/routes/t?after=-2", "client", None, None, None, *INVALID),
        ("negative route wait", "GET", "/v1/routes/t?after=1&wait=-1", "client", None, None, None, *INVALID),
        ("huge route wait", "GET", "/v1/routes/t?after=1&wait=100000", "client", None, None, None, *INVALID),
        ("text route wait", "GET", "/v1/routes/t?after=1&wait=soon", "client", None, None, None, *INVALID),
        ("negative history after", "GET", "/v1/history?after=-1", "client", None, None, None, *INVALID),
        ("text history limit", "GET", "/v1/history?limit=x", "client", None, None, None, *INVALID),
        ("negative watch after", "GET", "/v1/watch?topics=t&after=-5", "client", None, None, None, *INVALID),
        ("negative epoch", "POST", hb, "broker", {"epoch": -1, "queues": {}}, None, None, *INVALID),
        ("huge epoch", "POST", hb, "broker", {"epoch": 10 ** 30, "queues": {}}, None, None, *INVALID),
        ("negative offset", "POST", hb, "broker", {"epoch": b1_epoch, "queues": {"t.q0.g0.i1": -1}}, None, None,
         *INVALID),
        ("negative end_offset", "POST", "/v1/brokers/b1/seal", "broker", {**seal, "end_offset": -1}, None, None,
         *INVALID),
        ("huge end_offset", "POST", "/v1/brokers/b1/seal", "broker", {**seal, "end_offset": 10 ** 30}, None, None,
         *INVALID),
        ("negative seal queue", "POST", "/v1/brokers/b1/seal", "broker", {**seal, "queue": -1}, None, None, *INVALID),
        ("negative remap queue", "POST", f"{T}/remap", "admin", {"brokers": ["b2"], "queues": [-1]}, None, None,
         *INVALID),
        ("remap missing queue", "POST", f"{T}/remap", "admin", {"brokers": ["b2"], "queues": [99]}, None, None,
         *INVALID),
        # bad names
        ("dotted topic", "POST", "/v1/topics", "admin", {**new, "topic": "a.b"}, None, None, *INVALID),
        ("slashed topic", "POST", "/v1/topics", "admin", {**new, "topic": "a/b"}, None, None, *INVALID),
        ("long topic", "POST", "/v1/topics", "admin", {**new, "topic": "x" * 200}, None, None, *INVALID),
        ("empty topic", "POST", "/v1/topics", "admin", {**new, "topic": ""}, None, None, *INVALID),
        ("unicode topic", "POST", "/v1/topics", "admin", {**new, "topic": "t\u00f3pico"}, None, None, *INVALID),
        ("space topic", "POST", "/v1/topics", "admin", {**new, "topic": "a b"}, None, None, *INVALID),
        ("dotted broker in create", "POST", "/v1/topics", "admin", {**new, "brokers": ["b.1"]}, None, None, *INVALID),
        ("slashed broker in remap", "POST", f"{T}/remap", "admin", {"brokers": ["b/1"]}, None, None, *INVALID),
        ("dotted topic path config", "PUT", "/v1/topics/a.b/config", "admin", {"k": "v"}, None, None,
         (400, 404), {"INVALID_ARGUMENT", "TOPIC_NOT_FOUND"}),
        ("long topic path config", "PUT", f"/v1/topics/{'x' * 200}/config", "admin", {"k": "v"}, None, None,
         (400, 404), {"INVALID_ARGUMENT", "TOPIC_NOT_FOUND"}),
        ("slashed topic path config", "PUT", "/v1/topics/a%2Fb/config", "admin", {"k": "v"}, None, None,
         (400, 404), {"INVALID_ARGUMENT", "TOPIC_NOT_FOUND", "NOT_FOUND"}),
        ("dotted topic path get", "GET", "/v1/topics/a.b", "client", None, None, None,
         (400, 404), {"INVALID_ARGUMENT", "TOPIC_NOT_FOUND"}),
        ("dotted broker register", "PUT", "/v1/brokers/b.1", "broker", {"address": SIM_ADDRESS}, None, None, *INVALID),
        ("long broker register", "PUT", f"/v1/brokers/{'b' * 200}", "broker", {"address": SIM_ADDRESS}, None, None,
         *INVALID),
        ("slashed broker register", "PUT", "/v1/brokers/a%2Fb", "broker", {"address": SIM_ADDRESS}, None, None,
         (400, 404), {"INVALID_ARGUMENT", "NOT_FOUND"}),
        ("empty config key", "PUT", f"{T}/config", "admin", {"": "v"}, None, None, *INVALID),
        ("long config key", "PUT", f"{T}/config", "admin", {"k" * 200: "v"}, None, None, *INVALID),
        ("long config value", "PUT", f"{T}/config", "admin", {"k": "v" * 2000}, None, None, *INVALID),
        ("too many config keys", "PUT", f"{T}/config", "admin", {f"k{i}": "v" for i in range(65)}, None, None,
         *INVALID),
        # oversized bodies
        ("2 MiB create", "POST", "/v1/topics", "admin", None,
         json.dumps({**new, "config": {"k": "x" * BIG}}).encode(), raw, 413, "TOO_LARGE"),
        ("2 MiB config", "PUT", f"{T}/config", "admin", None, json.dumps({"k": "x" * BIG}).encode(), raw,
         413, "TOO_LARGE"),
        ("2 MiB register", "PUT", "/v1/brokers/bz", "broker", None,
         json.dumps({"address": "x" * BIG}).encode(), raw, 413, "TOO_LARGE"),
        # auth
        ("no token create", "POST", "/v1/topics", None, new, None, None, 401, "UNAUTHENTICATED"),
        ("no token config", "PUT", f"{T}/config", None, {"k": "v"}, None, None, 401, "UNAUTHENTICATED"),
        ("no token read", "GET", T, None, None, None, None, 401, "UNAUTHENTICATED"),
        ("no token routes", "GET", "/v1/routes/t", None, None, None, None, 401, "UNAUTHENTICATED"),
        ("no token watch", "GET", "/v1/watch?topics=t", None, None, None, None, 401, "UNAUTHENTICATED"),
        ("no token cluster", "GET", "/v1/cluster", None, None, None, None, 401, "UNAUTHENTICATED"),
        ("no token heartbeat", "POST", hb, None, {"epoch": b1_epoch, "queues": {}}, None, None, 401,
         "UNAUTHENTICATED"),
        ("no token register", "PUT", "/v1/brokers/bz", None, {"address": SIM_ADDRESS}, None, None, 401,
         "UNAUTHENTICATED"),
        ("wrong token", "POST", "/v1/topics", None, new, None, {"Authorization": "Bearer not-a-token"}, 401,
         "UNAUTHENTICATED"),
        ("basic auth", "PUT", f"{T}/config", None, {"k": "v"}, None, {"Authorization": "Basic YWRtaW46YWRtaW4="}, 401,
         "UNAUTHENTICATED"),
        ("client create", "POST", "/v1/topics", "client", new, None, None, 403, "PERMISSION_DENIED"),
        ("client config", "PUT", f"{T}/config", "client", {"k": "v"}, None, None, 403, "PERMISSION_DENIED"),
        ("client grow", "PATCH", T, "client", {"queues": 8}, None, None, 403, "PERMISSION_DENIED"),
        ("client remap", "POST", f"{T}/remap", "client", {"brokers": ["b2"]}, None, None, 403, "PERMISSION_DENIED"),
        ("client delete", "DELETE", T, "client", None, None, None, 403, "PERMISSION_DENIED"),
        ("client register", "PUT", "/v1/brokers/bz", "client", {"address": SIM_ADDRESS}, None, None, 403,
         "PERMISSION_DENIED"),
        ("client heartbeat", "POST", hb, "client", {"epoch": b1_epoch, "queues": {}}, None, None, 403,
         "PERMISSION_DENIED"),
        ("client seal", "POST", "/v1/brokers/b1/seal", "client", seal, None, None, 403, "PERMISSION_DENIED"),
        ("broker create", "POST", "/v1/topics", "broker", new, None, None, 403, "PERMISSION_DENIED"),
        ("broker config", "PUT", f"{T}/config", "broker", {"k": "v"}, None, None, 403, "PERMISSION_DENIED"),
        ("broker delete", "DELETE", T, "broker", None, None, None, 403, "PERMISSION_DENIED"),
        # conflicts
        ("duplicate topic", "POST", "/v1/topics", "admin", {"topic": "t", "queues": 4, "brokers": ["b1", "b2"]},
         None, None, 409, "TOPIC_EXISTS"),
        ("config version mismatch", "PUT", f"{T}/config?expected_version={tv + 1000}", "admin", {"k": "v"}, None,
         None, 409, "VERSION_MISMATCH"),
        ("config old version", "PUT", f"{T}/config?expected_version={tv - 1}", "admin", {"k": "v"}, None, None,
         409, "VERSION_MISMATCH"),
        ("grow version mismatch", "PATCH", f"{T}?expected_version={tv + 1}", "admin", {"queues": 8}, None, None,
         409, "VERSION_MISMATCH"),
        ("remap version mismatch", "POST", f"{T}/remap?expected_version={tv + 1}", "admin", {"brokers": ["b2"]},
         None, None, 409, "VERSION_MISMATCH"),
        ("delete version mismatch", "DELETE", f"{T}?expected_version={tv + 1}", "admin", None, None, None,
         409, "VERSION_MISMATCH"),
        ("create version mismatch", "POST", "/v1/topics?expected_version=5", "admin", new, None, None,
         409, "VERSION_MISMATCH"),
        ("shrink", "PATCH", T, "admin", {"queues": 2}, None, None, *INVALID),
        ("remap unknown broker", "POST", f"{T}/remap", "admin", {"brokers": ["nope"]}, None, None,
         404, "BROKER_NOT_FOUND"),
        ("create on unknown broker", "POST", "/v1/topics", "admin", {**new, "brokers": ["nope"]}, None, None,
         404, "BROKER_NOT_FOUND"),
        ("heartbeat unknown broker", "POST", "/v1/brokers/ghost/heartbeat", "broker", {"epoch": 1, "queues": {}},
         None, None, 404, "BROKER_NOT_FOUND"),
        ("heartbeat stale epoch", "POST", hb, "broker", {"epoch": b1_epoch + 5, "queues": {}}, None, None,
         409, "STALE_EPOCH"),
        ("seal not sealing", "POST", "/v1/brokers/b1/seal", "broker", seal, None, None, 409, "NOT_SEALING"),
        ("seal unknown broker", "POST", "/v1/brokers/ghost/seal", "broker", {**seal, "epoch": 1}, None, None,
         404, "BROKER_NOT_FOUND"),
        # unknown topic
        ("get unknown topic", "GET", "/v1/topics/nope", "client", None, None, None, 404, "TOPIC_NOT_FOUND"),
        ("config unknown topic", "PUT", "/v1/topics/nope/config", "admin", {"k": "v"}, None, None,
         404, "TOPIC_NOT_FOUND"),
        ("grow unknown topic", "PATCH", "/v1/topics/nope", "admin", {"queues": 8}, None, None, 404, "TOPIC_NOT_FOUND"),
        ("remap unknown topic", "POST", "/v1/topics/nope/remap", "admin", {"brokers": ["b2"]}, None, None,
         404, "TOPIC_NOT_FOUND"),
        ("delete unknown topic", "DELETE", "/v1/topics/nope", "admin", None, None, None, 404, "TOPIC_NOT_FOUND"),
        ("route unknown topic", "GET", "/v1/routes/nope?wait=1", "client", None, None, None, 404, "TOPIC_NOT_FOUND"),
        ("seal unknown topic", "POST", "/v1/brokers/b1/seal", "broker", {**seal, "topic": "nope"}, None, None,
         404, "TOPIC_NOT_FOUND"),
        # idempotency keys
        ("idempotency key reused", "PUT", f"{T}/config", "admin", {"a": "2"}, None, {"Idempotency-Key": "idem-1"},
         409, "IDEMPOTENCY_KEY_REUSED"),
        ("idempotency key reused elsewhere", "PATCH", T, "admin", {"queues": 5}, None, {"Idempotency-Key": "idem-1"},
         409, "IDEMPOTENCY_KEY_REUSED"),
        ("idempotency key too long", "PUT", f"{T}/config", "admin", {"a": "3"}, None, {"Idempotency-Key": "k" * 300},
         *INVALID),
        # routing
        ("unknown path", "GET", "/v1/nope", "admin", None, None, None, 404, "NOT_FOUND"),
        ("wrong method", "DELETE", "/v1/cluster", "admin", None, None, None, 405, "METHOD_NOT_ALLOWED"),
    ]
    return cases


async def _state(c, url: str) -> dict[str, Any]:
    s, cl, h = await c.call("GET", f"{url}/v1/cluster", "client")
    assert s == 200
    s, t, _ = await c.call("GET", f"{url}/v1/topics/t", "client")
    assert s == 200
    s, ts, _ = await c.call("GET", f"{url}/v1/topics", "client")
    s, bs, _ = await c.call("GET", f"{url}/v1/brokers", "client")
    return {"applied_version": cl["applied_version"], "header": _meta_version(h), "topic": t, "topics": ts,
            "brokers": [{k: b[k] for k in ("broker", "address", "epoch", "state")} for b in bs["brokers"]]}


async def test_every_nodes_broker_list_says_when_the_leader_last_heard_each_broker(meta_cluster, sim):
    # Heartbeats go to the leader and are not in the log: a follower asks the leader. It used to answer the
    # registration time, and a healthy broker showed in the console as heard from minutes ago.
    c = meta_cluster
    await sim.register("b1", heartbeat=False)
    await asyncio.sleep(0.3)   # the registration's time and the heartbeat's differ
    before = int(time.time() * 1000)
    assert await sim.heartbeat("b1") is not None
    after = int(time.time() * 1000)
    for url in c.meta_urls:
        (b1,) = (await ok(c, "GET", "/v1/brokers", role="client", url=url))["brokers"]
        assert before <= b1["last_heartbeat_ms"] <= after, (name_of(c, url), b1, before, after)


async def test_bad_input_gets_the_right_4xx_and_changes_nothing(meta_cluster, sim):
    c = meta_cluster
    await sim.register("b1")
    await sim.register("b2")
    await create_topic(c, "t", 4, ["b1", "b2"])
    s0, first, h0 = await call_any(c, "PUT", "/v1/topics/t/config", json={"a": "1"},
                                   headers={"Idempotency-Key": "idem-1"})
    assert s0 == 200, (s0, first)
    tv = first["version"]
    for u in c.meta_urls:
        await ok(c, "GET", f"/v1/topics/t?min_version={tv}", role="client", url=u)
    before = {u: await _state(c, u) for u in c.meta_urls}
    assert all(st["applied_version"] == tv and st["topic"]["version"] == tv for st in before.values()), before

    failures: list[str] = []
    cases = _bad_input_cases(tv, sim.epochs["b1"])
    t0 = time.monotonic()
    for label, method, path, role, body, data, headers, want_status, want_code in cases:
        statuses = want_status if isinstance(want_status, tuple) else (want_status,)
        codes = want_code if isinstance(want_code, set) else {want_code}
        for u in c.meta_urls:
            where = f"[{label}] {method} {name_of(c, u)}{path[:80]}"
            try:
                s, b, h = await c.call(method, u + path, role, json=body, data=data, headers=headers, timeout_s=15)
            except NET_ERRORS as e:
                failures.append(f"{where}: no answer: {e!r}")
                continue
            problems = []
            if s not in statuses:
                problems.append(f"status {s}, expected {want_status}")
            try:
                assert_error_shape(b, where)
                if b["error"]["code"] not in codes:
                    problems.append(f"code {b['error']['code']}, expected {want_code}")
            except AssertionError as e:
                problems.append(str(e))
            if "X-Meta-Version" not in h:
                problems.append("no X-Meta-Version header")
            if not problems and b["error"]["code"] == "VERSION_MISMATCH":
                cv = b["error"]["details"].get("current_version")
                want_cv = 0 if path.startswith("/v1/topics?") else tv
                if cv != want_cv:
                    problems.append(f"details.current_version {cv!r}, expected {want_cv}")
            if problems:
                failures.append(f"{where}: {'; '.join(problems)}; body {str(b)[:300]}")

    # A retried request with the same Idempotency-Key gets the first answer on every node and appends nothing.
    for u in c.meta_urls:
        s, b, _ = await c.call("PUT", f"{u}/v1/topics/t/config", json={"a": "1"}, headers={"Idempotency-Key": "idem-1"})
        if (s, b) != (s0, first):
            failures.append(f"[idempotent retry] {name_of(c, u)}: got {s} {b}, first answer was {s0} {first}")
    print(f"\n[bad input] {len(cases)} cases x {len(c.meta_urls)} nodes in {time.monotonic() - t0:.1f} s")

    await asyncio.sleep(0.5)  # let anything that was (wrongly) appended reach every node
    after = {u: await _state(c, u) for u in c.meta_urls}
    for u in c.meta_urls:
        b, a = before[u], after[u]
        for k in ("applied_version", "topic", "topics", "brokers"):
            if a[k] != b[k]:
                failures.append(f"[state] {name_of(c, u)}: {k} changed: {str(b[k])[:300]} -> {str(a[k])[:300]}")
    for m in ("m1", "m2", "m3"):
        tail = log_tail(c, m, 5, grep="handler_failed")
        if tail:
            failures.append(f"[log] {m} logged handler failures (500s):\n{tail}")
    assert not failures, f"{len(failures)} problems:\n" + "\n".join(failures)


# ---------------------------------------------------------------------------------------------------------------
# 6. route subscriptions: long poll and SSE
# ---------------------------------------------------------------------------------------------------------------
async def test_route_long_poll_and_sse_follow_changes_made_elsewhere(meta_cluster, sim):
    c = meta_cluster
    await sim.register("b1")
    await sim.register("b2")
    v0 = (await create_topic(c, "rt", 2, ["b1", "b2"]))["version"]
    leader, lurl, followers = await node_urls(c)
    f, other = followers[0], followers[1]
    for u in c.meta_urls:
        await ok(c, "GET", f"/v1/topics/rt?min_version={v0}", role="client", url=u)

    # Long poll on a follower, change made on another follower (forwarded to the leader).
    poll = asyncio.create_task(c.call("GET", f"{f}/v1/routes/rt?after={v0}&wait=10", "client", timeout_s=20))
    await asyncio.sleep(0.5)
    assert not poll.done(), f"the long poll returned without a change: {poll.result() if poll.done() else ''}"
    b = await ok(c, "PUT", "/v1/topics/rt/config", json={"k1": "a"}, url=other)
    v1 = b["version"]
    t_write = time.monotonic()
    s, route, h = await asyncio.wait_for(poll, 15)
    latency = time.monotonic() - t_write
    print(f"\n[long poll] follower {name_of(c, f)} answered {latency * 1000:.0f} ms after the write acknowledged on "
          f"{name_of(c, other)}")
    assert s == 200, (s, route)
    assert route["version"] == v1 and route["config"].get("k1") == "a", route
    assert latency < 3.0, f"the long poll took {latency:.2f} s after the change (wait was 10 s)"
    assert _meta_version(h) >= v1

    # The long poll also wakes for a change written on the leader; and after a change it answers at once.
    poll = asyncio.create_task(c.call("GET", f"{other}/v1/routes/rt?after={v1}&wait=10", "client", timeout_s=20))
    await asyncio.sleep(0.3)
    v1b = (await ok(c, "PUT", "/v1/topics/rt/config", json={"k1": "b"}, url=lurl))["version"]
    s, route, _ = await asyncio.wait_for(poll, 15)
    assert s == 200 and route["version"] == v1b, (s, route)
    s, route, _ = await c.call("GET", f"{f}/v1/routes/rt?after={v0}&wait=10&min_version={v1b}", "client")
    assert s == 200 and route["version"] == v1b, (s, route)

    # 304 after `wait` without a change.
    t0 = time.monotonic()
    s, body, h = await c.call("GET", f"{f}/v1/routes/rt?after={v1b}&wait=2", "client", timeout_s=15)
    took = time.monotonic() - t0
    assert s == 304, (s, body)
    assert 1.8 <= took < 6.0, f"304 after {took:.2f} s for wait=2"
    assert "X-Meta-Version" in h, h

    # SSE on a follower: one `route` event per change, id = the version, versions never go backwards.
    hdr = c.headers("client")
    events: list[dict] = []
    async with c.session.get(f"{f}/v1/watch?topics=rt", headers=hdr,
                             timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
        assert resp.status == 200, resp.status
        assert resp.headers.get("Content-Type", "").startswith("text/event-stream"), resp.headers
        sse = SseReader(resp)
        ev = await sse.next_event(5.0)
        assert ev is not None and ev.get("event") == "route", ev
        assert int(ev["id"]) == v1b and ev["json"]["version"] == v1b, ev
        events.append(ev)
        written = []
        for i, u in enumerate([other, lurl, f]):
            w = await ok(c, "PUT", "/v1/topics/rt/config", json={f"sse{i}": "x"}, url=u)
            written.append(w["version"])
            t_w = time.monotonic()
            while True:
                ev = await sse.next_event(max(0.1, 5.0 - (time.monotonic() - t_w)))
                assert ev is not None, f"no SSE event for version {w['version']} within 5 s; got {events[-1]}"
                events.append(ev)
                if int(ev["id"]) >= w["version"]:
                    break
        ids = [int(e["id"]) for e in events]
        assert all(e.get("event") == "route" for e in events), events
        assert all(int(e["id"]) == e["json"]["version"] for e in events), events
        assert ids == sorted(set(ids)), f"SSE versions went backwards or repeated: {ids}"
        assert set(written) <= set(ids), f"SSE missed a version: written {written}, received {ids}"
        assert events[-1]["json"]["config"].get("sse2") == "x", events[-1]

    # A stream resumed with after=V starts after V.
    async with c.session.get(f"{other}/v1/watch?topics=rt&after={written[0]}", headers=hdr,
                             timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
        assert resp.status == 200
        ev = await SseReader(resp).next_event(5.0)
        assert ev is not None and int(ev["id"]) > written[0], ev


# ---------------------------------------------------------------------------------------------------------------
# 7. remap: seal-then-switch with continuous offsets; fallback when the old broker is fenced
# ---------------------------------------------------------------------------------------------------------------
async def _route(c, topic: str, v: int = 0, url: str | None = None) -> dict:
    return await ok(c, "GET", f"/v1/routes/{topic}?min_version={v}", role="client", url=url)


async def test_remap_seals_then_switches_with_continuous_offsets(meta_cluster, sim):
    c = meta_cluster
    for b in ("b1", "b2", "b3"):
        await sim.register(b)
    await create_topic(c, "rm", 4, ["b1", "b2"])
    r0 = await _route(c, "rm")
    heads = {q["queue"]: q["broker"] for q in r0["queues"]}
    assert set(heads.values()) == {"b1", "b2"} and all(q["writable"] for q in r0["queues"]), r0

    leader, lurl, followers = await node_urls(c)
    rb = await ok(c, "POST", "/v1/topics/rm/remap", json={"brokers": ["b3"]}, url=followers[0])
    moved = sorted(rb["moved"], key=lambda m: m["queue"])
    assert moved == [{"queue": q, "from": heads[q], "to": "b3", "gen": 1} for q in range(4)], rb
    v = rb["version"]
    for u in c.meta_urls:
        r = await _route(c, "rm", v, url=u)
        for q in r["queues"]:
            assert q["broker"] == "b3" and q["gen"] == 1 and q["writable"] is False, (name_of(c, u), q)
            old, new = q["segments"][-2], q["segments"][-1]
            assert old["state"] == "sealing" and old["logic_end"] is None, q
            assert new["logic_start"] is None and new["broker"] == "b3", q

    ends = {0: 120, 1: 0, 2: 77_777, 3: 5}
    for q in range(4):
        s, b = await sim.seal(heads[q], "rm", q, 0, ends[q], url=c.meta_urls[q % 3])
        assert s == 200, (q, s, b)
        r = await _route(c, "rm", b["version"], url=c.meta_urls[(q + 1) % 3])
        for qq in r["queues"]:
            assert qq["writable"] is (qq["queue"] <= q), (q, qq)
        qv = r["queues"][q]
        old, new = qv["segments"]
        assert old["state"] == "sealed" and old["logic_end"] == ends[q], qv
        assert new["logic_start"] == ends[q] == old["logic_end"], f"logic offsets not continuous: {qv}"
        assert new["state"] == "active" and new["physical_start"] == 0, qv
        d = await ok(c, "GET", f"/v1/topics/rm?min_version={b['version']}", role="client")
        dq = d["logic_queues"][q]["segments"]
        assert dq[0]["logic_end"] == ends[q] and dq[1]["logic_start"] == ends[q], dq

    # A repeated seal report with the same end is accepted and changes nothing; another end is refused.
    vs = (await cluster_status(c, lurl))["applied_version"]
    s, b = await sim.seal(heads[0], "rm", 0, 0, ends[0])
    assert s == 200, (s, b)
    s, b = await sim.seal(heads[0], "rm", 0, 0, ends[0] + 1)
    assert s == 409 and b["error"]["code"] == "ALREADY_SEALED", (s, b)
    assert (await cluster_status(c, lurl))["applied_version"] == vs

    # Fallback: b1's session expires; a remap of its queues completes without any seal report.
    await create_topic(c, "fb", 2, ["b1"], replicas=1)   # one copy: with more, b1's queues fail over instead
    d0 = await ok(c, "GET", "/v1/topics/fb", role="client")
    seg0 = {q["queue"]: q["segments"][-1] for q in d0["logic_queues"]}
    assert all(s_["broker"] == "b1" for s_ in seg0.values()), seg0
    await sim.stop("b1")
    t_stop = sim.last_ok["b1"]
    # queue 0 is remapped while b1 is still active: it waits in `sealing` until b1 is fenced
    rb = await ok(c, "POST", "/v1/topics/fb/remap", json={"brokers": ["b2"], "queues": [0]})
    assert rb["moved"] == [{"queue": 0, "from": "b1", "to": "b2", "gen": 1}], rb
    r = await _route(c, "fb", rb["version"])
    assert r["queues"][0]["writable"] is False and r["queues"][0]["segments"][-1]["logic_start"] is None, r

    async def fenced():
        d = await ok(c, "GET", "/v1/brokers", role="client")
        st = {b["broker"]: b["state"] for b in d["brokers"]}
        return d if st.get("b1") == "fenced" else None
    await wait_until(fenced, 20.0, "b1 to be fenced after its heartbeats stopped", 0.2)
    fenced_after = time.monotonic() - t_stop
    print(f"\n[fence] b1 seen fenced {fenced_after:.2f} s after its last acknowledged heartbeat (session 3 s)")
    assert fenced_after >= 2.9, f"b1 was fenced only {fenced_after:.2f} s after its last heartbeat"
    d = await ok(c, "GET", "/v1/brokers", role="client")
    assert {b["broker"]: b["state"] for b in d["brokers"]} == {"b1": "fenced", "b2": "active", "b3": "active"}, d

    fallback0 = seg0[0]["logic_start"] + seg0[0]["budget_end"] - seg0[0]["physical_start"]
    v_now = (await cluster_status(c, lurl))["applied_version"]
    for u in c.meta_urls:
        r = await _route(c, "fb", v_now, url=u)
        q0 = r["queues"][0]
        old, new = q0["segments"]
        assert old["state"] == "sealed" and old["logic_end"] == fallback0, (name_of(c, u), q0)
        assert new["logic_start"] == fallback0 and q0["writable"] is True and q0["broker"] == "b2", (name_of(c, u), q0)
        assert r["queues"][1]["writable"] is False, r["queues"][1]  # still on fenced b1

    # queue 1 is remapped after b1 was fenced: it completes at once
    rb = await ok(c, "POST", "/v1/topics/fb/remap", json={"brokers": ["b2"], "queues": [1]})
    assert rb["moved"] == [{"queue": 1, "from": "b1", "to": "b2", "gen": 1}], rb
    fallback1 = seg0[1]["logic_start"] + seg0[1]["budget_end"] - seg0[1]["physical_start"]
    for u in c.meta_urls:
        r = await _route(c, "fb", rb["version"], url=u)
        q1 = r["queues"][1]
        old, new = q1["segments"]
        assert old["state"] == "sealed" and old["logic_end"] == fallback1, (name_of(c, u), q1)
        assert new["logic_start"] == fallback1 and q1["writable"] is True, (name_of(c, u), q1)
    # and the fenced broker's late seal report cannot move the decided start
    s, b = await sim.seal("b1", "fb", 1, 0, 10)
    assert s == 409, (s, b)
    assert_error_shape(b, "late seal")
    r = await _route(c, "fb")
    assert r["queues"][1]["segments"][1]["logic_start"] == fallback1, r


# ---------------------------------------------------------------------------------------------------------------
# 8. headers and public endpoints
# ---------------------------------------------------------------------------------------------------------------
async def test_every_response_has_meta_version_and_service_endpoints_are_public(meta_cluster, sim):
    c = meta_cluster
    await sim.register("b1")
    v = (await create_topic(c, "hv", 1, ["b1"]))["version"]
    for u in c.meta_urls:
        who = name_of(c, u)
        s, body, h = await c.call("GET", f"{u}/healthz", None)
        assert s == 200 and _meta_version(h) >= 0, (who, s, body)
        s, body, h = await c.call("GET", f"{u}/readyz", None)
        assert s == 200 and _meta_version(h) >= 0, (who, s, body)
        s, body, h = await c.call("GET", f"{u}/v1/openapi.json", None)
        assert s == 200 and isinstance(body, dict) and "paths" in body and "openapi" in body, (who, s, str(body)[:200])
        assert "/v1/topics" in body["paths"] and _meta_version(h) >= 0
        s, text, h = await c.call("GET", f"{u}/metrics?min_version={v}", None)
        assert s == 200 and isinstance(text, str), (who, s)
        assert h.get("Content-Type", "").startswith("text/plain"), h
        lines = [ln for ln in text.splitlines() if ln.startswith("stator_meta_applied_version")]
        assert lines, f"{who}: no stator_meta_applied_version in /metrics"
        assert _meta_version(h) >= 0
        # wait for the node to apply v, then the gauge shows at least v
        await ok(c, "GET", f"/v1/topics/hv?min_version={v}", role="client", url=u)
        s, text, h = await c.call("GET", f"{u}/metrics", None)
        val = float([ln for ln in text.splitlines() if ln.startswith("stator_meta_applied_version")][0].split()[-1])
        assert val >= v and _meta_version(h) >= v, (who, val, v)

    # Every other kind of answer carries the header too: success, created, errors of every class, 304, SSE.
    leader, lurl, followers = await node_urls(c)
    probes = [
        ("GET", "/v1/cluster", "client", None, 200),
        ("GET", "/v1/topics", "client", None, 200),
        ("GET", "/v1/topics/hv", "client", None, 200),
        ("GET", "/v1/routes/hv", "client", None, 200),
        ("GET", "/v1/history?limit=5", "client", None, 200),
        ("GET", "/v1/brokers", "broker", None, 200),
        ("PUT", "/v1/topics/hv/config", "admin", {"x": "1"}, 200),
        ("GET", "/v1/topics", None, None, 401),
        ("POST", "/v1/topics", "client", {"topic": "z", "queues": 1}, 403),
        ("GET", "/v1/topics/none", "client", None, 404),
        ("POST", "/v1/topics", "admin", {"topic": "hv", "queues": 1}, 409),
        ("POST", "/v1/topics", "admin", {"topic": "a.b", "queues": 1}, 400),
        ("DELETE", "/v1/cluster", "admin", None, 405),
        ("GET", "/v1/nowhere", "admin", None, 404),
    ]
    for i, u in enumerate([lurl] + followers):
        who = name_of(c, u)
        for method, path, role, body, want in probes:
            s, b, h = await c.call(method, u + path, role, json=body)
            assert s == want, (who, method, path, s, b)
            assert _meta_version(h) >= v, (who, method, path, h)
        s, b, h = await c.call("POST", u + "/v1/topics", "admin", json={"topic": f"created{i}", "queues": 1,
                                                                          "brokers": ["b1"]})
        assert s == 201 and _meta_version(h) >= b["version"], (who, s, b, h)
        s, b, h = await c.call("PUT", u + "/v1/topics/hv/config", "admin", data=b"x" * (2 * 1024 * 1024),
                               headers={"Content-Type": "application/json"})
        assert s == 413 and "X-Meta-Version" in h, (who, s, h)
        rv = (await _route(c, "hv", url=u))["version"]
        s, b, h = await c.call("GET", f"{u}/v1/routes/hv?after={rv}&wait=0.2", "client")
        assert s == 304 and "X-Meta-Version" in h, (who, s, h)
        async with c.session.get(f"{u}/v1/watch?topics=hv", headers=c.headers("client")) as resp:
            assert resp.status == 200 and "X-Meta-Version" in resp.headers, (who, resp.headers)


async def test_replicas_hold_byte_identical_images(meta_cluster):
    """DESIGN.md invariant 1 across real processes: after the same log, every node's image bytes are the same."""
    c = meta_cluster
    m = c.meta_urls
    s, b, _ = await c.call("PUT", m[0] + "/v1/brokers/bd", "broker", json={"address": "http://127.0.0.1:1"})
    assert s == 200, b
    s, b, _ = await c.call("POST", m[1] + "/v1/topics", json={"topic": "det", "queues": 8})
    assert s == 201, b
    s, b, _ = await c.call("PUT", m[2] + "/v1/topics/det/config", json={"a": "1", "b": "2"},
                           headers={"Idempotency-Key": "det-1"})
    assert s == 200, b
    s, b, _ = await c.call("POST", m[0] + "/v1/topics/det/remap", json={"brokers": ["bd"], "queues": [0]})
    assert s == 200, b
    version = b["version"]
    # Compare the nodes once they have applied the same number of commands (a command without events, like this
    # no-op remap, changes the image but not the version; bd's short session may also expire and fence it).
    for _ in range(100):
        digests = []
        for url in m:
            s, b, _ = await c.call("GET", url + f"/v1/admin/image-digest?min_version={version}")
            assert s == 200, b
            digests.append(b)
        if len({d["commands"] for d in digests}) == 1:
            break
        await asyncio.sleep(0.05)
    assert len({d["commands"] for d in digests}) == 1, digests
    assert len({d["sha256"] for d in digests}) == 1, digests
