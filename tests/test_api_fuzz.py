"""Schemathesis fuzzes every operation of both services' /v1/openapi.json against one real cluster (three meta nodes,
one broker). Whatever it sends, each answer:

- comes within REQUEST_TIMEOUT_S (no hang);
- is never a 5xx, bar the documented 503s of an honest wait or refusal;
- carries the service's version header (X-Meta-Version / X-Route-Version), and an error has the API shape;
- when it is a 4xx to a mutating request, changed nothing: on meta, the image read through the log (a linearizable
  read, so the node has applied whatever the leader decided) is the same as before, bar the counters every logged
  command moves (``commands``, ``last_ts``, ``requests``); on the broker, every state a read can show for the names
  the request carried (queue ends, committed offset, pop state, dead letters) is the same as before.

The cluster is idle between cases (no client traffic, broker sessions longer than the run), so the meta image only
moves by the case under test; should the cluster log an event of its own meanwhile (a broker's budget or seal, the
expiry of a group member the fuzzer let join), the check looks at the events between and accepts only those. Each test counts the cases it sent per operation, asserts
every operation got some, and prints the counts (the issue asks for them).
"""

from __future__ import annotations

import collections
import json
import time
import urllib.parse
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from broker.api.openapi import SPEC as BROKER_SPEC
from meta.api.openapi import SPEC as META_SPEC
from ops import devcluster
from tests.support import cluster as cluster_mod

CASES_PER_OPERATION = 12
REQUEST_TIMEOUT_S = 20.0
SETTLE_TIMEOUT_S = 20.0
SHORT_WAIT_S = 0.05                  # generated waits: a long poll is correct, only slow
SHORT_WAIT_MS = 50
HONEST_503 = {"VERSION_NOT_REACHED", "SEALING", "NO_LEADER", "FENCED", "BROKER_UNAVAILABLE", "TOO_MANY_WAITERS",
              "OVERLOADED", "UNKNOWN_OUTCOME", "LOCKS_CATCHING_UP", "CATCHING_UP"}
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
# What a command the log rejects still moves in the image (meta/state_machine.py apply): not state a client sees.
COMMAND_COUNTERS = ("commands", "last_ts", "requests")
# Events the cluster logs on its own (a broker's offset budget, segment rolls): never the effect of a refused request.
BACKGROUND_EVENTS = {"OffsetBudgetGranted", "SegmentSealing", "SegmentSealed", "SegmentOpened", "LogicStartDecided",
                     "BrokerFenced", "BrokerUnfenced"}
LEASE_EXPIRED = "lease_expired"     # the reason of the events a member's or a lock's lease expiry logs
TOPIC = "fuzztopic"                 # the broker's topic: longer than schemathesis' usual strings, so meta cases
GROUP = "fuzzgroup"                 # never name it by chance
BROKER = "b1"

# The SSE stream never ends by design; the integration tests cover it. Membership changes are left out: a generated
# name may be a real member's ("m1"), and removing one changes the cluster under the fuzzer; their bad input is
# tested by name in tests/test_meta_members.py.
meta_schema = (schemathesis.openapi.from_dict(META_SPEC).exclude(path="/v1/watch")
               .exclude(path_regex="^/v1/cluster/members/").exclude(path="/v1/cluster/members", method="POST"))
broker_schema = schemathesis.openapi.from_dict(BROKER_SPEC)


@pytest.fixture(scope="module")
def fuzz_cluster(tmp_path_factory):
    c = cluster_mod.up(str(tmp_path_factory.mktemp("fuzz")), 3, 1,
                       meta={"session_timeout_ms": 3_600_000})
    try:
        m, b = c.meta_urls[0], c.broker_urls[0]
        ok = _call(c, "POST", f"{m}/v1/topics", json={"topic": TOPIC, "queues": 2, "brokers": [BROKER]})
        assert ok.status_code == 201, ok.text
        ok = _call(c, "GET", f"{m}/v1/routes/{TOPIC}?min_version={ok.json()['version']}")
        assert ok.status_code == 200, ok.text
        _until_sent(c, b)
        ok = _call(c, "PUT", f"{b}/v1/offsets/{GROUP}/{TOPIC}/0", json={"offset": 1}, role="client")
        assert ok.status_code == 200, ok.text
        ok = _call(c, "POST", f"{b}/v1/pop/{TOPIC}", json={"group": GROUP, "max": 1}, role="client")
        assert ok.status_code == 200, ok.text
        yield c
    finally:
        devcluster.down(c.dir)


