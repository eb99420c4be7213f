"""The binary batch on real brokers (issue 23): a send as a batch (Content-Type: application/vnd.stator.batch) or as
JSON, a pull as a STORED batch (Accept) or as JSON, and the two forms interoperate byte for byte.

A message is stored in the form it came in and converted at the edge only when the forms differ, so a message sent
in one form reads back in the other with the same body bytes, key, props and text-ness. Damaged batches (the
"refused" vectors of tests/vectors/batch-v2.json) are refused before anything is stored. One cluster (one meta node,
two brokers) serves the module; each test has its own topic.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
import time

import pytest
import pytest_asyncio

from broker.storage.limits import RECORD_BYTES_MAX
from broker.writes import MESSAGES_PER_SEND_MAX
from tests.support import cluster as cluster_mod
from tests.support.broker_http import admin, all_writable, wait_route
from tests.support.meta_http import ok, wait_until
from wire import batch
from wire.batch import Message

live = pytest.mark.asyncio(loop_scope="module")
pytestmark = live

VECTORS = json.load(open(os.path.join(os.path.dirname(__file__), "vectors", "batch-v2.json")))
BATCH = {"Content-Type": batch.CONTENT_TYPE}
WANT_BATCH = {"Accept": batch.CONTENT_TYPE}

# Messages each form must carry unchanged: text and binary bodies, keys absent, empty and non-ASCII, properties.
MESSAGES = [
    Message(None, {}, b"hello", True),
    Message("order-17", {"trace": "a1", "zone": "eu"}, b"\x00\x01\x02\xff", False),
    Message("cl\u00e9", {}, "caf\u00e9 \u20ac \U0001f600 \"q\" \\ \n\x7f".encode(), True),
    Message("", {"": ""}, b"x", False),
    Message(None, {"n\u00e9": "v\u00e9"}, b"", False),
    Message(None, {}, b"", True),
    Message("k", {}, bytes(range(256)), False),
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory):
    async with cluster_mod.running(str(tmp_path_factory.mktemp("binary")), 1, 2,
                                   meta={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}) as c:
        yield c


async def topic(c, name: str, brokers=("b1",)) -> dict:
    await ok(c, "POST", "/v1/topics", json={"topic": name, "queues": 1, "brokers": list(brokers)}, expect=(201,))
    return await wait_route(c, name, all_writable)


async def post(c, name: str, data: bytes | None = None, json_body=None, headers=None, deadline_s: float = 30.0):
    """A send to queue 0's writable head, following the route while the broker learns it (404/409/503)."""
    deadline = time.monotonic() + deadline_s
    while True:
        r = await wait_route(c, name, all_writable)
        addr = r["queues"][0]["address"]
        s, b, _ = await c.call("POST", f"{addr}/v1/messages/{name}/0", "client", json=json_body, data=data,
                               headers=headers)
        if s not in (404, 409, 503) or time.monotonic() > deadline:
            return s, b
        await asyncio.sleep(0.1)


async def send_batch(c, name: str, messages: list[Message]) -> list[int]:
    s, b = await post(c, name, data=batch.encode(messages), headers=BATCH)
    assert s == 200, b
    assert set(b) >= {"queue", "offsets"}, b
    return b["offsets"]


async def send_json(c, name: str, messages: list[dict]) -> list[int]:
    s, b = await post(c, name, json_body={"messages": messages})
    assert s == 200, b
    return b["offsets"]


async def head(c, name: str) -> str:
    return (await wait_route(c, name, all_writable))["queues"][0]["address"]


async def pull_json(c, name: str, offset: int = 0, max_n: int = 1000) -> dict:
    s, b, h = await c.call("GET", f"{await head(c, name)}/v1/messages/{name}/0?offset={offset}&max={max_n}", "client")
    assert s == 200 and h["Content-Type"].startswith("application/json"), (s, b)
    return b


async def pull_binary(c, name: str, offset: int = 0, max_n: int = 1000) -> tuple[bytes, dict]:
    """A binary pull's body and its X-Pull fields."""
    url = f"{await head(c, name)}/v1/messages/{name}/0?offset={offset}&max={max_n}"
    async with c.session.get(url, headers=c.headers("client", **WANT_BATCH)) as r:
        body = await r.read()
        assert r.status == 200, body[:500]
        assert r.headers["Content-Type"] == batch.CONTENT_TYPE
        assert "X-Route-Version" in r.headers
        return body, json.loads(r.headers["X-Pull"])


