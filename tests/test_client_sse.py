"""client/sse.py: parsing the event stream meta's ``GET /v1/watch`` writes, however the bytes are cut."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.sse import SseEvent, SseParser, SseProtocolError

# What meta/api/watch.py writes: route events, a delete, and a keepalive comment.
ROUTE_A = {"topic": "a", "version": 5, "queues": []}
ROUTE_B = {"topic": "b", "version": 9, "queues": [{"queue": 0, "address": "http://x:1"}]}
STREAM = (b"event: route\nid: 5\ndata: " + json.dumps(ROUTE_A).encode() + b"\n\n"
          b": keepalive\n\n"
          b"event: route\nid: 9\ndata: " + json.dumps(ROUTE_B).encode() + b"\n\n"
          b"event: deleted\nid: 12\ndata: {\"topic\": \"a\", \"version\": 12}\n\n")
EXPECTED = [SseEvent("route", json.dumps(ROUTE_A), "5"), SseEvent("route", json.dumps(ROUTE_B), "9"),
            SseEvent("deleted", '{"topic": "a", "version": 12}', "12")]


def feed_all(parser: SseParser, chunks) -> list[SseEvent]:
    out = []
    for c in chunks:
        out += parser.feed(c)
    return out


def test_whole_stream():
    p = SseParser()
    assert p.feed(STREAM) == EXPECTED
    assert p.last_id == "12"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=20), st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_any_cut_and_any_line_ending_gives_the_same_events(cuts, eol):
    stream = STREAM.replace(b"\n", eol)
    bounds = [0, *sorted(cuts), len(stream)]
    chunks = [stream[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    assert feed_all(SseParser(), chunks) == EXPECTED


def test_multiline_data_comments_and_field_rules():
    p = SseParser()
    events = p.feed(b"data: one\ndata:two\ndata\n: comment\nretry: 100\nunknown: x\n\n")
    assert events == [SseEvent("message", "one\ntwo\n", None)]
    assert p.feed(b"data:  two spaces\n\n") == [SseEvent("message", " two spaces", None)]


def test_no_event_without_blank_line_or_without_data():
    p = SseParser()
    assert p.feed(b"event: route\nid: 3\ndata: x\n") == []
    assert p.feed(b"\n") == [SseEvent("route", "x", "3")]
    assert p.feed(b"event: route\nid: 4\n\n") == []       # no data: nothing dispatched, but the id is kept
    assert p.last_id == "4"
    assert p.feed(b"data: y\n\n") == [SseEvent("message", "y", "4")]


def test_utf8_split_inside_a_character():
    data = "data: キー\n\n".encode()
    p = SseParser()
    assert feed_all(p, [data[:8], data[8:]]) == [SseEvent("message", "キー", None)]


def test_buffer_is_bounded():
    p = SseParser(line_bytes_max=100, event_bytes_max=1000)
    with pytest.raises(SseProtocolError):
        p.feed(b"data: " + b"x" * 200)
    p = SseParser(line_bytes_max=100, event_bytes_max=150)
    with pytest.raises(SseProtocolError):
        p.feed(b"data: " + b"x" * 80 + b"\ndata: " + b"y" * 80 + b"\n")
