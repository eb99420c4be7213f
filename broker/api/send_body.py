"""The send request's body on the hot path: parsed once, and marked plain when its strings may be stored as they came.

Every refusal is json_body.parse_object's own or the envelope's below, with the same code, message and field: the
plain path only skips work that cannot find anything in a plain body, and hands any body it does not take to
parse_object to be refused in its words.
"""

from __future__ import annotations

import json
from typing import Any

from wire import json_body
from wire.errors import ApiError, invalid

from ..codec import plain_json_text


def read_send(raw: bytes) -> tuple[list[Any], bool]:
    """The messages of a send body and whether the body is plain (``codec.plain_json_text``)."""
    plain = plain_json_text(raw)
    body = _parse_plain(raw) if plain else None
    if body is None:
        body = json_body.parse_object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or set(body) != {"messages"}:
        raise invalid("the body must be {\"messages\": [...]}", field="messages")
    return messages, plain


def _parse_plain(raw: bytes) -> dict[str, Any] | None:
    """parse_object of a plain body without the two steps a plain body makes void, which were a third of its cost on
    a batch of 1 KB messages: the UTF-8 check (ASCII is UTF-8; decoding as ASCII also keeps json.loads from guessing
    UTF-16 from NUL bytes) and the scan for ``\\uD800``-style escapes (no backslash, no escape, no lone surrogate).
    The depth check stays. None when the body is no JSON object within the limits: parse_object then refuses it."""
    try:
        value = json.loads(raw.decode("ascii"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    try:
        json_body.check(value, strings=False)
    except ApiError:
        return None
    return value
