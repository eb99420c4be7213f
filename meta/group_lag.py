"""Committed offsets and lag of a group's queues, asked of the brokers when an operator describes the group.

Why meta asks instead of brokers reporting offsets in their heartbeats: committed offsets are data, and brokers hold
data (DESIGN.md invariant 4). Reporting them would make every broker heartbeat carry groups x queues numbers, every
few seconds, for a view an operator opens now and then; asking costs one request per (broker, topic) only when
someone looks. A broker that does not answer in time leaves its queues' offsets null, never the whole answer.

A group need not be in the image to have offsets: a pull group commits on the brokers and never heartbeats meta, and
an exclusive group whose members all left holds no lock naming the topics it read. Which groups and topics have
commits only the brokers know; no broker call lists them but ``/metrics``, whose
``stator_broker_consumer_committed_offset{group,topic,queue}`` each head broker exports from local state (no token,
no peer calls). It is read to find the (group, topic) pairs only: the numbers shown come from
``GET /v1/offsets/{group}/{topic}``, which walks the queue's older brokers for the newest commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import aiohttp
import structlog
from prometheus_client.parser import text_string_to_metric_families

log = structlog.get_logger("meta.group_lag")
BROKER_ASK_TIMEOUT_S = 2.0
BROKER_ASKS_IN_FLIGHT_MAX = 16
# A scrape carries every other series of the broker too (up to QUEUE_SERIES_MAX per family): more time than one ask.
BROKER_SCRAPE_TIMEOUT_S = 5.0
COMMITTED_METRIC = "stator_broker_consumer_committed_offset"
COMMITTED_LINES_MAX = 100_000   # 10x a broker's own cap on the family (broker/metrics.py QUEUE_SERIES_MAX)

Heads = dict[tuple[str, int], "str | None"]


async def committed_offsets(http: aiohttp.ClientSession, token: str, group: str,
                            heads: Heads) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(topic, queue): {"committed_offset", "max_offset", "lag"}}`` for each queue of ``heads`` whose head broker
    answered (``committed_offset`` -1: never committed, and ``lag`` null).

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
            offset, max_offset = q.get("offset"), q.get("max_offset")
            lag = None
            if isinstance(offset, int) and isinstance(max_offset, int) and offset >= 0:
                lag = max(0, max_offset - offset)
            found[(topic, q["queue"])] = {"committed_offset": offset, "max_offset": max_offset, "lag": lag}
    await asyncio.gather(*(ask(address, topic, queues) for (address, topic), queues in asks.items()))
    return found


async def fill_offsets(http: aiohttp.ClientSession, token: str, group: str, assignments: list[dict[str, Any]],
                       heads: Heads) -> None:
    """Set ``committed_offset``, ``max_offset`` and ``lag`` of each assignment (null when unknown)."""
    found = await committed_offsets(http, token, group, {(a["topic"], a["queue"]): heads.get((a["topic"], a["queue"]))
                                                         for a in assignments})
    for a in assignments:
        a.update(found.get((a["topic"], a["queue"]), {"committed_offset": None, "max_offset": None, "lag": None}))


async def committed_on_brokers(http: aiohttp.ClientSession, addresses: Iterable[str],
                               group: str | None = None) -> dict[str, set[str]]:
    """``{group: {topic, ...}}``: the (group, topic) pairs the brokers at ``addresses`` report commits for in their
    ``/metrics`` (only ``group``'s when given). A broker that does not answer adds nothing."""
    found: dict[str, set[str]] = {}

    async def scrape(address: str) -> None:
        lines: list[str] = []
        try:
            async with http.get(f"{address.rstrip('/')}/metrics",
                                timeout=aiohttp.ClientTimeout(total=BROKER_SCRAPE_TIMEOUT_S)) as r:
                if r.status != 200:
                    log.info("group_scrape_refused", broker=address, status=r.status)
                    return
                # Line by line, keeping only the one family: the rest of the scrape may be megabytes.
                async for raw in r.content:
                    if raw.startswith(COMMITTED_METRIC.encode() + b"{"):
                        lines.append(raw.decode("utf-8", "replace"))
                        if len(lines) >= COMMITTED_LINES_MAX:
                            break
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            log.info("group_scrape_unavailable", broker=address, error=type(e).__name__)
            return
        try:
            families = list(text_string_to_metric_families("".join(lines)))
        except ValueError as e:
            log.info("group_scrape_unreadable", broker=address, error=str(e)[:200])
            return
        for family in families:
            for s in family.samples:
                g, topic = s.labels.get("group"), s.labels.get("topic")
                if g and topic and s.value >= 0 and (group is None or g == group):
                    found.setdefault(g, set()).add(topic)
    await asyncio.gather(*(scrape(a) for a in set(addresses)))
    return found
