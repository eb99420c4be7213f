"""Every reach into pysyncobj's internals, in one module, for exactly the pysyncobj it was written against.

MetaSyncObj sends one append message per tick, keeps idle links up, holds back a restarted node's first election,
saves the commit index on stop and writes its own snapshot file. pysyncobj has no public API for any of that, so
these functions touch its name-mangled attributes (``_SyncObj__*``), its protected hooks and its journal and
snapshot layouts. Any release may rename or change them without notice; importing this module against another
version therefore fails at start-up, loudly, instead of letting a node misbehave quietly.

Protected hooks MetaSyncObj overrides (same version pin): ``_applyCommand``, ``_checkCommandsToApply``, ``_onTick``,
and the private ``__doApplyCommand`` (``CommandsAsBytes``: no pickle in the log). The journal is Stator's own
(``journal_and_poller_of_our_own``: swaps of module-level names), the transport too (pysyncobj's public ``transportClass``).
``keep_matching_entries`` puts a follower's incoming append messages in Raft's terms before pysyncobj sees them.
"""

from __future__ import annotations

import abc
import contextlib
import os
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pysyncobj.syncobj as _syncobj_mod
from pysyncobj import FAIL_REASON, SERIALIZER_STATE, SyncObj
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE
from pysyncobj.monotonic import monotonic
from pysyncobj.node import Node, TCPNode
from pysyncobj.version import VERSION

from .housekeeping import Housekeeping
from .journal import StatorJournal
from .membership import MEMBERSHIP_COMMAND
from .snapshot_file import LogEntry, Snapshot, WriterState

PYSYNCOBJ_VERSION = "0.3.17"


def require_version(found: str) -> None:
    if found != PYSYNCOBJ_VERSION:
        raise ImportError(f"meta.raft.pysyncobj_shim was written against pysyncobj {PYSYNCOBJ_VERSION} and reaches into its "
                          f"private internals, but pysyncobj {found} is installed: pin pysyncobj=={PYSYNCOBJ_VERSION} "
                          "or review every function of this module against the new version")


require_version(VERSION)

# -- raft state ------------------------------------------------------------------------------------------------
# Public properties already cover commit index, last applied, term, other nodes and conf (``raftCommitIndex``,
# ``raftLastApplied``, ``raftCurrentTerm``, ``otherNodes``, ``conf``); only what has no public face is here.


def current_log_index(so: SyncObj) -> int:
    return so._SyncObj__getCurrentLogIndex()


def log_entry(so: SyncObj, index: int) -> tuple[bytes, int, int] | None:
    """(command, index, term) of the log's entry at ``index``; None when the log does not hold it."""
    found = so._SyncObj__getEntries(index, 1)
    return tuple(found[0]) if found else None


def transport(so: SyncObj) -> Any:
    return so._SyncObj__transport


def match_indexes(so: SyncObj) -> dict[str, int]:
    """The leader's view of how far each follower's log matches its own, by the follower's raft address."""
    return {node.address: index for node, index in dict(so._SyncObj__raftMatchIndex).items()}


def leader(so: SyncObj) -> Node | None:
    return so._getLeader()


def leader_commit_heard(so: SyncObj) -> int | None:
    """The leader's commit index as this node last heard it (None before it heard any leader)."""
    return so._SyncObj__leaderCommitIndex


def is_leader(so: SyncObj) -> bool:
    return so._isLeader()


def postpone_election(so: SyncObj, delay_s: float) -> None:
    """No election from this node before ``delay_s`` from now (pysyncobj's own monotonic clock). Never earlier than
    the deadline it had: a learner's hold of 1 s at every tick, left behind when it became a voter, cut a configured
    30 s election timeout to about a second (tests/test_startup.py's never-ready cluster got a leader)."""
    so._SyncObj__raftElectionDeadline = max(so._SyncObj__raftElectionDeadline, monotonic() + delay_s)


def restart_election_timer(so: SyncObj) -> None:
    """The election deadline a follower gets when it hears its leader: one of its own election timeouts from now
    (drawn as pysyncobj draws it, within raftMinTimeout..raftMaxTimeout), whatever hold was left before."""
    conf = so._SyncObj__conf
    so._SyncObj__raftElectionDeadline = monotonic() + random.uniform(conf.raftMinTimeout, conf.raftMaxTimeout)


