"""Getting a request to the leader: one retry loop, for command submits and broker heartbeats alike.

On the leader the work runs here; on a follower the raw HTTP request is replayed on the leader (with the same
request id, so a retry after LEADER_CHANGED / UNKNOWN_OUTCOME never applies twice), or, for a command, proposed
here and carried to the leader by the raft transport (``through_log``). An election in between is waited
out until the deadline; a node that becomes the leader while waiting serves the request itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from wire.errors import ApiError, rejection

from . import limits
from .config import MetaConfig
from .log import Log
from .raft.node import ProposeFailed

RETRY_PAUSE_S = 0.05
LEADER_POLL_S = 0.02

Answer = tuple[int, Any, "int | None"]   # (HTTP status, body, X-Meta-Version of the answering node)


class BecameLeader(ProposeFailed):
    """Raised while waiting for a leader to forward to, when that leader turns out to be this node."""


class LeaderForwarder:
    def __init__(self, config: MetaConfig, log: Log):
        """Built inside the running event loop: the HTTP session and its connector belong to it."""
        from wire import tls
        self.config = config
        self.log = log
        ctx = tls.client_context(config.tls) if config.tls is not None else None
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limits.FORWARD_TIMEOUT_S),
                                           connector=tls.connector(ctx))
        self._my_url = next(m.url for m in config.members if m.node == config.node)

    async def stop(self) -> None:
        await self._http.close()

    def http_session(self) -> aiohttp.ClientSession:
        """The node's outgoing HTTP session (also used to ask brokers); callers pass their own timeouts."""
        return self._http

    def leader_url(self) -> str | None:
        address = self.log.leader_address()
        # A member added through the log (meta/raft/roles.py) is in no config: its URL is the membership's.
        return self.log.member_url(address) if address is not None else None

    async def to_leader(self, on_leader: Callable[[float], Awaitable[Answer]],
                        forward: Callable[[str], Awaitable[Answer]]) -> Answer:
        """``on_leader(seconds left)`` when this node leads, else ``forward(leader url)``; retried until
        PROPOSE_TIMEOUT_S. A forwarded answer of NO_LEADER / LEADER_CHANGED means the leader moved: retry."""
        async def attempt(deadline: float) -> Answer:
            if self.log.is_leader():
                return await on_leader(max(0.1, deadline - time.monotonic()))
            answer = await forward(await self._await_leader_url(deadline))
            body = answer[1]
            code = body.get("error", {}).get("code") if isinstance(body, dict) else None
            if answer[0] == 503 and code in ("NO_LEADER", "LEADER_CHANGED"):
                raise ProposeFailed("the leader moved while forwarding", code=code)
            return answer
        return await self._retried(attempt)

    async def through_log(self, propose: Callable[[float], Awaitable[Answer]]) -> Answer:
        """``propose(seconds left)`` on this node, leader or not, retried like ``to_leader``.

        A follower's proposal reaches the leader in the raft transport (pysyncobj's apply_command message, on the
        connection the log already keeps open) instead of a second HTTP request, and resolves once this node has
        applied the entry: the answer is this node's own apply, so the client reads its write here at once."""
        async def attempt(deadline: float) -> Answer:
            # Without a known leader pysyncobj would hold the command in its queue (commandsWaitLeader) until the
            # proposal's own timeout and answer UNKNOWN_OUTCOME; waiting here says NO_LEADER, as to_leader does.
            while not self.log.is_leader() and self.log.leader_address() is None:
                if time.monotonic() > deadline:
                    raise rejection(503, "NO_LEADER", "the meta cluster has no leader right now")
                await asyncio.sleep(LEADER_POLL_S)
            return await propose(max(0.1, deadline - time.monotonic()))
        return await self._retried(attempt)

    async def _retried(self, attempt: Callable[[float], Awaitable[Answer]]) -> Answer:
        deadline = time.monotonic() + limits.PROPOSE_TIMEOUT_S
        while True:
            try:
                return await attempt(deadline)
            except (ProposeFailed, aiohttp.ClientError, asyncio.TimeoutError) as e:
                if time.monotonic() > deadline:
                    if isinstance(e, ApiError) and not isinstance(e, BecameLeader):
                        raise
                    raise rejection(503, "NO_LEADER", f"could not reach the leader: {type(e).__name__}") from None
                await asyncio.sleep(RETRY_PAUSE_S)

    async def _await_leader_url(self, deadline: float) -> str:
        while True:
            url = self.leader_url()
            if url is not None and url != self._my_url:
                return url
            if self.log.is_leader():
                raise BecameLeader("this node became the leader", code="NO_LEADER")  # loop back, serve here
            if time.monotonic() > deadline:
                raise rejection(503, "NO_LEADER", "the meta cluster has no leader right now")
            await asyncio.sleep(LEADER_POLL_S)

    async def http(self, url: str, method: str, path_qs: str, body: bytes, headers: dict[str, str]) -> Answer:
        """Replay one HTTP request on another node."""
        async with self._http.request(method, url + path_qs, data=body, headers=headers) as resp:
            data = await resp.json(content_type=None)
            v = resp.headers.get("X-Meta-Version")
            return resp.status, data, int(v) if v and v.isdigit() else None
