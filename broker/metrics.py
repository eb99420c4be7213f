"""Prometheus metrics of one broker, in its node's registry (tests run several brokers in one process).

Traffic and latency are counted where they happen (writes.py, reads.py, the storage's fsync); the session's state,
the disk's free bytes and the end offset of each logic queue whose head is here are read when /metrics is scraped
(``StateCollector``), and so is each group's lag on the queues whose head is here (``ConsumerLagCollector``).

Labels name topics and logic queues, never physical queues: a physical queue's name carries its generation, so a
series labelled by it would end at every remap and a new one begin, and a dashboard would lose the queue's history.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric

from . import lag as lag_mod
from . import rates

SESSION_STATES = ("unregistered", "active", "fenced")
# One series per logic queue: above this many, the per-queue gauges are left out of the scrape (a scrape of a broker
# with a million queues would be megabytes) and stator_broker_queues still says how many there are.
QUEUE_SERIES_MAX = 10_000
LATENCY_BUCKETS_S = (.0001, .0002, .0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 5)


def _version() -> str:
    try:
        return metadata.version("stator")
    except metadata.PackageNotFoundError:
        return "unknown"


class Children:
    """A metric's children by the value of its one label, kept once made: prometheus_client's ``labels()`` checks
    the value and takes a lock on every call, and a send or a pull counts into three series. Children are never
    removed (a topic's series outlive its queues here), so the map holds one entry per value ever seen, as the
    metric itself does."""

    def __init__(self, metric: Counter):
        self._metric = metric
        self._children: dict[str, Any] = {}

    def __call__(self, value: str) -> Any:
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = self._metric.labels(value)
        return child


class BrokerMetrics:
    def __init__(self, registry: CollectorRegistry):
        r = registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        Info("stator_build", "Stator build", registry=r).info({"version": _version(), "role": "broker"})
        self.refusals = Counter("stator_broker_http_refusals_total", "Error answers by API code; a limit's refusals "
                                "show as TOO_LARGE, TOO_MANY_WAITERS, TOO_MANY_CONNECTIONS, TOO_MANY_OFFSETS, ...",
                                ["code"], registry=r)
        self.messages_in = Counter("stator_broker_messages_in_total", "Messages stored", ["topic"], registry=r)
        self.bytes_in = Counter("stator_broker_bytes_in_total", "Bytes of messages stored (encoded)", ["topic"],
                                registry=r)
        self.messages_out = Counter("stator_broker_messages_out_total", "Messages served to pulls", ["topic"],
                                    registry=r)
        self.bytes_out = Counter("stator_broker_bytes_out_total", "Bytes of messages served to pulls (encoded)",
                                 ["topic"], registry=r)
        self.append = Histogram("stator_broker_append_seconds", "One batch appended (and on disk, with flush "
                                "fsync)", registry=r, buckets=LATENCY_BUCKETS_S)
        self.fsync = Histogram("stator_broker_fsync_seconds", "One sync of queue data: a syncfs covering every queue "
                               "written meanwhile (sync_scope filesystem), or an fdatasync of one queue's file",
                               registry=r, buckets=LATENCY_BUCKETS_S)
        self.copies_wait = Histogram("stator_broker_copies_wait_seconds", "A replicated batch's wait for its copies "
                                     "after it was on this broker's disk (0 when they held it already)",
                                     registry=r, buckets=LATENCY_BUCKETS_S)
        self.copy_acknowledge = Histogram("stator_broker_copy_acknowledge_seconds", "On a copy: from the first "
                                          "records a stream brought to the acknowledgement that covers them (their "
                                          "write and sync here)", registry=r, buckets=LATENCY_BUCKETS_S)
        self.requests = Children(Counter("stator_broker_http_requests_total", "HTTP requests", ["status"],
                                         registry=r))
        self._messages_in, self._bytes_in = Children(self.messages_in), Children(self.bytes_in)
        self._messages_out, self._bytes_out = Children(self.messages_out), Children(self.bytes_out)
        self.last_hour = rates.MinuteCounts()   # the same counts, per minute for the last hour (the console's)

    def stored(self, topic: str, messages: int, payload_bytes: int) -> None:
        self._messages_in(topic).inc(messages)
        self._bytes_in(topic).inc(payload_bytes)
        self.last_hour.add(topic, rates.STORED, messages)

    def served(self, topic: str, messages: int, payload_bytes: int) -> None:
        if messages:
            self._messages_out(topic).inc(messages)
            self._bytes_out(topic).inc(payload_bytes)
            self.last_hour.add(topic, rates.SERVED, messages)


class StateCollector:
    """``session_state()``, the free bytes under ``data_dir``, how many live segments this broker hosts
    (``live_segments()``) and, per logic queue whose open head segment is among them, its end offset."""

    def __init__(self, data_dir: str, session_state: Callable[[], str], live_segments: Callable[[], list[Any]],
                 max_physical: Callable[[Any], int]):
        self.data_dir = data_dir
        self.session_state = session_state
        self.live_segments = live_segments
        self.max_physical = max_physical

    def collect(self) -> Iterator[Metric]:
        state = self.session_state()
        session = GaugeMetricFamily("stator_broker_session_state", "1 for the broker's meta session state now",
                                    labels=["state"])
        for s in SESSION_STATES:
            session.add_metric([s], 1 if s == state else 0)
        yield session
        yield GaugeMetricFamily("stator_broker_disk_free_bytes", "Free bytes on the data directory's file system",
                                value=shutil.disk_usage(os.path.abspath(self.data_dir)).free)
        live = self.live_segments()
        yield GaugeMetricFamily("stator_broker_queues", "Physical queues stored here", value=len(live))
        if len(live) <= QUEUE_SERIES_MAX:
            # Only the open head counts (a queue's end is where its head writes next), so a queue has one series on
            # one broker and summing over brokers counts it once. A head whose logic start waits for the seal of
            # the segment before it has no logic end yet and is left out until the seal.
            heads: dict[tuple[str, int], Any] = {}
            for seg in live:
                if seg.state != "active" or seg.logic_end is not None or seg.logic_start is None:
                    continue
                key = (seg.topic, seg.queue)
                if key not in heads or seg.gen > heads[key].gen:
                    heads[key] = seg
            per_queue = GaugeMetricFamily("stator_broker_queue_max_offset",
                                          "Next logic offset to be written, per logic queue whose head is here",
                                          labels=["topic", "queue"])
            for (topic, queue), seg in sorted(heads.items()):
                per_queue.add_metric([topic, str(queue)], seg.logic(self.max_physical(seg)))
            yield per_queue


class ConsumerLagCollector:
    """Per group and logic queue whose open head segment is on this broker: the committed offset and the lag, the
    messages stored from it on (broker/lag.py: a budget skipped after a lapsed session is not lag). Exported by the
    broker holding the head, like the queue's max offset: every broker's scrape together covers every queue once,
    and the scrape reads only local state (no peer calls at scrape time), so of the segments before the head it
    counts those the route carries with an exact end; ``GET /v1/groups/{group}`` asks their holders for the rest.

    ``committed()`` is the offset store's durable commits {(group, topic, queue): next offset}; ``segments(topic,
    queue)`` the queue's segments the route carries, oldest first; ``max_physical(seg)`` a segment's local end."""

    def __init__(self, me: str, committed: Callable[[], dict[tuple[str, str, int], int]],
                 segments: Callable[[str, int], Any], max_physical: Callable[[Any], int]):
        self.me = me
        self.committed = committed
        self.segments = segments
        self.max_physical = max_physical

    def collect(self) -> Iterator[Metric]:
        labels = ["group", "topic", "queue"]
        offset = GaugeMetricFamily("stator_broker_consumer_committed_offset",
                                   "A group's committed offset (next to read) on a logic queue whose head is here",
                                   labels=labels)
        lag = GaugeMetricFamily("stator_broker_consumer_lag_messages",
                                "Messages of a logic queue whose head is here that a group has not committed yet",
                                labels=labels)
        rows = 0
        for (group, topic, queue), committed in sorted(self.committed().items()):
            segs = self.segments(topic, queue)
            seg = segs[-1] if segs else None
            if (committed < 0 or seg is None or seg.broker != self.me or seg.logic_end is not None
                    or seg.logic_start is None):
                continue
            rows += 1
            if rows > QUEUE_SERIES_MAX:
                break
            values = [group, topic, str(queue)]
            offset.add_metric(values, committed)
            ends = [(s, s.logic(self.max_physical(s)) if s is seg else
                     None if s.logic_end is None or lag_mod.ends_at_budget(s) else s.logic_end) for s in segs]
            lag.add_metric(values, lag_mod.stored_after(ends, committed))
        yield offset
        yield lag
