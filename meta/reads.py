"""Reads of a meta node: the applied image under its lock, rendered routes, and the waits a read may ask for.

``min_version`` waits (bounded, and counted against VERSION_WAITERS_MAX) until this node applied V;
``consistency=linearizable`` first waits for the read index (meta/raft/read_index.py): no log entry. Everything is
served from this node's image.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from wire import json_body
from wire.errors import invalid, rejection
from wire.params import nonneg_int, seconds

from . import limits, views
from .admission import Admission
from .changefeed import ChangeFeed
from .image import GROUP_KEY_PREFIX, Image
from .log import Log
from .raft.node import ProposeFailed
from .route_cache import RouteCache

T = TypeVar("T")
READ_INDEX_RETRY_S = 0.05


class ReadFacade:
    def __init__(self, log: Log, feed: ChangeFeed, version_waiters: Admission):
        self.log = log
        self.feed = feed
        self.version_waiters = version_waiters
        self._route_cache = RouteCache(limits.ROUTE_CACHE_BYTES_MAX)
        self._route_gzip_cache = RouteCache(limits.ROUTE_GZIP_CACHE_BYTES_MAX)   # used on the event loop only
        self._leaderless_since: float | None = None

    @property
    def image(self) -> Image:
        return self.log.image

    @property
    def applied_version(self) -> int:
        return self.image.version

    def read(self, fn: Callable[[Image], T]) -> T:
        """Run ``fn(image)`` under the image lock so it never sees half of an applied command."""
        return self.log.read(fn)

    def route_bytes(self, topic: str, keep: bool = True) -> tuple[int, bytes] | None:
        """The topic's route as JSON, rendered once per version and shared by every subscriber. The view is built
        under the image lock, and encoded after it is released (views.route copies what it takes from the image):
        a 1,000-queue route takes ~6 ms to encode, which the apply thread no longer waits for. ``keep=False``
        renders without keeping the body (it is about to be gzip'd, and kept in that form)."""
        return self._rendered(topic, lambda image: image.topic(topic), views.route, encode_unlocked=True, keep=keep)

    def route_cache_bytes(self) -> dict[str, int]:
        return {"rendered": self._route_cache.bytes, "gzip": self._route_gzip_cache.bytes}

    def route_gzipped(self, topic: str) -> bool:
        """Whether the topic's route at its current version is in the gzip cache (what a reader taking gzip gets
        without a render)."""
        def look(image: Image) -> bool:
            t = image.topic(topic)
            return t is not None and self._route_gzip_cache.get(topic, t["version"]) is not None
        return self.read(look)

    async def route_for(self, topic: str, gzip_ok: bool) -> tuple[int, bytes, bool] | None:
        """(version, body, gzipped) of the topic's route: gzip'd once per version for a reader that takes it when
        the route is big, else as rendered. A big route is rendered and compressed in a worker thread (encoding
        yields the GIL every few ms, zlib releases it), so the event loop goes on serving meanwhile."""
        def cached(image: Image):
            # One pass under the lock finds what most reads want, the answer as rendered or gzip'd already.
            t = image.topic(topic)
            if t is None:
                return None
            version = t["version"]
            packed = self._route_gzip_cache.get(topic, version) if gzip_ok else None
            if packed is not None:
                return (version, packed, True), t["queues"]
            body = self._route_cache.get(topic, version)
            if body is not None and (not gzip_ok or len(body) < limits.ROUTE_GZIP_MIN_BYTES):
                return (version, body, False), t["queues"]
            return None, t["queues"]
        found = self.read(cached)
        if found is None:
            self._route_gzip_cache.drop(topic)
            return None
        if found[0] is not None:
            return found[0]
        if found[1] < limits.ROUTE_RENDER_OFFLOAD_QUEUES_MIN:
            route = self.route_bytes(topic)
        else:   # big: it will be gzip'd (ROUTE_GZIP_MIN_BYTES), and the rendered form need not take the cache
            route = await asyncio.to_thread(self.route_bytes, topic, not gzip_ok)
        if route is None:
            return None
        if not gzip_ok or len(route[1]) < limits.ROUTE_GZIP_MIN_BYTES:
            return route[0], route[1], False
        packed = await asyncio.to_thread(gzip.compress, route[1], limits.ROUTE_GZIP_LEVEL, mtime=0)
        self._route_gzip_cache.put(topic, route[0], packed)
        return route[0], packed, True

    def group_bytes(self, key: str) -> tuple[int, bytes] | None:
        """A group's ``group`` watch event (``key`` is its change-feed key), rendered once per group version."""
        return self._rendered(key, lambda image: image.groups.get(key[len(GROUP_KEY_PREFIX):]), views.group_event)

    def _rendered(self, key: str, find: Callable[[Image], dict | None], view: Callable[[Image, dict], object],
                  encode_unlocked: bool = False, keep: bool = True) -> tuple[int, bytes] | None:
        """(version, JSON bytes) of what ``find`` picks from the image, from the cache while its version holds.
        The cache is used under the image lock: routes are rendered from the event loop and from worker threads."""
        def look(image: Image):
            entry = find(image)
            if entry is None:
                self._route_cache.drop(key)
                return None
            body = self._route_cache.get(key, entry["version"])
            if body is not None:
                return entry["version"], body, None
            rendered = view(image, entry)
            if encode_unlocked:
                return entry["version"], None, rendered
            body = json_body.encode(rendered)
            self._route_cache.put(key, entry["version"], body)
            return entry["version"], body, None
        found = self.read(look)
        if found is None:
            return None
        version, body, rendered = found
        if body is None:
            body = json_body.encode(rendered)
            if keep:
                with self.log.image_lock:
                    self._route_cache.put(key, version, body)
        return version, body

    async def before_read(self, query: Mapping[str, str]) -> None:
        wait_s = seconds(query.get("wait"), "wait", limits.READ_WAIT_S_DEFAULT, limits.READ_WAIT_S_MAX)
        if query.get("consistency") == "linearizable":
            await self.linearizable(wait_s)
        elif query.get("consistency") not in (None, "", "serializable"):
            raise invalid("consistency must be 'linearizable' or 'serializable'")
        if query.get("min_version") is not None:
            v = nonneg_int(query["min_version"], "min_version")
            if self.feed.version < v:
                self.version_waiters.enter()
                try:
                    reached = await self.feed.wait_version(v, wait_s)
                finally:
                    self.version_waiters.leave()
                if not reached:
                    raise rejection(503, "VERSION_NOT_REACHED", f"this node has applied {self.applied_version}, "
                                    f"not {v}, within {wait_s} s", applied_version=self.applied_version, min_version=v)

    async def linearizable(self, timeout_s: float) -> None:
        """Returns once this node's image holds every write acknowledged before the call, through the read index
        (meta/raft/read_index.py: the leader confirms it still leads, nothing is appended to the log); 503
        NO_LEADER when no leader confirmed it within ``timeout_s`` (a new leader's first entry not yet committed,
        an election, a partition: each is asked again until then)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await self.log.read_index(max(0.1, deadline - time.monotonic()))
                return
            except ProposeFailed as e:
                if e.code == "OVERLOADED":
                    raise
                if time.monotonic() > deadline:
                    raise rejection(503, "NO_LEADER", "no leader to confirm a linearizable read") from None
                await asyncio.sleep(READ_INDEX_RETRY_S)

    def follows_log(self) -> bool:
        """Whether this node follows a leader closely enough to serve watch streams (see api/watch.py)."""
        now = time.monotonic()
        if self.log.leader_address() is None:
            if self._leaderless_since is None:
                self._leaderless_since = now
            return now - self._leaderless_since < limits.WATCH_LEADERLESS_S_MAX
        self._leaderless_since = None
        return self.log.commit_lag() <= limits.WATCH_LAG_ENTRIES_MAX
