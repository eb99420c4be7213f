"""One simulated meta node: the real MetaSyncObj, driven by hand (``doTick(0)``), its apply run as scheduled events.

A node's life is a chain of loop callbacks: ``step`` (one tick: read the sockets, elections, commit, send, poll)
then the next step one tick period later, or at once when bytes arrive or a proposal wakes it, but never before the
CPU time the last step cost has passed. Applies run as their own events a little after the commit, so apply can lag
commit as the real apply thread does. Every callback carries the incarnation it was scheduled for: a crash ends
them all.
"""

from __future__ import annotations

import copy
import random
import traceback
from collections.abc import Callable
from typing import Any

from meta.admission import Admission
from meta.api.app import make_app
from meta.config import Member, MetaConfig, Tokens
from meta.service import MetaService
from meta.changefeed import ChangeFeed
from meta.group_sessions import GroupSessions
from meta.limits import VERSION_WAITERS_MAX
from meta.log import Log
from meta.raft import pysyncobj_shim as shim
from meta.raft.applier import Applier
from meta.raft.node import TICK_PERIOD_S, LoopBridge, MetaSyncObj, RaftNode, RaftTuning
from meta.reads import ReadFacade
from runtime.serve import app_runner, set_up

from .clock import NodeHalted
from .disk import SimDisk
from .vnet import VirtualSite

SECRET = "stator-sim-secret"
HTTP_PORT = 8080
TOKENS = Tokens(admin="stator-sim-admin", client="stator-sim-client")
OFFSET_BUDGET = 1000
# The brokers' sessions as the chaos runner sets them (ops/chaos/topology.py META_EXTRA): a broker cut off is fenced,
# and its heads failed over, within a broker_partition (faults.py BROKER_PARTITION_S)
SESSION_TIMEOUT_MS, HEARTBEAT_INTERVAL_MS = 4000, 1000
STEP_COST_MIN_S = 0.0001
STEP_COST_MAX_S = 0.002
STALL_P = 0.003                    # a GC pause or a slow disk: crosses the 0.25-0.5 s election timeout
STALL_MIN_S = 0.1
STALL_MAX_S = 0.6
APPLY_DELAY_MAX_S = 0.005
DATA_ROOT = "/sim"                 # the journal's paths live on the SimDisk; nothing is written under it
# L2 (MessageTap): raft messages duplicated or held back and delivered late (so out of order), which TCP never does
# but Raft must survive.
L2_DUPLICATE_P = 0.02
L2_DELAY_P = 0.02
L2_LATE_MAX_S = 0.5
L2_REWIND_DELAY_P = 0.5    # while a rewind fault runs (faults.py): its cut batches arrive out of order often
# Compaction (and so snapshots, which fork and write real files) is off in milestone 1.
TUNING = RaftTuning(compaction_min_entries=10**9, compaction_min_time_s=10**9)


class _Driven:
    """MetaSyncObj's tick thread stand-in: not None, so ``_onTick`` reads the sockets first, as when started."""

    def join(self, timeout: float | None = None) -> None:
        pass


DRIVEN = _Driven()


class SimWake:
    """The pipe notifier's stand-in: a proposal wakes its node's next step now."""

    def __init__(self, node: SimMetaNode):
        self._node = node

    def notify(self) -> None:
        self._node.wake()


class DrivenApplier(Applier):
    """The apply thread's stand-in: never started; each submit schedules ``Applier.run_pending`` (one pass of the
    thread's work) as a step of the simulator, and every entry applied is recorded for the checks."""

    def __init__(self, sim: Any, apply: Any, after_batch: Any):
        node: SimMetaNode = sim.booting

        def recorded(index: int, work: Any) -> Any:
            node.applied(index, work.payload)   # work: the entry as MetaSyncObj.committed queued it
            return apply(index, work)

        super().__init__(recorded, after_batch)
        self._node = node

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def submit(self, index: int, payload: Any, inline: bool = False) -> Any:
        pending = super().submit(index, payload, inline)
        self._node.apply_soon()
        return pending

    def submit_call(self, call: Any) -> None:
        super().submit_call(call)
        self._node.apply_soon()


