"""Receipt handles: what a pop hands out and an ack or a change of invisible time brings back.

A handle names one delivery: ``base64url(JSON [topic, queue, offset, seq]) + "." + MAC``. ``seq`` is the delivery's
number, unique per broker incarnation and growing (the incarnation in its high bits, state.py), so the broker tells a
superseded handle (its offset was delivered again, or given a new handle: a larger seq is in flight) from a live one.
The MAC is an HMAC-SHA256 of the group and the body under a secret kept in the broker's data directory, so a handle
cannot be forged or moved to another group or broker: anything that does not verify is malformed (INVALID_HANDLE).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from typing import NamedTuple

from ..storage import files
from .limits import HANDLE_CHARS_MAX

MAC_BYTES = 16
_json_str = json.encoder.encode_basestring_ascii   # the C escaper json.dumps uses for strings
SECRET_BYTES = 32


class Handle(NamedTuple):
    topic: str
    queue: int
    offset: int
    seq: int


class HandleCodec:
    def __init__(self, secret: bytes):
        assert len(secret) >= 16
        self._keyed = hmac.new(secret, digestmod=hashlib.sha256)   # copied per handle: the key is set up once

    def _mac(self, group: str, body: bytes) -> str:
        m = self._keyed.copy()
        m.update(group.encode() + b"\0" + body)
        return base64.urlsafe_b64encode(m.digest()[:MAC_BYTES]).rstrip(b"=").decode()

    def encode(self, group: str, h: Handle) -> str:
        text = "[%s,%d,%d,%d]" % (_json_str(h.topic), h.queue, h.offset, h.seq)
        body = base64.urlsafe_b64encode(text.encode()).rstrip(b"=")
        return body.decode() + "." + self._mac(group, body)

    def decode(self, group: str, raw: object) -> Handle | None:
        """The handle, or None when it is malformed or was not made by this broker for this group."""
        if not isinstance(raw, str) or len(raw) > HANDLE_CHARS_MAX or raw.count(".") != 1:
            return None
        body, mac = raw.split(".")
        try:
            if not hmac.compare_digest(mac.encode("ascii"), self._mac(group, body.encode("ascii")).encode()):
                return None
            value = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (UnicodeError, ValueError):
            return None
        if (not isinstance(value, list) or len(value) != 4 or not isinstance(value[0], str)
                or not all(type(v) is int and v >= 0 for v in value[1:])):
            return None
        return Handle(*value)


def load_secret(path: str) -> bytes:
    """The broker's handle secret, made once and kept: handles stay valid across restarts."""
    raw = files.read_file(path)
    if raw is not None and len(raw) == SECRET_BYTES:
        return raw
    files.write_atomic(path, secrets.token_bytes(SECRET_BYTES))
    files.sync_dir(os.path.dirname(path))
    return files.read_file(path)