def _call(c, method: str, url: str, role: str = "admin", **kw) -> requests.Response:
    return requests.request(method, url, headers=c.headers(role), timeout=REQUEST_TIMEOUT_S, **kw)


def _until_sent(c, b: str) -> None:
    """The broker learns the new route from meta on its own: retry the first send until it takes it."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        r = _call(c, "POST", f"{b}/v1/messages/{TOPIC}/0", role="client",
                  json={"messages": [{"body": "one"}, {"body": "two"}]})
        if r.status_code == 200:
            return
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)


# -- the checks every answer keeps -----------------------------------------------------------------------------------

def check_answer(resp: requests.Response, version_header: str, what: str) -> None:
    assert version_header.lower() in {k.lower() for k in resp.headers}, f"no {version_header}: {what}"
    assert resp.status_code < 500 or resp.status_code == 503, f"HTTP {resp.status_code} {resp.text[:500]}: {what}"
    if resp.status_code < 400:
        return
    body = resp.json()
    assert isinstance(body, dict) and set(body) == {"error"}, f"not the error shape {body!r}: {what}"
    assert {"code", "message", "details"} <= set(body["error"]), f"not the error shape {body!r}: {what}"
    if resp.status_code == 503:
        assert body["error"]["code"] in HONEST_503, f"HTTP 503 {body}: {what}"


def shorten_waits(case) -> None:
    """A long poll or min_version wait is right to take its time: keep generated ones short."""
    for name in ("wait",):
        if case.query and name in case.query:
            case.query[name] = SHORT_WAIT_S
    if isinstance(case.body, dict) and isinstance(case.body.get("wait_ms"), int):
        case.body["wait_ms"] = min(case.body["wait_ms"], SHORT_WAIT_MS)


def describe(case) -> str:
    return (f"{case.method} {case.formatted_path} query={case.query!r} headers={case.headers!r} "
            f"body={json.dumps(case.body, default=repr)[:500] if case.body is not None else None}")


def run_operations(schema, send_one, counts: collections.Counter) -> None:
    """One hypothesis run per operation, so each gets its share of cases; no shrinking (it would replay hundreds of
    real requests) and no example database (the cluster differs on every run)."""
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=CASES_PER_OPERATION, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(), known=st.booleans())
        def one(case, known: bool) -> None:
            counts[f"{case.method} {case.path}"] += 1
            send_one(case, known)

        one()


def report(service: str, schema, counts: collections.Counter, statuses: collections.Counter) -> None:
    operations = {f"{r.ok().method.upper()} {r.ok().path}" for r in schema.get_all_operations()}
    assert set(counts) == operations, operations ^ set(counts)
    assert statuses["refused writes checked"], "no refused mutating request was checked for changes"
    print(f"\nschemathesis {service}: {sum(counts.values())} cases over {len(counts)} operations "
          f"(min {min(counts.values())} per operation); {dict(sorted(statuses.items()))}")


# -- meta ------------------------------------------------------------------------------------------------------------

def meta_image(c) -> tuple[int, dict[str, Any]]:
    """The node's image once it applied everything the leader committed, minus what every logged command moves."""
    r = _call(c, "GET", f"{c.meta_urls[0]}/v1/admin/image?consistency=linearizable")
    assert r.status_code == 200, r.text
    image = r.json()
    for key in COMMAND_COUNTERS:
        image.pop(key, None)
    return image["version"], image


def assert_meta_unchanged(c, before: tuple[int, dict[str, Any]], what: str) -> None:
    after = meta_image(c)
    if after[0] == before[0]:
        changed = sorted(k for k in set(before[1]) | set(after[1]) if before[1].get(k) != after[1].get(k))
        assert not changed, f"a refused request changed the image ({changed}): {what}"
        return
    r = _call(c, "GET", f"{c.meta_urls[0]}/v1/history?after={before[0]}&limit={after[0] - before[0]}")
    assert r.status_code == 200, r.text
    events = r.json()["events"]
    # A group member the fuzzer let join expires on the leader's timer: that command's events (the member leaving,
    # its locks released and granted again) belong to a group whose lease ran out in this window.
    expired = {e["data"]["group"] for e in events if e["data"].get("reason") == LEASE_EXPIRED}
    own = [e for e in events if e["type"] not in BACKGROUND_EVENTS and e["data"].get("group") not in expired]
    assert not own, f"a refused request logged events {own}: {what}"


