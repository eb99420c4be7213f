"""How the image keeps one line of its history: big lines compressed, so that the window fits at scale.

A topic's creation stores every queue's placement in its event: about 100 B per queue, as much as the rest of the
image holds for that queue. Lines of at least ``PACK_MIN_CHARS`` are kept as ``"z" + base64(zlib(line))`` (a stored
event's canonical JSON always begins with ``{``, so the two never mix up); a 1,000-queue creation shrinks about
tenfold. Still plain text, so snapshots need no special case. ``Image.canonical_bytes`` compares the lines
unpacked: two builds of zlib may compress the same line differently, and replicas must still agree byte for byte.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable
from typing import Any

from wire.json_body import decode

PACK_MIN_CHARS = 4096
PACK_LEVEL = 1       # the line is packed inside apply: most of the saving for the least CPU
PACKED_MARK = "z"


def pack(line: str) -> str:
    if len(line) < PACK_MIN_CHARS:
        return line
    return PACKED_MARK + base64.b64encode(zlib.compress(line.encode(), PACK_LEVEL)).decode("ascii")


def unpack(kept: str) -> str:
    if not kept.startswith(PACKED_MARK):
        return kept
    return zlib.decompress(base64.b64decode(kept[1:])).decode()


def unpacked(kept: Iterable[str], chars_max: int | None = None) -> list[str]:
    """The lines of ``kept`` unpacked, stopping before the one that would pass ``chars_max`` characters in all
    (the first is always taken, however long)."""
    out: list[str] = []
    total = 0
    for line in kept:
        line = unpack(line)
        total += len(line)
        if chars_max is not None and total > chars_max and out:
            break
        out.append(line)
    return out


# An unpacked line is a stored event as canonical JSON (meta/image.py ``_record``: keys sorted), so it begins with
# data and ends with topic, ts, type, v and version.
_LINE_START = '{"data":'
_LINE_TOPIC = ',"topic":'
_LINE_TAIL_KEYS = {"topic", "ts", "type", "v", "version"}


def split(line: str) -> tuple[dict[str, Any], str]:
    """(the event's fields but data, data's own JSON text) of an unpacked line, parsing only the short tail: the
    projection writer stores data's text as it is, and parses it only when its fold reads it."""
    # The last ',"topic":' is the top-level key: only the event's topic (null or a string, in which a quote is
    # escaped) and the four scalars follow it; a "topic" inside data comes before it.
    cut = line.rfind(_LINE_TOPIC)
    if cut < 0 or not line.startswith(_LINE_START):
        raise ValueError(f"not a stored event's canonical line: {line[:100]!r}")
    tail = decode("{" + line[cut + 1:])
    if not isinstance(tail, dict) or tail.keys() != _LINE_TAIL_KEYS:
        raise ValueError(f"not a stored event's canonical line: {line[:100]!r}")
    return tail, line[len(_LINE_START):cut]
