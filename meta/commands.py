"""Commands: what a caller asks the log to do, and their static validation.

A command is a dict ``{"type": <name>, ...fields}`` carried in an envelope
``{"rid": request id, "ts": leader time ms, "actor": role:name, "cmd": command}``.
``validate`` checks only what needs no state (types, ranges, names); the state machine calls it again inside apply
so a command that bypassed the HTTP layer is still rejected cleanly, then checks everything that needs the image.
Each type's decision is in meta/deciders/, one file per domain (``state_machine.DECIDERS`` names which).
"""

from __future__ import annotations

import re
from typing import Any

from . import limits
from wire import disk_identity
from wire.errors import invalid
from wire.names import NAME_RE

ADDRESS_RE = re.compile(r"^[\x21-\x7e]+$")  # a URL: routes carry it, and their size bound counts it as ASCII
ORDERS = ("best_tried", "strict")


def _name(value: Any, what: str, max_chars: int) -> str:
    if not isinstance(value, str) or not value or len(value) > max_chars or not NAME_RE.fullmatch(value):
        raise invalid(f"{what} must be 1-{max_chars} characters of A-Z a-z 0-9 _ -", field=what)
    return value


def _int(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise invalid(f"{what} must be an integer in [{lo}, {hi}]", field=what)
    return value


def _optional_version(cmd: dict[str, Any]) -> None:
    if cmd.get("expected_version") is not None:
        _int(cmd["expected_version"], "expected_version", 0, 2**62)


def _broker_list(value: Any, what: str = "brokers") -> list[str]:
    if not isinstance(value, list) or not value or len(value) > limits.BROKERS_MAX:
        raise invalid(f"{what} must be a non-empty list of broker names", field=what)
    names = [_name(b, "broker", limits.BROKER_NAME_CHARS_MAX) for b in value]
    if len(set(names)) != len(names):
        raise invalid(f"{what} has duplicates", field=what)
    return names


def _config(value: Any) -> dict[str, str | None]:
    if not isinstance(value, dict) or len(value) > limits.CONFIG_KEYS_MAX:
        raise invalid(f"config must be an object of at most {limits.CONFIG_KEYS_MAX} keys", field="config")
    for k, v in value.items():
        if not k or len(k) > limits.CONFIG_KEY_CHARS_MAX:
            raise invalid(f"config keys must be 1-{limits.CONFIG_KEY_CHARS_MAX} characters", field=k)
        if v is not None and (not isinstance(v, str) or len(v) > limits.CONFIG_VALUE_CHARS_MAX):
            raise invalid(f"config value of {k!r} must be a string of at most {limits.CONFIG_VALUE_CHARS_MAX} "
                          "characters, or null to remove it", field=k)
    return value


def _v_register_broker(c):
    _name(c.get("broker"), "broker", limits.BROKER_NAME_CHARS_MAX)
    addr = c.get("address")
    if not isinstance(addr, str) or not ADDRESS_RE.fullmatch(addr) or len(addr) > limits.ADDRESS_CHARS_MAX:
        raise invalid(f"address must be the broker's base URL: 1-{limits.ADDRESS_CHARS_MAX} printable ASCII "
                      "characters", field="address")
    if c.get("zone") is not None and (not isinstance(c["zone"], str) or len(c["zone"]) > 64):
        raise invalid("zone must be a string of at most 64 characters", field="zone")
    if c.get("cluster") is not None:
        _name(c["cluster"], "cluster", limits.BROKER_NAME_CHARS_MAX)
    if c.get("disk") is not None and not disk_identity.is_disk_id(c["disk"]):
        raise invalid(f"disk must be a disk id ({disk_identity.DISK_ID_HEX_CHARS} lowercase hex characters)",
                      field="disk")


def _scope(value) -> None:
    """A topic's scope: "global", or 1 to SCOPE_CLUSTERS_MAX distinct cluster names."""
    if value is None or value == limits.SCOPE_GLOBAL:
        return
    if not isinstance(value, list) or not 1 <= len(value) <= limits.SCOPE_CLUSTERS_MAX:
        raise invalid(f"scope must be \"{limits.SCOPE_GLOBAL}\" or a list of 1 to {limits.SCOPE_CLUSTERS_MAX} "
                      "cluster names", field="scope")
    for name in value:
        _name(name, "scope", limits.BROKER_NAME_CHARS_MAX)
    if len(set(value)) != len(value):
        raise invalid("scope names a cluster twice", field="scope")


def _v_drain_broker(c):
    _name(c.get("broker"), "broker", limits.BROKER_NAME_CHARS_MAX)
    if not isinstance(c.get("draining"), bool):
        raise invalid("draining must be true or false", field="draining")
    if c.get("to") is not None:
        _broker_list(c["to"])
        if c["broker"] in c["to"]:
            raise invalid("a broker cannot be drained onto itself", field="to")


def _v_drain_step(c):
    _name(c.get("broker"), "broker", limits.BROKER_NAME_CHARS_MAX)
    _int(c.get("queues_max"), "queues_max", 1, limits.DRAIN_QUEUES_PER_STEP_MAX)


def _v_copies_held(c):
    _v_broker_epoch(c)
    copies = c.get("copies")
    if not isinstance(copies, list) or not 1 <= len(copies) <= limits.SEALS_PER_REPORT_MAX:
        raise invalid(f"copies must be a list of 1 to {limits.SEALS_PER_REPORT_MAX} copies", field="copies")
    for h in copies:
        if not isinstance(h, dict) or set(h) != {"topic", "queue", "gen", "end"}:
            raise invalid("each copy is {topic, queue, gen, end}", field="copies")
        _name(h["topic"], "topic", limits.TOPIC_NAME_CHARS_MAX)
        _int(h["queue"], "queue", 0, limits.QUEUES_PER_TOPIC_MAX - 1)
        _int(h["gen"], "gen", 0, 2**62)
        _int(h["end"], "end", 0, 2**62)


def _v_broker_epoch(c):
    _name(c.get("broker"), "broker", limits.BROKER_NAME_CHARS_MAX)
    _int(c.get("epoch"), "epoch", 1, 2**62)


def _v_fence_broker(c):
    _v_broker_epoch(c)
    if c.get("reason") not in ("session_expired", "connection_refused"):
        raise invalid("reason must be 'session_expired' or 'connection_refused'", field="reason")


def _v_grant_budget(c):
    _v_broker_epoch(c)
    grants = c.get("grants")
    if not isinstance(grants, list) or len(grants) > limits.HEARTBEAT_QUEUES_MAX:
        raise invalid("grants must be a list", field="grants")
    for g in grants:
        if not isinstance(g, dict):
            raise invalid("each grant must be an object", field="grants")
        _name(g.get("topic"), "topic", limits.TOPIC_NAME_CHARS_MAX)
        _int(g.get("queue"), "queue", 0, limits.QUEUES_PER_TOPIC_MAX - 1)
        _int(g.get("gen"), "gen", 0, 2**62)
        _int(g.get("budget_end"), "budget_end", 0, 2**62)


def _v_create_topic(c):
    _name(c.get("topic"), "topic", limits.TOPIC_NAME_CHARS_MAX)
    slots = _int(c.get("slots", limits.SLOTS_DEFAULT), "slots", 1, limits.SLOTS_PER_TOPIC_MAX)
    _int(c.get("queues"), "queues", 1, min(slots, limits.QUEUES_PER_TOPIC_MAX))
    if c.get("brokers") is not None:
        _broker_list(c["brokers"])
    if c.get("order", "best_tried") not in ORDERS:
        raise invalid("order must be 'best_tried' or 'strict'", field="order")
    _scope(c.get("scope"))
    _config(c.get("config", {}))
    _optional_version(c)
    # replicas and min_insync as asked; default_* the cluster config's, which the node that took the request adds
    for key in ("replicas", "min_insync", "default_replicas", "default_min_insync"):
        if c.get(key) is not None:
            _int(c[key], key, 1, limits.REPLICAS_MAX)
    if c.get("replicas") is not None and c.get("min_insync") is not None and c["min_insync"] > c["replicas"]:
        raise invalid("min_insync cannot exceed replicas", field="min_insync")


def _v_grow_topic(c):
    _name(c.get("topic"), "topic", limits.TOPIC_NAME_CHARS_MAX)
    _int(c.get("queues"), "queues", 1, limits.QUEUES_PER_TOPIC_MAX)
    _optional_version(c)


def _v_set_config(c):
    _name(c.get("topic"), "topic", limits.TOPIC_NAME_CHARS_MAX)
    _config(c.get("config"))
    _optional_version(c)


def _v_topic(c):
    _name(c.get("topic"), "topic", limits.TOPIC_NAME_CHARS_MAX)
    _optional_version(c)


def _optional_queue_ids(c):
    """A command's ``queues``: absent (every queue), or a non-empty list of distinct queue ids."""
    qs = c.get("queues")
    if qs is not None:
        if not isinstance(qs, list) or not qs or len(qs) > limits.QUEUES_PER_TOPIC_MAX:
            raise invalid("queues must be a non-empty list of queue ids", field="queues")
        for q in qs:
            _int(q, "queues[]", 0, limits.QUEUES_PER_TOPIC_MAX - 1)
        if len(set(qs)) != len(qs):
            raise invalid("queues has duplicates", field="queues")


def _v_remap(c):
    _v_topic(c)
    _broker_list(c.get("brokers"))
    _optional_queue_ids(c)


def _v_elect(c):
    _v_topic(c)
    _optional_queue_ids(c)
    if not isinstance(c.get("unclean", False), bool):
        raise invalid("unclean must be true or false", field="unclean")


def _v_seal(c):
    _v_broker_epoch(c)
    _v_seal_report(c)


def _v_seal_many(c):
    _v_broker_epoch(c)
    seals = c.get("seals")
    if not isinstance(seals, list) or not 1 <= len(seals) <= limits.SEALS_PER_REPORT_MAX:
        raise invalid(f"seals must be a list of 1 to {limits.SEALS_PER_REPORT_MAX} reports", field="seals")
    seen = set()
    for r in seals:
        if not isinstance(r, dict):
            raise invalid("each seal report must be an object", field="seals")
        _v_seal_report(r)
        key = (r["topic"], r["queue"], r["gen"])
        if key in seen:  # two reports of one segment in one command would both be decided on the same image
            raise invalid("seals reports one segment twice", field="seals", topic=r["topic"], queue=r["queue"])
        seen.add(key)


def _v_seal_report(c):
    _name(c.get("topic"), "topic", limits.TOPIC_NAME_CHARS_MAX)
    _int(c.get("queue"), "queue", 0, limits.QUEUES_PER_TOPIC_MAX - 1)
    _int(c.get("gen"), "gen", 0, 2**62)
    _int(c.get("end_offset"), "end_offset", 0, 2**62)
    if c.get("physical_queue") is not None and (not isinstance(c["physical_queue"], str) or len(c["physical_queue"]) > 300):
        raise invalid("physical_queue must be a string", field="physical_queue")


def _v_alter_in_sync(c):
    _v_broker_epoch(c)
    changes = c.get("changes")
    if not isinstance(changes, list) or not 1 <= len(changes) <= limits.IN_SYNC_CHANGES_MAX:
        raise invalid(f"changes must be a list of 1 to {limits.IN_SYNC_CHANGES_MAX} changes", field="changes")
    seen = set()
    for ch in changes:
        if not isinstance(ch, dict) or set(ch) != {"topic", "queue", "gen", "in_sync", "epochs"}:
            raise invalid("each change must be {topic, queue, gen, in_sync, epochs}", field="changes")
        _name(ch["topic"], "topic", limits.TOPIC_NAME_CHARS_MAX)
        _int(ch["queue"], "queue", 0, limits.QUEUES_PER_TOPIC_MAX - 1)
        _int(ch["gen"], "gen", 0, 2**62)
        in_sync = ch["in_sync"]
        if not isinstance(in_sync, list) or not 1 <= len(in_sync) <= limits.REPLICAS_MAX:
            raise invalid(f"in_sync must list 1 to {limits.REPLICAS_MAX} brokers", field="in_sync")
        _broker_list(in_sync, "in_sync")
        epochs = ch["epochs"]
        if not isinstance(epochs, dict) or len(epochs) > limits.REPLICAS_MAX:
            raise invalid(f"epochs must map at most {limits.REPLICAS_MAX} brokers to their epochs", field="epochs")
        for b, e in epochs.items():
            _name(b, "epochs", limits.BROKER_NAME_CHARS_MAX)
            _int(e, "epochs", 0, 2**62)
        key = (ch["topic"], ch["queue"])
        if key in seen:   # two changes of one queue in one command would both be decided on the same image
            raise invalid("changes names one queue twice", field="changes", topic=ch["topic"], queue=ch["queue"])
        seen.add(key)


GROUP_MODES = ("exclusive", "shared")
# Group settings: key -> (type, low, high). Values are JSON numbers or strings; null removes a key (default again).
GROUP_CONFIG_INTS = {
    "lease_ms": (limits.LEASE_MS_MIN, limits.LEASE_MS_MAX),
    "heartbeat_interval_ms": (limits.GROUP_HEARTBEAT_INTERVAL_MS_MIN, limits.GROUP_HEARTBEAT_INTERVAL_MS_MAX),
    "max_attempts": (1, limits.MAX_ATTEMPTS_MAX),
}
GROUP_CONFIG_KEYS = (*GROUP_CONFIG_INTS, "retry_topic", "mode")


def _group(c):
    _name(c.get("group"), "group", limits.GROUP_NAME_CHARS_MAX)
    _optional_version(c)


def _member(value: Any) -> str:
    return _name(value, "member", limits.MEMBER_NAME_CHARS_MAX)


def _lock_refs(value: Any, what: str, most: int) -> None:
    if not isinstance(value, list) or len(value) > most:
        raise invalid(f"{what} must be a list of at most {most} locks", field=what)
    for r in value:
        if not isinstance(r, dict) or set(r) != {"topic", "queue", "token"}:
            raise invalid(f"each of {what} must be {{topic, queue, token}}", field=what)
        _name(r["topic"], "topic", limits.TOPIC_NAME_CHARS_MAX)
        _int(r["queue"], "queue", 0, limits.QUEUES_PER_TOPIC_MAX - 1)
        _int(r["token"], "token", 1, 2**62)


def _v_join_group(c):
    _group(c)
    _member(c.get("member"))
    topics = c.get("topics")
    if not isinstance(topics, list) or not 1 <= len(topics) <= limits.GROUP_TOPICS_MAX:
        raise invalid(f"topics must be a list of 1 to {limits.GROUP_TOPICS_MAX} topic names", field="topics")
    for t in topics:
        _name(t, "topic", limits.TOPIC_NAME_CHARS_MAX)
    if len(set(topics)) != len(topics):
        raise invalid("topics has duplicates", field="topics")
    if c.get("mode") not in GROUP_MODES:
        raise invalid("mode must be 'exclusive' or 'shared'", field="mode")


def _v_leave_group(c):
    _group(c)
    _member(c.get("member"))


def _v_release_locks(c):
    _v_leave_group(c)
    _lock_refs(c.get("locks"), "released", limits.RELEASES_PER_HEARTBEAT_MAX)


def _v_expire_members(c):
    _group(c)
    members = c.get("members")
    if not isinstance(members, list) or not 1 <= len(members) <= limits.EXPIRIES_PER_COMMAND_MAX:
        raise invalid("members must be a non-empty list", field="members")
    for m in members:
        _member(m)


def _v_expire_locks(c):
    _group(c)
    _lock_refs(c.get("locks"), "locks", limits.EXPIRIES_PER_COMMAND_MAX)


def _v_group_config(c):
    _group(c)
    config = c.get("config")
    if not isinstance(config, dict) or not config:
        raise invalid(f"config must be a non-empty object of {', '.join(GROUP_CONFIG_KEYS)}", field="config")
    for k, v in config.items():
        if k not in GROUP_CONFIG_KEYS:
            raise invalid(f"unknown group setting {k[:64]!r}; known: {', '.join(GROUP_CONFIG_KEYS)}", field="config")
        if v is None:
            continue
        if k in GROUP_CONFIG_INTS:
            _int(v, k, *GROUP_CONFIG_INTS[k])
        elif k == "retry_topic":
            _name(v, k, limits.TOPIC_NAME_CHARS_MAX)
        elif v not in GROUP_MODES:
            raise invalid("mode must be 'exclusive' or 'shared'", field=k)


VALIDATORS = {
    "RegisterBroker": _v_register_broker,
    "DrainBroker": _v_drain_broker,
    "DrainStep": _v_drain_step,
    "SealedCopiesHeld": _v_copies_held,
    "FenceBroker": _v_fence_broker,
    "UnfenceBroker": _v_broker_epoch,
    "GrantOffsetBudget": _v_grant_budget,
    "CreateTopic": _v_create_topic,
    "GrowTopic": _v_grow_topic,
    "SetTopicConfig": _v_set_config,
    "DeleteTopic": _v_topic,
    "RemapTopic": _v_remap,
    "SealSegment": _v_seal,
    "SealSegments": _v_seal_many,
    "AlterInSync": _v_alter_in_sync,
    "ElectLeaders": _v_elect,
    "Barrier": lambda c: None,
    "JoinGroup": _v_join_group,
    "LeaveGroup": _v_leave_group,
    "ReleaseLocks": _v_release_locks,
    "ExpireMembers": _v_expire_members,
    "ExpireLocks": _v_expire_locks,
    "SetGroupConfig": _v_group_config,
}


def validate(cmd: Any) -> dict[str, Any]:
    if not isinstance(cmd, dict) or not isinstance(cmd.get("type"), str) or cmd["type"] not in VALIDATORS:
        raise invalid("unknown command", type=str(cmd.get("type"))[:100] if isinstance(cmd, dict) else None)
    VALIDATORS[cmd["type"]](cmd)
    return cmd
