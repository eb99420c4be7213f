"""Property-based fuzzing of every meta and broker HTTP operation on real processes (one `full_cluster`).

Hypothesis builds requests (path parameters, query parameters, JSON bodies, tokens of every role or none, request-id
headers) from values that broke services before: lone surrogates as JSON escapes and as encoded bytes, invalid UTF-8,
huge and special numbers, wrong types, unknown fields. Deterministic catalogues add what hypothesis should not draw
at random because it is big: deep nesting, 100,000-item collections, bodies around the 1 MiB / 32 MiB limits, raw
header and path bytes that the aiohttp client refuses to send.

Properties of every answer (API.md conventions): below 500 except the documented honest 503s; every non-2xx answer
has the error shape with an UPPER_SNAKE code; every meta answer carries X-Meta-Version and every broker answer
X-Route-Version; no request hangs; a refused (4xx) mutating request changes nothing. After the fuzzing the cluster
still agrees, serves its history and takes a new write end to end.

Hypothesis runs synchronously in a worker thread (`asyncio.to_thread`) and drives the HTTP calls on the test's own
loop through `asyncio.run_coroutine_threadsafe`, so the cluster fixture's session is used from its own loop and any
exception in the worker fails the test.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import yarl
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

REQUEST_TIMEOUT_S = 15.0
RUN_TIMEOUT_S = 3 * REQUEST_TIMEOUT_S      # one example: its request plus the state snapshots around it
SETTLE_TIMEOUT_S = 10.0
FUZZ_EXAMPLES_PER_OP = 25   # drawn anew every run (no example database); 40 took ~20 s more of the suite
META_BODY_BYTES_MAX = 1 * 1024 * 1024     # meta/limits.py REQUEST_BODY_BYTES_MAX (API.md: bodies past it are 413)
BROKER_BODY_BYTES_MAX = 32 * 1024 * 1024  # broker/api/app.py REQUEST_BODY_BYTES_MAX
BIG_COLLECTION_ITEMS = 100_000
DEEP_ARRAY_LEVELS = 200_000
DEEP_OBJECT_LEVELS = 40                   # past the parsers' 32 levels
SHORT_WAIT_S = "0.2"                      # waits the fuzzer allows: correct long waits would only make it slow

HONEST_503 = {"NO_LEADER", "FENCED", "SEALING", "BROKER_UNAVAILABLE", "TOO_MANY_WAITERS", "OVERLOADED",
              "UNKNOWN_OUTCOME", "VERSION_NOT_REACHED", "LOCKS_CATCHING_UP", "CATCHING_UP"}
ERROR_CODE_RE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
REAL_BROKERS = ("b1", "b2", "b3")
FAKE_BROKER = "fzb"                       # registered by the test; mutating broker calls never name a real broker
TOPIC = "fz"
GROUP = "fzg"
# Events the cluster makes on its own while the fuzzer runs: a refused request may not be the cause of any other.
BACKGROUND_EVENTS = {"BrokerFenced", "BrokerUnfenced", "OffsetBudgetGranted", "SegmentSealed", "LogicStartDecided"}


# -- the operations --------------------------------------------------------------------------------------------------

READ_QUERY = ("min_version", "wait", "consistency")


@dataclass(frozen=True)
class Op:
    service: str                      # "meta" or "broker"
    method: str
    path: str                         # with {name} path parameters
    query: tuple[str, ...] = ()
    fields: tuple[str, ...] | None = None   # body fields; None: no body; (): any keys (topic config)
    mutating: bool = False
    stream: bool = False              # answers with a never-ending SSE stream


META_OPS = [
    Op("meta", "GET", "/v1/cluster", READ_QUERY),
    Op("meta", "GET", "/healthz"), Op("meta", "GET", "/readyz"), Op("meta", "GET", "/metrics"),
    Op("meta", "GET", "/v1/openapi.json"),
    Op("meta", "GET", "/v1/history", READ_QUERY + ("topic", "after", "limit")),
    Op("meta", "GET", "/v1/admin/image-digest", READ_QUERY),
    Op("meta", "GET", "/v1/admin/image", READ_QUERY),
    Op("meta", "GET", "/v1/routes/{topic}", READ_QUERY + ("after",)),
    Op("meta", "GET", "/v1/watch", ("topics", "after"), stream=True),
    Op("meta", "POST", "/v1/topics", ("expected_version",), ("topic", "queues", "brokers", "slots", "order", "config",
                                                             "replicas", "min_insync", "scope"),
       mutating=True),
    Op("meta", "GET", "/v1/topics", READ_QUERY),
    Op("meta", "GET", "/v1/topics/{topic}", READ_QUERY),
    Op("meta", "PATCH", "/v1/topics/{topic}", ("expected_version",), ("queues",), mutating=True),
    Op("meta", "PUT", "/v1/topics/{topic}/config", ("expected_version",), (), mutating=True),
    Op("meta", "POST", "/v1/topics/{topic}/remap", ("expected_version",), ("brokers", "queues"), mutating=True),
    Op("meta", "POST", "/v1/topics/{topic}/elect", ("expected_version",), ("queues", "unclean"), mutating=True),
    Op("meta", "DELETE", "/v1/topics/{topic}", ("expected_version",), mutating=True),
    Op("meta", "GET", "/v1/topics/{topic}/queues/{queue}/segments", READ_QUERY),
    Op("meta", "PUT", "/v1/brokers/{broker}", (), ("address", "zone", "cluster"), mutating=True),
    Op("meta", "GET", "/v1/brokers/{broker}", READ_QUERY),
    Op("meta", "POST", "/v1/brokers/{broker}/drain", (), ("draining", "to"), mutating=True),
    Op("meta", "POST", "/v1/brokers/{broker}/copies-held", (), ("epoch", "copies"), mutating=True),
    Op("meta", "POST", "/v1/brokers/{broker}/heartbeat", (), ("epoch", "queues"), mutating=True),
    Op("meta", "POST", "/v1/brokers/{broker}/seal", (),
       ("epoch", "topic", "queue", "gen", "end_offset", "physical_queue"), mutating=True),
    Op("meta", "POST", "/v1/brokers/{broker}/seals", (), ("epoch", "seals"), mutating=True),
    Op("meta", "POST", "/v1/brokers/{broker}/in-sync", (), ("epoch", "changes"), mutating=True),
    Op("meta", "POST", "/v1/brokers/{broker}/peer-down", (), ("epoch", "peer"), mutating=True),
    Op("meta", "GET", "/v1/brokers/{broker}/copies", ("after", "limit", *READ_QUERY)),
    Op("meta", "GET", "/v1/brokers", READ_QUERY),
    Op("meta", "POST", "/v1/groups/{group}/heartbeat", (), ("member", "topics", "mode", "released"), mutating=True),
    Op("meta", "POST", "/v1/groups/{group}/leave", ("expected_version",), ("member",), mutating=True),
    Op("meta", "PUT", "/v1/groups/{group}/config", ("expected_version",), (), mutating=True),
    Op("meta", "GET", "/v1/groups", READ_QUERY),
    Op("meta", "GET", "/v1/groups/{group}"),
    Op("meta", "GET", "/v1/cluster/members", READ_QUERY),
    Op("meta", "POST", "/v1/cluster/members", (), ("node", "raft", "url"), mutating=True),
    Op("meta", "POST", "/v1/cluster/members/{node}/promote", (), mutating=True),
    Op("meta", "DELETE", "/v1/cluster/members/{node}", (), mutating=True),
]
# The web console (meta/console): the fuzzer has no session, so pages redirect to the login form and everything
# else is refused in the API's error shape; a refused form changes nothing.
PAGE_QUERY = ("format", "fragment")
CONSOLE_OPS = [
    Op("meta", "GET", "/console", PAGE_QUERY), Op("meta", "GET", "/console/login", ("next",)),
    Op("meta", "POST", "/console/login", (), ("token", "next")),
    Op("meta", "POST", "/console/logout", (), ("csrf",)),
    Op("meta", "GET", "/console/events", (), stream=True),
    Op("meta", "GET", "/console/brokers", PAGE_QUERY), Op("meta", "GET", "/console/topics", PAGE_QUERY),
    Op("meta", "GET", "/console/topics/{topic}", PAGE_QUERY),
    Op("meta", "POST", "/console/topics/{topic}/remap", (), ("csrf", "brokers", "queues"), mutating=True),
    Op("meta", "POST", "/console/topics", (), ("csrf", "topic", "queues", "replicas", "min_insync", "order", "brokers"),
       mutating=True),
    Op("meta", "POST", "/console/topics/{topic}/grow", (), ("csrf", "queues"), mutating=True),
    Op("meta", "POST", "/console/topics/{topic}/config", (), ("csrf", "set", "unset"), mutating=True),
    Op("meta", "POST", "/console/topics/{topic}/delete", (), ("csrf", "confirm"), mutating=True),
    Op("meta", "GET", "/console/topics/{topic}/timeline", PAGE_QUERY + ("after",)),
    Op("meta", "GET", "/console/groups", PAGE_QUERY), Op("meta", "GET", "/console/groups/{group}", PAGE_QUERY),
    Op("meta", "POST", "/console/groups/{group}/config", (), ("csrf", "max_attempts", "lease_ms"), mutating=True),
    Op("meta", "GET", "/console/groups/{group}/pop", PAGE_QUERY),
    Op("meta", "GET", "/console/groups/{group}/dead-letters", PAGE_QUERY + ("offset",)),
    Op("meta", "GET", "/console/topics/{topic}/messages", PAGE_QUERY + ("queue", "offset", "key", "since", "max")),
    Op("meta", "POST", "/console/topics/{topic}/messages", (), ("csrf", "queue", "key", "body"), mutating=True),
    Op("meta", "GET", "/console/history", PAGE_QUERY + ("topic", "type", "after", "limit")),
    Op("meta", "GET", "/console/static/{name}"),
]
BROKER_OPS = [
    Op("broker", "POST", "/v1/messages/{topic}/{queue}", (), ("messages",), mutating=True),
    Op("broker", "GET", "/v1/messages/{topic}/{queue}", ("offset", "max", "group", "token")),
    Op("broker", "PUT", "/v1/offsets/{group}/{topic}/{queue}", (), ("offset", "token"), mutating=True),
    Op("broker", "GET", "/v1/offsets/{group}/{topic}/{queue}", ("local",)),
    Op("broker", "GET", "/v1/offsets/{group}/{topic}"),
    Op("broker", "GET", "/v1/offsets", ("group",)),
    Op("broker", "GET", "/v1/queues/{topic}", ("count",)),
    Op("broker", "GET", "/v1/queues/{topic}/{queue}/offset", ("ts",)),
    Op("broker", "GET", "/v1/rates/{topic}"),
    Op("broker", "GET", "/v1/physical/{pq}", ("offset", "max", "ts", "start")),
    Op("broker", "POST", "/v1/replica", (), ("follower", "epoch", "queues"), mutating=True),
    Op("broker", "GET", "/v1/replica/stream", ("follower", "epoch")),   # without the Upgrade headers: a plain 400
    Op("broker", "PUT", "/v1/replica/offsets", (), ("topic", "queue", "leader_gen", "commits"), mutating=True),
    Op("broker", "GET", "/v1/replica/offsets/{topic}/{queue}", ("after",)),
    Op("broker", "PUT", "/v1/replica/pop", (), ("topic", "queue", "leader_gen", "reset", "lines"), mutating=True),
    Op("broker", "POST", "/v1/replica/producers", (), ("queues", "route_version")),
    Op("broker", "GET", "/healthz"), Op("broker", "GET", "/readyz"), Op("broker", "GET", "/metrics"),
    Op("broker", "GET", "/v1/openapi.json"),
    Op("broker", "POST", "/v1/pop/{topic}", (), ("group", "max", "invisible_ms", "queue", "order", "wait_ms"),
       mutating=True),
    Op("broker", "POST", "/v1/ack", (), ("group", "handles"), mutating=True),
    Op("broker", "POST", "/v1/invisible", (), ("group", "handle", "invisible_ms"), mutating=True),
    Op("broker", "GET", "/v1/dlq/{group}", ("offset", "max")),
    Op("broker", "GET", "/v1/pop-stats/{group}"),
    Op("broker", "POST", "/v1/pop-handover/{group}/{topic}/{queue}", ("route_version",), mutating=True),
    Op("broker", "POST", "/v1/pop-adopt/{group}/{topic}/{queue}", (), ("deliveries",), mutating=True),
    Op("broker", "POST", "/v1/pop-takeover/{group}/{topic}/{queue}", mutating=True),
]
ALL_OPS = META_OPS + CONSOLE_OPS + BROKER_OPS
BODY_OPS = [op for op in ALL_OPS if op.fields is not None]


def op_named(method: str, path: str) -> Op:
    return next(op for op in ALL_OPS if (op.method, op.path) == (method, path))


def test_the_catalogue_names_every_route_of_both_apps(tmp_path, monkeypatch):
    """The fuzzer covers what the code serves: a new route without a row here fails this test."""
    from broker.api.app import make_app as make_broker_app
    from broker.config import BrokerConfig
    from meta.api import app as meta_app
    monkeypatch.setattr(meta_app, "MetaService", lambda *a, **kw: None)  # the router only: no node to start
    broker_app = make_broker_app(BrokerConfig(broker="x", data_dir=str(tmp_path), http_host="127.0.0.1", http_port=1,
                                              meta_urls=(), token="t", client_token="c"))
    served = set()
    for service, app in (("meta", meta_app.make_app(None)), ("broker", broker_app)):
        served |= {(service, r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    assert served == {(op.service, op.method, op.path) for op in ALL_OPS}


# -- values --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Raw:
    """JSON text put into a body as is: numbers and literals that Python's encoder cannot or will not write."""
    text: str


