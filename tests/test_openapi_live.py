"""Every operation of both specs, called on a real cluster, answers what its /v1/openapi.json says it answers.

The specs are generated from meta/api/models.py and broker/api/models.py, the models the handlers validate request
bodies with; this test holds the answers to them too, so a field renamed or retyped in a handler fails here instead
of drifting from the spec.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema_rs
import pytest

from broker.api import models as broker_models
from broker.codec import encode_message
from wire.errors import ApiError
from wire.shapes import validate
from meta.api import models
from tests.support import cluster as cluster_mod

SEALING_TRIES = 300   # 30 s: generous for a broker on a loaded machine to report a seal


@pytest.fixture(scope="module")
def served_spec():
    from meta.api.openapi import SPEC
    return SPEC


class SpecChecker:
    """Validates one answer against the schema the spec gives its operation and status."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.checked: set[tuple[str, str, int]] = set()

    def check(self, method: str, template: str, status: int, body) -> None:
        responses = self.spec["paths"][template][method.lower()]["responses"]
        assert str(status) in responses, f"{method} {template} answered {status}, which the spec does not list"
        content = responses[str(status)].get("content", {}).get("application/json")
        assert content is not None, (method, template, status)
        schema = {**content["schema"], "components": self.spec["components"]}
        errors = [f"{e.instance_path}: {e.message}" for e in jsonschema_rs.validator_for(schema).iter_errors(body)]
        assert not errors, (method, template, status, errors[:5], json.dumps(body)[:800])
        self.checked.add((method.upper(), template, status))


