"""Committed offsets and lag of a group's queues, asked of the brokers when an operator describes the group.

Why meta asks instead of brokers reporting offsets in their heartbeats: committed offsets are data, and brokers hold
data (DESIGN.md invariant 4). Reporting them would make every broker heartbeat carry groups x queues numbers, every
few seconds, for a view an operator opens now and then; asking costs one request per (broker, topic) only when
someone looks. A broker that does not answer in time leaves its queues' offsets null, never the whole answer.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp
import structlog

log = structlog.get_logger("meta.group_lag")
BROKER_ASK_TIMEOUT_S = 2.0
BROKER_ASKS_IN_FLIGHT_MAX = 16


async def fill_offsets(http: aiohttp.ClientSession, token: str, group: str, assignments: list[dict[str, Any]],
                       heads: dict[tuple[str, int], str | None]) -> None:
    """Set ``committed_offset``, ``max_offset`` and ``lag`` of each assignment (null when unknown).

    ``heads`` maps (topic, queue) to the address of the broker holding the queue's newest segment.
    """
    asks: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for a in assignments:
        a.update(committed_offset=None, max_offset=None, lag=None)
        address = heads.get((a["topic"], a["queue"]))
        if address:
            asks.setdefault((address, a["topic"]), []).append(a)
    gate = asyncio.Semaphore(BROKER_ASKS_IN_FLIGHT_MAX)

    async def ask(address: str, topic: str, rows: list[dict[str, Any]]) -> None:
        url = f"{address.rstrip('/')}/v1/offsets/{quote(group, safe='')}/{quote(topic, safe='')}"
        try:
            async with gate, http.get(url, headers={"Authorization": f"Bearer {token}"},
                                      timeout=aiohttp.ClientTimeout(total=BROKER_ASK_TIMEOUT_S)) as r:
                if r.status != 200:
                    log.info("group_offsets_refused", broker=address, topic=topic, status=r.status)
                    return
                body = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            log.info("group_offsets_unavailable", broker=address, topic=topic, error=type(e).__name__)
            return
        known = {q.get("queue"): q for q in body.get("queues", []) if isinstance(q, dict)}
        for a in rows:
            q = known.get(a["queue"])
            if q is None:
                continue
            offset, max_offset = q.get("offset"), q.get("max_offset")
            a["committed_offset"], a["max_offset"] = offset, max_offset
            if isinstance(offset, int) and isinstance(max_offset, int):
                a["lag"] = max(0, max_offset - offset) if offset >= 0 else None
    await asyncio.gather(*(ask(address, topic, rows) for (address, topic), rows in asks.items()))