SPECIAL_NUMBERS = [Raw(t) for t in (
    "0", "1", "2", "-1", "-0", "1.0", "0.5", "1e3", "1E400", "-1e400", "NaN", "Infinity", "-Infinity",
    str(2**31), str(2**62), str(2**62 + 1), str(2**63), str(2**64), str(-2**63), "9" * 4300, "1" + "0" * 5000)]
SPECIAL_TEXTS = ["", " ", "fz", TOPIC, FAKE_BROKER, "nope", "a b", "a/b", "..", "%2e", "?x=1", "#", "\x00", "\x7f",
                 "é", "ключ", "\U0001f600", "\ud800", "a\udfff", "\udc80b", "\ud83d\ude00", "\ufeff", "x" * 128,
                 "x" * 300, "x" * 1025, "http://127.0.0.1:1", "best_tried", "strict"]
# Hypothesis leaves out surrogates unless asked: ask, so lone ones come up in every string field.
any_text = st.one_of(st.sampled_from(SPECIAL_TEXTS),
                     st.text(st.characters(exclude_categories=()), max_size=12))
scalars = st.one_of(st.none(), st.booleans(), st.sampled_from(SPECIAL_NUMBERS),
                    st.integers(min_value=-2**70, max_value=2**70), st.floats(), any_text)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(any_text, inner, max_size=4)),
                           max_leaves=10)
