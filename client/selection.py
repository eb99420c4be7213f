"""Choosing a logic queue for a message (RocketMQ's ``MessageQueueSelector``, DOMAIN.md).

A selector answers two questions about a message and the topic's current route:
- ``select(route, message) -> queue``: the queue to send to (or, for spreading selectors, where to start looking);
- ``pins(message) -> bool``: whether that choice is the message's queue. A pinned choice (a key's queue, a custom
  choice) is never changed by fault avoidance or by a retry; an unpinned one (round robin, random) is only a starting
  point, and the producer may move the message to a queue on a healthier broker.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .slots import SlotTable, slot_of

Route = Mapping[str, Any]


@dataclass(frozen=True)
class Message:
    """One message to send: ``body`` as text (``str``) or binary (``bytes``, sent as ``body_b64``)."""
    body: str | bytes
    key: str | None = None
    props: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        if isinstance(self.body, str):
            out: dict[str, Any] = {"body": self.body}
        elif isinstance(self.body, (bytes, bytearray, memoryview)):
            out = {"body_b64": base64.b64encode(bytes(self.body)).decode("ascii")}
        else:
            raise TypeError(f"a message body is str or bytes, not {type(self.body).__name__}")
        if self.key is not None:
            out["key"] = self.key
        if self.props:
            out["props"] = dict(self.props)
        return out


@runtime_checkable
class QueueSelector(Protocol):
    def select(self, route: Route, message: Message) -> int: ...

    def pins(self, message: Message) -> bool: ...


def queue_count(route: Route) -> int:
    n = len(route["queues"])
    if n == 0:
        raise ValueError(f"topic {route.get('topic')!r} has no queues")
    return n


class RoundRobinSelector:
    """Queues in turn. Starts at a random queue, as RocketMQ does, so producers that start together spread out."""

    def __init__(self, start: int | None = None):
        self._next = random.randrange(1 << 30) if start is None else start

    def select(self, route: Route, message: Message) -> int:
        q = self._next % queue_count(route)
        self._next = (self._next + 1) % (1 << 62)
        return q

    def pins(self, message: Message) -> bool:
        return False


class RandomSelector:
    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()

    def select(self, route: Route, message: Message) -> int:
        return self._rng.randrange(queue_count(route))

    def pins(self, message: Message) -> bool:
        return False


class KeySelector:
    """A message with a key goes to its key's queue (slot table), so one key keeps its order; others go to
    ``fallback`` (round robin unless given)."""

    def __init__(self, fallback: QueueSelector | None = None):
        self.fallback = fallback or RoundRobinSelector()
        self._table: tuple[tuple[str, int], SlotTable] | None = None  # cached for one (topic, version)

    def _slot_table(self, route: Route) -> SlotTable:
        ident = (route["topic"], route["version"])
        if self._table is None or self._table[0] != ident:
            self._table = (ident, SlotTable(route["slot_table"], route["slots"]))
        return self._table[1]

    def select(self, route: Route, message: Message) -> int:
        if message.key is None:
            return self.fallback.select(route, message)
        return self._slot_table(route).queue_of(slot_of(message.key, route["slots"]))

    def pins(self, message: Message) -> bool:
        return message.key is not None or self.fallback.pins(message)


class CallableSelector:
    """A custom choice ``fn(route, message) -> queue`` (by machine room, by tenant, ...). Pinned unless told not."""

    def __init__(self, fn: Callable[[Route, Message], int], *, pinned: bool = True):
        self.fn = fn
        self.pinned = pinned

    def select(self, route: Route, message: Message) -> int:
        q = self.fn(route, message)
        n = queue_count(route)
        if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q < n:
            raise ValueError(f"the selector chose {q!r}; the topic has queues 0..{n - 1}")
        return q

    def pins(self, message: Message) -> bool:
        return self.pinned


def as_selector(spec: QueueSelector | Callable[[Route, Message], int] | str | None) -> QueueSelector:
    """``None`` or ``"key"``: by key, else round robin; ``"round_robin"``; ``"random"``; a selector; or a callable."""
    if spec is None or spec == "key":
        return KeySelector()
    if spec == "round_robin":
        return RoundRobinSelector()
    if spec == "random":
        return RandomSelector()
    if isinstance(spec, QueueSelector):
        return spec
    if callable(spec):
        return CallableSelector(spec)
    raise ValueError(f"unknown selector {spec!r}")