def stored_runs(raw: bytes) -> list[tuple[int, int, int, bytes]]:
    """A STORED batch's runs as (offset, ts_ms, count, sized records), read by hand, not by wire.batch."""
    magic, version, kind, count, length, crc = batch.HEADER.unpack_from(raw)
    assert (magic, version, kind, length) == (batch.MAGIC, 2, batch.STORED, len(raw) - batch.HEADER_BYTES)
    out, pos = [], batch.HEADER_BYTES
    while pos < len(raw):
        offset, ts_ms, run_count, run_bytes = struct.unpack_from("<QQII", raw, pos)
        pos += 24
        out.append((offset, ts_ms, run_count, raw[pos:pos + run_bytes]))
        pos += run_bytes
    assert pos == len(raw) and sum(r[2] for r in out) == count
    return out


def stored_records(raw: bytes) -> list[tuple[int, int, bytes]]:
    """A STORED batch's (offset, ts_ms, record bytes), read by hand: the raw records must be the senders' own."""
    out = []
    for offset, ts_ms, count, records in stored_runs(raw):
        pos = 0
        for i in range(count):
            (size,) = struct.unpack_from("<I", records, pos)
            out.append((offset + i, ts_ms, records[pos + 4:pos + 4 + size]))
            pos += 4 + size
        assert pos == len(records)
    return out


def as_json(m: Message) -> dict:
    """What a JSON reader must see of ``m``: "body" for text, else "body_b64"."""
    body = {"body": m.body.decode()} if m.text else {"body_b64": base64.b64encode(m.body).decode()}
    return {"key": m.key, "props": dict(m.props or {}), **body}


def of_json(m: dict) -> Message:
    body = m["body"].encode() if "body" in m else base64.b64decode(m["body_b64"])
    return Message(m.get("key"), m.get("props") or {}, body, "body" in m)


def fields(m: dict) -> dict:
    return {k: v for k, v in m.items() if k in ("key", "props", "body", "body_b64")}


async def max_offset(c, name: str) -> int:
    s, b, _ = await c.call("GET", f"{await head(c, name)}/v1/queues/{name}", "client")
    assert s == 200, b
    return b["queues"][0]["max_offset"]


# -- interoperation ------------------------------------------------------------------------------------------------

async def test_a_binary_send_reads_back_the_same_in_json_and_in_binary(cluster):
    c = cluster
    await topic(c, "bin2json")
    assert await send_batch(c, "bin2json", MESSAGES) == list(range(len(MESSAGES)))
    for vector in VECTORS["send"]:   # the vectors' batches as they are, byte for byte
        s, b = await post(c, "bin2json", data=bytes.fromhex(vector["batch_hex"]), headers=BATCH)
        assert s == 200, (vector["description"], b)
    expected = MESSAGES + [Message(m["key"], m["props"], bytes.fromhex(m["body_hex"]), m["text"])
                           for v in VECTORS["send"] for m in v["messages"]]
    got = await pull_json(c, "bin2json")
    assert [m["offset"] for m in got["messages"]] == list(range(len(expected)))
    assert [fields(m) for m in got["messages"]] == [as_json(m) for m in expected]
    raw, rest = await pull_binary(c, "bin2json")
    assert rest == {"next_offset": len(expected), "min_offset": 0, "max_offset": len(expected)}, rest
    records = stored_records(raw)
    assert [r for _, _, r in records] == [batch.record(m) for m in expected], "stored records served as they came"
    assert [(o, ts) for o, ts, _ in records] == [(m["offset"], m["ts"]) for m in got["messages"]]
    assert [m for _, _, m in batch.decode_stored(raw)] == expected
    # Each send is one run, its records the very bytes the sender's batch carried after its header.
    sends = [batch.encode(MESSAGES)] + [bytes.fromhex(v["batch_hex"]) for v in VECTORS["send"]]
    assert [records for _, _, _, records in stored_runs(raw)] == [b[batch.HEADER_BYTES:] for b in sends]


