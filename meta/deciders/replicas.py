"""Decisions about the copies of a queue's head (DESIGN.md invariant 12): how many, on which brokers, who is in
sync, and who leads when the leader is lost.

The leader epoch of a queue is its head's generation: a new leader always starts a new generation, so every
broker tells an old leader's writes and copies from a new one's by the physical queue's name alone (it names the
gen). A failover is a seal-then-switch like a remap (topics.move), with one difference: the old leader cannot
report where its segment ends, so the in-sync replica elected to lead reports its own copy's end instead
(``SegmentSealing`` names it). Every acknowledged record is on every in-sync replica, so that end holds them all;
records past it were never acknowledged, and no reader reaches them (a sealed segment is read up to its end).
Kafka's ISR and leader epoch in KRaft, RocketMQ 5's SyncStateSet and master epoch, decided in the one log.

Who is in sync changes only here: the leader asks (``AlterInSync``, fenced by the gen it leads: Kafka's
AlterPartition), or a broker is lost (fenced, or registered again on a new disk: it must catch up before it counts
again). A broker registered again on the disk it had kept its copies (``broker_restarted``).
"""

from __future__ import annotations

from typing import Any

from .. import allocation, chains, limits
from ..events import make
from ..image import Image
from wire.errors import invalid, rejection
from . import Decider, Events, decide_each
from .lookups import existing_topic, registered_broker, seal_at_budget


def settings(image: Image, c: dict[str, Any], available: int) -> tuple[int, int]:
    """A new topic's (replicas, min_insync): what the command asks, else the cluster's defaults the command carries
    (MetaConfig), capped at the brokers there are."""
    replicas = c.get("replicas")
    if replicas is None:
        replicas = max(1, min(c.get("default_replicas", limits.REPLICAS_DEFAULT), available))
    elif replicas > available:
        raise rejection(409, "NOT_ENOUGH_BROKERS", f"{replicas} replicas need {replicas} active brokers; "
                        f"{available} are there to place them on", replicas=replicas, brokers=available)
    min_insync = c.get("min_insync")
    if min_insync is None:   # at most replicas - 1: one broker lost leaves the topic writable
        min_insync = max(1, min(c.get("default_min_insync", limits.MIN_INSYNC_DEFAULT), replicas - 1))
    elif min_insync > replicas:
        raise invalid(f"min_insync ({min_insync}) cannot exceed replicas ({replicas})", field="min_insync")
    return replicas, min_insync


def zones(image: Image) -> dict[str, str | None]:
    return {name: b["zone"] for name, b in image.brokers.items()}


def active(image: Image, scope: list[str] | str = limits.SCOPE_GLOBAL) -> list[str]:
    """The active brokers, of ``scope``'s clusters only when it names some."""
    return sorted(b for b, v in image.brokers.items() if v["state"] == "active" and in_scope(v, scope))


def placeable(image: Image, scope: list[str] | str = limits.SCOPE_GLOBAL) -> list[str]:
    """The active brokers of ``scope`` a new leader or copy may go to: not those being drained."""
    return [b for b in active(image, scope) if not image.brokers[b]["draining"]]


def heads_holding(image: Image, broker: str) -> list[tuple[str, int]]:
    """(topic, queue) of every head ``broker`` holds a copy of, leader or not: what a drain of it still has to move."""
    return [(name, q) for name in image.topics_on(broker)
            for q, entry in enumerate(image.topics[name]["chains"])
            if broker in chains.head(entry)[chains.REPLICAS]]


def sealed_holding(image: Image, broker: str) -> list[tuple[str, int, chains.Segment]]:
    """(topic, queue, segment) of every sealed segment ``broker`` holds a copy of."""
    return [(name, q, s) for name in image.topics_on(broker)
            for q, entry in enumerate(image.topics[name]["chains"])
            for s in chains.segments(entry)[:-1]
            if s[chains.STATE] == "sealed" and broker in s[chains.REPLICAS]]


def in_scope(broker: dict[str, Any], scope: list[str] | str) -> bool:
    return scope == limits.SCOPE_GLOBAL or broker["cluster"] in scope


