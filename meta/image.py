"""The in-memory image of all metadata, changed only by replaying events (Kafka's MetadataImage + MetadataDelta).

The image is plain data (dicts, lists, ints, strings) so that a snapshot is the data itself, never a pickle of live
objects, and so that two replicas that replayed the same events compare byte for byte (``canonical_bytes``).
Replay does no I/O and reads no clock: times come from the leader's stamp on the command (``ts``). Each domain's
events are replayed in their own section, named in a table at the end of this file (``BROKER_REPLAYS``,
``TOPIC_REPLAYS``, ``GROUP_REPLAYS``); the commands that make them are decided in meta/deciders/.

Layout of ``Image.data``::

    version        last applied event's version (the metadata version)
    commands       commands applied, rejected ones included: two replicas agree byte for byte at equal counts
                   (the version alone does not pin the image: a rejection or a repeat changes last_ts and requests)
    last_ts        leader time of the last applied command (ms)
    brokers        {name: {broker, address, zone, epoch, state, registered_ms, last_seen_ms}}
    load           {broker: number of logic queues whose newest segment it hosts}
    hosting        {broker: {topic: number of its segments, of any generation, it holds a copy of}}: which topics
                   a broker event touches, without a scan of every segment
    topics         {name: {topic, incarnation, queues, slots, order, config, version, created_ms, replicas, min_insync,
                           slot_table, slot_table_version (the version that last changed it), barriers,
                           chains: per queue its segments in compact form (meta/chains.py)}}
    groups         {name: {group, mode, config, version, created_ms, members: {member: {member, topics, mode,
                           joined_ms}}, locks: {topic: {"<queue>": {member, token, target, granted_ms}}}}}
                   (meta/groups.py says what a lock entry means)
    lock_token     the last fencing token handed out (one counter for every lock)
    member_count   members of all groups
    subscriptions  {topic: {group: members of that group naming the topic}}: the groups a topic change concerns
    revoking       {group: locks of it being revoked}: where the leader looks for revocations whose lease ended
    requests       {request id: (fingerprint, ts, the outcome's JSON text)} in arrival order (idempotency); read
                   back from a snapshot each is a list (JSON has no tuple), read by position all the same, and frozen
                   out of the collector's walks with the rest of the restored image (MetaSyncObj._freeze_image)
    history        [stored event as canonical JSON, big ones packed: meta/history_lines.py] newest last, bounded;
                   history_start = version of history[0]; read them through history_kept_after / history_lines
    history_window events the history keeps (trimmed in chunks of a tenth past it): set by the leader's stamp on a
                   command envelope (meta/state_machine.py), never from a node's own config, so replicas agree
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from wire import json_body

from . import allocation, chains, groups, history_lines, limits
from .events import GROUP_EVENTS, UnknownEvent, stored

GROUP_KEY_PREFIX = "@"  # change-feed key of a group: never a topic name (commands.NAME_RE has no "@")


def group_key(name: str) -> str:
    return GROUP_KEY_PREFIX + name


def restoring_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object of a snapshot being parsed (json's object_pairs_hook): a topic is made compact at once, so that
    its parsed lists are freed before the next topic is parsed. Only a topic has these keys with these types (a
    config's values are strings)."""
    obj = dict(pairs)
    if isinstance(obj.get("incarnation"), int) and isinstance(obj.get("slot_table"), list) \
            and isinstance(obj.get("chains", obj.get("logic_queues")), list):
        try:
            _restore_topic(obj)
        except (KeyError, TypeError, IndexError, AttributeError) as e:   # the reader's "not a snapshot"
            raise ValueError(f"topic {str(obj.get('topic'))[:100]!r} is malformed: {e!r}") from None
    return obj


def _restore_topic(t: dict[str, Any]) -> None:
    """A topic read from a snapshot, in the image's compact form (in place): packed slot table, compact chains."""
    table = t["slot_table"]
    if isinstance(table, tuple):
        return   # already compact (restored while its snapshot was parsed: restoring_pairs)
    # A list per range in snapshots written before tables were packed; else the packed numbers as a JSON list.
    t["slot_table"] = allocation.packed_slot_table(table if table and isinstance(table[0], list) else [table])
    chains.restore(t)


