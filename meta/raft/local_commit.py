"""A follower's own commit, with three voters: the leader says how far its disk holds the log, the follower knows the rest.

Raft commits an entry of the leader's term once a majority of the voters hold it (thesis 3.6.2). pysyncobj's leader
learns that from the acknowledgements and then tells each follower (a commit notice, ``shim.send_commit_notice``),
so a follower's proposer was answered two hops after the follower's own sync: its acknowledgement to the leader, the
leader's tick, the notice back. With at most three voters the leader and any one follower are a majority, so a
follower that holds an entry on disk and knows that the leader does too knows it is committed, with no word back:

- **the leader**, right after each sync of its journal (in the tick that sent the entries, while the followers sync
  theirs), sends every voter a mark: ``{"type": "leader_synced", "term": T, "index": i}``, its journal durable up to
  ``i`` (``durable_index``: its last index when journal_sync is none, as its acknowledgements say then). It sends no
  commit notice to voters then; learners, which never commit on their own, still get them;
- **a voter** commits up to the lesser of the newest mark of its leader in the current term and the index its own
  journal is durable to (what its own sync covered, never what it acknowledged), when the entry there is of the
  current term (Raft counts only entries of the current term; earlier ones commit with it). Such an entry came from
  this term's leader, which never takes back its own entries, and a follower appends only after the entry before
  matched: by Raft's log matching the leader's log holds it and everything before it, so the leader's mark covers
  the very same entries. Nothing about what the follower acknowledged needs keeping.

Safe by Raft's own argument: two of three voters hold the entry durably under the term of the leader that made it,
so every future leader holds it (each needs a vote from one of the two, who grant it only to a log at least as
up to date). With a single-server membership change in flight a majority of the old voters and one of the new
overlap, so the follower's view of the voters (the newest membership in its log) is enough; with four voters or
more, or on a learner, nothing is committed here and the commit notices do it as before.

A follower may now have committed (and answered its client) an entry the leader has not counted yet: the leader's
linearizable reads take as read index the largest of its commit index and the last mark it sent in its term
(``commit_bound``), and the leader's own waits for what is committed do the same.

The only voter of a cluster is a majority by itself: right after its sync it commits what that sync covered
(``commit_alone``), by the same rule (an entry of its term, durable here), where pysyncobj would wait for the next tick.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import pysyncobj_shim as shim
from .group_commit import MARK_MESSAGE as LEADER_SYNCED, GroupCommit

VOTERS_MAX = 3   # the leader and one follower are a majority of at most three


def committable(*, mark: int, durable: int, commit: int, term_at: Callable[[int], int | None], term: int,
                voters: int) -> int | None:
    """The index a follower may raise its commit index to, or None. ``voters``: the voting members, this node and
    the leader among them; ``term_at(i)``: the term of this node's entry at i (None when its log does not hold it)."""
    if voters > VOTERS_MAX:
        return None
    index = min(mark, durable)
    if index <= commit or term_at(index) != term:
        return None
    return index


def caught_up(pysyncobj_ready: bool, applied: int, heard: int | None) -> bool:
    """A node's readiness. pysyncobj's wants, at some tick, the last applied index *equal* to the leader's commit
    index this node last heard of (``heard``); a follower committing on marks applies past it under a steady write
    load, and could stay unready for as long: past it counts as reached."""
    return pysyncobj_ready or (heard is not None and applied >= heard)


class LocalCommit:
    def __init__(self, so: Any, journal: GroupCommit, is_voter: Callable[[], bool]):
        self.so = so
        self._journal = journal
        self._is_voter = is_voter
        self.commits = 0   # times this node (a follower) raised its commit index on its own
        # the leader: the term of its marks and the last index it marked
        self._lead_term = 0
        self._marked = 0
        # a follower: the term and leader of its newest mark, and that mark
        self._follow: tuple[int, Any] = (0, None)
        self._mark = 0

    # -- the leader --------------------------------------------------------------------------------------------
    def marking(self) -> bool:
        """Leader: whether its voters commit on their own (then they get marks, not commit notices)."""
        return shim.is_leader(self.so) and 1 + len(shim.voters(self.so)) <= VOTERS_MAX

    def send_mark(self) -> None:
        """The leader's tick, after its sync: every voter learns how far the leader's journal is durable."""
        so = self.so
        if not self.marking():
            return
        term = so.raftCurrentTerm
        if term != self._lead_term:
            self._lead_term, self._marked = term, 0
        durable = self._journal.durable_index
        if durable <= self._marked:
            return
        self._marked = durable
        for node in shim.voters(so):   # a link that is down drops it: the next sync's mark covers this one's entries
            shim.send_message(so, node, {"type": LEADER_SYNCED, "term": term, "index": durable})
        shim.transport(so).flush()

    def commit_alone(self) -> bool:
        """Leader, right after its sync: the only voter (its learners never count) commits what its journal holds
        durably, as Raft's majority of one allows. pysyncobj moves a leader's commit index only at a tick's start, and
        with no acknowledgement to ask for that tick every write waited for the tick's timer (one writer: 20 writes a
        second, 50 ms each; tests/test_raft_only_voter.py). True when the commit index moved."""
        so = self.so
        if not shim.is_leader(so) or shim.voters(so):
            return False
        durable = self._journal.durable_index
        index = committable(mark=durable, durable=durable, commit=so.raftCommitIndex, term_at=lambda i: _term_at(so, i),
                            term=so.raftCurrentTerm, voters=1)
        if index is None:
            return False
        shim.commit_as_only_voter(so, index)
        return True

    def commit_bound(self) -> int:
        """The largest index any node may have taken for committed: the commit index, or on the leader the last
        index it marked in this term, if larger (a follower may have committed up to it on its own)."""
        commit = self.so.raftCommitIndex
        if shim.is_leader(self.so) and self._lead_term == self.so.raftCurrentTerm:
            return max(commit, self._marked)
        return commit

    # -- a follower --------------------------------------------------------------------------------------------
    def admit(self, node: Any, message: Any) -> bool:
        """Each incoming message, before pysyncobj: False for a mark (handled here)."""
        if not isinstance(message, dict) or message.get("type") != LEADER_SYNCED:
            return True
        term, index = message.get("term"), message.get("index")
        so = self.so
        if (type(term) is int and type(index) is int and term == so.raftCurrentTerm and not shim.is_leader(so)
                and node == shim.leader(so)):
            if self._follow != (term, node):
                self._follow, self._mark = (term, node), 0
            self._mark = max(self._mark, index)
            self.advance()
        return False

    def advance(self) -> None:
        """The tick, once this node's acknowledgements left: commit what the leader and this node both hold."""
        so = self.so
        term = so.raftCurrentTerm
        if (shim.is_leader(so) or self._follow != (term, shim.leader(so)) or not self._is_voter()
                or self._follow[1] not in shim.voters(so)):
            return
        index = committable(mark=self._mark, durable=self._journal.durable_index, commit=so.raftCommitIndex,
                            term_at=lambda i: _term_at(so, i), term=term, voters=1 + len(shim.voters(so)))
        if index is not None:
            shim.take_commit_notice(so, self._follow[1], index)
            self.commits += 1


def _term_at(so: Any, index: int) -> int | None:
    entry = shim.log_entry(so, index)
    return entry[2] if entry else None
