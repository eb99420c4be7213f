"""What several deciders read or decide alike: the topic or broker a command names, the active brokers it names, and
the seal of a segment at its budget's end."""

from __future__ import annotations

from typing import Any

from .. import chains
from ..events import make
from ..image import Image
from wire.errors import rejection
from . import Events, expect_version


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


def seal_at_budget(topic: str, queue: int, seg: dict[str, Any], by: str = "session_expired") -> Events:
    """The seal of a segment whose broker's session expired (or whose broker came back on a new disk, ``by``
    "disk_lost"), with no copy in sync to report its end: at the end of its granted budget."""
    return [make("SegmentSealed", topic=topic, queue=queue, gen=seg["gen"], broker=seg["broker"],
                 physical_end=seg["budget_end"], logic_end=chains.logic_end(seg, seg["budget_end"]), by=by)]


def existing_topic(image: Image, cmd: dict[str, Any]) -> dict[str, Any]:
    """The topic ``cmd`` names (404 when there is none), at the command's ``expected_version`` if it has one."""
    t = image.topic(cmd["topic"])
    if t is None:
        raise rejection(404, "TOPIC_NOT_FOUND", f"topic {cmd['topic']!r} does not exist", topic=cmd["topic"])
    expect_version(cmd, t["version"])
    return t
