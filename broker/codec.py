"""How messages are stored and answered: the stored JSON object of a message, spliced into answers as raw bytes."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from wire.errors import invalid

from .storage import Record

_json_str = json.encoder.encode_basestring_ascii  # the C escaper json.dumps uses for strings
_compact = json.JSONEncoder(separators=(",", ":")).encode


def plain_json_text(raw: bytes) -> bool:
    """True when every string ``json.loads`` takes from ``raw`` is already written as the escaper would write it, so
    it may be stored as its own text between quotes: ASCII (the escaper writes ``\\uXXXX`` for the rest), no
    backslash (no escape to undo) and no DEL (the one printable-range byte the escaper escapes). Control characters
    need no look: strict JSON refuses them raw inside strings. Three C scans of the body, no Python per byte."""
    return raw.isascii() and b"\\" not in raw and b"\x7f" not in raw


def encode_message(m: Any, plain: bool = False) -> bytes:
    """A message as the stored JSON object ``{"key":..,"props":..,"body"|"body_b64":..}``, built by hand on the
    hot path: one C string escape per field instead of a full json.dumps per message. ``plain``: the message came
    from a body ``plain_json_text`` accepted, so its strings need no escape (the escape was most of the cost)."""
    if not isinstance(m, dict):
        raise invalid("each message must be an object with body or body_b64")
    body, body_b64 = m.get("body"), m.get("body_b64")
    if (body is None) == (body_b64 is None):
        raise invalid("each message needs exactly one of body and body_b64")
    text = body if body is not None else body_b64
    if not isinstance(text, str):
        raise invalid("body and body_b64 must be strings")
    key, props = m.get("key"), m.get("props")
    if key is not None and not isinstance(key, str):
        raise invalid("key must be a string")
    if props is not None and (not isinstance(props, dict) or not all(isinstance(v, str) for v in props.values())):
        raise invalid("props must be an object of strings")
    field = '"body":' if body is not None else '"body_b64":'
    if plain:
        return ('{"key":' + ('"' + key + '"' if key is not None else "null") + ',"props":'
                + (_compact(props) if props else "{}") + "," + field + '"' + text + '"}').encode()
    return ('{"key":' + (_json_str(key) if key is not None else "null") + ',"props":'
            + (_compact(props) if props else "{}") + "," + field + _json_str(text) + "}").encode()


class RawMessage(NamedTuple):
    """A stored message with its logic offset. Its payload is already a JSON object (written by ``_encode``), so
    answers splice it into the response instead of parsing and re-encoding every message."""
    offset: int
    ts: int
    payload: bytes

    def to_json(self) -> bytes:
        return b'{"offset":%d,"ts":%d,' % (self.offset, self.ts) + self.payload[1:]


class RawRecord(NamedTuple):
    """A physical record for another broker: the same splice, with the stored object under "payload"."""
    offset: int
    ts: int
    payload: bytes

    def to_json(self) -> bytes:
        return b'{"offset":%d,"ts":%d,"payload":' % (self.offset, self.ts) + self.payload + b"}"


class RawPopped(NamedTuple):
    """A popped message: the same splice, with its queue, receipt handle and delivery attempt in front."""
    queue: int
    offset: int
    handle: str
    attempt: int
    payload: bytes

    def to_json(self) -> bytes:
        return (b'{"queue":%d,"offset":%d,"handle":"%s","attempt":%d,' % (
            self.queue, self.offset, self.handle.encode(), self.attempt) + self.payload[1:])


def stored_record(r: dict[str, Any]) -> Record:
    """A record another broker sent as RawRecord JSON, back as a storage record with its stored bytes."""
    return Record(r["offset"], r["ts"], json.dumps(r["payload"], separators=(",", ":")).encode())


def dumps_with_raw(value: Any) -> bytes:
    """json.dumps that writes RawMessage / RawRecord / RawPopped items of lists as their spliced bytes."""
    if isinstance(value, dict):
        return b"{" + b",".join(json.dumps(k).encode() + b":" + dumps_with_raw(v) for k, v in value.items()) + b"}"
    if isinstance(value, list) and value and isinstance(value[0], (RawMessage, RawRecord, RawPopped)):
        return b"[" + b",".join(v.to_json() for v in value) + b"]"
    return _compact(value).encode()
