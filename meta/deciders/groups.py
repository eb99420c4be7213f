"""Decisions about consumer groups: members joining and leaving, their leases ending, locks released or expired,
a group's settings; and what a topic's creation, growth or deletion does to the groups naming it
(``topic_changed``, which topics.py calls).

Who gets which queue, with which fencing token, is meta/groups.py (``LockPlanner``); this file decides when to ask it.
"""

from __future__ import annotations

from typing import Any

from .. import limits
from ..events import make
from ..groups import LockPlanner, effective_config, member_locks, owned
from ..image import Image
from wire.errors import invalid, rejection
from . import Decider, Events, expect_version


def existing_group(image: Image, c) -> dict[str, Any]:
    g = image.groups.get(c["group"])
    if g is None:
        raise rejection(404, "GROUP_NOT_FOUND", f"group {c['group']!r} does not exist", group=c["group"])
    expect_version(c, g["version"])
    return g


def rebalanced(image: Image, name: str, g: dict[str, Any] | None, mode: str | None, members, freed=frozenset(),
               queue_counts=None, planner: LockPlanner | None = None) -> Events:
    planner = planner or LockPlanner(image.data["lock_token"])
    return planner.rebalance(name, g, mode, members, queue_counts or image.queue_count, set(freed))


def topic_changed(image: Image, topic: str, queues: int | None) -> Events:
    """Lock events of every group naming ``topic`` after it was created, grown (``queues``) or deleted (None)."""
    events = []
    planner = LockPlanner(image.data["lock_token"])

    def counts(name: str) -> int | None:
        return queues if name == topic else image.queue_count(name)
    for name in sorted(set(image.data["subscriptions"].get(topic, ())) |
                       {n for n, g in image.groups.items() if topic in g["locks"]}):
        g = image.groups[name]
        freed = []
        if queues is None:
            freed = [(topic, int(q), lk) for q, lk in sorted(g["locks"].get(topic, {}).items())]
            events += planner.release(name, freed, "topic_deleted")
        # Harmless mutant: None for ``image`` here (rebalanced reads it only for a planner or counts it is not given).
        events += rebalanced(image, name, g, g["mode"], g["members"], {(t, q) for t, q, _ in freed}, counts, planner)
    return events


def without_members(image: Image, c, names: list[str], reason: str):
    g = existing_group(image, c)
    gone = [m for m in names if m in g["members"]]
    if not gone:
        return [], {"group": c["group"], "removed": []}
    planner = LockPlanner(image.data["lock_token"])
    freed = [lock for m in gone for lock in member_locks(g, m)]
    events = planner.release(c["group"], freed, reason)
    events += [make("GroupMemberLeft", group=c["group"], member=m, reason=reason) for m in gone]
    members = {m: v for m, v in g["members"].items() if m not in gone}
    # Harmless mutants: planner=None or left out, here and in release() (the new planner starts at the same token:
    # planner.release hands out none).
    events += rebalanced(image, c["group"], g, g["mode"], members, {(t, q) for t, q, _ in freed}, planner=planner)
    return events, {"group": c["group"], "removed": gone}


def release(image: Image, c, refs, reason: str, which):
    """Release the named locks that are still what the caller saw (same token), and regrant."""
    g = existing_group(image, c)
    freed = []
    for r in refs:
        lk = g["locks"].get(r["topic"], {}).get(str(r["queue"]))
        if lk is not None and lk["token"] == r["token"] and which(lk) \
                and (r["topic"], r["queue"]) not in {(t, q) for t, q, _ in freed}:
            freed.append((r["topic"], r["queue"], lk))
    if not freed:
        return [], {"group": c["group"], "released": 0}
    planner = LockPlanner(image.data["lock_token"])
    events = planner.release(c["group"], freed, reason)
    events += rebalanced(image, c["group"], g, g["mode"], g["members"], {(t, q) for t, q, _ in freed},
                         planner=planner)
    return events, {"group": c["group"], "released": len(freed)}


