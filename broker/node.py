"""One broker: storage, routes, the meta session and link, writes, reads and peers wired together, started and
stopped as one. Dependencies point one way: reads -> writes, meta link -> writes; the session is the one object the
link keeps and the writer obeys."""

from __future__ import annotations

import asyncio
import os
import time

import structlog
from prometheus_client import CollectorRegistry, Counter

from wire import disk_identity
from wire.tls import client_context

from .chores import Chores
from .config import SYNC_SCOPE_FILESYSTEM, BrokerConfig
from .fencing import FencingGate
from .locks import Barriers, LockTable
from .metrics import BrokerMetrics, ConsumerLagCollector, StateCollector
from .meta_link import MetaLink
from .offset_witness import FILE as WITNESS_FILE
from .offset_witness import WitnessLog
from .offsets import OffsetStore
from .peers import Peers
from .producer_journal import ProducerJournal
from .pop.metrics import PopCollector
from .pop.service import PopService
from .pop.settings import GroupSettings
from .pop.wakeup import TopicSignals
from .reads import Reader
from .replication.follower import Replicator
from .replication.pop_copies import PopCopies
from .replication.source import FetchSource
from .routing import RouteTable
from .session import MetaSession
from .writes import Writer
from .storage import FLUSH_FSYNC, FLUSH_GROUP, FLUSH_INTERVAL, QueueConfig, QueueStore

log = structlog.get_logger("broker")
FLUSH_TICK_S = 0.05
RETENTION_CHECK_S = 30.0


