"""Linearizable reads without a log entry: the read index (Raft thesis 6.4, etcd's ReadIndex).

A linearizable read on any node waits until that node has applied everything the cluster committed before the read
began, and is then served from the node's image. Until now each one appended a barrier entry to the log (a write,
with its fsyncs, per read); here no entry is appended:

- **On the leader**, once it has committed an entry of its own term (its no-op: until then its commit index may lag
  what an earlier leader committed), the read index is its commit index, or the last index it told its followers
  its disk holds, when larger: a follower may have committed up to there on its own (meta/raft/local_commit.py)
  and answered a write the leader has not counted yet. It then makes sure it still leads: it sends
  its voters a read probe (``read_probe``, a sequence number) and waits until a majority, itself included, answered
  a probe sent after the read arrived. No newer leader can have committed anything before that moment, since a
  majority still took this node as leader after it. Reads arriving meanwhile share the next probe.
- **On a follower**, the node asks the leader (``read_index``), which answers with the index once its probe is
  confirmed (``read_index_answer``; None when it cannot: not the leader, or no entry of its term committed yet).
- **Then, on either**, once pysyncobj has handed every entry up to the index to the apply thread, a call queued
  behind them (``Applier.submit_call``) answers the read: the image it reads holds them all.

A read that cannot be served (no leader known, leadership lost, the leader changed while a follower waited, its
deadline passed) is answered at once with a reason; the caller (meta/reads.py) tries again within its own wait.
Everything here runs on the tick except ``request`` (the event loop), which only appends to a queue.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import pysyncobj_shim as shim

READ_INDEX = "read_index"
READ_INDEX_ANSWER = "read_index_answer"
READ_PROBE = "read_probe"
READ_PROBE_ACK = "read_probe_ack"
READS_PENDING_MAX = 10_000      # reads waiting on one node at once; more are refused (OVERLOADED)
ASKED_MAX = 10_000              # a follower's reads waiting for the leader's answer

# done(index, None) once the read may be served; done(None, code) when it cannot be: code is one of these
NO_LEADER, LEADER_CHANGED, OVERLOADED, TIMED_OUT = "NO_LEADER", "LEADER_CHANGED", "OVERLOADED", "TIMED_OUT"
Done = Callable[[int | None, str | None], None]


def incarnation_nonce() -> int:
    """Where this incarnation's request ids start: 56 random bits, then room to count."""
    return int.from_bytes(os.urandom(7), "big") << 7


@dataclass
class ReadIndexCounts:
    """Since start, for the metrics: reads served here by index, probes this node sent as leader, read indexes it
    answered for followers, and reads refused (any reason)."""
    served: int = 0
    probes: int = 0
    answered: int = 0
    refused: int = 0


@dataclass
class _Read:
    done: Done
    deadline: float               # shim.clock(); until the tick takes the read, its timeout in seconds
    index: int = 0                # the read index, once known
    probe: int = 0                # the probe that must be confirmed (leader)


@dataclass
class _Leading:
    """The leader's reads of one term."""
    term: int
    seq: int = 0                                            # the last probe sent
    acked: dict[str, int] = field(default_factory=dict)     # voter address -> the newest probe it answered
    unprobed: list[Callable[[int | None], None]] = field(default_factory=list)   # wait for the next probe
    probed: list[tuple[int, int, Callable[[int | None], None]]] = field(default_factory=list)   # (probe, index, reply)


