"""One schedule (``run_schedule``), many seeds on worker processes (``run_seeds``), and the greedy shrinker.

A schedule: three meta nodes boot on one VirtualLoop; the faults of ``faults.plan(seed)`` start and end at their
virtual times; the workload runs from the moment its setup took; at ``duration_s`` everything heals (crashed nodes
restart), QUIET_S of calm follow, the clients stop, the nodes get CONVERGE_S to agree, and the checks run.
Determinism: one thread, virtual time, every draw from generators keyed by the seed; the trace hash covers every
node step, every delivered chunk of bytes, every apply and every operation's outcome. Run under PYTHONHASHSEED=0
(the CLI re-execs itself so): pysyncobj iterates sets of nodes hashed by their address string.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import gc
import hashlib
import logging
import multiprocessing
import random
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import aiohttp.web_app
import structlog

from meta.api.metrics import MetaMetrics
from meta.backup import image_digest
from meta.raft import pysyncobj_shim as shim
from meta.raft.node import APPEND_BATCH_BYTES

from . import apply_hash, checks
from .clock import SPINS_MAX, NodeClocks, VirtualLoop, patched
from .faults import (AIM_POLL_S, AIMED_LEADER_LOSS_P, BROKER_KINDS, KINDS, LEADER_LOST_AFTER_MAX_S, POWER_QUORUM_ISOLATION_EXTRA_S,
                     REWIND_AFTER_S, REWIND_BACK_MAX, REWIND_BATCH_BYTES, STALE_FOR_S, Fault, plan)
from .net import SimNet, SimPoller
from .brokers import BROKERS, BrokerWorkload, broker_tokens
from .vnet import VirtualNet
from .leases import Leases
from .node import STALL_P, DrivenApplier, SimMetaNode
from .disk import SimJournalIO
from .workload import CLIENTS, OP_TIMEOUT_S, THINK_MAX_S, Workload

NODES = ("n1", "n2", "n3")
RAFT_PORT = 7001
DURATION_S = 10.0           # virtual seconds of faults and workload (the default schedule)
CALM_SHARE = 0.5          # schedules with brokers whose meta cluster stalls seldom (see Sim)
CALM_STALLS = 0.1
QUIET_S = 5.0               # calm after the final heal, clients still running
CONVERGE_S = 10.0           # then at most this long for every node to apply the same index
CONVERGE_POLL_S = 0.1
MONO_OFFSET_MAX_S = 10_000.0
WALL_SKEW_MAX_S = 0.05
VIOLATIONS_MAX = 50
# A schedule of 10 virtual seconds has ~10,000 traced events; past this many the simulator (or the code under it) is
# spinning in virtual time, and the schedule stops with a violation instead of hanging its worker.
EVENTS_MAX = 5_000_000
LOG_RING_MAX = 200
FINAL_CANCEL_S = 60.0       # virtual: the tasks left at the end, cancelled, to finish
# The register (cas and linearizable reads) always runs; the others: reads with min_version, the remapper, the group
# leases (ops/sim/workload.py, ops/sim/leases.py), and http: every meta node serves its HTTP API on the virtual net
# (ops/sim/vnet.py) and the min_version reads are requests to it; brokers (ops/sim/brokers.py, not in the default set
# yet): real brokers on that net, the chaos runner's senders, read-back and checks
WORKLOADS = ("register", "min_version", "remaps", "leases", "http")


class Sim:
    def __init__(self, seed: int, faults: list[Fault], duration_s: float, l2: bool = False,
                 workloads: tuple[str, ...] = WORKLOADS):
        self.seed, self.faults, self.duration_s, self.l2 = seed, faults, duration_s, l2
        self.workloads = workloads
        self.l2_messages = 0
        self.rng = random.Random(f"{seed}:sim")
        self.loop = VirtualLoop()
        self.clocks = NodeClocks(self.loop)
        addresses = {name: f"10.77.0.{i + 1}:{RAFT_PORT}" for i, name in enumerate(NODES)}
        names = {a: n for n, a in addresses.items()}
        self.net = SimNet(self, seed, addresses)
        # HTTP on its own virtual net (ops/sim/vnet.py): with the http workload, each meta node serves its API there
        self.http = "http" in workloads or "brokers" in workloads
        self.vnet = self.loop.net = VirtualNet(self.loop, seed)
        self.broker_tokens: dict[str, str] = broker_tokens() if "brokers" in workloads else {}
        # The meta nodes' stalls (node.py) change the leader every few virtual seconds, and a new leader starts every
        # lease afresh: no exclusive member's lease ever ran out, so no silent consumer was ever fenced. With brokers,
        # half the schedules (drawn from the seed) run a calm meta cluster: a tenth of the stalls.
        self.stall_p = STALL_P
        if "brokers" in workloads and random.Random(f"{seed}:calm").random() < CALM_SHARE:
            self.stall_p = STALL_P * CALM_STALLS
        self.brokers: BrokerWorkload | None = None   # made in main: its files are real (a temporary directory)
        self.nodes = {name: SimMetaNode(self, name, addresses[name], [a for n, a in addresses.items() if n != name],
                                        names) for name in NODES}
        for name in NODES:
            self.clocks.mono_offset[name] = self.rng.uniform(0, MONO_OFFSET_MAX_S)
            self.clocks.wall_offset[name] = self.rng.uniform(-WALL_SKEW_MAX_S, WALL_SKEW_MAX_S)
        self.hash = hashlib.blake2b(digest_size=16)
        self.violations: list[dict[str, Any]] = []
        self.leaders: dict[int, set[str]] = {}
        self.applied_at: dict[int, tuple[bytes, str, int]] = {}
        self.booting: SimMetaNode | None = None
        self.applier_class = functools.partial(DrivenApplier, self)
        self.workload = Workload(self)
        self.leases = Leases(self, self.workload.ops)
        self.healed = False
        self._cuts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._slow: collections.Counter[str] = collections.Counter()
        self._down_until: dict[str, float] = {}
        self._aimed: dict[int, list[tuple[str, str]]] = {}   # power_quorum: the links it cut, by fault
        self.wiped = 0        # disks replaced (wipe, rejoin_leader_loss)
        self.skipped = 0      # wipes not made: some node was down or not a voter, or another wipe under way
        self._wipe_busy_until = 0.0
        self._rewinds = 0     # rewind faults under way
        self.skipped_rewinds = 0   # none made: no leader
        self._rewind_rng = random.Random(f"{seed}:rewind")
        self.rewound = 0      # next indexes moved back
        self.rewound_aimed = 0   # of them, to just before where a follower's log leaves the leader's
        self.threads_at_start = threading.active_count()
        self.events = 0
        self.metrics = MetaMetrics()   # the gauges and counters the nodes' read admission reports to
        self.loop.set_exception_handler(self._loop_error)
        self.loop.on_spinning = self._spinning

    def _spinning(self) -> None:
        """Some task runs again and again at one virtual instant (ops/sim/clock.py SPINS_MAX): a busy loop."""
        self.violation("runaway", f"{SPINS_MAX} loop iterations at virtual time {self.loop.time():.3f} s without it "
                       "moving: a task that never waits",
                       tasks=sorted({repr(t.get_coro())[:120] for t in asyncio.all_tasks(self.loop)})[:10])
        self.loop.stop()

    def _loop_error(self, _loop: Any, context: dict[str, Any]) -> None:
        """An exception no one caught in a loop callback (the simulator's own code, or a node's callback): fail the
        seed with it rather than let asyncio log it and go on."""
        e = context.get("exception")
        self.violation("simulator_error", str(context.get("message")), exception=repr(e),
                       traceback="".join(traceback.format_exception(e, limit=8)) if e is not None else None)

    # -- what the patches and the nodes call -------------------------------------------------------------------
    def new_poller(self, _poller_type: Any = None) -> SimPoller:
        return SimPoller(self.net)

    def journal_io_of_booting_node(self, _name: str = "os") -> SimJournalIO:
        assert self.booting is not None
        return SimJournalIO(self.booting.disk)

    def disk_identity(self, data_dir: str) -> tuple[str, bool]:
        assert self.booting is not None
        return self.booting.disk.identity(data_dir)

    def wake(self, name: str) -> None:
        self.nodes[name].wake()

    def trace(self, kind: str, a: str, b: str, data: bytes) -> None:
        self.events += 1
        if self.events == EVENTS_MAX:
            self.violation("runaway", f"{EVENTS_MAX} events by virtual time {self.loop.time():.3f} s")
            self.loop.stop()
        self.hash.update(f"{self.loop._now!r}|{kind}|{a}|{b}|{len(data)}|".encode())
        self.hash.update(data)

    def violation(self, check: str, message: str, **evidence: Any) -> None:
        if len(self.violations) < VIOLATIONS_MAX:
            self.violations.append({"check": check, "message": message,
                                    "evidence": {"t": round(self.loop.time(), 4), **evidence}})

    def after_step(self, node: SimMetaNode) -> None:
        so = node.so
        assert so is not None
        term = so.raftCurrentTerm
        if so.is_leader():
            leaders = self.leaders.setdefault(term, set())
            if node.name not in leaders:
                leaders.add(node.name)
                if len(leaders) == 2:
                    self.violation("one_leader_per_term", f"term {term} has two leaders", leaders=sorted(leaders))
        self.trace("step", node.name, f"{term}:{so.raftCommitIndex}:{node.applied_index}", b"")

    def before_send(self, node: SimMetaNode) -> None:
        """The rewind fault (faults.py), run as a node is about to send its appends: while one is under way, a
        leader's next index for each node it replicates to is moved back, and appends carry small batches. Aimed
        where it can matter: a follower whose log leaves the leader's at a committed index ``d`` gets a batch that
        ends at ``d - 1``, so that only the next message (held back, under --l2) tells it ``d`` is not its own."""
        so = node.so
        assert so is not None
        rewinding = self.rewinding()
        batch = REWIND_BATCH_BYTES if rewinding else APPEND_BATCH_BYTES
        if rewinding and so.is_leader():
            for peer, next_index in sorted(shim.next_indexes(so).items(), key=lambda p: p[0].address):
                low = max(2, so.raftCommitIndex - REWIND_BACK_MAX)
                if next_index <= low or shim.log_entry(so, low - 1) is None:
                    continue
                start = self._rewind_rng.randint(low, next_index - 1)
                leaves = self._where_log_leaves(so, peer.address, low + 2)
                if leaves is not None and leaves <= so.raftCommitIndex:
                    start = self._rewind_rng.randint(max(low, leaves - REWIND_BACK_MAX), leaves - 2)
                    batch = sum(len(shim.log_entry(so, i)[0]) for i in range(start, leaves))  # type: ignore[index]
                    self.rewound_aimed += 1
                shim.set_next_index(so, peer, start)
                self.rewound += 1
        shim.set_append_batch_bytes(so, batch)

    def rewinding(self) -> bool:
        return self._rewinds > 0 and not self.healed

    def _where_log_leaves(self, so: Any, address: str, from_index: int) -> int | None:
        """The first index from ``from_index`` on where the log of the node at ``address`` holds an entry of
        another term than the leader's ``so``; None if none (or that node is down)."""
        peer = next((n for n in self.nodes.values() if n.address == address and n.up and n.so is not None), None)
        if peer is None:
            return None
        for index in range(from_index, min(shim.current_log_index(so), shim.current_log_index(peer.so)) + 1):
            mine, theirs = shim.log_entry(so, index), shim.log_entry(peer.so, index)
            if mine is None or theirs is None:
                return None
            if mine[2] != theirs[2]:
                return index
        return None

    def on_apply(self, node: SimMetaNode, index: int, payload: bytes | None) -> None:
        digest = hashlib.blake2b(b"\0noop" if payload is None else bytes(payload), digest_size=16).digest()
        self.trace("apply", node.name, str(index), digest)
        seen = self.applied_at.get(index)
        if seen is None:
            self.applied_at[index] = (digest, node.name, node.incarnation)
        elif seen[0] != digest:
            self.violation("state_machine_safety", f"{node.name} (incarnation {node.incarnation}) applied another "
                           f"entry at index {index} than {seen[1]} (incarnation {seen[2]})", index=index,
                           entry=(bytes(payload)[:300].decode("utf-8", "replace") if payload else None))

    # -- faults ------------------------------------------------------------------------------------------------
    def _links(self, f: Fault) -> list[tuple[str, str]]:
        if f.kind in ("power_quorum", "rejoin_leader_loss"):
            return self._aimed.get(id(f), [])
        a = f.target[0]
        if f.kind == "isolate":
            return [p for o in NODES if o != a for p in ((a, o), (o, a))]
        if f.kind == "cut_link":
            return [(a, f.target[1]), (f.target[1], a)]
        if f.kind == "one_way":
            return [(a, f.target[1])]
        return []

    def start_fault(self, f: Fault) -> None:
        if self.healed:
            return
        now = self.loop.time()
        self.trace("fault", f.kind, ",".join(f.target), b"")
        if f.kind == "broker_partition":
            if self.brokers is None or not self.brokers.partition(f.target[0], f.duration):
                self.skipped += 1
            return
        if f.kind in BROKER_KINDS:
            if self.brokers is None or not self.brokers.fault(f.target[0], f.kind == "broker_power", f.duration):
                self.skipped += 1
            return
        node = self.nodes[f.target[0]]
        if f.kind in ("isolate", "cut_link", "one_way"):
            self._cuts.update(self._links(f))
            self.net.cut = {k for k, v in self._cuts.items() if v > 0}
        elif f.kind in ("crash_process", "crash_power"):
            if f.params.get("mid_step"):
                node.crash_mid_step(f.kind.split("_")[1], f.duration)
            else:
                node.crash(f.kind.split("_")[1])
                self.down_for(node.name, f.duration)
        elif f.kind == "pause":
            node.pause(now + f.duration)
        elif f.kind == "slow":
            self._slow[node.name] += 1
            self.net.slow[node.name] = max(self.net.slow.get(node.name, 0.0), float(f.params.get("extra_s", 0.05)))
        elif f.kind == "reset":
            self.net.reset_link(f.target[0], f.target[1])
        elif f.kind == "corrupt":
            self.net.corrupt_link(f.target[0], f.target[1])
        elif f.kind == "power_quorum":
            self._power_quorum(f)
            self.loop.call_at(now + f.duration + POWER_QUORUM_ISOLATION_EXTRA_S, self.end_fault, f)
            return
        elif f.kind == "wipe":
            if not self._all_vote():
                self.skipped += 1
                return
            node.wipe()
            self.down_for(node.name, f.duration)
            self.wiped += 1
            self._wipe_busy_until = now + f.duration
        elif f.kind == "rejoin_leader_loss":
            self._rejoin_leader_loss(f)
            return
        elif f.kind == "rewind":
            self._rewind(f)
            return
        self.loop.call_at(now + f.duration, self.end_fault, f)

    def _leader(self) -> str | None:
        up = [n for n in self.nodes.values() if n.up and n.so is not None]
        leaders = sorted((n.so.raftCurrentTerm, n.name) for n in up if n.so.is_leader())  # type: ignore[union-attr]
        return leaders[-1][1] if leaders else None

    def _all_vote(self) -> bool:
        """A disk may be taken: no other wipe is under way, every node is up and votes (a wiped one caught up)."""
        return self.loop.time() >= self._wipe_busy_until and all(
            n.up and n.so is not None and n.so.roles.voter for n in self.nodes.values())

    def _cut(self, links: list[tuple[str, str]], by: int) -> None:
        self._cuts.update({link: by for link in links})
        self.net.cut = {k for k, v in self._cuts.items() if v > 0}
        if by < 0:
            self.net.release()

    def _rejoin_leader_loss(self, f: Fault) -> None:
        leader = self._leader()
        if leader is None or not self._all_vote():
            self.skipped += 1
            return
        stale, wiped = self.rng.sample([n for n in NODES if n != leader], 2)
        cut_stale = [p for o in NODES if o != stale for p in ((stale, o), (o, stale))]
        cut_leader = [p for o in NODES if o != leader for p in ((leader, o), (o, leader))]
        self._cut(cut_stale, +1)
        self.wiped += 1
        self._wipe_busy_until = self.loop.time() + STALE_FOR_S + LEADER_LOST_AFTER_MAX_S + f.duration

        def rejoin() -> None:
            if self.healed:
                return
            node = self.nodes[wiped]
            node.wipe()
            if not node.halted:
                node.boot()
            if self.rng.random() < AIMED_LEADER_LOSS_P:
                lose_leader_once_heard(self.loop.time() + LEADER_LOST_AFTER_MAX_S)
            else:
                self.loop.call_at(self.loop.time() + self.rng.uniform(0, LEADER_LOST_AFTER_MAX_S), lose_leader)

        def lose_leader_once_heard(deadline: float) -> None:
            # Aimed: the leader goes as soon as the wiped node has heard it and holds no entry yet, the only moment
            # its vote could be wrong (from its first entry on, its log names the membership). Left to chance, the
            # loss came after that moment in almost every run: the wiped node catches up within a tick or two.
            node = self.nodes[wiped]
            so = node.so if node.up else None
            if self.loop.time() >= deadline or (so is not None and so.roles.heard_from(leader)
                                                and so.roles.log_is_empty()):
                lose_leader()
            else:
                self.loop.call_at(self.loop.time() + AIM_POLL_S, lose_leader_once_heard, deadline)

        def lose_leader() -> None:
            # The stale node comes back as the leader goes (the nemesis's order): back before, it caught up from the
            # leader within milliseconds and was stale no more. Healed first: the leader's links to it stay cut.
            if self.healed:
                return
            self._cut(cut_stale, -1)
            self._cut(cut_leader, +1)
            self.loop.call_at(self.loop.time() + f.duration, lambda: None if self.healed else self._cut(cut_leader, -1))

        self.loop.call_at(self.loop.time() + STALE_FOR_S, rejoin)

    def _rewind(self, f: Fault) -> None:
        """The leader of the moment is cut off for the fault's duration (what its clients propose meanwhile stays
        an uncommitted tail of its term), then its peers' leader rewinds for REWIND_AFTER_S: while it reconciles
        that tail."""
        leader = self._leader()
        if leader is None:
            self.skipped_rewinds += 1
            return
        links = [p for o in NODES if o != leader for p in ((leader, o), (o, leader))]
        self._cut(links, +1)

        def heal() -> None:
            if self.healed:
                return
            self._cut(links, -1)
            self._rewinds += 1
            self.loop.call_at(self.loop.time() + REWIND_AFTER_S, done)

        def done() -> None:
            self._rewinds -= 1

        self.loop.call_at(self.loop.time() + f.duration, heal)

    def _power_quorum(self, f: Fault) -> None:
        up = [n for n in self.nodes.values() if n.up and n.so is not None]
        leaders = sorted((n.so.raftCurrentTerm, n.name) for n in up if n.so.is_leader())  # type: ignore[union-attr]
        leader = leaders[-1][1] if leaders else self.rng.choice(list(NODES))
        links = [p for o in NODES if o != leader for p in ((leader, o), (o, leader))]
        self._aimed[id(f)] = links
        self._cuts.update(links)
        self.net.cut = {k for k, v in self._cuts.items() if v > 0}
        for name in NODES:
            if name != leader:
                if f.params.get("mid_step"):
                    self.nodes[name].crash_mid_step("power", f.duration)
                else:
                    self.nodes[name].crash("power")
                    self.down_for(name, f.duration)

    def end_fault(self, f: Fault) -> None:
        if self.healed:
            return
        node = self.nodes[f.target[0]]
        if f.kind in ("isolate", "cut_link", "one_way", "power_quorum"):
            self._cuts.subtract(self._links(f))
            self.net.cut = {k for k, v in self._cuts.items() if v > 0}
            self.net.release()
        elif f.kind in ("crash_process", "crash_power"):
            self.restart_due(node.name)
        elif f.kind == "slow":
            self._slow[node.name] -= 1
            if self._slow[node.name] <= 0:
                self.net.slow.pop(node.name, None)

    def down_for(self, name: str, duration: float) -> None:
        """``name`` just crashed: it restarts ``duration`` from now (unless another crash holds it down longer)."""
        now = self.loop.time()
        self._down_until[name] = max(self._down_until.get(name, 0.0), now + duration)
        self.loop.call_at(now + duration, self.restart_due, name)

    def restart_due(self, name: str) -> None:
        node = self.nodes[name]
        if self.healed or node.up or node.halted:
            return
        if self.loop.time() >= self._down_until.get(name, 0.0):
            node.boot()

    def heal_all(self) -> None:
        self.healed = True
        for node in self.nodes.values():
            node.crash_in_step = None
        self.trace("heal", "", "", b"")
        self._cuts.clear()
        self.net.slow.clear()
        self.net.heal()
        now = self.loop.time()
        for node in self.nodes.values():
            node.paused_until = min(node.paused_until, now)
            if not node.up and not node.halted:
                node.boot()
        if self.brokers is not None:
            self.brokers.heal()

    # -- the schedule ------------------------------------------------------------------------------------------
    async def main(self) -> dict[str, Any]:
        loop = self.loop
        for node in self.nodes.values():
            node.boot()
        broker_setup: asyncio.Task | None = None
        if "brokers" in self.workloads:
            self.brokers = BrokerWorkload(self)
            self.brokers.start()
            broker_setup = loop.create_task(self.brokers.setup())   # beside the register's: it takes seconds
        for f in self.faults:
            loop.call_at(f.at, self.start_fault, f)
        liveness: list[dict[str, Any]] = []
        clients: list[asyncio.Task] = []
        try:
            await asyncio.wait_for(self.workload.setup(), self.duration_s)
            if broker_setup is not None:
                await asyncio.wait_for(broker_setup, max(0.1, self.duration_s - loop.time()))
        except (RuntimeError, asyncio.TimeoutError):
            liveness.append(checks.violation("setup", "the workload's setup did not finish during the run"))
        if self.workload.ready:
            clients = [loop.create_task(self.workload.client(f"c{i}")) for i in range(CLIENTS)]
            if "remaps" in self.workloads:
                clients.append(loop.create_task(self.workload.remapper()))
            if "leases" in self.workloads:
                clients += self.leases.tasks()
            if self.brokers is not None and self.brokers.ready:
                clients += self.brokers.tasks()
        await asyncio.sleep(max(0.0, self.duration_s - loop.time()))
        self.heal_all()
        await asyncio.sleep(QUIET_S)
        self.workload.stopping = self.leases.stopping = True
        if self.brokers is not None:
            self.brokers.stop_clients()
        if clients:
            await asyncio.wait(clients, timeout=OP_TIMEOUT_S * 2 + THINK_MAX_S)
        await self.workload.close()
        deadline = loop.time() + CONVERGE_S
        while loop.time() < deadline and checks.converged(self):
            await asyncio.sleep(CONVERGE_POLL_S)
        safety, more, stats = checks.final(self)
        if self.brokers is not None:
            await self.brokers.read_back()
            safety += self.brokers.violations()
            self.trace("brokers", "", "", self.brokers.history())
            stats["brokers"] = self.brokers.counts()
            await self.brokers.close()
        return {"safety": self.violations + safety, "liveness": liveness + more, "stats": stats}


