"""The dead-letter queues: per group, one physical queue in a store of their own, fsynced per append.

A record is the JSON ``{"group","topic","queue","origin_offset","attempts","message": <the message's JSON object>}``
(a message stored as a binary record is rendered as its JSON object, ``codec.as_json_object``); DLQ
offsets count from 0 per group. Writes happen in a thread (they fsync). The queue name is a hash of the group, so
any group name fits the store's name rules; the group itself is in every record.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from ..codec import as_json_object
from ..storage import FLUSH_FSYNC, QueueConfig, QueueStore
from .limits import DLQ_TAIL_SCAN_MAX

PREFIX = "dlq-"


def queue_name(group: str) -> str:
    return PREFIX + hashlib.sha256(group.encode()).hexdigest()[:40]


class DeadLetters:
    # Harmless mutants: driven's default True (PopService always passes it); None or no config for the store's
    # (QueueStore's default config is QueueConfig(), whose flush_policy is FLUSH_FSYNC: the same config).
    def __init__(self, root: str, driven: bool = False):
        self.store = QueueStore(root, QueueConfig(flush_policy=FLUSH_FSYNC), driven=driven)
        self.sizes: dict[str, int] = {}
        for name in self.store.names():
            pq = self.store.get(name)
            # Harmless mutants: max_records 2 or its default (only the first record is read), >= (a read at
            # max_offset is empty), and + for - below (a DLQ queue keeps everything: min_offset is 0).
            first = pq.read(pq.min_offset, max_records=1) if pq.max_offset > pq.min_offset else []
            if first:
                self.sizes[json.loads(first[0].payload)["group"]] = pq.max_offset - pq.min_offset

    def _queue(self, group: str, create: bool):
        name = queue_name(group)
        if create:
            # One decision under the store's lock: appends run on threads, and a check then a create lost to the
            # group's first two dead letters at once (QueueExists killed the second one's chore)
            # Harmless mutants: the 0 left out (the default), and None for False where holds and read call this (falsy).
            return self.store.open_or_create(name, 0)
        return self.store.get(name) if name in self.store else None

    def _append(self, group: str, payloads: list[bytes], ts_ms: int) -> int:
        pq = self._queue(group, True)
        first = pq.append(payloads, ts_ms)
        # Harmless mutant: + for - (a DLQ queue starts at 0 and keeps everything: no retention, so min_offset is 0).
        self.sizes[group] = pq.max_offset - pq.min_offset
        return first

    async def append(self, group: str, entries: list[dict[str, Any]], ts_ms: int) -> None:
        """``entries``: {"topic","queue","origin_offset","attempts","message": stored message bytes, either form}."""
        payloads = [b'{"group":' + json.dumps(group).encode() + b',"topic":' + json.dumps(e["topic"]).encode()
                    + b',"queue":%d,"origin_offset":%d,"attempts":%d,"message":' % (
                        e["queue"], e["origin_offset"], e["attempts"]) + as_json_object(e["message"]) + b"}"
                    for e in entries]
        await asyncio.to_thread(self._append, group, payloads, ts_ms)

    def holds(self, group: str, topic: str, queue: int, origin_offset: int) -> bool:
        """Whether the group's newest DLQ records hold this message (a dead letter half done before a crash)."""
        pq = self._queue(group, False)
        if pq is None:
            return False
        start = max(pq.min_offset, pq.max_offset - DLQ_TAIL_SCAN_MAX)
        # Harmless mutants: >= or an always-true test here, and <= in read's (a read at max_offset is empty).
        for r in pq.read(start, max_records=DLQ_TAIL_SCAN_MAX) if pq.max_offset > start else []:
            v = json.loads(r.payload)
            if (v["topic"], v["queue"], v["origin_offset"]) == (topic, queue, origin_offset):
                return True
        return False

    async def read(self, group: str, offset: int, max_n: int) -> dict[str, Any]:
        pq = self._queue(group, False)
        if pq is None:
            return {"messages": [], "next_offset": 0, "min_offset": 0, "max_offset": 0}
        start = max(offset, pq.min_offset)
        records = []
        if start < pq.max_offset:
            records = await asyncio.to_thread(pq.read, start, max_records=max_n)
        out = []
        for r in records:
            v = json.loads(r.payload)
            m = v["message"]
            item = {"offset": r.offset, "topic": v["topic"], "queue": v["queue"], "origin_offset": v["origin_offset"],
                    "attempts": v["attempts"], "key": m.get("key"), "props": m.get("props", {}), "ts": r.ts_ms}
            item.update({k: m[k] for k in ("body", "body_b64") if k in m})
            out.append(item)
        nxt = out[-1]["offset"] + 1 if out else max(start, min(offset, pq.max_offset))
        return {"messages": out, "next_offset": nxt, "min_offset": pq.min_offset, "max_offset": pq.max_offset}

    def close(self) -> None:
        self.store.close()
