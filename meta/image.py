"""The in-memory image of all metadata, changed only by replaying events (Kafka's MetadataImage + MetadataDelta).

The image is plain data (dicts, lists, ints, strings) so that a snapshot is the data itself, never a pickle of live
objects, and so that two replicas that replayed the same events compare byte for byte (``canonical_bytes``).
Replay does no I/O and reads no clock: times come from the leader's stamp on the command (``ts``).

Layout of ``Image.data``::

    version        last applied event's version (the metadata version)
    commands       commands applied, rejected ones included: two replicas agree byte for byte at equal counts
                   (the version alone does not pin the image: a rejection or a repeat changes last_ts and requests)
    last_ts        leader time of the last applied command (ms)
    brokers        {name: {broker, address, zone, epoch, state, registered_ms, last_seen_ms}}
    load           {broker: number of logic queues whose newest segment it hosts}
    hosting        {broker: {topic: number of its segments, of any generation, on that broker}}: which topics a
                   broker event touches, without a scan of every segment
    topics         {name: {topic, incarnation, queues, slots, order, config, version, created_ms,
                           slot_table, slot_table_version (the version that last changed it), barriers,
                           logic_queues: [[segment, ...] per queue]}}
    groups         {name: {group, mode, config, version, created_ms, members: {member: {member, topics, mode,
                           joined_ms}}, locks: {topic: {"<queue>": {member, token, target, granted_ms}}}}}
                   (meta/groups.py says what a lock entry means)
    lock_token     the last fencing token handed out (one counter for every lock)
    member_count   members of all groups
    subscriptions  {topic: {group: members of that group naming the topic}}: the groups a topic change concerns
    revoking       {group: locks of it being revoked}: where the leader looks for revocations whose lease ended
    requests       {request id: [fingerprint, ts, outcome]} in arrival order (idempotency)
    history        [stored event as canonical JSON] newest last, bounded; history_start = version of history[0]
    history_window events the history keeps (trimmed in chunks of a tenth past it): set by the leader's stamp on a
                   command envelope (meta/state_machine.py), never from a node's own config, so replicas agree
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from . import limits
from .events import GROUP_EVENTS, UnknownEvent, stored

GROUP_KEY_PREFIX = "@"  # change-feed key of a group: never a topic name (commands.NAME_RE has no "@")


def group_key(name: str) -> str:
    return GROUP_KEY_PREFIX + name


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def empty_data() -> dict[str, Any]:
    return {"version": 0, "commands": 0, "last_ts": 0, "brokers": {}, "load": {}, "hosting": {}, "topics": {}, "requests": {},
            "history": [], "history_start": 1, "groups": {}, "lock_token": 0, "member_count": 0,
            "subscriptions": {}, "revoking": {}, "history_window": limits.HISTORY_EVENTS_MAX}


class Image:
    def __init__(self, data: dict[str, Any] | None = None):
        self.data = data if data is not None else empty_data()
        for key, value in empty_data().items():  # a snapshot written before a part of the image existed
            self.data.setdefault(key, value)
        # Node-local, never part of ``data`` (so never replicated nor in a snapshot): where the history the window
        # trims goes, as (version, line), for this node's projection to take before it is gone (meta/raft_node.py
        # sets a bounded deque; None, the default, keeps nothing: offline replays and tests).
        self.trimmed_to: deque[tuple[int, str]] | None = None

    # -- reads -------------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self.data["version"]

    @property
    def topics(self) -> dict[str, dict[str, Any]]:
        return self.data["topics"]

    @property
    def brokers(self) -> dict[str, dict[str, Any]]:
        return self.data["brokers"]

    @property
    def groups(self) -> dict[str, dict[str, Any]]:
        return self.data["groups"]

    def topic(self, name: str) -> dict[str, Any] | None:
        return self.data["topics"].get(name)

    def queue_count(self, topic: str) -> int | None:
        t = self.data["topics"].get(topic)
        return t["queues"] if t is not None else None

    def segment(self, topic: str, queue: int, gen: int) -> dict[str, Any] | None:
        t = self.topic(topic)
        if t is None or not 0 <= queue < t["queues"]:
            return None
        for seg in reversed(t["logic_queues"][queue]):
            if seg["gen"] == gen:
                return seg
        return None

    def history_after(self, after: int, limit: int) -> list[str]:
        start = max(after + 1, self.data["history_start"])
        i = start - self.data["history_start"]
        return self.data["history"][i:i + limit]

    def canonical_bytes(self) -> bytes:
        """The image as bytes, keys in insertion order: the order is itself state (the oldest remembered request
        is evicted first) and replaying the same log inserts in the same order on every replica."""
        return json.dumps(self.data, separators=(",", ":"), ensure_ascii=False).encode()

    # -- replay ------------------------------------------------------------------------------------------------
    def replay(self, event: dict[str, Any], ts: int) -> set[str]:
        """Fold one event in; returns the topics whose route changed."""
        handler = getattr(self, "_on_" + event["type"], None)
        if handler is None:
            raise UnknownEvent(event["type"])
        self.data["version"] += 1
        version = self.data["version"]
        changed = handler(event, ts) or set()
        if event["type"] in GROUP_EVENTS:
            # A lock event names its topic for history, but changes the group, never the topic's route.
            self.data["groups"][event["group"]]["version"] = version
            changed.add(group_key(event["group"]))
        elif event.get("topic") is not None:
            changed.add(event["topic"])
        for name in changed:
            t = self.data["topics"].get(name)
            if t is not None:
                t["version"] = version
        self._record(stored(version, ts, event))
        return changed

    def _record(self, stored_event: dict[str, Any]) -> None:
        history = self.data["history"]
        history.append(canonical_json(stored_event))
        # Trim in chunks so that trimming is amortised O(1) yet deterministic.
        window = self.data["history_window"]
        excess = len(history) - window
        if excess >= max(1, window // 10):
            if self.trimmed_to is not None:
                start = self.data["history_start"]
                self.trimmed_to.extend((start + i, line) for i, line in enumerate(history[:excess]))
            del history[:excess]
            self.data["history_start"] += excess

    def _load(self, broker: str, delta: int) -> None:
        load = self.data["load"]
        n = load.get(broker, 0) + delta
        if n:
            load[broker] = n
        else:
            load.pop(broker, None)

    def topics_on(self, broker: str) -> list[str]:
        return sorted(self.data["hosting"].get(broker, ()))

    def _host(self, broker: str, topic: str, delta: int) -> None:
        topics = self.data["hosting"].setdefault(broker, {})
        n = topics.get(topic, 0) + delta
        if n:
            topics[topic] = n
        else:
            topics.pop(topic, None)
            if not topics:
                del self.data["hosting"][broker]

    # brokers
    def _on_BrokerRegistered(self, e, ts):
        old = self.data["brokers"].get(e["broker"])
        self.data["brokers"][e["broker"]] = {
            "broker": e["broker"], "address": e["address"], "zone": e["zone"], "epoch": e["epoch"],
            "state": "active", "registered_ms": ts, "last_seen_ms": ts}
        if old is not None and (old["address"] != e["address"] or old["state"] != "active"):
            return set(self.topics_on(e["broker"]))
        return None

    def _on_BrokerFenced(self, e, ts):
        b = self.data["brokers"][e["broker"]]
        b["state"] = "fenced"
        return set(self.topics_on(e["broker"]))

    def _on_BrokerUnfenced(self, e, ts):
        b = self.data["brokers"][e["broker"]]
        b["state"] = "active"
        b["last_seen_ms"] = ts
        return set(self.topics_on(e["broker"]))

    # topics
    def _on_TopicCreated(self, e, ts):
        queues: list[list[dict[str, Any]]] = [[] for _ in range(e["queues"])]
        for s in e["segments"]:
            queues[s["queue"]].append(_segment(0, s["broker"], s["physical_queue"], 0, 0, s["budget_end"], ts))
            self._load(s["broker"], 1)
            self._host(s["broker"], e["topic"], 1)
        self.data["topics"][e["topic"]] = {
            "topic": e["topic"], "incarnation": e["incarnation"], "queues": e["queues"], "slots": e["slots"],
            "order": e["order"], "config": dict(e["config"]), "version": 0, "created_ms": ts,
            "slot_table": [list(r) for r in e["slot_table"]], "slot_table_version": self.data["version"],
            "barriers": [], "logic_queues": queues}

    def _on_TopicGrown(self, e, ts):
        t = self.data["topics"][e["topic"]]
        t["logic_queues"].extend([] for _ in range(e["queues"] - t["queues"]))
        t["queues"] = e["queues"]
        t["slot_table"] = [list(r) for r in e["slot_table"]]
        t["slot_table_version"] = self.data["version"]
        for b in e["barriers"]:
            t["barriers"].append({"queue": b["queue"], "after_queue": b["after_queue"], "after_gen": b["after_gen"],
                                  "after_offset": None})
        for s in e["segments"]:
            t["logic_queues"][s["queue"]].append(
                _segment(0, s["broker"], s["physical_queue"], 0, 0, s["budget_end"], ts))
            self._load(s["broker"], 1)
            self._host(s["broker"], e["topic"], 1)

    def _on_TopicConfigChanged(self, e, ts):
        self.data["topics"][e["topic"]]["config"] = dict(e["config"])

    def _on_TopicDeleted(self, e, ts):
        t = self.data["topics"].pop(e["topic"])
        for segs in t["logic_queues"]:
            self._load(segs[-1]["broker"], -1)
            for seg in segs:
                self._host(seg["broker"], e["topic"], -1)

    def _on_OffsetBudgetGranted(self, e, ts):
        self.segment(e["topic"], e["queue"], e["gen"])["budget_end"] = e["budget_end"]

    # segments
    def _on_SegmentSealing(self, e, ts):
        self.segment(e["topic"], e["queue"], e["gen"])["state"] = "sealing"

    def _on_SegmentSealed(self, e, ts):
        seg = self.segment(e["topic"], e["queue"], e["gen"])
        seg["state"] = "sealed"
        seg["logic_end"] = e["logic_end"]
        seg["physical_end"] = e["physical_end"]
        seg["sealed_ms"] = ts
        seg["sealed_by"] = e["by"]

    def _on_SegmentOpened(self, e, ts):
        t = self.data["topics"][e["topic"]]
        segs = t["logic_queues"][e["queue"]]
        self._load(segs[-1]["broker"], -1)
        segs.append(_segment(e["gen"], e["broker"], e["physical_queue"], e["physical_start"], None,
                             e["budget_end"], ts))
        self._load(e["broker"], 1)
        self._host(e["broker"], e["topic"], 1)

    def _on_LogicStartDecided(self, e, ts):
        t = self.data["topics"][e["topic"]]
        self.segment(e["topic"], e["queue"], e["gen"])["logic_start"] = e["logic_start"]
        for b in t["barriers"]:
            if b["after_queue"] == e["queue"] and b["after_gen"] == e["gen"]:
                b["after_offset"] = e["logic_start"]


    # groups
    def _on_GroupMemberJoined(self, e, ts):
        g = self._group(e["group"], ts)
        if g["mode"] is None:
            g["mode"] = e["mode"]
        old = g["members"].get(e["member"])
        if old is None:
            self.data["member_count"] += 1
        else:
            self._subscribe(e["group"], old["topics"], -1)
        g["members"][e["member"]] = {"member": e["member"], "topics": list(e["topics"]), "mode": e["mode"],
                                     "joined_ms": old["joined_ms"] if old else ts}
        self._subscribe(e["group"], e["topics"], 1)

    def _on_GroupMemberLeft(self, e, ts):
        old = self.data["groups"][e["group"]]["members"].pop(e["member"])
        self.data["member_count"] -= 1
        self._subscribe(e["group"], old["topics"], -1)

    def _on_GroupConfigChanged(self, e, ts):
        g = self._group(e["group"], ts)
        g["config"] = dict(e["config"])
        if "mode" in g["config"]:
            g["mode"] = g["config"]["mode"]

    def _on_LockGranted(self, e, ts):
        locks = self.data["groups"][e["group"]]["locks"].setdefault(e["topic"], {})
        locks[str(e["queue"])] = {"member": e["member"], "token": e["token"], "target": e["member"], "granted_ms": ts}
        self.data["lock_token"] = max(self.data["lock_token"], e["token"])

    def _on_LockTargetChanged(self, e, ts):
        lk = self.data["groups"][e["group"]]["locks"][e["topic"]][str(e["queue"])]
        before = lk["target"] != lk["member"]
        lk["target"] = e["target"]
        self._revoking(e["group"], (lk["target"] != lk["member"]) - before)

    def _on_LockReleased(self, e, ts):
        locks = self.data["groups"][e["group"]]["locks"]
        lk = locks[e["topic"]].pop(str(e["queue"]))
        if not locks[e["topic"]]:
            del locks[e["topic"]]
        self._revoking(e["group"], -(lk["target"] != lk["member"]))

    def _group(self, name: str, ts: int) -> dict[str, Any]:
        g = self.data["groups"].get(name)
        if g is None:
            g = self.data["groups"][name] = {"group": name, "mode": None, "config": {}, "version": 0,
                                             "created_ms": ts, "members": {}, "locks": {}}
        return g

    def _subscribe(self, group: str, topics: list[str], delta: int) -> None:
        subs = self.data["subscriptions"]
        for t in topics:
            n = subs.setdefault(t, {}).get(group, 0) + delta
            if n:
                subs[t][group] = n
            else:
                del subs[t][group]
                if not subs[t]:
                    del subs[t]

    def _revoking(self, group: str, delta: int) -> None:
        if delta:
            n = self.data["revoking"].get(group, 0) + delta
            if n:
                self.data["revoking"][group] = n
            else:
                del self.data["revoking"][group]


def _segment(gen: int, broker: str, pq: str, physical_start: int, logic_start: int | None, budget_end: int,
             ts: int) -> dict[str, Any]:
    return {"gen": gen, "broker": broker, "physical_queue": pq, "physical_start": physical_start,
            "logic_start": logic_start, "logic_end": None, "physical_end": None, "budget_end": budget_end,
            "state": "active", "opened_ms": ts, "sealed_ms": None, "sealed_by": None}
