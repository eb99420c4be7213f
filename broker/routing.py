"""The broker's view of the routes, learnt from meta's watch stream (DESIGN.md invariant 4: data, never authority).

A route only replaces an older one (versions only grow). From the routes the broker derives which physical queues it
hosts and in which state, and which segment holds a given logic offset of a queue.

A route carries the newest segments of each queue (meta bounds how many, so a route's size does not grow with the
history); a queue whose first carried segment has gen > 0 has older ones, which the reader asks meta for.
"""

from __future__ import annotations

from typing import Any

from wire import route as route_model
from wire.route import Segment
from wire.route import segment as segment_of
from wire.waits import Changes

__all__ = ["RouteTable", "Segment", "segment_of"]

ROUTE_CATCH_UP_WAIT_S = 1.0   # how long a request whose sender read a newer route waits for the watch stream
ROUTE_WAITERS_MAX = 10_000    # requests waiting so at once; one more decides at once on the routes held


class RouteTable:
    def __init__(self, me: str):
        self.me = me
        self.version = 0
        self.routes: dict[str, dict[str, Any]] = {}
        self._segments: dict[tuple[str, int], list[Segment]] = {}
        self.hosted: dict[str, Segment] = {}   # physical queue -> newest view of a segment this broker hosts
        # physical queue -> newest view of a segment this broker holds a copy of and does not lead (its follower)
        self.copies: dict[str, Segment] = {}
        self._advanced = Changes()   # each time version grows

    def update(self, route: dict[str, Any]) -> set[str] | None:
        """Take a newer route. None if it is not newer; else the physical queues this broker no longer hosts live
        (their per-queue state can go). Parses everything before changing anything: a bad route changes nothing."""
        route_model.check(route)
        topic = route["topic"]
        old = self.routes.get(topic)
        if old is not None and old["version"] >= route["version"]:
            return None
        parsed = {(topic, q["queue"]): [segment_of(topic, q["queue"], s) for s in q["segments"]]
                  for q in route["queues"]}
        before = self._hosted_of(topic)
        copies_before = self._copies_of(topic)
        self.routes[topic] = route
        self._advance(route["version"])
        self._segments.update(parsed)  # a static topic never loses queues: every old key is replaced
        now, copies = set(), set()
        for segs in parsed.values():
            for s in segs:
                if s.broker == self.me:
                    self.hosted[s.physical_queue] = s
                    now.add(s.physical_queue)
                elif self.me in s.replicas:
                    self.copies[s.physical_queue] = s
                    copies.add(s.physical_queue)
        for pq in copies_before - copies:
            self.copies.pop(pq, None)
        dropped = before - now
        for pq in dropped:
            self.hosted.pop(pq, None)
        return dropped

    def delete(self, topic: str, version: int) -> set[str]:
        """Forget a deleted topic; returns the physical queues it hosted here."""
        self._advance(version)
        if topic not in self.routes:
            return set()
        # Both read the topic's route: before it goes (after, they found nothing, and the deleted topic's segments
        # stayed in hosted and copies for good, their per-queue state never forgotten)
        dropped, copies = self._hosted_of(topic), self._copies_of(topic)
        route = self.routes.pop(topic)
        for pq in copies:
            self.copies.pop(pq, None)
        for q in route["queues"]:
            self._segments.pop((topic, q["queue"]), None)
        for pq in dropped:
            self.hosted.pop(pq, None)
        return dropped

    def caught_up(self, version: int) -> None:
        """The watch stream has sent every change up to ``version``."""
        self._advance(version)

    def _advance(self, version: int) -> None:
        if version > self.version:
            self.version = version
            self._advanced.changed()

    async def reach(self, version: int, timeout_s: float | None = None) -> bool:
        """Wait until this table has followed the log to ``version``, at most ``timeout_s`` (ROUTE_CATCH_UP_WAIT_S);
        whether it has.

        Meta's route reaches a client before the watch stream brings it here: a producer that read a queue's new
        head writable and sends to it at once would otherwise be refused (SEALING, NOT_LEADER) by the very broker
        the route names, and pause before its retry. Past ROUTE_WAITERS_MAX waiters, the answer is at once."""
        return await self._advanced.until(lambda: self.version >= version,
                                          ROUTE_CATCH_UP_WAIT_S if timeout_s is None else timeout_s, ROUTE_WAITERS_MAX)

    def _hosted_of(self, topic: str) -> set[str]:
        route = self.routes.get(topic)
        if route is None:
            return set()
        return {s.physical_queue for q in route["queues"] for s in self._segments.get((topic, q["queue"]), ())
                if s.broker == self.me}

    def _copies_of(self, topic: str) -> set[str]:
        route = self.routes.get(topic)
        if route is None:
            return set()
        return {s.physical_queue for q in route["queues"] for s in self._segments.get((topic, q["queue"]), ())
                if s.broker != self.me and self.me in s.replicas}

    def held(self, pq: str) -> Segment | None:
        """The newest view of a segment this broker leads or holds a copy of."""
        return self.hosted.get(pq) or self.copies.get(pq)

    def min_insync(self, topic: str) -> int:
        route = self.routes.get(topic)
        return route.get("min_insync", 1) if route is not None else 1

    def address(self, topic: str, broker: str) -> str | None:
        route = self.routes.get(topic)
        return route.get("addresses", {}).get(broker) if route is not None else None

    def to_report(self) -> list[Segment]:
        """Sealing segments whose end this broker must report: those it leads, or was elected to seal after their
        leader was lost (DESIGN.md invariant 12)."""
        return [s for s in (*self.hosted.values(), *self.copies.values())
                if s.state == "sealing" and (s.sealer or s.broker) == self.me]

    def segments(self, topic: str, queue: int) -> list[Segment] | None:
        return self._segments.get((topic, queue))

    def head(self, topic: str, queue: int) -> Segment | None:
        segs = self._segments.get((topic, queue))
        return segs[-1] if segs else None

    def live_hosted(self) -> list[Segment]:
        """Hosted segments that may still take writes or need a seal report."""
        return [s for s in self.hosted.values() if s.state in ("active", "sealing")]
