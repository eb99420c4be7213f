"""Every event the meta log can yield, as plain data with a schema version.

An event is a dict ``{"type": <name>, "v": <schema version>, ...fields}``. Events are what the state machine
decides; the image (meta/image.py) changes only by replaying them, on the leader and on followers alike.
When an event is stored (history, SQL projection, export) it is wrapped as
``{"version": <metadata version>, "ts": <leader ms>, "type": <name>, "v": <schema version>, "topic": <topic or null>,
"data": <fields>}``, so that readers of stored history (projection, export) can tell schema versions apart.

Changing a field's meaning needs a new schema version here and a branch in the replay for the old one.
"""

from __future__ import annotations

from typing import Any

# name -> (schema version, {field: documentation})
EVENT_SCHEMAS: dict[str, tuple[int, dict[str, str]]] = {
    "BrokerRegistered": (3, {
        "broker": "broker name",
        "address": "base URL of the broker's data API",
        "zone": "availability zone or null",
        "cluster": "the cluster it belongs to (its config's; 'DefaultCluster' when it names none): topics scoped to "
                   "that cluster place queues and copies on it",
        "epoch": "session epoch; grows with every registration of this broker",
        "disk": "the id of the data directory it registered with (wire/disk_identity.py), or null when not told: "
                "the one of its previous registration means it kept its copies; any other, that it lost them",
    }),
    "BrokerFenced": (1, {
        "broker": "broker name",
        "epoch": "the session epoch that was fenced",
        "reason": "'session_expired', or 'connection_refused' (a peer could not reach it and its address refused "
                  "the leader's connection: its process is gone)",
    }),
    "BrokerUnfenced": (1, {
        "broker": "broker name",
        "epoch": "the session epoch that heartbeats again",
    }),
    "BrokerDrainChanged": (1, {
        "broker": "broker name",
        "draining": "true while the copies it holds move off it (no new copy is placed on it); false stops that",
        "to": "the brokers its copies go to first (stator broker replace B --with C), or null",
    }),
    "OffsetBudgetGranted": (1, {
        "topic": "topic name", "queue": "logic queue id", "gen": "segment generation",
        "broker": "broker hosting the segment",
        "budget_end": "physical offset (exclusive) the broker may write up to in this segment",
    }),
    "TopicCreated": (4, {
        "topic": "topic name",
        "incarnation": "metadata version that created it; part of every physical queue name",
        "queues": "number of logic queues",
        "slots": "number of key slots",
        "order": "'best_tried' or 'strict'",
        "config": "initial config map",
        "replicas": "copies of each queue's head (1-5)",
        "min_insync": "in-sync copies below which a send is refused (1-replicas)",
        "scope": "'global' (any broker), or the clusters its queues and their copies stay in",
        "slot_table": "[[lo, hi, queue]] covering every slot exactly once",
        "segments": "[{queue, broker, physical_queue, budget_end, replicas, in_sync}]: gen 0 of each queue, "
                    "logic_start 0; replicas leader first, in_sync the active ones of them",
    }),
    "TopicGrown": (3, {
        "topic": "topic name",
        "queues": "the new number of logic queues",
        "slot_table": "the new slot table",
        "barriers": "[{queue, after_queue, after_gen}]: new queue waits for after_queue's segment after_gen to start",
        "segments": "[{queue, broker, physical_queue, budget_end, replicas, in_sync}]: gen 0 of each new queue; "
                    "replicas may name fenced brokers, which in_sync leaves out",
    }),
    "TopicConfigChanged": (1, {
        "topic": "topic name",
        "config": "the whole config after the change",
        "changed": "keys set by this change",
    }),
    "TopicDeleted": (1, {"topic": "topic name"}),
    "SegmentSealing": (1, {
        "topic": "topic name", "queue": "logic queue id", "gen": "generation being sealed",
        "broker": "broker that must stop writes and report the end: the segment's leader, or the in-sync replica "
                  "elected when its leader was fenced",
    }),
    "SegmentSealed": (1, {
        "topic": "topic name", "queue": "logic queue id", "gen": "sealed generation",
        "broker": "broker hosting it",
        "physical_end": "physical offset (exclusive) of the last message + 1",
        "logic_end": "logic offset (exclusive) the segment ends at",
        "by": "'broker' (reported end), 'session_expired' (end of the granted budget) or 'disk_lost' (its broker "
              "came back on a new disk with no copy in sync to report the end: end of the granted budget)",
    }),
    "SegmentOpened": (2, {
        "topic": "topic name", "queue": "logic queue id", "gen": "new generation (the queue's new leader epoch)",
        "broker": "broker hosting the new segment: its leader",
        "from_broker": "broker of the previous generation",
        "physical_queue": "name of the physical queue on the broker (the same on every replica)",
        "physical_start": "first physical offset of this segment",
        "budget_end": "initial write budget (physical, exclusive)",
        "replicas": "brokers holding a copy, leader first",
        "in_sync": "replicas the leader waits for before it acknowledges (the leader among them)",
        "cause": "'remap', 'grow', 'failover' (the previous leader was fenced or lost its disk; an in-sync "
                 "replica leads), 'restart' (the leader "
                 "registered again on its disk: it leads on in a new gen from its copy's end), 'disk_lost' (the "
                 "leader came back on a new disk with no copy in sync to take over: the old gen ends at its budget "
                 "and the leader leads on from there) or "
                 "'unclean' (an operator elected an out-of-sync replica: what it missed is lost) or 'drain' (the "
                 "head's copies moved off a broker being drained)",
    }),
    "SegmentCopiesChanged": (1, {
        "topic": "topic name", "queue": "logic queue id", "gen": "segment generation (a sealed one)",
        "replicas": "the brokers holding a copy of it now",
        "in_sync": "of those, the ones holding it whole (reads ask them)",
        "reason": "'moving' (a drain placed a copy on another broker, which catches it up) or 'moved' (that copy "
                  "holds it whole: the draining broker's copy is no longer named)",
    }),
    "InSyncChanged": (1, {
        "topic": "topic name", "queue": "logic queue id", "gen": "generation (the leader epoch it was asked in)",
        "in_sync": "the in-sync set after the change, leader first",
        "reason": "'caught_up' or 'lagging' (the leader asked), or 'fenced' (a replica's broker was fenced or "
                  "registered again: it may have lost its disk)",
    }),
    "LogicStartDecided": (1, {
        "topic": "topic name", "queue": "logic queue id", "gen": "generation",
        "logic_start": "logic offset of the segment's first message",
    }),
    # Consumer groups. Lock events name their topic too (history filters by it), but they change the group, never the
    # topic's route: image.replay keys them by group (GROUP_EVENTS, below).
    "GroupMemberJoined": (1, {
        "group": "group name", "member": "member id chosen by the client",
        "topics": "topics the member consumes", "mode": "'exclusive' (ordered, locks) or 'shared' (pop)",
    }),
    "GroupMemberLeft": (1, {
        "group": "group name", "member": "member id",
        "reason": "'left' (it asked) or 'lease_expired' (no heartbeat for the group's lease_ms)",
    }),
    "GroupConfigChanged": (1, {
        "group": "group name", "config": "the group's settings after the change (only the keys set)",
        "changed": "keys set or removed by this change",
    }),
    "LockGranted": (1, {
        "group": "group name", "topic": "topic name", "queue": "logic queue id", "member": "new owner",
        "token": "fencing token: larger than every earlier grant of any lock",
    }),
    "LockTargetChanged": (1, {
        "group": "group name", "topic": "topic name", "queue": "logic queue id", "member": "current owner",
        "token": "the owner's token (still current until released)",
        "target": "member the queue should go to (null: nobody); != owner means the owner is asked to release it",
    }),
    "LockReleased": (1, {
        "group": "group name", "topic": "topic name", "queue": "logic queue id", "member": "owner until now",
        "token": "the token that stops being current",
        "reason": "'released' (the owner gave it up), 'left', 'lease_expired' or 'topic_deleted'",
    }),
}

