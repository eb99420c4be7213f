"""Receipt handles: what a pop hands out and an ack or a change of invisible time brings back.

A handle names one delivery: ``<queue>.<offset>.<seq>.<base64url(topic)>.<MAC>``. ``seq`` is the delivery's number,
unique per broker incarnation and growing (the incarnation in its high bits, service.py), so the broker tells a
superseded handle (its offset was delivered again, or given a new handle: a larger seq is in flight) from a live one.
The MAC is a keyed BLAKE2b of the group and the rest of the handle under a secret kept in the broker's data
directory, so a handle cannot be forged or moved to another group or broker: anything that does not verify is
malformed (INVALID_HANDLE). No JSON on this path: a handle is made and checked per message popped and acked.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from typing import NamedTuple

from ..storage import files
from .limits import HANDLE_CHARS_MAX

MAC_BYTES = 16
SECRET_BYTES = 32


class Handle(NamedTuple):
    topic: str
    queue: int
    offset: int
    seq: int


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None


class HandleCodec:
    def __init__(self, secret: bytes):
        # Harmless mutants: either bound moved by one (the only secret is load_secret's, SECRET_BYTES = 32 long).
        assert 16 <= len(secret) <= 64
        self._secret = secret

    def _mac(self, group: str, body: str) -> str:
        return _b64(hashlib.blake2b((group + "\0" + body).encode(), key=self._secret, digest_size=MAC_BYTES).digest())

    def encode(self, group: str, h: Handle) -> str:
        body = "%d.%d.%d.%s" % (h.queue, h.offset, h.seq, _b64(h.topic.encode()))
        return body + "." + self._mac(group, body)

    def decode(self, group: str, raw: object) -> Handle | None:
        """The handle, or None when it is malformed or was not made by this broker for this group."""
        if not isinstance(raw, str) or len(raw) > HANDLE_CHARS_MAX or raw.count(".") != 4 or not raw.isascii():
            return None
        body, _, mac = raw.rpartition(".")
        if not hmac.compare_digest(mac, self._mac(group, body)):
            return None
        queue, offset, seq, topic = body.split(".")
        numbers = [_number(queue), _number(offset), _number(seq)]
        if None in numbers:
            return None
        try:
            # Harmless mutant: +len (too much padding is ignored by the decoder; a length of 1 mod 4 fails either way).
            name = base64.urlsafe_b64decode(topic + "=" * (-len(topic) % 4)).decode()
        except (ValueError, UnicodeError):
            return None
        return Handle(name, *numbers)


def load_secret(path: str) -> bytes:
    """The broker's handle secret, made once and kept: handles stay valid across restarts."""
    raw = files.read_file(path)
    if raw is not None and len(raw) == SECRET_BYTES:
        return raw
    # Harmless mutant: token_bytes(None) (its default length is 32 bytes, SECRET_BYTES).
    files.write_atomic(path, secrets.token_bytes(SECRET_BYTES))
    files.sync_dir(os.path.dirname(path))
    return files.read_file(path)