def scoped(image: Image, scope: list[str] | str, names: list[str]) -> list[str]:
    """``names`` (registered brokers), refused 409 OUT_OF_SCOPE when one is in none of ``scope``'s clusters: a
    topic's queues and copies stay within its scope, whatever a create or a remap names."""
    for n in names:
        b = registered_broker(image, n)
        if not in_scope(b, scope):
            raise rejection(409, "OUT_OF_SCOPE", f"broker {n!r} is in cluster {b['cluster']!r}, outside the topic's "
                            f"scope {scope}", broker=n, cluster=b["cluster"], scope=scope)
    return names


def replica_set(image: Image, t: dict[str, Any], leader: str, preferred: list[str]) -> list[str]:
    """The copies of a queue led by ``leader``: the topic's count, from the active ``preferred`` brokers first (a
    remap's targets, or the replicas the queue had), then every other active one, then, when too few are active,
    fenced ones (``in_sync`` leaves them out: each catches up once it is back, as Kafka keeps an offline broker
    in a partition's assignment). A set cut to the active brokers stayed cut for that segment's whole life, and
    two lost disks then lost what it held while a third broker was back and empty-handed (the chaos runner's
    broker_wipe, seed 7)."""
    want = t["replicas"] - 1
    live = set(placeable(image, t["scope"]))
    where = zones(image)
    chosen: list[str] = []
    # Harmless mutants: another word for "active" below (held is read only once every live broker but the leader is
    # chosen, and followers() never picks the leader, so the active ones it would add are all left out again);
    # ``<=`` for ``<`` (with the count reached, the slice below takes nothing).
    held = sorted(b for b, v in image.brokers.items()
                  if v["state"] != "active" and not v["draining"] and in_scope(v, t["scope"]))
    for pool in ([b for b in preferred if b in live], sorted(live), held):
        if len(chosen) < want:
            more = allocation.followers(leader, want, [b for b in pool if b not in chosen], where)
            chosen += [b for b in more if b not in chosen][:want - len(chosen)]
    return [leader, *chosen]


def in_sync_of(image: Image, replicas: list[str]) -> list[str]:
    """The copies of a new, empty segment that are in sync from its start: its leader (``replicas[0]``, the first
    of every in-sync set, fenced or not: a growth splits a queue in place) and the active others."""
    # Harmless mutants: ``get(b, None)`` or ``get(b)`` (every replica is a registered broker, and none ever leaves
    # the image: no event removes one).
    return [b for b in replicas if b == replicas[0] or image.brokers.get(b, {}).get("state") == "active"]


def broker_lost(image: Image, broker: str, budget: int, fenced: bool) -> Events:
    """What the log decides when ``broker`` is fenced, or registers again on a new disk (``fenced`` False): each
    head it leads moves to an elected in-sync replica; it leaves every in-sync set; a segment it was sealing is
    sealed by an in-sync replica, or, when none is live, at its budget's end (a safe end: it can write nothing past
    it; a copy in sync that is down holds what was acknowledged and serves it once back). Back on a new disk with
    no live copy in sync to take over a head it led, that head ends at its budget too, and it leads on from there:
    no offset is ever used twice, whatever it held alone is lost (its only copy in sync was on the lost disk)."""
    live = set(active(image)) - {broker}
    events: Events = []
    for name in image.topics_on(broker):
        t = image.topics[name]
        for q, entry in enumerate(t["chains"]):
            raw = chains.segments(entry)
            head = raw[-1]
            # Both the segment being sealed and the head: a copy that may have lost its disk must leave the in-sync
            # set of each, or a later election could pick it (the chaos runner's broker_wipe found that election).
            if len(raw) >= 2 and raw[-2][chains.STATE] == "sealing" and broker in raw[-2][chains.REPLICAS]:
                events += _sealing_lost(t, q, raw[-2], head, broker, live, fenced)
            # Harmless mutant: ``or`` (a head is always active: a SegmentSealing comes with the next gen's
            # SegmentOpened; and an active head not held by ``broker`` has it in no in-sync set: _head_lost decides
            # nothing).
            if head[chains.STATE] == "active" and broker in head[chains.REPLICAS]:
                events += _head_lost(t, q, head, broker, live, budget, fenced)
    return events


