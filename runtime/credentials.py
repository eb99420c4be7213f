"""Per-broker credentials (issue 20, item 7b): each broker has its own token, and a service knows it only by its hash.

A config names each broker's token as ``"sha256:<hex>"``, so a leaked config file hands out no credential. A
presented token is hashed once and compared with every broker's hash in constant time (no early exit), and the
request then carries the broker id it proved. A handler acting for a broker (``act_for``) refuses any other broker.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping

from aiohttp import web

from wire.errors import rejection

HASH_PREFIX = "sha256:"
HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
BROKER_TOKENS_MAX = 1_024   # brokers a config may name; each request compares against every hash


def token_hash(token: str) -> str:
    """The form a config names a broker's token by."""
    return HASH_PREFIX + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def check_hash(value: str) -> str:
    if not HASH_RE.match(value):
        raise ValueError('must be "sha256:" and 64 lowercase hex digits: the hash of the broker\'s token '
                         "(`python -m runtime.credentials < TOKEN_FILE` prints it), never the token itself")
    return value


# What the auth middleware (runtime/server.py) proved of a request's caller: its role, and a broker caller's id.
ROLE = web.RequestKey("role", str)
BROKER = web.RequestKey("broker", str)


def broker_of(token: str, hashes: Mapping[str, str]) -> str | None:
    """The broker whose token this is, or None; every hash is compared, whatever matched first."""
    presented = token_hash(token).encode()
    found = None
    for broker, expected in hashes.items():
        if hmac.compare_digest(presented, expected.encode()):
            found = found or broker
    return found


def act_for(request: web.Request, broker: str) -> None:
    """Refuse a broker that acts under another broker's id; an admin acts for any broker (operators)."""
    if request.get(ROLE) == "broker":
        require_broker(request.get(BROKER), {broker}, f"act as broker {broker!r}")


def caller_broker(request: web.Request) -> str | None:
    """The broker id a broker caller proved; None for an admin (who may act for any broker)."""
    return request.get(BROKER) if request.get(ROLE) == "broker" else None


def require_broker(caller: str | None, allowed: set[str], what: str) -> None:
    """Refuse a broker caller that is not one of ``allowed`` (None: an admin, allowed everywhere)."""
    if caller is not None and caller not in allowed:
        raise rejection(403, "PERMISSION_DENIED", f"broker {caller!r} may not {what}", caller=caller,
                        allowed=sorted(allowed))


if __name__ == "__main__":
    # The token comes on stdin, never as an argument: arguments are visible to every user in the process list.
    import sys
    print(token_hash(sys.stdin.readline().strip()))
