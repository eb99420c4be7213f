"""Every reach into pysyncobj's internals, in one module, for exactly the pysyncobj it was written against.

MetaSyncObj sends one append message per tick, keeps idle links up, holds back a restarted node's first election,
saves the commit index on stop and writes its own snapshot file. pysyncobj has no public API for any of that, so
these functions touch its name-mangled attributes (``_SyncObj__*``), its protected hooks and its journal and
snapshot layouts. Any release may rename or change them without notice; importing this module against another
version therefore fails at start-up, loudly, instead of letting a node misbehave quietly.

Protected hooks MetaSyncObj overrides (same version pin): ``_applyCommand``, ``_checkCommandsToApply``, ``_onTick``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pysyncobj.pickle as _pickle
from pysyncobj import SERIALIZER_STATE, SyncObj
from pysyncobj.syncobj import _COMMAND_TYPE
from pysyncobj.journal import FileJournal
from pysyncobj.monotonic import monotonic
from pysyncobj.node import Node, TCPNode
from pysyncobj.version import VERSION

from .snapshot_file import LogEntry, Snapshot, WriterState

PYSYNCOBJ_VERSION = "0.3.17"


def require_version(found: str) -> None:
    if found != PYSYNCOBJ_VERSION:
        raise ImportError(f"meta.pysyncobj_shim was written against pysyncobj {PYSYNCOBJ_VERSION} and reaches into its "
                          f"private internals, but pysyncobj {found} is installed: pin pysyncobj=={PYSYNCOBJ_VERSION} "
                          "or review every function of this module against the new version")


require_version(VERSION)

# -- raft state ------------------------------------------------------------------------------------------------
# Public properties already cover commit index, last applied, term, other nodes and conf (``raftCommitIndex``,
# ``raftLastApplied``, ``raftCurrentTerm``, ``otherNodes``, ``conf``); only what has no public face is here.


def current_log_index(so: SyncObj) -> int:
    return so._SyncObj__getCurrentLogIndex()


def match_indexes(so: SyncObj) -> dict[str, int]:
    """The leader's view of how far each follower's log matches its own, by the follower's raft address."""
    return {node.address: index for node, index in dict(so._SyncObj__raftMatchIndex).items()}


def leader(so: SyncObj) -> Node | None:
    return so._getLeader()


def is_leader(so: SyncObj) -> bool:
    return so._isLeader()


def postpone_election(so: SyncObj, delay_s: float) -> None:
    """No election from this node before ``delay_s`` from now (pysyncobj's own monotonic clock)."""
    so._SyncObj__raftElectionDeadline = monotonic() + delay_s


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


def save_commit_index(so: SyncObj) -> None:
    """What the journal's one-second timer does: persist the commit index it otherwise saves lazily."""
    so._SyncObj__raftLog.onOneSecondTimer()


# -- transport -------------------------------------------------------------------------------------------------
def send_append_entries(so: SyncObj) -> None:
    so._SyncObj__sendAppendEntries()


def send_message(so: SyncObj, node: Node, message: dict[str, Any]) -> None:
    so._SyncObj__transport.send(node, message)


def pipe_notifier(so: SyncObj) -> Any:
    """The notifier that wakes the tick; pysyncobj creates it only when built with appendEntriesUseBatch=False."""
    return getattr(so, "_SyncObj__pipeNotifier", None)


def poll_sockets(so: SyncObj) -> None:
    """Read whatever messages already wait in the sockets, without blocking."""
    so._poller.poll(0)


# -- snapshots -------------------------------------------------------------------------------------------------
# With a custom ``serializer``, pysyncobj calls ``serializer(dump_file + ".tmp", (last, previous, cluster))`` on the
# tick thread and then renames ``dump_file + ".tmp"`` over the dump file at once, assuming the write is done. Our
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


# -- journal ---------------------------------------------------------------------------------------------------
REGULAR_COMMAND = 0  # pysyncobj's _COMMAND_TYPE.REGULAR: the first byte of a journal entry for a replicated call


def committed_calls(journal_path: str, after_index: int) -> Iterator[tuple[Any, ...]]:
    """Arguments of every replicated call this node's journal holds as committed, after ``after_index``.

    The journal is the node's own file, written by pysyncobj; its entries are pickles only pysyncobj ever wrote.
    """
    journal = FileJournal(journal_path)
    try:
        commit = journal.getRaftCommitIndex()
        for i in range(len(journal)):
            command, index, _term = journal[i]
            if index <= after_index or index > commit or not command or command[0] != REGULAR_COMMAND:
                continue
            decoded = _pickle.loads(command[1:])
            yield decoded[1] if isinstance(decoded, tuple) and len(decoded) > 1 else ()
    finally:
        journal._destroy()


# -- guard -----------------------------------------------------------------------------------------------------
# pysyncobj snapshots (with its default serializer) every attribute set after SyncObj.__init__ returned, plus
# this one of its own: the enabled code version, which only setCodeVersion changes (Stator never calls it).
_OWN_LATE_ATTRIBUTES = frozenset({"_SyncObj__enabledCodeVersion"})


def replicated_attribute_names(so: SyncObj) -> set[str]:
    """Attributes pysyncobj would count as replicated state: those first set after ``SyncObj.__init__``."""
    return set(vars(so)) - so._SyncObj__properies - _OWN_LATE_ATTRIBUTES