small_ints = st.one_of(st.sampled_from([0, 1, 2, 3, -1, 16_384, 16_385, 65_536, 65_537, 2**62, 2**63]),
                       st.sampled_from(SPECIAL_NUMBERS))
names = st.sampled_from([TOPIC, "fz-new", "fz-2", FAKE_BROKER, "nope", GROUP, "a" * 127, "a" * 128, ""])
broker_lists = st.one_of(st.lists(st.sampled_from(REAL_BROKERS + (FAKE_BROKER, "nope")), max_size=4), json_values)
message = st.fixed_dictionaries({}, optional={"body": st.one_of(any_text, json_values),
                                              "body_b64": st.one_of(st.sampled_from(["eA==", "!!"]), json_values),
                                              "key": st.one_of(any_text, json_values),
                                              "props": st.one_of(st.dictionaries(any_text, any_text, max_size=3),
                                                                 json_values),
                                              "junk": json_values})
# Plausible values per field, so requests also reach the checks behind the type checks.
FIELD_VALUES = {
    "topic": names, "queues": st.one_of(small_ints, st.lists(small_ints, max_size=3)), "brokers": broker_lists,
    "slots": small_ints,
    "order": st.one_of(st.sampled_from(["best_tried", "strict", "STRICT"]), st.booleans()),  # a topic's, a pop's
    "config": st.dictionaries(any_text, st.one_of(any_text, st.none()), max_size=3),
    "address": st.sampled_from(["http://127.0.0.1:1", "http://é", "x" * 257, ""]), "zone": any_text,
    "epoch": small_ints, "gen": small_ints, "queue": small_ints, "end_offset": small_ints,
    "physical_queue": st.sampled_from(["fz.q0.g0.i4", "x" * 301, "../x"]),
    "messages": st.one_of(st.lists(message, max_size=3), json_values), "offset": small_ints, "token": small_ints,
    "group": names, "max": small_ints, "invisible_ms": st.sampled_from([0, 999, 1000, 60_000, 43_200_001]),
    "wait_ms": st.sampled_from([0, 1, 200, 30_001, -1]),
    "handles": st.one_of(st.lists(any_text, max_size=3), json_values), "handle": any_text,
    "deliveries": st.one_of(st.lists(st.lists(small_ints, max_size=3), max_size=3), json_values),
    # A member added here never comes up (a learner: the majority is untouched); one raft address for all of them,
    # so at most one is ever added.
    "node": names, "raft": st.sampled_from(["127.0.0.1:1", "no-port", "x" * 300 + ":1"]),
    "url": st.sampled_from(["http://127.0.0.1:1", "ftp://x", ""]),
}
QUERY_VALUES = st.one_of(
    st.sampled_from(["0", "1", "-1", "x", "", "1.5", "1e400", "nan", "inf", str(2**62), str(2**63), "9" * 5000,
                     "\u0661\u0662", " 1 ", "linearizable", "serializable", "LINEARIZABLE", SHORT_WAIT_S, "61",
                     "301", TOPIC, f"{TOPIC},nope", ",".join(f"t{i}" for i in range(1001))]),
    any_text)
# Mostly tokens that pass auth, so the requests reach the handlers; the rest check auth itself.
ROLES = st.sampled_from(["admin", "broker", "client"] * 3 + ["none", "wrong", "basic"])
HEADER_VALUES = st.sampled_from(["", " ", "k1", "x" * 200, "x" * 201, "x" * 10_000, "é", "ключ", "a b"])