# Each event's domain, named (tests/test_deciders.py: every event in exactly one). The image replays each domain's
# events in its own section (meta/image.py's *_REPLAYS); the projection and the export keep a group's events apart.
BROKER_EVENTS = frozenset({"BrokerRegistered", "BrokerFenced", "BrokerUnfenced", "BrokerDrainChanged"})
# Topics and their segments: each names its topic, and changes that topic's route (and version).
TOPIC_EVENTS = frozenset({
    "TopicCreated", "TopicGrown", "TopicConfigChanged", "TopicDeleted",
    "OffsetBudgetGranted", "SegmentSealing", "SegmentSealed", "SegmentOpened", "LogicStartDecided", "InSyncChanged",
    "SegmentCopiesChanged",
})
# Consumer groups and their locks: each names its group, and changes the group, never a topic's route, even when it
# names a topic too (image.replay keys them by group).
GROUP_EVENTS = frozenset({
    "GroupMemberJoined", "GroupMemberLeft", "GroupConfigChanged", "LockGranted", "LockTargetChanged", "LockReleased",
})
DOMAINS: dict[str, frozenset[str]] = {"brokers": BROKER_EVENTS, "topics": TOPIC_EVENTS, "groups": GROUP_EVENTS}


class UnknownEvent(ValueError):
    pass


def make(event_type: str, **fields: Any) -> dict[str, Any]:
    """Build an event, checking that its fields are exactly the schema's (a typo must fail loudly)."""
    try:
        version, schema = EVENT_SCHEMAS[event_type]
    except KeyError:
        raise UnknownEvent(event_type) from None
    if fields.keys() != schema.keys():
        raise ValueError(f"{event_type} fields {sorted(fields)} != schema {sorted(schema)}")
    return {"type": event_type, "v": version, **fields}


def stored(version: int, ts: int, event: dict[str, Any]) -> dict[str, Any]:
    """The stored form of an event (history API, projection, export)."""
    data = dict(event)
    data.pop("type", None)
    data.pop("v", None)
    return {"version": version, "ts": ts, "type": event["type"], "v": event["v"], "topic": event.get("topic"),
            "data": data}
