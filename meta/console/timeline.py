"""A topic's mapping timeline: each logic queue's segments against time, from the topic's history events.

Pure: events in, bars and marks out (the page draws them as SVG). A segment starts when the event that created it
was applied (TopicCreated or TopicGrown for gen 0, SegmentOpened for later gens) and ends when it was sealed; an open
segment runs to ``now_ms``. Events of a range that starts after a segment was created still show it, from the
range's left edge: a bar that begins at the edge says "already there".
"""

from __future__ import annotations

import bisect
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


GAP_MIN_PX = 16     # the least room between two moments of change: the newest segment is never a sliver
TICKS = 5           # labelled times between the axis's two ends


class Scale:
    """Time to x, piecewise linear: between each two moments something changed (a segment opened, sealing or
    sealed, a remap, the ends) at least GAP_MIN_PX, and the rest of the width shared by duration. On a linear axis a
    segment opened ten seconds ago on a topic two hours old was a 2-pixel sliver; here quiet stretches are
    compressed, and the ticks say which time each place stands for."""

    def __init__(self, t: Timeline, left: float, right: float):
        moments = {t.start_ms, t.end_ms, *t.remaps}
        for b in t.bars:
            moments.update(m for m in (b.start_ms, b.end_ms, b.sealing_ms) if m is not None)
        self.moments = sorted(moments)
        gaps = [b - a for a, b in zip(self.moments, self.moments[1:])]
        floor = min(GAP_MIN_PX, (right - left) / max(1, len(gaps)) / 2)   # floors take at most half the width
        share = (right - left - floor * len(gaps)) / max(1, sum(gaps))
        self.xs = [float(left)]
        for gap in gaps:
            self.xs.append(self.xs[-1] + floor + share * gap)

    def x(self, ms: int) -> float:
        i = max(0, min(bisect.bisect_right(self.moments, ms) - 1, len(self.moments) - 2))
        if len(self.moments) < 2:
            return round(self.xs[0], 1)
        a, b = self.moments[i], self.moments[i + 1]
        return round(self.xs[i] + (self.xs[i + 1] - self.xs[i]) * min(1.0, max(0.0, (ms - a) / (b - a))), 1)

    def ms(self, x: float) -> int:
        """The time at ``x`` (the inverse of ``x``)."""
        i = max(0, min(bisect.bisect_right(self.xs, x) - 1, len(self.xs) - 2))
        if len(self.xs) < 2:
            return self.moments[0]
        a, b = self.xs[i], self.xs[i + 1]
        return int(self.moments[i] + (self.moments[i + 1] - self.moments[i]) * min(1.0, max(0.0, (x - a) / (b - a))))

    def ticks(self, n: int = TICKS) -> list[tuple[float, int]]:
        """``n`` places evenly spread between the ends, each with the time it stands for."""
        left, right = self.xs[0], self.xs[-1]
        places = [left + (right - left) * (k + 1) / (n + 1) for k in range(n)]
        return [(round(p, 1), self.ms(p)) for p in places]


@dataclass(frozen=True)
class Geometry:
    """Where the SVG puts things: a label column, then time from left to right (``Scale``), one row per logic
    queue."""
    width: int = 960
    label_w: int = 70
    row_h: int = 22
    top: int = 24

    def scale(self, t: Timeline) -> Scale:
        return Scale(t, self.label_w, self.width - 10)

    def y(self, queue: int) -> int:
        return self.top + queue * self.row_h

    def height(self, t: Timeline) -> int:
        return self.top + max(1, t.queues) * self.row_h + 40
