"""Queue names <-> directory names. Reversible, so a store lists its queues from the directory alone.

Letters, digits, '-', '_' and '.' stay as they are (so `orders.q3.g1.i7` stays readable on disk); every other UTF-8
byte becomes %XX, and so does a leading '.', which keeps '.', '..' and the store's own hidden work directories out
of reach of any queue name. Only the one canonical spelling of a name is accepted back.
"""

from __future__ import annotations

from . import limits
from .errors import InvalidQueueName

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
_DOT = ord(".")
_HEX = frozenset("0123456789ABCDEF")


def dir_name(name: str) -> str:
    if type(name) is not str or not name:
        raise InvalidQueueName("a queue name is a non-empty string", name=repr(name))
    try:
        raw = name.encode("utf-8")   # harmless mutant: "UTF-8" (codec names are case-insensitive)
    except UnicodeEncodeError:
        raise InvalidQueueName("a queue name must be valid Unicode", name=repr(name)) from None
    if len(raw) > limits.QUEUE_NAME_BYTES_MAX:
        raise InvalidQueueName(f"a queue name holds at most {limits.QUEUE_NAME_BYTES_MAX} UTF-8 bytes",
                               name_bytes=len(raw))
    encoded = "".join(chr(b) if b in _SAFE and (i or b != _DOT) else f"%{b:02X}" for i, b in enumerate(raw))
    if len(encoded) > limits.DIR_NAME_BYTES_MAX:
        raise InvalidQueueName(f"a queue name escapes to more than {limits.DIR_NAME_BYTES_MAX} bytes",
                               name=name)
    return encoded


def queue_name(directory: str) -> str | None:
    """The queue name a directory holds, or None when it is not the canonical spelling of one."""
    raw = bytearray()
    i = 0
    while i < len(directory):
        ch = directory[i]
        if ch == "%":
            digits = directory[i + 1:i + 3]
            # Harmless mutant: ``<`` for ``<=`` (two characters are never all sixteen of _HEX)
            if len(digits) != 2 or not set(digits) <= _HEX:
                return None
            raw.append(int(digits, 16))
            i += 3
        elif ch.isascii():
            raw.append(ord(ch))
            i += 1
        else:
            return None
    try:
        name = raw.decode("utf-8")   # harmless mutant: "UTF-8" (codec names are case-insensitive)
        return name if dir_name(name) == directory else None
    except (UnicodeDecodeError, InvalidQueueName):
        return None