class BrokerNode:
    def __init__(self, config: BrokerConfig, driven: bool = False):
        """``driven``: the node starts no thread of its own. Each part's blocking work runs on the caller's event loop
        instead, inline or as a callback it schedules there, so that a deterministic simulator (ops/sim, issue 36)
        can run a real broker on its one-thread virtual-time loop. Work handed to the loop's executor (to_thread)
        is the loop's to run: the simulator's runs it inline."""
        self.config = config
        self.driven = driven
        self.registry = CollectorRegistry()
        tls_context = client_context(config.tls) if config.tls is not None else None
        self.metrics = BrokerMetrics(self.registry)
        # Before any file of the data directory is touched: what a directory without it holds is taken as lost.
        self.disk, created = disk_identity.load_or_create(config.data_dir)
        qcfg = QueueConfig(flush_policy=_flush_policy(config),
                           flush_interval_ms=config.flush_interval_ms, retention_ms=config.retention_ms,
                           retention_bytes=config.retention_bytes, segment_bytes_max=config.segment_bytes_max,
                           observe_sync_s=self.metrics.fsync.observe)
        self.store = QueueStore(os.path.join(config.data_dir, "queues"), qcfg, driven=driven)
        self.offsets = OffsetStore(os.path.join(config.data_dir, "offsets.log"), driven=driven)
        self.witness = WitnessLog(os.path.join(config.data_dir, WITNESS_FILE))
        self.routes = RouteTable(config.broker)
        self.session = MetaSession()
        self.pop_signals = TopicSignals()
        self.group_settings = GroupSettings()
        self.producer_log = ProducerJournal(os.path.join(config.data_dir, "producers.log"))
        self.peers = Peers(config.token, tls_context)
        self.writer = Writer(config.broker, self.store, self.routes, self.session, self.offsets, self.pop_signals,
                             self.metrics, self.producer_log, self.peers, driven=driven)
        self.locks = LockTable(lambda: self.session.writable(self.routes.version))
        self.link = MetaLink(config.broker, config.url, config.zone, config.meta_urls, config.token, self.routes,
                             self.session, self.writer,
                             Counter("stator_broker_heartbeats_total", "heartbeats sent to meta", registry=self.registry),
                             self.locks, self.group_settings, ssl_context=tls_context, cluster=config.cluster,
                             disk=self.disk)
        self.reader = Reader(config.broker, self.routes, self.writer, self.offsets, self.witness, self.peers,
                             self.link, self.metrics, driven=driven)
        # A head this broker comes to lead takes its queue's commits from the brokers of its older segments
        self.writer.offset_copies.older_commits = self.reader.older_commits
        self.pop = PopService(config.broker, config.data_dir, self.routes, self.reader,
                              lambda: self.session.writable(self.routes.version), self.group_settings,
                              self.pop_signals, driven)
        # A copy joins the in-sync set holding every commit and every pop ack of the queue (replication/offsets.py,
        # replication/pop_copies.py): both gates are asked, so both snapshots start at once
        self.pop_copies = PopCopies(config.broker, self.routes, self.writer.replicas, self.peers)
        self.pop.journal.copies = self.pop_copies
        self.pop_copies.kick = self.pop.journal.kick
        self.pop_copies.untaken = self.pop.copies_untaken
        self.pop.check_copies = self._check_pop_copies
        self.writer.replicas.copy_ready = lambda seg, copy: all(
            [self.writer.offset_copies.ready(seg, copy), self.pop_copies.ready(seg, copy)])
        self.writer.replicas.on_new_follower_epoch = lambda copy: (
            self.writer.offset_copies.forget_copy(copy), self.pop_copies.forget_copy(copy))
        self.registry.register(PopCollector(self.pop))
        self.registry.register(StateCollector(config.data_dir, lambda: self.session.state, self.routes.live_hosted,
                                              self.writer.max_physical))
        self.registry.register(ConsumerLagCollector(config.broker, self.offsets.snapshot, self.routes.segments,
                                                    self.writer.max_physical))
        self.replica_source = FetchSource(config.broker, self.routes, self.writer, driven)   # what followers fetch here
        self.replicator = Replicator(config.broker, self.routes, self.writer, config.token, tls_context,
                                     self.link.peer_down)
        if created:   # said once every store opened: a broker refusing a damaged file says that one line only
            log.info("broker_disk_identity_created", disk=self.disk, data_dir=config.data_dir)
        self.link.on_route_applied = self._route_applied
        self.link.on_route_deleted = self.pop.route_deleted
        self.link.on_registered = lambda: self.replicator.recover(self.link.sealed_copies)
        self.link.on_copies_placed = self.link.on_registered
        self.replicator.on_whole = lambda whole: self._chores.spawn(self.link.copies_held(
            [{"topic": seg.topic, "queue": seg.queue, "gen": seg.gen, "end": end} for seg, end in whole]),
            "report copies held")
        self.barriers = Barriers(self.reader.committed_at_head, self.reader.min_offset)
        self.gate = FencingGate(self.locks, self.barriers, self.routes)   # every fenced read and commit asks it
        self._tasks: list[asyncio.Task] = []
        self._chores = Chores("node_chore_failed")   # reports of sealed copies held whole

    def _check_pop_copies(self, topic: str, queue: int, what: str) -> None:
        head = self.routes.head(topic, queue)
        if head is not None and head.broker == self.config.broker:
            self.writer.replicas.check_writable(head, what)

    def _route_applied(self, topic: str) -> None:
        self._witness(topic)
        self.writer.replicas.route_changed()
        self.writer.offset_copies.route_changed(topic)
        self.writer.producer_handover.route_changed(topic)   # a remap's new head takes the old one's batches
        self.pop_copies.route_changed()
        self.pop.take_over_copies_soon()   # a failover elected this broker: the groups' states it holds as a copy
        self.pop.hint_new_heads(topic)     # the queue moved on from here: its new head takes what is held here
        self.pop.route_applied(topic)      # a queue moved here: a pop waiting on the topic looks again, now
        self.writer.forget_unkept_batches(topic)
        self.replicator.follow(topic)

    def _witness(self, topic: str) -> None:
        """Marks the heads of ``topic`` this broker leads or is an in-sync copy of: this disk holds every commit
        made on them (broker/offset_witness.py). Only from routes that follow its registration: an older one may
        name it in sync from before a lost disk."""
        if not self.session.writable(self.routes.version):
            return
        me = self.config.broker
        route = self.routes.routes.get(topic)
        heads = [self.routes.head(topic, q["queue"]) for q in (route["queues"] if route is not None else ())]
        self.witness.mark((h.topic, h.queue, h.physical_queue) for h in heads
                          if h is not None and h.state == "active" and (h.broker == me or me in h.in_sync))

    async def start(self) -> None:
        await self.peers.start()
        await self.replicator.start()
        await self.link.start()
        self._tasks.append(asyncio.create_task(self.writer.replicas.run(
            self.link.alter_in_sync, lambda: self.session.writable(self.routes.version)), name="in-sync"))
        await self.pop.start()
        if self.config.flush == "interval":
            self._tasks.append(asyncio.create_task(self._flush_loop()))
        if self.config.retention_ms is not None or self.config.retention_bytes is not None:
            self._tasks.append(asyncio.create_task(self._retention_loop()))

    # Both ticks fsync and delete files, so they run in a thread: the store is thread-safe, and on the event loop
    # they would stall every request, now also while waiting for a queue's lock held by an append's roll.
    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_TICK_S)
            try:
                await asyncio.to_thread(self.store.maybe_flush, int(time.time() * 1000))
                await asyncio.to_thread(self.producer_log.sync)
            except Exception:
                log.exception("flush_failed")  # that queue is marked failed and refuses writes; others go on

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(RETENTION_CHECK_S)
            try:
                deleted = await asyncio.to_thread(self.store.apply_retention, int(time.time() * 1000))
                if deleted:
                    log.info("retention_deleted_files", files=deleted)
            except Exception:
                log.exception("retention_failed")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._chores.cancel_all()
        await self.pop.stop()
        self.writer.offset_copies.stop()
        await self.link.stop()
        await self.replicator.stop()
        self.replica_source.stop()
        await self.peers.stop()
        self.reader.stop()
        self.writer.stop()
        # The producers' lines first: a queue closed cleanly is not walked again at the next start, so a line lost
        # after it would leave its batch known by neither (writes.py ``_recovered``)
        self.producer_log.close()
        self.store.close()
        self.offsets.close()
        self.witness.close()


def _flush_policy(config: BrokerConfig) -> str:
    if config.flush == FLUSH_INTERVAL:
        return FLUSH_INTERVAL
    return FLUSH_GROUP if config.sync_scope == SYNC_SCOPE_FILESYSTEM else FLUSH_FSYNC