def clock() -> float:
    """pysyncobj's monotonic clock, which its election deadlines count in."""
    return monotonic()


def election_due(so: SyncObj) -> bool:
    """Whether pysyncobj would campaign at this tick: a voter following (or a candidate) whose election deadline
    has passed, connected to some peer (pysyncobj's own conditions, ``_onTick``)."""
    return (not so._isLeader() and so.selfNode is not None and so._SyncObj__raftElectionDeadline < monotonic()
            and bool(so._SyncObj__connectedNodes or not so._SyncObj__otherNodes))


def start_election_now(so: SyncObj) -> None:
    """pysyncobj campaigns at its next tick (what ``timeout_now`` does, without a transfer)."""
    so._SyncObj__raftElectionDeadline = 0


def transfer_in_progress(so: SyncObj) -> bool:
    """The leader asked this node to campaign now (``timeout_now``); pysyncobj clears it as the campaign starts."""
    return bool(so._SyncObj__transferInProgress)


def last_log(so: SyncObj) -> tuple[int, int]:
    """(index, term) of the log's last entry, as a vote request names them."""
    index = current_log_index(so)
    return index, so._SyncObj__getEntries(index, 1)[0][2]   # the log always holds its last entry (or the snapshot's)


def voters(so: SyncObj) -> set[Node]:
    """The other voting members (pysyncobj counts a majority over them and the node itself)."""
    return so._SyncObj__otherNodes


def adopt_term(so: SyncObj, term: int) -> None:
    """Raft's rule for a message of a newer term, as pysyncobj applies it to a vote request: that term, no vote
    cast in it, a follower with no leader known."""
    so._SyncObj__setCurrentTerm(term, None)
    step_down(so)
    so._SyncObj__raftLeader = None


def committed_term(so: SyncObj) -> int | None:
    """The term of the entry at the commit index (None when the log no longer holds it)."""
    entry = log_entry(so, so.raftCommitIndex)
    return entry[2] if entry else None


def election_timeout_min_s(so: SyncObj) -> float:
    return so._SyncObj__conf.raftMinTimeout


def leader_out_of_reach(so: SyncObj) -> bool:
    """Whether this follower has heard from no leader for an election timeout while connected to no peer.

    pysyncobj's follower campaigns only while connected to a peer, and a campaign is what clears the leader it last
    heard: a node whose two peers were killed went on naming the dead leader, and answering ready, for as long as
    it stayed alone (found with the two others killed: /readyz 200 for minutes). Its election deadline, which
    every append from the leader pushes back, says how long it has heard nothing."""
    return (not so._isLeader() and so._SyncObj__raftElectionDeadline < monotonic()
            and not so._SyncObj__connectedNodes)


def load_snapshot_before_any_apply(so: SyncObj) -> None:
    """Load the node's snapshot now, before its first tick, instead of when pysyncobj gets to it.

    pysyncobj loads the snapshot only at the first tick after its transport is ready, but applies journal entries
    up to the saved commit index on every tick before that, onto the empty state. A node stopped after its snapshot
    was written and before its journal was cut (the tick that notices the forked writer finished) still holds the
    journal from index 1: it would replay the whole log first, and its projection take from that replay what the
    snapshot then replaces. Loading first makes a restart start from the snapshot, as a restart should."""
    conf = so._SyncObj__conf
    if so._SyncObj__needLoadDumpFile and conf.fullDumpFile is not None and os.path.isfile(conf.fullDumpFile):
        so._SyncObj__loadDumpFile(clearJournal=False)
    so._SyncObj__needLoadDumpFile = False


def finish_interrupted_compaction(so: SyncObj, snapshot: Snapshot) -> bool:
    """Cut the journal to start at the snapshot's two entries when it still holds them further on; True if it did.

    A compaction is two steps: the snapshot file is renamed into place (by the writer), then a later tick cuts the
    journal to start at the snapshot's ``previous`` entry. A node stopped between the two restarts with a journal
    that starts earlier, and pysyncobj's loader, seeing a journal that does not start with those entries, clears
    it: every entry after the snapshot would be gone from this node, acknowledged ones included (with
    journal_sync fsync, entries the leader counted toward a commit). Finishing the cut first keeps them."""
    journal = so._SyncObj__raftLog
    previous, last = _raw_entry(snapshot.previous), _raw_entry(snapshot.last_applied)
    if len(journal) < 2 or journal[0] == previous:
        return False
    at = previous[1] - journal[0][1]   # journal indexes are contiguous
    if not 0 < at < len(journal) - 1 or journal[at] != previous or journal[at + 1] != last:
        return False                   # not this log's entries (a snapshot installed from the leader): a clear is right
    journal.deleteEntriesTo(at)
    return True