async def test_live_answers_match_the_spec(tmp_path, served_spec):
    async with cluster_mod.running(str(tmp_path), 3, 2, meta={"session_timeout_ms": 600_000}) as c:
        m = c.meta_urls[0]
        s, spec, _ = await c.call("GET", m + "/v1/openapi.json", None)
        assert s == 200 and spec == json.loads(json.dumps(served_spec))   # the document served is the one built
        checker = SpecChecker(spec)

        async def call(method, template, role="admin", json_body=None, expect=None, **path):
            url = m + template.format(**path)
            for _ in range(SEALING_TRIES):
                status, body, _ = await c.call(method, url, role, json=json_body)
                checker.check(method, template.split("?")[0], status, body)
                if not (status == 503 and body["error"]["code"] == "SEALING"):
                    break
                await asyncio.sleep(0.1)   # a growth or remap seals a queue until its broker reports the end
            if expect is not None:
                assert status == expect, (method, url, status, body)
            return body

        brokers = await call("GET", "/v1/brokers", "client", expect=200)
        names = [b["broker"] for b in brokers["brokers"]]
        assert len(names) == 2
        await call("POST", "/v1/topics", json_body={"topic": "t", "queues": 2, "brokers": names[:1],
                                                    "config": {"retention": "7d"}}, expect=201)
        await call("POST", "/v1/topics", json_body={"topic": "t", "queues": 2}, expect=409)
        await call("POST", "/v1/topics", json_body={"topic": "u", "queues": "2"}, expect=400)
        await call("GET", "/v1/topics", "client", expect=200)
        await call("GET", "/v1/topics/{topic}", "client", expect=200, topic="t")
        await call("GET", "/v1/topics/{topic}", "client", expect=404, topic="nope")
        await call("PUT", "/v1/topics/{topic}/config", json_body={"a": "1", "retention": None}, expect=200, topic="t")
        await call("PATCH", "/v1/topics/{topic}", json_body={"queues": 3}, expect=200, topic="t")
        await call("POST", "/v1/topics/{topic}/remap", json_body={"brokers": names[1:], "queues": [0]}, expect=200,
                   topic="t")
        await call("GET", "/v1/topics/{topic}/queues/{queue}/segments", "client", expect=200, topic="t", queue=0)
        elected = await call("POST", "/v1/topics/{topic}/elect", json_body={"unclean": True}, expect=200, topic="t")
        assert {q["outcome"] for q in elected["queues"]} <= {"leader_active", "sealing"}, elected
        await call("POST", "/v1/topics/{topic}/elect", json_body={"unclean": "yes"}, expect=400, topic="t")
        await call("GET", "/v1/routes/{topic}", "client", expect=200, topic="t")
        route = await call("GET", "/v1/routes/{topic}", "client", expect=200, topic="t")
        heads: dict[str, int] = {}
        for q in route["queues"]:
            heads[q["segments"][-1]["broker"]] = heads.get(q["segments"][-1]["broker"], 0) + 1
        listed = await call("GET", "/v1/brokers?include=heads", "client", expect=200)
        assert {b["broker"]: b["heads"] for b in listed["brokers"]} == {n: heads.get(n, 0) for n in names}, listed
        await call("GET", "/v1/brokers?include=nope", "client", expect=400)
        described = await call("GET", "/v1/brokers/{broker}", "client", expect=200, broker=names[0])
        assert described["heads"] == heads.get(names[0], 0) and described["draining"] is False, described
        await call("GET", "/v1/brokers/{broker}", "client", expect=404, broker="nope")
        await call("POST", "/v1/brokers/{broker}/drain", json_body={"draining": "yes"}, expect=400, broker=names[0])
        await call("POST", "/v1/brokers/{broker}/drain", json_body={"draining": False}, expect=200, broker=names[0])
        await call("POST", "/v1/brokers/{broker}/copies-held", "broker", json_body={"epoch": 1, "copies": []},
                   expect=400, broker=names[0])
        await call("GET", "/v1/cluster", "client", expect=200)
        await call("GET", "/v1/history", "client", expect=200)
        await call("GET", "/v1/admin/image-digest", expect=200)
        await call("GET", "/v1/cluster/members", "client", expect=200)
        spare = {"node": "m9", "raft": "127.0.0.1:1", "url": "http://127.0.0.1:1"}   # added, never started
        await call("POST", "/v1/cluster/members", json_body=spare, expect=201)
        await call("POST", "/v1/cluster/members/{node}/promote", expect=409, node="m9")
        await call("DELETE", "/v1/cluster/members/{node}", expect=200, node="m9")

        heartbeat = {"member": "c1", "topics": ["t"], "mode": "exclusive"}
        await call("PUT", "/v1/groups/{group}/config", json_body={"lease_ms": 30_000, "mode": "exclusive"},
                   expect=200, group="g")
        answer = await call("POST", "/v1/groups/{group}/heartbeat", "client", json_body=heartbeat, expect=200,
                            group="g")
        for _ in range(50):   # the join enters the log; the next heartbeat answers the grants
            if answer["assignments"]:
                break
            answer = await call("POST", "/v1/groups/{group}/heartbeat", "client", json_body=heartbeat, expect=200,
                                group="g")
        assert answer["assignments"], answer
        await call("GET", "/v1/groups", "client", expect=200)
        listed = await call("GET", "/v1/groups?include=brokers", "client", expect=200)
        assert {g["source"] for g in listed["groups"]} <= {"meta", "brokers"} and listed["groups"], listed
        detail = await call("GET", "/v1/groups/{group}", "client", expect=200, group="g")
        assert detail["assignments"]
        await call("POST", "/v1/groups/{group}/leave", "client", json_body={"member": "c1"}, expect=200, group="g")

        await call("PUT", "/v1/brokers/{broker}", "broker", json_body={"address": "http://127.0.0.1:1"},
                   expect=200, broker="spare")
        await call("POST", "/v1/brokers/{broker}/heartbeat", "broker", json_body={"epoch": 1, "queues": {}},
                   expect=200, broker="spare")
        await call("POST", "/v1/brokers/{broker}/seal", "broker", json_body={
            "epoch": 1, "topic": "t", "queue": 0, "gen": 0, "end_offset": 0}, broker="spare")
        await call("POST", "/v1/brokers/{broker}/seals", "broker", json_body={"epoch": 1, "seals": [
            {"topic": "t", "queue": 0, "gen": 0, "end_offset": 0}]}, broker="spare")
        in_sync = await call("POST", "/v1/brokers/{broker}/in-sync", "broker", json_body={"epoch": 1, "changes": [
            {"topic": "t", "queue": 0, "gen": 0, "in_sync": ["spare"], "epochs": {"spare": 1}}]}, expect=200,
            broker="spare")
        assert in_sync["results"][0]["code"] == "SEGMENT_NOT_FOUND", in_sync   # it leads nothing
        down = await call("POST", "/v1/brokers/{broker}/peer-down", "broker", json_body={"epoch": 1, "peer": "spare"},
                          expect=200, broker="spare")
        assert down == {"peer": "spare", "probe": None, "state": "active"}, down   # it does not probe itself
        copies = await call("GET", "/v1/brokers/{broker}/copies?limit=5", "broker", expect=200, broker="spare")
        assert (copies["copies"], copies["next"]) == ([], None), copies
        await call("DELETE", "/v1/topics/{topic}", expect=200, topic="t")
        await call("GET", "/healthz", None, expect=200)
        await call("GET", "/readyz", None, expect=200)

        _assert_every_json_operation_called(spec, checker, skip={"/v1/admin/image"})


