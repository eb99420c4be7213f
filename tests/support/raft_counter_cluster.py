"""A real three-node pysyncobj cluster over Stator's transport (meta/raft/transport.py): a replicated counter per node,
started on free loopback ports, and the waits that check its replicas agree.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from meta.raft import pysyncobj_shim as shim
from meta.raft.transport import RaftLink, StatorTransport
from ops.devcluster import free_base_port


SECRET = "the cluster secret of these tests"
LINK = RaftLink(secret=SECRET)     # one stretch of the secret for every node of the module
WAIT_S = 15.0


# A write that failed for one of these was certainly not applied (meta/raft/node.py NOT_APPLIED): resubmitted.
NOT_APPLIED = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.DISCARDED, FAIL_REASON.NOT_LEADER,
               FAIL_REASON.REQUEST_DENIED}


def wait_until(predicate: Callable[[], Any], timeout: float = WAIT_S, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Counter(SyncObj):
    def __init__(self, me: str, others: list[str], link: RaftLink = LINK, **conf: Any):
        self.before_flush: list[str] = []
        settings = dict(autoTick=True, appendEntriesUseBatch=False, raftMinTimeout=0.25, raftMaxTimeout=0.5,
                        appendEntriesPeriod=0.05, connectionTimeout=5, connectionRetryTime=0.3,
                        leaderFallbackTimeout=1.0, logCompactionMinEntries=10 ** 9, logCompactionMinTime=10 ** 9)
        settings.update(conf)
        super().__init__(me, others, SyncObjConf(**settings), transportClass=functools.partial(StatorTransport, link))
        self.transport: StatorTransport = shim.transport(self)   # pysyncobj has no public accessor for it
        # The application's part: a flush at the end of its tick phase, and the group-commit hook.
        self.addOnTickCallback(self.transport.flush)
        self.transport.set_before_flush(lambda messages: self.before_flush.extend(m["type"] for m in messages))
        self.__total = 0

    @replicated
    def add(self, value: int) -> int:
        self.__total += value
        return self.__total

    def total(self) -> int:
        return self.__total

    def on_tick(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` once on the tick thread (the transport is not thread-safe) and return its result."""
        done = threading.Event()
        result: list[Any] = []

        def once() -> None:
            if not done.is_set():
                result.append(fn())
                done.set()
        self.addOnTickCallback(once)
        assert done.wait(5), "the tick thread did not run the callback"
        return result[0]


@dataclass
class Cluster:
    addresses: list[str]
    nodes: list[Counter]

    def alive(self) -> list[Counter]:
        return [n for n in self.nodes if n.tick_thread_alive()]

    def leader(self) -> Counter | None:
        leaders = [n for n in self.alive() if n._isLeader()]
        return leaders[0] if len(leaders) == 1 else None


def apply_all(nodes: list[Counter], count: int, timeout: float = WAIT_S) -> int:
    """``count`` writes of 1 at once, spread over ``nodes``, on a stable cluster; the number of resubmissions. Only a
    write that certainly did not apply may fail (and is resubmitted), so that totals add up exactly."""
    outcome: dict[int, int] = {}
    lock = threading.Lock()
    retries = 0

    def submit(i: int) -> None:
        nodes[i % len(nodes)].add(1, callback=functools.partial(done, i))

    def done(i: int, result: Any, error: int) -> None:
        with lock:
            outcome[i] = error

    for i in range(count):
        submit(i)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with lock:
            failed = [i for i, e in outcome.items() if e != FAIL_REASON.SUCCESS]
            finished = len(outcome)
        assert all(outcome[i] in NOT_APPLIED for i in failed), \
            f"writes failed with {sorted({outcome[i] for i in failed})}"
        for i in failed:
            with lock:
                del outcome[i]
            retries += 1
            submit(i)
        if finished == count and not failed:
            return retries
        time.sleep(0.02)
    raise AssertionError(f"{count - len(outcome)} writes unanswered after {timeout} s")


def agree(cluster: Cluster, expected: int | None = None) -> int:
    """Wait until every live replica holds the same total (``expected`` if given) and last applied index."""
    alive = cluster.alive()

    def same() -> bool:
        totals = {n.total() for n in alive}
        return len(totals) == 1 and (expected is None or totals == {expected}) \
            and len({n.raftLastApplied for n in alive}) == 1
    wait_until(same, what=f"every replica at the same total ({expected})")
    return alive[0].total()


def running_cluster(link: RaftLink = LINK) -> Iterator[Cluster]:
    """Three Counter nodes on free loopback ports, linked by ``link``, once they have a leader; destroyed after."""
    base = free_base_port()
    addresses = [f"127.0.0.1:{base + i}" for i in (1, 2, 3)]
    nodes = [Counter(a, [b for b in addresses if b != a], link) for a in addresses]
    c = Cluster(addresses, nodes)
    try:
        wait_until(c.leader, what="a leader")
        yield c
    finally:
        for node in nodes:
            if node.tick_thread_alive():
                node.destroy_synchronous()
