"""Every reach into pysyncobj's internals, in one module, for exactly the pysyncobj it was written against.

MetaSyncObj sends one append message per tick, keeps idle links up, holds back a restarted node's first election,
saves the commit index on stop and writes its own snapshot file. pysyncobj has no public API for any of that, so
these functions touch its name-mangled attributes (``_SyncObj__*``), its protected hooks and its journal and
snapshot layouts. Any release may rename or change them without notice; importing this module against another
version therefore fails at start-up, loudly, instead of letting a node misbehave quietly.

Protected hooks MetaSyncObj overrides (same version pin): ``_applyCommand``, ``_checkCommandsToApply``, ``_onTick``.
``JournalSync`` (group commit) wraps methods of the node's own journal and transport objects, same pin.
``keep_matching_entries`` puts a follower's incoming append messages in Raft's terms before pysyncobj sees them.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pysyncobj.pickle as _pickle
from pysyncobj import SERIALIZER_STATE, SyncObj
import pysyncobj.journal as _journal_mod
from pysyncobj.journal import FileJournal, MetaStorer
from pysyncobj.syncobj import _COMMAND_TYPE
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


def save_commit_index(so: SyncObj) -> None:
    """What the journal's one-second timer does: persist the commit index it otherwise saves lazily."""
    so._SyncObj__raftLog.onOneSecondTimer()


# -- transport -------------------------------------------------------------------------------------------------
def send_append_entries(so: SyncObj) -> None:
    so._SyncObj__sendAppendEntries()


def send_message(so: SyncObj, node: Node, message: dict[str, Any]) -> None:
    transport(so).send(node, message)


def pipe_notifier(so: SyncObj) -> Any:
    """The notifier that wakes the tick; pysyncobj creates it only when built with appendEntriesUseBatch=False."""
    return getattr(so, "_SyncObj__pipeNotifier", None)


def poll_sockets(so: SyncObj) -> None:
    """Read whatever messages already wait in the sockets, without blocking."""
    so._poller.poll(0)


# -- commands forwarded by followers ---------------------------------------------------------------------------
# A follower's call of a @replicated method goes to the leader as pysyncobj's ``apply_command`` message; the leader
# hands its ``command`` to ``_applyCommand`` with the callback ``(sender node, request id)``, appends it to the log
# and answers with its index; the follower's callback fires when it applied that index itself. ``command`` is the
# REGULAR type byte and the pickle of ``(method id, args)`` that pysyncobj's ``replicated`` wrapper made (no kwargs).
def is_forwarded(callback: Any) -> bool:
    """Whether ``_applyCommand`` got this command from a follower (pysyncobj's ``(node, request id)`` callback)."""
    return isinstance(callback, tuple)


def single_argument(command: Any) -> tuple[Any, Any] | None:
    """(method id, argument) of a REGULAR command that calls one method with one positional argument, else None."""
    if not isinstance(command, bytes) or not command or command[0] != REGULAR_COMMAND:
        return None
    try:
        decoded = _pickle.loads(command[1:])
    except Exception:  # noqa: BLE001 - whatever it holds, the command then goes to the log unchanged
        return None
    if isinstance(decoded, tuple) and len(decoded) == 2 and isinstance(decoded[1], tuple) and len(decoded[1]) == 1:
        return decoded[0], decoded[1][0]
    return None


def with_argument(method_id: Any, argument: Any) -> bytes:
    """The REGULAR command calling ``method_id`` with ``argument``, as pysyncobj's ``replicated`` encodes it."""
    return bytes([REGULAR_COMMAND]) + _pickle.dumps((method_id, (argument,)))


def method_id(so: SyncObj, name: str) -> Any:
    """pysyncobj's id of the @replicated method ``name`` (registered under its versioned name: version 0)."""
    return so._methodToID[f"{name}_v0"]


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
            yield call_args(command)
    finally:
        journal._destroy()


def call_args(command: bytes) -> tuple[Any, ...]:
    """The arguments of the replicated call a regular journal entry's command holds (pysyncobj's own pickle)."""
    decoded = _pickle.loads(command[1:])
    return decoded[1] if isinstance(decoded, tuple) and len(decoded) > 1 else ()


