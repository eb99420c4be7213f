"""The log as a meta node's parts see it: who leads and in which term, a proposal answered by this node's own apply,
the applied image under its lock, the membership, and the counters the metrics report.

One object over the two that make the Raft node, ``MetaSyncObj`` (pysyncobj: elections, replication, apply, on its
own threads) and ``RaftNode`` (its asyncio face), so that no part holds both or reaches into either. It only
delegates: what each call does is said where it is done (meta/raft/node.py, meta/raft/roles.py).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from . import limits
from .raft import pysyncobj_shim as shim
from .image import Image
from .raft.node import MetaSyncObj, RaftNode
from .raft.prevote import PreVoteCounts
from .raft.read_index import ReadIndexCounts

T = TypeVar("T")


class Log:
    def __init__(self, node: MetaSyncObj, raft: RaftNode):
        self._node = node
        self._raft = raft
        self._ready_at: int | None = None   # the commit index when pysyncobj first said ready
        self._caught_up = False

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """On the event loop: starts the apply thread, and the tick on the loop (meta/raft/loop_ticker.py)."""
        self._node.start(self._raft.loop)

    def stop(self) -> None:
        """Blocking: run it in an executor."""
        self._node.stop()

    # -- who leads ---------------------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self._node.is_leader()

    def leader_address(self) -> str | None:
        return self._node.leader_address()

    def term(self) -> int:
        return self._node.term()

    def is_ready(self) -> bool:
        """Caught up with the leader: pysyncobj's onReady (the leader's commit index reached), and the image holds
        that index. onReady counts entries queued to the apply thread, not applied: a restarted follower said it
        was ready with its image at version 49 while the leader's stood at 301. Once true, stays true."""
        if self._caught_up:
            return True
        if not self._node.isReady():
            return False
        if self._ready_at is None:
            self._ready_at = self._node.raftCommitIndex
        self._caught_up = self._node.applied_index >= self._ready_at
        return self._caught_up

    # -- writes ------------------------------------------------------------------------------------------------
    async def propose(self, cmd: dict[str, Any], rid: str | None, actor: str,
                      timeout_s: float = limits.PROPOSE_TIMEOUT_S) -> dict[str, Any]:
        """The command's outcome once this node applied it (meta/raft/node.py RaftNode.propose)."""
        return await self._raft.propose(cmd, rid, actor, timeout_s)

    async def read_index(self, timeout_s: float) -> None:
        """Once this node's image holds every write acknowledged before the call; nothing is appended
        (meta/raft/node.py RaftNode.read_index)."""
        await self._raft.read_index(timeout_s)

    async def applied_commit(self, timeout_s: float) -> bool:
        """Once this node applied every entry it knew committed at the call; False after ``timeout_s``
        (meta/raft/node.py RaftNode.applied_commit)."""
        return await self._raft.applied_commit(timeout_s)

    # -- the applied image -------------------------------------------------------------------------------------
    @property
    def image(self) -> Image:
        return self._node.current_image()

    @property
    def image_lock(self) -> threading.RLock:
        """Held by the apply thread while it applies an entry."""
        return self._node.image_lock

    def read(self, fn: Callable[[Image], T]) -> T:
        """``fn(image)`` under the image lock, so it never sees half of an applied command."""
        with self._node.image_lock:
            return fn(self.image)

    def data_version(self) -> int:
        """The version of the replicated image data as it stands (the image is not rebound: any thread)."""
        return self._node.image_data["version"]

    def commit_index(self) -> int:
        return self._node.raftCommitIndex

    def commit_lag(self) -> int:
        return self._node.commit_lag()

    @property
    def applied_index(self) -> int:
        return self._node.applied_index

    # -- the membership (meta/raft/roles.py) -------------------------------------------------------------------
    def member_name(self, address: str) -> str:
        return self._node.roles.name_of(address)

    def member_url(self, address: str) -> str | None:
        return self._node.roles.url_of(address)

    @property
    def removed(self) -> bool:
        return self._node.roles.removed

    def membership_status(self) -> dict[str, Any]:
        return self._node.membership_status()

    def change_membership(self, op: str, name: str, raft: str | None = None,
                          url: str | None = None) -> concurrent.futures.Future:
        return self._node.roles.request(op, name, raft, url)

    # -- for the metrics ---------------------------------------------------------------------------------------
    def set_apply_observer(self, observe: Callable[[float], None]) -> None:
        self._node.set_apply_observer(observe)

    def follower_lag(self) -> dict[str, int]:
        return self._node.follower_lag()

    @property
    def role_changes(self) -> dict[str, int]:
        return self._node.role_changes

    @property
    def slow_ticks(self) -> int:
        return self._node.slow_ticks

    @property
    def proposal_wakes_deferred(self) -> int:
        return self._node.proposal_wakes_deferred

    @property
    def proposals_forwarded_at_once(self) -> int:
        return self._node.proposals_forwarded_at_once

    @property
    def entries_appended_at_once(self) -> int:
        return self._node.entries_appended_at_once

    def snapshot_counts(self) -> dict[str, int]:
        return self._node.snapshot_counts()

    def journal_stats(self) -> dict[str, Any]:
        return self._node.journal_stats()

    def held_entries(self) -> shim.HeldEntries:
        return self._node.held_entries()

    def pre_vote_counts(self) -> PreVoteCounts:
        return self._node.pre_vote_counts()

    def read_index_counts(self) -> ReadIndexCounts:
        return self._node.read_index_counts()

    @property
    def proposal_failures(self) -> collections.Counter[str]:
        return self._raft.failures
