"""Prometheus metrics of one broker, in its node's registry (tests run several brokers in one process).

Traffic and latency are counted where they happen (writes.py, reads.py, the storage's fsync); the session's state,
the disk's free bytes and each physical queue's max offset are read when /metrics is scraped (``StateCollector``),
and so is each group's lag on the queues whose head is here (``ConsumerLagCollector``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric

SESSION_STATES = ("unregistered", "active", "fenced")
# One series per physical queue: above this many, the per-queue gauge is left out of the scrape (a scrape of a broker
# with a million queues would be megabytes) and stator_broker_queues still says how many there are.
QUEUE_SERIES_MAX = 10_000
LATENCY_BUCKETS_S = (.0001, .0002, .0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 5)


def _version() -> str:
    try:
        return metadata.version("stator")
    except metadata.PackageNotFoundError:
        return "unknown"


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
        self.append = Histogram("stator_broker_append_seconds", "One batch appended (with its fsync under flush "
                                "policy fsync)", registry=r, buckets=LATENCY_BUCKETS_S)
        self.fsync = Histogram("stator_broker_fsync_seconds", "One fsync of a queue's active segment file",
                               registry=r, buckets=LATENCY_BUCKETS_S)

    def stored(self, topic: str, payloads: list[bytes]) -> None:
        self.messages_in.labels(topic).inc(len(payloads))
        self.bytes_in.labels(topic).inc(sum(len(p) for p in payloads))

    def served(self, topic: str, payloads: list[bytes]) -> None:
        if payloads:
            self.messages_out.labels(topic).inc(len(payloads))
            self.bytes_out.labels(topic).inc(sum(len(p) for p in payloads))


class StateCollector:
    """``session_state()``, ``queue_max_offsets()`` and the free bytes under ``data_dir``, at each scrape."""

    def __init__(self, data_dir: str, session_state: Callable[[], str],
                 queue_max_offsets: Callable[[], dict[str, int]]):
        self.data_dir = data_dir
        self.session_state = session_state
        self.queue_max_offsets = queue_max_offsets

    def collect(self) -> Iterator[Metric]:
        state = self.session_state()
        session = GaugeMetricFamily("stator_broker_session_state", "1 for the broker's meta session state now",
                                    labels=["state"])
        for s in SESSION_STATES:
            session.add_metric([s], 1 if s == state else 0)
        yield session
        yield GaugeMetricFamily("stator_broker_disk_free_bytes", "Free bytes on the data directory's file system",
                                value=shutil.disk_usage(os.path.abspath(self.data_dir)).free)
        offsets = self.queue_max_offsets()
        yield GaugeMetricFamily("stator_broker_queues", "Physical queues stored here", value=len(offsets))
        if len(offsets) <= QUEUE_SERIES_MAX:
            per_queue = GaugeMetricFamily("stator_broker_queue_max_offset",
                                          "Next physical offset to be written, per physical queue",
                                          labels=["physical_queue"])
            for name, offset in sorted(offsets.items()):
                per_queue.add_metric([name], offset)
            yield per_queue


class ConsumerLagCollector:
    """Per group and logic queue whose open head segment is on this broker: the committed offset and the lag behind
    the queue's end. Exported by the broker holding the head, like the queue's max offset: every broker's scrape
    together covers every queue once, and the scrape reads only local state (no peer calls at scrape time).

    ``committed()`` is the offset store's durable commits {(group, topic, queue): next offset}; ``head(topic,
    queue)`` the queue's newest segment; ``max_physical(seg)`` its local end."""

    def __init__(self, me: str, committed: Callable[[], dict[tuple[str, str, int], int]],
                 head: Callable[[str, int], Any], max_physical: Callable[[Any], int]):
        self.me = me
        self.committed = committed
        self.head = head
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
            seg = self.head(topic, queue)
            if (committed < 0 or seg is None or seg.broker != self.me or seg.logic_end is not None
                    or seg.logic_start is None):
                continue
            rows += 1
            if rows > QUEUE_SERIES_MAX:
                break
            values = [group, topic, str(queue)]
            offset.add_metric(values, committed)
            lag.add_metric(values, max(0, seg.logic(self.max_physical(seg)) - committed))
        yield offset
        yield lag