# -- transport -------------------------------------------------------------------------------------------------
APPEND = "append_entries"   # pysyncobj's append message (its type field), heartbeats and commit notices included
def send_append_entries(so: SyncObj) -> None:
    so._SyncObj__sendAppendEntries()


# Once an entry commits, the leader tells its followers at once: a follower's proposer is answered by the follower's
# own apply, a hop later instead of a heartbeat later. pysyncobj sends that as an empty append, and every follower
# acknowledges it: per write, two more messages to the leader that say nothing it does not know (each follower's
# match index is already the last entry), each reading and decoding in a tick of its own (a 1-writer leader ran 4.7
# receives and 3.5 ticks a write). A commit notice is that same append marked QUIET: a follower that takes it answers
# nothing; one that refuses it (its log does not hold the leader's last entry) answers as it answers any append.
QUIET = "quiet"


def send_commit_notice(so: SyncObj, voters_too: bool = True) -> bool:
    """Leader: send every follower the commit index in a quiet append, when the append pysyncobj would send each one
    carries no entry (its next index is past the log); False, and nothing sent, when one would (pysyncobj's
    ``send_append_entries`` then sends them, each answered). ``voters_too`` False: to the learners alone (the voters
    commit on their own, meta/raft/local_commit.py)."""
    last = current_log_index(so)
    next_index = so._SyncObj__raftNextIndex
    nodes = so._SyncObj__otherNodes | so._SyncObj__readonlyNodes
    if any(next_index.get(node) != last + 1 for node in nodes):
        return False
    if not voters_too:
        nodes = so._SyncObj__readonlyNodes
    last_term = log_entry(so, last)[2]   # the log always holds its last entry (compaction keeps it)
    connected = so._SyncObj__connectedNodes
    link = transport(so)
    # The next heartbeat stays where the last answered append put it: a notice tells the leader nothing back, and
    # its step-down (leaderFallbackTimeout) counts the answers.
    for node in nodes:
        if node in connected:
            link.send(node, {"type": APPEND, "term": so.raftCurrentTerm, "commit_index": so.raftCommitIndex,
                             "entries": [], "prevLogIdx": last, "prevLogTerm": last_term, QUIET: True})
    return True


def take_commit_notice(so: SyncObj, leader: Node, index: int) -> None:
    """Raise this follower's commit index to ``index`` (at most its last) as ``leader``'s commit notice would
    (``send_commit_notice``): that quiet append, handed to the node's own receive path, and answered by nothing.
    pysyncobj only ever raises the commit index this way, and applies up to it at its next apply pass."""
    last = current_log_index(so)
    transport(so)._onMessageReceived(leader, {"type": APPEND, "term": so.raftCurrentTerm, "commit_index": index,
                                              "entries": [], "prevLogIdx": last, "prevLogTerm": log_entry(so, last)[2],
                                              QUIET: True})


def commit_as_only_voter(so: SyncObj, index: int) -> None:
    """Leader, the only voter: raise its commit index to ``index`` (an entry of its term, durable here) as the start
    of pysyncobj's next tick would, its majority being itself."""
    so._SyncObj__raftCommitIndex = index
    so._SyncObj__raftLog.setRaftCommitIndex(index)
    so._SyncObj__leaderCommitIndex = index


def send_message(so: SyncObj, node: Node, message: dict[str, Any]) -> None:
    transport(so).send(node, message)


def pipe_notifier(so: SyncObj) -> Any:
    """The notifier that wakes the tick; pysyncobj creates it only when built with appendEntriesUseBatch=False."""
    return getattr(so, "_SyncObj__pipeNotifier", None)


def poll_sockets(so: SyncObj) -> None:
    """Read whatever messages already wait in the sockets, without blocking."""
    so._poller.poll(0)