def broker_restarted(image: Image, broker: str, budget: int) -> Events:
    """What the log decides when ``broker`` registers again on the disk it had (wire/disk_identity.py): it kept
    every copy, and its place in every in-sync set it had (a fence took it out of them; it catches up first). Each
    head it leads goes on in a new gen from its own copy's end: a leader streams what it writes before its sync
    (broker/replication/source.py), so back from a crash its followers may hold records it lost, never
    acknowledged; they end the old gen's copies past its end, where no reader goes. A single copy carries on.
    Before the disk id, every registration counted as a lost disk: in the chaos runner (seed 21) meta, back after
    8 s, took b3's registration (power loss, its disk kept) as a loss and elected b2 for b3's heads, in sync and
    active in the image but itself back on a wiped disk a moment later: the old gen was sealed at b2's empty end."""
    live = set(active(image)) | {broker}
    events: Events = []
    for name in image.topics_on(broker):
        t = image.topics[name]
        for q, entry in enumerate(t["chains"]):
            head = chains.head(entry)
            if (head[chains.STATE] == "active" and head[chains.BROKER] == broker
                    and head[chains.LOGIC_START] is not None and len(head[chains.REPLICAS]) > 1):
                # The next gen is empty, so every live copy holds all of its records; but not every live copy
                # holds the queue's consumer state (pop state, committed offsets), which only the old gen's
                # in-sync copies were sent. An election trusts the in-sync set for both: the others join once
                # caught up, through the leader, which sends them that state first (the chaos runner, seed 13: a
                # copy back on a wiped disk, put in sync here, was elected at the next failover and started the
                # pop group over from offset 0)
                in_sync = [broker, *(b for b in head[chains.IN_SYNC] if b != broker and b in live)]
                events += _fail_over(t, q, head, broker, broker, in_sync, "restart", budget)
    return events


def _elected(seg: chains.Segment, lost: str, live: set[str]) -> str | None:
    """The in-sync replica that takes over from ``lost``: the first in replica order (leader preference, as
    Kafka elects the first of the assignment that is in sync)."""
    return next((b for b in seg[chains.REPLICAS] if b != lost and b in live and b in seg[chains.IN_SYNC]), None)


def _without(seg: chains.Segment, lost: str) -> list[str]:
    return [b for b in seg[chains.IN_SYNC] if b != lost]


def _left_in_sync(t: dict[str, Any], q: int, seg: chains.Segment, lost: str) -> Events:
    """``lost`` leaves ``seg``'s in-sync set (never emptied: a set names at least its leader)."""
    if lost not in seg[chains.IN_SYNC] or len(seg[chains.IN_SYNC]) == 1:
        return []
    return [make("InSyncChanged", topic=t["topic"], queue=q, gen=seg[chains.GEN], in_sync=_without(seg, lost),
                 reason="fenced")]


def _head_lost(t: dict[str, Any], q: int, head: chains.Segment, lost: str, live: set[str], budget: int,
               fenced: bool) -> Events:
    if head[chains.BROKER] != lost:
        return _left_in_sync(t, q, head, lost)
    if head[chains.LOGIC_START] is None:
        return []   # the segment it continues is still sealing: that seal is decided first (_sealing_lost)
    new = _elected(head, lost, live)   # harmless mutant: None for lost (``live`` never holds the lost broker)
    if new is not None:
        return _fail_over(t, q, head, lost, new, [new, *(b for b in _without(head, lost) if b != new)], "failover",
                          budget)
    if fenced:
        # No live copy in sync to lead (replicas=1, or every follower lagged or is down): the queue waits for its
        # broker, or an operator's remap seals it at its budget (lookups.seal_at_budget), or elects a copy
        # (``elect``; ``unclean`` for one out of sync).
        return []
    # Back on a new disk: its copy is empty, and leading on from its end would number new records with offsets
    # already acknowledged. Its budget's end is a safe end (it wrote nothing past it).
    # Harmless mutants: None for q in as_dict (it changes only the dict's physical_queue, which seal_at_budget and
    # logic_end never read); None for t, q or lost in _left_in_sync below (no live in-sync copy was elected, so the
    # set is [lost] alone: a fence or a new disk takes a copy out of every set and only active ones are added, so
    # every other copy in sync is live; a set of one is never changed, and _left_in_sync returns before reading them).
    topic, gen = t["topic"], head[chains.GEN]
    seg = chains.as_dict(t, q, head)
    replicas = list(head[chains.REPLICAS])
    return [*_left_in_sync(t, q, head, lost), *seal_at_budget(topic, q, seg, by="disk_lost"),
            make("SegmentOpened", topic=topic, queue=q, gen=gen + 1, broker=lost, from_broker=lost,
                 physical_queue=allocation.physical_queue_name(topic, t["incarnation"], q, gen + 1),
                 physical_start=0, budget_end=budget, replicas=replicas,
                 in_sync=[lost], cause="disk_lost"),   # no live copy in sync (else _elected): the others join later
            make("LogicStartDecided", topic=topic, queue=q, gen=gen + 1,
                 logic_start=chains.logic_end(seg, seg["budget_end"]))]