@pytest.mark.long(seconds=55)   # its module alone, measured on 2 cores (tests/conftest.py)
def test_meta_api_keeps_the_contract_whatever_the_input(fuzz_cluster):
    c = fuzz_cluster
    counts: collections.Counter = collections.Counter()
    statuses: collections.Counter = collections.Counter()

    def send_one(case, known: bool) -> None:
        shorten_waits(case)
        if (case.path_parameters or {}).get("broker") == BROKER:
            case.path_parameters["broker"] = "not-" + BROKER   # re-registering the live broker would fence it
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {c.token('admin')}"}
        what = describe(case)
        before = meta_image(c) if case.method.upper() in MUTATING else None
        resp = case.call(base_url=c.meta_urls[0], timeout=REQUEST_TIMEOUT_S)
        check_answer(resp, "X-Meta-Version", what)
        statuses[f"{resp.status_code // 100}xx"] += 1
        if resp.status_code == 503:
            statuses[f"503 {resp.json()['error']['code']}"] += 1
        if before is not None and 400 <= resp.status_code < 500:
            assert_meta_unchanged(c, before, what)
            statuses["refused writes checked"] += 1

    run_operations(meta_schema, send_one, counts)
    report("meta", meta_schema, counts, statuses)


# -- broker ----------------------------------------------------------------------------------------------------------

def _names(case) -> dict[str, Any]:
    """The topic, queue and group a case names, in its path or its body: where a refused request could do harm."""
    names = {"topic": TOPIC, "queue": 0, "group": GROUP}
    for source in (case.path_parameters or {}, case.body if isinstance(case.body, dict) else {}):
        for key in names:
            if isinstance(source.get(key), (str, int)) and not isinstance(source.get(key), bool):
                names[key] = source[key]
    return names


def name_known(case) -> None:
    """Half the cases name the fixture's topic, queue and group, in the path and the body: a random name is mostly a
    404 or 400 at the door, these reach the handlers' deeper checks (the bodies stay generated)."""
    known = {"topic": TOPIC, "group": GROUP, "queue": 0}
    for params in (case.path_parameters, case.body if isinstance(case.body, dict) else None):
        for key, value in known.items():
            if params is not None and key in params:
                params[key] = value


def broker_state(c, names: dict[str, Any]) -> list[tuple[str, int, Any]]:
    """Everything a read shows about the case's names and the fixture's own: queue ends, committed offset, pop state
    (bar the counts that move with the clock alone) and dead letters."""
    q = urllib.parse.quote
    b = c.broker_urls[0]
    paths = []
    for n in ({"topic": TOPIC, "queue": 0, "group": GROUP}, names):
        t, g, queue = q(str(n["topic"]), safe=""), q(str(n["group"]), safe=""), q(str(n["queue"]), safe="")
        paths += [f"/v1/queues/{t}", f"/v1/offsets/{g}/{t}/{queue}", f"/v1/pop-stats/{g}", f"/v1/dlq/{g}"]
    out = []
    for path in paths:
        r = _call(c, "GET", b + path, role="client")
        body = r.json() if r.content else None
        if path.startswith("/v1/pop-stats/") and r.status_code == 200:
            body = [(s["topic"], s["queue"], s["pop_offset"], s["in_flight"], s["frozen"]) for s in body["queues"]]
        out.append((path, r.status_code, body))
    return out


ROLE_OF = {"/v1/physical/{pq}": "broker", "/v1/pop-handover/{group}/{topic}/{queue}": "broker",
           "/v1/pop-adopt/{group}/{topic}/{queue}": "broker", "/v1/pop-takeover/{group}/{topic}/{queue}": "broker"}


def test_broker_api_keeps_the_contract_whatever_the_input(fuzz_cluster):
    c = fuzz_cluster
    counts: collections.Counter = collections.Counter()
    statuses: collections.Counter = collections.Counter()

    def send_one(case, known: bool) -> None:
        shorten_waits(case)
        if known:
            name_known(case)
        token = c.token(ROLE_OF.get(case.path, "client"))
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
        what = describe(case)
        before = broker_state(c, _names(case)) if case.method.upper() in MUTATING else None
        resp = case.call(base_url=c.broker_urls[0], timeout=REQUEST_TIMEOUT_S)
        check_answer(resp, "X-Route-Version", what)
        statuses[f"{resp.status_code // 100}xx"] += 1
        if resp.status_code == 503:
            statuses[f"503 {resp.json()['error']['code']}"] += 1
        if before is not None and 400 <= resp.status_code < 500:
            statuses["refused writes checked"] += 1
            after = broker_state(c, _names(case))
            changed = [(b, a) for b, a in zip(before, after) if b != a]
            assert not changed, f"a refused request changed what the broker serves {changed}: {what}"

    run_operations(broker_schema, send_one, counts)
    report("broker", broker_schema, counts, statuses)