def _assert_every_json_operation_called(spec: dict, checker: SpecChecker, skip: set[str]) -> None:
    """Every operation with a JSON answer in the spec was called at least once (the SSE stream and the raw image
    are read by their own tests)."""
    json_ops = {(meth.upper(), path) for path, ops in spec["paths"].items() for meth, op in ops.items()
                if "application/json" in op["responses"].get("200", op["responses"].get("201", {}))
                .get("content", {}) and path not in skip}
    called = {(meth, path) for meth, path, _ in checker.checked}
    assert json_ops <= called, json_ops - called


async def test_live_broker_answers_match_the_broker_spec(tmp_path):
    from broker.api.openapi import SPEC as BROKER_SPEC
    async with cluster_mod.running(str(tmp_path), 3, 1, meta={"session_timeout_ms": 600_000}) as c:
        b = c.broker_urls[0]
        s, spec, _ = await c.call("GET", b + "/v1/openapi.json", None)
        assert s == 200 and spec == json.loads(json.dumps(BROKER_SPEC))
        checker = SpecChecker(spec)
        s, _, _ = await c.call("POST", c.meta_urls[0] + "/v1/topics", json={"topic": "t", "queues": 1})
        assert s == 201

        async def call(method, template, role="client", json_body=None, expect=200, **path):
            url = b + template.format(**path)
            for _ in range(SEALING_TRIES):   # the broker learns the new topic from its watch stream
                status, body, _ = await c.call(method, url, role, json=json_body)
                checker.check(method, template.split("?")[0], status, body)
                if status == expect or status not in (404, 409, 503):
                    break
                await asyncio.sleep(0.1)
            assert status == expect, (method, url, status, body)
            return body

        sent = await call("POST", "/v1/messages/{topic}/{queue}", json_body={"messages": [
            {"body": "a", "key": "k"}, {"body_b64": "Yg==", "props": {"p": "1"}}, {"body": "c"}]}, topic="t", queue=0)
        assert sent["offsets"] == [0, 1, 2]
        await call("POST", "/v1/messages/{topic}/{queue}", json_body={"messages": [{"body": 1}]}, expect=400,
                   topic="t", queue=0)
        pulled = await call("GET", "/v1/messages/{topic}/{queue}?offset=0", topic="t", queue=0)
        assert [m["offset"] for m in pulled["messages"]] == [0, 1, 2]
        await call("PUT", "/v1/offsets/{group}/{topic}/{queue}", json_body={"offset": 2}, group="g", topic="t",
                   queue=0)
        await call("PUT", "/v1/offsets/{group}/{topic}/{queue}", json_body={"offset": "2"}, expect=400, group="g",
                   topic="t", queue=0)
        await call("GET", "/v1/offsets/{group}/{topic}/{queue}", group="g", topic="t", queue=0)
        await call("GET", "/v1/offsets/{group}/{topic}", group="g", topic="t")
        listed = await call("GET", "/v1/offsets?group=g")
        assert listed == {"groups": [{"group": "g", "topics": ["t"]}], "truncated": False}
        await call("GET", "/v1/queues/{topic}", topic="t")
        counted = await call("GET", "/v1/queues/{topic}?count=1", topic="t")
        assert [q["messages"] for q in counted["queues"]] == [q["max_offset"] - q["min_offset"]
                                                             for q in counted["queues"]], counted
        hour = await call("GET", "/v1/rates/{topic}", topic="t")
        assert len(hour["stored"]) == len(hour["served"]) == 60 and sum(hour["served"]) >= 3, hour
        await call("GET", "/v1/queues/{topic}/{queue}/offset?ts=0", topic="t", queue=0)
        route = (await c.call("GET", c.meta_urls[0] + "/v1/routes/t", "client"))[1]
        sent_queue = route["queues"][0]["physical_queue"]
        await call("GET", "/v1/physical/{pq}?offset=0", "broker", pq=sent_queue)
        popped = await call("POST", "/v1/pop/{topic}", json_body={"group": "p", "max": 2, "invisible_ms": 60_000},
                            topic="t")
        assert len(popped["messages"]) == 2
        handle = (await call("POST", "/v1/invisible", json_body={
            "group": "p", "handle": popped["messages"][0]["handle"], "invisible_ms": 30_000}))["handle"]
        acked = await call("POST", "/v1/ack", json_body={"group": "p", "handles": [handle, "junk"]})
        assert [r["ok"] for r in acked["results"]] == [True, False]
        await call("GET", "/v1/dlq/{group}", group="p")
        await call("GET", "/v1/pop-stats/{group}", group="p")
        # Handover is asked of an old head: this broker holds the head, so it refuses, in the spec's error shape.
        await call("POST", "/v1/pop-handover/{group}/{topic}/{queue}?route_version=0", "broker", expect=409,
                   group="none", topic="t", queue=0)
        await call("POST", "/v1/pop-adopt/{group}/{topic}/{queue}", "broker", json_body={"deliveries": []},
                   group="none", topic="t", queue=0)
        assert (await call("POST", "/v1/pop-takeover/{group}/{topic}/{queue}", "broker", group="none", topic="t",
                           queue=0)) == {"queued": True}
        pushed = {"topic": "t", "queue": 0, "leader_gen": 0, "commits": [{"group": "pushed", "offset": 1, "gen": 0,
                                                                          "seq": 1}]}
        assert (await call("PUT", "/v1/replica/offsets", "broker", json_body=pushed)) == {"stored": 1}
        await call("PUT", "/v1/replica/offsets", "broker", json_body={**pushed, "leader_gen": -1}, expect=400)
        table = await call("GET", "/v1/replica/offsets/{topic}/{queue}", "broker", topic="t", queue=0)
        assert {"group": "pushed", "offset": 1, "gen": 0, "seq": 1} in table["commits"] and table["next"] is None
        assert (await call("GET", "/v1/replica/offsets/{topic}/{queue}?after=pushed", "broker", topic="t",
                           queue=0))["commits"] == []
        line = ["pushed", "t", 0, 3, 0, False, 0, [[1, 7, 1, 1, 0]], []]   # a pop journal line (broker/pop/state.py)
        copied = {"topic": "t", "queue": 0, "leader_gen": 0, "reset": True, "lines": [line]}
        assert (await call("PUT", "/v1/replica/pop", "broker", json_body=copied)) == {"stored": 1}
        await call("PUT", "/v1/replica/pop", "broker", json_body={**copied, "lines": [["x"]]}, expect=400)
        asked = {"queues": [{"topic": "t", "queue": 0, "gen": 1, "previous": sent_queue}], "route_version": 0}
        assert (await call("POST", "/v1/replica/producers", "broker", json_body=asked)) == {"queues": []}
        await call("POST", "/v1/replica/producers", "broker", json_body={**asked, "queues": []}, expect=400)
        await call("POST", "/v1/replica/producers", "broker", json_body={"queues": asked["queues"]}, expect=400)
        await call("GET", "/healthz", None)
        await call("GET", "/readyz", None)
        _assert_every_json_operation_called(spec, checker, skip=set())