# -- commands: Stator's bytes in the log, never a pickle ----------------------------------------------------------
# pysyncobj's ``@replicated`` methods pickle ``(method id, args)`` into every log entry, and every replica unpickles
# what reached it from the network (``__doApplyCommand``). Stator does not use ``@replicated``: a log entry's command
# is pysyncobj's REGULAR type byte and the UTF-8 JSON of one envelope, appended through ``_applyCommand`` (the
# protected method the ``replicated`` wrapper itself calls) and applied by ``CommandsAsBytes`` below, which replaces
# pysyncobj's private ``__doApplyCommand``. A follower's proposal travels to the leader as pysyncobj's
# ``apply_command`` message; the leader hands its ``command`` to ``_applyCommand`` with the callback ``(sender node,
# request id)``, appends it to the log and answers with its index; the follower's callback fires when it applied
# that index itself.
REGULAR_COMMAND = _COMMAND_TYPE.REGULAR   # the first byte of an entry that carries an envelope
_REGULAR_BYTE = bytes([REGULAR_COMMAND])
if _COMMAND_TYPE.MEMBERSHIP != MEMBERSHIP_COMMAND:   # the journal recognises membership entries by this byte
    raise ImportError(f"pysyncobj's MEMBERSHIP entry type is {_COMMAND_TYPE.MEMBERSHIP}, not {MEMBERSHIP_COMMAND}")
_MEMBERSHIP_BYTE = bytes([MEMBERSHIP_COMMAND])
NO_OP_COMMAND = bytes([_COMMAND_TYPE.NO_OP])   # a new term's first entry (pysyncobj writes the type byte alone)


class MembershipPayload(bytes):
    """The payload of a MEMBERSHIP entry: the voters, for the state machine's ``apply_membership``."""


def propose_membership(so: SyncObj, payload: bytes, callback: Callable[[Any, int], None]) -> None:
    """Queue a membership entry (the leader appends it alone, never batched)."""
    so._applyCommand(_MEMBERSHIP_BYTE + payload, callback)


def voted_for(so: SyncObj) -> Any:
    return so._SyncObj__votedForNodeId


def set_voted_for(so: SyncObj, node_id: Any) -> None:
    """Record a vote for ``node_id`` in the current term (durably, as pysyncobj records its own)."""
    so._SyncObj__setCurrentTerm(so.raftCurrentTerm, node_id)


def set_members(so: SyncObj, voters: set[Node], learners: set[Node]) -> None:
    """pysyncobj's voters (a majority is counted over them and the node itself) and its read-only nodes (the leader
    sends them entries, never counts them): the transport links to each, and forgets a node in neither."""
    other, readonly = so._SyncObj__otherNodes, so._SyncObj__readonlyNodes
    next_index, match_index = so._SyncObj__raftNextIndex, so._SyncObj__raftMatchIndex
    responded = so._SyncObj__lastResponseTime
    link = transport(so)
    wanted = voters | learners
    for node in (other | readonly) - wanted:
        link.dropNode(node)
        next_index.pop(node, None)
        match_index.pop(node, None)
        responded.pop(node, None)
        so._SyncObj__connectedNodes.discard(node)
    last = current_log_index(so)
    for node in wanted - (other | readonly):
        link.addNode(node)
        next_index[node] = last + 1
        match_index[node] = 0
    for node in voters - other:
        # The leader steps down when too few voters answered lately: a new voter has not had the chance yet.
        responded[node] = monotonic()
    other.clear()
    other.update(voters)
    readonly.clear()
    readonly.update(learners)


def step_down(so: SyncObj) -> None:
    """A candidate (or leader) becomes a follower; the next leader's append says who leads."""
    so._SyncObj__setState(_RAFT_STATE.FOLLOWER)


class Acknowledgements(abc.ABC):
    """Mixin for a SyncObj subclass: every acknowledgement a node sends the leader (pysyncobj's ``next_node_idx``,
    after an append or a snapshot) goes through ``acknowledge`` first, which may send its own instead."""

    def _SyncObj__sendNextNodeIdx(self, node: Node, reset: bool = False,  # noqa: N802 - the private name it replaces
                                  nextNodeIdx: int | None = None, success: bool = False) -> None:
        if nextNodeIdx is None:
            nextNodeIdx = current_log_index(self) + 1
        if not self.acknowledge(node, nextNodeIdx, reset, success):
            SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)

    @abc.abstractmethod
    def acknowledge(self, node: Node, next_index: int, reset: bool, success: bool) -> bool:
        """The tick: True if this acknowledgement was sent here (pysyncobj then sends none)."""