def path_params(op: Op) -> st.SearchStrategy[dict[str, str]]:
    # Mutating broker calls never name a real broker: a valid re-registration would fence it for the whole run.
    broker = st.sampled_from([FAKE_BROKER, "nope"]) | any_text
    topic = st.sampled_from([TOPIC, "nope", "fz-new"]) | any_text
    queue = st.sampled_from(["0", "1", "2", "-1", "x", str(2**64), "1.0"]) | any_text
    pq = st.sampled_from(["fz.q0.g0.i4", "..", "%2e%2e", "nope"]) | any_text
    group = st.sampled_from([GROUP, "g"]) | any_text
    # Never a real member's name (m1..m3): removing one would change the cluster under the fuzzer.
    node = st.sampled_from(["fz-node", "nope"]) | any_text.filter(lambda t: not re.fullmatch(r"m[0-9]+", t))
    name = st.sampled_from(["console.js", "console.css", "nope", "..%2fpages.py"]) | any_text
    known = {"topic": topic, "queue": queue, "broker": broker, "pq": pq, "group": group, "node": node, "name": name}
    wanted = re.findall(r"{(\w+)}", op.path)
    return st.fixed_dictionaries({k: known[k] for k in wanted})


@dataclass
class Request:
    op: Op
    target: int                                # which node of the op's service
    params: dict[str, str]
    query: list[tuple[str, str]]
    role: str
    headers: dict[str, str]
    body: bytes | None = None
    content_type: str | None = "application/json"

    def describe(self) -> str:
        return (f"{self.op.method} {self.op.path} node#{self.target} params={_short(self.params)} "
                f"query={_short(self.query)} role={self.role} headers={_short(self.headers)} "
                f"content_type={self.content_type!r} body={_short(self.body)}")


def _short(value: Any, chars_max: int = 600) -> str:
    text = repr(value)
    return text if len(text) <= chars_max else f"{text[:chars_max]}... ({len(text)} chars)"


def render(value: Any, ascii_only: bool) -> str:
    """JSON text of ``value``; with ``ascii_only`` a lone surrogate is written as a \\udXXX escape, else as the
    character itself (the body's bytes then carry it encoded with surrogatepass: invalid UTF-8)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(render(str(k), ascii_only) + ":" + render(v, ascii_only) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@st.composite
def bodies(draw, op: Op) -> bytes | None:
    if op.fields is None:
        return draw(st.sampled_from([None, b"", b"{}", b"junk"]))
    if op.fields == ():
        obj = draw(st.one_of(FIELD_VALUES["config"], st.dictionaries(any_text, json_values, max_size=4)))
    else:
        obj = draw(st.fixed_dictionaries({}, optional={f: st.one_of(FIELD_VALUES.get(f, json_values), json_values)
                                                       for f in op.fields}))
    if draw(st.booleans()):
        obj.update(draw(st.dictionaries(any_text, json_values, max_size=2)))   # unknown fields
    value = obj if draw(st.integers(0, 9)) else draw(json_values)              # now and then not an object at all
    raw = encode(render(value, ascii_only=draw(st.booleans())))
    mangle = draw(st.sampled_from(["none"] * 6 + ["truncate", "bom", "invalid_utf8", "trailing", "empty"]))
    return {"none": raw, "truncate": raw[:len(raw) // 2], "bom": b"\xef\xbb\xbf" + raw,
            "invalid_utf8": raw[:1] + b"\xff\xfe" + raw[1:], "trailing": raw + b" x", "empty": b""}[mangle]


@st.composite
def requests(draw, op: Op) -> Request:
    query = []
    for name in draw(st.lists(st.sampled_from(op.query + ("unknown_param", "expected_version")), max_size=4)):
        query.append((name, draw(QUERY_VALUES)))
    headers = {}
    for name in draw(st.lists(st.sampled_from(["Idempotency-Key", "X-Request-Id"]), max_size=2, unique=True)):
        headers[name] = draw(HEADER_VALUES)
    return Request(op=op, target=draw(st.integers(0, 2)), params=draw(path_params(op)), query=bounded_waits(query),
                   role=draw(ROLES),
                   headers=headers, body=draw(bodies(op)),
                   content_type=draw(st.sampled_from(["application/json", None, "text/plain",
                                                      "application/json; charset=latin-1"])))


def bounded_waits(query: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A wait for a version never applied, or a long poll on a quiet topic, is right to take its full time: keep
    every such wait short so the run stays within its budget (the clamping itself is tested by other suites)."""
    out = [(k, SHORT_WAIT_S if k == "wait" and _long_wait(v) else v) for k, v in query]
    if any(k == "min_version" for k, _ in out) and not any(k == "wait" for k, _ in out):
        out.append(("wait", SHORT_WAIT_S))
    return out


def _long_wait(v: str) -> bool:
    try:
        return float(v) > float(SHORT_WAIT_S)
    except ValueError:
        return False


# -- sending and checking --------------------------------------------------------------------------------------------

def quote(value: str) -> str:
    return urllib.parse.quote(encode(value), safe="")


def url_of(c, req: Request) -> yarl.URL:
    base = (c.meta_urls if req.op.service == "meta" else c.broker_urls)[req.target]
    path = re.sub(r"{(\w+)}", lambda m: quote(req.params[m.group(1)]), req.op.path)
    qs = "&".join(f"{quote(k)}={quote(v)}" for k, v in req.query)
    return yarl.URL(base + path + ("?" + qs if qs else ""), encoded=True)


