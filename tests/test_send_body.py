"""The send hot path (broker/api/send_body.py, codec.encode_message with ``plain``) against the full path it shortens:
json_body.parse_object, the envelope check and the escaping encode. For every body, both store the same bytes or
refuse with the same code, message and details."""

from __future__ import annotations

import base64
import json
import random

import pytest

from broker.api.send_body import read_send
from broker.codec import encode_message, plain_json_text
from wire import json_body
from wire.errors import ApiError, invalid


def _full(raw: bytes):
    """What the broker did before the hot path: the answer is the stored payloads or the refusal."""
    try:
        body = json_body.parse_object(raw)
        messages = body.get("messages")
        if not isinstance(messages, list) or set(body) != {"messages"}:
            raise invalid("the body must be {\"messages\": [...]}", field="messages")
        return [encode_message(m) for m in messages]
    except ApiError as e:
        return e.to_dict()


def _fast(raw: bytes):
    try:
        messages, plain = read_send(raw)
        return [encode_message(m, plain) for m in messages]
    except ApiError as e:
        return e.to_dict()


BODIES = [
    b'{"messages":[{"body":"a"}]}',
    b'{"messages": [{"body": "a b", "key": "k", "props": {"x": "y"}}, {"body_b64": "YQ=="}]}',
    b' {"messages" :[ {"key":null,"body":"{[,:]}"} ] } ',
    b'{"messages":[{"body":"a"}],"messages":[{"body":"b"}]}',   # duplicate member: the last wins in both
    b'{"messages":[{"body":"a","body":"b"}]}',
    b'{"messages":[{"body":"a","colour":[1,2,{"x":null}]}]}',   # unknown fields are ignored in both
    b'{"messages":[{"body":"caf\xc3\xa9"}]}',                   # UTF-8: not plain
    b'{"messages":[{"body":"tab\\t quote\\" back\\\\ \\u00e9 \\ud83d\\ude00"}]}',
    b'{"messages":[{"body":"del\x7f"}]}',                       # DEL raw: valid JSON, escaped when stored
    b'{"messages":[{"body":"nl\nraw"}]}',                       # control character raw: invalid JSON
    b'{"messages":[{"body":"\\ud800"}]}',                       # lone surrogate
    b'{"messages":[{"body":"x"}]}\xff',
    b'\x00{"messages":[{"body":"x"}]}',                          # NUL: json.loads(bytes) would guess UTF-16
    b'{"messages":[{"body":"a"}' + b',{"body":"b","props":' + b'{"p":' * 40 + b'1' + b'}' * 40 + b'}]}',
    b'[' * 100_000,
    b'', b'null', b'[]', b'{}', b'{"messages":[]}', b'{"messages":{}}', b'{"messages":[1]}', b'{"messages":[null]}',
    b'{"messages":[{}]}', b'{"messages":[{"body":1}]}', b'{"messages":[{"body":"a","key":2}]}',
    b'{"messages":[{"body":"a","props":{"x":1}}]}', b'{"messages":[{"body":"a","props":[]}]}',
    b'{"messages":[{"body":"a","body_b64":"YQ=="}]}', b'{"messages":[{"body":"a"}],"x":1}',
    b'{"messages":[{"body":"a"}',
    # numbers JSON lacks or no encoder of ours carries, in a field the hot path would otherwise ignore
    b'{"messages":[{"body":"a","x":NaN}]}', b'{"messages":[{"body":"a","x":-Infinity}]}',
    b'{"messages":[{"body":"a","x":1e400}]}', b'{"messages":[{"body":"a","x":18446744073709551616}]}',
    b'{"messages":[{"body":"a","x":[-9223372036854775809]}]}', b'{"messages":[{"body":"a","x":18446744073709551615}]}',
]


@pytest.mark.parametrize("raw", BODIES)
def test_the_hot_path_stores_and_refuses_like_the_full_path(raw):
    assert _fast(raw) == _full(raw)


@pytest.mark.parametrize("value", [b"NaN", b"-Infinity", b"1e400", b"18446744073709551616", b"[-9223372036854775809]"])
def test_numbers_nothing_could_encode_again_are_refused_on_the_hot_path_too(value):
    refused = _fast(b'{"messages":[{"body":"a","x":' + value + b'}]}')
    assert isinstance(refused, dict) and refused["error"]["code"] == "INVALID_ARGUMENT", refused


def test_plain_bodies_are_told_from_the_rest():
    assert plain_json_text(b'{"messages":[{"body":"a {}[]:, b"}]}')
    assert not plain_json_text('{"body":"é"}'.encode())
    assert not plain_json_text(b'{"body":"a\\"b"}')
    assert not plain_json_text(b'{"body":"\x7f"}')


@pytest.mark.parametrize("bad", ["AAE", "AA=E", "plain text", "AAEC/w==x", "\u00e9"])
def test_bad_base64_is_refused_the_same_on_both_paths(bad):
    raw = json.dumps({"messages": [{"body_b64": bad}]}).encode()
    fast = _fast(raw)
    assert fast == _full(raw) and fast["error"]["code"] == "INVALID_ARGUMENT", fast


def test_random_messages_store_the_same_bytes_either_way():
    """Messages of characters the escaper treats each its own way, written as clients write them (spaces or not,
    ASCII-escaped or raw UTF-8): the hot path must store exactly the bytes the full path stores."""
    rnd = random.Random(11)
    plain = ["a", "Z", " ", "{", "}", "[", "]", ":", ",", "/", "~"]
    escaped = plain + ['"', "\\", "\x7f", "\x00", "\n", "é", "€", "😀"]
    text = lambda: "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))  # noqa: E731
    plain_seen = 0
    for _ in range(400):
        alphabet = rnd.choice([plain, escaped])
        messages = []
        for _ in range(rnd.randint(1, 5)):
            value = text() if rnd.random() < 0.5 else "plain text"
            # body_b64 carries base64 (anything else is refused on both paths, test_bad_base64_...).
            m = {"body": value} if rnd.random() < 0.5 else {"body_b64": base64.b64encode(value.encode()).decode()}
            if rnd.random() < 0.5:
                m["key"] = text() if rnd.random() < 0.5 else None
            if rnd.random() < 0.3:
                m["props"] = {text(): text() for _ in range(rnd.randint(0, 2))}
            messages.append(m)
        raw = json.dumps({"messages": messages}, ensure_ascii=rnd.random() < 0.5,
                         separators=rnd.choice([(",", ":"), (", ", ": ")])).encode()
        plain_seen += plain_json_text(raw)
        fast = _fast(raw)
        assert fast == _full(raw)
        assert [json.loads(p) for p in fast] == [
            {"key": m.get("key"), "props": m.get("props") or {}, **{k: v for k, v in m.items()
                                                                   if k in ("body", "body_b64")}}
            for m in messages]
    assert 100 < plain_seen < 300  # both paths were taken