class CompactionChecks(abc.ABC):
    """Mixin for a SyncObj subclass: pysyncobj's compaction check (``__tryLogCompaction``, at the end of every tick:
    is a snapshot due, has the writer finished) runs when ``compaction_checks`` says it is due (housekeeping.py),
    not at every tick. What it looks at moves in seconds: a snapshot due, or written, is taken up to a period later."""

    compaction_checks: Housekeeping

    def _SyncObj__tryLogCompaction(self) -> None:   # noqa: N802 - the private name it replaces
        if self.compaction_checks.due(monotonic()):
            SyncObj._SyncObj__tryLogCompaction(self)


def answer_in_flight(so: SyncObj) -> None:
    """The tick: answer LEADER_CHANGED (it may still commit) to every proposal of this node appended, or forwarded
    and appended by the leader, and not applied yet. pysyncobj answers them only when the log reaches their index
    again (DISCARDED under another term), and never if the new leader's log is shorter and nothing more is written;
    it forgets them here, so an entry that commits later answers no one twice."""
    waiting = so._SyncObj__commandsWaitingCommit
    callbacks = [callback for index in sorted(waiting) for _term, callback in waiting[index]]
    waiting.clear()
    for callback in callbacks:
        callback(None, FAIL_REASON.LEADER_CHANGED)


def next_indexes(so: SyncObj) -> dict[Node, int]:
    """Leader: the index it sends each node it replicates to from (pysyncobj's, moved by each answer)."""
    return dict(so._SyncObj__raftNextIndex)


def before_each_send(so: SyncObj, before: Callable[[], None]) -> None:
    """``before()`` runs each time ``so`` is about to send its append messages, on the tick (the
    simulator's rewind fault moves the leader's next indexes there). Set on the instance: pysyncobj would count it
    replicated state in a snapshot, so never on a node that compacts."""
    send = so._SyncObj__sendAppendEntries

    def sending() -> None:
        before()
        send()

    so._SyncObj__sendAppendEntries = sending


def set_append_batch_bytes(so: SyncObj, size: int) -> None:
    """How many bytes of entries one append message carries (the first entry past it included)."""
    so._getConf().appendEntriesBatchSizeBytes = size


def set_next_index(so: SyncObj, node: Node, index: int) -> bool:
    """Leader: send ``node`` entries from ``index`` on; False if the leader does not replicate to it."""
    next_index = so._SyncObj__raftNextIndex
    if node not in next_index:
        return False
    next_index[node] = index
    return True


class CommandsAsBytes(abc.ABC):
    """Mixin for a SyncObj subclass: hand each committed entry to ``committed(index, payload)``.

    pysyncobj calls its ``__doApplyCommand`` for entry ``raftLastApplied + 1`` (it counts the entry applied right
    after) and passes what it returns to the proposers' callbacks. ``payload`` is a REGULAR entry's envelope bytes;
    pysyncobj's other entry types (no-op, membership, code version) carry nothing to apply (None): Stator writes
    only no-ops among them (dynamicMembershipChange=False, no setCodeVersion), and an entry of another type is
    skipped the same way on every replica (pysyncobj would raise on a code version newer than its own)."""

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:   # noqa: N802 - the private name it replaces
        kind = command[:1]
        if kind == _REGULAR_BYTE:
            payload: bytes | None = command[1:]
        elif kind == _MEMBERSHIP_BYTE:
            payload = MembershipPayload(command[1:])
        else:
            payload = None
        return self.committed(self.raftLastApplied + 1, payload)

    @abc.abstractmethod
    def committed(self, index: int, payload: bytes | None) -> Any:
        """The tick: entry ``index`` is committed; what this returns reaches its proposers' callbacks."""


def propose(so: SyncObj, payload: bytes, callback: Callable[[Any, int], None]) -> None:
    """Queue one entry's payload for the log (the leader appends it; a follower forwards it to the leader)."""
    so._applyCommand(bytes([REGULAR_COMMAND]) + payload, callback)