# -- journal integrity ----------------------------------------------------------------------------------------
# pysyncobj's journal (journal.py, "APP_NAME + APP_VERSION + FORMAT_VERSION + LAST_RECORD_OFFSET, then per record
# size + (index, term, command) + size") carries no checksum, and FileJournal reads it back without a check: a
# flipped bit is a different index, term or command, replayed as if committed. check_journal refuses what a check
# can see before pysyncobj reads the file: a header that is not pysyncobj's, a record whose two size fields differ,
# indexes that do not follow one another, terms that go back or pass the node's current term, an entry that is
# neither a no-op nor a replicated call decoding to an envelope. What it cannot see: a change inside an envelope's
# JSON that still parses (a digit), or a term changed to another value still in order; only a checksum inside the
# command could (the envelope is built in RaftNode.propose), which this module cannot add without changing what
# pysyncobj stores and sends.
# A meta node's journal holds two kinds of entries: a new term's no-op (pysyncobj writes the type byte alone) and
# replicated calls; membership and code-version entries are never written (dynamicMembershipChange=False, no
# setCodeVersion), so one of those is a damaged type byte.
NO_OP_COMMAND = bytes([_COMMAND_TYPE.NO_OP])
_SIZE = struct.Struct("<I")


class JournalDamaged(RuntimeError):
    """The node's raft journal fails a consistency check; the message is one line naming the file and the record."""


def check_journal(path: str) -> int:
    """Raises JournalDamaged when the journal at ``path`` fails a check (above); returns the records checked."""
    if not os.path.exists(path):
        return 0

    def damaged(why: str) -> JournalDamaged:
        return JournalDamaged(f"{path}: the raft journal is damaged ({why}); pysyncobj keeps no checksum, so this "
                              "node cannot trust its log: move its data directory away and let it rejoin from a peer")

    with open(path, "rb") as f:
        # Mapped, not read: the file is preallocated in big chunks and may hold gigabytes of entries at scale.
        raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
    name_size, version_at = _journal_mod.NAME_SIZE, _journal_mod.NAME_SIZE + _journal_mod.VERSION_SIZE
    if (raw[:name_size] != _journal_mod.APP_NAME.ljust(name_size, b"\0")
            or raw[version_at:version_at + 4] != _SIZE.pack(_journal_mod.JOURNAL_FORMAT_VERSION)):
        raise damaged("its header is not pysyncobj's")
    try:
        journal = FileJournal(path)
    except Exception as e:   # pysyncobj read past what the file holds: a damaged size field
        raise damaged(f"pysyncobj cannot read it: {type(e).__name__}") from None
    try:
        # pysyncobj stores a new term (meta file, before any vote or entry of it) before it appends an entry of that
        # term, so no entry is newer; with the journal mode that does not sync, a power loss can break that too.
        current_term = journal.getCurrentTerm()
        pos = _journal_mod.FIRST_RECORD_OFFSET
        previous: tuple[int, int] | None = None
        for i in range(len(journal)):
            command, index, term = journal[i]
            size = _SIZE.pack(16 + len(command))
            where = f"record {i}, log index {index}"
            if raw[pos:pos + 4] != size or raw[pos + 20 + len(command):pos + 24 + len(command)] != size:
                raise damaged(f"{where}: its two size fields differ")
            if previous is not None and (index != previous[0] + 1 or term < previous[1]):
                raise damaged(f"{where}: follows index {previous[0]} term {previous[1]} with term {term}")
            if term > current_term:
                raise damaged(f"{where}: term {term} is past the node's current term {current_term}")
            if command != NO_OP_COMMAND and not (command[:1] == bytes([REGULAR_COMMAND]) and _is_envelope_call(command)):
                raise damaged(f"{where}: neither a new term's no-op nor a replicated call that decodes")
            pos += 24 + len(command)
            previous = (index, term)
        return len(journal)
    finally:
        journal._destroy()


def _is_envelope_call(command: bytes) -> bool:
    """pysyncobj's replicated call ``(function id, (payload,), kwargs)``, its payload an envelope's JSON object."""
    try:
        decoded = _pickle.loads(command[1:])   # the node's own file: what pysyncobj would unpickle to replay it
        payload = decoded[1][0]
        return isinstance(payload, str) and isinstance(json.loads(payload), dict)
    except Exception:
        return False


