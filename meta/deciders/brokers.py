"""Decisions about brokers: their registration (each one a new session epoch), the fence of an expired session and
its end, and the offset budgets their heartbeats renew.

A fence also ends what the fenced broker was sealing: it can write nothing past its budget, so the budget's end is
a safe end (``seal_at_budget``, which topics.move uses too when the old broker is already fenced).
"""

from __future__ import annotations

from typing import Any

from .. import chains, limits
from ..events import make
from ..image import Image
from wire.errors import rejection
from . import Decider, Events


def registered_broker(image: Image, name: str, epoch: int | None = None) -> dict[str, Any]:
    """The broker ``name`` (404 when unknown), in session ``epoch`` when one is given (409 STALE_EPOCH otherwise)."""
    b = image.brokers.get(name)
    if b is None:
        raise rejection(404, "BROKER_NOT_FOUND", f"broker {name!r} is not registered", broker=name)
    if epoch is not None and epoch != b["epoch"]:
        raise rejection(409, "STALE_EPOCH", f"broker {name!r} has epoch {b['epoch']}, not {epoch}; register again",
                        broker=name, epoch=b["epoch"])
    return b


def active_brokers(image: Image, names: list[str]) -> list[str]:
    for n in names:
        if registered_broker(image, n)["state"] != "active":
            raise rejection(409, "BROKER_NOT_ACTIVE", f"broker {n!r} is fenced (its session expired)", broker=n)
    return names


def seal_at_budget(topic: str, queue: int, seg: dict[str, Any]) -> Events:
    """The seal of a segment whose broker's session expired: at the end of its granted budget."""
    return [make("SegmentSealed", topic=topic, queue=queue, gen=seg["gen"], broker=seg["broker"],
                 physical_end=seg["budget_end"], logic_end=chains.logic_end(seg, seg["budget_end"]),
                 by="session_expired")]


# -- the commands ------------------------------------------------------------------------------------------------
def register(image: Image, c, ts, budget):
    old = image.brokers.get(c["broker"])
    if old is None and len(image.brokers) >= limits.BROKERS_MAX:
        raise rejection(409, "TOO_MANY_BROKERS", f"at most {limits.BROKERS_MAX} brokers")
    epoch = (old["epoch"] if old else 0) + 1
    ev = make("BrokerRegistered", broker=c["broker"], address=c["address"], zone=c.get("zone"), epoch=epoch)
    return [ev], {"broker": c["broker"], "epoch": epoch}


def fence(image: Image, c, ts, budget):
    b = registered_broker(image, c["broker"])
    if b["epoch"] != c["epoch"] or b["state"] == "fenced":
        return [], {"state": b["state"]}  # a later registration or an earlier fence already decided
    events = [make("BrokerFenced", broker=c["broker"], epoch=c["epoch"], reason=c["reason"])]
    for name in image.topics_on(c["broker"]):
        t = image.topics[name]
        for q, entry in enumerate(t["chains"]):
            raw = chains.segments(entry)
            if len(raw) >= 2 and raw[-2][chains.BROKER] == c["broker"] and raw[-2][chains.STATE] == "sealing":
                sealing = chains.as_dict(t, q, raw[-2])
                events += seal_at_budget(name, q, sealing)
                events.append(make("LogicStartDecided", topic=name, queue=q, gen=raw[-1][chains.GEN],
                                   logic_start=chains.logic_end(sealing, sealing["budget_end"])))
    return events, {"state": "fenced"}


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
}
