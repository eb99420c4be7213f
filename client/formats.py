"""The form messages take between the client and a broker: the binary batch (wire/batch.py, docs/batch-format.md),
the default, or JSON (``wire_format="json"``: what people and ``curl`` read, kept so it stays tested).

One place decides it for both directions:
- a send (``send_body``) is a SEND batch with ``Content-Type: application/vnd.stator.batch``, or ``{"messages": [...]}``;
  its answer is JSON either way;
- a pull asks with ``Accept: application/vnd.stator.batch`` (``accept_headers``) and gets a STORED batch whose other
  fields (next_offset, min_offset, max_offset, unavailable, held_by) come in the ``X-Pull`` header as JSON; a JSON
  answer (no Accept, or a broker that answered JSON anyway) is read too (``pulled``);
- a pop asks the same way and gets a POPPED batch, each message behind its queue, offset, attempt and receipt handle,
  or JSON (``popped``).
Bodies are bytes on the way out of either form: a JSON ``body`` is its UTF-8 bytes (``text``), ``body_b64`` its
decoded bytes. A ``str`` body is sent as UTF-8 marked as text, ``bytes`` as they are.
"""

from __future__ import annotations

import base64
import json as jsonlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aiohttp

from wire import batch
from wire.caller import Answer, request_once
from wire.errors import ApiError, Unavailable
from .selection import Message

BINARY = "binary"
JSON = "json"
WIRE_FORMATS = (BINARY, JSON)
WIRE_FORMAT_DEFAULT = BINARY
PULL_HEADER = "X-Pull"          # a binary pull's fields other than its messages, as compact JSON


def check_wire_format(value: str) -> str:
    """``value`` when it names a form, else ValueError."""
    if value not in WIRE_FORMATS:
        raise ValueError(f"wire_format must be one of {WIRE_FORMATS}, not {value!r}")
    return value


@dataclass(frozen=True)
class Outgoing:
    """A request's body in one form: JSON, or bytes with their headers."""
    json: Any = None
    data: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


class Body:
    """What a received message (pulled or popped) says of its body: ``body`` is bytes; ``is_text``: sent as text."""
    body: bytes
    is_text: bool

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (for messages sent as text; raises ``UnicodeDecodeError`` on other bytes)."""
        return self.body.decode("utf-8")

    @property
    def sent_body(self) -> str | bytes:
        """The body as it was sent: ``str`` when sent as text, else ``bytes`` (to send it on with its form)."""
        return self.text if self.is_text else self.body


class Pulled(NamedTuple):
    """One message of a pull's answer, whichever form it came in."""
    offset: int
    ts: int | None
    key: str | None
    props: Mapping[str, str]
    body: bytes
    text: bool              # sent as text (a JSON reader gets "body")


def body_bytes(m: Mapping[str, Any]) -> tuple[bytes, bool]:
    """A JSON message's body as bytes, and whether it was text: ``body`` as UTF-8, ``body_b64`` decoded."""
    if m.get("body_b64") is not None:
        return base64.b64decode(m["body_b64"]), False
    return str(m.get("body", "")).encode(), True


def batch_message(m: Message) -> batch.Message:
    """``m`` as the batch carries it: a ``str`` body as UTF-8 marked as text, ``bytes`` as they are."""
    if isinstance(m.body, str):
        return batch.Message(m.key, m.props, m.body.encode(), True)
    if isinstance(m.body, (bytes, bytearray, memoryview)):
        return batch.Message(m.key, m.props, bytes(m.body), False)
    raise TypeError(f"a message body is str or bytes, not {type(m.body).__name__}")


def send_body(messages: Iterable[Message], form: str) -> Outgoing:
    """The body of a send of ``messages`` in ``form``."""
    if form == JSON:
        return Outgoing(json={"messages": [m.to_json() for m in messages]})
    return Outgoing(data=batch.encode(batch_message(m) for m in messages),
                    headers={"Content-Type": batch.CONTENT_TYPE})


def accept_headers(form: str) -> dict[str, str]:
    """What a pull or a pop in ``form`` asks for."""
    return {"Accept": batch.CONTENT_TYPE} if form == BINARY else {}


def pulled(answer: Answer) -> tuple[Mapping[str, Any], list[Pulled]]:
    """A pull's fields (next_offset, min_offset, ...) and its messages, from a batch or a JSON answer. A damaged
    batch is ``Unavailable`` (it was damaged on the way: another try may get it whole)."""
    if not isinstance(answer.body, bytes):
        fields = answer.body if isinstance(answer.body, dict) else {}
        return fields, [Pulled(int(m["offset"]), m.get("ts"), m.get("key"), m.get("props") or {}, *body_bytes(m))
                        for m in fields.get("messages", [])]
    try:
        fields = jsonlib.loads(answer.headers.get(PULL_HEADER, ""))
        triples = batch.decode_stored(answer.body)
    except (ValueError, ApiError) as e:
        raise Unavailable(f"GET {answer.url}: the batch answer cannot be read ({PULL_HEADER}: "
                          f"{answer.headers.get(PULL_HEADER)!r}): {e}", url=answer.url) from e
    if not isinstance(fields, dict):
        raise Unavailable(f"GET {answer.url}: {PULL_HEADER} is not a JSON object", url=answer.url)
    return fields, [Pulled(offset, ts, m.key, m.props or {}, m.body, m.text) for offset, ts, m in triples]


class Delivered(NamedTuple):
    """One message of a pop's answer, whichever form it came in."""
    queue: int
    offset: int
    attempt: int
    handle: str
    key: str | None
    props: Mapping[str, str]
    body: bytes
    text: bool


def popped(answer: Answer) -> list[Delivered]:
    """A pop's messages, from a POPPED batch or a JSON answer. A damaged batch is ``Unavailable``."""
    if not isinstance(answer.body, bytes):
        fields = answer.body if isinstance(answer.body, dict) else {}
        return [Delivered(int(m["queue"]), int(m["offset"]), int(m["attempt"]), m["handle"], m.get("key"),
                          m.get("props") or {}, *body_bytes(m)) for m in fields.get("messages", [])]
    try:
        deliveries = batch.decode_popped(answer.body)
    except ApiError as e:
        raise Unavailable(f"POST {answer.url}: the batch answer cannot be read: {e}", url=answer.url) from e
    return [Delivered(q, o, a, h, m.key, m.props or {}, m.body, m.text) for q, o, a, h, m in deliveries]


async def request(session: aiohttp.ClientSession, method: str, url: str, *, token: str | None,
                  body: Outgoing | None = None, params: Mapping[str, Any] | None = None,
                  headers: Mapping[str, str] | None = None, timeout_s: float) -> Answer:
    """``wire.caller.request_once`` with ``body`` in either form; a batch answer comes back with its bytes."""
    body = body or Outgoing()
    return await request_once(session, method, url, token=token, json=body.json, data=body.data, params=params,
                              headers={**(headers or {}), **body.headers}, timeout_s=timeout_s,
                              raw_answer=batch.CONTENT_TYPE)