def auth_headers(c, role: str, url: str = "") -> dict[str, str]:
    if role in ("admin", "broker", "client"):
        return c.headers_for(role, url)   # a broker acts as the broker its path names (each has its own token)
    return {"wrong": {"Authorization": "Bearer not-a-token"}, "basic": {"Authorization": "Basic eDp5"},
            "none": {}}[role]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def send(c, req: Request) -> Answer:
    headers = {**auth_headers(c, req.role, str(url_of(c, req))), **req.headers}
    if req.content_type is not None and req.body is not None:
        headers["Content-Type"] = req.content_type
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    phases = RequestPhases()
    try:
        async with c.session.request(req.op.method, url_of(c, req), data=req.body, headers=headers,
                                     timeout=timeout, trace_request_ctx=phases) as r:
            if req.op.stream and r.status == 200:
                return Answer(r.status, dict(r.headers), b"")   # a live stream: its headers are the answer
            return Answer(r.status, dict(r.headers), await r.read())
    except asyncio.TimeoutError:
        stalls = c.loop_stalls.since(phases.started)
        raise AssertionError(f"no answer within {REQUEST_TIMEOUT_S} s: {req.describe()}; the client's phases: "
                             f"{phases}; its loop's stalls meanwhile (s): {stalls}; "
                             f"the node then: {await _node_state(c, req)}") from None
    except aiohttp.ClientError as e:
        raise AssertionError(f"connection failed ({e!r}): {req.describe()}") from None


class RequestPhases:
    """Where one request's time went, by the client's trace signals (the ``fuzzed`` session traces them): a request
    that got no headers within 15 s (GET /v1/watch under the suite's load, 2026-12-02/04/05) left unknown whether it
    waited for a pooled connection, for the connect, for its own loop, or for the node's answer."""

    def __init__(self):
        self.started = time.monotonic()
        self.seen: dict[str, list] = {}   # phase -> [first s, last s, times]

    def mark(self, phase: str) -> None:
        at = round(time.monotonic() - self.started, 3)
        first_last_times = self.seen.setdefault(phase, [at, at, 0])
        first_last_times[1:] = [at, first_last_times[2] + 1]

    def __repr__(self) -> str:
        seen = [f"{phase} at {first}-{last} s ({times}x)" for phase, (first, last, times) in self.seen.items()]
        return ", ".join(seen) or "none"


def _tracing() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    for signal in ("connection_queued_start", "connection_queued_end", "connection_create_start",
                   "connection_create_end", "connection_reuseconn", "request_headers_sent", "request_chunk_sent",
                   "response_chunk_received", "request_end", "request_exception"):
        async def mark(session, ctx, params, phase=signal) -> None:
            if isinstance(ctx.trace_request_ctx, RequestPhases):
                ctx.trace_request_ctx.mark(phase)
        getattr(config, f"on_{signal}").append(mark)
    return config


LAG_PROBE_S = 0.05


class LoopStalls:
    """The test loop's stalls, each longer than ``LAG_PROBE_S`` past its timer, with when they ended: a hang's report
    says whether the client's own loop was held meanwhile."""

    def __init__(self):
        self.stalls: list[tuple[float, float]] = []   # (ended at, monotonic; seconds late)
        self._task: asyncio.Task | None = None

    async def _probe(self) -> None:
        while True:
            due = time.monotonic() + LAG_PROBE_S
            await asyncio.sleep(LAG_PROBE_S)
            late = time.monotonic() - due
            if late > LAG_PROBE_S:
                self.stalls = [*self.stalls[-99:], (time.monotonic(), round(late, 3))]

    def since(self, started: float) -> list[float]:
        return [late for ended, late in self.stalls if ended >= started]

    def __enter__(self) -> "LoopStalls":
        self._task = asyncio.get_running_loop().create_task(self._probe())
        return self

    def __exit__(self, *exc) -> None:
        self._task.cancel()


@pytest.fixture
async def fuzzed(full_cluster):
    """full_cluster whose session traces each request's phases (``RequestPhases``), and whose loop's stalls are
    watched (``LoopStalls``), for the report of a hang."""
    c = full_cluster
    own = c.session
    with LoopStalls() as c.loop_stalls:
        async with aiohttp.ClientSession(trace_configs=[_tracing()]) as traced:
            c.session = traced
            try:
                yield c
            finally:
                c.session = own


_REPORTED_METRICS = ("watch_streams", "open_fds", "stator_meta_raft_ticks_slow", "stator_meta_journal_syncs_slow")


async def _node_state(c, req: Request) -> dict[str, Any]:
    """What the node that did not answer says right after, over a connection of its own: a rare hang of GET /v1/watch
    (no headers within 15 s, 2026-12-02 and 2026-12-04, not reproduced alone) left nothing to go on. The node counts
    no connections; its open descriptors stand for them."""
    base = (c.meta_urls if req.op.service == "meta" else c.broker_urls)[req.target]
    state: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as fresh:
        for path in ("/healthz", "/metrics"):
            started = time.monotonic()
            try:
                async with fresh.get(base + path, headers=auth_headers(c, "admin")) as r:
                    text = await r.text()
                    if path == "/metrics":   # open streams, and descriptors (an accept failing with EMFILE hangs);
                        # ticks and journal syncs long enough to hold the loop the tick runs on (2026-12-04: a
                        # fresh connection's /healthz took 1.54 s, the next request 3 ms)
                        text = "\n".join(line for line in text.splitlines() if not line.startswith("#")
                                         and any(name in line for name in _REPORTED_METRICS))
                    state[path] = {"status": r.status, "s": round(time.monotonic() - started, 3), "body": text[:500]}
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                state[path] = repr(e)
    return state


def check_answer(op: Op, a: Answer, what: str) -> None:
    """The API.md conventions every answer keeps, whatever the request."""
    version_header = "X-Meta-Version" if op.service == "meta" else "X-Route-Version"
    assert version_header in a.headers, f"no {version_header} on HTTP {a.status} {a.body[:300]!r}: {what}"
    if a.status < 300 or a.status == 304:
        return
    try:
        body = json.loads(a.body)
    except ValueError:
        raise AssertionError(f"HTTP {a.status} without a JSON error body {a.body[:300]!r}: {what}") from None
    err = body.get("error") if isinstance(body, dict) else None
    assert isinstance(body, dict) and set(body) == {"error"} and isinstance(err, dict), \
        f"HTTP {a.status} body is not the error shape {body!r}: {what}"
    assert isinstance(err.get("code"), str) and ERROR_CODE_RE.fullmatch(err["code"]), (a.status, err, what)
    assert isinstance(err.get("message"), str) and isinstance(err.get("details"), dict), (a.status, err, what)
    assert a.status < 500 or (a.status == 503 and err["code"] in HONEST_503), \
        f"HTTP {a.status} {err['code']}: {err['message']}: {what}"


