"""Group commit of a node's journal: one fdatasync covers every entry appended since the last, before it counts.

Where a node promises durability in pysyncobj's flow:
- a follower appends an append_entries message's entries to its journal and answers ``next_node_idx`` with
  ``success=True``: that answer is the acknowledgement. Answers leave when the transport flushes (once per tick
  phase); ``before_flush`` syncs the journal once if any answer among them is an acknowledgement;
- the leader counts itself (``count = 1``) for every entry of its own journal when it advances the commit index, at
  the start of a tick; its entries are appended in ``_checkCommandsToApply`` later in a tick (and the no-op of a new
  term while messages are read). It has the disk start on a tick's entries before it sends them (``start_writeback``),
  syncs once per tick right after they left (its disk works while the followers' do) and once more before the
  commit computation if anything was appended since.

With ``durable`` False nothing is synced but the same bookkeeping runs, so a test and an operator see the
difference: ``acks_unsynced`` / ``commits_unsynced`` / ``marks_unsynced`` count acknowledgements, leader commits and
the leader's marks (meta/raft/local_commit.py) that covered entries no sync had covered yet (always 0 when durable).
An acknowledgement or a mark is checked as it is written to its link (``sent``), not where the sync is, so one sent
before its sync by any path is counted.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from .journal import StatorJournal

log = structlog.get_logger("meta.raft")
SLOW_SYNC_S = 0.1   # a sync this long is half the shortest election timeout

ACK_MESSAGE = "next_node_idx"   # a follower's answer to append_entries; with success=True it acknowledges entries
MARK_MESSAGE = "leader_synced"  # the leader's word of how far its journal is on disk (meta/raft/local_commit.py)


class GroupCommit:
    def __init__(self, journal: StatorJournal, durable: bool):
        self.durable = durable
        self._journal = journal
        self.acks_checked = 0
        self.acks_unsynced = 0
        self.commits_checked = 0
        self.commits_unsynced = 0
        self.marks_checked = 0
        self.marks_unsynced = 0
        self.slow_syncs = 0
        self.sync_seconds_max = 0.0

    @property
    def synced_index(self) -> int:
        return self._journal.synced_index

    @property
    def durable_index(self) -> int:
        """How far this node's log counts as on disk: the synced index, or with ``durable`` False the last index
        (what its acknowledgements and commits count on then)."""
        return self._journal.synced_index if self.durable else self._journal.last_index

    def sync(self) -> None:
        """fdatasync the journal if anything changed since the last time (no-op when not durable)."""
        if not self.durable:
            return
        started = time.monotonic()
        if self._journal.sync():
            took = time.monotonic() - started
            self.sync_seconds_max = max(self.sync_seconds_max, took)
            if took > SLOW_SYNC_S:
                # As etcd's "slow fdatasync": the disk held this node's raft loop (and, on a leader, its heartbeats).
                self.slow_syncs += 1
                log.warning("raft_journal_sync_slow", seconds=round(took, 3), synced_index=self.synced_index)

    def start_writeback(self) -> None:
        """The leader, once a tick appended its entries and before it sends them: the disk starts on them while
        they are encoded and sent, so the ``sync`` after the sends (the leader's group commit) waits for less.
        Nothing counts as durable by it (no-op when not durable)."""
        if self.durable:
            self._journal.start_writeback()

    def before_flush(self, messages: list[dict[str, Any]]) -> None:
        """The transport's hook: acknowledgements about to leave must cover only entries on disk."""
        if any(m.get("type") == ACK_MESSAGE and m.get("success") for m in messages):
            self.sync()

    def sent(self, messages: list[dict[str, Any]]) -> None:
        """The transport's hook once messages are written to a link: an acknowledgement, or a leader's mark, that
        left covering an entry no sync had covered by then is counted (wherever it was sent from, whatever synced
        or not before)."""
        for m in messages:
            kind = m.get("type")
            if kind == ACK_MESSAGE and m.get("success"):
                self.acks_checked += 1
                if m["next_node_idx"] - 1 > self._journal.synced_index:
                    self.acks_unsynced += 1
            elif kind == MARK_MESSAGE:
                self.marks_checked += 1
                if m["index"] > self._journal.synced_index:
                    self.marks_unsynced += 1

    def check_commit(self, commit_index: int, synced_before: int) -> None:
        """After a leader's tick that advanced its commit index: the index must not pass what was synced before
        the tick computed it (the leader counted itself for every entry up to there)."""
        self.commits_checked += 1
        if commit_index > synced_before:
            self.commits_unsynced += 1

    def stats(self) -> dict[str, Any]:
        return {"durable": self.durable, "syncs": self._journal.syncs, "synced_index": self._journal.synced_index,
                "acks_checked": self.acks_checked, "acks_unsynced": self.acks_unsynced,
                "commits_checked": self.commits_checked, "commits_unsynced": self.commits_unsynced,
                "marks_checked": self.marks_checked, "marks_unsynced": self.marks_unsynced,
                "state_writes": self._journal.state_writes, "writebacks": self._journal.writebacks,
                "slow_syncs": self.slow_syncs, "sync_seconds_max": self.sync_seconds_max}
