"""Consumer groups as the state machine decides them: who owns which queue, with which fencing token.

Pure functions of the image (no clock, no I/O): the group commands' deciders (meta/deciders/groups.py) call them
inside apply.

An exclusive group's lock on a (topic, queue) is ``{"member", "token", "target", "granted_ms"}`` in
``group["locks"][topic][str(queue)]``; a queue without an entry has no owner. ``target`` is where the balanced, sticky
assignment wants the queue. When it differs from the owner the queue is being revoked: the owner keeps its token (it
may still commit) until it releases the queue or its lease ends, and only then is the queue granted to the target
with a new token (Kafka KIP-848's rule: a partition moves only once its old owner gave it up).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import limits
from .events import make

Lock = dict[str, Any]
Members = Mapping[str, Mapping[str, Any]]

CONFIG_DEFAULTS = {"lease_ms": limits.LEASE_MS_DEFAULT,
                   "heartbeat_interval_ms": limits.GROUP_HEARTBEAT_INTERVAL_MS_DEFAULT,
                   "max_attempts": limits.MAX_ATTEMPTS_DEFAULT}


def effective_config(name: str, group: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every setting of a group, defaults filled in (what heartbeats and describe answer)."""
    config = {**CONFIG_DEFAULTS, "retry_topic": f"{name}-retry", "mode": group["mode"] if group else None}
    if group is not None:
        config.update(group["config"])
    return config


def promise_after_shortening(record: Mapping[str, int] | None, before_ms: int, ts: int) -> dict[str, int]:
    """``lease_ms`` went down from ``before_ms`` at ``ts`` (the command's leader time): answers given before may
    still promise ``before_ms``, until about ``ts + before_ms``. Merged with an earlier record still running, so
    the record names the longest lease any answer may still carry (``lease_ms``) and until when (``until_ms``)."""
    lease, until = before_ms, ts + before_ms
    if record is not None and record["until_ms"] > ts:
        lease, until = max(lease, record["lease_ms"]), max(until, record["until_ms"])
    return {"lease_ms": lease, "until_ms": until}


def lease_still_promised_ms(group: Mapping[str, Any], wall_ms: int) -> int:
    """The longest lease an answer given before ``group``'s lease_ms was last shortened may still carry at
    ``wall_ms``, or 0. A new leader, which cannot know the old one's answers, counts every member's silence against
    at least this (meta/group_sessions.py). The record is kept one such lease past its ``until_ms``: an answer read
    the old setting until the change applied, a commit's latency after the command's time."""
    record = group.get("lease_promised")
    if record is None or wall_ms >= record["until_ms"] + record["lease_ms"]:
        return 0
    return record["lease_ms"]


def owned(lock: Lock) -> bool:
    """Owned and not being revoked: the owner may go on processing it."""
    return lock["target"] == lock["member"]


def member_locks(group: Mapping[str, Any], member: str) -> list[tuple[str, int, Lock]]:
    return [(topic, int(q), lk) for topic, qs in group["locks"].items() for q, lk in qs.items()
            if lk["member"] == member]


def assign(queues: int, members: list[str], current: Mapping[int, str | None], load: dict[str, int]) -> dict[int, str]:
    """Balanced and sticky: each member gets ``queues // len(members)`` queues or one more; a queue stays with its
    current target while that member is subscribed and under its share. Ties go to the member with the least load
    over the group's other topics, then by name. ``load`` is updated with this topic's share."""
    if not members or not queues:
        return {}
    base, extra = divmod(queues, len(members))
    held = {m: 0 for m in members}
    for m in current.values():
        if m in held:
            held[m] += 1
    # Those already holding the most keep the larger shares, so the fewest queues move.
    order = sorted(members, key=lambda m: (-held[m], load.get(m, 0), m))
    cap = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    kept = {m: 0 for m in members}
    out: dict[int, str] = {}
    moving = []
    for q in range(queues):
        m = current.get(q)
        if m in cap and kept[m] < cap[m]:
            out[q] = m
            kept[m] += 1
        else:
            moving.append(q)
    room = [(kept[m], load.get(m, 0), m) for m in members if kept[m] < cap[m]]
    heapq.heapify(room)
    for q in moving:
        n, w, m = heapq.heappop(room)
        out[q] = m
        kept[m] = n + 1
        if kept[m] < cap[m]:
            heapq.heappush(room, (n + 1, w, m))
    for m, n in kept.items():
        load[m] = load.get(m, 0) + n
    return out