# -- journal durability (group commit) -------------------------------------------------------------------------
# pysyncobj 0.3.17 writes its journal through a shared mmap (``FileJournal.add``) and never msyncs it but on close;
# it stores term and vote (``MetaStorer.storeMeta``, called by ``setCurrentTerm`` before any vote goes out) with a
# rename and no fsync. Where a node promises durability in its flow:
# - a follower: ``__onMessageReceived`` appends an append_entries message's entries to the journal and at once
#   sends ``next_node_idx`` with ``success=True`` through ``transport.send``: that message is the acknowledgement;
# - the leader: ``_onTick`` counts itself (``count = 1``) for every entry of its own journal when it advances the
#   commit index, at the start of a tick; its entries are appended in ``_checkCommandsToApply`` later in a tick
#   (and the no-op of a new term while messages are read).
# So: every journal mutation marks the journal dirty; a success ``next_node_idx`` msyncs a dirty journal before it
# leaves; the leader msyncs once per tick right after sending the tick's entries (its disk works while the
# followers do) and once more before the commit computation if anything was appended since. One msync covers
# every entry appended since the previous one: group commit per tick (one per append message on a follower).
_JOURNAL_MUTATORS = ("add", "clear", "deleteEntriesFrom", "deleteEntriesTo")
ACK_MESSAGE = "next_node_idx"   # a follower's answer to append_entries; with success=True it acknowledges entries


class _DurableMetaStorer(MetaStorer):
    """pysyncobj's term/vote/commit-index file, written durably: fsync the new file, rename, fsync the directory."""

    def __init__(self, path: str):
        super().__init__(path)
        self.stores = 0

    def storeMeta(self, meta: dict[str, Any]) -> None:
        path = self.getPath()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_pickle.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(os.path.dirname(os.path.abspath(path)))
        self.stores += 1


def fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def datasync_journal(journal: FileJournal) -> None:
    """Write the journal's dirty pages to disk and wait, with the GIL released.

    pysyncobj's ``flush`` is ``mmap.flush``: msync(MS_SYNC) of the whole mapping, and CPython 3.11 holds the GIL
    through that call, so every group commit stopped the event loop for as long as the disk took (py-spy under
    vs_etcd at 64 writers: 16-28% of every node's samples in it). On Linux msync(MS_SYNC) of a shared file mapping is
    ``vfs_fsync_range(file, ..., datasync=1)``: the fdatasync of the file writes the same pages (the kernel tracks
    pages dirtied through the mapping), and ``os.fdatasync`` waits with the GIL released. Elsewhere: msync."""
    if not sys.platform.startswith("linux"):
        journal.flush()
        return
    resizable = journal._FileJournal__journalFile
    os.fdatasync(resizable._ResizableFile__f.fileno())


def _last_index(journal: FileJournal) -> int:
    return journal[-1][1] if len(journal) else 0