@contextlib.contextmanager
def quiet_logs() -> Iterator[collections.deque]:
    """structlog below WARNING dropped and the rest kept in a bounded ring (printing would cost more than raft);
    the previous configuration restored on exit."""
    ring: collections.deque = collections.deque(maxlen=LOG_RING_MAX)

    def keep(_logger: Any, method: str, event: dict[str, Any]) -> Any:
        ring.append((method, event.get("event")))
        raise structlog.DropEvent

    saved = structlog.get_config()
    stdlib = logging.getLogger("pysyncobj")
    level = stdlib.level
    structlog.configure(processors=[keep], wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        cache_logger_on_first_use=False)
    stdlib.setLevel(logging.CRITICAL + 1)   # pysyncobj logs a truncation of applied entries as critical
    try:
        yield ring
    finally:
        structlog.configure(**saved)
        stdlib.setLevel(level)


def run_schedule(seed: int, faults: list[Fault] | None = None, duration_s: float = DURATION_S,
                 kinds: tuple[str, ...] = KINDS, l2: bool = False, keep_log: bool = False,
                 workloads: tuple[str, ...] = WORKLOADS) -> dict[str, Any]:
    """Run one schedule; returns its result (JSON-ready): ok (no safety violation), violations, liveness findings,
    the trace hash, the faults (replayable with --plan) and counts. ``l2``: the MessageTap duplicates and delays raft
    messages (node.py); a failure found only so is labelled l2 (TCP never does it). ``workloads``: which of
    WORKLOADS run (the CLI runs them all; a test may pick the one its planted bug needs)."""
    if faults is None:
        brokers = BROKERS if "brokers" in workloads else ()
        faults = plan(seed, duration_s, list(NODES), tuple(k for k in kinds if brokers or k not in BROKER_KINDS),
                      brokers)
    started = time.perf_counter()
    sim = Sim(seed, faults, duration_s, l2, workloads)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        with quiet_logs(), patched(sim):
            try:
                out = sim.loop.run_until_complete(sim.main())
            except RuntimeError:
                if not any(v["check"] == "runaway" for v in sim.violations):
                    raise
                out = {"safety": sim.violations, "liveness": [], "stats": {}}
            finally:
                for node in sim.nodes.values():
                    node.digest = image_digest(node.so.image_data) if node.so is not None else None
                    node.up = False
                # The schedule is over: crashed incarnations' tasks are woken to be cancelled with the rest, rather
                # than left for the garbage collector to close outside any loop; none of it counts any more.
                sim.loop.revive_all()
                tasks = [t for t in asyncio.all_tasks(sim.loop) if not t.done()]
                for t in tasks:
                    t.cancel()
                if tasks:
                    sim.loop.run_until_complete(asyncio.wait(tasks, timeout=FINAL_CANCEL_S))
                sim.loop.close()
    finally:
        if gc_was:
            gc.enable()
        _forget_served_apps()
        gc.collect()
    ops = sim.workload.ops
    furthest = max(sim.nodes.values(), key=lambda n: (n.applied_index, n.name))   # (all marked down by now)
    return {
        **({"log": apply_hash.log_lines(furthest.applies), "digest": furthest.digest} if keep_log else {}),
        "seed": seed, "l2": l2, "ok": not out["safety"], "violations": out["safety"], "liveness": out["liveness"],
        "trace_hash": sim.hash.hexdigest(), "duration_s": duration_s, "faults": [f.to_json() for f in faults],
        "counts": {"ops": len(ops), "ops_ok": sum(o.outcome == "ok" for o in ops),
                   "cas_ok": sum(o.kind == "cas" and o.outcome == "ok" for o in ops),
                   "read_mv_ok": sum(o.kind == "read_mv" and o.outcome == "ok" for o in ops),
                   "heartbeats_ok": sum(o.kind == "heartbeat" and o.outcome == "ok" for o in ops),
                   "steps": sum(n.steps for n in sim.nodes.values()), "events": sim.events,
                   "terms": max(sim.leaders, default=0), "last_index": max(sim.applied_at, default=0),
                   "boots": sum(n.incarnation for n in sim.nodes.values()),
                   "unsynced_bytes_lost": sum(n.disk.bytes_lost for n in sim.nodes.values()),
                   "chain_ops": dict(sorted(sim.workload.chain_ops.items())), "l2_messages": sim.l2_messages,
                   "wiped": sim.wiped, "wipes_skipped": sim.skipped, "rewound": sim.rewound,
                   "rewound_aimed": sim.rewound_aimed, "rewinds_skipped": sim.skipped_rewinds,
                   "refused": dict(sorted(sum((collections.Counter(n.refusals()) for n in sim.nodes.values()),
                                              collections.Counter()).items())),
                   **out["stats"]},
        "wall_s": round(time.perf_counter() - started, 3),
    }


