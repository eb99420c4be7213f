"""One meta node as a service: the Raft node, leader duties (sessions, budgets), forwarding, reads with barriers.

HTTP handlers (meta/api/) parse and answer; everything they ask of the node goes through this class.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import aiohttp
import structlog

from . import limits
from .changefeed import ChangeFeed
from .commands import validate
from .config import MetaConfig
from client.wire.errors import ApiError, invalid, rejection
from .image import Image
from client.wire.params import nonneg_int, seconds
from .projection_follower import ProjectionFollower
from .route_cache import RouteCache
from .raft_node import LoopBridge, MetaSyncObj, ProposeFailed, RaftNode
from .sessions import SessionTracker
from . import allocation, views
from ops.logging import set_position_provider

log = structlog.get_logger("meta.service")

SESSION_CHECK_INTERVAL_S = 0.25


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class MetaService:
    def __init__(self, config: MetaConfig):
        self.config = config
        self.feed = ChangeFeed()
        self.sessions = SessionTracker(config.session_timeout_ms)
        self.sync: MetaSyncObj | None = None
        self.raft: RaftNode | None = None
        self.projection = ProjectionFollower(config.projection_url, self)
        self._http: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task] = []
        self._led_term: int | None = None
        self._route_cache = RouteCache(limits.ROUTE_CACHE_BYTES_MAX)
        self.started_at = time.time()
        self._request_prefix = f"{config.node}.{uuid.uuid4().hex[:12]}."
        self._request_seq = 0
        self._leaderless_since: float | None = None

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
                                self.config.raft_tuning, on_applied, bridge)
        self.sync.start()
        set_position_provider(lambda: {"term": self.sync.term(), "version": self.sync.image_data["version"]})
        self.raft = RaftNode(self.sync, loop, self.config.offset_budget)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limits.FORWARD_TIMEOUT_S))
        self._tasks = [asyncio.create_task(self._leader_duties(), name="leader-duties"),
                       asyncio.create_task(self.projection.run(), name="projection")]
        log.info("meta_started", node=self.config.node, raft=self.config.raft)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.feed.close()
        if self._http is not None:
            await self._http.close()
        if self.sync is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.sync.stop)
        self.projection.close()

    # -- state -------------------------------------------------------------------------------------------------
    @property
    def image(self) -> Image:
        return self.sync.current_image()

    @property
    def applied_version(self) -> int:
        return self.image.version

    def read(self, fn):
        """Run ``fn(image)`` under the image lock so it never sees half of an applied command."""
        with self.sync.image_lock:
            return fn(self.image)

    def leader_url(self) -> str | None:
        m = self.config.member_by_raft(self.sync.leader_address())
        return m.url if m else None

    def role(self) -> str:
        if self.sync.is_leader():
            return "leader"
        return "follower" if self.sync.leader_address() else "candidate"

    def follows_log(self) -> bool:
        """Whether this node follows a leader closely enough to serve watch streams (see api/watch.py)."""
        now = time.monotonic()
        if self.sync.leader_address() is None:
            if self._leaderless_since is None:
                self._leaderless_since = now
            return now - self._leaderless_since < limits.WATCH_LEADERLESS_S_MAX
        self._leaderless_since = None
        return self.sync.commit_lag() <= limits.WATCH_LAG_ENTRIES_MAX

    def ready(self) -> bool:
        return self.sync.isReady() and self.sync.leader_address() is not None

    def route_bytes(self, topic: str) -> tuple[int, bytes] | None:
        """The topic's route as JSON, rendered once per version and shared by every subscriber."""
        def render(image: Image):
            t = image.topic(topic)
            if t is None:
                self._route_cache.drop(topic)
                return None
            body = self._route_cache.get(topic, t["version"])
            if body is None:
                body = json.dumps(views.route(image, t), separators=(",", ":")).encode()
                self._route_cache.put(topic, t["version"], body)
            return t["version"], body
        return self.read(render)

    # -- reads -------------------------------------------------------------------------------------------------
    async def before_read(self, query: dict[str, str]) -> None:
        """``min_version`` waits (bounded) for this node to apply V; ``consistency=linearizable`` goes through the log."""
        wait_s = seconds(query.get("wait"), "wait", limits.READ_WAIT_S_DEFAULT, limits.READ_WAIT_S_MAX)
        if query.get("consistency") == "linearizable":
            await self._barrier(wait_s)
        elif query.get("consistency") not in (None, "", "serializable"):
            raise invalid("consistency must be 'linearizable' or 'serializable'")
        if query.get("min_version") is not None:
            v = nonneg_int(query["min_version"], "min_version")
            if not await self.feed.wait_version(v, wait_s):
                raise rejection(503, "VERSION_NOT_REACHED", f"this node has applied {self.applied_version}, not {v}, "
                                f"within {wait_s} s", applied_version=self.applied_version, min_version=v)

    async def _barrier(self, timeout_s: float) -> None:
        # A no-op command through the log: once it is applied here, every write acknowledged before the read is too.
        # A follower submits it through pysyncobj's own forwarding; the callback fires when this node applies it.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await self.raft.propose({"type": "Barrier"}, None, "system", max(0.1, deadline - time.monotonic()))
                return
            except ProposeFailed:
                if time.monotonic() > deadline:
                    raise rejection(503, "NO_LEADER", "no leader to confirm a linearizable read") from None
                await asyncio.sleep(0.05)

    # -- writes ------------------------------------------------------------------------------------------------
    async def submit(self, cmd: dict[str, Any], *, actor: str, idempotency_key: str | None,
                     request_id: str | None, forward) -> tuple[int, dict[str, Any]]:
        """Validate, then propose on the leader or forward the raw request to it. Returns (status, body).

        ``forward(url, request_id)`` replays the HTTP request on another node and returns (status, body, version).
        Retries after LEADER_CHANGED / UNKNOWN_OUTCOME reuse the request id, so nothing applies twice.
        """
        validate(cmd)
        if idempotency_key is not None:
            if not idempotency_key or len(idempotency_key) > limits.REQUEST_ID_CHARS_MAX:
                raise invalid(f"Idempotency-Key must be 1-{limits.REQUEST_ID_CHARS_MAX} characters")
            rid = f"{actor}:key:{idempotency_key}"
        else:
            # Without a key the request still gets an id, passed on when forwarding (X-Request-Id), so the retries of
            # this node, and a proposal here after it became leader itself, can never apply twice.
            request_id = request_id or self._next_request_id()
            if len(request_id) > limits.REQUEST_ID_CHARS_MAX:
                raise invalid(f"X-Request-Id must be at most {limits.REQUEST_ID_CHARS_MAX} characters")
            rid = f"{actor}:rid:{request_id}"
        deadline = time.monotonic() + limits.PROPOSE_TIMEOUT_S
        while True:
            try:
                if self.sync.is_leader():
                    outcome = await self.raft.propose(cmd, rid, actor, max(0.1, deadline - time.monotonic()))
                    return _answer(outcome)
                url = await self._await_leader_url(deadline)
                status, body, version = await forward(url, request_id)
                code = body.get("error", {}).get("code") if isinstance(body, dict) else None
                if status == 503 and code in ("NO_LEADER", "LEADER_CHANGED"):
                    raise ProposeFailed("the leader moved while forwarding", code=code)
                if version is not None:
                    await self.feed.wait_version(version, 1.0)  # read-your-writes on the node the client talks to
                return status, body
            except (ProposeFailed, aiohttp.ClientError, asyncio.TimeoutError) as e:
                if time.monotonic() > deadline:
                    if isinstance(e, ApiError):
                        raise
                    raise rejection(503, "NO_LEADER", f"could not reach the leader: {type(e).__name__}") from None
                await asyncio.sleep(0.05)

    async def _await_leader_url(self, deadline: float) -> str:
        while True:
            url = self.leader_url()
            if url is not None and url != self._my_url():
                return url
            if self.sync.is_leader():
                raise BecameLeader("this node became the leader", code="NO_LEADER")  # loop back, propose locally
            if time.monotonic() > deadline:
                raise rejection(503, "NO_LEADER", "the meta cluster has no leader right now")
            await asyncio.sleep(0.02)

    def _my_url(self) -> str:
        return next(m.url for m in self.config.members if m.node == self.config.node)

    async def forward_to_leader(self, method: str, path_qs: str, body: bytes,
                                headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Replay a request on the leader, waiting out an election; 503 NO_LEADER when none comes in time.

        Only for calls that are safe to repeat (heartbeats): commands go through ``submit`` with a request id.
        """
        deadline = time.monotonic() + limits.PROPOSE_TIMEOUT_S
        while True:
            try:
                url = await self._await_leader_url(deadline)
                status, data, _ = await self.forward_http(url, method, path_qs, body, headers)
                code = data.get("error", {}).get("code") if isinstance(data, dict) else None
                if status == 503 and code in ("NO_LEADER", "LEADER_CHANGED"):
                    raise ProposeFailed("the leader moved while forwarding", code=code)
                return status, data
            except BecameLeader:
                raise
            except (ProposeFailed, aiohttp.ClientError, asyncio.TimeoutError) as e:
                if time.monotonic() > deadline:
                    raise rejection(503, "NO_LEADER", f"could not reach the leader: {type(e).__name__}") from None
                await asyncio.sleep(0.05)

    async def forward_http(self, url: str, method: str, path_qs: str, body: bytes,
                           headers: dict[str, str]) -> tuple[int, dict[str, Any], int | None]:
        async with self._http.request(method, url + path_qs, data=body, headers=headers) as resp:
            data = await resp.json(content_type=None)
            v = resp.headers.get("X-Meta-Version")
            return resp.status, data, int(v) if v and v.isdigit() else None

    # -- broker sessions (leader duties) -----------------------------------------------------------------------
    async def heartbeat(self, broker: str, epoch: int, queues: dict[str, int]) -> dict[str, Any]:
        """Leader only. Refreshes the session, unfences a returning broker, renews offset budgets.

        The budgets in the answer are read from the image after the grant was applied: a broker may use only what
        the log granted (a segment that started sealing meanwhile got nothing, and its old budget stands).
        """
        grant = self.config.offset_budget

        def look(image: Image):
            b = image.brokers.get(broker)
            if b is None:
                raise rejection(404, "BROKER_NOT_FOUND", f"broker {broker!r} is not registered; register first")
            if b["epoch"] != epoch:
                raise rejection(409, "STALE_EPOCH", f"epoch {epoch} is not current ({b['epoch']}); register again",
                                epoch=b["epoch"])
            grants = []
            for pq, max_offset in queues.items():
                seg = _segment_by_pq(image, pq)
                if seg is not None and seg["broker"] == broker and seg["state"] == "active" \
                        and max_offset + grant // 2 > seg["budget_end"]:
                    topic, q, gen = allocation.parse_physical_queue_name(pq)
                    grants.append({"topic": topic, "queue": q, "gen": gen, "budget_end": max_offset + grant})
            return b["state"], grants
        state, grants = self.read(look)
        self.sessions.heartbeat(broker, epoch, _monotonic_ms(), int(time.time() * 1000))
        if state == "fenced":
            _answer(await self.raft.propose({"type": "UnfenceBroker", "broker": broker, "epoch": epoch}, None,
                                            f"broker:{broker}"))
        if grants:
            _answer(await self.raft.propose({"type": "GrantOffsetBudget", "broker": broker, "epoch": epoch,
                                             "grants": grants}, None, f"broker:{broker}"))

        def granted(image: Image):
            out = {}
            for pq in queues:
                seg = _segment_by_pq(image, pq)
                if seg is not None and seg["broker"] == broker and seg["state"] != "sealed":
                    out[pq] = seg["budget_end"]
            return image.version, out
        version, budgets = self.read(granted)
        return {"state": "active", "version": version, "budgets": budgets, "budget_grant": grant,
                "heartbeat_interval_ms": self.config.heartbeat_interval_ms,
                "session_timeout_ms": self.config.session_timeout_ms}

    async def _leader_duties(self) -> None:
        while True:
            await asyncio.sleep(SESSION_CHECK_INTERVAL_S)
            try:
                if not self.sync.is_leader():
                    self._led_term = None
                    continue
                active = self.read(lambda im: [(b, v["epoch"]) for b, v in im.brokers.items()
                                               if v["state"] == "active"])
                term = self.sync.term()
                if self._led_term != term:
                    self._led_term = term
                    self.sessions.reset(active, _monotonic_ms())
                    continue
                for broker, epoch in self.sessions.expired(active, _monotonic_ms()):
                    log.warning("broker_session_expired", broker=broker, epoch=epoch)
                    await self.raft.propose({"type": "FenceBroker", "broker": broker, "epoch": epoch,
                                             "reason": "session_expired"}, None, "system")
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader_duties_failed")


class BecameLeader(ProposeFailed):
    """Raised while waiting for a leader to forward to, when that leader turns out to be this node."""


def _answer(outcome: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    if outcome.get("ok"):
        return 200, outcome["result"]
    e = outcome["error"]
    raise ApiError(e["message"], e["details"], code=e["code"], status=e["status"])


def _segment_by_pq(image: Image, pq: str) -> dict[str, Any] | None:
    parsed = allocation.parse_physical_queue_name(pq)
    if parsed is None:
        return None
    seg = image.segment(*parsed)
    return seg if seg is not None and seg["physical_queue"] == pq else None