async def meta_state(c, node: int) -> dict[str, Any]:
    """What a refused meta write must leave as it was, read from the node that answered it: a consistent read, the
    applied version the same before and after the reads (the live brokers' budget grants move it meanwhile)."""
    m = c.meta_urls[node]

    async def get(path: str) -> Any:
        s, b, _ = await c.call("GET", m + path, timeout_s=REQUEST_TIMEOUT_S)
        assert s in (200, 404), (path, s, b)
        return b

    paths = ("/v1/topics", f"/v1/topics/{TOPIC}", "/v1/brokers")
    for _ in range(20):
        first = (await get("/v1/cluster"))["applied_version"]
        out = dict(zip(paths, await asyncio.gather(*(get(path) for path in paths))))   # at once: one per example
        if (await get("/v1/cluster"))["applied_version"] == first:
            break
    else:
        raise AssertionError("the applied version never held still for one read of the state")
    out["version"] = first
    for b in out["/v1/brokers"]["brokers"]:
        b.pop("last_heartbeat_ms", None)   # moves with every heartbeat of the live brokers
    return out


async def broker_state(c) -> list[Any]:
    """What a refused broker write must leave as it was: the queues' ends, the group's offsets and pop state, on
    every broker."""
    paths = (f"/v1/queues/{TOPIC}", f"/v1/offsets/{GROUP}/{TOPIC}/0", f"/v1/offsets/{GROUP}/{TOPIC}/1",
             f"/v1/pop-stats/{GROUP}")
    reads = [(u, path) for u in c.broker_urls for path in paths]
    answers = await asyncio.gather(*(c.call("GET", u + path, role="client", timeout_s=REQUEST_TIMEOUT_S)
                                     for u, path in reads))   # at once: two of these per refused example
    out = []
    for (u, path), (s, b, _) in zip(reads, answers):
        if path.startswith("/v1/pop-stats/"):
            # Pop state of the group: what a refused pop, ack or change of invisible time must leave (the counts
            # that move with the clock alone, invisible and revive backlog, are left out).
            out.append((u, "pop", s, [(q["topic"], q["queue"], q["pop_offset"], q["in_flight"], q["frozen"])
                                      for q in b["queues"]] if s == 200 else b))
        else:
            out.append((u, path, s, b))
    return out


async def events_between(c, node: int, after: int, upto: int) -> list[dict[str, Any]]:
    s, b, _ = await c.call("GET", c.meta_urls[node] + f"/v1/history?after={after}&limit={upto - after}")
    assert s == 200, b
    return [e for e in b["events"] if e["version"] <= upto]


async def assert_unchanged_meta(c, node: int, before: dict[str, Any], what: str) -> None:
    after = await meta_state(c, node)
    if after["version"] != before["version"]:
        own = [e for e in await events_between(c, node, before["version"], after["version"])
               if e["type"] not in BACKGROUND_EVENTS or e["data"].get("broker") == FAKE_BROKER
               and e["type"] != "BrokerFenced"]
        assert not own, f"a refused request changed the log: {own}: {what}"
        return   # the cluster's own events (fencing, budgets) moved the version: compare what they cannot touch
    changed = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert not changed, f"a refused request changed the state: {changed}: {what}"


def bounded_pop_wait(req: Request) -> Request:
    """A pop's long poll on a quiet topic is right to take its full wait_ms: keep it short, like ``bounded_waits``."""
    if req.op.path != "/v1/pop/{topic}" or not req.body:
        return req
    try:
        body = json.loads(req.body)
    except (ValueError, RecursionError):
        return req
    short_ms = int(float(SHORT_WAIT_S) * 1000)
    if isinstance(body, dict) and type(body.get("wait_ms")) is int and body["wait_ms"] > short_ms:
        body["wait_ms"] = short_ms
        return Request(req.op, req.target, req.params, req.query, req.role, req.headers,
                       json.dumps(body).encode(), req.content_type)
    return req


async def fuzz_one(c, req: Request) -> None:
    req = bounded_pop_wait(req)
    what = req.describe()
    before = None
    if req.op.mutating:
        before = await (meta_state(c, req.target) if req.op.service == "meta" else broker_state(c))
    a = await send(c, req)
    check_answer(req.op, a, what)
    if before is None or not 400 <= a.status < 500:
        if req.op.method == "DELETE" and a.status == 200 and req.params.get("topic") == TOPIC:
            await ensure_topic(c)
        return
    if req.op.service == "meta":
        await assert_unchanged_meta(c, req.target, before, what)
    else:
        after = await broker_state(c)
        assert after == before, f"a refused broker write changed the data: {before} -> {after}: {what}"


# -- the cluster under test ------------------------------------------------------------------------------------------

async def ensure_topic(c) -> None:
    s, b, _ = await c.call("POST", c.meta_urls[0] + "/v1/topics",
                           json={"topic": TOPIC, "queues": 2, "brokers": list(REAL_BROKERS[:2])})
    assert s in (201, 409), b


async def prepare(c) -> None:
    """A topic whose queue 0 moved from b1 to b2 (so reads cross brokers), a message in it, an offset committed on
    each broker, and a registered fake broker for the broker calls."""
    m = c.meta_urls[0]
    await ensure_topic(c)
    s, b, _ = await c.call("PUT", m + f"/v1/brokers/{FAKE_BROKER}", role="broker",
                           json={"address": "http://127.0.0.1:1"})
    assert s == 200, b
    s, b, _ = await c.call("POST", c.broker_urls[0] + f"/v1/messages/{TOPIC}/0", role="client",
                           json={"messages": [{"body": "before the move", "key": "k"}]})
    assert s == 200, b
    s, b, _ = await c.call("PUT", c.broker_urls[0] + f"/v1/offsets/{GROUP}/{TOPIC}/0", role="client",
                           json={"offset": 0})
    assert s == 200, b
    s, b, _ = await c.call("POST", m + f"/v1/topics/{TOPIC}/remap", json={"brokers": ["b2"], "queues": [0]})
    assert s == 200, b
    await until(lambda: writable_on(c, 1), "queue 0 writable on b2 after the remap")
    s, b, _ = await c.call("PUT", c.broker_urls[1] + f"/v1/offsets/{GROUP}/{TOPIC}/0", role="client",
                           json={"offset": 1})
    assert s == 200, b