def _fail_over(t: dict[str, Any], q: int, head: chains.Segment, lost: str, new: str, in_sync: list[str],
               cause: str, budget: int) -> Events:
    """``new`` seals the head at its copy's end and leads the next gen, which starts there (``new`` may be ``lost``
    itself, back on its disk: cause ``restart``; it stays in the old gen's in-sync set, its copy is whole)."""
    topic, gen = t["topic"], head[chains.GEN]
    replicas = [new, *(b for b in head[chains.REPLICAS] if b not in (new, lost))]
    if lost != new:
        replicas.append(lost)   # the lost one last
    # The lost leader leaves the in-sync set of the segment being sealed too: if the copy elected to seal it is lost
    # in turn, the next election must not pick a broker back on an empty disk (the chaos runner's broker_wipe,
    # seed 9: its empty copy's end became the segment's end).
    left = _left_in_sync(t, q, head, lost) if lost != new else []
    return [*left, make("SegmentSealing", topic=topic, queue=q, gen=gen, broker=new),
            make("SegmentOpened", topic=topic, queue=q, gen=gen + 1, broker=new, from_broker=lost,
                 physical_queue=allocation.physical_queue_name(topic, t["incarnation"], q, gen + 1),
                 physical_start=0, budget_end=budget, replicas=replicas, in_sync=in_sync, cause=cause)]


def _sealing_lost(t: dict[str, Any], q: int, sealing: chains.Segment, head: chains.Segment, lost: str,
                  live: set[str], fenced: bool) -> Events:
    """A segment being sealed that ``lost`` holds a copy of: it leaves its in-sync set; when it was the sealer, a
    live in-sync copy reports the end instead; with none, its budget's end is a safe end (its leader can write
    nothing past it): the bounded jump of DESIGN.md invariant 5."""
    topic = t["topic"]
    events = _left_in_sync(t, q, sealing, lost)
    if chains.sealer(sealing) != lost:
        return events
    new = _elected(sealing, lost, live)   # harmless mutant: None for lost (``live`` never holds the lost broker)
    if new is not None:
        return [*events, make("SegmentSealing", topic=topic, queue=q, gen=sealing[chains.GEN], broker=new)]
    seg = chains.as_dict(t, q, sealing)   # harmless mutant: None for q (only the dict's physical_queue, never read)
    return [*events, *seal_at_budget(topic, q, seg, by="session_expired" if fenced else "disk_lost"),
            make("LogicStartDecided", topic=topic, queue=q, gen=head[chains.GEN],
                 logic_start=chains.logic_end(seg, seg["budget_end"]))]