def _forget_served_apps() -> None:
    # aiohttp memoizes each application's middleware chain in a module-level lru_cache of 1,024 entries whose keys
    # hold the applications (aiohttp/web_app.py ``_cached_build_middleware``). A node serves one application for its
    # life; the simulator boots hundreds of nodes in one process, and through that cache every node of every past
    # schedule stayed alive: ~4.7 MB and ~8,500 objects more a schedule, each closing gc.collect slower than the one
    # before (92 schedules a minute over seeds 1-300, against ~150 over the first 60). tests/test_sim.py checks
    # that no application outlives its schedule, so a renamed cache shows there.
    cache = getattr(aiohttp.web_app, "_cached_build_middleware", None)
    if cache is not None:
        cache.cache_clear()


def _one(args: tuple[int, float, tuple[str, ...], bool, tuple[str, ...]]) -> dict[str, Any]:
    seed, duration_s, kinds, l2, workloads = args
    try:
        return run_schedule(seed, duration_s=duration_s, kinds=kinds, l2=l2, workloads=workloads)
    except Exception as e:   # noqa: BLE001 - a simulator bug must name its seed, not kill the batch
        return {"seed": seed, "ok": False, "violations": [{"check": "simulator_error", "message": repr(e),
                                                           "evidence": {"traceback": traceback.format_exc(limit=12)}}],
                "liveness": [], "trace_hash": None, "faults": [], "counts": {}, "wall_s": 0.0}


