"""The broker's view of the routes, learnt from meta's watch stream (DESIGN.md invariant 4: data, never authority).

A route only replaces an older one (versions only grow). From the routes the broker derives which physical queues it
hosts and in which state, and which segment holds a given logic offset of a queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Segment:
    topic: str
    queue: int
    gen: int
    broker: str
    address: str | None
    physical_queue: str
    physical_start: int
    logic_start: int | None
    logic_end: int | None
    state: str
    budget_end: int   # as of this route; heartbeats renew it faster than routes change

    def physical(self, logic: int) -> int:
        return logic - self.logic_start + self.physical_start

    def logic(self, physical: int) -> int:
        return physical - self.physical_start + self.logic_start


class RouteTable:
    def __init__(self, me: str):
        self.me = me
        self.version = 0
        self.routes: dict[str, dict[str, Any]] = {}
        self._segments: dict[tuple[str, int], list[Segment]] = {}
        self.hosted: dict[str, Segment] = {}   # physical queue -> newest view of a segment this broker hosts

    def update(self, route: dict[str, Any]) -> bool:
        old = self.routes.get(route["topic"])
        if old is not None and old["version"] >= route["version"]:
            return False
        self.routes[route["topic"]] = route
        self.version = max(self.version, route["version"])
        for q in route["queues"]:
            segs = [Segment(route["topic"], q["queue"], s["gen"], s["broker"], s.get("address"), s["physical_queue"],
                            s["physical_start"], s["logic_start"], s["logic_end"], s.get("state", "active"),
                            s.get("budget_end", 0))
                    for s in q["segments"]]
            self._segments[(route["topic"], q["queue"])] = segs
            for s in segs:
                if s.broker == self.me:
                    self.hosted[s.physical_queue] = s
        return True

    def delete(self, topic: str, version: int) -> None:
        route = self.routes.pop(topic, None)
        self.version = max(self.version, version)
        if route is None:
            return
        for q in route["queues"]:
            for s in self._segments.pop((topic, q["queue"]), []):
                self.hosted.pop(s.physical_queue, None)

    def segments(self, topic: str, queue: int) -> list[Segment] | None:
        return self._segments.get((topic, queue))

    def head(self, topic: str, queue: int) -> Segment | None:
        segs = self._segments.get((topic, queue))
        return segs[-1] if segs else None

    def live_hosted(self) -> list[Segment]:
        """Hosted segments that may still take writes or need a seal report."""
        return [s for s in self.hosted.values() if s.state in ("active", "sealing")]