# -- the commands ------------------------------------------------------------------------------------------------
def join(image: Image, c, ts, budget):
    name, member = c["group"], c["member"]
    g = image.groups.get(name)
    expect_version(c, g["version"] if g else 0)
    if g is None and len(image.groups) >= limits.GROUPS_MAX:
        raise rejection(409, "TOO_MANY_GROUPS", f"at most {limits.GROUPS_MAX} groups")
    mode = g["mode"] if g is not None and g["mode"] is not None else c["mode"]
    if mode != c["mode"]:
        raise rejection(409, "GROUP_MODE_MISMATCH", f"group {name!r} is {mode}; member asked for {c['mode']}",
                        group=name, mode=mode)
    members = dict(g["members"]) if g is not None else {}
    old = members.get(member)
    if old is not None and old["topics"] == c["topics"] and old["mode"] == c["mode"]:
        return [], {"group": name, "joined": False}
    if old is None:
        if len(members) >= limits.MEMBERS_PER_GROUP_MAX:
            raise rejection(409, "TOO_MANY_MEMBERS", f"a group has at most {limits.MEMBERS_PER_GROUP_MAX} members")
        if image.data["member_count"] >= limits.MEMBERS_MAX:
            raise rejection(409, "TOO_MANY_MEMBERS", f"at most {limits.MEMBERS_MAX} members in all groups")
    members[member] = {"topics": c["topics"], "mode": c["mode"]}
    events = [make("GroupMemberJoined", group=name, member=member, topics=c["topics"], mode=c["mode"])]
    return events + rebalanced(image, name, g, mode, members), {"group": name, "joined": True}


def leave(image: Image, c, ts, budget):
    return without_members(image, c, [c["member"]], "left")


def expire_members(image: Image, c, ts, budget):
    return without_members(image, c, c["members"], "lease_expired")


def release_locks(image: Image, c, ts, budget):
    return release(image, c, c["locks"], "released", lambda lk: lk["member"] == c["member"])


def expire_locks(image: Image, c, ts, budget):
    # Only revoked locks expire this way; an owner's own lease ends with its membership (ExpireMembers).
    return release(image, c, c["locks"], "lease_expired", lambda lk: not owned(lk))


def set_config(image: Image, c, ts, budget):
    name = c["group"]
    g = image.groups.get(name)
    expect_version(c, g["version"] if g else 0)
    if g is None and len(image.groups) >= limits.GROUPS_MAX:
        raise rejection(409, "TOO_MANY_GROUPS", f"at most {limits.GROUPS_MAX} groups")
    config = dict(g["config"]) if g is not None else {}
    for k, v in c["config"].items():
        if v is None:
            config.pop(k, None)
        else:
            config[k] = v
    config = dict(sorted(config.items()))
    # Harmless mutants: another key than "mode" here (so ``mode`` is the group's), and, below, ``==`` for ``!=`` or
    # None for the name, the group or the mode in the rebalance. A mode changes only while the group has no member
    # (members of another mode are refused just below, and every member has the group's mode: join refuses another),
    # so no lock either (a lock outlives no membership): that rebalance decides nothing, whatever it is given; and a
    # group's own mode gives no rebalance anything to do (each command leaves its group balanced: a rebalance
    # after every step of 300 random histories of joins, leaves, releases, expiries and topic changes decided
    # nothing). ``effective`` reads the mode from ``config`` when it names one.
    mode = config.get("mode", g["mode"] if g else None)
    effective = effective_config(name, {"mode": mode, "config": config})
    if effective["heartbeat_interval_ms"] * 2 > effective["lease_ms"]:
        raise invalid("heartbeat_interval_ms must be at most half of lease_ms, so a lease outlives a lost "
                      "heartbeat", lease_ms=effective["lease_ms"],
                      heartbeat_interval_ms=effective["heartbeat_interval_ms"])
    if g is not None and "mode" in config:
        other = sorted(m for m, v in g["members"].items() if v["mode"] != config["mode"])
        if other:
            raise rejection(409, "GROUP_MODE_MISMATCH", f"members of another mode are in the group: {other[:5]}",
                            group=name, mode=config["mode"])
    if g is not None and config == g["config"]:
        return [], {"group": name, "config": effective_config(name, g)}
    events = [make("GroupConfigChanged", group=name, config=config, changed=sorted(c["config"]))]
    if g is not None and mode != g["mode"]:
        events += rebalanced(image, name, g, mode, g["members"])
    return events, {"group": name, "config": effective}


DECIDERS: dict[str, Decider] = {
    "JoinGroup": join,
    "LeaveGroup": leave,
    "ExpireMembers": expire_members,
    "ReleaseLocks": release_locks,
    "ExpireLocks": expire_locks,
    "SetGroupConfig": set_config,
}