async def writable_on(c, broker: int) -> bool:
    s, _, _ = await c.call("POST", c.broker_urls[broker] + f"/v1/messages/{TOPIC}/0", role="client",
                           json={"messages": [{"body": "after the move"}]})
    return s == 200


async def until(probe, what: str, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await probe():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


async def assert_cluster_healthy(c) -> None:
    """Every meta node agrees on one applied version, history serves, and a new write goes end to end."""
    async def agreed() -> bool:
        versions = set()
        for u in c.meta_urls:
            s, b, _ = await c.call("GET", u + "/v1/cluster", timeout_s=REQUEST_TIMEOUT_S)
            if s != 200:
                return False
            versions.add(b["applied_version"])
        return len(versions) == 1
    await until(agreed, "every meta node serves /v1/cluster at one applied version")
    for u in c.meta_urls:
        s, b, _ = await c.call("GET", u + "/v1/history?limit=5")
        assert s == 200 and b["events"], b
    s, b, _ = await c.call("POST", c.meta_urls[1] + "/v1/topics",
                           json={"topic": "after-fuzz", "queues": 1, "brokers": ["b3"]})
    assert s == 201, b
    version = b["version"]
    s, route, _ = await c.call("GET", c.meta_urls[2] + f"/v1/routes/after-fuzz?min_version={version}")
    assert s == 200, route
    head = route["queues"][0]["address"]

    async def sent() -> bool:
        s, b, _ = await c.call("POST", head + "/v1/messages/after-fuzz/0", role="client",
                               json={"messages": [{"body": "still works", "key": "k"}]})
        return s == 200
    await until(sent, "a send to the new topic")
    s, b, _ = await c.call("GET", head + "/v1/messages/after-fuzz/0?offset=0", role="client")
    assert s == 200 and [m["body"] for m in b["messages"]] == ["still works"], b


class LoopRunner:
    """Runs coroutines on the test's loop from the hypothesis worker thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def __call__(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(RUN_TIMEOUT_S)


@pytest.mark.long(seconds=65)   # its module alone, measured on 2 cores (tests/conftest.py)
@pytest.mark.slow
async def test_every_operation_keeps_the_contract_whatever_the_input(fuzzed):
    c = fuzzed
    await prepare(c)
    run = LoopRunner(asyncio.get_running_loop())
    sent = []

    def fuzz(op: Op) -> None:
        @settings(max_examples=FUZZ_EXAMPLES_PER_OP, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate],   # shrinking would replay hundreds of real requests
                  suppress_health_check=list(HealthCheck))
        @given(req=requests(op))
        def one_op(req: Request) -> None:
            sent.append(req.op)
            run(fuzz_one(c, req))
        one_op()

    for op in ALL_OPS:   # one hypothesis run per operation: each gets its share of the examples
        await asyncio.to_thread(fuzz, op)
    assert set(sent) == set(ALL_OPS)
    await assert_cluster_healthy(c)


# -- big and raw inputs, each sent once to every operation that takes a body ------------------------------------------

def _object_of(field_name: str, value_text: str) -> bytes:
    return encode("{" + render(field_name, True) + ":" + value_text + "}")


def _sized(op: Op, total_bytes: int) -> bytes:
    """An object of the op's first field (or "k") holding one string, ``total_bytes`` long in all."""
    name = op.fields[0] if op.fields else "k"
    frame = len(_object_of(name, '""'))
    return _object_of(name, '"' + "x" * (total_bytes - frame) + '"')


def big_bodies(op: Op) -> list[tuple[str, bytes]]:
    limit = META_BODY_BYTES_MAX if op.service == "meta" else BROKER_BODY_BYTES_MAX
    name = op.fields[0] if op.fields else "k"
    items = BIG_COLLECTION_ITEMS
    out = [
        ("deep array", b"[" * DEEP_ARRAY_LEVELS),
        ("deep object", b'{"a":' * DEEP_OBJECT_LEVELS + b"1" + b"}" * DEEP_OBJECT_LEVELS),
        ("deep object in a field", _object_of(name, '{"a":' * DEEP_OBJECT_LEVELS + "1" + "}" * DEEP_OBJECT_LEVELS)),
        (f"{items}-item list", _object_of(name, "[" + ",".join(["0"] * items) + "]")),
        (f"{items + 1}-key object", encode("{" + ",".join(f'"k{i}":"v"' for i in range(items + 1)) + "}")),
        (f"{items}-key object in a field", _object_of(name, "{" + ",".join(f'"q{i}":1' for i in range(items)) + "}")),
        (f"{items} messages", _object_of("messages", "[" + ",".join(['{"body":"x"}'] * items) + "]")),
        ("body one byte under the limit", _sized(op, limit - 1)),
        ("body at the limit", _sized(op, limit)),
        ("body one byte over the limit", _sized(op, limit + 1)),
        ("duplicate keys", encode("{" + ",".join(f'"{f}":"a","{f}":1' for f in op.fields or ("k",)) + "}")),
        ("lone surrogate key", b'{"\\udbff": 1}'),
        ("encoded surrogate value", _object_of(name, '"\udc80"')),   # encode() writes it as bytes ED B2 80
    ]
    for value in ("NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 5000, str(2**64), "-1", "1.5",
                  '"\\ud800"', '"a\\udfff"', '"\\ud83d\\ude00"', "null", "[]", "{}", "true"):
        out.append((f"{value[:12]} in every field", _every_field(op, value)))
    return out


def _every_field(op: Op, value_text: str) -> bytes:
    return encode("{" + ",".join(f'"{f}":{value_text}' for f in op.fields or ("k",)) + "}")


def deterministic_requests() -> list[tuple[str, Request]]:
    params = {"topic": TOPIC, "queue": "0", "broker": FAKE_BROKER, "group": GROUP, "pq": "nope", "node": "fz-node"}
    out = []
    for op in BODY_OPS:
        role = "broker" if "/brokers/" in op.path else "client" if op.service == "broker" else "admin"
        wanted = dict((k, params[k]) for k in re.findall(r"{(\w+)}", op.path))
        for label, body in big_bodies(op):
            out.append((label, Request(op=op, target=1, params=wanted, query=[], role=role, headers={}, body=body)))
    return out


@pytest.mark.slow
async def test_big_and_malformed_bodies_keep_the_contract(fuzzed):
    """Every body-taking operation, each once with deep nesting, 100,000-item collections, bodies around its
    service's size limit and special numbers and surrogates in every field: all answers keep the contract and no
    refusal changes anything. Every violation is listed, not only the first."""
    c = fuzzed
    await prepare(c)
    violations = []
    for label, req in deterministic_requests():
        try:
            await fuzz_one(c, req)
        except AssertionError as e:
            violations.append(f"{label}: {_short(str(e), 900)}")
    await assert_cluster_healthy(c)
    assert not violations, "\n".join(violations)


# -- bytes the aiohttp client will not send: raw HTTP/1.1 over a socket ------------------------------------------------

RAW_HEADER_VALUES = [b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"caf\xc3\xa9", b"x" * 10_000, b"x" * 8_000]
RAW_TARGETS = {
    "meta": [b"/v1/topics/%ff%fe", b"/v1/topics/\xff\xfe", b"/v1/topics/%ed%a0%80", b"/v1/topics/fz?min_version=%ff",
             b"/v1/history?topic=%ed%a0%80&limit=1", b"/v1/routes/fz?after=" + b"9" * 10_000],
    "broker": [b"/v1/queues/%ff%fe", b"/v1/queues/\xff\xfe", b"/v1/messages/%ed%a0%80/0", b"/v1/offsets/%ff/fz/0",
               b"/v1/physical/%ed%a0%80", b"/v1/messages/fz/0?offset=" + b"9" * 10_000],
}


async def raw_request(url: str, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                      body: bytes = b"") -> Answer:
    """One request written byte for byte; the answer is read to the end of the connection."""
    u = yarl.URL(url)
    reader, writer = await asyncio.open_connection(u.host, u.port)
    try:
        head = [method + b" " + target + b" HTTP/1.1", b"Host: " + f"{u.host}:{u.port}".encode(),
                b"Connection: close", b"Content-Length: " + str(len(body)).encode()]
        head += [k + b": " + v for k, v in headers]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), REQUEST_TIMEOUT_S)
    finally:
        writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    header_block, _, payload = rest.partition(b"\r\n\r\n")
    answer_headers = dict(line.decode("latin-1").split(": ", 1) for line in header_block.split(b"\r\n") if line)
    return Answer(int(status_line.split()[1]), answer_headers, payload)