async def test_a_json_send_reads_back_the_same_in_binary(cluster):
    c = cluster
    await topic(c, "json2bin")
    sent = [{"body": "hello"}, {"body_b64": "AAEC/w==", "key": "order-17", "props": {"trace": "a1", "zone": "eu"}},
            {"body": "caf\u00e9 \u20ac \U0001f600 \"q\" \\ \n\x7f", "key": "cl\u00e9"},
            {"body_b64": "", "key": "", "props": {"": ""}}, {"body": "", "key": None, "props": None},
            {"body_b64": base64.b64encode(bytes(range(256))).decode(), "props": {"n\u00e9": "v\u00e9"}}]
    assert await send_json(c, "json2bin", sent) == list(range(len(sent)))
    raw, rest = await pull_binary(c, "json2bin")
    assert rest["next_offset"] == rest["max_offset"] == len(sent), rest
    expected = [of_json(m) for m in sent]
    assert [m for _, _, m in batch.decode_stored(raw)] == expected
    assert [r for _, _, r in stored_records(raw)] == [batch.record(m) for m in expected]
    got = await pull_json(c, "json2bin")
    assert [fields(m) for m in got["messages"]] == [{"key": m.get("key"), "props": m.get("props") or {},
                                                    **{k: m[k] for k in ("body", "body_b64") if k in m}}
                                                   for m in sent]
    # Part way, and past the end: the same fields as the JSON answer, in X-Pull, and an empty batch.
    raw, rest = await pull_binary(c, "json2bin", offset=2, max_n=2)
    assert [o for o, _, _ in stored_records(raw)] == [2, 3] and rest["next_offset"] == 4, rest
    raw, rest = await pull_binary(c, "json2bin", offset=len(sent))
    assert raw == batch.empty_stored() and rest == {"next_offset": len(sent), "min_offset": 0,
                                                    "max_offset": len(sent)}, rest


async def test_a_text_body_that_is_not_utf8_reads_as_body_b64_in_json(cluster):
    """The broker never reads a batch's bodies: a record marked text whose body is not UTF-8 is kept as sent (the
    binary reader gets it back as it was), and a JSON reader, which cannot carry it as text, gets body_b64."""
    c = cluster
    await topic(c, "badtext")
    await send_batch(c, "badtext", [Message("k", {}, b"\xff\xfe", True)])
    got = await pull_json(c, "badtext")
    assert fields(got["messages"][0]) == {"key": "k", "props": {}, "body_b64": "//4="}
    raw, _ = await pull_binary(c, "badtext")
    assert [m for _, _, m in batch.decode_stored(raw)] == [Message("k", {}, b"\xff\xfe", True)]


async def test_accept_negotiates_and_errors_stay_json(cluster):
    c = cluster
    await topic(c, "accept")
    await send_batch(c, "accept", MESSAGES[:2])
    url = f"{await head(c, 'accept')}/v1/messages/accept/0?offset=0"
    for accept, binary in ((None, False), ("application/json", False), ("*/*", False),
                           (batch.CONTENT_TYPE, True), (f"application/json;q=0.5, {batch.CONTENT_TYPE}", True),
                           (f"{batch.CONTENT_TYPE};q=0.2, application/json", False),
                           (f"{batch.CONTENT_TYPE};q=0", False)):
        headers = c.headers("client", **({"Accept": accept} if accept else {}))
        async with c.session.get(url, headers=headers) as r:
            assert r.status == 200
            assert (r.headers["Content-Type"] == batch.CONTENT_TYPE) == binary, (accept, r.headers)
            assert ("X-Pull" in r.headers) == binary
    for path, status, code in (("/v1/messages/nope/0", 404, "TOPIC_NOT_FOUND"),
                               ("/v1/messages/accept/0?offset=-1", 400, "INVALID_ARGUMENT")):
        async with c.session.get(f"{await head(c, 'accept')}{path}", headers=c.headers("client", **WANT_BATCH)) as r:
            assert r.status == status and r.headers["Content-Type"].startswith("application/json")
            assert (await r.json())["error"]["code"] == code


# -- refusals --------------------------------------------------------------------------------------------------------