class ReadIndex:
    def __init__(self, so: Any, submit_call: Callable[[Callable[[], None]], None], wake: Callable[[], None],
                 commit_bound: Callable[[], int]):
        """``so``: the MetaSyncObj; ``submit_call(fn)``: run fn on the apply thread after every entry handed over so
        far (Applier.submit_call); ``wake()``: run the next tick now (any thread); ``commit_bound()``: the leader's
        read index, its commit index or, when larger, the last index a follower may have committed on its own
        and answered for (meta/raft/local_commit.py)."""
        self.so = so
        self._commit_bound = commit_bound
        self._submit_call = submit_call
        self._wake = wake
        self._incoming: collections.deque[_Read] = collections.deque()   # from the event loop
        self._leading: _Leading | None = None
        self._asked: dict[int, tuple[Any, _Read]] = {}                   # id -> (leader asked, read)
        # Ids go on from a number of this incarnation's own: a leader answers a request when its probe is confirmed,
        # maybe after the follower restarted, and a restarted follower counting from 1 again took that answer, an
        # index of before its own read began, for a read of its own (a stale read)
        self._ids = itertools.count(incarnation_nonce())
        self._applying: list[_Read] = []                                  # index known, waiting for it to be handed over
        self.counts = ReadIndexCounts()

    # -- the event loop ----------------------------------------------------------------------------------------
    def request(self, done: Done, timeout_s: float) -> None:
        """Any thread: ``done`` (on the tick or the apply thread) says when a linearizable read may be served."""
        if len(self._incoming) >= READS_PENDING_MAX:
            done(None, OVERLOADED)   # not counted: the counts belong to the tick
            return
        self._incoming.append(_Read(done, timeout_s))   # the tick reads the clock: it is the node's
        self._wake()

    # -- the tick ----------------------------------------------------------------------------------------------
    def tick(self) -> None:
        so = self.so
        now = shim.clock()
        leading = self._leading
        if leading is not None and (not shim.is_leader(so) or so.raftCurrentTerm != leading.term):
            self._stop_leading()
        while self._incoming:
            read = self._incoming.popleft()
            read.deadline += now
            if shim.is_leader(so):
                self._lead(lambda index, read=read: self._indexed(read, index))
            elif (leader := shim.leader(so)) is not None and len(self._asked) < ASKED_MAX:
                rid = next(self._ids)
                self._asked[rid] = (leader, read)
                shim.send_message(so, leader, {"type": READ_INDEX, "id": rid})
            else:
                self._refuse(read, NO_LEADER if leader is None else OVERLOADED)
        for rid, (leader, read) in list(self._asked.items()):
            if shim.leader(so) != leader or read.deadline < now:
                del self._asked[rid]
                self._refuse(read, LEADER_CHANGED if read.deadline >= now else TIMED_OUT)
        self._probe()
        self._hand_over(now)

    def _lead(self, reply: Callable[[int | None], None]) -> None:
        """On the leader: ``reply(index)`` once leadership is confirmed after now, ``reply(None)`` if it is lost."""
        so = self.so
        if self._leading is None:
            self._leading = _Leading(so.raftCurrentTerm)
        if shim.committed_term(so) != so.raftCurrentTerm:
            reply(None)   # no entry of this term committed yet: the commit index may be behind; ask again shortly
            return
        self._leading.unprobed.append(reply)

    def _probe(self) -> None:
        leading = self._leading
        if leading is None or not leading.unprobed:
            return
        so = self.so
        leading.seq += 1
        index = self._commit_bound()
        leading.probed += [(leading.seq, index, reply) for reply in leading.unprobed]
        leading.unprobed = []
        self.counts.probes += 1
        for node in shim.voters(so):
            shim.send_message(so, node, {"type": READ_PROBE, "term": leading.term, "seq": leading.seq})
        self._confirm()

    def _confirm(self) -> None:
        leading = self._leading
        voters = shim.voters(self.so)
        majority = (len(voters) + 1) / 2
        still = []
        for seq, index, reply in leading.probed:
            if 1 + sum(leading.acked.get(v.address, 0) >= seq for v in voters) > majority:
                reply(index)
            else:
                still.append((seq, index, reply))
        leading.probed = still

    def _stop_leading(self) -> None:
        leading, self._leading = self._leading, None
        for reply in [*leading.unprobed, *(r for _, _, r in leading.probed)]:
            reply(None)

    def _indexed(self, read: _Read, index: int | None) -> None:
        if index is None:
            self._refuse(read, LEADER_CHANGED)
        else:
            read.index = index
            self._applying.append(read)

    def _hand_over(self, now: float) -> None:
        """Answer every read whose index pysyncobj has handed to the apply thread, from the apply thread."""
        if not self._applying:
            return
        handed = self.so.raftLastApplied
        waiting = []
        for read in self._applying:
            if read.index <= handed:
                self.counts.served += 1
                self._submit_call(lambda read=read: read.done(read.index, None))
            elif read.deadline < now:
                self._refuse(read, TIMED_OUT)
            else:
                waiting.append(read)
        self._applying = waiting

    def _refuse(self, read: _Read, code: str) -> None:
        self.counts.refused += 1
        read.done(None, code)

    # -- messages ----------------------------------------------------------------------------------------------
    def admit(self, node: Any, message: Any) -> bool:
        """Each incoming message, before pysyncobj: False for the read index's own."""
        if not isinstance(message, dict):
            return True
        kind = message.get("type")
        so = self.so
        if kind == READ_INDEX:
            rid = message.get("id")
            if type(rid) is int:
                def answer(index: int | None, node: Any = node, rid: int = rid) -> None:
                    self.counts.answered += 1
                    shim.send_message(so, node, {"type": READ_INDEX_ANSWER, "id": rid, "index": index})
                if shim.is_leader(so):
                    self._lead(answer)
                    self._probe()
                else:
                    answer(None)
            return False
        if kind == READ_INDEX_ANSWER:
            rid = message.get("id")
            found = self._asked.get(rid) if type(rid) is int else None
            if found is not None and found[0] == node:   # from the leader asked, nobody else
                del self._asked[rid]
                index = message.get("index")
                if type(index) is int and index >= 0:
                    self._indexed(found[1], index)
                    self._hand_over(shim.clock())
                else:
                    self._refuse(found[1], NO_LEADER)
            return False
        if kind == READ_PROBE:
            term, seq = message.get("term"), message.get("seq")
            if type(term) is int and type(seq) is int and term >= so.raftCurrentTerm:
                shim.send_message(so, node, {"type": READ_PROBE_ACK, "term": term, "seq": seq})
            return False
        if kind == READ_PROBE_ACK:
            leading, seq = self._leading, message.get("seq")
            if (leading is not None and message.get("term") == leading.term and type(seq) is int
                    and shim.is_leader(so) and node in shim.voters(so)):
                leading.acked[node.address] = max(leading.acked.get(node.address, 0), seq)
                self._confirm()
            return False
        return True
