"""The pure, deterministic state machine: a command envelope in, events out, folded into the image.

``apply(envelope)`` is the only entry point the Raft adapter calls. It
1. answers a repeated request id with the first outcome (idempotency survives LEADER_CHANGED / UNKNOWN_OUTCOME retries),
2. validates and decides against the image, producing events or a rejection (a rejection changes nothing),
3. replays the events into the image, each event taking the next version,
4. remembers the outcome under the request id.
No clock, randomness or I/O: the leader's time arrives in ``envelope["ts"]``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from . import allocation, chains, groups, limits
from .commands import validate
from wire import json_body
from wire.errors import ApiError, invalid, rejection
from .events import make
from .image import Image
from . import raft_membership

Outcome = dict[str, Any]


class StateMachine:
    def __init__(self, image: Image | None = None):
        self.image = image or Image()
        self._budget = limits.OFFSET_BUDGET_DEFAULT  # the grant stamped into the envelope being applied

    # -- the entry point ---------------------------------------------------------------------------------------
    def apply_membership(self, envelope: Any) -> Outcome:
        """A membership entry (meta/raft_membership.py): the voters, recorded in the image so that snapshots carry
        them. It changes no topic and makes no event; what is not a well-formed membership changes nothing."""
        cmd = envelope.get("cmd") if isinstance(envelope, dict) else None
        members = raft_membership.parse(cmd)
        if members is None:
            return _failed(invalid("not a well-formed membership entry"), self.image.version)
        self.image.data["members"] = [m.to_json() for m in members]
        return {"ok": True, "result": {"members": self.image.data["members"]}, "version": self.image.version}

    def apply(self, envelope: Any) -> tuple[Outcome, set[str]]:
        """Returns (outcome, topics whose route changed). An outcome is {"ok", "result"|"error", "version"}.

        Total: whatever an entry holds, the answer is an outcome, the same on every replica. Only a failure while
        replaying events (a broken invariant of the image) escapes, and the Raft adapter stops the node for it.
        """
        try:
            rid, ts, budget, window, fingerprint = _check_envelope(envelope)
        except ApiError as e:  # a malformed entry changes nothing at all, not even the command count
            return _failed(e, self.image.version), set()
        # An envelope that passed the checks above changes the image (at least last_ts): count it, so replicas
        # can be compared at equal counts.
        self.image.data["commands"] += 1
        ts = max(ts, self.image.data["last_ts"])  # leader clocks may step back across elections; time in the log never does
        self.image.data["last_ts"] = ts
        if window is not None:
            # The leader's history window (its config), decided here so every replica trims at the same entries.
            self.image.data["history_window"] = window
        cmd = envelope.get("cmd")
        if rid:
            seen = self.image.data["requests"].get(rid)
            if seen is not None:
                if seen[0] != fingerprint:
                    return _failed(rejection(409, "IDEMPOTENCY_KEY_REUSED",
                                             "this Idempotency-Key was used for a different request"),
                                   self.image.version), set()
                return json_body.copied(seen[2]), set()
        self._budget = budget
        try:
            validate(cmd)
            events, result = getattr(self, "_" + cmd["type"])(cmd, ts)
        except ApiError as e:
            outcome = _failed(e, self.image.version)
            changed: set[str] = set()
        except Exception as e:  # a bug in a decision: nothing was changed yet, so reject (the same way on every node)
            outcome = _failed(invalid(f"command could not be decided: {type(e).__name__}"), self.image.version)
            changed = set()
        else:
            changed = set()
            for ev in events:
                changed |= self.image.replay(ev, ts)
            outcome = {"ok": True, "result": {**result, "version": self.image.version}, "version": self.image.version}
        if rid:
            self._remember(rid, fingerprint, ts, json_body.copied(outcome))  # the caller may not change the image
        return outcome, changed

    def _remember(self, rid: str, fingerprint: str, ts: int, outcome: Outcome) -> None:
        requests = self.image.data["requests"]
        requests[rid] = [fingerprint, ts, outcome]
        # Dicts keep insertion order, so the oldest request is first: evict by count and by age, deterministically.
        while requests:
            oldest = next(iter(requests))
            if len(requests) > limits.REQUEST_OUTCOMES_MAX or ts - requests[oldest][1] > limits.REQUEST_OUTCOME_AGE_MS_MAX:
                del requests[oldest]
            else:
                break

    # -- helpers -----------------------------------------------------------------------------------------------
    def _topic(self, cmd: dict[str, Any]) -> dict[str, Any]:
        t = self.image.topic(cmd["topic"])
        if t is None:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {cmd['topic']!r} does not exist", topic=cmd["topic"])
        self._expect(cmd, t["version"])
        return t

    @staticmethod
    def _expect(cmd: dict[str, Any], current: int) -> None:
        ev = cmd.get("expected_version")
        if ev is not None and ev != current:
            raise rejection(409, "VERSION_MISMATCH", f"expected version {ev}, current is {current}",
                            current_version=current, expected_version=ev)

    def _broker(self, name: str, epoch: int | None = None) -> dict[str, Any]:
        b = self.image.brokers.get(name)
        if b is None:
            raise rejection(404, "BROKER_NOT_FOUND", f"broker {name!r} is not registered", broker=name)
        if epoch is not None and epoch != b["epoch"]:
            raise rejection(409, "STALE_EPOCH", f"broker {name!r} has epoch {b['epoch']}, not {epoch}; register again",
                            broker=name, epoch=b["epoch"])
        return b

    def _active_brokers(self, names: list[str]) -> list[str]:
        for n in names:
            if self._broker(n)["state"] != "active":
                raise rejection(409, "BROKER_NOT_ACTIVE", f"broker {n!r} is fenced (its session expired)", broker=n)
        return names

    def _writable_head(self, t: dict[str, Any], queue: int) -> dict[str, Any]:
        head = chains.head_of(t, queue)
        if head["state"] != "active" or head["logic_start"] is None:
            raise rejection(503, "SEALING", f"queue {queue} of {t['topic']!r} is still being remapped; retry shortly",
                            topic=t["topic"], queue=queue, gen=head["gen"])
        return head

    def _move(self, t: dict[str, Any], queue: int, to: str, cause: str) -> list[dict[str, Any]]:
        """Seal-then-switch of one queue (DESIGN.md, the flow of one remap). Returns the events."""
        old = chains.head_of(t, queue)
        gen = old["gen"] + 1
        topic = t["topic"]
        opened = make("SegmentOpened", topic=topic, queue=queue, gen=gen, broker=to, from_broker=old["broker"],
                      physical_queue=allocation.physical_queue_name(topic, t["incarnation"], queue, gen),
                      physical_start=0, budget_end=self._budget, cause=cause)
        if self.image.brokers[old["broker"]]["state"] == "active":
            return [make("SegmentSealing", topic=topic, queue=queue, gen=old["gen"], broker=old["broker"]), opened]
        # The old broker's session has expired: it can write nothing beyond its budget, so the budget end is a safe end.
        return [*self._seal_at_budget(topic, queue, old), opened,
                make("LogicStartDecided", topic=topic, queue=queue, gen=gen,
                     logic_start=_logic_end(old, old["budget_end"]))]

    @staticmethod
    def _seal_at_budget(topic: str, queue: int, seg: dict[str, Any]) -> list[dict[str, Any]]:
        return [make("SegmentSealed", topic=topic, queue=queue, gen=seg["gen"], broker=seg["broker"],
                     physical_end=seg["budget_end"], logic_end=_logic_end(seg, seg["budget_end"]),
                     by="session_expired")]

    # -- brokers -----------------------------------------------------------------------------------------------
    def _RegisterBroker(self, c, ts):
        old = self.image.brokers.get(c["broker"])
        if old is None and len(self.image.brokers) >= limits.BROKERS_MAX:
            raise rejection(409, "TOO_MANY_BROKERS", f"at most {limits.BROKERS_MAX} brokers")
        epoch = (old["epoch"] if old else 0) + 1
        ev = make("BrokerRegistered", broker=c["broker"], address=c["address"], zone=c.get("zone"), epoch=epoch)
        return [ev], {"broker": c["broker"], "epoch": epoch}

    def _FenceBroker(self, c, ts):
        b = self._broker(c["broker"])
        if b["epoch"] != c["epoch"] or b["state"] == "fenced":
            return [], {"state": b["state"]}  # a later registration or an earlier fence already decided
        events = [make("BrokerFenced", broker=c["broker"], epoch=c["epoch"], reason=c["reason"])]
        for name in self.image.topics_on(c["broker"]):
            t = self.image.topics[name]
            for q, entry in enumerate(t["chains"]):
                raw = chains.segments(entry)
                if len(raw) >= 2 and raw[-2][chains.BROKER] == c["broker"] and raw[-2][chains.STATE] == "sealing":
                    sealing = chains.as_dict(t, q, raw[-2])
                    events += self._seal_at_budget(name, q, sealing)
                    events.append(make("LogicStartDecided", topic=name, queue=q, gen=raw[-1][chains.GEN],
                                       logic_start=_logic_end(sealing, sealing["budget_end"])))
        return events, {"state": "fenced"}

    def _UnfenceBroker(self, c, ts):
        b = self._broker(c["broker"], c["epoch"])
        if b["state"] == "active":
            return [], {"state": "active"}
        return [make("BrokerUnfenced", broker=c["broker"], epoch=c["epoch"])], {"state": "active"}

    def _GrantOffsetBudget(self, c, ts):
        self._broker(c["broker"], c["epoch"])
        events = []
        granted: dict[tuple[str, int, int], int] = {}  # a budget never shrinks, even within one command
        for g in c["grants"]:
            key = (g["topic"], g["queue"], g["gen"])
            seg = self.image.segment(*key)
            # Grants race with remaps: a segment that moved on or is sealing gets nothing more, silently.
            if seg is None or seg["broker"] != c["broker"] or seg["state"] != "active":
                continue
            if g["budget_end"] <= granted.get(key, seg["budget_end"]):
                continue
            granted[key] = g["budget_end"]
            events.append(make("OffsetBudgetGranted", topic=g["topic"], queue=g["queue"], gen=g["gen"],
                               broker=c["broker"], budget_end=g["budget_end"]))
        return events, {"granted": len(events)}

    def _SealSegment(self, c, ts):
        self._broker(c["broker"], c["epoch"])
        return self._seal_one(c["broker"], c)

    def _SealSegments(self, c, ts):
        """Many seal reports of one broker in one command (a remap of thousands of queues seals thousands of
        segments: one command each made a route version, and a route rendering, each). Each report is decided on
        its own: a refused one is an item of the result and changes nothing; the others apply."""
        self._broker(c["broker"], c["epoch"])
        events, results = [], []
        for report in c["seals"]:
            try:
                seal_events, result = self._seal_one(c["broker"], report)
            except ApiError as e:
                results.append({"ok": False, "code": e.code, "status": e.status})
            else:
                events += seal_events
                results.append({"ok": True, **result})
        return events, {"results": results}

    def _seal_one(self, broker: str, c: dict[str, Any]):
        t = self._topic({"topic": c["topic"]})
        seg = self.image.segment(c["topic"], c["queue"], c["gen"])
        # physical_queue names the topic's incarnation too: a late report about a deleted topic's segment must not
        # seal the same (topic, queue, gen) of a topic created again under that name.
        if seg is None or seg["broker"] != broker or c.get("physical_queue", seg["physical_queue"]) != seg["physical_queue"]:
            raise rejection(404, "SEGMENT_NOT_FOUND", "no such segment on this broker",
                            topic=c["topic"], queue=c["queue"], gen=c["gen"])
        if seg["state"] == "sealed":
            if seg["physical_end"] == c["end_offset"]:
                return [], {"logic_end": seg["logic_end"]}
            raise rejection(409, "ALREADY_SEALED", "the segment was already sealed at another offset",
                            physical_end=seg["physical_end"], by=seg["sealed_by"])
        if seg["state"] != "sealing":
            raise rejection(409, "NOT_SEALING", "the segment is not being sealed", state=seg["state"])
        if not seg["physical_start"] <= c["end_offset"] <= seg["budget_end"]:
            raise invalid("end_offset is outside the segment's granted budget",
                          physical_start=seg["physical_start"], budget_end=seg["budget_end"])
        logic_end = _logic_end(seg, c["end_offset"])
        events = [make("SegmentSealed", topic=c["topic"], queue=c["queue"], gen=c["gen"], broker=broker,
                       physical_end=c["end_offset"], logic_end=logic_end, by="broker")]
        nxt = chains.head_of(t, c["queue"])
        if nxt["gen"] == c["gen"] + 1 and nxt["logic_start"] is None:
            events.append(make("LogicStartDecided", topic=c["topic"], queue=c["queue"], gen=nxt["gen"],
                               logic_start=logic_end))
        return events, {"logic_end": logic_end}

    # -- topics ------------------------------------------------------------------------------------------------
    def _CreateTopic(self, c, ts):
        name = c["topic"]
        if name in self.image.topics:
            raise rejection(409, "TOPIC_EXISTS", f"topic {name!r} already exists", topic=name,
                            current_version=self.image.topics[name]["version"])
        self._expect(c, 0)
        if len(self.image.topics) >= limits.TOPICS_MAX:
            raise rejection(409, "TOO_MANY_TOPICS", f"at most {limits.TOPICS_MAX} topics")
        if c.get("brokers"):
            brokers = self._active_brokers(c["brokers"])
        else:
            brokers = sorted(b for b, v in self.image.brokers.items() if v["state"] == "active")
            if not brokers:
                raise rejection(409, "NO_BROKERS", "no active broker to place the topic on")
        slots = c.get("slots", limits.SLOTS_DEFAULT)
        incarnation = self.image.version + 1
        placement = allocation.balanced_assignment(range(c["queues"]), brokers, self.image.data["load"])
        segments = [{"queue": q, "broker": b, "physical_queue": allocation.physical_queue_name(name, incarnation, q, 0),
                     "budget_end": self._budget} for q, b in sorted(placement.items())]
        config = {k: v for k, v in sorted(c.get("config", {}).items()) if v is not None}
        ev = make("TopicCreated", topic=name, incarnation=incarnation, queues=c["queues"], slots=slots,
                  order=c.get("order", "best_tried"), config=config,
                  slot_table=allocation.initial_slot_table(slots, c["queues"]), segments=segments)
        return [ev, *self._topic_changed_for_groups(name, c["queues"])], {"topic": name, "queues": c["queues"]}

    def _GrowTopic(self, c, ts):
        t = self._topic(c)
        new_count = c["queues"]
        if new_count < t["queues"]:
            raise invalid(f"a static topic only grows: it has {t['queues']} queues", queues=t["queues"])
        if new_count > t["slots"]:
            raise invalid(f"queues cannot exceed slots ({t['slots']})", slots=t["slots"])
        if new_count == t["queues"]:
            return [], {"topic": t["topic"], "queues": new_count}
        table, splits = allocation.grow_slot_table(allocation.slot_table(t["slot_table"]), range(t["queues"], new_count))
        split_queues = sorted({old for _, old in splits})
        heads = {q: self._writable_head(t, q) for q in split_queues}
        hosts = sorted({b for b in {chains.head(e)[chains.BROKER] for e in t["chains"]}
                        if self.image.brokers[b]["state"] == "active"})
        if not hosts:
            hosts = sorted(b for b, v in self.image.brokers.items() if v["state"] == "active")
        if not hosts:
            raise rejection(409, "NO_BROKERS", "no active broker to place the new queues on")
        placement = allocation.balanced_assignment(range(t["queues"], new_count), hosts, self.image.data["load"])
        segments = [{"queue": q, "broker": b,
                     "physical_queue": allocation.physical_queue_name(t["topic"], t["incarnation"], q, 0),
                     "budget_end": self._budget} for q, b in sorted(placement.items())]
        barriers = [{"queue": nq, "after_queue": old, "after_gen": heads[old]["gen"] + 1} for nq, old in splits]
        events = [make("TopicGrown", topic=t["topic"], queues=new_count, slot_table=table, barriers=barriers,
                       segments=segments)]
        # The split point must be exact, so each split queue is sealed and continues in a new generation on the
        # same broker: the barrier offset is that generation's logic start.
        for q in split_queues:
            events += self._move(t, q, heads[q]["broker"], "grow")
        events += self._topic_changed_for_groups(t["topic"], new_count)
        return events, {"topic": t["topic"], "queues": new_count}

    def _SetTopicConfig(self, c, ts):
        t = self._topic(c)
        config = dict(t["config"])
        for k, v in c["config"].items():
            if v is None:
                config.pop(k, None)
            else:
                config[k] = v
        if len(config) > limits.CONFIG_KEYS_MAX:
            raise invalid(f"a topic has at most {limits.CONFIG_KEYS_MAX} config keys")
        if config == t["config"]:
            return [], {"topic": t["topic"], "config": config}
        config = dict(sorted(config.items()))
        ev = make("TopicConfigChanged", topic=t["topic"], config=config, changed=sorted(c["config"]))
        return [ev], {"topic": t["topic"], "config": config}

    def _DeleteTopic(self, c, ts):
        t = self._topic(c)
        return ([make("TopicDeleted", topic=t["topic"]), *self._topic_changed_for_groups(t["topic"], None)],
                {"topic": t["topic"]})

    def _RemapTopic(self, c, ts):
        t = self._topic(c)
        targets = self._active_brokers(c["brokers"])
        queues = c.get("queues") or list(range(t["queues"]))
        for q in queues:
            if q >= t["queues"]:
                raise invalid(f"queue {q} does not exist; the topic has {t['queues']} queues", queue=q)
        heads = {q: self._writable_head(t, q) for q in queues}
        moves = allocation.rebalance({q: h["broker"] for q, h in heads.items()}, targets)
        events, moved = [], []
        for q, to in sorted(moves.items()):
            events += self._move(t, q, to, "remap")
            moved.append({"queue": q, "from": heads[q]["broker"], "to": to, "gen": heads[q]["gen"] + 1})
        return events, {"topic": t["topic"], "moved": moved}

    def _Barrier(self, c, ts):
        return [], {}

    # -- consumer groups (meta/groups.py decides who owns which queue) -----------------------------------------
    def _existing_group(self, c) -> dict[str, Any]:
        g = self.image.groups.get(c["group"])
        if g is None:
            raise rejection(404, "GROUP_NOT_FOUND", f"group {c['group']!r} does not exist", group=c["group"])
        self._expect(c, g["version"])
        return g

    def _rebalanced(self, name: str, g: dict[str, Any] | None, mode: str | None, members, freed=frozenset(),
                    queue_counts=None, planner: groups.LockPlanner | None = None) -> list[dict[str, Any]]:
        planner = planner or groups.LockPlanner(self.image.data["lock_token"])
        return planner.rebalance(name, g, mode, members, queue_counts or self.image.queue_count, set(freed))

    def _JoinGroup(self, c, ts):
        name, member = c["group"], c["member"]
        g = self.image.groups.get(name)
        self._expect(c, g["version"] if g else 0)
        if g is None and len(self.image.groups) >= limits.GROUPS_MAX:
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
            if self.image.data["member_count"] >= limits.MEMBERS_MAX:
                raise rejection(409, "TOO_MANY_MEMBERS", f"at most {limits.MEMBERS_MAX} members in all groups")
        members[member] = {"topics": c["topics"], "mode": c["mode"]}
        events = [make("GroupMemberJoined", group=name, member=member, topics=c["topics"], mode=c["mode"])]
        return events + self._rebalanced(name, g, mode, members), {"group": name, "joined": True}

    def _without_members(self, c, names: list[str], reason: str):
        g = self._existing_group(c)
        gone = [m for m in names if m in g["members"]]
        if not gone:
            return [], {"group": c["group"], "removed": []}
        planner = groups.LockPlanner(self.image.data["lock_token"])
        freed = [lock for m in gone for lock in groups.member_locks(g, m)]
        events = planner.release(c["group"], freed, reason)
        events += [make("GroupMemberLeft", group=c["group"], member=m, reason=reason) for m in gone]
        members = {m: v for m, v in g["members"].items() if m not in gone}
        events += self._rebalanced(c["group"], g, g["mode"], members, {(t, q) for t, q, _ in freed}, planner=planner)
        return events, {"group": c["group"], "removed": gone}

    def _LeaveGroup(self, c, ts):
        return self._without_members(c, [c["member"]], "left")

    def _ExpireMembers(self, c, ts):
        return self._without_members(c, c["members"], "lease_expired")

    def _release(self, c, refs, reason: str, which):
        """Release the named locks that are still what the caller saw (same token), and regrant."""
        g = self._existing_group(c)
        freed = []
        for r in refs:
            lk = g["locks"].get(r["topic"], {}).get(str(r["queue"]))
            if lk is not None and lk["token"] == r["token"] and which(lk) \
                    and (r["topic"], r["queue"]) not in {(t, q) for t, q, _ in freed}:
                freed.append((r["topic"], r["queue"], lk))
        if not freed:
            return [], {"group": c["group"], "released": 0}
        planner = groups.LockPlanner(self.image.data["lock_token"])
        events = planner.release(c["group"], freed, reason)
        events += self._rebalanced(c["group"], g, g["mode"], g["members"], {(t, q) for t, q, _ in freed},
                                   planner=planner)
        return events, {"group": c["group"], "released": len(freed)}

    def _ReleaseLocks(self, c, ts):
        return self._release(c, c["locks"], "released", lambda lk: lk["member"] == c["member"])

    def _ExpireLocks(self, c, ts):
        # Only revoked locks expire this way; an owner's own lease ends with its membership (ExpireMembers).
        return self._release(c, c["locks"], "lease_expired", lambda lk: not groups.owned(lk))

    def _SetGroupConfig(self, c, ts):
        name = c["group"]
        g = self.image.groups.get(name)
        self._expect(c, g["version"] if g else 0)
        if g is None and len(self.image.groups) >= limits.GROUPS_MAX:
            raise rejection(409, "TOO_MANY_GROUPS", f"at most {limits.GROUPS_MAX} groups")
        config = dict(g["config"]) if g is not None else {}
        for k, v in c["config"].items():
            if v is None:
                config.pop(k, None)
            else:
                config[k] = v
        config = dict(sorted(config.items()))
        mode = config.get("mode", g["mode"] if g else None)
        effective = groups.effective_config(name, {"mode": mode, "config": config})
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
            return [], {"group": name, "config": groups.effective_config(name, g)}
        events = [make("GroupConfigChanged", group=name, config=config, changed=sorted(c["config"]))]
        if g is not None and mode != g["mode"]:
            events += self._rebalanced(name, g, mode, g["members"])
        return events, {"group": name, "config": effective}

    def _topic_changed_for_groups(self, topic: str, queues: int | None) -> list[dict[str, Any]]:
        """Lock events of every group naming ``topic`` after it was created, grown (``queues``) or deleted (None)."""
        events = []
        planner = groups.LockPlanner(self.image.data["lock_token"])

        def counts(name: str) -> int | None:
            return queues if name == topic else self.image.queue_count(name)
        for name in sorted(set(self.image.data["subscriptions"].get(topic, ())) |
                           {n for n, g in self.image.groups.items() if topic in g["locks"]}):
            g = self.image.groups[name]
            freed = []
            if queues is None:
                freed = [(topic, int(q), lk) for q, lk in sorted(g["locks"].get(topic, {}).items())]
                events += planner.release(name, freed, "topic_deleted")
            events += self._rebalanced(name, g, g["mode"], g["members"], {(t, q) for t, q, _ in freed}, counts,
                                       planner)
        return events


def _logic_end(seg: dict[str, Any], physical_end: int) -> int:
    return seg["logic_start"] + (physical_end - seg["physical_start"])


def _check_envelope(envelope: Any) -> tuple[str | None, int, int, int | None, str | None]:
    """(rid, ts, budget, history window or None, fingerprint) of a well-formed envelope; anything else is a
    rejection that changes nothing.

    What an outside caller controls reaches apply inside the command: its text must encode (no lone surrogates), its
    nesting must be shallow, its size bounded. One encode of the canonical text checks the first two in C.
    """
    if not isinstance(envelope, dict):
        raise invalid("a command envelope must be an object")
    rid, ts, budget = envelope.get("rid"), envelope.get("ts"), envelope.get("budget", limits.OFFSET_BUDGET_DEFAULT)
    if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= 2**62:
        raise invalid("command envelope without a leader timestamp")
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= limits.OFFSET_BUDGET_MAX:
        raise invalid("command envelope with a bad offset budget")
    window = envelope.get("history")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or not limits.HISTORY_WINDOW_MIN <= window <= limits.HISTORY_WINDOW_MAX):
        raise invalid("command envelope with a bad history window")
    if rid is not None and (not isinstance(rid, str) or not rid or len(rid) > 2 * limits.REQUEST_ID_CHARS_MAX):
        raise invalid("request id must be a non-empty string")
    try:
        cmd = envelope.get("cmd")
        text = json_body.canonical(cmd)
        # Only a command whose text could hide a violation is walked: nesting is at most as deep as the text has
        # brackets, and orjson writes a non-finite float as null. Of the rest of the envelope, apply reads only the
        # fields checked above (never ``actor``).
        if b"null" in text or text.count(b"{") + text.count(b"[") > json_body.JSON_DEPTH_MAX:
            json_body.check(cmd, "command", strings=False)
    except (ValueError, RecursionError, UnicodeError, TypeError, ApiError):
        raise invalid("the command is not encodable JSON text (a lone surrogate, a non-finite number, an integer "
                      "outside 64 bits or too deep)") from None
    if len(text) > limits.COMMAND_BYTES_MAX:
        raise invalid(f"the command exceeds {limits.COMMAND_BYTES_MAX} bytes")
    if rid is not None and not json_body.is_scalar_text(rid):
        raise invalid("request id is not valid Unicode")
    fingerprint = hashlib.sha256(text).hexdigest()[:32] if rid else None
    return rid, ts, budget, window, fingerprint


def _failed(err: ApiError, version: int) -> Outcome:
    return {"ok": False, "error": {"status": err.status, "code": err.code, "message": err.message,
                                   "details": err.details}, "version": version}
