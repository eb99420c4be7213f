"""The timeline's time axis (meta/console/timeline.py): each change gets room, so the newest segment of a topic two
hours old, remapped ten seconds ago, is a bar one can see and point at, not a 2-pixel sliver (issue 35); the ticks
between the ends name the time each place stands for."""

from __future__ import annotations

from meta.console import timeline

HOUR_MS = 3_600_000


def _remapped_long_after_creation():
    t0, now = 1_795_000_000_000, 1_795_000_000_000 + 2 * HOUR_MS
    events = [
        {"version": 1, "ts": t0, "type": "TopicCreated", "topic": "t",
         "data": {"queues": 2, "segments": [{"queue": 0, "broker": "b1"}, {"queue": 1, "broker": "b1"}]}},
        {"version": 2, "ts": now - 10_000, "type": "SegmentSealing", "topic": "t", "data": {"queue": 0, "gen": 0}},
        {"version": 3, "ts": now - 9_990, "type": "SegmentOpened", "topic": "t",
         "data": {"queue": 0, "gen": 1, "broker": "b2"}},
        {"version": 4, "ts": now - 9_900, "type": "SegmentSealed", "topic": "t", "data": {"queue": 0, "gen": 0}},
    ]
    return timeline.build("t", events, now), now


def test_the_newest_segment_is_wider_than_a_sliver():
    tl, now = _remapped_long_after_creation()
    g = timeline.Geometry()
    sc = g.scale(tl)
    newest = next(b for b in tl.bars if b.gen == 1)
    assert sc.x(now) - sc.x(newest.start_ms) >= timeline.GAP_MIN_PX
    # the old, long segment still takes most of the width, and the axis spans exactly the drawing's width
    old = next(b for b in tl.bars if (b.queue, b.gen) == (1, 0))
    assert sc.x(now) - sc.x(old.start_ms) == g.width - 10 - g.label_w
    assert sc.x(newest.start_ms) - sc.x(tl.start_ms) > (g.width - g.label_w) / 2


def test_ticks_between_the_ends_name_increasing_times_that_map_back_to_their_places():
    tl, _ = _remapped_long_after_creation()
    sc = timeline.Geometry().scale(tl)
    ticks = sc.ticks()
    assert len(ticks) == timeline.TICKS
    places, times = [x for x, _ in ticks], [ms for _, ms in ticks]
    assert places == sorted(places) and times == sorted(times) and len(set(times)) == len(times)
    assert all(tl.start_ms < ms < tl.end_ms for ms in times)
    for x, ms in ticks:
        assert abs(sc.x(ms) - x) <= 0.2


def test_x_never_goes_back_and_stays_within_the_axis():
    tl, now = _remapped_long_after_creation()
    g = timeline.Geometry()
    sc = g.scale(tl)
    xs = [sc.x(tl.start_ms + k * (now - tl.start_ms) // 997) for k in range(998)]
    assert xs == sorted(xs) and xs[0] == g.label_w and xs[-1] == g.width - 10
    assert sc.x(tl.start_ms - HOUR_MS) == g.label_w and sc.x(now + HOUR_MS) == g.width - 10


def test_a_timeline_of_one_moment_draws():
    tl = timeline.build("t", [], 1_795_000_000_000)
    sc = timeline.Geometry().scale(tl)
    assert sc.x(tl.start_ms) == timeline.Geometry().label_w and len(sc.ticks()) == timeline.TICKS


def test_tick_labels_tell_apart_the_moments_of_a_short_axis():
    from meta.console.values import clock
    assert clock(1_795_000_000_123) == "11:06:40" and clock(1_795_000_000_123, HOUR_MS) == "11:06:40"
    assert clock(1_795_000_000_123, 2_000) == "11:06:40.123"
