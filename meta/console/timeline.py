"""A topic's mapping timeline: each logic queue's segments against time, from the topic's history events.

Pure: events in, bars and marks out (the page draws them as SVG). A segment starts when the event that created it
was applied (TopicCreated or TopicGrown for gen 0, SegmentOpened for later gens) and ends when it was sealed; an open
segment runs to ``now_ms``. Events of a range that starts after a segment was created still show it, from the
range's left edge: a bar that begins at the edge says "already there".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

# One colour per broker, by the broker's order of first appearance: stable while the page lives, readable on white.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")


@dataclass
class Bar:
    queue: int
    gen: int
    broker: str
    start_ms: int
    end_ms: int | None = None        # None: still open
    sealing_ms: int | None = None    # when the remap asked it to stop taking writes
    from_edge: bool = False          # created before the events shown


@dataclass
class Timeline:
    topic: str
    start_ms: int
    end_ms: int
    queues: int
    bars: list[Bar] = field(default_factory=list)
    brokers: dict[str, str] = field(default_factory=dict)   # broker -> colour
    remaps: list[int] = field(default_factory=list)          # ms of each remap's first sealing
    events: int = 0


def build(topic: str, events: Iterable[dict[str, Any]], now_ms: int) -> Timeline:
    """``events``: the topic's stored events (``{"version","ts","type","topic","data"}``) in version order."""
    bars: dict[tuple[int, int], Bar] = {}
    sealing_versions: dict[int, int] = {}   # version -> ts: one remap seals many queues in one event each
    first_ts = last_ts = None
    count = 0
    queues = 0
    for e in events:
        count += 1
        ts, kind, d = e["ts"], e["type"], e.get("data") or {}
        first_ts = ts if first_ts is None else first_ts
        last_ts = ts
        if kind in ("TopicCreated", "TopicGrown"):
            queues = max(queues, d.get("queues", 0))
            for s in d.get("segments", []):
                bars[(s["queue"], 0)] = Bar(s["queue"], 0, s["broker"], ts)
        elif kind == "SegmentOpened":
            bars[(d["queue"], d["gen"])] = Bar(d["queue"], d["gen"], d["broker"], ts)
        elif kind in ("SegmentSealing", "SegmentSealed", "LogicStartDecided", "OffsetBudgetGranted"):
            key = (d["queue"], d["gen"])
            bar = bars.get(key)
            if bar is None and "broker" in d:
                bar = bars[key] = Bar(d["queue"], d["gen"], d["broker"], ts, from_edge=True)
            if bar is not None and kind == "SegmentSealing":
                bar.sealing_ms = ts
                sealing_versions.setdefault(e["version"], ts)
            elif bar is not None and kind == "SegmentSealed":
                bar.end_ms = ts
        elif kind == "TopicDeleted":
            for bar in bars.values():
                if bar.end_ms is None:
                    bar.end_ms = ts
    start = first_ts if first_ts is not None else now_ms
    edge = min([start] + [b.start_ms for b in bars.values()])
    for bar in bars.values():
        if bar.from_edge:
            bar.start_ms = edge
    ordered = sorted(bars.values(), key=lambda b: (b.queue, b.gen))
    colours: dict[str, str] = {}
    for bar in sorted(ordered, key=lambda b: (b.start_ms, b.queue, b.gen)):
        colours.setdefault(bar.broker, PALETTE[len(colours) % len(PALETTE)])
    queues = max([queues] + [b.queue + 1 for b in ordered])
    remaps = sorted(set(sealing_versions.values()))
    return Timeline(topic, edge, max(now_ms, last_ts or now_ms), queues, ordered, colours, remaps, count)


@dataclass(frozen=True)
class Geometry:
    """Where the SVG puts things: a label column, then time from left to right, one row per logic queue."""
    width: int = 960
    label_w: int = 70
    row_h: int = 22
    top: int = 24

    def x(self, t: Timeline, ms: int) -> float:
        span = max(1, t.end_ms - t.start_ms)
        return round(self.label_w + (self.width - self.label_w - 10) * (ms - t.start_ms) / span, 1)

    def y(self, queue: int) -> int:
        return self.top + queue * self.row_h

    def height(self, t: Timeline) -> int:
        return self.top + max(1, t.queues) * self.row_h + 24
