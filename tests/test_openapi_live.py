"""Every operation of the meta spec, called on a real cluster, answers what /v1/openapi.json says it answers.

The spec is generated from meta/api/models.py, the models the handlers validate request bodies with; this test holds
the answers to it too, so a field renamed or retyped in a handler fails here instead of drifting from the spec.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema_rs
import pytest

from meta.api import models
from tests import cluster as cluster_mod

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
        await call("GET", "/v1/routes/{topic}", "client", expect=200, topic="t")
        await call("GET", "/v1/cluster", "client", expect=200)
        await call("GET", "/v1/history", "client", expect=200)
        await call("GET", "/v1/admin/image-digest", expect=200)

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
        await call("DELETE", "/v1/topics/{topic}", expect=200, topic="t")
        await call("GET", "/healthz", None, expect=200)
        await call("GET", "/readyz", None, expect=200)

        # Every operation with a JSON answer in the spec was called at least once (the stream and the raw image
        # are read by their own tests).
        json_ops = {(meth.upper(), path) for path, ops in spec["paths"].items() for meth, op in ops.items()
                    if "application/json" in op["responses"].get("200", op["responses"].get("201", {}))
                    .get("content", {}) and path != "/v1/admin/image"}
        assert json_ops <= {(meth, path) for meth, path, _ in checker.checked}, \
            json_ops - {(meth, path) for meth, path, _ in checker.checked}


def test_request_models_refuse_what_the_handlers_would_not_take():
    """The models are strict: no coercion, unknown fields named, bounds from meta/limits.py."""
    with pytest.raises(Exception) as e:
        models.validate(models.CreateTopic, {"topic": "t", "queues": 1, "colour": "red"})
    assert e.value.code == "INVALID_ARGUMENT" and e.value.details["field"] == "colour"
    with pytest.raises(Exception) as e:
        models.validate(models.CreateTopic, {"topic": "t", "queues": True})
    assert e.value.details["field"] == "queues"
    with pytest.raises(Exception) as e:
        models.validate(models.GroupConfig, {"lease_ms": 1})
    assert e.value.details["field"] == "lease_ms"
    assert models.validate(models.TopicConfig, {"a": None, "b": "x"}) == {"a": None, "b": "x"}
