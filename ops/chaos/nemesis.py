"""The nemesis: a fault schedule drawn from a seeded ``random.Random`` (the same seed, duration and kinds give the
same schedule), and the executor that applies each fault and heals it after its hold time.

Faults come one after another (a gap, a fault held for a bounded time, its heal), so the cluster always gets back
to whole between two faults; what a fault does to the cluster's parts is as real as it gets on one machine: kill -9
and restart of the process, SIGSTOP/SIGCONT of its process group, SIGTERM and restart, and cut proxies (topology.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from dataclasses import asdict, dataclass
from typing import Any

from ops import devcluster

from .topology import Topology


KINDS = ("kill", "pause", "restart", "partition")
GAP_S = (0.2, 1.0)                  # between a heal and the next fault
HOLD_S = {"kill": (0.5, 3.0), "pause": (0.5, 4.0), "restart": (0.2, 1.5), "partition": (1.0, 5.0)}
FIRST_FAULT_S = 1.0                 # let the workloads start first
STOP_WAIT_S = 15.0                  # a stop or start of one member (devcluster waits up to 10 s + 5 s for a kill)


@dataclass(frozen=True)
class Fault:
    at_s: float        # after the start of the run
    kind: str
    target: str        # "m2", "b1", or for a partition "m2|rest" (a meta node from the others) / "b1|meta"
    hold_s: float

    def describe(self) -> str:
        return f"{self.at_s:7.2f}s {self.kind:<9} {self.target:<8} for {self.hold_s:.2f}s"


def schedule(seed: int, duration_s: float, kinds: tuple[str, ...], topology_names: tuple[list[str], list[str]]
             ) -> list[Fault]:
    """Every fault, healed before ``duration_s`` ends. Pure: only the arguments decide it."""
    rng = random.Random(seed)
    metas, brokers = topology_names
    faults: list[Fault] = []
    t = FIRST_FAULT_S
    while True:
        kind = rng.choice(kinds)
        hold = round(rng.uniform(*HOLD_S[kind]), 3)
        if kind == "partition":
            if rng.random() < 0.5:
                target = f"{rng.choice(metas)}|rest"
            else:
                target = f"{rng.choice(brokers)}|meta"
        else:
            target = rng.choice(metas + brokers)
        if t + hold > duration_s:
            return faults
        faults.append(Fault(round(t, 3), kind, target, hold))
        t += hold + rng.uniform(*GAP_S)


class Nemesis:
    """Applies a schedule to a running chaos cluster; ``heal_all`` puts everything back whatever happened."""

    def __init__(self, topology: Topology, faults: list[Fault], clock):
        self.t = topology
        self.faults = faults
        self.clock = clock                 # seconds since the run started (history.Recorder.now)
        self.applied: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._paused: set[str] = set()
        self._down: set[str] = set()

    async def run(self) -> None:
        for f in self.faults:
            await asyncio.sleep(max(0.0, f.at_s - self.clock()))
            started = self.clock()
            try:
                await self._apply(f)
                await asyncio.sleep(f.hold_s)
            except (OSError, RuntimeError, KeyError, asyncio.TimeoutError) as e:
                # a fault that could not be applied is reported (the run then gives no verdict), not fatal
                self.errors.append(f"applying {f.describe()}: {type(e).__name__}: {e}")
            finally:
                await self._heal(f)
            self.applied.append({**asdict(f), "started_s": round(started, 3), "healed_s": round(self.clock(), 3)})

    async def _apply(self, f: Fault) -> None:
        name = f.target.split("|")[0]
        if f.kind == "kill":
            await self._stop(name, signal.SIGKILL)
        elif f.kind == "restart":
            await self._stop(name, signal.SIGTERM)
        elif f.kind == "pause":
            self._signal(name, signal.SIGSTOP)
            self._paused.add(name)
        elif f.kind == "partition":
            for link in self._links(f.target):
                self.t.links[link].set_cut(True)

    async def _heal(self, f: Fault) -> None:
        name = f.target.split("|")[0]
        try:
            if f.kind in ("kill", "restart"):
                await self._start(name)
            elif f.kind == "pause":
                self._signal(name, signal.SIGCONT)
                self._paused.discard(name)
            elif f.kind == "partition":
                for link in self._links(f.target):
                    self.t.links[link].set_cut(False)
        except Exception as e:   # noqa: BLE001 -- reported in the summary; heal_all tries again at the end
            self.errors.append(f"healing {f.describe()}: {type(e).__name__}: {e}")

    def _links(self, target: str) -> list[str]:
        name, side = target.split("|")
        if side == "meta":
            return list(self.t.broker_meta_links[name])
        return [link for pair, links in self.t.meta_pair_links.items() if name in pair for link in links]

    async def _stop(self, name: str, sig: int) -> None:
        self._down.add(name)
        await asyncio.wait_for(asyncio.to_thread(devcluster.stop_member, self.t.dir, name, sig), STOP_WAIT_S)

    async def _start(self, name: str) -> None:
        # Not waiting for readiness: a lone meta node is ready only with a majority; the final heal waits for all.
        await asyncio.wait_for(asyncio.to_thread(devcluster.start, self.t.dir, name, False), STOP_WAIT_S)
        self._down.discard(name)

    def _signal(self, name: str, sig: int) -> None:
        pid = _pid(self.t, name)
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass

    async def heal_all(self) -> None:
        """Continue every paused member, reconnect every link, start every member left down."""
        for name in list(self._paused):
            self._signal(name, signal.SIGCONT)
        self._paused.clear()
        for link in self.t.links.values():
            if link.cut:
                link.set_cut(False)
        for name in list(self._down):
            try:
                await self._start(name)
            except RuntimeError:   # already running: a heal got there first
                self._down.discard(name)
            except Exception as e:  # noqa: BLE001 -- reported; the readiness wait names the member
                self.errors.append(f"final heal of {name}: {type(e).__name__}: {e}")

    def resume_all_now(self) -> None:
        """For the emergency path (Ctrl-C): a stopped process would not see SIGTERM until continued."""
        for name in list(self._paused):
            self._signal(name, signal.SIGCONT)
        self._paused.clear()


def _pid(t: Topology, name: str) -> int:
    for m in t.cluster()["meta"] + t.cluster()["brokers"]:
        if m.get("node", m.get("broker")) == name:
            return m["pid"]
    raise KeyError(name)
