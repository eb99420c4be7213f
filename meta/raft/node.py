"""The thin pysyncobj adapter: propose, commit, apply, answer.

The driver loop. pysyncobj's tick runs on the node's event loop, between its other callbacks (``loop_ticker``: a
proposal, a ready socket or a timer asks for one; a watchdog thread ticks while the loop is held elsewhere):
  1. ``propose`` (asyncio) encodes an envelope as JSON bytes and queues it (never a pickled object: the envelope is
     data the state machine validates; ``pysyncobj_shim.CommandsAsBytes``).
  2. The next tick puts every queued proposal of this node into one log entry under the leader's stamp (its time
     and settings; ``entry``, ``proposals``) and hands it to pysyncobj, which replicates it; once a
     majority has it, pysyncobj's apply hook queues it for the apply thread (``applier``).
  3. The apply thread runs the pure state machine on each envelope of the entry under ``image_lock`` (readers on
     the asyncio thread take the same lock, so they never see half of a command) and posts the changed topics to
     the event loop; a small entry of cheap commands is applied by the tick itself (``INLINE_APPLY``).
  4. Each proposer's callback gets its own outcome and is hopped to the event loop, batched (``LoopBridge``).

The replicated state is one attribute, ``image_data`` (plain data). A snapshot is that image written as JSON by
``snapshot_file`` (never pysyncobj's pickle of the object's attributes); every other attribute is set before
``SyncObj.__init__`` so that pysyncobj counts it as local, and what changes later lives in ``_LocalState``.
The bytes are Stator's: the journal (``journal``: checksummed records, group-committed fdatasync, compaction by
rename) and the transport (``transport``: our framing, AES-GCM under keys derived from the cluster secret, one
frame per peer per tick). pysyncobj decides: elections, replication, the commit index.
Everything that reaches into pysyncobj's internals goes through ``pysyncobj_shim``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf

from wire import disk_identity
from .. import limits
from . import pysyncobj_shim as shim
from wire.errors import ApiError, rejection
from wire.waits import result_within
from ..image import Image, restoring_pairs
from .applier import DISCARDED, INLINE_ENTRIES_MAX, Applier, Pending
from .entry import ENTRY_BYTES_MAX, decode_entry, encode_entry, encode_envelope, encode_stamp, restamped
from .group_commit import GroupCommit
from .housekeeping import Housekeeping
from .journal import FORMAT_VERSION as JOURNAL_FORMAT_VERSION
from .journal import JOURNAL_FILE, JournalFormatError, StatorJournal, journal_io
from .local_commit import LocalCommit, caught_up
from .loop_ticker import LoopPoller, LoopTicker
from .prevote import PreVote, PreVoteCounts
from .read_index import ReadIndex, ReadIndexCounts
from .proposals import Proposals, batch_callback
from .membership import from_image as members_of_image
from .roles import Roles
from .transport import RaftLink, StatorTransport
from .snapshot_file import BackgroundWriter, SnapshotFormatError, WriterState, sync_file
from .snapshot_file import read as read_snapshot
from ..state_machine import StateMachine

log = structlog.get_logger("meta.raft")

# Fail reasons after which the command was certainly not applied: safe to retry as is.
NOT_APPLIED = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.DISCARDED, FAIL_REASON.NOT_LEADER,
               FAIL_REASON.REQUEST_DENIED}
# After these the command may or may not have been applied: retry with the same request id (idempotent).
MAYBE_APPLIED = {FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME}


@dataclass(frozen=True)
class RaftTuning:
    """Timeouts for a metadata service on a LAN: fail over well under a second, step down fast when cut off."""
    election_timeout_min_s: float = 0.25
    election_timeout_max_s: float = 0.5
    append_entries_period_s: float = 0.05
    # A leader that heard no majority for this long steps down (pysyncobj's leaderFallbackTimeout, 30 s by default).
    # At most the election timeout: by then the others may have elected a new leader, and until it steps down a
    # cut-off leader still answers group heartbeats from its own image. A tick held longer than this (a follower
    # applying a huge command) would cause an election anyway, so it costs no stability the election timeout keeps.
    leader_fallback_timeout_s: float = 0.5
    connection_timeout_s: float = 5.0
    connection_retry_s: float = 0.3
    compaction_min_entries: int = 20_000
    compaction_min_time_s: int = 300
    commands_queue_max: int = 50_000
    # Under load a proposal waits up to propose_coalesce_s for others before it wakes the tick, so that one entry
    # carries more of them (one append, sync, acknowledgement and apply pass for more writes): only while this node's
    # last entry of its own carried at least propose_coalesce_min proposals. A lone writer's entries carry one, so
    # it never waits; a tick that runs meanwhile (a message, the timer) takes what is queued at once. 0 turns it off.
    # 64 writers on a 2-core VM, off then on (1.5 ms) in turn: 8 -> 12 proposals an entry, CPU a write lower by 1-15%
    # in each of four pairs.
    propose_coalesce_s: float = 0.0015
    propose_coalesce_min: int = 4
    # A leader sends its snapshot to a follower behind its log this many bytes per heartbeat period (pysyncobj's
    # logCompactionBatchSize, 64 KiB by default: 1.3 MB/s, so a 10,000,000-queue snapshot of ~100 MB took over a
    # minute: a follower behind a leader that compacts more often than that never catches up).
    snapshot_chunk_bytes: int = 1024 * 1024
    # "fsync": a node fdatasyncs its journal before it acknowledges entries to the leader and before it counts
    # itself, as leader, toward their commit (group commit, one sync per tick); "none": written, never synced.
    journal_sync: str = "fsync"
    # "os": the journal's writes go to the OS at once; "memory_until_sync" (tests): they stay in the process until
    # the next sync, so a kill -9 loses what a power loss would (meta/raft/journal.py).
    journal_io: str = "os"


# Commands that add thousands of long-lived objects to the image (see MetaSyncObj._freeze_image).
LARGE_COMMANDS = frozenset({"CreateTopic", "GrowTopic"})
# Commands whose apply costs about as much as decoding them (one topic's or group's record, one segment, one broker),
# whatever the image's size: an entry of these alone, up to INLINE_APPLY_BYTES_MAX, is applied on the tick
# (meta/raft/applier.py). Every other kind (creations, deletions, remaps, drains, expiries: work that grows with the
# topic or the cluster) keeps the apply thread, so that a tick never waits behind it.
INLINE_APPLY = frozenset({"SetTopicConfig", "SetGroupConfig", "GrantOffsetBudget", "JoinGroup", "LeaveGroup",
                          "RegisterBroker", "SealSegment", "AlterInSync", "Barrier"})
INLINE_APPLY_BYTES_MAX = 16 * 1024


class _Decoded(NamedTuple):
    """A committed entry on its way to apply: its payload, and its envelopes if the tick decoded them."""
    payload: bytes | None
    envelopes: list[Any] | None


class LoopBridge:
    """Hops work from the tick (on the loop, or the watchdog thread) and the apply thread to the event loop, once per
    tick rather than once per callback.

    Every ``call_soon_threadsafe`` writes to the loop's self-pipe; under load a tick resolves dozens of proposals
    and notifications, so they are queued here and run in one hop at the end of the tick (``flush``).
    """

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None   # the loop's thread: a flush there needs no wake-up of the loop
        self._pending: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._lock = threading.Lock()

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._pending.append((fn, args))

    def flush(self) -> None:
        with self._lock:
            if not self._pending or self.loop is None:
                return
            batch, self._pending = self._pending, []
        if self.loop_thread == threading.get_ident():
            # The tick, on the loop: run them now. Through call_soon they ran after the tick that the loop queues
            # behind this one (LoopTicker: the last poll read something), and the futures they resolve woke their
            # writers later still: a 1-client write's answer waited for a whole tick more.
            _run_all(batch)
            return
        try:
            self.loop.call_soon_threadsafe(_run_all, batch)
        except RuntimeError:  # the loop is closed: the node is stopping
            pass


def _run_all(batch: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    for fn, args in batch:
        try:
            fn(*args)
        except Exception:   # one failing callback must not cost the others theirs, nor fail the tick it runs in
            log.exception("raft_loop_callback_failed", callback=getattr(fn, "__qualname__", repr(fn)))


class ProposeFailed(ApiError):
    status = 503


SNAPSHOT_FILE = "raft.snapshot"
PYSYNCOBJ_JOURNAL_FILE = "raft.journal"   # Stator 0.1's journal (pysyncobj's format): refused by name
# pysyncobj's append messages carry entries up to this many bytes; an entry of at least this size would be sent in
# pieces, which pysyncobj gets wrong for some sizes (pysyncobj_shim._append_as_raft): above the largest entry.
APPEND_BATCH_BYTES = ENTRY_BYTES_MAX + 1
RAFT_BIND_ATTEMPTS_MAX = 10   # x bindRetryTime 0.2 s: a taken raft port stops the node in ~2 s, not a busy loop forever
SLOW_TICK_S = 0.25   # the shortest election timeout: a tick longer than this can cost the cluster its leader
RESTART_ELECTION_GRACE_S = 1.5
LEADERSHIP_CHECK_S = 0.05    # a leader waiting for its apply looks this often whether it still leads
TICK_PERIOD_S = 0.05   # the tick's timer: heartbeats, elections and timeouts are looked at at least this often
_ROLES = {0: "follower", 1: "candidate", 2: "leader"}  # pysyncobj's _RAFT_STATE
SNAPSHOT_KINDS = ("written", "installed", "superseded")
EXIT_REPLICA_UNTRUSTED = 70  # this replica's image cannot be trusted: stop rather than serve or spread it


@dataclass
class _LocalState:
    """What a node changes while it runs, besides the image. One object, created before ``SyncObj.__init__``:
    pysyncobj counts it as local, whatever fields change later."""
    pipe: Any = None              # pysyncobj's pipe notifier: a thread other than the loop's asks for a tick
    sent_index: int = 0           # last log index and commit index sent to the followers
    sent_commit: int = 0
    wake_pending: bool = False
    coalesce_s: float = 0.0       # RaftTuning.propose_coalesce_s and _min
    coalesce_min: int = 0
    last_batch: int = 0           # proposals in this node's last entry of its own
    wakes_deferred: int = 0       # proposals that asked for the tick after coalesce_s, not at once
    forwarded_at_once: int = 0    # times a follower sent its proposals to the leader between ticks
    appended_at_once: int = 0     # times a lightly loaded leader appended and sent entries ahead of its tick's order
    forward_arrived: bool = False   # the leader queued a follower's forwarded proposals since its last tick began
    freeze_pending: bool = True   # the image restored from a snapshot or journal at start-up
    last_keepalive: float = 0.0   # monotonic
    slow_ticks: int = 0           # ticks longer than SLOW_TICK_S, waits included
    installed_through: int = 0    # a snapshot's last index: the image holds every entry up to it already
    snapshot_queued: bool = False     # the snapshot writer waits on the apply thread for its index
    snapshot_start_failed: bool = False
    role_changes: dict[str, int] = field(default_factory=dict)   # times this node became leader/follower/candidate
    # snapshots this node wrote itself, installed from the leader, and wrote only to drop (an install was newer)
    snapshots: collections.Counter[str] = field(default_factory=collections.Counter)
    observe_apply_s: Callable[[float], None] | None = None       # apply latency, for metrics (set by the service)
    journal: GroupCommit | None = None        # group commit of the journal (journal_sync)
    transport: StatorTransport | None = None
    held: shim.HeldEntries | None = None      # appends that repeated held entries (pysyncobj_shim.py)
    notice: shim.CommitNotice = field(default_factory=shim.CommitNotice)   # a commit notice is being handled
    # The leader's stamp (its clock and settings) for the next entry (RaftNode.leader_fields); None: unstamped.
    stamp: Callable[[], dict[str, Any]] | None = None
    roles: Roles | None = None    # voter or learner, and the leader's membership changes (meta/raft/roles.py)
    prevote: PreVote | None = None   # no campaign without a majority's pre-vote (meta/raft/prevote.py)
    read_index: ReadIndex | None = None   # linearizable reads without a log entry (meta/raft/read_index.py)
    local_commit: LocalCommit | None = None   # followers commit on the leader's mark (meta/raft/local_commit.py)
    leader_seen: Any = None       # the leader this node knew at the end of the last tick (pysyncobj's Node)
    caught_up: bool = False       # isReady once true


class MetaSyncObj(shim.CommandsAsBytes, shim.Acknowledgements, shim.CompactionChecks, SyncObj):
    def __init__(self, self_raft: str, partners: list[str], data_dir: str, secret: str, tuning: RaftTuning,
                 on_applied: Callable[[int, set[str] | None], None], bridge: LoopBridge,
                 link: RaftLink | None = None, names: dict[str, str] | None = None,
                 urls: dict[str, str] | None = None):
        """``link``: how the raft port talks (mutual TLS or not); by default under ``secret`` alone. ``names``: the
        node name of each raft address of the config (this node's and its partners'), ``urls``: the HTTP URL of each
        node name, as the membership records them (meta/raft/roles.py); by default the raft addresses, none."""
        # Local, non-replicated attributes: set before SyncObj.__init__ so pysyncobj leaves them out of snapshots.
        self.image_lock = threading.RLock()
        self.compaction_checks = Housekeeping()   # shim.CompactionChecks
        # What the image's window trims, kept for this node's projection (meta/image.py, trimmed_to).
        self.trimmed: deque[tuple[int, str]] = deque(maxlen=limits.HISTORY_TRIMMED_KEPT_EVENTS_MAX)
        self._machine = StateMachine(Image())
        self._machine.image.trimmed_to = self.trimmed
        self._on_applied = on_applied
        self.bridge = bridge
        self.commands_queue_max = tuning.commands_queue_max
        self._local = _LocalState(coalesce_s=tuning.propose_coalesce_s, coalesce_min=tuning.propose_coalesce_min)
        self._applier = Applier(self._apply_entry, bridge.flush)
        self._proposals = Proposals(tuning.commands_queue_max)
        os.makedirs(data_dir, exist_ok=True)
        snapshot_path = os.path.join(data_dir, SNAPSHOT_FILE)
        old_journal = os.path.join(data_dir, PYSYNCOBJ_JOURNAL_FILE)
        if os.path.exists(old_journal):
            # Stator 0.1 kept pysyncobj's journal: starting beside it on an empty log of ours would drop what this node
            # acknowledged. There is no conversion (no deployed clusters): the node must rejoin from a peer.
            raise JournalFormatError(old_journal, "pysyncobj's journal of Stator 0.1",
                                     f"{JOURNAL_FILE}.<seq> segments (STATOR-RAFT-LOG version {JOURNAL_FORMAT_VERSION}) only")
        # Before the journal: a directory whose identity file is gone is a new disk, whatever else it holds.
        disk, created = disk_identity.load_or_create(data_dir)
        names = {address: address for address in [self_raft, *partners]} | dict(names or {})
        self._local.roles = Roles(self, names[self_raft], names, dict(urls or {}), disk)
        if created:
            log.info("raft_disk_identity_created", disk=disk, data_dir=data_dir)
        # Checked whole before pysyncobj reads a single entry: a damaged record stops the node naming file and offset.
        journal = StatorJournal(data_dir, journal_io(tuning.journal_io))
        self._snapshots = BackgroundWriter(snapshot_path)
        conf = SyncObjConf(
            journalFile=os.path.join(data_dir, JOURNAL_FILE),   # pysyncobj asks createJournal, the shim answers ours
            appendEntriesBatchSizeBytes=APPEND_BATCH_BYTES,
            fullDumpFile=snapshot_path,
            serializer=self._write_snapshot,
            serializeChecker=self._snapshot_progress,
            deserializer=self._read_snapshot,
            raftMinTimeout=tuning.election_timeout_min_s,
            raftMaxTimeout=tuning.election_timeout_max_s,
            appendEntriesPeriod=tuning.append_entries_period_s,
            leaderFallbackTimeout=tuning.leader_fallback_timeout_s,
            connectionTimeout=tuning.connection_timeout_s,
            connectionRetryTime=tuning.connection_retry_s,
            logCompactionMinEntries=tuning.compaction_min_entries,
            logCompactionMinTime=tuning.compaction_min_time_s,
            logCompactionBatchSize=tuning.snapshot_chunk_bytes,
            # Each node compacts in its own time window: three snapshot writers at once starve two cores.
            logCompactionSplit=True,
            commandsQueueSize=tuning.commands_queue_max,
            appendEntriesUseBatch=False,  # p50 of one write ~2 ms instead of ~100 ms (DEPENDENCIES.md)
            dynamicMembershipChange=False,
            bindRetryTime=0.2,
            maxBindRetries=RAFT_BIND_ATTEMPTS_MAX,  # then pysyncobj raises and the node exits naming the address
            autoTick=False,  # our own ticker starts only once image_data exists (see start())
            onStateChanged=self._log_state_change,
        )
        self._poller = LoopPoller()
        # The tick's driver once started (meta/raft/loop_ticker.py); the simulator puts its own stand-in here.
        self._ticker: Any = None
        with shim.journal_and_poller_of_our_own(journal, self._poller):
            super().__init__(self_raft, partners, conf,
                             transportClass=functools.partial(StatorTransport, link or RaftLink(secret=secret)))
        # A repeated append must not take back entries; keepalives, learners' progress, (to a learner) vote
        # requests, pre-votes, vote requests in lease and the read index's messages are ours to handle.
        roles = self._local.roles
        prevote = self._local.prevote = PreVote(self, self_raft, lambda: roles.voter)
        reads = self._local.read_index = ReadIndex(self, self._applier.submit_call, self.wake, self.commit_bound)
        self._local.held = shim.keep_matching_entries(self, lambda node, m: roles.admit(node, m)
                                                      and prevote.admit(node, m) and reads.admit(node, m)
                                                      and self._local.local_commit.admit(node, m),
                                                      self._local.notice)
        # Replicated state: the only attribute a snapshot holds.
        self.image_data = self._machine.image.data
        self._local.journal = GroupCommit(shim.journal_of(self), tuning.journal_sync == "fsync")
        self._local.transport = shim.transport(self)
        self._local.transport.set_before_flush(self._local.journal.before_flush, self._local.journal.sent)
        self._local.local_commit = LocalCommit(self, self._local.journal, lambda: roles.voter)
        shim.load_snapshot_before_any_apply(self)
        # Bound to the restored image now, before anyone reads: a later rebind tells every reader that everything
        # changed (a snapshot installed from the leader), and at start-up that made the route warmer render every
        # big route twice (at 10,000,000 queues, ~45 s more before a restarted node's reads were warm).
        self._machine.image = Image(self.image_data)
        self._machine.image.trimmed_to = self.trimmed
        self._batch_appends(conf)

    # -- one append message per tick ---------------------------------------------------------------------------
    # pysyncobj offers two modes: batching (entries wait for the next 50 ms period: slow single writes) or one
    # append message per command to every follower (each pickled and encrypted: CPU-bound under load). We take
    # the middle: a command wakes the tick at once (pipe notifier), the tick appends every queued command
    # to the log, and one message per follower carries them all. This relies on pysyncobj's internals (through
    # the shim, pinned to one version).
    def _batch_appends(self, conf: SyncObjConf) -> None:
        self._local.pipe = shim.pipe_notifier(self)  # created only with appendEntriesUseBatch=False
        conf.appendEntriesUseBatch = True             # no send per command inside the tick...
        self.addOnTickCallback(self._send_new_entries)  # ...one send per tick instead
        self.addOnTickCallback(self._local.transport.flush)   # one frame per peer with all of it
        self._local.transport.flush_on_tick = False            # (the transport's own tick flush came first)
        # Cheap committed entries, once the commit index left: their answers reach the loop while the leader syncs.
        self.addOnTickCallback(functools.partial(self._applier.run_inline, self.image_lock))
        # The leader's disk works while the followers' do, and they learn at once when it is done
        self.addOnTickCallback(self._leader_sync_and_mark)
        self.addOnTickCallback(self.bridge.flush)
        self.addOnTickCallback(self._freeze_image)
        self.addOnTickCallback(self._keep_links_alive)
        self.addOnTickCallback(self._local.roles.leader_tick)
        if self.raftCurrentTerm > 0:
            # A node restarting on its own data must not stand for election before it could hear the leader:
            # pysyncobj has no pre-vote, so its higher term would depose a healthy leader (one more election).
            shim.postpone_election(self, RESTART_ELECTION_GRACE_S)

    def _keep_links_alive(self) -> None:
        # pysyncobj drops a connection that has read nothing for connectionTimeout, and two followers never talk
        # until an election: their link was down much of the time, so the first candidate's vote request was lost
        # and every failover took a second election. A small message now and then keeps every link up.
        # Each one also says which disk this node runs on and whether its log is empty (meta/raft/roles.py).
        keepalive = self._local.roles.keepalive()
        if keepalive is not None:
            for node in self.otherNodes | self.readonlyNodes:
                shim.send_message(self, node, keepalive)

    def isReady(self) -> bool:  # noqa: N802 - pysyncobj's name
        """Caught up with the leader's commit index as this node heard of it (local_commit.caught_up); once true,
        stays true, as pysyncobj's own."""
        if not self._local.caught_up:
            self._local.caught_up = caught_up(super().isReady(), self.raftLastApplied, shim.leader_commit_heard(self))
        return self._local.caught_up

    def acknowledge(self, node: Any, next_index: int, reset: bool, success: bool) -> bool:
        if success and not reset and self._local.notice.handling:
            return True   # a commit notice taken: the leader knows this node holds its log (shim.send_commit_notice)
        return self._local.roles.acknowledge(node, next_index, reset, success)

    def wake(self) -> None:
        """Any thread: run the next tick now (on the event loop's own thread, without a write to the pipe)."""
        ticker = self._ticker
        if isinstance(ticker, LoopTicker) and ticker.on_loop_thread():
            ticker.soon()
        elif self._local.pipe is not None:
            self._local.pipe.notify()

    def stamp_bytes(self) -> bytes:
        """The stamp line of the next entry: the leader's clock and settings (meta/raft/entry.py)."""
        return self._stamp()

    def _log_state_change(self, old: int, new: int) -> None:
        # Elections are the first thing to look at when latency jumps: every change of role is a log line.
        role = str(_ROLES.get(new, new))
        self._local.role_changes[role] = self._local.role_changes.get(role, 0) + 1
        log.info("raft_role_changed", old=_ROLES.get(old, old), new=_ROLES.get(new, new),
                 leader=self.leader_address())

    def _freeze_image(self) -> None:
        # A million logic queues are millions of long-lived dicts; a full cyclic GC over them holds the interpreter
        # for hundreds of milliseconds, long enough to miss heartbeats and trigger elections. The image is acyclic
        # (freed by reference counting alone), so after a command that added many objects we move everything
        # alive to the permanent generation, out of the collector's reach. Whatever else is alive at that instant
        # (a few request objects of the event loop) is frozen too; topic creations are rare admin calls, so the
        # cyclic garbage this can pin stays small and bounded.
        if self._local.freeze_pending:
            self._local.freeze_pending = False
            gc.freeze()

    # -- proposals: one entry per node per tick (meta/raft/proposals.py) ---------------------------------------
    def propose(self, envelope: bytes, callback: Callable[[Any, int], None]) -> None:
        """Event loop: queue one proposal's envelope for the next tick's entry; ``callback(outcome, err)`` fires
        on the tick or apply thread."""
        if not self._proposals.add(envelope, callback):
            callback(None, FAIL_REASON.QUEUE_FULL)
            return
        # One wake-up per tick is enough: the tick takes every waiting proposal. The flag is cleared before taking,
        # so a proposal queued after that point always wakes the next tick.
        local = self._local
        if local.pipe is not None and not local.wake_pending:
            local.wake_pending = True
            if local.coalesce_s > 0 and not self._lightly_loaded() and isinstance(self._ticker, LoopTicker):
                local.wakes_deferred += 1
                self._ticker.wake_after(local.coalesce_s)
            elif not self._send_at_once():
                self.wake()

    def _lightly_loaded(self) -> bool:
        """The node's last entry of its own carried fewer than propose_coalesce_min proposals: a lone writer's
        carry one. Under load its proposals wait to coalesce, and the leader keeps its tick's order."""
        return self._local.last_batch < self._local.coalesce_min

    def _send_at_once(self) -> bool:
        """Event loop: a node with nothing of its own in flight sends the proposals on now, between two ticks,
        rather than from the tick it would wake: that tick's scheduling and its work before the send were ~100 us
        of a write at one writer. A follower forwards them to its leader; a leader appends them, sends them to its
        followers, syncs and marks (``_append_at_once``). With entries of its own in flight (a load) proposals wait
        for the tick, which packs them into one entry: sent one by one as they came, each would be an entry."""
        ticker = self._ticker
        return isinstance(ticker, LoopTicker) and ticker.on_loop_thread() and ticker.between_ticks(self._send_if_idle)

    def _send_if_idle(self) -> bool:   # holding the tick's lock: pysyncobj's state is read and changed here
        # The only voter commits on its own sync (LocalCommit.commit_alone), so nothing of its own is ever in flight
        # for long: sent at once, every proposal of a load would take a sync of its own. Its tick, after the loop's
        # other callbacks, packs what they proposed into one entry and one sync.
        if shim.proposals_in_flight(self) or (shim.is_leader(self) and not shim.voters(self)):
            return False
        if shim.is_leader(self):
            self._append_at_once()
            self._leader_sync_and_mark()
            return True
        if shim.leader(self) is None:
            return False
        self._checkCommandsToApply()
        self._local.transport.flush()
        self._local.forwarded_at_once += 1
        return True

    def _append_forwarded_at_once(self) -> None:
        """The tick, right after its first poll: a lightly loaded leader that read a follower's forwarded proposals
        appends and sends them now, and syncs and marks them next (``_onTick``), rather than after the rest of
        pysyncobj's tick (~100 us from the forward's arrival to the append's send at one writer, 130 more to the
        mark). Only a leader with none of its own proposals waiting or in flight, whose last entry of its own carried
        fewer than propose_coalesce_min: otherwise the tick's order is kept, and its own proposals, which may wait
        to coalesce, join the forwarded ones in one entry and one sync (taken early, they cost a 64-writer load 1-3%
        more CPU a write, toggled inside one cluster)."""
        local = self._local
        if local.forward_arrived:
            local.forward_arrived = False
            if (shim.is_leader(self) and self._lightly_loaded() and not len(self._proposals)
                    and not shim.proposals_in_flight(self)):
                self._append_at_once()

    def _append_at_once(self) -> None:   # the leader, holding the tick's lock
        self._checkCommandsToApply()
        self._send_new_entries()
        self._local.transport.flush()
        self._local.appended_at_once += 1

    def _checkCommandsToApply(self):
        self._local.wake_pending = False
        batches = self._proposals.take()
        if batches:
            self._local.last_batch = sum(len(batch.envelopes) for batch in batches)
            stamp = self._stamp() if self.is_leader() else encode_stamp({})
            for batch in batches:
                shim.propose(self, encode_entry(stamp, batch.envelopes),
                             batch_callback(batch.callbacks, self._applier.lock))
        super()._checkCommandsToApply()

    def _applyCommand(self, command, callback, commandType=None):
        # Our own entries (shim.propose) and, on the leader, the entries a follower forwarded (pysyncobj's
        # apply_command message, with a ``(node, request id)`` callback).
        forwarded = commandType is None and shim.is_forwarded(callback)
        if forwarded:
            command = self._stamped(command)
        if not isinstance(command, bytes) or len(command) > ENTRY_BYTES_MAX:
            # Never from an entry of ours (batches stay within the bound); an entry past the append batch would be
            # sent in pieces, which stalls the log (APPEND_BATCH_BYTES).
            shim.refuse_command(self, callback)
            return
        super()._applyCommand(command, callback, commandType)
        if forwarded:
            self._local.forward_arrived = True   # appended at once after this poll (_append_forwarded_at_once)

    def _stamp(self) -> bytes:
        stamp = self._local.stamp
        return encode_stamp(stamp() if stamp is not None else {})

    def _stamped(self, command: Any) -> Any:
        # A follower's entry carries an empty stamp; only the leader's clock and settings may enter the log, so the
        # leader stamps its own over the first line before appending it, as if it had been proposed here. An entry
        # it cannot read goes to the log unchanged (apply rejects it, the same way on every replica).
        payload = shim.envelope_bytes(command)
        if self._local.stamp is None or payload is None or not self.is_leader():
            return command
        stamped = restamped(payload, self._stamp())
        return command if stamped is None else shim.with_envelope(stamped)

    def set_stamp(self, stamp: Callable[[], dict[str, Any]]) -> None:
        self._local.stamp = stamp

    def _onTick(self, timeToWait=0.0):
        # pysyncobj judges the leader dead at the start of a tick, before it reads the messages that arrived
        # meanwhile. After a long tick (a follower applying a batch of large entries) the leader's heartbeats are
        # already waiting in the socket: read them first, so being busy is never mistaken for a dead leader.
        self._local.roles.decide()
        if self._ticker is not None:
            shim.poll_sockets(self)
            self._append_forwarded_at_once()
            self._local.transport.flush()   # what answering them queued (a follower's acknowledgements)
            self._local.local_commit.advance()   # once they left: what the leader's mark and this disk both hold
        # The leader counts itself toward the commit of every entry in its journal at the start of the tick: what
        # was appended since the last sync (a new term's no-op, read from the sockets; forwarded proposals appended
        # at once) is synced first, and its voters hear of it at once.
        journal = self._local.journal
        self._leader_sync_and_mark()
        was_leader, synced, commit = shim.is_leader(self), journal.synced_index, self.raftCommitIndex
        self._local.prevote.tick()   # a pre-vote first, where pysyncobj would campaign
        super()._onTick(timeToWait)
        self._apply_marked()
        self._local.read_index.tick()   # after pysyncobj's: the entries it committed are handed over
        # The tick ends in a poll that handled what arrived: its answers leave now, not a tick later.
        self._local.transport.flush()
        if was_leader and shim.is_leader(self) and self.raftCommitIndex > commit:
            journal.check_commit(self.raftCommitIndex, synced)
        self._answer_in_flight_on_leader_change()

    def _follow_up_tick(self) -> bool:
        """Whether a tick whose last poll read something needs another tick at once (LoopTicker). The leader does:
        its commit index moves only at a tick's start. A follower of a known leader has acted on what it read
        within the tick: its acknowledgements leave with the tick's last flush, a mark's entries are applied by
        ``_apply_marked``, a read index by ``read_index.tick``; a tick more found nothing to do but cost a third of
        a follower's ticks at one writer (1-2% of its writes a second, toggled inside one cluster). A node without
        a leader (a candidate counting votes) keeps it."""
        return shim.is_leader(self) or shim.leader(self) is None

    def _apply_marked(self) -> None:
        """pysyncobj's tick ends in a poll: on a follower, a leader's mark read there commits entries (LocalCommit)
        that pysyncobj would apply at the next tick's start, after the callbacks of this one (run_inline among
        them) and that tick's own start, ~35-70 us later on a follower-entered write: applied, and answered, now."""
        if shim.is_leader(self) or self.raftCommitIndex <= self.raftLastApplied:
            return
        self._apply_committed_now()

    def _apply_committed_now(self) -> None:
        """What the commit index covers, applied (the cheap entries on this tick) and answered now, not at the next
        tick's start, where pysyncobj would."""
        shim.apply_committed(self)
        self._applier.run_inline(self.image_lock)
        self.bridge.flush()

    def _answer_in_flight_on_leader_change(self) -> None:
        # A proposal in flight when the leader this node knows changes (itself stepping down included) is answered
        # now, not at its timeout: a leader that stepped down with entries appended and nothing written after left
        # its proposer waiting 5 s for UNKNOWN_OUTCOME (a 2 MiB entry at the end of tests/test_raft_entry_sizes.py).
        leader = shim.leader(self)
        if leader != self._local.leader_seen:
            if self._local.leader_seen is not None:
                shim.answer_in_flight(self)
            self._local.leader_seen = leader

    def _leader_sync_and_mark(self) -> None:
        """The leader's group commit, then its voters learn how far its journal is durable (LocalCommit). A follower
        syncs only before it acknowledges (GroupCommit.before_flush), which is all Raft asks of it. Syncing on every
        tick too cost fdatasyncs of entries no acknowledgement needed yet, and hid a follower that acknowledged before
        its sync from every test and from the chaos runner's power losses (its entries were on disk a tick later)."""
        if shim.is_leader(self):
            self._local.journal.sync()
            self._local.local_commit.send_mark()
            # The only voter is a majority by its own sync: what it covered is committed (LocalCommit.commit_alone)
            if self._local.local_commit.commit_alone():
                self._apply_committed_now()

    def _send_new_entries(self) -> None:
        local = self._local
        if not shim.is_leader(self):
            local.sent_index = local.sent_commit = 0
            return
        last = shim.current_log_index(self)
        commit = self.raftCommitIndex
        # New entries, or a commit index the followers have not heard of yet: without the latter a follower would
        # apply (and answer a read-your-write) only at the next heartbeat, up to a period later.
        if last > local.sent_index or commit > local.sent_commit:
            entries = last > local.sent_index
            local.sent_index, local.sent_commit = last, commit
            if entries and self._lightly_loaded():
                # The disk works on them while they are encoded and sent. Not under load: the call held the loop
                # 15-70 us a tick there (the device's doorbell), where the loop's time is what limits the writes.
                local.journal.start_writeback()
            if entries or not shim.send_commit_notice(self, voters_too=not self._local.local_commit.marking()):
                shim.send_append_entries(self)

    # -- snapshots: pysyncobj's serializer hooks, all called on the tick ------------------------------------
    def _write_snapshot(self, rename_source: str, raft: tuple[Any, ...]) -> None:
        # pysyncobj renames rename_source over the snapshot as soon as this returns (see the shim); a stale file
        # of that name from an older run would be taken for the new snapshot, so it must not exist.
        with contextlib.suppress(FileNotFoundError):
            os.remove(rename_source)
        # pysyncobj asks for the image at its last applied entry, which is queued on the apply thread: the writer
        # forks from there, right after that entry (the image is then exactly the one at it).
        self._local.snapshot_queued = True
        self._applier.submit_call(lambda: self._start_snapshot(raft))

    def _start_snapshot(self, raft: tuple[Any, ...]) -> None:
        """Apply thread, right after the snapshot's last entry was applied."""
        try:
            with self.image_lock:
                if not self._snapshots.start(shim.snapshot_of(self.image_data, raft)):
                    self._local.snapshot_start_failed = True
                    log.warning("raft_snapshot_not_started", path=self._snapshots.path)
        finally:
            self._local.snapshot_queued = False   # after start() set the writer's pid: poll sees WRITING or done

    def _snapshot_progress(self) -> int:
        if self._local.snapshot_queued:
            return shim.serializer_state(WriterState.WRITING)
        if self._local.snapshot_start_failed:
            self._local.snapshot_start_failed = False
            return shim.serializer_state(WriterState.FAILED)
        superseded = self._snapshots.superseded
        state = self._snapshots.poll()
        if state is WriterState.DONE:
            self._local.snapshots["written"] += 1
            log.info("raft_snapshot_written", index=self._snapshots.on_disk_index)
        elif self._snapshots.superseded > superseded:
            self._local.snapshots["superseded"] += 1
            log.info("raft_snapshot_superseded", installed=self._snapshots.on_disk_index)
        return shim.serializer_state(state)

    def _read_snapshot(self, path: str) -> tuple[Any, ...]:
        try:
            snapshot = read_snapshot(path, restoring_pairs)
        except (OSError, SnapshotFormatError):
            # Going on would leave the image empty while the log resumes after the snapshot: a diverged replica.
            log.critical("raft_snapshot_unreadable", path=path, exc_info=True)
            os._exit(EXIT_REPLICA_UNTRUSTED)
        # Installed from the leader, the file was renamed into place unsynced; pysyncobj cuts the journal (durably,
        # by rename) right after this returns, so the snapshot that replaces those entries must be on disk first.
        sync_file(path)
        self._snapshots.note_on_disk(snapshot.last_applied.index)   # an older write in flight is dropped, not renamed
        # Entries the snapshot covers that still wait on the apply thread must not be applied on top of it.
        self._applier.discard_through(snapshot.last_applied.index)
        if self._ticker is not None:   # not the start-up load: the leader's snapshot, just received
            self._local.snapshots["installed"] += 1
            log.info("raft_snapshot_installed", index=snapshot.last_applied.index)
        if shim.finish_interrupted_compaction(self, snapshot):
            log.warning("raft_compaction_finished_on_start", path=path, journal_starts_at=snapshot.previous.index)
        with self.image_lock:
            self.image_data = snapshot.image
            self._local.installed_through = snapshot.last_applied.index
        # The voters as of the snapshot's index: the journal's membership entries before it are gone with it.
        shim.journal_of(self).membership.set_base(snapshot.last_applied.index, members_of_image(snapshot.image.get("members")))
        self._local.freeze_pending = True
        return shim.raft_state_of(snapshot)

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """On ``loop``'s thread (by default the running loop): the apply thread starts, and the tick runs on the
        loop (meta/raft/loop_ticker.py)."""
        loop = loop or asyncio.get_running_loop()
        self._applier.start()
        self.bridge.loop_thread = threading.get_ident()
        ticker = LoopTicker(self._tick_once, self._poller, TICK_PERIOD_S, follow_up=self._follow_up_tick)
        self._ticker = ticker
        ticker.start(loop)

    def _tick_once(self) -> bool:
        """One tick; False if it raised (the ticker then waits a period before the next: no hot loop of failures)."""
        started = time.monotonic()
        ok = True
        try:
            self.doTick(0)
        except Exception:  # a bug in a tick must not silently stop the node's Raft: log it loudly and go on
            log.exception("raft_tick_failed")
            ok = False
        took = time.monotonic() - started
        if took > SLOW_TICK_S:
            # A tick this long held back heartbeats (or their answers) past the shortest election timeout.
            self._local.slow_ticks += 1
            log.warning("raft_tick_slow", seconds=round(took, 3), leader=shim.is_leader(self))
        return ok

    def stop(self) -> None:
        """Any thread."""
        if isinstance(self._ticker, LoopTicker):
            self._ticker.stop()
        self._applier.stop()   # applies what was queued, then ends
        # pysyncobj saves the commit index lazily (once a second); save it now so that the offline tools
        # (rebuild-projection) see every entry this node knew to be committed.
        shim.save_commit_index(self)
        self.destroy()

    def current_image(self) -> Image:
        """The current image; rebinds after pysyncobj replaced ``image_data`` from a snapshot."""
        if self._machine.image.data is not self.image_data:
            with self.image_lock:
                self._machine.image = Image(self.image_data)
                self._machine.image.trimmed_to = self.trimmed
            self._on_applied(self.image_data["version"], None)
        return self._machine.image

    def committed(self, index: int, payload: bytes | None) -> Pending:
        """The tick (pysyncobj's apply hook): queue the entry to be applied; never apply here. A small entry of
        cheap commands only is applied by the tick itself once it sent the commit index on (applier.py)."""
        if payload is None:
            return self._applier.submit(index, _Decoded(None, []), inline=True)
        if (isinstance(payload, shim.MembershipPayload) or len(payload) > INLINE_APPLY_BYTES_MAX
                or self.raftCommitIndex - index >= INLINE_ENTRIES_MAX):
            # Part of a backlog (a node catching up hands over thousands at once): the apply thread decodes and
            # applies it. Decoding them all here held a restarted node's first tick, and its loop, for 1.6-1.7 s.
            return self._applier.submit(index, _Decoded(payload, None))
        envelopes = decode_entry(payload)
        inline = all(isinstance(e, dict) and isinstance(e.get("cmd"), dict) and e["cmd"].get("type") in INLINE_APPLY
                     for e in envelopes)
        return self._applier.submit(index, _Decoded(payload, envelopes), inline=inline)

    def _apply_entry(self, index: int, entry: _Decoded) -> Any:
        """Apply thread (or the tick, for a small entry of cheap commands): one committed entry, in log
        order, on every replica; the outcome of each of its proposals, in order (None for a new term's no-op)."""
        payload, envelopes = entry
        if envelopes is None:
            envelopes = decode_entry(payload) if payload is not None else []
        outcomes: list[dict[str, Any]] = []
        changed: set[str] = set()
        with self.image_lock:
            if index <= self._local.installed_through:
                return DISCARDED   # a snapshot installed meanwhile holds it already
            if payload is None:
                return None        # a new term's no-op
            if isinstance(payload, shim.MembershipPayload):
                self.current_image()
                return [self._machine.apply_membership(envelopes[0] if len(envelopes) == 1 else None)]
            image = self.current_image()
            for envelope in envelopes:
                started = time.perf_counter()   # the adapter times apply; nothing inside apply reads a clock
                try:
                    outcome, touched = self._machine.apply(envelope)
                except Exception:
                    # Replay failed half-way: this replica's image can no longer be trusted. Stop rather than
                    # diverge; on restart the journal replays the same entry, so the bug must be fixed, not skipped.
                    log.critical("apply_failed", index=index, payload=payload[:2000].decode("utf-8", "replace"),
                                 exc_info=True)
                    os._exit(EXIT_REPLICA_UNTRUSTED)
                if self._local.observe_apply_s is not None:
                    self._local.observe_apply_s(time.perf_counter() - started)
                if outcome.get("ok") and envelope["cmd"]["type"] in LARGE_COMMANDS:
                    self._local.freeze_pending = True
                outcomes.append(outcome)
                changed |= touched
            version = image.version
        if changed or any(o.get("ok") for o in outcomes):
            self._on_applied(version, changed)
        return outcomes

    @property
    def applier_lock(self) -> threading.Lock:
        return self._applier.lock

    @property
    def applied_index(self) -> int:
        """The last log index whose entry is in the image (raftLastApplied counts entries queued to apply)."""
        return self._applier.applied_index

    # -- status -----------------------------------------------------------------------------------------------
    @property
    def roles(self) -> Roles:
        """This node's place in the membership, and the leader's changes (meta/raft/roles.py)."""
        return self._local.roles

    def membership_status(self) -> dict[str, Any]:
        return self._local.roles.status()

    def leader_address(self) -> str | None:
        """The leader this node follows, or None; None too for a leader it has not heard from for an election
        timeout while connected to no peer (shim.leader_out_of_reach), so readiness and watch streams say so."""
        leader = shim.leader(self)
        if leader is None or shim.leader_out_of_reach(self):
            return None
        return leader.address

    def is_leader(self) -> bool:
        return shim.is_leader(self)

    @property
    def role_changes(self) -> dict[str, int]:
        return dict(self._local.role_changes)

    @property
    def slow_ticks(self) -> int:
        return self._local.slow_ticks

    @property
    def proposal_wakes_deferred(self) -> int:
        return self._local.wakes_deferred

    @property
    def proposals_forwarded_at_once(self) -> int:
        return self._local.forwarded_at_once

    @property
    def entries_appended_at_once(self) -> int:
        return self._local.appended_at_once

    def set_apply_observer(self, observe: Callable[[float], None]) -> None:
        self._local.observe_apply_s = observe

    def follower_lag(self) -> dict[str, int]:
        """Leader only (else empty): entries each follower has yet to acknowledge, by its raft address."""
        if not self.is_leader():
            return {}
        last = shim.current_log_index(self)
        return {node: max(0, last - match) for node, match in shim.match_indexes(self).items()}

    def commit_lag(self) -> int:
        """Entries this node knows to be committed but has not applied yet."""
        return max(0, self.raftCommitIndex - self._applier.applied_index)

    def term(self) -> int:
        return self.raftCurrentTerm

    def held_entries(self) -> shim.HeldEntries:
        """How often an append message repeated entries this node held (kept, where pysyncobj deleted them)."""
        return self._local.held

    def after_applied(self, index: int, done: Callable[[], None]) -> None:
        """Any thread: ``done()`` on the apply thread once every entry through ``index`` is in the image (at once
        when it is; else behind the entries queued so far, and again behind later ones until ``index`` is reached:
        the tick hands committed entries over after it moves the commit index)."""
        def check() -> None:
            if self._applier.applied_index >= index:
                done()
            else:
                self._applier.submit_call(check)
        check()

    def read_index(self, done: Callable[[int | None, str | None], None], timeout_s: float) -> None:
        """Any thread: ``done(index, None)`` once a linearizable read may be served from this node's image, or
        ``done(None, code)`` (meta/raft/read_index.py)."""
        self._local.read_index.request(done, timeout_s)

    def read_index_counts(self) -> ReadIndexCounts:
        return self._local.read_index.counts

    def pre_vote_counts(self) -> PreVoteCounts:
        """Pre-votes asked and won, granted and refused, vote requests refused in lease (meta/raft/prevote.py)."""
        return self._local.prevote.counts

    def snapshot_counts(self) -> dict[str, int]:
        """Snapshots since start: ``written`` here, ``installed`` from the leader, ``superseded`` (written, dropped)."""
        return {kind: self._local.snapshots[kind] for kind in SNAPSHOT_KINDS}

    def journal_stats(self) -> dict[str, Any]:
        """Group commit counters: syncs, and acknowledgements / commits / marks checked against the synced index;
        commits a follower raised on the leader's mark."""
        return {**self._local.journal.stats(), "local_commits": self._local.local_commit.commits}

    def commit_bound(self) -> int:
        """The largest index a node may have taken for committed (meta/raft/local_commit.py): what a linearizable
        read on the leader, or a wait for what is committed, must wait for."""
        return self._local.local_commit.commit_bound()


