"""The ``group`` event of meta's all-topic watch stream: what brokers enforce of a consumer group.

Meta renders it (meta/views.py ``group_event``), brokers read it: the lock table (broker/locks.py) and pop's settings
(broker/pop/settings.py). One shape and one parser for all of them.

- ``group``, ``version``: the group and the version of its state (a newer one replaces an older one).
- ``mode``: ``exclusive``, ``shared`` or null (no members yet).
- ``locks``: topic -> the current token per queue (null: no owner).
- ``tokens_through``: every grant with a token up to here is in ``locks``, superseded or current (tokens grow with the
  log, and the table is the group's state after all of them); a broker takes a larger token as "I am behind". An
  event without it means the largest token it holds.
- ``config``: the group's settings with defaults filled in (pop reads ``max_attempts`` from it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypedDict

MODES = ("exclusive", "shared")
LOCK_FIELDS = ("mode", "locks", "tokens_through")   # what the lock table reads
ALL_FIELDS = (*LOCK_FIELDS, "config")


class GroupEvent(TypedDict):
    group: str
    version: int
    mode: Literal["exclusive", "shared"] | None
    tokens_through: int
    locks: dict[str, list[int | None]]
    config: dict[str, Any]


class GroupEventError(ValueError):
    """A ``group`` event that does not have the contract's shape: it changes nothing."""


def _nonneg_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GroupEventError(f"{what} must be a non-negative integer")
    return v


def _locks(raw: Any) -> dict[str, list[int | None]]:
    if not isinstance(raw, dict):
        raise GroupEventError("locks must be an object")
    locks: dict[str, list[int | None]] = {}
    for topic, tokens in raw.items():
        if not isinstance(topic, str) or not topic or not isinstance(tokens, list):
            raise GroupEventError("locks must map topic names to lists of tokens")
        locks[topic] = [None if t is None else _nonneg_int(t, f"token of {topic}") for t in tokens]
    return locks


def parse(body: Any, fields: Iterable[str] = ALL_FIELDS) -> dict[str, Any]:
    """The event's ``group`` and ``version`` and the named ``fields`` of it, checked (GroupEventError otherwise).

    A reader names the fields it reads and is not refused for the others: the lock table reads ``LOCK_FIELDS``,
    pop's settings ``config``."""
    fields = tuple(fields)
    if not isinstance(body, dict):
        raise GroupEventError("a group event must be an object")
    group = body.get("group")
    if not isinstance(group, str) or not group:
        raise GroupEventError("group must be a non-empty string")
    out: dict[str, Any] = {"group": group, "version": _nonneg_int(body.get("version"), "version")}
    if "mode" in fields:
        mode = body.get("mode")
        if mode is not None and mode not in MODES:
            raise GroupEventError(f"mode must be one of {MODES} or null")
        out["mode"] = mode
    if "locks" in fields or "tokens_through" in fields:
        locks = _locks(body.get("locks"))
        held = max((t for ts in locks.values() for t in ts if t is not None), default=0)
        through = _nonneg_int(body.get("tokens_through", held), "tokens_through")
        if through < held:
            raise GroupEventError("tokens_through is below a token the table holds")
        out["locks"], out["tokens_through"] = locks, through
    if "config" in fields:
        if not isinstance(body.get("config"), dict):
            raise GroupEventError("config must be an object")
        out["config"] = body["config"]
    return out
