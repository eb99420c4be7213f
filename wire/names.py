"""Names that cross the wire and stand in configs: topics, brokers, groups, nodes. One rule, read by the meta node's
commands, the configs of both kinds of node, and the client's own checks."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
BROKER_NAME_CHARS_MAX = 64   # a broker's name, and a meta node's (the configs name both by this rule)


def physical_queue_name(topic: str, incarnation: int, queue: int, gen: int) -> str:
    """Unique on a broker across remaps and across a topic deleted and created again (incarnation)."""
    return f"{topic}.q{queue}.g{gen}.i{incarnation}"


def parse_physical_queue_name(name: str) -> tuple[str, int, int] | None:
    """(topic, queue, gen) of a name made by ``physical_queue_name``, or None for anything else. Topic names hold
    no dots (NAME_RE), so the last three dot-separated parts are always the numbers."""
    parts = name.rsplit(".", 3)
    if len(parts) != 4 or parts[1][:1] != "q" or parts[2][:1] != "g" or parts[3][:1] != "i":
        return None
    try:
        return parts[0], int(parts[1][1:]), int(parts[2][1:])
    except ValueError:
        return None
