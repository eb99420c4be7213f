"""Is a broker's process gone? The leader's own look when another broker reports it cannot reach it (a follower's
fetch broke off, or could not connect).

Only a refused connection decides: nobody listens at the broker's address, so its process is gone (killed, crashed,
stopped) and whatever it was doing has stopped with it. A connection that is accepted, or that times out, decides
nothing: the broker may be paused, slow or cut off by a partition, and its session's timeout stays the judge (a
black-holed link never refuses). This is Redis Sentinel's subjective-then-objective down in two steps: one peer's
suspicion, confirmed by the one that decides.
"""

from __future__ import annotations

import asyncio
import errno
from urllib.parse import urlsplit

PROBE_TIMEOUT_S = 1.0

REFUSED = "refused"        # nobody listens: the process is gone
ANSWERED = "answered"      # a connection was accepted: something listens there
SILENT = "silent"          # no answer within PROBE_TIMEOUT_S, or the network said no route: decides nothing


def endpoint(address: str) -> tuple[str, int] | None:
    """host and port of a broker's registered base URL; None for one that names no host."""
    try:
        parts = urlsplit(address)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


async def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Open (and close at once) a TCP connection to the broker at ``address``: REFUSED, ANSWERED or SILENT."""
    where = endpoint(address)
    if where is None:
        return SILENT
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*where), timeout_s)
    except ConnectionRefusedError:
        return REFUSED
    except asyncio.TimeoutError:
        return SILENT
    except OSError as e:
        return REFUSED if e.errno == errno.ECONNREFUSED else SILENT
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), timeout_s)
    except (OSError, asyncio.TimeoutError):
        pass
    return ANSWERED
