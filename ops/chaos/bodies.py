"""Message bodies of the send workload: sizes from 1 byte to a few MiB, each body a pure function of its tag and size,
so the history keeps (tag, size) and the read-back keeps a fingerprint, never the bytes of a big body twice.

A body at least as long as its tag starts with it (``tag|`` then filler): it names the send it came from, and the
same tagged body twice in a queue is a duplicate. A shorter one (1 byte and up) is the first characters of its tag's
hash: it is still checked at its offset, byte for byte, but says nothing about duplicates.
"""

from __future__ import annotations

import hashlib
import random
import zlib

KIB, MIB = 1024, 1024 * 1024
TINY_SHARE = 0.1                   # messages of 1 to TINY_BYTES_MAX bytes
TINY_BYTES_MAX = 8
BIG_EVERY = 40                     # about one batch in this many carries one big body
BIG_BYTES = (64 * KIB, 3 * MIB)    # log-uniform; a record holds at most 4 MiB (broker/storage/limits.py)
FINGERPRINT_PLAIN_MAX = 64         # bodies up to this long are kept as they are
_FILL = "0123456789abcdefghijklmnopqrstuvwxyz"


def sizes(rng: random.Random, count: int) -> list[int]:
    """The body sizes of one batch of ``count`` messages; 0 means "the tag itself" (the common case)."""
    out = [rng.randint(1, TINY_BYTES_MAX) if rng.random() < TINY_SHARE else 0 for _ in range(count)]
    if rng.randrange(BIG_EVERY) == 0:
        lo, hi = BIG_BYTES
        out[rng.randrange(count)] = int(lo * (hi / lo) ** rng.random())
    return out


def body(tag: str, size: int) -> str:
    if size == 0:
        return tag
    if size < len(tag) + 1:
        return hashlib.sha256(tag.encode()).hexdigest()[:size]
    head = tag + "|"
    reps, rest = divmod(size - len(head), len(_FILL))
    return head + _FILL * reps + _FILL[:rest]


def tagged(size: int, tag: str) -> bool:
    """Whether a body of ``size`` carries its whole tag (and so can be told apart from every other)."""
    return size == 0 or size >= len(tag) + 1


def fingerprint(text: str | None) -> str | None:
    """What the read-back keeps of a body: small ones whole, big ones by their head, length and CRC."""
    if text is None or len(text) <= FINGERPRINT_PLAIN_MAX:
        return text
    return f"{text[:40]}..#{len(text)}:{zlib.crc32(text.encode()):08x}"


def tag_of(fp: str | None) -> str | None:
    """The tag a fingerprint names, or None for a short untagged body."""
    if fp is None:
        return None
    if "|" in fp:
        return fp.split("|", 1)[0]
    return fp if "-" in fp else None
