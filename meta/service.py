"""One meta node as a service: the Raft node, and the parts HTTP handlers talk to, started and stopped as one.

- ``log`` (meta/log.py): the Raft node as the parts see it: who leads, proposals, the applied image, the membership;
- ``reads`` (meta/reads.py): the applied image, rendered routes, min_version and linearizable waits;
- ``forwarder`` (meta/forwarder.py): the one retry loop that gets a request to the leader;
- ``brokers`` (meta/broker_sessions.py): the leader's duties towards brokers, decided through the log;
- ``groups`` (meta/group_sessions.py): the leader's duties towards group members: leases, expiry;
- ``projection`` (meta/projection_follower.py): the SQL projection following the applied log.
Handlers (meta/api/) parse and answer; they ask this class and its ``log``, and never touch the pysyncobj object.
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
from .drains import Drainer
from .log import Log
from .projection_follower import ProjectionFollower
from .raft.node import LoopBridge, MetaSyncObj, RaftNode
from .raft.transport import RaftLink
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
    """Built whole inside the running event loop (meta/api/app.py builds it as the app starts), never half: the
    Raft node binds its port as it is built, and the HTTP port is taken first (runtime/serve.py); proposals'
    futures and the forwarder's HTTP session belong to the loop. ``start`` starts threads and tasks, nothing more."""

    def __init__(self, config: MetaConfig, version_waiters: Admission):
        loop = asyncio.get_running_loop()
        ssl_context = client_tls_context(config.tls)   # a bad file fails here, before the raft port is bound
        self.config = config
        self.feed = ChangeFeed()
        self.version_waiters = version_waiters
        bridge = LoopBridge()
        bridge.loop = loop

        def on_applied(version: int, changed: set[str] | None) -> None:  # the tick (on the loop, or its watchdog thread)
            bridge.post(self.feed.publish, version, changed)

        node = MetaSyncObj(config.raft, config.partners, config.data_dir, config.secret, config.raft_tuning,
                           on_applied, bridge, raft_link(config), names={m.raft: m.node for m in config.members},
                           urls={m.node: m.url for m in config.members})
        # The RaftNode before the node starts: it gives the node the leader's stamp for commands followers forward.
        self.log = Log(node, RaftNode(node, loop, config.offset_budget, config.history_window))
        # The restored image's version, before any reader or the route warmer starts: waiters start from it, and the
        # change log reaches back no further (a watch stream asking for an older version gets a full scan).
        self.feed.publish(self.log.data_version(), None)
        self.reads = ReadFacade(self.log, self.feed, self.version_waiters)
        self._assemble(GroupSessions(self.reads, self.log), ssl_context)
        self._driven = False

    @classmethod
    def around(cls, config: MetaConfig, version_waiters: Admission, feed: ChangeFeed, log: Log, reads: ReadFacade,
               groups: GroupSessions) -> MetaService:
        """A service around a log its caller built and drives (the simulator's meta nodes, ops/sim/node.py, whose
        raft steps and applies run on its scheduler): ``start`` and ``stop`` leave the node's threads alone."""
        svc = cls.__new__(cls)
        svc.config, svc.feed, svc.version_waiters, svc.log, svc.reads = config, feed, version_waiters, log, reads
        svc._assemble(groups, client_tls_context(config.tls))
        svc._driven = True
        return svc

    def _assemble(self, groups: GroupSessions, ssl_context: Any) -> None:
        config = self.config
        self.forwarder = LeaderForwarder(config, self.log)
        self.brokers = BrokerSessions(config, self.reads, self.log)
        self.groups = groups
        self.drains = Drainer(self.reads, self.log)
        self.route_warmer = RouteWarmer(self.reads, self.feed, self.log.is_ready)
        peers = [m.url for m in config.members if m.node != config.node]
        self.projection = ProjectionFollower(config.projection_url, node=config.node, log_level=config.log_level,
                                             feed=self.feed, read=self.reads.read, peers=peers,
                                             token=config.tokens.client, ssl_context=ssl_context)
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
        if not self._driven:
            self.log.start()
        set_position_provider(lambda: {"term": self.log.term(), "version": self.log.data_version()})
        self._tasks = [asyncio.create_task(self.brokers.run(), name="broker-sessions"),
                       asyncio.create_task(self.groups.run(), name="group-leases"),
                       asyncio.create_task(self.drains.run(), name="drains"),
                       asyncio.create_task(self.route_warmer.run(), name="route-warmer")]
        if not self._driven:   # the SQL projection runs a writer process: outside the simulator
            self._tasks.append(asyncio.create_task(self.projection.run(), name="projection"))
        for task in self._tasks:
            task.add_done_callback(_log_if_failed)
        log.info("meta_started", node=self.config.node, raft=self.config.raft)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.feed.close()
        await self.forwarder.stop()
        if not self._driven:
            await asyncio.get_running_loop().run_in_executor(None, self.log.stop)
        self.projection.close()

    # -- state, for handlers and the projection -----------------------------------------------------------------
    def read(self, fn):
        return self.reads.read(fn)

    @property
    def applied_version(self) -> int:
        return self.reads.applied_version

    def is_leader(self) -> bool:
        return self.log.is_leader()

    def leader(self) -> Member | None:
        address = self.log.leader_address()
        if address is None:
            return None
        member = self.config.member_by_raft(address)
        if member is not None:
            return member
        # A member added through the log (meta/raft/roles.py): in no config, named by the membership.
        return Member(self.log.member_name(address), address, self.log.member_url(address) or "")

    def term(self) -> int:
        return self.log.term()

    def commit_index(self) -> int:
        return self.log.commit_index()

    def role(self) -> str:
        if self.log.is_leader():
            return "leader"
        return "follower" if self.log.leader_address() else "candidate"

    def ready(self) -> bool:
        # Routes warm too: a node that started serves its routes as fast as its peers from its first ready answer
        return (self.log.is_ready() and self.log.leader_address() is not None and not self.log.removed
                and self.route_warmer.ready())

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
            status, body = answer(await self.log.propose(cmd, rid, actor, left_s))
            return status, body, None

        status, body, _ = await self.forwarder.through_log(propose)
        return status, body


def _log_if_failed(task: asyncio.Task) -> None:
    # Each of these runs for the node's life: one that ends with an exception has stopped doing its job, and
    # asyncio would say so only when the task is collected, if ever.
    if not task.cancelled() and task.exception() is not None:
        log.error("background_task_failed", task=task.get_name(), exc_info=task.exception())
