"""Committed offsets and lag of a group's queues, asked of the brokers when an operator describes the group.

Why meta asks instead of brokers reporting offsets in their heartbeats: committed offsets are data, and brokers hold
data (DESIGN.md invariant 4). Reporting them would make every broker heartbeat carry groups x queues numbers, every
few seconds, for a view an operator opens now and then; asking costs one request per (broker, topic) only when
someone looks. A broker that does not answer in time leaves its queues' offsets null, never the whole answer.

A group need not be in the image to have offsets: a pull group commits on the brokers and never heartbeats meta, and
an exclusive group whose members all left holds no lock naming the topics it read. Which groups and topics have
commits only the brokers know: each lists its own (``GET /v1/offsets``); the numbers shown come from
``GET /v1/offsets/{group}/{topic}`` of each queue's head, which walks the queue's older brokers for the newest commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import aiohttp
import structlog

log = structlog.get_logger("meta.group_lag")
BROKER_ASK_TIMEOUT_S = 2.0
BROKER_ASKS_IN_FLIGHT_MAX = 16

Heads = dict[tuple[str, int], "str | None"]


async def committed_offsets(http: aiohttp.ClientSession, token: str, group: str,
                            heads: Heads) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(topic, queue): {"committed_offset", "max_offset", "lag", "unavailable"?}}`` for each queue of ``heads``
    whose head broker answered (``committed_offset`` -1: never committed, and ``lag`` null; ``unavailable``: the
    ranges whose holders did not answer, left out of the lag).

    ``heads`` maps (topic, queue) to the address of the broker holding the queue's newest segment.
    """
    asks: dict[tuple[str, str], set[int]] = {}
    for (topic, queue), address in heads.items():
        if address:
            asks.setdefault((address, topic), set()).add(queue)
    gate = asyncio.Semaphore(BROKER_ASKS_IN_FLIGHT_MAX)
    found: dict[tuple[str, int], dict[str, Any]] = {}

    async def ask(address: str, topic: str, queues: set[int]) -> None:
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
        for q in body.get("queues", []) if isinstance(body, dict) else []:
            if not isinstance(q, dict) or q.get("queue") not in queues:
                continue
            # The broker counts the lag: the messages stored from the offset on, not max_offset - offset, which
            # counted an offset budget skipped after a lapsed session (broker/lag.py)
            offset, max_offset, lag = q.get("offset"), q.get("max_offset"), q.get("lag")
            found[(topic, q["queue"])] = {"committed_offset": offset, "max_offset": max_offset,
                                          "lag": lag if isinstance(lag, int) and not isinstance(lag, bool) else None}
            if isinstance(q.get("unavailable"), list):
                found[(topic, q["queue"])]["unavailable"] = q["unavailable"]
    await asyncio.gather(*(ask(address, topic, queues) for (address, topic), queues in asks.items()))
    return found


async def fill_offsets(http: aiohttp.ClientSession, token: str, group: str, assignments: list[dict[str, Any]],
                       heads: Heads) -> None:
    """Set ``committed_offset``, ``max_offset`` and ``lag`` of each assignment (null when unknown)."""
    found = await committed_offsets(http, token, group, {(a["topic"], a["queue"]): heads.get((a["topic"], a["queue"]))
                                                         for a in assignments})
    for a in assignments:
        a.update(found.get((a["topic"], a["queue"]), {"committed_offset": None, "max_offset": None, "lag": None}))


async def committed_on_brokers(http: aiohttp.ClientSession, token: str, addresses: Iterable[str],
                               group: str | None = None) -> dict[str, set[str]]:
    """``{group: {topic, ...}}``: the groups the brokers at ``addresses`` hold commits of, with their topics (only
    ``group``'s when given), from each broker's ``GET /v1/offsets``. A broker that does not answer adds nothing."""
    found: dict[str, set[str]] = {}
    query = f"?group={quote(group, safe='')}" if group is not None else ""

    async def ask(address: str) -> None:
        try:
            async with http.get(f"{address.rstrip('/')}/v1/offsets{query}",
                                headers={"Authorization": f"Bearer {token}"},
                                timeout=aiohttp.ClientTimeout(total=BROKER_ASK_TIMEOUT_S)) as r:
                body = await r.json() if r.status == 200 else None
                if r.status != 200:
                    log.info("group_listing_refused", broker=address, status=r.status)
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            log.info("group_listing_unavailable", broker=address, error=type(e).__name__)
            return
        if isinstance(body, dict) and body.get("truncated"):
            log.warning("group_listing_truncated", broker=address)
        for g in body.get("groups", []) if isinstance(body, dict) else []:
            if isinstance(g, dict) and isinstance(g.get("group"), str) and isinstance(g.get("topics"), list):
                found.setdefault(g["group"], set()).update(t for t in g["topics"] if isinstance(t, str))
    await asyncio.gather(*(ask(a) for a in set(addresses)))
    return found


async def pop_positions(http: aiohttp.ClientSession, token: str, group: str, addresses: Iterable[str]
                        ) -> list[dict[str, Any]]:
    """Where ``group`` pops each queue, from every broker of ``addresses`` (``GET /v1/pop-stats/{group}``: pop
    state lives with the queue's head); a broker that does not answer in BROKER_ASK_TIMEOUT_S leaves its queues
    out."""
    gate = asyncio.Semaphore(BROKER_ASKS_IN_FLIGHT_MAX)

    async def ask(address: str) -> list[dict[str, Any]]:
        url = f"{address.rstrip('/')}/v1/pop-stats/{quote(group, safe='')}"
        try:
            async with gate, http.get(url, headers={"Authorization": f"Bearer {token}"},
                                      timeout=aiohttp.ClientTimeout(total=BROKER_ASK_TIMEOUT_S)) as r:
                body = await r.json(content_type=None) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            log.info("pop_positions_unavailable", broker=address, error=type(e).__name__)
            return []
        if not isinstance(body, dict) or not isinstance(body.get("queues"), list):
            return []
        return [{"topic": q["topic"], "queue": q["queue"], "broker": body.get("broker"), "pop_offset": q["pop_offset"],
                 "in_flight": q["in_flight"], "revive_backlog": q["revive_backlog"]}
                for q in body["queues"] if isinstance(q, dict) and {"topic", "queue", "pop_offset", "in_flight",
                                                                    "revive_backlog"} <= q.keys()]
    found = [row for rows in await asyncio.gather(*(ask(a) for a in addresses)) for row in rows]
    return sorted(found, key=lambda r: (r["topic"], r["queue"], r["broker"] or ""))
