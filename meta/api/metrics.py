"""Prometheus metrics of one meta node, in a registry of its own (tests run several nodes in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class MetaMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("stator_meta_http_requests_total", "HTTP requests", ["route", "status"], registry=r)
        self.latency = Histogram("stator_meta_http_request_seconds", "HTTP request latency", ["route"], registry=r,
                                 buckets=(.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 30))
        self.applied_version = Gauge("stator_meta_applied_version", "Last applied metadata version", registry=r)
        self.term = Gauge("stator_meta_raft_term", "Current Raft term", registry=r)
        self.is_leader = Gauge("stator_meta_is_leader", "1 when this node leads", registry=r)
        self.long_polls = Gauge("stator_meta_long_poll_waiters", "Long-poll requests waiting", registry=r)
        self.watch_streams = Gauge("stator_meta_watch_streams", "Open SSE watch streams", registry=r)
        self.version_waiters = Gauge("stator_meta_version_waiters", "Reads waiting for a min_version", registry=r)
        self.topics = Gauge("stator_meta_topics", "Topics in the image", registry=r)
        self.rejections = Counter("stator_meta_limit_rejections_total", "Requests refused by a limit", ["limit"],
                                  registry=r)
        self.projection_position = Gauge("stator_meta_projection_position", "Version the SQL projection reached",
                                         registry=r)
        self.projection_gap = Gauge("stator_meta_projection_gap_versions",
                                    "Versions this node holds in neither its image nor its projection (being filled "
                                    "from peers)", registry=r)