@pytest.mark.parametrize("message", [
    {"body": "a"}, {"body_b64": "YQ=="}, {"body": "a", "key": "k", "props": {"x": "y"}}, {"body": "a", "key": None},
    {}, {"body": "a", "body_b64": "YQ=="}, {"body": 1}, {"body": "a", "key": 2}, {"body": "a", "props": {"x": 1}},
    {"body": "a", "props": []}, "text", None,
])
def test_the_send_model_and_the_codec_agree_on_each_message(message):
    """The send path checks messages in the codec (the hot path), the spec shows the model: they must agree."""
    def accepted(check) -> bool:
        try:
            check()
            return True
        except ApiError:
            return False
    assert accepted(lambda: encode_message(message)) == accepted(
        lambda: validate(broker_models.Send, {"messages": [message]}))


def test_request_models_refuse_what_the_handlers_would_not_take():
    """The models are strict: no coercion, unknown fields named, bounds from meta/limits.py."""
    with pytest.raises(Exception) as e:
        validate(models.CreateTopic, {"topic": "t", "queues": 1, "colour": "red"})
    assert e.value.code == "INVALID_ARGUMENT" and e.value.details["field"] == "colour"
    with pytest.raises(Exception) as e:
        validate(models.CreateTopic, {"topic": "t", "queues": True})
    assert e.value.details["field"] == "queues"
    with pytest.raises(Exception) as e:
        validate(models.GroupConfig, {"lease_ms": 1})
    assert e.value.details["field"] == "lease_ms"
    assert validate(models.TopicConfig, {"a": None, "b": "x"}) == {"a": None, "b": "x"}
