"""Prometheus metrics of one meta node, in a registry of its own (tests run several nodes in one process).

Counters of things that happen on the request path are incremented there; everything else (commit index, follower
lag, brokers by state, seals and remaps in flight, role changes, proposal failures, session expiries) is read from
the node's state when /metrics is scraped (``NodeStateCollector``), so nothing is added to the hot path.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, Info, PlatformCollector,
                               ProcessCollector)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .. import chains
from ..deciders.replicas import heads_holding

BROKER_STATES = ("active", "fenced")
ROLES = ("leader", "follower", "candidate")
PROPOSAL_FAILURES = ("NO_LEADER", "LEADER_CHANGED", "OVERLOADED", "UNKNOWN_OUTCOME")
# The in-flight scan walks each queue's newest segments on the event loop: above this many queues it is skipped
# (the gauges are left out of the scrape rather than stalling the node).
INFLIGHT_SCAN_QUEUES_MAX = 200_000


def build_version() -> str:
    try:
        return metadata.version("stator")
    except metadata.PackageNotFoundError:
        return "unknown"


class MetaMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)     # process_* (CPU, memory, open files): not in a private registry by default
        PlatformCollector(registry=r)
        GCCollector(registry=r)          # python_gc_*: full collections hold the node (meta/gc_tuning.py)
        gc_threshold = Gauge("stator_meta_gc_threshold", "The cyclic collector's threshold of each generation "
                             "(meta/gc_tuning.py)", ["generation"], registry=r)
        for generation in range(3):
            gc_threshold.labels(str(generation)).set_function(lambda g=generation: gc.get_threshold()[g])
        Info("stator_build", "Stator build", registry=r).info({"version": build_version(), "role": "meta"})
        self.requests = Counter("stator_meta_http_requests_total", "HTTP requests", ["route", "status"], registry=r)
        self.latency = Histogram("stator_meta_http_request_seconds",
                                 "HTTP request latency (long polls, waits for a version and SSE streams left out)",
                                 ["route"], registry=r,
                                 buckets=(.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 30))
        # The children of the two, by their labels: prometheus_client's labels() checks and looks up under a lock
        # at each call, ~6% of a node's CPU per request (two calls); a route and a status are a few dozen keys.
        self._request_counts: dict[tuple[str, int], Any] = {}
        self._request_latencies: dict[str, Any] = {}
        self.apply = Histogram("stator_meta_apply_seconds", "Time to apply one log entry to the image", registry=r,
                               buckets=(.00005, .0001, .0002, .0005, .001, .002, .005, .01, .05, .25, 1))
        self.applied_version = Gauge("stator_meta_applied_version", "Last applied metadata version", registry=r)
        self.term = Gauge("stator_meta_raft_term", "Current Raft term", registry=r)
        self.is_leader = Gauge("stator_meta_is_leader", "1 when this node leads", registry=r)
        self.long_polls = Gauge("stator_meta_long_poll_waiters", "Long-poll requests waiting", registry=r)
        self.long_polls_answered_parked = Counter(
            "stator_meta_long_polls_answered_parked_total", "Long polls answered whole by the parked-poll writer, "
            "one rendered answer per topic version (the rest answer from their own handler)", registry=r)
        self.watch_streams = Gauge("stator_meta_watch_streams", "Open SSE watch streams", registry=r)
        self.watch_events_written_parked = Counter(
            "stator_meta_watch_events_written_parked_total", "Route events written to parked one-topic watch streams by "
            "the parked-watch writer, one framed event per topic version (the rest write from their own stream)",
            registry=r)
        self.watch_streams_parked = Gauge("stator_meta_watch_streams_parked", "One-topic watch streams parked "
                                          "between their topic's changes (written by the parked-watch writer)",
                                          registry=r)
        self.version_waiters = Gauge("stator_meta_version_waiters", "Reads waiting for a min_version", registry=r)
        self.topics = Gauge("stator_meta_topics", "Topics in the image", registry=r)
        self.refusals = Counter("stator_meta_http_refusals_total", "Error answers by API code; a limit's refusals "
                                "show as TOO_LARGE, TOO_MANY_WAITERS, TOO_MANY_CONNECTIONS, OVERLOADED, ...", ["code"],
                                registry=r)
        self.rejections = Counter("stator_meta_limit_rejections_total", "Requests refused by a limit", ["limit"],
                                  registry=r)
        self.projection_position = Gauge("stator_meta_projection_position", "Version the SQL projection reached",
                                         registry=r)
        self.projection_gap = Gauge("stator_meta_projection_gap_versions",
                                    "Versions this node holds in neither its image nor its projection (being filled "
                                    "from peers)", registry=r)

    def observe_request(self, route: str, status: int, seconds: float | None) -> None:
        """One request answered with ``status``; ``seconds`` None leaves it out of the latency (a stream, a wait)."""
        count = self._request_counts.get((route, status))
        if count is None:
            count = self._request_counts[(route, status)] = self.requests.labels(route, str(status))
        count.inc()
        if seconds is not None:
            latency = self._request_latencies.get(route)
            if latency is None:
                latency = self._request_latencies[route] = self.latency.labels(route)
            latency.observe(seconds)

    def watch_node(self, svc: Any) -> None:
        """Report ``svc``'s state at every scrape; its apply latency from now on."""
        self.registry.register(NodeStateCollector(svc))
        svc.log.set_apply_observer(self.apply.observe)


