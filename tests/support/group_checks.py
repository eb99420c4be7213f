"""Checks of consumer groups in the state machine's image (meta/groups.py): every lock held by a member, no two locks
sharing a token, counters equal to a recount; and the image rebuilt from its own event log alone.
"""

from __future__ import annotations

import json
from typing import Any

from meta import groups as group_rules
from meta.events import make
from meta.image import Image


def check_group_invariants(image: Image) -> None:
    tokens = []
    for name, g in image.groups.items():
        for topic, qs in g["locks"].items():
            n = image.queue_count(topic)
            assert n is not None, f"{name} holds a lock on missing topic {topic}"
            for q, lk in qs.items():
                assert 0 <= int(q) < n
                assert lk["member"] in g["members"], "a lock outlived its owner's membership"
                assert lk["target"] is None or lk["target"] in g["members"]
                tokens.append(lk["token"])
        assert image.data["revoking"].get(name, 0) == sum(
            not group_rules.owned(lk) for qs in g["locks"].values() for lk in qs.values())
    assert len(tokens) == len(set(tokens)), "two locks share a token"
    assert all(t <= image.data["lock_token"] for t in tokens)
    assert image.data["member_count"] == sum(len(g["members"]) for g in image.groups.values())


def lock_holders(image: Image) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(group, topic, queue) -> its one lock (member, token, target)."""
    return {(g, t, int(q)): lk for g, grp in image.groups.items() for t, qs in grp["locks"].items()
            for q, lk in qs.items()}


# What an image holds besides the fold of its events: the count of applied commands, the leader's time, the
# remembered outcomes of requests, and the voters (membership entries, not events).
NOT_FOLDED = ("commands", "last_ts", "requests", "members")


def replayed(image: Image) -> Image:
    """A fresh image fed the events of ``image``'s log, each at its stored time (the log must start at version 1)."""
    assert image.data["history_start"] == 1, "the history window trimmed the log: it cannot be replayed whole"
    fresh = Image()
    fresh.data["history_window"] = image.data["history_window"]
    for line in image.history_lines():
        ev = json.loads(line)
        fresh.replay(make(ev["type"], **ev["data"]), ev["ts"])
    return fresh


def folded(image: Image) -> dict[str, Any]:
    """The image as data, without what is not a fold of its events (``NOT_FOLDED``)."""
    data = json.loads(image.canonical_bytes())
    for key in NOT_FOLDED:
        data.pop(key, None)
    return data