RAW_WRITES = {"meta": ("/v1/topics/{topic}/config", "admin"),
              "broker": ("/v1/offsets/{group}/{topic}/{queue}", "client")}


def raw_cases(c) -> list[tuple[Op, str, bytes, bytes, list[tuple[bytes, bytes]]]]:
    """(op, url, method, target, headers): bad header bytes on a write of each service, bad path bytes on reads."""
    cases = []
    for service, (path, role) in RAW_WRITES.items():
        op = op_named("PUT", path)
        url = (c.meta_urls if service == "meta" else c.broker_urls)[1]
        target = path.format(topic=TOPIC, group=GROUP, queue=0).encode()
        auth = [(b"Authorization", c.headers(role)["Authorization"].encode())]
        for name in (b"Idempotency-Key", b"X-Request-Id", b"Authorization", b"Last-Event-ID"):
            for value in RAW_HEADER_VALUES:
                hs = [(name, value)] + ([] if name == b"Authorization" else auth)
                cases.append((op, url, b"PUT", target, hs))
        for bad_target in RAW_TARGETS[service]:
            cases.append((op, url, b"GET", bad_target, auth))
    return cases


@pytest.mark.slow
async def test_raw_header_and_path_bytes_keep_the_contract(fuzzed):
    """Header values that are not ASCII or not UTF-8 or 10,000 bytes long, and paths and queries with invalid
    UTF-8 or 10,000-digit numbers: every answer keeps the contract (error shape, version header, no 5xx) and a
    refused write changes nothing. Every violation is listed."""
    c = fuzzed
    await prepare(c)
    violations = []
    for op, url, method, target, headers in raw_cases(c):
        what = f"{method.decode()} {url} {target[:80]!r} headers={_short(headers, 200)}"
        before = await (meta_state(c, 1) if op.service == "meta" else broker_state(c))
        body = b'{"k": "v"}' if op.service == "meta" else b'{"offset": 1}'
        try:
            a = await raw_request(url, method, target, headers, body if method == b"PUT" else b"")
            if any(byte >= 0x80 for byte in target):
                # Not HTTP: a request line holds no byte a URL may not (RFC 9112). aiohttp's parser refuses it with a
                # plain 400 before any code of the service runs, so there is no service answer to keep a shape for.
                assert a.status == 400, f"a request line with raw non-ASCII bytes got HTTP {a.status}: {what}"
            else:
                check_answer(op, a, what)
            if 400 <= a.status < 500 and method == b"PUT":
                if op.service == "meta":
                    await assert_unchanged_meta(c, 1, before, what)
                else:
                    assert await broker_state(c) == before, f"a refused write changed the data: {what}"
        except (AssertionError, asyncio.TimeoutError, ConnectionError, ValueError, IndexError) as e:
            violations.append(f"{what}: {_short(str(e) or repr(e), 500)}")
    await assert_cluster_healthy(c)
    assert not violations, f"{len(violations)} violations:\n" + "\n".join(violations)


async def test_a_group_name_with_url_characters_reads_only_its_own_offset(fuzzed):
    """A broker asks the brokers of older segments for a group's offset it does not hold; the group name went into
    that request's path unescaped, so a group named "fzg/fz/0?" read group fzg's offset from the older broker."""
    c = fuzzed
    await prepare(c)
    for group in (f"{GROUP}/{TOPIC}/0?", f"{GROUP}/{TOPIC}/0#", "never-committed"):
        a = await send(c, Request(op=op_named("GET", "/v1/offsets/{group}/{topic}/{queue}"), target=1,
                                  params={"group": group, "topic": TOPIC, "queue": "0"}, query=[], role="client",
                                  headers={}))
        assert a.status == 200 and json.loads(a.body) == {"offset": -1}, (group, a.status, a.body)
