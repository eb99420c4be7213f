"""The state machine against a small independent model, driven by random command sequences (STYLE.md, Hypothesis
stateful tests).

The model knows brokers (epoch, state) and, per topic, each logic queue's chain of segments as
(gen, broker, logic_start, logic_end, physical_end, budget, state, replicas, in_sync, sealer), updated from what each
command must do (DESIGN.md, the flow of one remap, and invariant 12: a lost broker's heads fail over to the first
in-sync replica, it leaves every in-sync set, and what it was sealing is sealed by an in-sync copy or at its budget)
rather than from the image. Placement is the one decision the model leaves to the machine: it reads which brokers got
a queue and its copies and checks only that the choice was allowed.
Consumer groups ride along: members join, leave and have their leases expire; locks are released by their owner or
expire while revoked, sometimes named with a stale token. Who gets which queue is again the machine's decision; the
model keeps each group's members and follows the lock events.
After every step: versions only grow; segments chain without gap or overlap; at most one writable head per queue;
the slot table partitions [0, slots); load counters equal a recount; the image equals the model; a replica fed the
same envelopes (sometimes restored from a snapshot of the canonical bytes on the way) is byte-identical; a queue of a
group has at most one owner, granted only after the last one's lock was released, and every grant's fencing token is
larger than every earlier one; a released or expired lock is no longer held; the image rebuilt from its event log
alone equals the image.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from meta import groups as group_rules
from meta.events import GROUP_EVENTS
from meta.image import Image, group_key
from meta.state_machine import StateMachine
from tests.support.allocation_checks import minimal_moves
from tests.support.group_checks import check_group_invariants, folded, lock_holders, replayed
from tests.support.state_machine_builders import (CATCH_ALL, STATUS, chains_of, check_image_invariants, disk_id,
                                                  slot_owners, stable, table_of)

BUDGET = 1000
BROKERS = ["b0", "b1", "b2", "b3"]
TOPICS = ["t0", "t1", "t2"]
SLOTS = [None, 3, 5, 6, 7, 12]  # None: the default (1024); small odd counts make uneven splits
GROW_BY_MAX = 3
GROUPS = ["g0", "g1"]
MEMBERS = ["m0", "m1", "m2"]
STALE = 1000   # added to a token: a lock named as the caller saw it long ago
CODES = {**STATUS, "GROUP_NOT_FOUND": 404, "GROUP_MODE_MISMATCH": 409}

brokers_st = st.lists(st.sampled_from(BROKERS), min_size=1, max_size=3, unique=True)


class StateMachineVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sm = StateMachine()
        self.replica = StateMachine()
        self.ts = 1_000_000
        self.step = 0
        self.n_rid = 0
        self.sent: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (envelope with a rid, its first outcome)
        self.last_version = 0
        self.last_ts = 0
        # the model
        self.brokers: dict[str, dict[str, Any]] = {}  # name -> {"epoch", "state", "disk"}
        self.disks = 0   # disks handed out so far: each registration on a new disk takes the next
        self.topics: dict[str, dict[str, Any]] = {}  # name -> {"queues", "slots", "config", "segs": [[seg]]}
        self.groups: dict[str, dict[str, list[str]]] = {}  # name -> {member: its topics}
        # the lock events seen so far, followed: (group, topic, queue) -> the current token; the last grant's token
        self.events_seen = 0
        self.held: dict[tuple[str, str, int], int] = {}
        self.top_token = 0

    # -- plumbing ------------------------------------------------------------------------------------------------
    def submit(self, cmd: dict[str, Any], rid: bool = True, expect: set[str] | None = None,
               may_reject: set[str] | None = None) -> dict[str, Any]:
        """Apply to the machine and the replica. ``expect``: the rejections that apply (none: must succeed).
        ``may_reject``: rejections the model cannot rule out (the command may also succeed)."""
        self.step += 1
        self.ts += 1000 if self.step % 7 else -5000  # now and then the leader's clock steps back
        rid_value = None
        if rid:
            self.n_rid += 1
            rid_value = f"req-{self.n_rid}"
        env = {"rid": rid_value, "ts": self.ts, "budget": BUDGET, "actor": "admin", "cmd": cmd}
        before, version, n_hist = stable(self.sm), self.sm.image.version, len(self.sm.image.data["history"])
        topic_versions = {n: t["version"] for n, t in self.sm.image.topics.items()}
        outcome, changed = self.sm.apply(copy.deepcopy(env))
        self.replica.apply(copy.deepcopy(env))
        if rid_value:
            self.sent.append((env, copy.deepcopy(outcome)))
        n_events = len(self.sm.image.data["history"]) - n_hist
        assert self.sm.image.version == version + n_events
        assert outcome["version"] == self.sm.image.version
        if outcome["ok"]:
            assert outcome["result"]["version"] == outcome["version"]
            stored = [json.loads(s) for s in self.sm.image.history_lines()[n_hist:]]
            # a lock event names its topic but changes its group, never the topic's route
            touched = {e["topic"] for e in stored if e["topic"] is not None and e["type"] not in GROUP_EVENTS}
            touched |= {group_key(e["data"]["group"]) for e in stored if e["type"] in GROUP_EVENTS}
            assert touched <= changed
            for name, t in self.sm.image.topics.items():  # a topic's version is that of the last event touching it
                if name in changed:
                    assert t["version"] > version
                    assert t["version"] >= max([e["version"] for e in stored if e["topic"] == name
                                                and e["type"] not in GROUP_EVENTS], default=0)
                else:
                    assert t["version"] == topic_versions[name]
        else:
            err = outcome["error"]
            assert not err["message"].startswith(CATCH_ALL), err["message"]
            assert err["status"] == CODES[err["code"]], err
            assert n_events == 0 and changed == set()
            assert stable(self.sm) == before, "a rejection changed the image"
        allowed = (expect or set()) | (may_reject or set())
        if expect:
            assert not outcome["ok"] and outcome["error"]["code"] in allowed, (cmd, expect, outcome)
        elif not outcome["ok"]:
            assert outcome["error"]["code"] in allowed, (cmd, outcome)
        return outcome

    def model_topic(self, name: str) -> dict[str, Any] | None:
        return self.topics.get(name)

    def pending(self, mt: dict[str, Any], q: int) -> bool:
        return mt["segs"][q][-1]["start"] is None

    def move(self, name: str, q: int, to: str) -> None:
        """Seal-then-switch in the model: the old head seals now when its broker is fenced, later otherwise."""
        segs = self.topics[name]["segs"][q]
        head = segs[-1]
        replicas, in_sync = self.placed_copies(name, q, to, head["gen"] + 1)
        new = {"gen": head["gen"] + 1, "broker": to, "start": None, "end": None, "pend": None, "budget": BUDGET,
               "state": "active", "replicas": replicas, "in_sync": in_sync, "sealer": None}
        if self.brokers[head["broker"]]["state"] == "fenced":
            self.seal_model(head, head["budget"])
            new["start"] = head["end"]
        else:
            head["state"] = "sealing"
        segs.append(new)

    def placed_copies(self, name: str, q: int, leader: str, gen: int) -> tuple[list[str], list[str]]:
        """The copies the machine chose for a new segment, and those in sync: the topic's count where brokers are
        registered, distinct, the leader first, active brokers before fenced ones (which are not in sync)."""
        seg = next(s for s in chains_of(self.sm.image.topics[name])[q] if s["gen"] == gen)
        active = {n for n, b in self.brokers.items() if b["state"] == "active"} - {leader}
        want = 1 + min(self.topics[name]["replicas"] - 1, len(set(self.brokers) - {leader}))
        copies = seg["replicas"]
        assert copies[0] == leader and len(copies) == want and len(set(copies)) == want, (copies, want)
        live_first = 1 + min(want - 1, len(active))
        assert set(copies[1:live_first]) <= active and not set(copies[live_first:]) & active, (copies, active)
        return list(copies), [b for b in copies if b == leader or b in active]

    def restarted(self, name: str) -> None:
        """What the log must decide when broker ``name`` registers again on its disk: each head it leads with a
        follower goes on in a new gen, from its own end (reported later), in sync with the old gen's live in-sync
        copies (the others have not been sent the queue's consumer state: they join through the leader)."""
        live = {n for n, b in self.brokers.items() if b["state"] == "active"} | {name}
        for tname in sorted(self.topics):
            for segs in self.topics[tname]["segs"]:
                head = segs[-1]
                if (head["state"] == "active" and head["broker"] == name and head["start"] is not None
                        and len(head["replicas"]) > 1):
                    head["state"], head["sealer"] = "sealing", None
                    segs.append({"gen": head["gen"] + 1, "broker": name, "start": None, "end": None, "pend": None,
                                 "budget": BUDGET, "state": "active", "replicas": list(head["replicas"]),
                                 "in_sync": [name, *(b for b in head["in_sync"] if b != name and b in live)],
                                 "sealer": None})

    def lost(self, name: str, fenced: bool) -> None:
        """What the log must decide when broker ``name`` is fenced or registers again on a new disk (``fenced``
        False)."""
        live = {n for n, b in self.brokers.items() if b["state"] == "active"} - {name}

        def elected(seg):
            return next((b for b in seg["replicas"] if b != name and b in live and b in seg["in_sync"]), None)

        for tname in sorted(self.topics):
            for segs in self.topics[tname]["segs"]:
                head = segs[-1]
                start_before = head["start"]   # the machine decides on the image before this loss's events
                sealing = segs[-2] if len(segs) >= 2 and segs[-2]["state"] == "sealing" else None
                if sealing is not None and name in sealing["replicas"]:
                    new = elected(sealing)   # chosen before it leaves the in-sync set: it is excluded anyway
                    if name in sealing["in_sync"] and len(sealing["in_sync"]) > 1:
                        sealing["in_sync"] = [b for b in sealing["in_sync"] if b != name]
                    if (sealing["sealer"] or sealing["broker"]) == name:
                        if new is not None:
                            sealing["sealer"] = None if new == sealing["broker"] else new
                        else:
                            self.seal_model(sealing, sealing["budget"])
                            head["start"] = sealing["end"]
                if head["state"] == "active" and name in head["replicas"]:
                    if head["broker"] != name:
                        if name in head["in_sync"]:
                            head["in_sync"].remove(name)
                        continue
                    new = elected(head)
                    if new is None and not fenced and start_before is not None:
                        # back on a new disk with no copy in sync: its gen ends at its budget, it leads on from there
                        if name in head["in_sync"] and len(head["in_sync"]) > 1:
                            head["in_sync"] = [b for b in head["in_sync"] if b != name]
                        self.seal_model(head, head["budget"])
                        segs.append({"gen": head["gen"] + 1, "broker": name, "start": head["end"], "end": None,
                                     "pend": None, "budget": BUDGET, "state": "active",
                                     "replicas": list(head["replicas"]),
                                     "in_sync": [name], "sealer": None})   # no live copy was in sync
                        continue
                    if new is None or start_before is None:
                        continue
                    if name in head["in_sync"] and len(head["in_sync"]) > 1:
                        head["in_sync"] = [b for b in head["in_sync"] if b != name]
                    head["state"], head["sealer"] = "sealing", new
                    segs.append({"gen": head["gen"] + 1, "broker": new, "start": None, "end": None, "pend": None,
                                 "budget": BUDGET, "state": "active",
                                 "replicas": [new, *(b for b in head["replicas"] if b not in (new, name)), name],
                                 "in_sync": [new, *(b for b in head["in_sync"] if b not in (new, name))],
                                 "sealer": None})

    @staticmethod
    def sealer(seg: dict[str, Any]) -> str:
        return seg["sealer"] or seg["broker"]

    @staticmethod
    def seal_model(seg: dict[str, Any], physical_end: int) -> None:
        seg["state"] = "sealed"
        seg["pend"] = physical_end
        seg["end"] = seg["start"] + physical_end  # every segment starts at physical offset 0

    def segments(self, pred) -> list[tuple[str, int, dict[str, Any]]]:
        return [(name, q, s) for name in sorted(self.topics) for q, segs in enumerate(self.topics[name]["segs"])
                for s in segs if pred(s)]

    def broker_codes(self, names: list[str]) -> set[str]:
        codes = set()
        for n in names:
            if n not in self.brokers:
                codes.add("BROKER_NOT_FOUND")
            elif self.brokers[n]["state"] != "active":
                codes.add("BROKER_NOT_ACTIVE")
        return codes

    def pick_topic(self, data) -> str:
        """Mostly an existing topic, sometimes any name (which may not exist)."""
        if self.topics and data.draw(st.integers(0, 5), label="existing topic?"):
            return data.draw(st.sampled_from(sorted(self.topics)), label="topic")
        return data.draw(st.sampled_from(TOPICS), label="topic")

    def pick_brokers(self, data) -> list[str]:
        """Mostly registered brokers, sometimes any names (which may be unknown)."""
        pool = sorted(self.brokers) if self.brokers and data.draw(st.integers(0, 5), label="known?") else BROKERS
        return data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True), label="brokers")

    @initialize(n=st.integers(1, 3), topics=st.lists(st.tuples(st.integers(1, 3), st.sampled_from(SLOTS)),
                                                      max_size=2))
    def some_brokers_and_topics(self, n, topics):
        for name in BROKERS[:n]:
            self.register(name, "http://first")
        for name, (queues, slots) in zip(TOPICS, topics):
            self.create(name, queues, slots, None, "best_tried")

    # -- brokers -------------------------------------------------------------------------------------------------
    @rule(name=st.sampled_from(BROKERS), address=st.sampled_from(["http://first", "http://second"]),
          kept=st.booleans())
    def register(self, name, address, kept=False):
        """``kept``: a broker known before comes back on the disk it had; else on a new one."""
        known = name in self.brokers
        if known and kept:
            disk = self.brokers[name]["disk"]
        else:
            self.disks += 1
            disk = disk_id(self.disks)
        out = self.submit({"type": "RegisterBroker", "broker": name, "address": address, "disk": disk})
        epoch = self.brokers.get(name, {"epoch": 0})["epoch"] + 1
        assert out["result"]["epoch"] == epoch
        self.brokers[name] = {"epoch": epoch, "state": "active", "disk": disk}
        if known and kept:
            self.restarted(name)
        elif known:
            self.lost(name, fenced=False)

    @rule(name=st.sampled_from(BROKERS), stale=st.booleans())
    def fence(self, name, stale):
        b = self.brokers.get(name)
        if b is None:
            self.submit({"type": "FenceBroker", "broker": name, "epoch": 1, "reason": "session_expired"},
                        expect={"BROKER_NOT_FOUND"})
            return
        epoch = b["epoch"] + 1 if stale else b["epoch"]
        self.submit({"type": "FenceBroker", "broker": name, "epoch": epoch, "reason": "session_expired"})
        if stale or b["state"] == "fenced":
            return
        b["state"] = "fenced"
        self.lost(name, fenced=True)

    @rule(name=st.sampled_from(BROKERS), stale=st.booleans())
    def unfence(self, name, stale):
        b = self.brokers.get(name)
        if b is None:
            self.submit({"type": "UnfenceBroker", "broker": name, "epoch": 1}, expect={"BROKER_NOT_FOUND"})
            return
        if stale:
            if b["epoch"] > 1:
                self.submit({"type": "UnfenceBroker", "broker": name, "epoch": b["epoch"] - 1},
                            expect={"STALE_EPOCH"})
            return
        self.submit({"type": "UnfenceBroker", "broker": name, "epoch": b["epoch"]})
        b["state"] = "active"

    @precondition(lambda self: self.topics)
    @rule(data=st.data())
    def grant(self, data):
        name, q, seg = data.draw(st.sampled_from(self.segments(lambda s: True)))
        budget_end = data.draw(st.integers(0, 4 * BUDGET))
        broker = seg["broker"]
        out = self.submit({"type": "GrantOffsetBudget", "broker": broker, "epoch": self.brokers[broker]["epoch"],
                           "grants": [{"topic": name, "queue": q, "gen": seg["gen"], "budget_end": budget_end}]})
        grows = seg["state"] == "active" and budget_end > seg["budget"]
        assert out["result"]["granted"] == (1 if grows else 0)
        if grows:
            seg["budget"] = budget_end

    # -- topics --------------------------------------------------------------------------------------------------
    @rule(name=st.sampled_from(TOPICS), queues=st.integers(1, 3), slots=st.sampled_from(SLOTS),
          brokers=st.none() | brokers_st, order=st.sampled_from(["best_tried", "strict"]))
    def create(self, name, queues, slots, brokers, order):
        if brokers is not None and self.brokers and len(brokers) > 1:  # mostly registered ones
            brokers = [b for b in brokers if b in self.brokers] or brokers
        cmd: dict[str, Any] = {"type": "CreateTopic", "topic": name, "queues": queues, "order": order}
        if slots is not None:
            cmd["slots"] = slots
        if brokers is not None:
            cmd["brokers"] = brokers
        expect = set()
        if name in self.topics:
            expect.add("TOPIC_EXISTS")
        if brokers is not None:
            expect |= self.broker_codes(brokers)
        elif not any(b["state"] == "active" for b in self.brokers.values()):
            expect.add("NO_BROKERS")
        out = self.submit(cmd, expect=expect)
        if expect:
            return
        allowed = set(brokers) if brokers else {n for n, b in self.brokers.items() if b["state"] == "active"}
        t = self.sm.image.topics[name]
        live = {n for n, b in self.brokers.items() if b["state"] == "active"}
        replicas = min(3, len(live))   # limits.REPLICAS_DEFAULT where as many brokers are active
        assert (t["replicas"], t["min_insync"]) == (replicas, max(1, min(2, replicas - 1)))
        segs = []
        for q in range(queues):
            [seg] = chains_of(t)[q]
            assert seg["broker"] in allowed and seg["replicas"][0] == seg["broker"]
            assert set(seg["replicas"][1:]) <= live and len(set(seg["replicas"])) == replicas
            segs.append([{"gen": 0, "broker": seg["broker"], "start": 0, "end": None, "pend": None,
                          "budget": BUDGET, "state": "active", "replicas": list(seg["replicas"]),
                          "in_sync": list(seg["replicas"]), "sealer": None}])
        self.topics[name] = {"queues": queues, "slots": slots or 1024, "config": {}, "order": order, "segs": segs,
                             "replicas": replicas}
        assert out["result"]["queues"] == queues

    @rule(data=st.data(), add=st.integers(0, GROW_BY_MAX))
    def grow(self, data, add):
        name = self.pick_topic(data)
        mt = self.model_topic(name)
        if mt is None:
            self.submit({"type": "GrowTopic", "topic": name, "queues": 1 + add}, expect={"TOPIC_NOT_FOUND"})
            return
        old, new = mt["queues"], mt["queues"] + add
        if new > mt["slots"]:
            self.submit({"type": "GrowTopic", "topic": name, "queues": new}, expect={"INVALID_ARGUMENT"})
            return
        may = set()
        if any(self.pending(mt, q) for q in range(old)):
            may.add("SEALING")
        if not any(b["state"] == "active" for b in self.brokers.values()):
            may.add("NO_BROKERS")
        before = slot_owners(table_of(self.sm.image.topics[name]), mt["slots"])
        n_barriers = len(self.sm.image.topics[name]["barriers"])
        out = self.submit({"type": "GrowTopic", "topic": name, "queues": new}, may_reject=may)
        if not out["ok"]:
            if out["error"]["code"] == "SEALING":
                assert self.pending(mt, out["error"]["details"]["queue"])
            return
        assert out["result"]["queues"] == new
        if add == 0:
            return
        t = self.sm.image.topics[name]
        after = slot_owners(table_of(t), mt["slots"])
        barriers = t["barriers"][n_barriers:]
        assert sorted(b["queue"] for b in barriers) == list(range(old, new))
        split = sorted({b["after_queue"] for b in barriers})
        for b in barriers:
            assert b["after_queue"] < old, f"barrier {b} names a queue created by this growth"
            assert all(before[s] == b["after_queue"] for s in range(mt["slots"]) if after[s] == b["queue"])
            assert b["after_gen"] == mt["segs"][b["after_queue"]][-1]["gen"] + 1
        for q in split:
            assert not self.pending(mt, q)
            self.move(name, q, mt["segs"][q][-1]["broker"])
        active = {n for n, b in self.brokers.items() if b["state"] == "active"}
        for q in range(old, new):
            [seg] = chains_of(t)[q]
            assert seg["broker"] in active, "a new queue was placed on a fenced broker"
            mt["segs"].append([{"gen": 0, "broker": seg["broker"], "start": 0, "end": None, "pend": None,
                                "budget": BUDGET, "state": "active", "replicas": None, "in_sync": None,
                                "sealer": None}])
            copies, in_sync = self.placed_copies(name, q, seg["broker"], 0)
            mt["segs"][q][0].update(replicas=copies, in_sync=in_sync)
        mt["queues"] = new

    @rule(data=st.data(), ev=st.sampled_from([None, None, "right", "wrong"]))
    def remap(self, data, ev):
        name = self.pick_topic(data)
        onto = self.pick_brokers(data)
        mt = self.model_topic(name)
        n = mt["queues"] if mt else 3
        queues = data.draw(st.none() | st.lists(st.integers(0, n if data.draw(st.integers(0, 5)) else n - 1),
                                                min_size=1, max_size=3, unique=True), label="queues")
        cmd: dict[str, Any] = {"type": "RemapTopic", "topic": name, "brokers": onto}
        if queues is not None:
            cmd["queues"] = queues
        if mt is None:
            self.submit(cmd, expect={"TOPIC_NOT_FOUND"})
            return
        if ev is not None:
            current = self.sm.image.topics[name]["version"]
            cmd["expected_version"] = current if ev == "right" else current + 1
        expect = self.broker_codes(onto)
        if ev == "wrong":
            expect.add("VERSION_MISMATCH")
        chosen = queues if queues is not None else list(range(mt["queues"]))
        if any(q >= mt["queues"] for q in chosen):
            expect.add("INVALID_ARGUMENT")
        if any(self.pending(mt, q) for q in chosen if q < mt["queues"]):
            expect.add("SEALING")
        out = self.submit(cmd, expect=expect)
        if expect:
            if out["error"]["code"] == "VERSION_MISMATCH":
                assert out["error"]["details"]["current_version"] == self.sm.image.topics[name]["version"]
            return
        moved = out["result"]["moved"]
        before = {q: mt["segs"][q][-1]["broker"] for q in chosen}
        assert sorted(m["queue"] for m in moved) == sorted({m["queue"] for m in moved})
        for m in moved:
            head = mt["segs"][m["queue"]][-1]
            assert m["queue"] in chosen and m["from"] == head["broker"] and m["gen"] == head["gen"] + 1
            assert m["to"] in onto and m["to"] != m["from"]
            self.move(name, m["queue"], m["to"])
        for q in chosen:
            assert mt["segs"][q][-1]["broker"] in onto, f"queue {q} left outside the target brokers"
        # the chosen queues end up balanced over the targets, with the fewest moves that achieve it
        counts = [sum(1 for q in chosen if mt["segs"][q][-1]["broker"] == b) for b in onto]
        assert max(counts) - min(counts) <= 1, (before, onto, moved)
        assert len(moved) == minimal_moves(before, onto), (before, onto, moved)

    @precondition(lambda self: any(s["state"] == "sealing" for t in self.topics.values()
                                   for segs in t["segs"] for s in segs))
    @rule(data=st.data())
    def seal(self, data):
        name, q, seg = data.draw(st.sampled_from(self.segments(lambda s: s["state"] == "sealing")))
        beyond = data.draw(st.integers(0, 9)) == 0
        end = seg["budget"] + data.draw(st.integers(1, 10)) if beyond else data.draw(st.integers(0, seg["budget"]))
        by = self.sealer(seg)
        cmd = {"type": "SealSegment", "broker": by, "epoch": self.brokers[by]["epoch"],
               "topic": name, "queue": q, "gen": seg["gen"], "end_offset": end}
        if beyond:
            self.submit(cmd, expect={"INVALID_ARGUMENT"})
            return
        out = self.submit(cmd)
        self.seal_model(seg, end)
        assert out["result"]["logic_end"] == seg["end"]
        nxt = self.topics[name]["segs"][q][-1]
        assert nxt["gen"] == seg["gen"] + 1 and nxt["start"] is None
        nxt["start"] = seg["end"]

    @precondition(lambda self: any(s["state"] == "sealed" for t in self.topics.values()
                                   for segs in t["segs"] for s in segs))
    @rule(data=st.data(), same=st.booleans())
    def seal_again(self, data, same):
        name, q, seg = data.draw(st.sampled_from(self.segments(lambda s: s["state"] == "sealed")))
        end = seg["pend"] if same else (seg["pend"] + 1) % (seg["budget"] + 1)
        by = self.sealer(seg)
        cmd = {"type": "SealSegment", "broker": by, "epoch": self.brokers[by]["epoch"],
               "topic": name, "queue": q, "gen": seg["gen"], "end_offset": end}
        v = self.sm.image.version
        out = self.submit(cmd, expect=None if same or end == seg["pend"] else {"ALREADY_SEALED"})
        if out["ok"]:
            assert out["result"]["logic_end"] == seg["end"] and self.sm.image.version == v

    @precondition(lambda self: self.topics)
    @rule(data=st.data())
    def seal_active(self, data):
        name, q, seg = data.draw(st.sampled_from(self.segments(lambda s: s["state"] == "active")))
        self.submit({"type": "SealSegment", "broker": seg["broker"], "epoch": self.brokers[seg["broker"]]["epoch"],
                     "topic": name, "queue": q, "gen": seg["gen"], "end_offset": 0}, expect={"NOT_SEALING"})

    @precondition(lambda self: self.topics)
    @rule(data=st.data())
    def alter_in_sync(self, data):
        """A leader asks to change who is in sync of one of its segments: only the head's gen, while it is active,
        only its replicas, the leader first; a fenced broker is never added, and a fenced leader asks nothing."""
        name, q, seg = data.draw(st.sampled_from(self.segments(lambda s: True)))
        leader = seg["broker"]
        others = [b for b in seg["replicas"] if b != leader]
        wanted = [leader, *data.draw(st.lists(st.sampled_from(others), unique=True) if others else st.just([]))]
        cmd = {"type": "AlterInSync", "broker": leader, "epoch": self.brokers[leader]["epoch"],
               "changes": [{"topic": name, "queue": q, "gen": seg["gen"], "in_sync": wanted,
                            "epochs": {b: self.brokers[b]["epoch"] for b in wanted}}]}
        if self.brokers[leader]["state"] != "active":
            self.submit(cmd, expect={"BROKER_NOT_ACTIVE"})
            return
        [result] = self.submit(cmd)["result"]["results"]
        if seg is not self.topics[name]["segs"][q][-1] or seg["state"] != "active":
            assert result == {"ok": False, "code": "STALE_LEADER_EPOCH", "status": 409}
        elif any(self.brokers[b]["state"] != "active" for b in set(wanted) - set(seg["in_sync"])):
            assert result == {"ok": False, "code": "BROKER_NOT_ACTIVE", "status": 409}
        else:
            assert result["ok"]
            if sorted(wanted) != sorted(seg["in_sync"]):
                seg["in_sync"] = list(wanted)   # not the list the sent command holds

    @rule(data=st.data(), key=st.sampled_from(["k1", "k2"]),
          value=st.none() | st.sampled_from(["x", "y"]), ev=st.sampled_from([None, "right", "wrong"]))
    def set_config(self, data, key, value, ev):
        name = self.pick_topic(data)
        mt = self.model_topic(name)
        cmd: dict[str, Any] = {"type": "SetTopicConfig", "topic": name, "config": {key: value}}
        if mt is None:
            self.submit(cmd, expect={"TOPIC_NOT_FOUND"})
            return
        if ev is not None:
            current = self.sm.image.topics[name]["version"]
            cmd["expected_version"] = current if ev == "right" else current - 1
        if ev == "wrong":
            err = self.submit(cmd, expect={"VERSION_MISMATCH"})["error"]
            assert err["details"]["current_version"] == self.sm.image.topics[name]["version"]
            return
        v = self.sm.image.version
        out = self.submit(cmd)
        config = dict(mt["config"])
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
        assert out["result"]["config"] == config
        assert self.sm.image.version == v + (0 if config == mt["config"] else 1)
        mt["config"] = config

    @rule(name=st.sampled_from(TOPICS), ev=st.sampled_from([None, "right", "wrong"]))
    def delete(self, name, ev):
        cmd: dict[str, Any] = {"type": "DeleteTopic", "topic": name}
        if name not in self.topics:
            self.submit(cmd, expect={"TOPIC_NOT_FOUND"})
            return
        if ev is not None:
            current = self.sm.image.topics[name]["version"]
            cmd["expected_version"] = current if ev == "right" else current + 7
        if ev == "wrong":
            self.submit(cmd, expect={"VERSION_MISMATCH"})
            return
        self.submit(cmd)
        del self.topics[name]

    @rule(snapshot=st.booleans())
    def barrier_or_snapshot(self, snapshot):
        if snapshot:  # the replica continues from a snapshot of the canonical bytes
            self.replica = StateMachine(Image(json.loads(self.sm.image.canonical_bytes())))
            return
        v = self.sm.image.version
        self.submit({"type": "Barrier"}, rid=False)
        assert self.sm.image.version == v

    @precondition(lambda self: self.sent)
    @rule(data=st.data(), other=st.booleans())
    def repeat_request(self, data, other):
        env, first = data.draw(st.sampled_from(self.sent))
        self.ts += 10
        cmd = {"type": "Barrier", "nonce": 1} if other else copy.deepcopy(env["cmd"])
        again = {"rid": env["rid"], "ts": self.ts, "budget": BUDGET, "actor": "admin", "cmd": cmd}
        v, before = self.sm.image.version, self.sm.image.data["history"][-1:]
        outcome, changed = self.sm.apply(copy.deepcopy(again))
        self.replica.apply(copy.deepcopy(again))
        assert self.sm.image.version == v and self.sm.image.data["history"][-1:] == before and changed == set()
        if other:
            assert outcome["ok"] is False and outcome["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
        else:
            assert outcome == first

    # -- groups --------------------------------------------------------------------------------------------------
    def group_locks(self, group: str) -> dict[tuple[str, int], dict[str, Any]]:
        return {(t, q): lk for (g, t, q), lk in lock_holders(self.sm.image).items() if g == group}

    def pick_group(self, data) -> str:
        """Mostly a group that exists, sometimes any name (which may not exist)."""
        if self.groups and data.draw(st.integers(0, 5), label="existing group?"):
            return data.draw(st.sampled_from(sorted(self.groups)), label="group")
        return data.draw(st.sampled_from(GROUPS), label="group")

    def pick_refs(self, data, group: str) -> list[dict[str, Any]]:
        """Some of the group's locks as a member names them, now and then with a token that is no longer current."""
        locks = sorted(self.group_locks(group).items())
        chosen = data.draw(st.lists(st.sampled_from(locks), max_size=4, unique_by=lambda x: x[0]) if locks
                           else st.just([]), label="locks")
        return [{"topic": t, "queue": q, "token": lk["token"] + (STALE if data.draw(st.integers(0, 4)) == 0 else 0)}
                for (t, q), lk in chosen]

    def released_now(self, group: str, before: dict[tuple[str, int], dict[str, Any]], freed: list[tuple[str, int]],
                     reason: str, v: int) -> None:
        """What a release, leave or expiry must leave behind: the freed locks no longer held with their token, every
        other lock as it was unless the queue was free, the release events stamped with the leader's time."""
        after = self.group_locks(group)
        for key in freed:
            assert after.get(key, {}).get("token") != before[key]["token"], f"{key} still held after its release"
        for key, lk in before.items():
            if key not in freed:
                assert after.get(key, {}).get("token") == lk["token"], f"{key} changed hands without a release"
        events = [json.loads(line) for line in self.sm.image.history_after(v, 10**9)]
        releases = [e for e in events if e["type"] == "LockReleased"]
        assert sorted((e["data"]["topic"], e["data"]["queue"]) for e in releases) == sorted(freed)
        for e in releases:
            assert e["data"]["reason"] == reason and e["ts"] == self.sm.image.data["last_ts"], e

    @rule(data=st.data(), member=st.sampled_from(MEMBERS))
    def join_group(self, data, member):
        group = self.pick_group(data)
        pool = sorted(self.topics) if self.topics and data.draw(st.integers(0, 3), label="existing topics?") else TOPICS
        topics = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True), label="topics")
        out = self.submit({"type": "JoinGroup", "group": group, "member": member, "topics": topics,
                           "mode": "exclusive"})
        members = self.groups.setdefault(group, {})
        assert out["result"]["joined"] is (members.get(member) != topics)
        members[member] = topics

    @rule(group=st.sampled_from(GROUPS), member=st.sampled_from(MEMBERS))
    def join_shared(self, group, member):
        """A member asking for another mode than the group's is refused while the group is exclusive."""
        if group in self.groups and self.groups[group]:
            self.submit({"type": "JoinGroup", "group": group, "member": member, "topics": ["t0"], "mode": "shared"},
                        expect={"GROUP_MODE_MISMATCH"})

    def leave_or_expire(self, group: str, gone: list[str], cmd: dict[str, Any], reason: str) -> None:
        if group not in self.groups:
            self.submit(cmd, expect={"GROUP_NOT_FOUND"})
            return
        before, v = self.group_locks(group), self.sm.image.version
        out = self.submit(cmd)
        removed = [m for m in gone if m in self.groups[group]]
        assert out["result"]["removed"] == removed
        for m in removed:
            del self.groups[group][m]
        self.released_now(group, before, [key for key, lk in before.items() if lk["member"] in removed], reason, v)

    @rule(data=st.data(), member=st.sampled_from(MEMBERS))
    def leave_group(self, data, member):
        group = self.pick_group(data)
        self.leave_or_expire(group, [member], {"type": "LeaveGroup", "group": group, "member": member}, "left")

    @rule(data=st.data(), members=st.lists(st.sampled_from(MEMBERS + ["ghost"]), min_size=1, max_size=3, unique=True))
    def expire_members(self, data, members):
        """The leader saw these leases end (at the time it stamps on the command)."""
        group = self.pick_group(data)
        self.leave_or_expire(group, members, {"type": "ExpireMembers", "group": group, "members": members},
                             "lease_expired")

    def release_or_expire(self, group: str, cmd: dict[str, Any], which, reason: str) -> None:
        if group not in self.groups:
            self.submit(cmd, expect={"GROUP_NOT_FOUND"})
            return
        before, v = self.group_locks(group), self.sm.image.version
        freed = [(r["topic"], r["queue"]) for r in cmd["locks"]
                 if (r["topic"], r["queue"]) in before and before[(r["topic"], r["queue"])]["token"] == r["token"]
                 and which(before[(r["topic"], r["queue"])])]
        out = self.submit(cmd)
        assert out["result"]["released"] == len(freed), (cmd, before)
        self.released_now(group, before, freed, reason, v)

    @rule(data=st.data())
    def release_locks(self, data):
        """The member gives up locks (its own are released; another's, or a stale token, change nothing)."""
        group = self.pick_group(data)
        refs = self.pick_refs(data, group)
        owners = sorted({lk["member"] for lk in self.group_locks(group).values()})
        member = data.draw(st.sampled_from(owners if owners and data.draw(st.integers(0, 3)) else MEMBERS),
                           label="member")
        self.release_or_expire(group, {"type": "ReleaseLocks", "group": group, "member": member, "locks": refs},
                               lambda lk: lk["member"] == member, "released")

    @rule(data=st.data())
    def expire_locks(self, data):
        """The leader saw revoked locks' leases end: only locks being revoked expire so."""
        group = self.pick_group(data)
        refs = self.pick_refs(data, group)
        self.release_or_expire(group, {"type": "ExpireLocks", "group": group, "locks": refs},
                               lambda lk: not group_rules.owned(lk), "lease_expired")

    # -- invariants ----------------------------------------------------------------------------------------------
    @invariant()
    def versions_and_time_only_grow(self):
        assert self.sm.image.version >= self.last_version
        assert self.sm.image.data["last_ts"] >= self.last_ts
        self.last_version = self.sm.image.version
        self.last_ts = self.sm.image.data["last_ts"]

    @invariant()
    def image_structure(self):
        check_image_invariants(self.sm.image)

    @invariant()
    def replica_is_byte_identical(self):
        assert self.replica.image.canonical_bytes() == self.sm.image.canonical_bytes()

    @invariant()
    def image_equals_model(self):
        image = self.sm.image
        assert {n: (b["epoch"], b["state"]) for n, b in image.brokers.items()} == {
            n: (b["epoch"], b["state"]) for n, b in self.brokers.items()}
        assert set(image.topics) == set(self.topics)
        for name, mt in self.topics.items():
            t = image.topics[name]
            assert (t["queues"], t["slots"], t["config"], t["order"]) == (mt["queues"], mt["slots"], mt["config"],
                                                                          mt["order"])
            for q, msegs in enumerate(mt["segs"]):
                got = [(s["gen"], s["broker"], s["logic_start"], s["logic_end"], s["physical_end"], s["budget_end"],
                        s["state"], s["replicas"], s["in_sync"], s["sealer"]) for s in chains_of(t)[q]]
                want = [(s["gen"], s["broker"], s["start"], s["end"], s["pend"], s["budget"], s["state"],
                         s["replicas"], s["in_sync"], self.sealer(s)) for s in msegs]
                assert got == want, f"{name}/{q}"
            # model continuity: each decided start is the previous end, the first start is 0
            for msegs in mt["segs"]:
                assert msegs[0]["start"] == 0
                for prev, nxt in zip(msegs, msegs[1:]):
                    assert nxt["start"] is None or nxt["start"] == prev["end"]
                assert sum(1 for s in msegs if s["state"] != "sealed") <= 2
                assert sum(1 for s in msegs if s["state"] == "active" and s["start"] is not None) <= 1

    @invariant()
    def one_owner_per_queue_and_tokens_only_grow(self):
        """Follows the lock events: a queue is granted only once its last lock was released, each grant's token is
        larger than every earlier one, a release ends exactly the current token; the image holds what they say."""
        image = self.sm.image
        for line in image.history_after(self.events_seen, 10**9):
            ev = json.loads(line)
            self.events_seen = ev["version"]
            if ev["type"] not in ("LockGranted", "LockReleased"):
                continue
            d = ev["data"]
            key = (d["group"], d["topic"], d["queue"])
            if ev["type"] == "LockGranted":
                assert key not in self.held, f"{key} granted to {d['member']} while token {self.held.get(key)} holds it"
                assert d["token"] > self.top_token, f"token {d['token']} after {self.top_token}"
                self.top_token = self.held[key] = d["token"]
            else:
                assert self.held.pop(key, None) == d["token"], f"{key} released with a token that was not current"
        assert self.held == {key: lk["token"] for key, lk in lock_holders(image).items()}
        assert image.data["lock_token"] == self.top_token
        check_group_invariants(image)

    @invariant()
    def groups_equal_model(self):
        image = self.sm.image
        assert set(image.groups) == set(self.groups)
        for name, members in self.groups.items():
            assert {m: v["topics"] for m, v in image.groups[name]["members"].items()} == members

    @invariant()
    def the_event_log_replays_to_the_image(self):
        assert folded(replayed(self.sm.image)) == folded(self.sm.image)


StateMachineVsModel.TestCase.settings = settings(max_examples=75, stateful_step_count=40, deadline=None,
                                                 suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.filter_too_much])
TestStateMachineVsModel = StateMachineVsModel.TestCase
