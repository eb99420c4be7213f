"""Everything a broker says to and hears from meta: registration, heartbeats, the watch stream, seal reports.

The session itself (epoch, budgets, whether writes are allowed) lives in broker/session.py, shared with the writer.
The watch stream is read with the client's bounded SSE parser (one parser for every reader of meta's streams); its
ids are safe resume points (meta/api/watch.py), so reconnecting with ``after=<route version>`` misses nothing.
A route that cannot be applied is logged and fetched again on its own; it never stops the broker from following
every other topic.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import structlog
from prometheus_client import Counter

from wire.caller import Answer, Backoff, auth_headers, new_session, request_once
from wire.sse import SseEvent, SseParser
from wire.errors import ApiError, StatorError
from wire.waits import wait_set

from .chores import Chores
from .locks import LockTable
from .pop.settings import GroupSettings
from .routing import RouteTable, Segment, segment_of
from .session import MetaSession
from .writes import Writer

log = structlog.get_logger("broker.meta")

REQUEST_TIMEOUT_S = 5.0
ANY_STATUS = range(100, 600)     # every answer comes back to the link, which reads its status and code itself
RETRY_BACKOFF_S = 0.05           # the first pause of a failed heartbeat or watch; it doubles up to RETRY_BACKOFF_MAX_S
RETRY_BACKOFF_MAX_S = 2.0
REFETCH_RETRY_S = 0.2            # the first pause of a failed route fetch; it doubles up to REFETCH_RETRY_S_MAX
REFETCH_RETRY_S_MAX = 30.0
SEAL_RETRY_S = 0.2               # the first pause after a failed seal report; it doubles up to SEAL_RETRY_S_MAX
SEAL_RETRY_S_MAX = 5.0
SEALS_PER_REPORT_MAX = 512       # within meta's SEALS_PER_REPORT_MAX (1,024)
SEAL_SETTLED_CODES = ("ALREADY_SEALED", "SEGMENT_NOT_FOUND", "TOPIC_NOT_FOUND")  # nothing more to report
WATCH_READ_TIMEOUT_S = 60.0      # four of meta's 15 s keepalives: a silent stream is dead
PEER_DOWN_EVERY_S = 0.25         # a peer this broker cannot reach is reported at most this often
REFETCHES_MAX = 1_024            # topics whose route is being fetched again after a failed event


# The pauses of the link's retry loops (wire/caller.py Backoff; the n-th pause after n failures in a row). The
# heartbeat's, the refetch's and the seal report's double exactly; the watch's waits between its pause and twice it
# (equal jitter's range is half its ceiling to all of it, so its base and cap are twice the heartbeat's).
HEARTBEAT_BACKOFF = Backoff(RETRY_BACKOFF_S, RETRY_BACKOFF_MAX_S, jitter=False)
WATCH_BACKOFF = Backoff(2 * RETRY_BACKOFF_S, 2 * RETRY_BACKOFF_MAX_S)
REFETCH_BACKOFF = Backoff(REFETCH_RETRY_S, REFETCH_RETRY_S_MAX, jitter=False)
SEAL_BACKOFF = Backoff(SEAL_RETRY_S, SEAL_RETRY_S_MAX, jitter=False)


class MetaLink:
    def __init__(self, broker: str, address: str, zone: str | None, meta_urls: tuple[str, ...], token: str,
                 routes: RouteTable, session: MetaSession, writer: Writer, heartbeats: Counter, locks: LockTable,
                 group_settings: GroupSettings | None = None, ssl_context: Any = None, cluster: str | None = None,
                 *, disk: str):
        self._ssl_context = ssl_context   # meta's https:// URLs (wire/tls.py)
        self.broker = broker
        self.address = address
        self.zone = zone
        self.cluster = cluster
        self.disk = disk   # the data directory's id (wire/disk_identity.py): meta tells a restart from a lost disk
        self.meta_urls = list(meta_urls)
        self.routes = routes
        self.session = session
        self.writer = writer
        self.locks = locks
        self.group_settings = group_settings
        self._token = token
        self.route_changed = asyncio.Event()
        # what else follows each route applied (the node sets it: replication of this broker's copies)
        self.on_route_applied: Callable[[str], None] = lambda topic: None
        # ... and each topic deleted (the node sets it: what pop keeps of the topic's queues goes)
        self.on_route_deleted: Callable[[str], None] = lambda topic: None
        # told after each registration (the node sets it: the sealed copies this broker must catch up)
        self.on_registered: Callable[[], None] = lambda: None
        # A sealed copy was placed here (the heartbeat's copies_version grew): the node lists them again
        self.on_copies_placed: Callable[[], None] = lambda: None
        self._copies_version = 0
        self._heartbeats = heartbeats
        self._to_seal: dict[str, Segment] = {}   # physical queue -> a sealing segment whose end meta has not recorded
        self._seal_wanted = asyncio.Event()
        self._refetching: dict[str, asyncio.Task] = {}
        self._chores = Chores("broker_chore_failed")
        self._http: aiohttp.ClientSession | None = None
        self._beat_http: aiohttp.ClientSession | None = None  # its own connections: never queued behind others
        self._tasks: list[asyncio.Task] = []
        self._meta_i = 0
        self._peer_down_at: dict[str, float] = {}   # peer -> monotonic time it was last reported

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._http = new_session(self._ssl_context)        # each request states its own timeout
        self._beat_http = new_session(self._ssl_context)
        self._tasks = [asyncio.create_task(self._heartbeat_loop(), name="heartbeats"),
                       asyncio.create_task(self._watch_loop(), name="watch"),
                       asyncio.create_task(self._seal_loop(), name="seal-reports")]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._refetching.values(), *self._chores.running()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for http in (self._http, self._beat_http):
            if http is not None:
                await http.close()

    def _meta(self) -> str:
        return self.meta_urls[self._meta_i % len(self.meta_urls)]

    def _next_meta(self) -> None:
        self._meta_i += 1

    async def _call(self, method: str, path: str, body: dict | None = None,
                    http: aiohttp.ClientSession | None = None) -> Answer:
        """One request to the meta node the link talks to now (wire/caller.py ``request_once``), bounded by
        REQUEST_TIMEOUT_S; any status is returned, no answer raises ``Unavailable``."""
        return await request_once(http or self._http, method, self._meta() + path, token=self._token, json=body,
                                  timeout_s=REQUEST_TIMEOUT_S, ok=ANY_STATUS)

    # -- session -----------------------------------------------------------------------------------------------
    async def _register(self) -> None:
        answer = await self._call("PUT", f"/v1/brokers/{self.broker}",
                                  {"address": self.address, "zone": self.zone, "cluster": self.cluster,
                                   "disk": self.disk},
                                  self._beat_http)
        status, body = answer.status, answer.body
        if status != 200:
            raise RuntimeError(f"registration refused: {status} {body}")
        s = self.session
        s.epoch, s.state, s.last_ack_sent = body["epoch"], "active", time.monotonic()
        s.routes_needed = max(s.routes_needed, body["version"])
        log.info("broker_registered", epoch=s.epoch, routes_needed=s.routes_needed)
        self.on_registered()

    async def sealed_copies(self, after: str | None) -> dict[str, Any]:
        """One page of the sealed segments this broker holds copies of (GET /v1/brokers/{b}/copies)."""
        path = f"/v1/brokers/{self.broker}/copies" + ("" if after is None else f"?after={quote(after)}")
        answer = await self._call("GET", path)
        if answer.status != 200:
            self._next_meta()
            raise RuntimeError(f"sealed copies refused: {answer.status} {str(answer.body)[:300]}")
        return answer.body

    async def copies_held(self, copies: list[dict[str, Any]]) -> None:
        """Tell meta this broker holds these sealed copies whole (POST /v1/brokers/{b}/copies-held); a refusal is
        logged: the next listing (a registration, another copy placed here) tells it again."""
        answer = await self._call("POST", f"/v1/brokers/{self.broker}/copies-held",
                                  {"epoch": self.session.epoch, "copies": copies})
        if answer.status != 200:
            log.info("copies_held_refused", status=answer.status, body=str(answer.body)[:300])

    async def _heartbeat(self) -> None:
        s = self.session
        if s.epoch is None:
            await self._register()
        sent = time.monotonic()
        was_active = s.active()
        queues = self.writer.next_offsets(self.routes.live_hosted())
        self._heartbeats.inc()
        answer = await self._call("POST", f"/v1/brokers/{self.broker}/heartbeat", {"epoch": s.epoch, "queues": queues},
                                  self._beat_http)
        status, body = answer.status, answer.body
        code = body.get("error", {}).get("code") if isinstance(body, dict) else None
        if status == 200:
            if not was_active:
                # Meta may have fenced and sealed while this session lapsed: write only with routes that new.
                s.routes_needed = max(s.routes_needed, body["version"])
            s.state = body["state"]
            s.last_ack_sent = sent
            s.budgets.update(body.get("budgets", {}))
            s.budget_grant = body.get("budget_grant", s.budget_grant)
            s.session_timeout_ms = body.get("session_timeout_ms", s.session_timeout_ms)
            s.heartbeat_interval_ms = body.get("heartbeat_interval_ms", s.heartbeat_interval_ms)
            if body.get("copies_version", 0) > self._copies_version:
                self._copies_version = body["copies_version"]
                self.on_copies_placed()
        elif code in ("STALE_EPOCH", "BROKER_NOT_FOUND"):
            s.epoch = None  # register again with a new epoch on the next beat
            s.beat_soon()
        else:
            raise RuntimeError(f"heartbeat refused: {status} {code}")

    async def _heartbeat_loop(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await self._heartbeat()
                failures = 0
                # The interval runs from send to send, as meta measures the session: an answer slow in coming (a
                # loaded leader, a forward) must not be added to the silence meta sees before the next beat.
                wait = max(0.0, self.session.heartbeat_interval_ms / 1000 - (time.monotonic() - started))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("heartbeat_failed", meta=self._meta(), error=f"{type(e).__name__}: {e}")
                self._next_meta()
                wait = HEARTBEAT_BACKOFF.delay_s(failures)
                failures += 1
            self.session.beat_requested.clear()
            await wait_set(self.session.beat_requested, wait)

    # -- watch stream ------------------------------------------------------------------------------------------
    async def _watch_loop(self) -> None:
        failures = 0
        while True:
            url = f"{self._meta()}/v1/watch?after={self.routes.version}"
            try:
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT_S,
                                                sock_read=WATCH_READ_TIMEOUT_S)
                async with self._http.get(url, headers=auth_headers(self._token), timeout=timeout) as r:
                    if r.status != 200:
                        raise RuntimeError(f"watch refused: {r.status}")
                    failures = 0
                    await self._forget_deleted_topics()
                    parser = SseParser()
                    async for chunk in r.content.iter_any():
                        for event in parser.feed(chunk):
                            self._on_event(event)
                raise RuntimeError("watch stream ended")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("watch_failed", meta=self._meta(), error=f"{type(e).__name__}: {e}")
                self._next_meta()
                await asyncio.sleep(WATCH_BACKOFF.delay_s(failures))
                failures += 1

    async def _forget_deleted_topics(self) -> None:
        """A stream opened with ``after=V`` on a node whose change log no longer reaches V cannot name topics deleted
        while this broker was not listening: drop every route whose topic meta no longer lists."""
        # Read at least at the version this broker already knows: a meta node still replaying its log after a
        # restart would otherwise list too few topics, and live routes would be dropped.
        answer = await self._call("GET", f"/v1/topics?min_version={self.routes.version}")
        if answer.status != 200:
            raise RuntimeError(f"topic list refused: {answer.status}")
        listed = {t["topic"] for t in answer.body["topics"]}
        for topic in [t for t in self.routes.routes if t not in listed]:
            self._delete_route(topic, self.routes.version)

    def _on_event(self, event: SseEvent) -> None:
        if event.event == "unavailable":
            raise RuntimeError("the meta node stopped following the leader")
        body: Any = None
        try:
            body = json.loads(event.data)
            if event.event == "route":
                self._apply_route(body)
            elif event.event == "deleted":
                self._delete_route(body["topic"], body["version"])
            elif event.event == "caught_up":
                self.routes.caught_up(body["version"])
            elif event.event == "group":
                self._apply_group(body)
        except Exception as e:  # one bad topic must never stop the broker from following every other one
            if event.event == "group":
                log.error("group_event_failed", id=event.id, group=body.get("group") if isinstance(body, dict)
                          else None, error=f"{type(e).__name__}: {e}")
                return
            topic = body.get("topic") if isinstance(body, dict) else None
            log.error("route_event_failed", event_type=event.event, id=event.id, topic=topic,
                      error=f"{type(e).__name__}: {e}")
            if isinstance(topic, str):
                self._refetch_later(topic)

    def _apply_group(self, body: Any) -> None:
        """A group's lock table. Its id is a resume point like a route's (meta/api/watch.py): a pass whose last
        change is a group's sends no ``caught_up``, so the group's version counts as followed too, or a broker
        registered at that version would wait for an unrelated change before it writes again."""
        self.locks.apply(body)
        if self.group_settings is not None:
            self.group_settings.apply(body)   # pop's max_attempts
        self.routes.caught_up(body["version"])

    def _apply_route(self, route: dict[str, Any]) -> None:
        dropped = self.routes.update(route)
        if dropped is None:
            return
        self._dropped(dropped)
        for seg in self.routes.to_report():
            if seg.topic == route["topic"] and seg.physical_queue not in self._to_seal:
                self._to_seal[seg.physical_queue] = seg
                self._seal_wanted.set()
        for seg in self.routes.live_hosted():
            if seg.topic == route["topic"] and seg.state == "active" and seg.physical_queue not in self.writer.store:
                self._background(self.writer.prepare(seg), f"prepare {seg.physical_queue}")
        self.session.beat_soon()  # new segments want their budgets now, not in two seconds
        self.on_route_applied(route["topic"])

    def _background(self, work, what: str) -> None:
        """A short task of this link that stop() cancels; its failure is logged, never lost."""
        self._chores.spawn(work, what)

    def _delete_route(self, topic: str, version: int) -> None:
        self._dropped(self.routes.delete(topic, version))
        self.on_route_deleted(topic)

    def _dropped(self, physical_queues: set[str]) -> None:
        self.writer.forget(physical_queues)
        self.route_changed.set()

    def _refetch_later(self, topic: str) -> None:
        if topic in self._refetching or len(self._refetching) >= REFETCHES_MAX:
            return
        self._refetching[topic] = asyncio.create_task(self._refetch(topic))

    async def _refetch(self, topic: str) -> None:
        """Fetch one topic's route by itself until it applies (or the topic is gone)."""
        failures = 0
        try:
            while True:
                try:
                    answer = await self._call("GET", f"/v1/routes/{quote(topic, safe='')}")
                    status, body = answer.status, answer.body
                    if status == 404:
                        self._delete_route(topic, self.routes.version)
                        return
                    if status == 200:
                        self._apply_route(body)
                        log.info("route_refetched", topic=topic, version=body["version"])
                        return
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning("route_refetch_failed", topic=topic, error=f"{type(e).__name__}: {e}")
                    self._next_meta()
                await asyncio.sleep(REFETCH_BACKOFF.delay_s(failures))
                failures += 1
        finally:
            self._refetching.pop(topic, None)

    async def queue_segments(self, topic: str, queue: int, min_version: int) -> list[Segment]:
        """Every segment of one queue, older ones included (a route carries only the newest)."""
        answer = await self._call(
            "GET", f"/v1/topics/{quote(topic, safe='')}/queues/{queue}/segments?min_version={min_version}")
        if answer.status != 200:
            raise ApiError.from_dict(answer.status, answer.body)
        return [segment_of(topic, queue, s) for s in answer.body["segments"]]

    async def alter_in_sync(self, changes: list[dict[str, Any]]) -> None:
        """Ask meta to change who is in sync of heads this broker leads (replication/leader.py); what the log
        decided comes back with the routes."""
        answer = await self._call("POST", f"/v1/brokers/{self.broker}/in-sync",
                                  {"epoch": self.session.epoch, "changes": changes})
        if answer.status != 200:
            self._next_meta()
            raise RuntimeError(f"in-sync change refused: {answer.status} {str(answer.body)[:300]}")

    def peer_down(self, peer: str) -> None:
        """This broker could not reach ``peer`` (a fetch broke off or could not connect): tell the meta leader,
        which fences ``peer`` at once when its address refuses connections (meta/broker_probe.py), so the heads it
        led fail over in well under its session's timeout. At most once per PEER_DOWN_EVERY_S per peer."""
        now = time.monotonic()
        if self.session.epoch is None or now - self._peer_down_at.get(peer, -PEER_DOWN_EVERY_S) < PEER_DOWN_EVERY_S:
            return
        self._peer_down_at[peer] = now
        self._chores.spawn(self._report_peer_down(peer, self.session.epoch), f"peer-down {peer}")

    async def _report_peer_down(self, peer: str, epoch: int) -> None:
        answer = await self._call("POST", f"/v1/brokers/{self.broker}/peer-down", {"epoch": epoch, "peer": peer})
        if answer.status != 200:
            self._next_meta()
            raise RuntimeError(f"peer-down report refused: {answer.status} {str(answer.body)[:300]}")
        log.info("peer_down_reported", peer=peer, probe=answer.body.get("probe"), state=answer.body.get("state"))

    # -- seals -----------------------------------------------------------------------------------------------
    async def _seal_loop(self) -> None:
        """Report the ends of this broker's sealing segments, many per request (POST /v1/brokers/{b}/seals).

        A remap of thousands of queues seals thousands of segments here; one report each made one command, one
        route version and one route rendering on every meta node each, and flooded meta. Writes to a segment stop
        (``writer.seal``) before its end is read, so a report retried later carries the same end.
        """
        failures = 0
        while True:
            if not self._to_seal:
                self._seal_wanted.clear()
                await self._seal_wanted.wait()
            for pq in [pq for pq in self._to_seal if self._seal_done(pq)]:
                del self._to_seal[pq]
            batch = list(self._to_seal.values())[:SEALS_PER_REPORT_MAX]
            if not batch:
                continue
            try:
                if await self._report_seals(batch):
                    failures = 0
                    continue
            except (StatorError, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                # StatorError: no answer (Unavailable), or one that is not JSON
                log.warning("seal_report_failed", segments=len(batch), error=type(e).__name__)
                self._next_meta()
            await asyncio.sleep(SEAL_BACKOFF.delay_s(failures))
            failures += 1

    def _seal_done(self, pq: str) -> bool:
        current = self.routes.held(pq)
        return current is None or current.state == "sealed" or (current.sealer or current.broker) != self.broker

    async def _report_seals(self, batch: list[Segment]) -> bool:
        """One report of many segments; returns whether any of them is now settled."""
        reports = [{"topic": seg.topic, "queue": seg.queue, "gen": seg.gen, "end_offset": await self.writer.seal(seg),
                    "physical_queue": seg.physical_queue} for seg in batch]
        answer = await self._call("POST", f"/v1/brokers/{self.broker}/seals",
                                  {"epoch": self.session.epoch, "seals": reports})
        status, body = answer.status, answer.body
        if status != 200:
            code = body.get("error", {}).get("code") if isinstance(body, dict) else None
            if code == "STALE_EPOCH":
                self.session.epoch = None
                self.session.beat_soon()
            log.warning("seal_refused", segments=len(batch), status=status, code=code)
            return False
        settled = 0
        for seg, report, result in zip(batch, reports, body["results"]):
            if result.get("ok") or result.get("code") in SEAL_SETTLED_CODES:
                self._to_seal.pop(seg.physical_queue, None)
                settled += 1
                log.info("segment_sealed", pq=seg.physical_queue, end=report["end_offset"], code=result.get("code"))
        return settled > 0