def run_seeds(first: int, count: int, workers: int, duration_s: float = DURATION_S,
              kinds: tuple[str, ...] = KINDS, l2: bool = False, workloads: tuple[str, ...] = WORKLOADS
              ) -> Iterator[dict[str, Any]]:
    """Seeds first..first+count-1 on ``workers`` processes (forked: no thread runs here), results in seed order."""
    jobs = [(seed, duration_s, kinds, l2, workloads) for seed in range(first, first + count)]
    if workers <= 1:
        yield from map(_one, jobs)
        return
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        yield from pool.map(_one, jobs, chunksize=1)


def shrink(seed: int, faults: list[Fault], duration_s: float, runs_max: int, l2: bool = False,
           workloads: tuple[str, ...] = WORKLOADS) -> tuple[list[Fault], int]:
    """Greedy: drop one fault at a time, keeping the drop whenever the schedule still fails (any safety violation),
    at most ``runs_max`` runs. Returns the smallest failing fault list found and the runs spent."""
    current, runs, i = list(faults), 0, 0
    while i < len(current) and runs < runs_max:
        candidate = current[:i] + current[i + 1:]
        runs += 1
        if not run_schedule(seed, candidate, duration_s, l2=l2, workloads=workloads)["ok"]:
            current = candidate
        else:
            i += 1
    return current, runs
