"""A starting meta node is ready only once its routes are warm (meta/route_warmer.py), in process: the warmer's gate
against a table of topics it reads through the same calls as the node's ReadFacade (``read``, ``route_gzipped``,
``route_for``). The real node's readiness with it: tests/test_route_cache.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from meta import limits
from meta import route_warmer as warmer_mod
from meta.changefeed import ChangeFeed
from meta.route_warmer import RouteWarmer

BIG = limits.ROUTE_RENDER_OFFLOAD_QUEUES_MIN
WAIT_S = 5.0


class Topics:
    """Topics by name with a version and a size, and a gzip cache of (name, version) as the node's reads keep."""

    def __init__(self, **queues: int):
        self.topics = {name: {"queues": n, "version": 1} for name, n in queues.items()}
        self.cached: dict[str, int] = {}
        self.renders: list[tuple[str, int]] = []
        self.fail = False

    def read(self, fn):
        return fn(self)

    def route_gzipped(self, name: str) -> bool:
        t = self.topics.get(name)
        return t is not None and self.cached.get(name) == t["version"]

    async def route_for(self, name: str, gzip_ok: bool):
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("render failed")
        t = self.topics[name]
        self.renders.append((name, t["version"]))
        self.cached[name] = t["version"]
        return t["version"], b"route", True


async def _until(pred, what: str):
    async with asyncio.timeout(WAIT_S):
        while not pred():
            await asyncio.sleep(0.01)


@pytest.fixture
def running():
    tasks = []

    def start(topics: Topics, caught_up) -> RouteWarmer:
        warmer = RouteWarmer(topics, ChangeFeed(), caught_up)
        tasks.append(asyncio.create_task(warmer.run()))
        return warmer
    yield start
    for t in tasks:
        t.cancel()


async def test_not_warm_before_the_catch_up_and_warm_after_a_pass_that_began_caught_up(running):
    topics = Topics(a=BIG, b=BIG * 4, small=BIG - 1)
    caught_up = [False]
    warmer = running(topics, lambda: caught_up[0])
    # The pass over the image the node restored renders the big routes while it catches up...
    await _until(lambda: len(topics.renders) == 2, "the first pass")
    assert sorted(topics.renders) == [("a", 1), ("b", 1)]
    # ...but a route that changed during the catch-up is stale: not warm until a pass after it.
    topics.topics["b"]["version"] = 2
    await asyncio.sleep(3 * warmer_mod.CATCH_UP_POLL_S)
    assert not warmer.warm
    caught_up[0] = True
    assert not warmer.ready()
    await _until(lambda: warmer.warm, "warm")
    assert warmer.ready()
    assert topics.renders[2:] == [("b", 2)]      # the unchanged route was not rendered again
    assert warmer.rendered == 3


async def test_the_hold_on_readiness_ends_its_bound_after_the_catch_up_while_renders_keep_failing(
        running, monkeypatch):
    monkeypatch.setattr(limits, "ROUTE_WARM_READY_WAIT_MAX_S", 0.3)
    monkeypatch.setattr(warmer_mod, "FAILURE_PAUSE_S", 0.05)
    topics = Topics(a=BIG)
    topics.fail = True
    caught_up = [False]
    warmer = running(topics, lambda: caught_up[0])
    await asyncio.sleep(0.5)
    assert not warmer.ready()            # not caught up: the bound has not started
    caught_up[0] = True
    await asyncio.sleep(0.15)
    assert not warmer.ready()
    await _until(warmer.ready, "ready after the bound")
    assert not warmer.warm and topics.renders == [] and warmer.rendered == 0
    topics.fail = False                  # the warm-up went on behind the readiness
    await _until(lambda: warmer.warm, "warm")
    assert topics.renders == [("a", 1)]


async def test_a_long_first_pass_counts_the_bound_from_the_catch_up_within_it(running, monkeypatch):
    monkeypatch.setattr(limits, "ROUTE_WARM_READY_WAIT_MAX_S", 0.2)
    topics = Topics(**{f"t{i}": BIG for i in range(40)})
    slow = topics.route_for

    async def route_for(name, gzip_ok):
        await asyncio.sleep(0.02)
        return await slow(name, gzip_ok)
    topics.route_for = route_for
    warmer = running(topics, lambda: True)
    await _until(warmer.ready, "ready after the bound")   # within the first pass (40 x 20 ms)
    assert not warmer.warm and len(topics.renders) < 40
    await _until(lambda: warmer.warm, "warm")
    assert len(topics.renders) == 40


async def test_without_big_topics_a_caught_up_node_is_warm_at_once(running):
    topics = Topics(small=2)
    warmer = running(topics, lambda: True)
    await _until(lambda: warmer.warm, "warm")
    assert topics.renders == []


async def test_once_warm_renders_take_at_most_their_share_of_the_wall_time_and_the_warm_up_none(running):
    """Renders back to back starved the raft tick thread of the GIL (limits.ROUTE_WARM_DUTY): once warm, each render
    is followed by a wait of (1 / duty - 1) times its length. A starting node's warm-up is not held back."""
    render_s = 0.2   # the pacing waits 3x as long; a warm-up render never waits that long, even on a loaded machine
    topics = Topics(**{f"t{i}": BIG for i in range(4)})
    slow = topics.route_for
    started: list[float] = []

    async def route_for(name, gzip_ok):
        started.append(time.monotonic())
        await asyncio.sleep(render_s)
        return await slow(name, gzip_ok)
    topics.route_for = route_for
    warmer = running(topics, lambda: True)
    await _until(lambda: warmer.warm, "warm")
    warm_up = [b - a for a, b in zip(started, started[1:])]
    assert len(warm_up) == 3 and max(warm_up) < render_s / limits.ROUTE_WARM_DUTY * 0.95, warm_up   # not paced
    for t in topics.topics.values():
        t["version"] = 2
    warmer.feed.publish(2, set(topics.topics))
    async with asyncio.timeout(WAIT_S * 4):
        while len(topics.renders) < 8:
            await asyncio.sleep(0.01)
    gaps = [b - a for a, b in zip(started[4:], started[5:])]
    assert min(gaps) >= render_s / limits.ROUTE_WARM_DUTY * 0.95, gaps