class SimMetaNode:
    def __init__(self, sim: Any, name: str, address: str, partners: list[str], names: dict[str, str]):
        self.sim, self.name, self.address, self.partners, self.names = sim, name, address, partners, names
        self.rng = random.Random(f"{sim.seed}:node:{name}")
        self.disk = SimDisk(random.Random(f"{sim.seed}:disk:{name}"))
        self.incarnation = 0
        self.so: MetaSyncObj | None = None
        self.raft: RaftNode | None = None
        self.reads: ReadFacade | None = None
        self.groups: GroupSessions | None = None
        self._groups_task: Any = None
        self._http_task: Any = None           # the HTTP API starting (Sim.http)
        self._runner: Any = None              # ... and serving
        self.up = False
        self.halted = False
        self.busy_until = 0.0
        self.paused_until = 0.0
        self._step_at: float | None = None
        self._step_handle: Any = None
        self.crash_in_step: tuple[str, float] | None = None
        self._apply_handle: Any = None
        self.steps = 0
        self.wipes = 0
        self.digest: str | None = None        # the image's digest when the schedule ended
        self.refused: dict[str, int] = {}     # frames and connections the transport refused, by reason (ended ones)
        self.journal_stats: list[dict[str, Any]] = []      # each ended incarnation's group-commit counters
        self.applies: list[tuple[int, bytes | None]] = []   # this incarnation's applied entries, in order

    # -- life ------------------------------------------------------------------------------------------------
    def boot(self) -> None:
        sim = self.sim
        self.incarnation += 1
        self.applies = []
        self.crash_in_step = None
        self.sim.net.down.discard(self.name)
        sim.booting = self
        try:
            with sim.clocks.running(self.name):
                feed = ChangeFeed()
                # urls as meta/service.py passes them: without them a follower knows no URL to forward an HTTP
                # request to, and every write sent to a follower waited 5 s for NO_LEADER (found 2026-12-02: the
                # exclusive group's heartbeats, two of three refused, never let a lease run out)
                so = MetaSyncObj(self.address, self.partners, f"{DATA_ROOT}/{self.name}", SECRET, TUNING,
                                 feed.publish, LoopBridge(), names=self.names,
                                 urls={n.name: n.url for n in self.sim.nodes.values()})
        except Exception:
            # JournalDamaged after a crash the journal claims to survive, or a bug on the start-up path: the node
            # stays down, and the seed fails (a refusal to start is not a safety violation, but never expected).
            self.sim.violation("boot_failed", f"{self.name} could not start (incarnation {self.incarnation})",
                               node=self.name, traceback=traceback.format_exc(limit=8))
            self.halted = True
            return
        finally:
            sim.booting = None
        so._ticker = DRIVEN
        shim.before_each_send(so, lambda: sim.before_send(self))
        so._local.pipe = SimWake(self)
        if sim.l2:
            self._tap(so)
        so.bridge.loop = sim.loop
        self.so = so
        self.raft = RaftNode(so, sim.loop, offset_budget=OFFSET_BUDGET)
        # What an HTTP read waits for (min_version, consistency), as meta/service.py builds it
        log = Log(so, self.raft)
        feed.publish(log.data_version(), None)
        waiters = Admission("version_waiters", VERSION_WAITERS_MAX, sim.metrics.version_waiters, sim.metrics.rejections,
                            "too many reads wait for a min_version")
        self.reads = ReadFacade(log, feed, waiters)
        self.groups = GroupSessions(self.reads, log)   # the leader's lease keeper, as meta/service.py runs it
        if sim.http:   # the whole service, its lease keeper among its tasks, behind the real HTTP API
            self._http_task = sim.loop.create_task(self._serve(feed, log, self.incarnation))
        else:
            self._groups_task = sim.loop.create_task(self.groups.run())
        self.up = True
        self.busy_until = sim.loop.time()
        sim.trace("boot", self.name, str(self.incarnation), b"")
        self.wake()
        self.apply_soon()

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{HTTP_PORT}"

    def config(self) -> MetaConfig:
        members = tuple(Member(n.name, n.address, n.url) for n in self.sim.nodes.values())
        return MetaConfig(node=self.name, data_dir=f"{DATA_ROOT}/{self.name}", http_host=self.host,
                          http_port=HTTP_PORT, raft=self.address, secret=SECRET, tokens=TOKENS, members=members,
                          projection_url="", broker_tokens=self.sim.broker_tokens, offset_budget=OFFSET_BUDGET,
                          session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                          raft_tuning=TUNING)

    async def _serve(self, feed: ChangeFeed, log: Log, incarnation: int) -> None:
        """meta/api/app.py's app around this incarnation's driven node, listening on the virtual net: its routes,
        its broker sessions, drains, lease keeper and parked watches run as in a process, its raft as steps."""
        config = self.config()
        assert self.reads is not None and self.groups is not None
        reads, groups = self.reads, self.groups
        app = make_app(config, service=lambda waiters: MetaService.around(config, waiters, feed, log, reads, groups))
        runner = app_runner(app)
        await set_up(runner)
        if not self.up or incarnation != self.incarnation:   # crashed while the app started
            await runner.cleanup()
            return
        host, port = config.http_host, config.http_port
        await VirtualSite(runner, self.sim.vnet, host, port).start()
        self._runner = runner

    def _stop_serving(self) -> None:
        """The process is gone: its port and connections at once, its app's tasks after (nothing it does reaches
        anyone: the net no longer carries its bytes)."""
        if self._http_task is not None:
            self._http_task.cancel()
            self._http_task = None
        if self._runner is not None:
            self.sim.vnet.unlisten(self.host, HTTP_PORT)
            self.sim.vnet.reset(self.host)
            self.sim.loop.create_task(self._runner.cleanup())
            self._runner = None

    def _tap(self, so: MetaSyncObj) -> None:
        """MessageTap: between the transport and pysyncobj (and the shim's handler), some messages are delivered
        twice, some only later. pysyncobj's Transport keeps its handler in _onMessageReceivedCallback."""
        transport = shim.transport(so)
        inner = transport._onMessageReceivedCallback
        rng = random.Random(f"{self.sim.seed}:tap:{self.name}:{self.incarnation}")
        incarnation = self.incarnation

        def tapped(node: Any, message: Any) -> None:
            r = rng.random()
            delay_p = L2_REWIND_DELAY_P if self.sim.rewinding() else L2_DELAY_P
            if r < L2_DUPLICATE_P + delay_p:
                at = self.sim.loop.time() + rng.uniform(0, L2_LATE_MAX_S)
                self.sim.loop.call_at(at, self._late, incarnation, inner, node, copy.deepcopy(message))
                self.sim.l2_messages += 1
                if r >= L2_DUPLICATE_P:
                    return      # held back: only the late copy arrives
            inner(node, message)

        transport.setOnMessageReceivedCallback(tapped)

    def _late(self, incarnation: int, inner: Any, node: Any, message: Any) -> None:
        if not self.up or incarnation != self.incarnation or self.so is None:
            return
        now = self.sim.loop.time()
        if self.paused_until > now or self.busy_until > now:
            self.sim.loop.call_at(max(self.paused_until, self.busy_until), self._late, incarnation, inner, node,
                                  message)
            return
        self.sim.trace("late", self.name, str(message.get("type") if isinstance(message, dict) else ""), b"")
        def deliver() -> None:
            inner(node, message)
            shim.transport(self.so).flush()

        if self._as_node("a late message", deliver):
            self.wake()

    def crash(self, kind: str) -> None:
        """kind "process" (kill -9) or "power". No stop(), no destroy(): nothing gets to sync or say goodbye."""
        if not self.up:
            return
        self._end()
        self.sim.net.kill(self.name, power=kind == "power")
        self.disk.crash(kind)
        self.sim.trace("crash", self.name, kind, b"")

    def _end(self) -> None:
        if self.so is not None:
            self.journal_stats.append(self.so.journal_stats())
            self.refused.update(shim.transport(self.so).refused)
        self.up = False
        self.so = self.raft = self.reads = self.groups = None
        self._stop_serving()
        if self._groups_task is not None:
            self._groups_task.cancel()
            self._groups_task = None
        for handle in (self._step_handle, self._apply_handle):
            if handle is not None:
                handle.cancel()
        self._step_handle = self._apply_handle = None
        self._step_at = None

    def wipe(self) -> None:
        """The disk is replaced: killed (if up), then an empty disk with a new identity; boot() starts it."""
        self.crash("power")
        self.wipes += 1
        self.disk = SimDisk(random.Random(f"{self.sim.seed}:disk:{self.name}:{self.wipes}"))
        self.sim.trace("wipe", self.name, str(self.wipes), b"")

    def halt(self, why: str) -> None:
        self.halted = True
        self._end()
        self.sim.net.kill(self.name, power=False)

    def pause(self, until: float) -> None:
        self.paused_until = max(self.paused_until, until)

    # -- scheduling ------------------------------------------------------------------------------------------
    def wake(self) -> None:
        if not self.up:
            return
        self._schedule(max(self.sim.loop.time(), self.busy_until, self.paused_until))

    def _schedule(self, at: float) -> None:
        if self._step_at is not None and self._step_at <= at:
            return
        if self._step_handle is not None:
            self._step_handle.cancel()
        self._step_at = at
        self._step_handle = self.sim.loop.call_at(at, self.step, self.incarnation)

    def step(self, incarnation: int) -> None:
        self._step_handle = self._step_at = None
        if not self.up or incarnation != self.incarnation:
            return
        now = self.sim.loop.time()
        if self.paused_until > now:
            self._schedule(self.paused_until)
            return
        so = self.so
        assert so is not None
        self.steps += 1
        # The step's CPU time is drawn first: what it sends leaves when it ends (net.py), and a crash aimed inside
        # it (crash_mid_step) lands before its syncs completed and its messages left.
        cost = self.rng.uniform(STEP_COST_MIN_S, STEP_COST_MAX_S)
        if self.rng.random() < self.sim.stall_p:
            cost += self.rng.uniform(STALL_MIN_S, STALL_MAX_S)
        self.busy_until = now + cost
        self.disk.begin_step()
        if not self._as_node("a tick", lambda: so.doTick(0)):
            return
        self.sim.after_step(self)
        if self.crash_in_step is not None:
            (kind, down_s), self.crash_in_step = self.crash_in_step, None
            self.sim.loop.call_at(now + self.rng.uniform(0, cost), self._crash_mid_step, kind, down_s,
                                  self.incarnation)
        self._schedule(now + cost + TICK_PERIOD_S)

    def crash_mid_step(self, kind: str, down_s: float) -> None:
        """Crash this node inside its next step (after some of its work, before its syncs completed); it restarts
        ``down_s`` after that."""
        if self.up:
            self.crash_in_step = (kind, down_s)

    def _crash_mid_step(self, kind: str, down_s: float, incarnation: int) -> None:
        if self.up and incarnation == self.incarnation and not self.sim.healed:
            if kind == "power":
                self.disk.undo_step()
            self.crash(kind)
            self.sim.trace("mid_step", self.name, kind, b"")
            self.sim.down_for(self.name, down_s)

    def apply_soon(self) -> None:
        if self._apply_handle is None and self.up:
            at = max(self.sim.loop.time() + self.rng.uniform(0, APPLY_DELAY_MAX_S), self.paused_until)
            self._apply_handle = self.sim.loop.call_at(at, self._apply, self.incarnation)

    def _apply(self, incarnation: int) -> None:
        self._apply_handle = None
        if not self.up or incarnation != self.incarnation or self.so is None:
            return
        if self.paused_until > self.sim.loop.time():
            self.apply_soon()
            return
        self._as_node("apply", self.so._applier.run_pending)

    def _as_node(self, what: str, work: Callable[[], None]) -> bool:
        """Run ``work`` on this node's clocks; False when it halted the node (its ``os._exit``, or an exception the
        real process would have died of), each a violation."""
        with self.sim.clocks.running(self.name):
            try:
                work()
                return True
            except NodeHalted as e:
                self.sim.violation("node_halted", f"{self.name} called os._exit({e.code}) in {what}", node=self.name)
            except Exception:
                self.sim.violation("tick_raised", f"{self.name} raised in {what}", node=self.name,
                                   traceback=traceback.format_exc(limit=8))
        self.halt(what)
        return False

    def applied(self, index: int, payload: bytes | None) -> None:
        """The apply tap: every entry this node applies, before it is applied."""
        self.applies.append((index, payload))
        self.sim.on_apply(self, index, payload)

    # -- status ----------------------------------------------------------------------------------------------
    def refusals(self) -> dict[str, int]:
        out = dict(self.refused)
        if self.so is not None:
            for reason, n in shim.transport(self.so).refused.items():
                out[reason] = out.get(reason, 0) + n
        return out

    @property
    def applied_index(self) -> int:
        return self.so.applied_index if self.so is not None else 0
