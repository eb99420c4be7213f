"""Each broker has its own credential, bound to its id (issue 20, item 7b): meta and brokers refuse a broker acting
under another's id, on real processes (three meta nodes, two brokers), and configs name broker tokens by hash only.

b1's own token cannot register, heartbeat or seal as b2 at any meta node (403, the log unchanged); b2's token cannot
hand deliveries to b1 (``pop-adopt``) for a queue b2 never headed, nor freeze b1's pop state of a queue b2 does not
head (403, nothing adopted); the rightful calls (a broker for itself, an admin for any) still answer.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from broker import config as broker_config
from runtime.credentials import broker_of, token_hash
from meta import config as meta_config
from runtime.config_file import ConfigError
from tests.support import cluster as cluster_mod
from tests.support.meta_http import ok
from tests.support.broker_http import all_writable, send, wait_route
from tests.support.config_files import broker_raw, meta_raw

live = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory):
    async with cluster_mod.running(str(tmp_path_factory.mktemp("creds")), 3, 2,
                                   meta={"session_timeout_ms": 600_000}) as c:
        yield c


async def as_broker(c, who: str, method: str, url: str, json=None) -> tuple[int, dict]:
    s, b, _ = await c.call(method, url, role=None, json=json,
                           headers={"Authorization": f"Bearer {c.broker_token(who)}"})
    return s, b


def denied(s: int, b: dict, caller: str, what: str) -> None:
    """403 PERMISSION_DENIED whose message names the caller and what it may not do (at meta: the other broker)."""
    assert s == 403 and b["error"]["code"] == "PERMISSION_DENIED", (s, b)
    assert f"broker {caller!r} may not" in b["error"]["message"] and what in b["error"]["message"], b


async def brokers(c) -> dict[str, dict]:
    got = await ok(c, "GET", "/v1/brokers")
    return {b["broker"]: b for b in got["brokers"]}


@live
async def test_a_broker_cannot_register_heartbeat_or_seal_as_another_at_any_meta_node(cluster):
    c = cluster
    await ok(c, "POST", "/v1/topics", json={"topic": "cred", "queues": 1, "brokers": ["b2"]}, expect=(201,))
    await wait_route(c, "cred", all_writable)
    await send(c, "cred", 0, ["m0", "m1"])
    before = await brokers(c)
    topic_before = await ok(c, "GET", "/v1/topics/cred")
    epoch = before["b2"]["epoch"]
    seal = {"epoch": epoch, "topic": "cred", "queue": 0, "gen": 0, "end_offset": 2}
    for url in c.meta_urls:   # followers refuse it too, before forwarding anything to the leader
        denied(*await as_broker(c, "b1", "PUT", f"{url}/v1/brokers/b2", {"address": "http://127.0.0.1:1"}),
               "b1", "as broker 'b2'")
        denied(*await as_broker(c, "b1", "POST", f"{url}/v1/brokers/b2/heartbeat", {"epoch": epoch, "queues": {}}),
               "b1", "as broker 'b2'")
        denied(*await as_broker(c, "b1", "POST", f"{url}/v1/brokers/b2/seal", seal), "b1", "as broker 'b2'")
        denied(*await as_broker(c, "b1", "POST", f"{url}/v1/brokers/b2/seals",
                                {"epoch": epoch, "seals": [{k: v for k, v in seal.items() if k != "epoch"}]}),
               "b1", "as broker 'b2'")
    after = await brokers(c)
    assert {k: after["b2"][k] for k in ("epoch", "address", "state")} == \
        {k: before["b2"][k] for k in ("epoch", "address", "state")}
    topic_after = await ok(c, "GET", "/v1/topics/cred")
    assert topic_after["logic_queues"] == topic_before["logic_queues"]   # nothing sealed
    # The rightful calls: a broker for itself, an admin for any broker (operators).
    b1_epoch = after["b1"]["epoch"]
    s, b = await as_broker(c, "b1", "POST", f"{c.meta_urls[0]}/v1/brokers/b1/heartbeat",
                           {"epoch": b1_epoch, "queues": {}})
    assert s == 200, b
    await ok(c, "POST", "/v1/brokers/b2/heartbeat", json={"epoch": epoch, "queues": {}})


@live
async def test_a_broker_cannot_push_or_take_pop_state_of_a_queue_it_never_headed(cluster):
    c = cluster
    await ok(c, "POST", "/v1/topics", json={"topic": "credpop", "queues": 1, "brokers": ["b1"]}, expect=(201,))
    await wait_route(c, "credpop", all_writable)
    await send(c, "credpop", 0, [f"m{i}" for i in range(3)])
    b1 = c.url("b1")
    s, b, _ = await c.call("POST", f"{b1}/v1/pop/credpop", "client",
                           json={"group": "g", "max": 3, "invisible_ms": 600_000})
    assert s == 200 and [m["offset"] for m in b["messages"]] == [0, 1, 2], b
    handles = {m["offset"]: m["handle"] for m in b["messages"]}
    s, b, _ = await c.call("POST", f"{b1}/v1/ack", "client", json={"group": "g", "handles": [handles[1], handles[2]]})
    assert s == 200 and [r["ok"] for r in b["results"]] == [True, True], b
    stats = lambda: c.call("GET", f"{b1}/v1/pop-stats/g", "client")   # noqa: E731
    s, before, _ = await stats()
    assert s == 200 and before["queues"][0]["in_flight"] == 1, before
    # b2 never held the queue's head: it has no deliveries of it to hand over, least of all acked ones.
    s, b = await as_broker(c, "b2", "POST", f"{b1}/v1/pop-adopt/g/credpop/0", {"deliveries": [[1, 1], [2, 1]]})
    denied(s, b, "b2", "hand over deliveries")
    # Nor is b2 the head that could ask b1 to freeze its pop state.
    s, b = await as_broker(c, "b2", "POST", f"{b1}/v1/pop-handover/g/credpop/0?route_version=0")
    denied(s, b, "b2", "take over the pop state")
    s, after, _ = await stats()
    assert after["queues"] == before["queues"], (before, after)   # nothing adopted, nothing frozen
    s, b, _ = await c.call("POST", f"{b1}/v1/pop/credpop", "client", json={"group": "g", "max": 5})
    assert s == 200 and b["messages"] == [], b   # the acked offsets stay acked
    # A client or an unknown token is no broker at all.
    s, b, _ = await c.call("POST", f"{b1}/v1/pop-adopt/g/credpop/0", "client", json={"deliveries": []})
    assert (s, b["error"]["code"]) == (403, "PERMISSION_DENIED"), b
    s, b, _ = await c.call("POST", f"{b1}/v1/pop-adopt/g/credpop/0", None, json={"deliveries": []},
                           headers={"Authorization": "Bearer " + "x" * 32})
    assert (s, b["error"]["code"]) == (401, "UNAUTHENTICATED"), b


def test_a_meta_config_with_the_shared_broker_token_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"tokens.*tokens\.broker is no longer read.*broker_tokens"):
        meta_config.parse(meta_raw(tokens={"admin": "a" * 16, "client": "c" * 16, "broker": "b" * 16}))


def test_configs_name_broker_tokens_by_hash_only():
    good = {"b1": token_hash("1" * 16), "b2": token_hash("2" * 16)}
    assert meta_config.parse(meta_raw(broker_tokens=good)).broker_tokens == good
    with pytest.raises(ConfigError, match=r"broker_tokens\.b1: must be \"sha256:\""):
        meta_config.parse(meta_raw(broker_tokens={"b1": "1" * 16}))   # a token itself, not its hash
    with pytest.raises(ConfigError, match="each broker needs its own token"):
        meta_config.parse(meta_raw(broker_tokens={"b1": good["b1"], "b2": good["b1"]}))
    with pytest.raises(ConfigError, match="must differ from tokens.admin"):
        meta_config.parse(meta_raw(broker_tokens={"b1": token_hash("a" * 16)}))
    b = broker_config.parse(broker_raw(broker_tokens=good, tokens={"broker": "1" * 16, "client": "c" * 16}))
    assert b.broker_tokens == good and b.token == "1" * 16
    with pytest.raises(ConfigError, match="broker_tokens.b1: not the hash of this broker's own token"):
        broker_config.parse(broker_raw(broker_tokens=good, tokens={"broker": "9" * 16, "client": "c" * 16}))


def test_a_token_proves_the_one_broker_it_belongs_to():
    hashes = {"b1": token_hash("1" * 16), "b2": token_hash("2" * 16)}
    assert [broker_of(t, hashes) for t in ("1" * 16, "2" * 16, "3" * 16, "")] == ["b1", "b2", None, None]
