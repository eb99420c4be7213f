"""A follower of three in-process nodes whose ticks are held: only the test's raft messages reach its state."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from meta.raft import pysyncobj_shim as shim
from meta.raft.group_commit import ACK_MESSAGE
from meta.raft.node import MetaSyncObj
from tests.support.raft_nodes import leader_of, start_nodes


class Follower:
    """A follower whose ticks are held: only the test's messages reach its raft state, on the test's thread."""

    def __init__(self, node: MetaSyncObj):
        self.node = node
        self.leader = shim.leader(node)
        node._ticker.stop()         # what stop() does first, without closing the node's journal and sockets
        self.sent: list[dict[str, Any]] = []
        transport = shim.transport(node)
        send = transport.send

        def recording(to, message):
            self.sent.append(message)
            return send(to, message)

        transport.send = recording
        self._receive = transport._onMessageReceivedCallback

    def entry(self, index: int) -> tuple[Any, int, int]:
        return shim.log_entry(self.node, index)

    @property
    def last(self) -> int:
        return shim.current_log_index(self.node)

    @property
    def term(self) -> int:
        return self.node.raftCurrentTerm

    def append(self, term: int, prev: int, entries: list, commit: int) -> dict[str, Any]:
        """Hand the follower one append message from the leader and return its answer."""
        answers = self.answers_to(term, prev, entries, commit)
        assert len(answers) == 1, self.sent
        return answers[0]

    def answers_to(self, term: int, prev: int, entries: list, commit: int, prev_term: int | None = None,
                   **extra: Any) -> list[dict[str, Any]]:
        """Hand the follower one append message (``extra``: more fields) and return every acknowledgement it sent;
        ``prev_term`` by default the term of its own entry at ``prev``."""
        self.sent.clear()
        if prev_term is None:
            prev_term = self.entry(prev)[2]
        self._receive(self.leader, {"type": "append_entries", "term": term, "commit_index": commit,
                                    "prevLogIdx": prev, "prevLogTerm": prev_term, "entries": entries, **extra})
        return [m for m in self.sent if m.get("type") == ACK_MESSAGE]

    def append_in_pieces(self, term: int, prev: int, entry: tuple, commit: int) -> list[dict[str, Any]]:
        """The same for one entry sent as pysyncobj sends a big one, in a 'start' and a 'finish' piece; returns
        every message the follower sent in answer."""
        data = entry[0]
        base = {"type": "append_entries", "term": term, "commit_index": commit, "prevLogIdx": prev,
                "prevLogTerm": self.entry(prev)[2]}
        self.sent.clear()
        self._receive(self.leader, {**base, "transmission": "start", "data": data[:len(data) // 2]})
        self._receive(self.leader, {**base, "transmission": "finish", "data": data[len(data) // 2:]})
        return list(self.sent)

    def uncommitted_tail(self) -> tuple[int, int, int, Any]:
        """Two entries this term's leader appends after the follower's last and does not commit; returns the
        follower's (last, term, commit index) from before them and the command they carry."""
        last, term, commit = self.last, self.term, self.node.raftCommitIndex
        command = self.entry(last)[0]
        self.append(term, last, [(command, last + 1, term), (command, last + 2, term)], commit)
        assert self.last == last + 2 and self.node.raftCommitIndex == commit
        return last, term, commit, command

    def snapshot_piece(self, term: int, commit: int) -> None:
        """Hand the follower one message of a snapshot transfer as a leader sends it (``serialized``: a piece of
        the snapshot, None while the leader's serializer has none ready)."""
        self._receive(self.leader, {"type": "append_entries", "term": term, "commit_index": commit,
                                    "serialized": None})



@contextlib.asynccontextmanager
async def caught_up(base_dir, secret: str = "held-follower-test-secret", writes: int = 8,
                    wait_s: float = 20.0) -> AsyncIterator[Follower]:
    """Three nodes in this process replicate ``writes`` barriers; then one follower, caught up, is held (the
    ``held_follower`` fixture of tests/conftest.py)."""
    nodes = start_nodes(base_dir, secret)
    try:
        leader, raft = await leader_of(nodes, wait_s)
        for i in range(writes):
            r = await raft.propose({"type": "Barrier"}, f"rid-{i}", "system", timeout_s=wait_s)
            assert r["ok"], r
        f = next(n for n in nodes if n is not leader)
        last = shim.current_log_index(leader)
        deadline = time.monotonic() + wait_s
        while shim.current_log_index(f) < last or f.raftCommitIndex < last:
            assert time.monotonic() < deadline, "the follower did not catch up"
            await asyncio.sleep(0.05)
        yield Follower(f)
    finally:
        for n in nodes:
            n.stop()
