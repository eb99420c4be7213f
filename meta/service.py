"""One meta node as a service: the Raft node, and the parts HTTP handlers talk to, started and stopped as one.

- ``reads`` (meta/reads.py): the applied image, rendered routes, min_version and linearizable waits;
- ``forwarder`` (meta/forwarder.py): the one retry loop that gets a request to the leader;
- ``brokers`` (meta/broker_sessions.py): the leader's duties towards brokers, decided through the log;
- ``groups`` (meta/group_sessions.py): the leader's duties towards group members: leases, expiry;
- ``projection`` (meta/projection_follower.py): the SQL projection following the applied log.
Handlers (meta/api/) parse and answer; they ask this class and never touch the pysyncobj object.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import structlog

from wire.errors import invalid

from . import limits
from .admission import Admission
from .broker_sessions import BrokerSessions, answer
from .changefeed import ChangeFeed
from .commands import validate
from .config import Member, MetaConfig
from .forwarder import Answer, LeaderForwarder
from .group_sessions import GroupSessions
from .projection_follower import ProjectionFollower
from .raft_node import LoopBridge, MetaSyncObj, RaftNode
from .raft_transport import RaftLink
from .reads import ReadFacade
from .route_warmer import RouteWarmer
from runtime.logging import set_position_provider

log = structlog.get_logger("meta.service")


def client_tls_context(files):
    """The context for this node's calls to other nodes over https:// (None for plain HTTP)."""
    from wire.tls import client_context
    return client_context(files) if files is not None else None


def raft_link(config: MetaConfig) -> RaftLink:
    """Mutual TLS on the raft port when the node's TLS has a CA to verify its peers by (the cluster's CA), as every
    HTTP listener then requires client certificates; else the cluster secret alone authenticates and encrypts."""
    tls = config.tls
    if tls is not None and tls.ca:
        log.info("raft_tls", mode="mutual", ca=tls.ca)
        return RaftLink.with_tls(config.secret, tls.cert, tls.key, tls.ca)
    if tls is not None:
        log.warning("raft_tls", mode="off", why="tls has no ca: peers' certificates cannot be verified; frames are "
                                                 "still authenticated and encrypted under the cluster secret")
    return RaftLink(secret=config.secret)


class MetaService:
    def __init__(self, config: MetaConfig, version_waiters: Admission):
        self.config = config
        self.feed = ChangeFeed()
        self.version_waiters = version_waiters
        self.sync: MetaSyncObj | None = None
        self.raft: RaftNode | None = None
        self.reads: ReadFacade | None = None
        self.forwarder: LeaderForwarder | None = None
        self.brokers: BrokerSessions | None = None
        self.groups: GroupSessions | None = None
        self.route_warmer: RouteWarmer | None = None
        peers = [m.url for m in config.members if m.node != config.node]
        self.projection = ProjectionFollower(config.projection_url, node=config.node, log_level=config.log_level,
                                             feed=self.feed, read=self.read, peers=peers, token=config.tokens.client,
                                             ssl_context=client_tls_context(config.tls))
        self._tasks: list[asyncio.Task] = []
        self.started_at = time.time()
        self._request_prefix = f"{config.node}.{uuid.uuid4().hex[:12]}."
        self._request_seq = 0

    def _next_request_id(self) -> str:
        # Unique across nodes and restarts without a syscall per request (uuid4 reads os.urandom).
        self._request_seq += 1
        return f"{self._request_prefix}{self._request_seq}"

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        bridge = LoopBridge()
        bridge.loop = loop

        def on_applied(version: int, changed: set[str] | None) -> None:  # tick thread
            bridge.post(self.feed.publish, version, changed)

        self.sync = MetaSyncObj(self.config.raft, self.config.partners, self.config.data_dir, self.config.secret,
                                self.config.raft_tuning, on_applied, bridge, raft_link(self.config),
                                names={m.raft: m.node for m in self.config.members},
                                urls={m.node: m.url for m in self.config.members})
        # The restored image's version, before any reader or the route warmer starts: waiters start from it, and the
        # change log reaches back no further (a watch stream asking for an older version gets a full scan).
        self.feed.publish(self.sync.image_data["version"], None)
        # The RaftNode first: it gives the node the leader's stamp for commands forwarded by followers.
        self.raft = RaftNode(self.sync, loop, self.config.offset_budget, self.config.history_window)
        self.sync.start()
        set_position_provider(lambda: {"term": self.sync.term(), "version": self.sync.image_data["version"]})
        self.reads = ReadFacade(self.sync, self.raft, self.feed, self.version_waiters)
        self.forwarder = LeaderForwarder(self.config, self.sync)
        await self.forwarder.start()
        self.brokers = BrokerSessions(self.config, self.reads, self.raft, self.sync)
        self.groups = GroupSessions(self.reads, self.raft, self.sync)
        self.route_warmer = RouteWarmer(self.reads, self.feed)
        self._tasks = [asyncio.create_task(self.brokers.run(), name="broker-sessions"),
                       asyncio.create_task(self.groups.run(), name="group-leases"),
                       asyncio.create_task(self.projection.run(), name="projection"),
                       asyncio.create_task(self.route_warmer.run(), name="route-warmer")]
        log.info("meta_started", node=self.config.node, raft=self.config.raft)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.feed.close()
        if self.forwarder is not None:
            await self.forwarder.stop()
        if self.sync is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.sync.stop)
        self.projection.close()

    # -- state, for handlers and the projection -----------------------------------------------------------------
    def read(self, fn):
        return self.reads.read(fn)

    @property
    def applied_version(self) -> int:
        return self.reads.applied_version

    def is_leader(self) -> bool:
        return self.sync.is_leader()

    def leader(self) -> Member | None:
        address = self.sync.leader_address()
        if address is None:
            return None
        member = self.config.member_by_raft(address)
        if member is not None:
            return member
        # A member added through the log (meta/raft_roles.py): in no config, named by the membership.
        roles = self.sync.roles
        return Member(roles.name_of(address), address, roles.url_of(address) or "")

    def term(self) -> int:
        return self.sync.term()

    def commit_index(self) -> int:
        return self.sync.raftCommitIndex

    def role(self) -> str:
        if self.sync.is_leader():
            return "leader"
        return "follower" if self.sync.leader_address() else "candidate"

    def ready(self) -> bool:
        return self.sync.isReady() and self.sync.leader_address() is not None and not self.sync.roles.removed

    # -- writes ------------------------------------------------------------------------------------------------
    async def submit(self, cmd: dict[str, Any], *, actor: str, idempotency_key: str | None,
                     request_id: str | None) -> tuple[int, Any]:
        """Validate, then propose through the log from this node, leader or not. Returns (status, body).

        A follower's proposal travels to the leader in the raft transport and is answered by this node's own apply
        (read-your-writes here). Retries after LEADER_CHANGED / UNKNOWN_OUTCOME reuse the request id, so nothing
        applies twice.
        """
        validate(cmd)
        if idempotency_key is not None:
            rid = f"{actor}:key:{idempotency_key}"
        else:
            # Without a key the request still gets an id, so the retries of this node can never apply twice.
            request_id = request_id or self._next_request_id()
            rid = f"{actor}:rid:{request_id}"
        if len(rid) > 2 * limits.REQUEST_ID_CHARS_MAX:
            raise invalid(f"request ids are at most {limits.REQUEST_ID_CHARS_MAX} characters")

        async def propose(left_s: float) -> Answer:
            status, body = answer(await self.raft.propose(cmd, rid, actor, left_s))
            return status, body, None

        status, body, _ = await self.forwarder.through_log(propose)
        return status, body