def proposals_in_flight(so: SyncObj) -> bool:
    """Whether an entry this node proposed waits for its leader's answer (forwarded) or for its commit."""
    return bool(so._SyncObj__commandsWaitingReply) or any(so._SyncObj__commandsWaitingCommit.values())


def apply_committed(so: SyncObj) -> None:
    """Apply up to the commit index now, as the start of pysyncobj's next tick would (a follower: it sends nothing);
    nothing when the commit index is applied already."""
    so._SyncObj__applyLogEntries()


def is_forwarded(callback: Any) -> bool:
    """Whether ``_applyCommand`` got this command from a follower (pysyncobj's ``(node, request id)`` callback)."""
    return isinstance(callback, tuple)


def envelope_bytes(command: Any) -> bytes | None:
    """The envelope bytes of a REGULAR command, else None."""
    if isinstance(command, bytes) and command[:1] == bytes([REGULAR_COMMAND]):
        return command[1:]
    return None


def with_envelope(payload: bytes) -> bytes:
    return bytes([REGULAR_COMMAND]) + payload


def refuse_command(so: SyncObj, callback: Any) -> None:
    """Answer a command's proposer REQUEST_DENIED without appending it (a forwarded one gets pysyncobj's message)."""
    so._SyncObj__callErrCallback(FAIL_REASON.REQUEST_DENIED, callback)


# -- snapshots -------------------------------------------------------------------------------------------------
# With a custom ``serializer``, pysyncobj calls ``serializer(dump_file + ".tmp", (last, previous, cluster))`` on the
# the tick (on the loop, or its watchdog thread) and then renames ``dump_file + ".tmp"`` over the dump file at once, assuming the write is done. Our
# writer works in a forked child and never creates that name, so the rename fails, pysyncobj marks itself busy
# (no second snapshot, no snapshot transmission) and from then on asks ``serializeChecker`` until it answers
# SUCCESS or FAILED. ``deserializer(dump_file)`` must return ``(last, previous, cluster)``; pysyncobj then restores
# no attribute of its own, the image is ours to restore.
_SERIALIZER_STATES = {WriterState.IDLE: SERIALIZER_STATE.NOT_SERIALIZING,
                      WriterState.WRITING: SERIALIZER_STATE.SERIALIZING,
                      WriterState.DONE: SERIALIZER_STATE.SUCCESS,
                      WriterState.FAILED: SERIALIZER_STATE.FAILED}


def serializer_state(state: WriterState) -> int:
    """What ``serializeChecker`` answers pysyncobj for the writer's state."""
    return _SERIALIZER_STATES[state]


def snapshot_of(image: dict[str, Any], raft: tuple[Any, ...]) -> Snapshot:
    """The snapshot to write, from what pysyncobj hands its serializer: the last applied entry, the one before it
    (the log must still start with both after compaction) and the cluster's nodes."""
    last, previous, cluster = raft
    return Snapshot(image, _entry(last), _entry(previous), tuple(sorted(node.id for node in cluster)))


def raft_state_of(snapshot: Snapshot) -> tuple[Any, ...]:
    """What pysyncobj's deserializer must return."""
    return (_raw_entry(snapshot.last_applied), _raw_entry(snapshot.previous),
            {TCPNode(address) for address in snapshot.cluster})


def seed_entries() -> tuple[LogEntry, LogEntry]:
    """The two entries a new cluster's log starts with when it is seeded from an image (a restore): pysyncobj's own
    no-op entries at indexes 1 and 2 of term 0, the same on every node, so their logs agree."""
    no_op = bytes([_COMMAND_TYPE.NO_OP])
    return LogEntry(2, 0, no_op), LogEntry(1, 0, no_op)


def _entry(raw: tuple[bytes, int, int]) -> LogEntry:
    command, index, term = raw
    return LogEntry(index, term, command)


def _raw_entry(entry: LogEntry) -> tuple[bytes, int, int]:
    return entry.command, entry.index, entry.term


