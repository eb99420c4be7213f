"""Who is logged in to this node's console: a bounded table of opaque session ids, kept in memory only.

The browser holds only a random id in an HttpOnly, SameSite=Strict cookie; the token it was exchanged for stays
here, so it is never in a URL, a page, a script or a log. The console calls the node's API with that token (the
same checks as any client). A restart logs everyone out; so does reaching the table's bound (oldest first).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

COOKIE = "stator_console"
SESSIONS_MAX = 256            # logged-in browsers per node; the oldest is logged out past it
SESSION_TTL_S = 12 * 3600     # a login lasts a working day
CONSOLE_ROLES = ("admin", "client")   # a broker's credential is a machine's, not a person's


@dataclass(frozen=True)
class Session:
    role: str
    token: str
    csrf: str            # echoed by every form the console renders; a POST without it is refused
    expires_at: float    # time.monotonic()


class Sessions:
    def __init__(self, limit: int = SESSIONS_MAX, ttl_s: float = SESSION_TTL_S):
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self.limit = limit
        self.ttl_s = ttl_s

    def open(self, role: str, token: str) -> str:
        now = time.monotonic()
        self._drop_expired(now)
        while len(self._by_id) >= self.limit:
            self._by_id.popitem(last=False)
        sid = secrets.token_urlsafe(32)
        self._by_id[sid] = Session(role, token, secrets.token_urlsafe(16), now + self.ttl_s)
        return sid

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        s = self._by_id.get(sid)
        if s is None or s.expires_at <= time.monotonic():
            self._by_id.pop(sid, None)
            return None
        return s

    def close(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)

    def __len__(self) -> int:
        return len(self._by_id)

    def _drop_expired(self, now: float) -> None:
        for sid in [k for k, s in self._by_id.items() if s.expires_at <= now]:
            del self._by_id[sid]


def csrf_ok(session: Session, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(session.csrf.encode(), presented.encode())