class NodeStateCollector:
    def __init__(self, svc: Any):
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        svc = self.svc
        commit = GaugeMetricFamily("stator_meta_raft_commit_index", "Raft commit index this node knows")
        commit.add_metric([], svc.commit_index())
        yield commit
        lag = GaugeMetricFamily("stator_meta_follower_lag_entries",
                                "Leader only: log entries each follower has yet to acknowledge", labels=["follower"])
        for follower, entries in sorted(svc.log.follower_lag().items()):
            lag.add_metric([follower], entries)
        yield lag
        roles = CounterMetricFamily("stator_meta_raft_role_changes", "Times this node took each Raft role "
                                    "(to leader: an election it won)", labels=["role"])
        changes = svc.log.role_changes
        for role in ROLES:
            roles.add_metric([role], changes.get(role, 0))
        yield roles
        yield CounterMetricFamily("stator_meta_raft_ticks_slow", "Raft ticks longer than the shortest election "
                                  "timeout (meta/raft/node.py SLOW_TICK_S): heartbeats were held back",
                                  value=svc.log.slow_ticks)
        yield CounterMetricFamily("stator_meta_raft_proposal_wakes_deferred", "Proposals that asked for the next "
                                  "tick after raft_tuning.propose_coalesce_s rather than at once (the node was under "
                                  "load: its last entry carried at least propose_coalesce_min proposals)",
                                  value=svc.log.proposal_wakes_deferred)
        yield CounterMetricFamily("stator_meta_raft_proposals_forwarded_at_once", "Times this node, a follower "
                                  "with no entry of its own in flight, sent its proposals to the leader at once "
                                  "rather than from the next tick", value=svc.log.proposals_forwarded_at_once)
        yield CounterMetricFamily("stator_meta_raft_entries_appended_at_once", "Times this node, a lightly loaded "
                                  "leader, appended and sent proposals (its own, or a follower's just read) at once "
                                  "rather than in its tick's order", value=svc.log.entries_appended_at_once)
        snapshots = CounterMetricFamily("stator_meta_raft_snapshots", "Snapshots since start: written by this node, "
                                        "installed from the leader, or written and dropped because an install was "
                                        "newer", labels=["kind"])
        for kind, count in svc.log.snapshot_counts().items():
            snapshots.add_metric([kind], count)
        yield snapshots
        failures = CounterMetricFamily("stator_meta_proposal_failures", "Proposals that failed, by reason",
                                       labels=["reason"])
        for reason in sorted(set(PROPOSAL_FAILURES) | set(svc.log.proposal_failures)):
            failures.add_metric([reason], svc.log.proposal_failures.get(reason, 0))
        yield failures
        expiries = CounterMetricFamily("stator_meta_broker_session_expiries",
                                       "Broker sessions this node fenced for silence while it led")
        expiries.add_metric([], svc.brokers.expiries)
        yield expiries
        checks = CounterMetricFamily("stator_meta_broker_session_checks",
                                     "Session checks this node made while it led (a term's first starts every "
                                     "session afresh and is not counted)")
        checks.add_metric([], svc.brokers.tracker.checks)
        yield checks
        stalls = CounterMetricFamily("stator_meta_broker_session_check_stalls",
                                     "Session checks that found this leader had not been listening for over a second "
                                     "(its loop stalled): the stall counted against no broker's session")
        stalls.add_metric([], svc.brokers.tracker.stalls)
        yield stalls
        refusals = CounterMetricFamily("stator_meta_broker_refusal_fences",
                                       "Brokers this node fenced while it led because a peer could not reach them and "
                                       "their address refused its connection")
        refusals.add_metric([], svc.brokers.refusals)
        yield refusals
        yield from self._journal_counters(svc.log.journal_stats())
        held = svc.log.held_entries()
        kept = CounterMetricFamily("stator_meta_raft_held_entries_appends", "Append messages that repeated entries "
                                   "this follower held; pysyncobj would have deleted the entries after them, Raft "
                                   "keeps them (meta/raft/pysyncobj_shim.py)", labels=["kind"])
        kept.add_metric(["trimmed"], held.trimmed)
        kept.add_metric(["repeat"], held.repeats)
        kept.add_metric(["snapshot_commit_held"], held.snapshot_commits_held)
        yield kept
        yield _by_kind("stator_meta_raft_pre_votes", "Pre-votes (meta/raft/prevote.py): rounds this node asked for "
                       "and won, pre-votes it granted and refused, vote requests it refused while in lease, newer "
                       "terms it took from a term notice or a pre-vote's refusal", svc.log.pre_vote_counts())
        yield _by_kind("stator_meta_raft_read_index", "Reads by read index (meta/raft/read_index.py): served here, "
                       "probes sent as leader, read indexes answered for followers, reads refused",
                       svc.log.read_index_counts())
        yield from self._image_gauges()
        cached = GaugeMetricFamily("stator_meta_route_cache_bytes", "Routes kept rendered, by form", labels=["form"])
        for form, nbytes in svc.reads.route_cache_bytes().items():
            cached.add_metric([form], nbytes)
        yield cached
        warmed = CounterMetricFamily("stator_meta_routes_prerendered", "Big topics' routes rendered and gzip'd as "
                                     "they changed, before any reader asked (meta/route_warmer.py)")
        warmed.add_metric([], svc.route_warmer.rendered)
        yield warmed

    @staticmethod
    def _journal_counters(stats: dict[str, Any]) -> Iterator[Metric]:
        """The journal's group commit (raft_tuning.journal_sync): syncs, and acknowledgements, commits or marks that got
        ahead of the disk (always 0 with fsync; counted with ``none`` too, so an operator sees what the mode risks)."""
        yield GaugeMetricFamily("stator_meta_journal_fsync_enabled", "1 when the journal is fsynced before acks",
                                value=1 if stats["durable"] else 0)
        yield CounterMetricFamily("stator_meta_journal_syncs", "Journal syncs (one covers every entry since the last)",
                                  value=stats["syncs"])
        yield CounterMetricFamily("stator_meta_journal_acks_unsynced",
                                  "Follower acknowledgements sent for entries not yet on disk", value=stats["acks_unsynced"])
        yield CounterMetricFamily("stator_meta_journal_commits_unsynced",
                                  "Leader commits counting its own entries not yet on disk",
                                  value=stats["commits_unsynced"])
        yield CounterMetricFamily("stator_meta_journal_marks_unsynced",
                                  "Leader's marks of its synced journal covering entries not yet on disk",
                                  value=stats["marks_unsynced"])
        yield CounterMetricFamily("stator_meta_journal_writebacks", "Writebacks of the leader's new entries started "
                                  "before it sends them, ahead of its sync (meta/raft/group_commit.py start_writeback)",
                                  value=stats["writebacks"])
        yield CounterMetricFamily("stator_meta_journal_syncs_slow", "Journal syncs longer than 0.1 s "
                                  "(meta/raft/group_commit.py SLOW_SYNC_S)", value=stats["slow_syncs"])
        yield CounterMetricFamily("stator_meta_raft_local_commits",
                                  "Times this follower committed on the leader's mark (meta/raft/local_commit.py)",
                                  value=stats["local_commits"])

    def _image_gauges(self) -> Iterator[Metric]:
        def look(image) -> tuple[dict[str, int], int, int, bool]:
            states = dict.fromkeys(BROKER_STATES, 0)
            for b in image.brokers.values():
                states[b["state"]] = states.get(b["state"], 0) + 1
            topics = image.data["topics"].values()
            if sum(t["queues"] for t in topics) > INFLIGHT_SCAN_QUEUES_MAX:
                return states, 0, 0, False
            # A sealing segment is one of a queue's two newest; a queue whose head has no logic start yet is a move
            # (remap or growth) still waiting for that seal.
            seals = sum(1 for t in topics for e in t["chains"] for s in chains.segments(e)[-2:]
                        if s[chains.STATE] == "sealing")
            moves = sum(1 for t in topics for e in t["chains"] if chains.head(e)[chains.LOGIC_START] is None)
            return states, seals, moves, True

        def drains(image) -> dict[str, int]:
            return {b: len(heads_holding(image, b)) for b, v in image.brokers.items() if v["draining"]}

        states, seals, moves, scanned = self.svc.read(look)
        draining = GaugeMetricFamily("stator_meta_drain_remaining_heads", "Heads a broker being drained still holds "
                                     "a copy of (0: drained)", labels=["broker"])
        for broker, left in sorted(self.svc.read(drains).items()):
            draining.add_metric([broker], left)
        yield draining
        brokers = GaugeMetricFamily("stator_meta_brokers", "Registered brokers by state", labels=["state"])
        for state, n in sorted(states.items()):
            brokers.add_metric([state], n)
        yield brokers
        if scanned:
            yield GaugeMetricFamily("stator_meta_seals_in_flight", "Segments sealing now", value=seals)
            yield GaugeMetricFamily("stator_meta_remaps_in_flight",
                                    "Queues whose newest segment waits for the seal of the one before", value=moves)


def _by_kind(name: str, help_text: str, counts: Any) -> CounterMetricFamily:
    """One counter per field of a dataclass of counts, labelled ``kind`` by the field's name."""
    family = CounterMetricFamily(name, help_text, labels=["kind"])
    for kind, value in dataclasses.asdict(counts).items():
        family.add_metric([kind], value)
    return family
