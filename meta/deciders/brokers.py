"""Decisions about brokers: their registration (each one a new session epoch), the fence of an expired session and
its end, and the offset budgets their heartbeats renew.

A fence, and a registration of a broker known before on another disk (wire/disk_identity.py), lose the broker's
copies: the heads it led fail over to in-sync replicas and it leaves every in-sync set (replicas.broker_lost). One
back on the disk it had keeps them (replicas.broker_restarted). What a lost broker was sealing with no live copy in
sync to seal it instead ends at its budget's end, a safe end: it can write nothing past it (``lookups.seal_at_budget``,
which topics.move uses too when the old broker is already fenced).
"""

from __future__ import annotations


from .. import limits
from ..events import make
from ..image import Image
from wire.errors import rejection
from . import Decider
from .lookups import registered_broker
from .replicas import broker_lost, broker_restarted, heads_holding, placeable


# -- the commands ------------------------------------------------------------------------------------------------
def register(image: Image, c, ts, budget):
    old = image.brokers.get(c["broker"])
    if old is None and len(image.brokers) >= limits.BROKERS_MAX:
        raise rejection(409, "TOO_MANY_BROKERS", f"at most {limits.BROKERS_MAX} brokers")
    epoch = (old["epoch"] if old else 0) + 1
    disk = c.get("disk")
    ev = make("BrokerRegistered", broker=c["broker"], address=c["address"], zone=c.get("zone"),
              cluster=c.get("cluster") or limits.CLUSTER_DEFAULT, epoch=epoch, disk=disk)
    if old is None:
        after = []
    elif disk is not None and disk == old["disk"]:
        after = broker_restarted(image, c["broker"], budget)   # its copies are where they were
    else:   # a new disk (or one it did not name): what it held counts only once it has caught up
        # Harmless mutant: fenced=None (falsy, as False: broker_lost reads it only as a truth value).
        after = broker_lost(image, c["broker"], budget, fenced=False)
    return [ev, *after], {"broker": c["broker"], "epoch": epoch}


def drain(image: Image, c, ts, budget):
    """Start (or stop) moving every head copy a broker holds onto others (issue 37; the moves are DrainStep's). Refused
    409 NOT_ENOUGH_BROKERS when a topic it holds copies of could not keep its count of copies without it."""
    name = c["broker"]
    b = registered_broker(image, name)
    to = c.get("to") if c["draining"] else None
    for other in to or ():
        registered_broker(image, other)
    if c["draining"]:
        for topic in image.topics_on(name):
            t = image.topics[topic]
            left = [x for x in placeable(image, t["scope"]) if x != name]
            if len(left) < t["replicas"]:
                raise rejection(409, "NOT_ENOUGH_BROKERS", f"{topic!r} keeps {t['replicas']} copies of each queue; "
                                f"without {name!r} its scope has {len(left)} brokers to place them on",
                                topic=topic, replicas=t["replicas"], brokers=len(left))
    result = {"broker": name, "draining": c["draining"], "to": to, "remaining": len(heads_holding(image, name))}
    if (b["draining"], b["drain_to"]) == (c["draining"], to):
        return [], result
    return [make("BrokerDrainChanged", broker=name, draining=c["draining"], to=to)], result


def fence(image: Image, c, ts, budget):
    b = registered_broker(image, c["broker"])
    if b["epoch"] != c["epoch"] or b["state"] == "fenced":
        return [], {"state": b["state"]}  # a later registration or an earlier fence already decided
    events = [make("BrokerFenced", broker=c["broker"], epoch=c["epoch"], reason=c["reason"])]
    return events + broker_lost(image, c["broker"], budget, fenced=True), {"state": "fenced"}


def unfence(image: Image, c, ts, budget):
    b = registered_broker(image, c["broker"], c["epoch"])
    if b["state"] == "active":
        return [], {"state": "active"}
    return [make("BrokerUnfenced", broker=c["broker"], epoch=c["epoch"])], {"state": "active"}


def grant_budget(image: Image, c, ts, budget):
    registered_broker(image, c["broker"], c["epoch"])
    events = []
    granted: dict[tuple[str, int, int], int] = {}  # a budget never shrinks, even within one command
    for g in c["grants"]:
        key = (g["topic"], g["queue"], g["gen"])
        seg = image.segment(*key)
        # Grants race with remaps: a segment that moved on or is sealing gets nothing more, silently.
        if seg is None or seg["broker"] != c["broker"] or seg["state"] != "active":
            continue
        if g["budget_end"] <= granted.get(key, seg["budget_end"]):
            continue
        granted[key] = g["budget_end"]
        events.append(make("OffsetBudgetGranted", topic=g["topic"], queue=g["queue"], gen=g["gen"],
                           broker=c["broker"], budget_end=g["budget_end"]))
    return events, {"granted": len(events)}


DECIDERS: dict[str, Decider] = {
    "RegisterBroker": register,
    "FenceBroker": fence,
    "UnfenceBroker": unfence,
    "GrantOffsetBudget": grant_budget,
    "DrainBroker": drain,
}