# -- the command ---------------------------------------------------------------------------------------------------
def alter_one(image: Image, broker: str, change: dict[str, Any]) -> tuple[Events, dict[str, Any]]:
    # Harmless mutants: the message and details of the rejections below (decide_each keeps a refused item's code and
    # status only); ``and`` for ``or`` in the epoch check (a head's gen is never sealing, an older gen never active);
    # ``or True`` in the test of t (Image.segment answers None for a topic that does not exist); ``get(b, None)`` or
    # ``get(b)`` for ``get(b, {})`` (b is one of the segment's replicas, a registered broker: none leaves the image).
    t = image.topic(change["topic"])
    seg = image.segment(change["topic"], change["queue"], change["gen"]) if t is not None else None
    if seg is None or seg["broker"] != broker:
        raise rejection(404, "SEGMENT_NOT_FOUND", "no such segment led by this broker",
                        topic=change["topic"], queue=change["queue"], gen=change["gen"])
    if chains.head_of(t, change["queue"])["gen"] != change["gen"] or seg["state"] != "active":
        raise rejection(409, "STALE_LEADER_EPOCH", "the queue has a newer leader epoch, or is being sealed",
                        topic=change["topic"], queue=change["queue"], gen=change["gen"])
    in_sync = change["in_sync"]
    if in_sync[0] != broker or not set(in_sync) <= set(seg["replicas"]):
        raise invalid("in_sync must name the leader first and only the segment's replicas",
                      replicas=seg["replicas"])
    for b in set(in_sync) - set(seg["in_sync"]):
        if image.brokers.get(b, {}).get("state") != "active":
            raise rejection(409, "BROKER_NOT_ACTIVE", f"broker {b!r} is fenced: it cannot be in sync", broker=b)
        if change["epochs"].get(b) != image.brokers[b]["epoch"]:
            # What the leader saw of it was another registration: one that registered again (a new disk) may hold
            # nothing the leader acknowledged (the chaos runner's broker_wipe: a request on its way re-added a broker
            # 30 ms after it came back on an empty disk, and a failover then elected it)
            raise rejection(409, "STALE_BROKER_EPOCH", f"broker {b!r} registered again since the leader heard from "
                            "it", broker=b, epoch=image.brokers[b]["epoch"], seen=change["epochs"].get(b))
    if sorted(in_sync) == sorted(seg["in_sync"]):
        return [], {"in_sync": seg["in_sync"]}
    reason = "caught_up" if len(in_sync) > len(seg["in_sync"]) else "lagging"
    ev = make("InSyncChanged", topic=change["topic"], queue=change["queue"], gen=change["gen"], in_sync=in_sync,
              reason=reason)
    return [ev], {"in_sync": in_sync}


def alter_in_sync(image: Image, c, ts, budget):
    """A leader's changes of its heads' in-sync sets, each decided on its own (as SealSegments): a refused one is
    an item of the result and changes nothing."""
    registered_broker(image, c["broker"], c["epoch"])
    if image.brokers[c["broker"]]["state"] != "active":
        raise rejection(409, "BROKER_NOT_ACTIVE", f"broker {c['broker']!r} is fenced", broker=c["broker"])
    return decide_each(c["changes"], lambda change: alter_one(image, c["broker"], change))


def elect(image: Image, c, ts, budget):
    """An operator's election for the queues of a topic whose leader is fenced and which no in-sync copy took over.
    ``unclean``: elect the first live copy even out of sync; it seals the head at its own end, and what the old
    leader acknowledged past it is lost (Kafka's unclean leader election, never automatic). Each queue is decided
    on its own and named in the result with what happened to it."""
    t = existing_topic(image, c)
    queues = c.get("queues") or list(range(t["queues"]))
    for q in queues:
        if q >= t["queues"]:
            raise invalid(f"queue {q} does not exist; the topic has {t['queues']} queues", queue=q)
    live = set(active(image))
    events: Events = []
    results = []
    for q in queues:
        head = chains.head(t["chains"][q])
        leader, gen = head[chains.BROKER], head[chains.GEN]
        result: dict[str, Any] = {"queue": q, "leader": leader, "gen": gen}
        if leader in live:
            result["outcome"] = "leader_active"
        elif head[chains.STATE] != "active" or head[chains.LOGIC_START] is None:
            result["outcome"] = "sealing"
        # harmless mutant: None for leader in _elected (a leader in ``live`` was answered leader_active above)
        elif (new := _elected(head, leader, live)) is not None:
            events += _fail_over(t, q, head, leader, new, [new, *(b for b in _without(head, leader) if b != new)],
                                 "failover", budget)
            result.update(outcome="elected", to=new, new_gen=gen + 1)
        elif not c.get("unclean"):
            result["outcome"] = "no_in_sync_copy"
        elif (new := next((b for b in head[chains.REPLICAS] if b != leader and b in live), None)) is None:
            result["outcome"] = "no_live_copy"
        else:
            events += _fail_over(t, q, head, leader, new, [new], "unclean", budget)
            result.update(outcome="elected_unclean", to=new, new_gen=gen + 1,
                          may_lose=f"what {leader} acknowledged in gen {gen} past the end of {new}'s copy, which "
                                   "was not in sync")
        results.append(result)
    return events, {"topic": t["topic"], "queues": results}


DECIDERS: dict[str, Decider] = {
    "AlterInSync": alter_in_sync,
    "ElectLeaders": elect,
}