class RaftNode:
    """Asyncio face of the log: ``propose`` and ``barrier`` return when the command is applied on this node."""

    def __init__(self, sync: MetaSyncObj, loop: asyncio.AbstractEventLoop, offset_budget: int,
                 history_window: int = limits.HISTORY_EVENTS_MAX):
        self.sync = sync
        self.loop = loop
        self.offset_budget = offset_budget
        self.history_window = history_window
        self.failures: collections.Counter[str] = collections.Counter()   # failed proposals by code, for metrics
        sync.set_stamp(self.leader_fields)

    def leader_fields(self) -> dict[str, Any]:
        """What only the leader puts into an envelope: its clock, its offset budget and its history window."""
        # The window of the image's history is the leader's setting; a follower's proposal (a read barrier, or a
        # command forwarded through the raft transport) gets it from the leader, so nodes with different configs
        # cannot make it flap.
        return {"ts": int(time.time() * 1000), "budget": self.offset_budget, "history": self.history_window}

    def envelope(self, cmd: dict[str, Any], rid: str | None, actor: str) -> dict[str, Any]:
        return {"rid": rid, "ts": 0, "budget": self.offset_budget, "actor": actor, "cmd": cmd}

    async def propose(self, cmd: dict[str, Any], rid: str | None, actor: str,
                      timeout_s: float = limits.PROPOSE_TIMEOUT_S) -> dict[str, Any]:
        # Only the leader's clock and settings enter the log (apply reads nothing of a node's own): the tick puts
        # this node's proposals into one entry under the leader's stamp, or under an empty one on a follower, whose
        # entry travels to the leader in pysyncobj's apply_command message and is stamped there
        # (MetaSyncObj._stamped). An entry left unstamped keeps ts 0, which the state machine's max(ts, last_ts)
        # turns into log time.
        envelope = encode_envelope(self.envelope(cmd, rid, actor))
        if len(envelope) > limits.COMMAND_BYTES_MAX:
            raise rejection(413, "TOO_LARGE", f"the command exceeds {limits.COMMAND_BYTES_MAX} bytes")
        fut: asyncio.Future = self.loop.create_future()

        def done(outcome: Any, err: int) -> None:   # the tick or the apply thread
            if outcome is DISCARDED:   # a snapshot installed from the leader covered it before it was applied here
                self.sync.bridge.post(_resolve, fut, None, FAIL_REASON.UNKNOWN_OUTCOME)
            else:
                self.sync.bridge.post(_resolve, fut, outcome, err)

        self.sync.propose(envelope, done)
        try:
            result, err = await result_within(fut, timeout_s)
        except asyncio.TimeoutError:
            self.failures["UNKNOWN_OUTCOME"] += 1
            raise rejection(503, "UNKNOWN_OUTCOME", "the log did not answer in time; retry with the same "
                            "Idempotency-Key to learn the outcome", request_id=rid) from None
        if err == FAIL_REASON.SUCCESS:
            return result
        self.failures[_FAILURE_CODES.get(err, "NO_LEADER")] += 1
        if err in MAYBE_APPLIED:
            raise ProposeFailed("leadership changed while the command was in flight", {"request_id": rid},
                                code="LEADER_CHANGED")
        if err == FAIL_REASON.QUEUE_FULL:
            raise ProposeFailed(f"the log's command queue is full ({self.sync.commands_queue_max} commands); retry",
                                code="OVERLOADED")
        raise ProposeFailed("no leader could take the command", {"reason": int(err)}, code="NO_LEADER")


    async def applied_commit(self, timeout_s: float) -> bool:
        """Returns once this node applied every entry it knew committed at the call; False after ``timeout_s``, or
        as soon as a leader that called it no longer leads. No message is sent: on the leader the image then holds
        every write a follower has acknowledged (a follower applies a committed entry as soon as it knows it, even
        before the leader counted it: ``commit_bound``, which a leader cut off from its followers never commits)."""
        index = self.sync.commit_bound()
        if self.sync.applied_index >= index:
            return True
        leading = self.sync.is_leader()
        fut: asyncio.Future = self.loop.create_future()
        self.sync.after_applied(index, lambda: self.sync.bridge.post(_resolve, fut, None, 0))
        deadline = self.loop.time() + timeout_s
        try:
            while not fut.done():
                left = deadline - self.loop.time()
                if left <= 0 or (leading and not self.sync.is_leader()):
                    return False
                await asyncio.wait((fut,), timeout=min(left, LEADERSHIP_CHECK_S))
            return True
        finally:
            fut.cancel()   # the apply thread's answer, if it comes later, finds it done

    async def read_index(self, timeout_s: float) -> None:
        """Returns once this node's image holds every write the cluster acknowledged before the call (a
        linearizable read may then be served from it), appending nothing to the log (meta/raft/read_index.py).
        ProposeFailed with the reason when it cannot say so now (no leader, leadership changed, too many reads
        waiting): the caller may ask again."""
        fut: asyncio.Future = self.loop.create_future()

        def done(index: int | None, code: str | None) -> None:   # the tick or the apply thread
            self.sync.bridge.post(_resolve, fut, index, code)

        self.sync.read_index(done, timeout_s)
        try:
            _index, code = await result_within(fut, timeout_s)
        except asyncio.TimeoutError:
            raise ProposeFailed("no leader confirmed the read in time", code="NO_LEADER") from None
        if code is not None:
            raise ProposeFailed(f"the read index could not be had: {code}", code=code)


_FAILURE_CODES = {**{e: "LEADER_CHANGED" for e in MAYBE_APPLIED}, FAIL_REASON.QUEUE_FULL: "OVERLOADED"}


def _resolve(fut: asyncio.Future, result: Any, err: int) -> None:
    if not fut.done():
        fut.set_result((result, err))
