"""Request headers whose values end up in the replicated log, checked once at the edge."""

from __future__ import annotations

import re
from collections.abc import Mapping

from wire.errors import invalid

REQUEST_ID_CHARS_MAX = 200
# Printable ASCII only: aiohttp decodes header bytes with surrogateescape, so any other byte would reach the log as a
# lone surrogate (and the id is echoed in logs and answers).
_REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]{1,%d}$" % REQUEST_ID_CHARS_MAX)


def request_id_header(headers: Mapping[str, str], name: str) -> str | None:
    """An ``Idempotency-Key`` or ``X-Request-Id`` value, or None when absent; a bad one is a 400."""
    value = headers.get(name)
    if value is None:
        return None
    if not _REQUEST_ID_RE.fullmatch(value):
        raise invalid(f"{name} must be 1-{REQUEST_ID_CHARS_MAX} printable ASCII characters", header=name)
    return value