def empty_data() -> dict[str, Any]:
    return {"version": 0, "commands": 0, "last_ts": 0, "brokers": {}, "load": {}, "hosting": {}, "topics": {}, "requests": {},
            "history": [], "history_start": 1, "groups": {}, "lock_token": 0, "member_count": 0,
            "subscriptions": {}, "revoking": {}, "history_window": limits.HISTORY_EVENTS_MAX,
            "members": []}   # the voters (meta/raft/membership.py): set by membership entries, not by events


class Image:
    def __init__(self, data: dict[str, Any] | None = None):
        self.data = data if data is not None else empty_data()
        for key, value in empty_data().items():  # a snapshot written before a part of the image existed
            self.data.setdefault(key, value)
        for t in self.data["topics"].values():  # from a snapshot: JSON lists back into shared tuples
            _restore_topic(t)
        # Node-local, never part of ``data`` (so never replicated nor in a snapshot): where the history the window
        # trims goes, as (version, line as kept: meta/history_lines.py), for this node's projection to take before
        # it is gone (meta/raft/node.py sets a bounded deque; None, the default, keeps nothing: offline replays and
        # tests).
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
        """The segment as a dict (a copy: the image changes only through replay)."""
        t = self.topic(topic)
        if t is None or not 0 <= queue < t["queues"]:
            return None
        for seg in reversed(chains.segments(t["chains"][queue])):
            if seg[chains.GEN] == gen:
                return chains.as_dict(t, queue, seg)
        return None

    def _change_segment(self, topic: str, queue: int, gen: int, **changes: Any) -> None:
        t = self.data["topics"][topic]
        segs = list(chains.segments(t["chains"][queue]))
        i = next(i for i in range(len(segs) - 1, -1, -1) if segs[i][chains.GEN] == gen)
        segs[i] = chains.replaced(segs[i], **changes)
        t["chains"][queue] = chains.entry_of(tuple(segs))

    def history_kept_after(self, after: int, limit: int) -> list[str]:
        """Up to ``limit`` lines after version ``after`` as the image keeps them (big ones packed): a slice, cheap
        under the image lock; unpack them after it is released (``history_lines.unpacked``)."""
        start = max(after + 1, self.data["history_start"])
        i = start - self.data["history_start"]
        return self.data["history"][i:i + limit]

    def history_after(self, after: int, limit: int) -> list[str]:
        """Up to ``limit`` lines after version ``after``, unpacked: for readers of an image no other thread changes."""
        return history_lines.unpacked(self.history_kept_after(after, limit))

    def history_lines(self) -> list[str]:
        """Every line the window holds, oldest first (version ``history_start`` first)."""
        return history_lines.unpacked(self.data["history"])

    def canonical_bytes(self) -> bytes:
        """The image as bytes, keys in insertion order: the order is itself state (the oldest remembered request
        is evicted first) and replaying the same log inserts in the same order on every replica."""
        data = {**self.data, "history": self.history_lines()}  # the same key order; lines compared unpacked
        # Who serves the metadata is not part of it: a cluster restored from a backup has other disks, and its own
        # membership (meta/raft/membership.py); replicas compare their voters through the cluster status.
        data.pop("members", None)
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()

    # -- replay ------------------------------------------------------------------------------------------------
    def replay(self, event: dict[str, Any], ts: int) -> set[str]:
        """Fold one event in; returns the topics whose route changed."""
        handler = REPLAYS.get(event["type"])
        if handler is None:
            raise UnknownEvent(event["type"])
        self.data["version"] += 1
        version = self.data["version"]
        changed = handler(self, event, ts) or set()
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
        history.append(history_lines.pack(json_body.canonical(stored_event).decode()))
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

    # -- replay of brokers' events (BROKER_REPLAYS) ---------------------------------------------------------------
    def _on_BrokerRegistered(self, e, ts):
        old = self.data["brokers"].get(e["broker"])
        self.data["brokers"][e["broker"]] = {
            "broker": e["broker"], "address": e["address"], "zone": e["zone"], "cluster": e["cluster"],
            "epoch": e["epoch"], "disk": e["disk"], "draining": old["draining"] if old else False,
            "drain_to": old["drain_to"] if old else None, "copies_version": old["copies_version"] if old else 0,
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

    def _on_BrokerDrainChanged(self, e, ts):
        b = self.data["brokers"][e["broker"]]
        b["draining"], b["drain_to"] = e["draining"], e["to"]
        return None

    # -- replay of topics' and segments' events (TOPIC_REPLAYS) ---------------------------------------------------
    def _on_TopicCreated(self, e, ts):
        t = self.data["topics"][e["topic"]] = {
            "topic": e["topic"], "incarnation": e["incarnation"], "queues": e["queues"], "slots": e["slots"],
            "order": e["order"], "config": dict(e["config"]), "version": 0, "created_ms": ts,
            "replicas": e["replicas"], "min_insync": e["min_insync"], "scope": e["scope"],
            "slot_table": allocation.packed_slot_table(e["slot_table"]), "slot_table_version": self.data["version"],
            "barriers": [], "chains": [None] * e["queues"]}
        self._place_first_segments(t, e["segments"], ts)

    def _place_first_segments(self, t: dict[str, Any], placed: list[dict[str, Any]], ts: int) -> None:
        # Every node applies a creation under the image lock, and a 1,000-queue one held the interpreter long enough
        # (made by the dozen in ops.bench.scale) to starve the raft tick into elections: so queues placed alike
        # share one segment made once (meta/chains.py), and each broker's load and hosting count change once per
        # topic, not once per queue (the counts only grow here, so the sums are the same, in the same key order).
        shared: dict[tuple, tuple] = {}
        led: dict[str, int] = {}
        hosted: dict[str, int] = {}
        topic, incarnation = t["topic"], t["incarnation"]
        for s in placed:
            broker, pq = s["broker"], s["physical_queue"]
            key = (broker, None if pq == allocation.physical_queue_name(topic, incarnation, s["queue"], 0) else pq,
                   s["budget_end"], tuple(s["replicas"]), tuple(s["in_sync"]))
            seg = shared.get(key)
            if seg is None:
                seg = shared[key] = chains.new_segment(t, s["queue"], 0, broker, pq, 0, 0, s["budget_end"], ts,
                                                       s["replicas"], s["in_sync"])
            t["chains"][s["queue"]] = seg
            led[broker] = led.get(broker, 0) + 1
            for b in s["replicas"]:
                hosted[b] = hosted.get(b, 0) + 1
        for broker, n in led.items():
            self._load(broker, n)
        for broker, n in hosted.items():
            self._host(broker, topic, n)

    def _on_TopicGrown(self, e, ts):
        t = self.data["topics"][e["topic"]]
        t["chains"].extend(None for _ in range(e["queues"] - t["queues"]))
        t["queues"] = e["queues"]
        t["slot_table"] = allocation.packed_slot_table(e["slot_table"])
        t["slot_table_version"] = self.data["version"]
        for b in e["barriers"]:
            t["barriers"].append({"queue": b["queue"], "after_queue": b["after_queue"], "after_gen": b["after_gen"],
                                  "after_offset": None})
        self._place_first_segments(t, e["segments"], ts)

    def _on_TopicConfigChanged(self, e, ts):
        self.data["topics"][e["topic"]]["config"] = dict(e["config"])

    def _on_TopicDeleted(self, e, ts):
        t = self.data["topics"].pop(e["topic"])
        for entry in t["chains"]:
            self._load(chains.head(entry)[chains.BROKER], -1)
            for seg in chains.segments(entry):
                for b in seg[chains.REPLICAS]:
                    self._host(b, e["topic"], -1)

    def _on_OffsetBudgetGranted(self, e, ts):
        self._change_segment(e["topic"], e["queue"], e["gen"], budget_end=e["budget_end"])

    def _on_SegmentSealing(self, e, ts):
        seg = self.segment(e["topic"], e["queue"], e["gen"])
        self._change_segment(e["topic"], e["queue"], e["gen"], state="sealing",
                             sealer=e["broker"] if e["broker"] != seg["broker"] else None)

    def _on_SegmentSealed(self, e, ts):
        self._change_segment(e["topic"], e["queue"], e["gen"], state="sealed", logic_end=e["logic_end"],
                             physical_end=e["physical_end"], sealed_ms=ts, sealed_by=e["by"])

    def _on_SegmentOpened(self, e, ts):
        t = self.data["topics"][e["topic"]]
        segs = chains.segments(t["chains"][e["queue"]])
        self._load(segs[-1][chains.BROKER], -1)
        opened = chains.new_segment(t, e["queue"], e["gen"], e["broker"], e["physical_queue"], e["physical_start"],
                                    None, e["budget_end"], ts, e["replicas"], e["in_sync"])
        t["chains"][e["queue"]] = (*segs, opened)
        self._load(e["broker"], 1)
        for b in e["replicas"]:
            self._host(b, e["topic"], 1)

    def _on_InSyncChanged(self, e, ts):
        self._change_segment(e["topic"], e["queue"], e["gen"], in_sync=chains.names(e["in_sync"]))

    def _on_SegmentCopiesChanged(self, e, ts):
        t = self.data["topics"][e["topic"]]
        seg = next(s for s in reversed(chains.segments(t["chains"][e["queue"]])) if s[chains.GEN] == e["gen"])
        old, new = set(seg[chains.REPLICAS]), set(e["replicas"])
        for b in sorted(new - old):
            self._host(b, e["topic"], 1)
            self.data["brokers"][b]["copies_version"] += 1   # its heartbeat answer tells it to catch the copy up
        for b in sorted(old - new):
            self._host(b, e["topic"], -1)
        self._change_segment(e["topic"], e["queue"], e["gen"], replicas=chains.names(e["replicas"]),
                             in_sync=chains.names(e["in_sync"]))

    def _on_LogicStartDecided(self, e, ts):
        t = self.data["topics"][e["topic"]]
        self._change_segment(e["topic"], e["queue"], e["gen"], logic_start=e["logic_start"])
        for b in t["barriers"]:
            if b["after_queue"] == e["queue"] and b["after_gen"] == e["gen"]:
                b["after_offset"] = e["logic_start"]

    # -- replay of groups' and locks' events (GROUP_REPLAYS) ------------------------------------------------------
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
        before = groups.effective_config(e["group"], g)["lease_ms"]
        g["config"] = dict(e["config"])
        if "mode" in g["config"]:
            g["mode"] = g["config"]["mode"]
        if groups.effective_config(e["group"], g)["lease_ms"] < before:
            g["lease_promised"] = groups.promise_after_shortening(g.get("lease_promised"), before, ts)

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


# Which method replays each event, one table per domain (meta/events.py: BROKER_EVENTS, TOPIC_EVENTS, GROUP_EVENTS;
# tests/test_deciders.py checks they match).
BROKER_REPLAYS = {
    "BrokerRegistered": Image._on_BrokerRegistered,
    "BrokerFenced": Image._on_BrokerFenced,
    "BrokerUnfenced": Image._on_BrokerUnfenced,
    "BrokerDrainChanged": Image._on_BrokerDrainChanged,
}
TOPIC_REPLAYS = {
    "TopicCreated": Image._on_TopicCreated,
    "TopicGrown": Image._on_TopicGrown,
    "TopicConfigChanged": Image._on_TopicConfigChanged,
    "TopicDeleted": Image._on_TopicDeleted,
    "OffsetBudgetGranted": Image._on_OffsetBudgetGranted,
    "SegmentSealing": Image._on_SegmentSealing,
    "SegmentSealed": Image._on_SegmentSealed,
    "SegmentOpened": Image._on_SegmentOpened,
    "LogicStartDecided": Image._on_LogicStartDecided,
    "InSyncChanged": Image._on_InSyncChanged,
    "SegmentCopiesChanged": Image._on_SegmentCopiesChanged,
}
GROUP_REPLAYS = {
    "GroupMemberJoined": Image._on_GroupMemberJoined,
    "GroupMemberLeft": Image._on_GroupMemberLeft,
    "GroupConfigChanged": Image._on_GroupConfigChanged,
    "LockGranted": Image._on_LockGranted,
    "LockTargetChanged": Image._on_LockTargetChanged,
    "LockReleased": Image._on_LockReleased,
}
REPLAYS = {**BROKER_REPLAYS, **TOPIC_REPLAYS, **GROUP_REPLAYS}