async def test_every_refused_vector_is_400_and_stores_nothing(cluster):
    c = cluster
    await topic(c, "refused")
    await send_batch(c, "refused", MESSAGES[:1])
    for vector in VECTORS["refused"]:
        s, b = await post(c, "refused", data=bytes.fromhex(vector["batch_hex"]), headers=BATCH)
        assert (s, b["error"]["code"]) == (400, "INVALID_ARGUMENT"), (vector["description"], s, b)
        assert await max_offset(c, "refused") == 1, f"{vector['description']}: something was stored"
    good = batch.encode(MESSAGES)
    damaged = [good[:-1] + bytes([good[-1] ^ 1]), good[:len(good) // 2], good + b"\x00", b"",
               good[:batch.HEADER_BYTES], b"SB\x01\x00" + b"\xff" * 12]
    for raw in damaged:
        s, b = await post(c, "refused", data=raw, headers=BATCH)
        assert (s, b["error"]["code"]) == (400, "INVALID_ARGUMENT"), (raw[:40], s, b)
    # A type that is neither JSON nor the batch's: 415, named; the body is not read.
    for kind in ("text/plain", "application/xml", "application/vnd.stator.batch2"):
        s, b = await post(c, "refused", data=good, headers={"Content-Type": kind})
        assert (s, b["error"]["code"]) == (415, "INVALID_ARGUMENT"), (kind, s, b)
        assert kind in b["error"]["message"]
    # A batch sent as JSON is not JSON; JSON sent as a batch is not a batch.
    s, b = await post(c, "refused", data=good, headers={"Content-Type": "application/json"})
    assert (s, b["error"]["code"]) == (400, "INVALID_ARGUMENT"), b
    s, b = await post(c, "refused", data=b'{"messages":[{"body":"a"}]}', headers=BATCH)
    assert (s, b["error"]["code"]) == (400, "INVALID_ARGUMENT"), b
    # A JSON body_b64 that is not base64 has no bytes a binary reader could be given: refused whole, by name.
    for bad in ("AAE", "AA=E", "not base64!", "AAEC/w==x"):
        s, b = await post(c, "refused", json_body={"messages": [{"body": "ok"}, {"body_b64": bad}]})
        assert (s, b["error"]["code"], b["error"]["details"].get("field")) == (400, "INVALID_ARGUMENT", "body_b64"), \
            (bad, s, b)
    assert await max_offset(c, "refused") == 1
    # JSON under the types tools put on a body whose caller named none is still taken as JSON.
    for kind in ("application/json; charset=utf-8", "application/octet-stream", None):
        s, b = await post(c, "refused", data=b'{"messages":[{"body":"a"}]}',
                          headers={"Content-Type": kind} if kind else None)
        assert s == 200, (kind, s, b)
    assert await max_offset(c, "refused") == 4


async def test_sizes_at_the_limits(cluster):
    c = cluster
    await topic(c, "limits")
    lead = batch.LEAD_BYTES
    largest = Message("k", {}, os.urandom(RECORD_BYTES_MAX - lead - 1), False)
    assert len(batch.record(largest)) == RECORD_BYTES_MAX
    assert await send_batch(c, "limits", [largest]) == [0]
    s, b = await post(c, "limits", data=batch.encode([largest._replace(body=largest.body + b"!")]), headers=BATCH)
    assert (s, b["error"]["code"]) == (413, "TOO_LARGE"), b
    assert await max_offset(c, "limits") == 1
    raw, _ = await pull_binary(c, "limits", max_n=1)
    assert [r for _, _, r in stored_records(raw)] == [batch.record(largest)]

    many = [Message(None, {}, b"%d" % i, True) for i in range(MESSAGES_PER_SEND_MAX)]
    assert await send_batch(c, "limits", many) == list(range(1, MESSAGES_PER_SEND_MAX + 1))
    s, b = await post(c, "limits", data=batch.encode(many + many[:1]), headers=BATCH)
    assert (s, b["error"]["code"]) == (413, "TOO_LARGE"), b
    assert await max_offset(c, "limits") == MESSAGES_PER_SEND_MAX + 1
    got = await pull_json(c, "limits", offset=1, max_n=1000)
    assert [m["body"] for m in got["messages"]] == [str(i) for i in range(1000)]


# -- across brokers, pop and dead letters ----------------------------------------------------------------------------

async def test_a_binary_pull_across_a_remap_reads_the_older_segment_from_its_broker(cluster):
    c = cluster
    await topic(c, "moved", brokers=("b1",))
    first = MESSAGES[:4]
    await send_batch(c, "moved", first)
    await send_json(c, "moved", [{"body_b64": "AP8=", "key": "j"}])
    s, b = await admin(c, "POST", 0, "/v1/topics/moved/remap", json={"brokers": ["b2"], "queues": [0]})
    assert s == 200, b
    r = await wait_route(c, "moved", lambda r: r["queues"][0]["writable"] and r["queues"][0]["broker"] == "b2")
    assert r["queues"][0]["address"] == c.url("b2")
    second = MESSAGES[4:]
    assert await send_batch(c, "moved", second) == list(range(5, 5 + len(second)))
    expected = first + [Message("j", {}, b"\x00\xff", False)] + second
    raw, rest = await pull_binary(c, "moved")   # at b2, which reads offsets 0-4 from b1
    assert rest["next_offset"] == rest["max_offset"] == len(expected) and rest["min_offset"] == 0, rest
    assert [r for _, _, r in stored_records(raw)] == [batch.record(m) for m in expected]
    got = await pull_json(c, "moved")
    assert [fields(m) for m in got["messages"]] == [as_json(m) for m in expected]
    # The physical read between brokers carries each form byte-exact: a JSON object as "payload", a record as
    # "payload_b64".
    segs = r["queues"][0]["segments"]
    s, phys, _ = await c.call("GET", f"{c.url('b1')}/v1/physical/{segs[0]['physical_queue']}?offset=0&max=10",
                              "broker")
    assert s == 200, phys
    kinds = [("payload_b64" in rec, "payload" in rec) for rec in phys["records"]]
    assert kinds == [(True, False)] * 4 + [(False, True)], phys
    assert [base64.b64decode(rec["payload_b64"]) for rec in phys["records"][:4]] == [batch.record(m) for m in first]


async def test_pop_and_dead_letters_of_binary_sent_messages_are_json(cluster):
    c = cluster
    await ok(c, "PUT", "/v1/groups/bin-dl/config", json={"max_attempts": 1})
    await topic(c, "binpop", brokers=("b1",))
    await send_batch(c, "binpop", MESSAGES[:3])
    b1 = c.url("b1")
    await asyncio.sleep(0.5)   # the broker hears of the group's config from meta's watch stream
    s, popped, _ = await c.call("POST", f"{b1}/v1/pop/binpop", "client",
                                json={"group": "bin-dl", "max": 10, "invisible_ms": 1000})
    assert s == 200, popped
    got = sorted(popped["messages"], key=lambda m: m["offset"])
    assert [fields(m) for m in got] == [as_json(m) for m in MESSAGES[:3]]
    s, acked, _ = await c.call("POST", f"{b1}/v1/ack", "client",
                               json={"group": "bin-dl", "handles": [m["handle"] for m in got[1:]]})
    assert s == 200 and all(r["ok"] for r in acked["results"]), acked

    async def dead_lettered():
        s, b, _ = await c.call("GET", f"{b1}/v1/dlq/bin-dl?offset=0&max=10", "client")
        return b["messages"] if s == 200 and b["messages"] else None
    dlq = await wait_until(dead_lettered, 15, "the message in the DLQ")
    assert [(m["topic"], m["queue"], m["origin_offset"]) for m in dlq] == [("binpop", 0, 0)]
    assert fields(dlq[0]) == as_json(MESSAGES[0])


async def test_a_binary_pop_answers_both_forms_byte_identical_and_its_handles_ack(cluster):
    c = cluster
    await topic(c, "popbin", brokers=("b1",))
    await send_batch(c, "popbin", MESSAGES)
    sent_json = [{"body": "caf\u00e9", "key": "k"}, {"body_b64": "AP8=", "props": {"p": "1"}}]
    await send_json(c, "popbin", sent_json)
    expected = MESSAGES + [of_json(m) for m in sent_json]
    b1 = c.url("b1")
    async with c.session.post(f"{b1}/v1/pop/popbin", json={"group": "popbin-g", "max": 100, "invisible_ms": 5000},
                              headers=c.headers("client", **WANT_BATCH)) as r:
        raw = await r.read()
        assert r.status == 200 and r.headers["Content-Type"] == batch.CONTENT_TYPE, raw[:300]
    deliveries = sorted(batch.decode_popped(raw), key=lambda d: d[1])
    assert [(q, o, a) for q, o, a, _, _ in deliveries] == [(0, i, 1) for i in range(len(expected))]
    assert [m for _, _, _, _, m in deliveries] == expected
    s, acked, _ = await c.call("POST", f"{b1}/v1/ack", "client",
                               json={"group": "popbin-g", "handles": [h for _, _, _, h, _ in deliveries]})
    assert s == 200 and [r["ok"] for r in acked["results"]] == [True] * len(expected), acked
    async with c.session.post(f"{b1}/v1/pop/popbin", json={"group": "popbin-g", "max": 100, "wait_ms": 0},
                              headers=c.headers("client", **WANT_BATCH)) as r:
        assert r.status == 200 and batch.decode_popped(await r.read()) == []   # all acked: an empty POPPED batch
