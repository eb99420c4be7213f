"""Schemathesis fuzzes every meta operation of /v1/openapi.json against a real node: whatever it sends, the answer is
never a 5xx (bar the documented 503s of an honest wait), always carries X-Meta-Version, and errors have the API shape."""

from __future__ import annotations


import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from meta.api.openapi import SPEC
from ops import devcluster
from tests import cluster as cluster_mod

# The SSE stream never ends by design; it is exercised by the integration tests instead.
schema = schemathesis.openapi.from_dict(SPEC).exclude(path="/v1/watch")
WAIT_PARAMS = ("wait",)
HONEST_503 = {"VERSION_NOT_REACHED", "SEALING", "NO_LEADER"}


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory):
    c = cluster_mod.up(str(tmp_path_factory.mktemp("fuzz")), 3, 0, meta={"session_timeout_ms": 3_600_000})
    m = c.meta_urls[0]
    h = {"Authorization": f"Bearer {c.token('broker')}"}
    assert requests.put(f"{m}/v1/brokers/b1", json={"address": "http://127.0.0.1:1"}, headers=h, timeout=10).ok
    h = {"Authorization": f"Bearer {c.token('admin')}"}
    assert requests.post(f"{m}/v1/topics", json={"topic": "t", "queues": 2}, headers=h, timeout=10).status_code == 201
    yield c
    devcluster.down(c.dir)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_whatever_the_input(case, fuzz_target):
    c = fuzz_target
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {c.token('admin')}"}
    for p in WAIT_PARAMS:  # keep generated waits short: a long poll or min_version wait is correct, just slow
        if case.query and p in case.query:
            case.query[p] = 0.05
    resp = case.call(base_url=c.meta_urls[0], timeout=20)
    assert "x-meta-version" in {k.lower() for k in resp.headers}, (case.method, case.path, resp.status_code)
    if resp.status_code >= 400 and resp.content:
        body = resp.json()
        assert set(body) == {"error"} and {"code", "message", "details"} <= set(body["error"]), body
        if resp.status_code == 503:
            assert body["error"]["code"] in HONEST_503, body
    assert resp.status_code < 500 or resp.status_code == 503, (case.method, case.path, case.query,
                                                               case.body, resp.status_code, resp.text[:500])