class JournalSync:
    """Group commit of one node's journal, and the evidence of it.

    With ``durable`` False nothing is synced (pysyncobj's own behaviour) but the same bookkeeping runs, so a test
    sees the difference: ``acks_unsynced`` / ``commits_unsynced`` count acknowledgements and leader commits that
    covered entries no msync had covered yet (always 0 when durable).
    """

    def __init__(self, so: SyncObj, durable: bool, snapshot_path: str):
        journal = so._SyncObj__raftLog
        if not isinstance(journal, FileJournal):
            raise TypeError(f"JournalSync needs pysyncobj's FileJournal, not {type(journal).__name__}")
        self.durable = durable
        self._journal = journal
        self._dirty = False
        # A cleared journal either follows a snapshot installed from the leader (pysyncobj writes the received file
        # and renames it, with no fsync) or a compaction (our own snapshot writer fsyncs): the snapshot file must be
        # durable before the journal that no longer holds its entries is.
        self._snapshot_path = snapshot_path
        self._cleared = False
        self.synced_index = _last_index(journal)   # what was on disk at start-up counts as synced
        self.syncs = 0
        self.snapshot_fsyncs = 0
        self.acks_checked = 0
        self.acks_unsynced = 0
        self.commits_checked = 0
        self.commits_unsynced = 0
        for name in _JOURNAL_MUTATORS:
            setattr(journal, name, self._marking(getattr(journal, name)))
        journal.clear = self._noting_clear(journal.clear)
        self._meta_storer: _DurableMetaStorer | None = None
        if durable:
            path = journal._FileJournal__metaStorer.getPath()
            self._meta_storer = journal._FileJournal__metaStorer = _DurableMetaStorer(path)
            fsync_directory(os.path.dirname(os.path.abspath(path)))   # the journal file's own name
        link = transport(so)
        link.send = self._syncing_acks(link.send)

    def _marking(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def mutate(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            self._dirty = True
            # A truncation takes back what the last sync covered above the new end.
            self.synced_index = min(self.synced_index, _last_index(self._journal))
            return result
        return mutate

    def _noting_clear(self, clear: Callable[[], Any]) -> Callable[[], Any]:
        def noted() -> Any:
            self._cleared = True
            return clear()
        return noted

    def _syncing_acks(self, send: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def send_after_sync(node: Any, message: Any) -> Any:
            if isinstance(message, dict) and message.get("type") == ACK_MESSAGE and message.get("success"):
                self.sync()
                self.acks_checked += 1
                if message["next_node_idx"] - 1 > self.synced_index:
                    self.acks_unsynced += 1
            return send(node, message)
        return send_after_sync

    def sync(self) -> None:
        """msync the journal if anything changed since the last time (no-op when not durable)."""
        if not self.durable or not self._dirty:
            return
        self._dirty = False
        if self._cleared:
            self._cleared = False
            if os.path.exists(self._snapshot_path):
                with open(self._snapshot_path, "rb") as f:
                    os.fsync(f.fileno())
                fsync_directory(os.path.dirname(os.path.abspath(self._snapshot_path)))
                self.snapshot_fsyncs += 1
        datasync_journal(self._journal)
        self.syncs += 1
        self.synced_index = _last_index(self._journal)

    def check_commit(self, commit_index: int, synced_before: int) -> None:
        """After a leader's tick that advanced its commit index: the index must not pass what was synced before
        the tick computed it (the leader counted itself for every entry up to there)."""
        self.commits_checked += 1
        if commit_index > synced_before:
            self.commits_unsynced += 1

    def stats(self) -> dict[str, Any]:
        return {"durable": self.durable, "syncs": self.syncs, "snapshot_fsyncs": self.snapshot_fsyncs,
                "synced_index": self.synced_index,
                "acks_checked": self.acks_checked, "acks_unsynced": self.acks_unsynced,
                "commits_checked": self.commits_checked, "commits_unsynced": self.commits_unsynced,
                "meta_fsyncs": self._meta_storer.stores if self._meta_storer is not None else 0}


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
_APPEND = "append_entries"


class HeldEntries:
    """Counts of the append messages that repeated entries this follower held (see above)."""

    def __init__(self) -> None:
        self.trimmed = 0     # a held prefix was dropped: pysyncobj would have deleted the entries after it
        self.repeats = 0     # every entry was held and the log went on: pysyncobj would have deleted the rest


def keep_matching_entries(so: SyncObj) -> HeldEntries:
    """Route the node's incoming raft messages through ``_append_as_raft`` (see above). Before the node ticks."""
    handle = so._SyncObj__onMessageReceived
    counts = HeldEntries()

    def received(node: Node, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") == _APPEND and "prevLogIdx" in message:
            message = _append_as_raft(so, node, message, handle, counts)
            if message is None:
                return
        handle(node, message)

    transport(so).setOnMessageReceivedCallback(received)
    return counts


def _append_as_raft(so: SyncObj, node: Node, message: dict[str, Any], handle: Callable[[Node, Any], None],
                    counts: HeldEntries) -> dict[str, Any] | None:
    """The message pysyncobj should see instead of ``message``, or None once it is handled here."""
    if message["term"] < so._SyncObj__raftCurrentTerm:
        return message                         # refused as stale by pysyncobj itself
    transmission = message.get("transmission")
    if transmission is not None:
        if transmission != "finish":
            return message                     # a piece of one big entry: no entry is written yet
        # The last piece of one big entry: decode it here (as pysyncobj would) so it goes through the same check.
        whole = so._SyncObj__recvTransmission + message["data"]
        so._SyncObj__recvTransmission = ""
        message = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        message["entries"] = [_pickle.loads(whole)]
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