# -- journal: Stator's own (meta/raft/journal.py) -----------------------------------------------------------------
# ``SyncObj.__init__`` creates its journal with ``createJournal(self.__conf.journalFile)``, a module-level name of
# pysyncobj.syncobj: the one documented swap puts Stator's journal there while the node is constructed (a lock keeps
# two constructions in one process apart). ``test_pysyncobj_pin`` fails if pysyncobj stops calling it that way.
_journal_swap = threading.Lock()


@contextlib.contextmanager
def journal_and_poller_of_our_own(journal: StatorJournal, poller: Any) -> Iterator[None]:
    """Inside this block ``SyncObj.__init__`` gets ``journal`` and ``poller`` (meta/raft/loop_ticker.py LoopPoller,
    which the event loop watches too): it builds its poller there as well, with ``createPoller``, and everything
    subscribes to it before the constructor returns."""
    with _journal_swap:
        journal_was, poller_was = _syncobj_mod.createJournal, _syncobj_mod.createPoller
        _syncobj_mod.createJournal = lambda _path: journal
        _syncobj_mod.createPoller = lambda _kind: poller
        try:
            yield
        finally:
            _syncobj_mod.createJournal, _syncobj_mod.createPoller = journal_was, poller_was


def journal_of(so: SyncObj) -> StatorJournal:
    journal = so._SyncObj__raftLog
    if not isinstance(journal, StatorJournal):
        raise TypeError(f"the node's journal is {type(journal).__name__}, not Stator's own")
    return journal


def save_commit_index(so: SyncObj) -> None:
    """What the journal's one-second timer does: persist the commit index it otherwise saves lazily."""
    so._SyncObj__raftLog.onOneSecondTimer()


# -- append entries that repeat what a follower has ---------------------------------------------------------
# pysyncobj's follower deletes everything after prevLogIdx whenever its log goes on past it, then appends the
# message's entries: an append that repeats entries the follower already holds takes back the ones after them.
# Raft (Figure 2, AppendEntries step 3) deletes only from the first entry that conflicts (same index, other term).
# The difference bites when a leader resends from behind (a reject resets its next index; a resend carries at most
# appendEntriesBatchSizeBytes): the follower drops entries it has already acknowledged, a majority may then no
# longer hold a committed entry, and a leader elected without it overwrites it. So a follower's appends pass here
# first and reach pysyncobj as what Raft would do:
# - entries the follower already holds are dropped from the front of the message, so pysyncobj deletes from the
#   first conflict (or from nothing, if the log simply ends there) and appends only the rest;
# - a message whose entries are all held already, with more after them, changes no entry: pysyncobj gets it as a
#   heartbeat (term, leader, election timer), the commit index it may take is bounded by the message's last entry
#   (the entries after it are not known to match the leader's), and the acknowledgement covers only that entry.


class HeldEntries:
    """Counts of the append messages that repeated entries this follower held (see above)."""

    def __init__(self) -> None:
        self.trimmed = 0     # a held prefix was dropped: pysyncobj would have deleted the entries after it
        self.repeats = 0     # every entry was held and the log went on: pysyncobj would have deleted the rest
        self.pieces_refused = 0   # an entry sent in pieces (see _append_as_raft): never from a node of ours
        self.snapshot_commits_held = 0   # a snapshot piece that would have raised the commit index (see above)


class CommitNotice:
    """Whether the append a follower is handling is a commit notice (QUIET, see ``send_commit_notice``): its
    acknowledgement of success is then not sent (``Acknowledgements``)."""

    def __init__(self) -> None:
        self.handling = False


def keep_matching_entries(so: SyncObj, admit: Callable[[Node, Any], bool], notice: CommitNotice) -> HeldEntries:
    """Route the node's incoming raft messages through ``_append_as_raft`` (see above). Before the node ticks.
    ``admit(node, message)`` sees each message first; pysyncobj never sees those it answers False for. ``notice``
    says, while an append is handled, whether it is a commit notice."""
    handle = so._SyncObj__onMessageReceived
    counts = HeldEntries()

    def received(node: Node, message: Any) -> None:
        if not admit(node, message):
            return
        if isinstance(message, dict) and message.get("type") == APPEND:
            if "prevLogIdx" not in message:
                _snapshot_piece_as_raft(so, node, message, handle, counts)
                return
            notice.handling = message.get(QUIET) is True and not message.get("entries")
            try:
                message = _append_as_raft(so, node, message, handle, counts)
                if message is not None:
                    handle(node, message)
            finally:
                notice.handling = False
            return
        handle(node, message)

    transport(so).setOnMessageReceivedCallback(received)
    return counts


