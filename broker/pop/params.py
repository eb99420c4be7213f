"""Request bodies of the pop routes, checked once: every field typed and bounded, a clear 400 otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wire import json_body
from wire.errors import invalid
from wire.params import int_in

from .limits import (DLQ_READ_MAX, HANDLES_PER_ACK_MAX, INVISIBLE_MS_DEFAULT, INVISIBLE_MS_MAX, INVISIBLE_MS_MIN,
                     POP_MESSAGES_DEFAULT, POP_MESSAGES_MAX, WAIT_MS_MAX)

NAME_CHARS_MAX = 255


def name(raw: Any, what: str) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > NAME_CHARS_MAX or not json_body.is_scalar_text(raw):
        raise invalid(f"{what} must be 1-{NAME_CHARS_MAX} characters of valid Unicode", field=what)
    return raw


def _int(body: dict[str, Any], field: str, default: int | None, lo: int, hi: int) -> int:
    raw = body.get(field)
    if raw is not None and not (type(raw) is int):
        raise invalid(f"{field} must be an integer within [{lo}, {hi}]", field=field)
    return int_in(raw, field, default, lo, hi)


@dataclass(frozen=True)
class PopRequest:
    group: str
    max: int
    invisible_ms: int
    queue: int | None
    order: bool
    wait_ms: int


def pop_request(body: dict[str, Any]) -> PopRequest:
    order = body.get("order", False)
    if not isinstance(order, bool):
        raise invalid("order must be true or false", field="order")
    queue = body.get("queue")
    return PopRequest(group=name(body.get("group"), "group"),
                      max=_int(body, "max", POP_MESSAGES_DEFAULT, 1, POP_MESSAGES_MAX),
                      invisible_ms=_int(body, "invisible_ms", INVISIBLE_MS_DEFAULT, INVISIBLE_MS_MIN,
                                        INVISIBLE_MS_MAX),
                      queue=None if queue is None else _int(body, "queue", None, 0, 2**31),
                      order=order, wait_ms=_int(body, "wait_ms", 0, 0, WAIT_MS_MAX))


def ack_request(body: dict[str, Any]) -> tuple[str, list[Any]]:
    group = name(body.get("group"), "group")
    handles = body.get("handles")
    if not isinstance(handles, list) or not 1 <= len(handles) <= HANDLES_PER_ACK_MAX:
        raise invalid(f"handles must be a list of 1 to {HANDLES_PER_ACK_MAX} handles", field="handles",
                      limit=HANDLES_PER_ACK_MAX)
    return group, handles


def invisible_request(body: dict[str, Any]) -> tuple[str, Any, int]:
    return (name(body.get("group"), "group"), body.get("handle"),
            _int(body, "invisible_ms", None, INVISIBLE_MS_MIN, INVISIBLE_MS_MAX))


def dlq_query(query: Any) -> tuple[int, int]:
    return int_in(query.get("offset"), "offset", 0), int_in(query.get("max"), "max", 32, 1, DLQ_READ_MAX)


def adopt_request(body: dict[str, Any]) -> list[list[int]]:
    raw = body.get("deliveries")
    if not isinstance(raw, list) or len(raw) > 100_000:
        raise invalid("deliveries must be a list of [offset, attempt] or [offset, attempt, deadline_ms]")
    out = []
    for d in raw:
        if (not isinstance(d, list) or len(d) not in (2, 3)
                or not all(type(v) is int and 0 <= v < 2**62 for v in d)):
            raise invalid("deliveries must be a list of [offset, attempt] or [offset, attempt, deadline_ms]")
        out.append(d)
    return out
