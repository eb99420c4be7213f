"""``AdminClient``: the meta service's admin and read calls (API.md, meta section), through any meta node.

Every mutation carries an ``Idempotency-Key`` made once per logical call and sent unchanged on every retry, so a retry
after a lost answer returns the first outcome and appends nothing. ``expected_version`` is passed through for optimistic
concurrency (409 ``VERSION_MISMATCH`` -> ``errors.VersionMismatch`` with ``current_version``).

Reads ask for ``min_version`` = the newest metadata version this client has seen on any answer (the ``X-Meta-Version``
of every read and write, and the version a write returned), so whichever node answers, a read never shows state older
than what the client already saw or wrote (DESIGN.md invariant 3): a lagging node waits (bounded, server-side) and one
that has not caught up within its wait answers 503, and the call moves to another node.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp

from wire.errors import VERSION_NOT_REACHED, StatorError
from wire.caller import META_ATTEMPTS_MAX_DEFAULT, META_DEADLINE_S_DEFAULT, REQUEST_TIMEOUT_S_DEFAULT, Backoff, MetaCaller


HISTORY_WAIT_S_DEFAULT = 10.0   # a history long poll; well under the server's READ_WAIT_S_MAX (60 s)


def _seg(name: str) -> str:
    """A path segment; names are validated by the server, quoting only keeps a bad one from changing the path."""
    return quote(str(name), safe="")


def new_idempotency_key() -> str:
    return uuid.uuid4().hex


class AdminClient:
    """Admin and read calls to the meta service through any of ``meta_urls`` (failing over between them)."""

    def __init__(self, meta_urls: Sequence[str] | str, token: str, *, session: aiohttp.ClientSession | None = None,
                 timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT, attempts_max: int = META_ATTEMPTS_MAX_DEFAULT,
                 deadline_s: float = META_DEADLINE_S_DEFAULT, backoff: Backoff | None = None,
                 monotonic_reads: bool = True, ssl_context: ssl.SSLContext | None = None,
                 consistency: str | None = None):
        self.meta = MetaCaller(meta_urls, token, session=session, timeout_s=timeout_s, attempts_max=attempts_max,
                               deadline_s=deadline_s, backoff=backoff, ssl_context=ssl_context)
        self.monotonic_reads = monotonic_reads
        self.consistency = consistency   # of reads that name none; None: the server's default (serializable)

    @property
    def seen_version(self) -> int:
        """The newest metadata version this client has seen (its reads ask for at least this one)."""
        return self.meta.max_version_seen

    # -- plumbing ----------------------------------------------------------------------------------------------
    async def _write(self, method: str, path: str, body: Any = None, *, expected_version: int | None = None,
                     idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or new_idempotency_key()  # once per logical call: every retry below reuses it
        answer = await self.meta.call(method, path, json=body, params={"expected_version": expected_version},
                                      headers={"Idempotency-Key": key})
        # A follower that forwarded the write may answer before it applied it: its header can be older than the write.
        self.meta.note_version(answer.body.get("version") if isinstance(answer.body, dict) else None)
        return answer.body

    async def _read(self, path: str, params: dict[str, Any] | None = None, *,
                    consistency: str | None = None) -> dict[str, Any]:
        q = dict(params or {})
        consistency = consistency or self.consistency
        if consistency is not None:
            q["consistency"] = consistency
        if self.monotonic_reads and self.seen_version > 0:
            q["min_version"] = self.seen_version
        return (await self.meta.call("GET", path, params=q)).body

    # -- topics ------------------------------------------------------------------------------------------------
    async def create_topic(self, topic: str, queues: int, *, brokers: Sequence[str] | None = None,
                           slots: int | None = None, order: str | None = None, config: dict[str, str] | None = None,
                           replicas: int | None = None, min_insync: int | None = None,
                           scope: Sequence[str] | str | None = None, expected_version: int | None = None, idempotency_key: str | None = None) -> dict[str, Any]:
        """``{"topic","queues","replicas","min_insync","version"}``. ``order`` is ``"best_tried"`` (default) or
        ``"strict"``; ``replicas`` (1-5) and ``min_insync`` default to the cluster's (meta config); ``scope`` is
        ``"global"`` (default) or the clusters the queues and their copies stay in."""
        body: dict[str, Any] = {"topic": topic, "queues": queues}
        for k, v in (("brokers", list(brokers) if brokers is not None else None), ("slots", slots),
                     ("order", order), ("config", config), ("replicas", replicas), ("min_insync", min_insync),
                     ("scope", scope if scope is None or isinstance(scope, str) else list(scope))):
            if v is not None:
                body[k] = v
        return await self._write("POST", "/v1/topics", body, expected_version=expected_version,
                                 idempotency_key=idempotency_key)

    async def elect_leaders(self, topic: str, *, queues: Sequence[int] | None = None, unclean: bool = False,
                            expected_version: int | None = None) -> dict[str, Any]:
        """``{"topic","queues":[{"queue","leader","gen","outcome","to"?,"may_lose"?}],"version"}``: leaders for queues
        whose leader is fenced; ``unclean`` elects an out-of-sync copy where no in-sync one is left."""
        body: dict[str, Any] = {"unclean": unclean}
        if queues is not None:
            body["queues"] = list(queues)
        return await self._write("POST", f"/v1/topics/{_seg(topic)}/elect", body, expected_version=expected_version)

    async def describe_topic(self, topic: str, *, consistency: str | None = None) -> dict[str, Any]:
        """The admin view: queues, slots, order, version, config and every logic queue's segment chain."""
        return await self._read(f"/v1/topics/{_seg(topic)}", consistency=consistency)

    async def list_topics(self, *, consistency: str | None = None) -> list[dict[str, Any]]:
        return (await self._read("/v1/topics", consistency=consistency))["topics"]

    async def grow_topic(self, topic: str, queues: int, *, expected_version: int | None = None,
                         idempotency_key: str | None = None) -> dict[str, Any]:
        """Raise the number of logic queues (a static topic only grows)."""
        return await self._write("PATCH", f"/v1/topics/{_seg(topic)}", {"queues": queues},
                                 expected_version=expected_version, idempotency_key=idempotency_key)

    async def set_config(self, topic: str, config: dict[str, str | None], *, expected_version: int | None = None,
                         idempotency_key: str | None = None) -> dict[str, Any]:
        """Merge ``config`` into the topic's config; a ``None`` value removes the key."""
        return await self._write("PUT", f"/v1/topics/{_seg(topic)}/config", dict(config),
                                 expected_version=expected_version, idempotency_key=idempotency_key)

    async def remap(self, topic: str, brokers: Sequence[str], *, queues: Sequence[int] | None = None,
                    expected_version: int | None = None, idempotency_key: str | None = None) -> dict[str, Any]:
        """Move the topic's queues (all, or ``queues``) onto ``brokers``: ``{"version","moved":[...]}``."""
        body: dict[str, Any] = {"brokers": list(brokers)}
        if queues is not None:
            body["queues"] = list(queues)
        return await self._write("POST", f"/v1/topics/{_seg(topic)}/remap", body,
                                 expected_version=expected_version, idempotency_key=idempotency_key)

    async def delete_topic(self, topic: str, *, expected_version: int | None = None,
                           idempotency_key: str | None = None) -> dict[str, Any]:
        return await self._write("DELETE", f"/v1/topics/{_seg(topic)}", expected_version=expected_version,
                                 idempotency_key=idempotency_key)

    # -- consumer groups ---------------------------------------------------------------------------------------
    async def set_group_config(self, group: str, config: dict[str, Any], *, expected_version: int | None = None,
                               idempotency_key: str | None = None) -> dict[str, Any]:
        """Merge ``config`` (``lease_ms``, ``heartbeat_interval_ms``, ``max_attempts``, ``retry_topic``, ``mode``) into
        the group's settings; a ``None`` value goes back to the default. ``{"group","config","version"}``, the
        config with defaults filled in."""
        return await self._write("PUT", f"/v1/groups/{_seg(group)}/config", dict(config),
                                 expected_version=expected_version, idempotency_key=idempotency_key)

    async def list_groups(self, *, consistency: str | None = None) -> list[dict[str, Any]]:
        """``[{"group","mode","members","locks","version"}]``."""
        return (await self._read("/v1/groups", consistency=consistency))["groups"]

    async def describe_group(self, group: str) -> dict[str, Any]:
        """Members, assignments with tokens, lease ends, committed offsets and lag (the leader answers: lease ends
        live in its memory). ``GroupNotFound`` for an unknown group."""
        return await self._read(f"/v1/groups/{_seg(group)}")

    # -- cluster -----------------------------------------------------------------------------------------------
    async def brokers(self) -> list[dict[str, Any]]:
        return (await self._read("/v1/brokers"))["brokers"]

    async def broker(self, broker: str) -> dict[str, Any]:
        """One broker as the list has it, with ``heads``, ``holding`` (heads it holds a copy of: what a drain still
        moves) and ``sealed_copies``."""
        return await self._read(f"/v1/brokers/{quote(broker, safe='')}")

    async def drain_broker(self, broker: str, draining: bool = True,
                           to: Sequence[str] | None = None) -> dict[str, Any]:
        """``{"broker","draining","to","remaining","version"}``: start (or stop) moving the head copies ``broker``
        holds onto others, ``to`` first when named."""
        body: dict[str, Any] = {"draining": draining}
        if to is not None:
            body["to"] = list(to)
        return await self._write("POST", f"/v1/brokers/{quote(broker, safe='')}/drain", body)

    async def cluster(self) -> dict[str, Any]:
        """The answering node's view: node, role, leader, term, commit_index, applied_version, members. Always its
        own state: the view is what tells an operator there is no leader."""
        return await self._read("/v1/cluster", consistency="serializable")

    # -- the meta cluster's members (one change at a time, through the log) -------------------------------------
    async def members(self, consistency: str = "linearizable") -> dict[str, Any]:
        """``{"membership_index","members":[{"node","raft","url","disk","voter"}]}``. Read through the leader by
        default, as etcd's member list is: the next change is decided on it. ``"serializable"`` answers from the
        node's own applied state, which a cluster without a leader still has."""
        return await self._read("/v1/cluster/members", consistency=consistency)

    async def add_member(self, node: str, raft: str, url: str) -> dict[str, Any]:
        """Add meta node ``node`` as a learner; it catches up, then ``promote_member`` makes it a voter."""
        return await self._write("POST", "/v1/cluster/members", {"node": node, "raft": raft, "url": url})

    async def promote_member(self, node: str) -> dict[str, Any]:
        return await self._write("POST", f"/v1/cluster/members/{_seg(node)}/promote")

    async def remove_member(self, node: str) -> dict[str, Any]:
        return await self._write("DELETE", f"/v1/cluster/members/{_seg(node)}")

    async def history(self, *, topic: str | None = None, after: int = 0, limit: int | None = None) -> dict[str, Any]:
        """One page of events after version ``after``: ``{"events":[...],"next_after"}``."""
        return await self._read("/v1/history", {"topic": topic, "after": after, "limit": limit})

    async def history_after(self, after: int, *, topic: str | None = None, limit: int | None = None,
                            wait_s: float = HISTORY_WAIT_S_DEFAULT) -> dict[str, Any]:
        """The next page after ``after``, waiting (on the server, up to ``wait_s``) for a version after it to be
        applied: a long poll of the history. An empty page with ``next_after == after`` when none came in time."""
        q = {"topic": topic, "after": after, "limit": limit, "min_version": after + 1, "wait": wait_s}
        try:
            answer = await self.meta.call("GET", "/v1/history", params=q, timeout_s=wait_s + self.meta.timeout_s,
                                          deadline_s=wait_s + self.meta.deadline_s,
                                          final_codes=frozenset({VERSION_NOT_REACHED}))
        except StatorError as e:
            if e.code != VERSION_NOT_REACHED:
                raise
            return {"events": [], "next_after": after}
        return answer.body

    async def iter_history(self, *, topic: str | None = None, after: int = 0,
                           page: int = 1000) -> AsyncIterator[dict[str, Any]]:
        """Every event after ``after`` up to the version applied when the last page was read.

        A topic-filtered page reads a bounded stretch of events past ``after`` (the server's
        HISTORY_SCAN_EVENTS_MAX), so an empty page whose ``next_after`` moved on means "keep going"; only a
        ``next_after`` that no longer advances marks the end."""
        while True:
            answer = await self.history(topic=topic, after=after, limit=page)
            for e in answer["events"]:
                yield e
            if answer["next_after"] <= after:
                return
            after = answer["next_after"]

    async def route(self, topic: str) -> dict[str, Any]:
        """The topic's route now (API.md "Route"); ``TopicNotFound`` for an unknown topic."""
        return await self._read(f"/v1/routes/{_seg(topic)}")

    async def image(self) -> tuple[dict[str, Any], int, str]:
        """The answering node's whole image: ``(image data, its version, sha256 of its canonical bytes)``."""
        answer = await self.meta.call("GET", "/v1/admin/image", params={"min_version": self.seen_version or None})
        return answer.body, int(answer.headers["X-Image-Version"]), answer.headers["X-Image-Sha256"]

    async def image_digest(self) -> dict[str, Any]:
        """``{"node","version","commands","sha256","bytes"}`` of the answering node's image."""
        return await self._read("/v1/admin/image-digest")

    async def readiness(self) -> dict[str, Any]:
        """``GET /readyz`` of the node this client talks to: its answer whether ready (200) or not (503)."""
        return (await self.meta.call("GET", "/readyz", ok=(200, 503))).body

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def close(self) -> None:
        await self.meta.close()

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
