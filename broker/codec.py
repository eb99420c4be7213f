"""How messages are stored and answered, in the form each came in.

A message sent as JSON is stored as its JSON object ``{"key":..,"props":..,"body"|"body_b64":..}`` (``encode_message``;
its first byte is ``{``); one sent in a binary batch is stored as the ``wire.batch`` record it came as (its first byte
is the record's attrs, 0x00 or 0x01). Answers splice stored payloads as raw bytes, converting at the edge only where
the forms differ (``as_json_object``, ``as_record``), as Kafka down-converts for older consumers: a message sent in
one form reads back byte-identical in the other (body bytes, key, props, text-ness).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, NamedTuple

from wire import batch
from wire.errors import invalid

from .storage import Record, Run
from .storage.record import SIZE, records_of

# The tag each stored frame carries (storage keeps it opaque): the form of all its records. A binary pull forwards a
# TAG_RECORDS run as it lies on disk; only TAG_JSON runs are converted, record by record.
TAG_RECORDS = 0   # wire.batch records, as a binary send brought them
TAG_JSON = 1      # JSON objects, as encode_message wrote a JSON send's messages

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
    if body_b64 is not None:
        _b64decode(body_b64)   # refused now rather than stored: a binary reader gets the decoded bytes
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


def as_json_object(payload: bytes) -> bytes:
    """A stored payload as the JSON object ``encode_message`` writes: itself when stored as JSON, else its binary
    record rendered with "body" (UTF-8 text: the record's TEXT bit) or "body_b64". A body marked text that is not
    UTF-8 (a batch's bodies are never read on the way in) is rendered as "body_b64": JSON cannot carry it as text."""
    if payload[:1] == b"{":
        return payload
    m = batch.message(payload)
    body: str | None = None
    if m.text:
        try:
            body = str(m.body, "utf-8")
        except UnicodeDecodeError:
            body = None
    field, text = ('"body":', body) if body is not None else ('"body_b64":', str(base64.b64encode(m.body), "ascii"))
    return ('{"key":' + (_json_str(m.key) if m.key is not None else "null") + ',"props":'
            + (_compact(m.props) if m.props else "{}") + "," + field + _json_str(text) + "}").encode()


def as_record(payload: bytes) -> bytes:
    """A stored payload as a ``wire.batch`` record: itself when stored as one, else its JSON object's key, props and
    body ("body" as UTF-8 text with the TEXT bit; "body_b64" decoded) in a record."""
    if payload[:1] != b"{":
        return payload
    obj = json.loads(payload)
    text = obj.get("body")
    if text is not None:
        body = text.encode("utf-8", "surrogatepass")
    else:
        body = _b64decode(obj["body_b64"])
    return batch.record(batch.Message(obj.get("key"), obj.get("props"), body, text=text is not None))


def _b64decode(text: str) -> bytes:
    """A "body_b64" as bytes: standard base64, padded (RFC 4648 section 4), or 400 INVALID_ARGUMENT."""
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise invalid("body_b64 must be standard base64 with its padding (RFC 4648, section 4)",
                      field="body_b64") from None


class RawMessage(NamedTuple):
    """A stored message with its logic offset, spliced into a JSON answer as its JSON object (``as_json_object``)
    instead of parsing and re-encoding every message."""
    offset: int
    ts: int
    payload: bytes

    def to_json(self) -> bytes:
        return b'{"offset":%d,"ts":%d,' % (self.offset, self.ts) + as_json_object(self.payload)[1:]


def messages(runs: list[Run]) -> list[RawMessage]:
    """The messages of runs read for a pull (logic offsets), one by one: a JSON answer's, a pop's."""
    return [RawMessage(r.offset, r.ts_ms, r.payload) for run in runs for r in records_of(run)]


def binary_runs(runs: list[Run]) -> list[batch.Run]:
    """Runs as a STORED batch answers them: a binary send's records as stored, a JSON send's converted."""
    out = []
    for run in runs:
        records = run.records
        if run.tag != TAG_RECORDS:
            records = batch.sized(as_record(r.payload) for r in records_of(run))
        out.append(batch.Run(run.offset, run.ts_ms, run.count, records))
    return out


def popped_batch(deliveries: list["RawPopped"]) -> bytes:
    """A pop's deliveries as a POPPED batch, each message as a record (``as_record``)."""
    return batch.encode_popped(batch.Popped(d.queue, d.offset, d.attempt, d.handle, as_record(d.payload))
                               for d in deliveries)


def run_of(record: Record) -> Run:
    """One record another broker sent (``stored_record``) as a run of its own, tagged by its form."""
    tag = TAG_JSON if record.payload[:1] == b"{" else TAG_RECORDS
    return Run(record.offset, record.ts_ms, 1, tag, SIZE.pack(len(record.payload)) + record.payload)


class RawRecord(NamedTuple):
    """A physical record for another broker, byte-exact in either form: a JSON object under "payload", a binary
    record base64-encoded under "payload_b64" (``stored_record`` reads both back)."""
    offset: int
    ts: int
    payload: bytes

    def to_json(self) -> bytes:
        if self.payload[:1] == b"{":
            return b'{"offset":%d,"ts":%d,"payload":' % (self.offset, self.ts) + self.payload + b"}"
        return b'{"offset":%d,"ts":%d,"payload_b64":"' % (self.offset, self.ts) + base64.b64encode(self.payload) \
            + b'"}'


class RawPopped(NamedTuple):
    """A popped message: the same splice, with its queue, receipt handle and delivery attempt in front."""
    queue: int
    offset: int
    handle: str
    attempt: int
    payload: bytes

    def to_json(self) -> bytes:
        return (b'{"queue":%d,"offset":%d,"handle":"%s","attempt":%d,' % (
            self.queue, self.offset, self.handle.encode(), self.attempt) + as_json_object(self.payload)[1:])


def stored_record(r: dict[str, Any]) -> Record:
    """A record another broker sent as RawRecord JSON, back as a storage record with its stored bytes (either form)."""
    if "payload_b64" in r:
        return Record(r["offset"], r["ts"], base64.b64decode(r["payload_b64"]))
    return Record(r["offset"], r["ts"], json.dumps(r["payload"], separators=(",", ":")).encode())


def dumps_with_raw(value: Any) -> bytes:
    """json.dumps that writes RawMessage / RawRecord / RawPopped items of lists as their spliced bytes, and a list
    of runs (a pull's) as the messages in them."""
    if isinstance(value, dict):
        return b"{" + b",".join(json.dumps(k).encode() + b":" + dumps_with_raw(v) for k, v in value.items()) + b"}"
    if isinstance(value, list) and value and isinstance(value[0], Run):
        value = messages(value)
    if isinstance(value, list) and value and isinstance(value[0], (RawMessage, RawRecord, RawPopped)):
        return b"[" + b",".join(v.to_json() for v in value) + b"]"
    return _compact(value).encode()
