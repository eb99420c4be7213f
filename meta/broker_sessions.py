"""Broker sessions as the leader sees them (KRaft's BrokerHeartbeatManager): in memory, never in the log.

Heartbeats only refresh this table; a decision (fence, unfence, budget) is a command in the log. A node that becomes
leader starts every active broker's session afresh (grace), because it cannot know when the old leader last heard it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

import structlog

from wire.errors import ApiError

from . import allocation, broker_probe
from .config import MetaConfig
from .deciders.lookups import registered_broker
from .image import Image
from .log import Log
from .periodic import run_every
from .reads import ReadFacade

log = structlog.get_logger("meta.sessions")
SESSION_CHECK_INTERVAL_S = 0.25
# A check later than its interval by more than this means the leader itself was not listening (its loop stalled, the
# process paused): heartbeats sent meanwhile wait unread in its sockets, so the stall counts against no broker.
CHECK_STALL_MS = 1_000


class SessionTracker:
    def __init__(self, timeout_ms: int, check_interval_ms: int = int(SESSION_CHECK_INTERVAL_S * 1000)):
        self.timeout_ms = timeout_ms
        self.check_interval_ms = check_interval_ms
        self.checks = 0                               # checks made (a term's first only resets, and is not one)
        self.stalls = 0                               # checks that found the leader had not been listening
        self._last: dict[str, tuple[int, int]] = {}   # broker -> (epoch, monotonic ms of last heartbeat)
        self._wall: dict[str, int] = {}               # broker -> wall ms of last heartbeat (for display)
        self._looked_ms: int | None = None            # monotonic ms the last check ended

    def reset(self, active: Iterable[tuple[str, int]], now_ms: int) -> None:
        self._last = {b: (epoch, now_ms) for b, epoch in active}
        self._wall = {}
        self._looked_ms = now_ms

    def looked(self, now_ms: int) -> None:
        """A check ended at ``now_ms``: the next is due an interval later."""
        self._looked_ms = now_ms

    def heartbeat(self, broker: str, epoch: int, now_ms: int, wall_ms: int) -> None:
        self._last[broker] = (epoch, now_ms)
        self._wall[broker] = wall_ms

    def expired(self, active: Iterable[tuple[str, int]], now_ms: int) -> list[tuple[str, int]]:
        """Active brokers whose current epoch has not been heard from within the timeout, not counting the time
        this node was not listening (a check more than CHECK_STALL_MS late)."""
        self.checks += 1
        late = 0 if self._looked_ms is None else now_ms - self._looked_ms - self.check_interval_ms
        if late > CHECK_STALL_MS:
            self.stalls += 1
            log.warning("broker_sessions_check_stalled", late_ms=late)
            self._last = {b: (epoch, min(at + late, now_ms)) for b, (epoch, at) in self._last.items()}
        out = []
        for broker, epoch in active:
            seen = self._last.get(broker)
            if seen is None:
                self._last[broker] = (epoch, now_ms)  # first sight (e.g. just registered): its session starts now
            elif seen[0] != epoch:
                self._last[broker] = (epoch, now_ms)
            elif now_ms - seen[1] > self.timeout_ms:
                out.append((broker, epoch))
        return out

    def last_heartbeat_ms(self, broker: str) -> int | None:
        return self._wall.get(broker)


class BrokerSessions:
    """The leader's duties towards brokers: heartbeats refresh the tracker above; fencing, unfencing and budget grants
    are commands in the log, decided from the image and proposed here."""

    def __init__(self, config: MetaConfig, reads: ReadFacade, log: Log):
        self.config = config
        self.reads = reads
        self.log = log
        self.tracker = SessionTracker(config.session_timeout_ms)
        self.expiries = 0   # sessions this node fenced for silence while it led
        self.refusals = 0   # brokers this node fenced because their address refused connections
        self._led_term: int | None = None
        self._probes: dict[str, asyncio.Task] = {}   # broker -> the probe of it under way (reports share it)

    def last_heartbeat_ms(self, broker: str) -> int | None:
        return self.tracker.last_heartbeat_ms(broker)

    async def heartbeat(self, broker: str, epoch: int, queues: dict[str, int]) -> dict[str, Any]:
        """Leader only. Refreshes the session, unfences a returning broker, renews offset budgets.

        The budgets in the answer are read from the image after the grant was applied: a broker may use only what
        the log granted (a segment that started sealing meanwhile got nothing, and its old budget stands).
        """
        grant = self.config.offset_budget

        def look(image: Image):
            b = registered_broker(image, broker, epoch)
            grants = []
            for pq, max_offset in queues.items():
                seg = _segment_by_pq(image, pq)
                if seg is not None and seg["broker"] == broker and seg["state"] == "active" \
                        and max_offset + grant // 2 > seg["budget_end"]:
                    topic, q, gen = allocation.parse_physical_queue_name(pq)
                    grants.append({"topic": topic, "queue": q, "gen": gen, "budget_end": max_offset + grant})
            return b["state"], grants
        state, grants = self.reads.read(look)
        copies_version = self.reads.read(lambda im: im.brokers[broker]["copies_version"])
        self.tracker.heartbeat(broker, epoch, _monotonic_ms(), int(time.time() * 1000))
        if state == "fenced":
            answer(await self.log.propose({"type": "UnfenceBroker", "broker": broker, "epoch": epoch}, None,
                                          f"broker:{broker}"))
        if grants:
            answer(await self.log.propose({"type": "GrantOffsetBudget", "broker": broker, "epoch": epoch,
                                           "grants": grants}, None, f"broker:{broker}"))

        def granted(image: Image):
            out = {}
            for pq in queues:
                seg = _segment_by_pq(image, pq)
                if seg is not None and seg["broker"] == broker and seg["state"] != "sealed":
                    out[pq] = seg["budget_end"]
            return image.version, out
        version, budgets = self.reads.read(granted)
        return {"state": "active", "version": version, "budgets": budgets, "budget_grant": grant,
                "heartbeat_interval_ms": self.config.heartbeat_interval_ms,
                "session_timeout_ms": self.config.session_timeout_ms, "copies_version": copies_version}

    async def peer_down(self, reporter: str, epoch: int, peer: str) -> dict[str, Any]:
        """Leader only. ``reporter`` (at its session ``epoch``) could not reach ``peer``: when ``peer``'s address
        refuses connections its process is gone, and it is fenced now rather than when its session runs out
        (meta/broker_probe.py); otherwise nothing changes. Answers ``{"peer", "probe", "state"}``."""
        def look(image: Image):
            registered_broker(image, reporter, epoch)
            p = registered_broker(image, peer)
            return p["state"], p["epoch"], p["address"]
        state, peer_epoch, address = self.reads.read(look)
        if state != "active" or peer == reporter:
            return {"peer": peer, "probe": None, "state": state}
        probe = self._probes.get(peer)
        if probe is None:   # one look at a time per broker, whoever reports it
            probe = self._probes[peer] = asyncio.create_task(broker_probe.probe(address), name=f"probe {peer}")
            probe.add_done_callback(lambda _: self._probes.pop(peer, None))
        seen = await asyncio.shield(probe)
        if seen != broker_probe.REFUSED:
            return {"peer": peer, "probe": seen, "state": state}
        log.warning("broker_refuses_connections", broker=peer, epoch=peer_epoch, reporter=reporter, address=address)
        outcome = await self.log.propose({"type": "FenceBroker", "broker": peer, "epoch": peer_epoch,
                                          "reason": "connection_refused"}, None, "system")
        _, result = answer(outcome)
        if result.get("state") == "fenced":
            self.refusals += 1
        return {"peer": peer, "probe": seen, "state": result.get("state", state)}

    async def run(self) -> None:
        """Fence brokers whose session expired, while this node leads. A task: cancelled on stop."""
        await run_every(SESSION_CHECK_INTERVAL_S, self._check_sessions, "broker_sessions_failed")

    async def _check_sessions(self) -> None:
        if not self.log.is_leader():
            self._led_term = None
            return
        active = self.reads.read(lambda im: [(b, v["epoch"]) for b, v in im.brokers.items() if v["state"] == "active"])
        term = self.log.term()
        if self._led_term != term:
            # A new leader cannot know when the old one last heard each broker: every session starts afresh.
            self._led_term = term
            self.tracker.reset(active, _monotonic_ms())
            return
        try:
            for broker, epoch in self.tracker.expired(active, _monotonic_ms()):
                log.warning("broker_session_expired", broker=broker, epoch=epoch)
                self.expiries += 1   # stator_meta_broker_session_expiries_total (meta/api/metrics.py)
                await self.log.propose({"type": "FenceBroker", "broker": broker, "epoch": epoch,
                                        "reason": "session_expired"}, None, "system")
        finally:
            self.tracker.looked(_monotonic_ms())


def answer(outcome: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The HTTP answer of a command's outcome; a rejection is raised as the ApiError it carries."""
    if outcome.get("ok"):
        return 200, outcome["result"]
    e = outcome["error"]
    raise ApiError(e["message"], e["details"], code=e["code"], status=e["status"])


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _segment_by_pq(image: Image, pq: str) -> dict[str, Any] | None:
    parsed = allocation.parse_physical_queue_name(pq)
    if parsed is None:
        return None
    seg = image.segment(*parsed)
    return seg if seg is not None and seg["physical_queue"] == pq else None