class LockPlanner:
    """Decides the lock events of one command for one group, handing out tokens in order.

    ``members`` and ``queue_counts`` describe the group and topics as they will be after the command's other events;
    ``freed`` are locks this command releases (their entries still stand in the image until its events replay).
    """

    def __init__(self, next_token: int):
        self.next_token = next_token

    def release(self, group: str, locks: Iterable[tuple[str, int, Lock]], reason: str) -> list[dict[str, Any]]:
        return [make("LockReleased", group=group, topic=t, queue=q, member=lk["member"], token=lk["token"],
                     reason=reason) for t, q, lk in locks]

    def rebalance(self, group: str, image_group: Mapping[str, Any] | None, mode: str | None, members: Members,
                  queue_counts: Callable[[str], int | None], freed: set[tuple[str, int]]) -> list[dict[str, Any]]:
        locks = image_group["locks"] if image_group is not None else {}
        subscribers: dict[str, list[str]] = {}
        if mode == "exclusive":
            for name in sorted(members):
                if members[name]["mode"] == "exclusive":
                    for t in members[name]["topics"]:
                        subscribers.setdefault(t, []).append(name)
        events: list[dict[str, Any]] = []
        load: dict[str, int] = {}
        for topic in sorted(set(subscribers) | set(locks)):
            n = queue_counts(topic) or 0
            current = {int(q): lk for q, lk in locks.get(topic, {}).items() if (topic, int(q)) not in freed}
            targets = assign(n, subscribers.get(topic, []), {q: lk["target"] for q, lk in current.items()}, load)
            for q in range(n):
                target = targets.get(q)
                lk = current.get(q)
                if lk is None:
                    if target is not None:
                        self.next_token += 1
                        events.append(make("LockGranted", group=group, topic=topic, queue=q, member=target,
                                           token=self.next_token))
                elif lk["target"] != target:
                    events.append(make("LockTargetChanged", group=group, topic=topic, queue=q, member=lk["member"],
                                       token=lk["token"], target=target))
        return events


# -- read models ---------------------------------------------------------------------------------------------------
def lock_table(group: Mapping[str, Any], queue_counts: Callable[[str], int | None]) -> dict[str, list[int | None]]:
    """{topic: [current token or None, per queue]}: what brokers enforce (the watch stream's ``group`` event)."""
    out = {}
    for topic, qs in sorted(group["locks"].items()):
        n = max(queue_counts(topic) or 0, 1 + max((int(q) for q in qs), default=-1))
        tokens: list[int | None] = [None] * n
        for q, lk in qs.items():
            tokens[int(q)] = lk["token"]
        out[topic] = tokens
    return out


def assignments_by_member(group: Mapping[str, Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per member, in (topic, queue) order: ``owned``, the queues it may process, and ``revoking``, the ones it must
    give up. A member releases at once a revoked queue it never worked on: one granted and revoked again between two
    of its heartbeats would otherwise wait out a whole lease, since no answer ever listed it."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for topic in sorted(group["locks"]):
        qs = group["locks"][topic]
        for q in sorted(qs, key=int):
            lk = qs[q]
            mine = out.setdefault(lk["member"], {"owned": [], "revoking": []})
            mine["owned" if owned(lk) else "revoking"].append({"topic": topic, "queue": int(q), "token": lk["token"]})
    return out