def _snapshot_piece_as_raft(so: SyncObj, node: Node, message: dict[str, Any], handle: Callable[[Node, Any], None],
                            counts: HeldEntries) -> None:
    """A piece of the leader's snapshot (``serialized``, no prevLogIdx): pysyncobj let it raise the follower's
    commit index to min(leader's commit, own last index), though the piece shows nothing of the follower's log to
    match the leader's. A follower with an uncommitted tail from an old term (a leader cut off from its peers keeps
    appending) then applied that tail: it answered its clients ok for writes no majority held, and the snapshot it
    installed next took them back (found by the chaos runner's leader_cut fault). The piece reaches pysyncobj with
    the follower's own commit index. Once the snapshot is loaded, the leader's next append (from the snapshot's
    index, which then matches) raises the commit index as Raft does; until then it may lag what the snapshot
    applied, which pysyncobj's apply loop and the journal take as nothing left to apply."""
    if message["term"] < so.raftCurrentTerm or message["commit_index"] <= so.raftCommitIndex:
        handle(node, message)
        return
    counts.snapshot_commits_held += 1
    handle(node, {**message, "commit_index": so.raftCommitIndex})
    so._SyncObj__leaderCommitIndex = message["commit_index"]   # what the leader has committed, for readiness


def _append_as_raft(so: SyncObj, node: Node, message: dict[str, Any], handle: Callable[[Node, Any], None],
                    counts: HeldEntries) -> dict[str, Any] | None:
    """The message pysyncobj should see instead of ``message``, or None once it is handled here."""
    if message["term"] < so._SyncObj__raftCurrentTerm:
        return message                         # refused as stale by pysyncobj itself
    if "transmission" in message:
        # pysyncobj sends an entry of at least appendEntriesBatchSizeBytes in pieces, and marks two pieces 'finish'
        # for some sizes: the entry is never appended and the leader resends the same pieces forever. MetaSyncObj
        # sets the batch above the largest entry the log accepts, so no node of ours sends pieces: refuse them.
        counts.pieces_refused += 1
        return None
    entries = message.get("entries") or []
    prev = message["prevLogIdx"]
    last = so._SyncObj__getCurrentLogIndex()
    if last <= prev:
        return message                         # nothing after prevLogIdx to keep
    held = so._SyncObj__getEntries(prev, len(entries) + 1)
    if not held or held[0][2] != message["prevLogTerm"]:
        return message                         # prevLogIdx unknown or from another term: pysyncobj refuses it
    same = 0
    while same < len(entries) and same + 1 < len(held) and held[same + 1][2] == entries[same][2]:
        same += 1
    if same < len(entries):
        if same == 0:
            return message
        counts.trimmed += 1
        return {**message, "prevLogIdx": entries[same - 1][1], "prevLogTerm": entries[same - 1][2],
                "entries": entries[same:]}
    counts.repeats += 1
    matched = prev + len(entries)
    heartbeat = {k: v for k, v in message.items() if k not in ("prevLogIdx", "prevLogTerm", "entries")}
    heartbeat["commit_index"] = min(message["commit_index"], matched)   # pysyncobj only ever raises it
    handle(node, heartbeat)
    so._SyncObj__leaderCommitIndex = message["commit_index"]   # what the leader has committed, for readiness
    so._SyncObj__sendNextNodeIdx(node, nextNodeIdx=matched + 1, success=True)
    return None


# -- guard -----------------------------------------------------------------------------------------------------
# pysyncobj snapshots (with its default serializer) every attribute set after SyncObj.__init__ returned, plus
# this one of its own: the enabled code version, which only setCodeVersion changes (Stator never calls it).
_OWN_LATE_ATTRIBUTES = frozenset({"_SyncObj__enabledCodeVersion"})


def replicated_attribute_names(so: SyncObj) -> set[str]:
    """Attributes pysyncobj would count as replicated state: those first set after ``SyncObj.__init__``."""
    return set(vars(so)) - so._SyncObj__properies - _OWN_LATE_ATTRIBUTES
