"""The group leases of a schedule: members of one exclusive group heartbeat the leader (meta/group_sessions.py, run
on every simulated node as meta/service.py runs it), one at a time goes silent for longer than any lease, and an
operator shortens and lengthens the group's ``lease_ms`` in turn. Each answered heartbeat is an op that
ops/chaos/checker.py ``leases_never_overlap`` judges: a queue is never granted before the lease promised to its
last holder ends, not even after ``lease_ms`` went down (the chaos runner's exclusive workload, without brokers).

A member gives back half the queues an answer revokes in its next heartbeat, as a consumer that has finished with
them; the others, and all of them while it is silent, the leader's ExpireLocks ends once the lease promised to the
holder has run out (the path a shortened ``lease_ms`` must not cut short).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from ops.chaos.history import OK, UNKNOWN, Op
from wire.errors import ApiError

from .clock import VIRTUAL_EPOCH_S

GROUP = "sim-group"
TOPIC = "sim-leased"
QUEUES = 4
MEMBERS = ("m1", "m2", "m3")
LATE_JOIN_S = (2.0, 5.0)          # the last member joins this long after the others: queues move to it
LEASES_MS = (6_000, 2_000)        # the operator's turns: a shortening under a lease already promised is the edge
HEARTBEAT_MS = 500                # at most half the shortest lease (meta refuses more)
LEASE_CHANGE_EVERY_S = (2.0, 4.0)
RELEASE_P = 0.5                   # of the queues revoked from a member: given back at its next heartbeat; the rest
                                  # it keeps until the leader's ExpireLocks ends them (a consumer slow to finish)
FIRST_SILENCE_S = 3.0
SILENT_S = 7.0                    # past the longest lease: the member's queues go to the others
SILENT_GAP_S = 1.0
LEAVE_P = 0.04                    # of a member's heartbeats while it holds queues: it leaves instead (and joins
                                  # again at its next one), which moves queues and revokes others' on the way back
HEARTBEAT_TIMEOUT_S = 2.0
SETUP_RETRY_S = 0.2


class Leases:
    def __init__(self, sim: Any, ops: list[Op]):
        self.sim = sim
        self.ops = ops
        self.stopping = False
        self.configured = False   # members wait for the group's lease_ms (the default lease outlasts a silence)
        self.silent: str | None = None
        self._silent_until = 0.0
        self._next_silence = 0.0

    def tasks(self) -> list[Any]:
        loop = self.sim.loop
        self._next_silence = loop.time() + FIRST_SILENCE_S
        return [loop.create_task(self.operator()), *(loop.create_task(self.member(m)) for m in MEMBERS)]

    def _wall_ms(self) -> int:
        """The members' wall clock: the one the lease keeper reads too (it runs outside every node's step, so with
        none of their skews: ops/sim/clock.py NodeClocks)."""
        return int((VIRTUAL_EPOCH_S + self.sim.loop.time()) * 1000)

    def _leader(self) -> Any | None:
        leaders = [n for n in self.sim.nodes.values() if n.up and n.so is not None and n.so.is_leader()]
        return max(leaders, key=lambda n: n.so.raftCurrentTerm) if leaders else None

    def _is_silent(self, member: str) -> bool:
        now = self.sim.loop.time()
        if self.silent is not None and now >= self._silent_until:
            self.silent, self._next_silence = None, now + SILENT_GAP_S
        if self.silent is None and now >= self._next_silence:
            self.silent, self._silent_until = member, now + SILENT_S
        return self.silent == member

    async def _propose(self, cmd: dict[str, Any], rid: str) -> bool:
        node = self._leader()
        if node is None:
            return False
        try:
            r = await node.raft.propose(cmd, rid, "sim", timeout_s=HEARTBEAT_TIMEOUT_S)
        except ApiError:
            return False
        return bool(r.get("ok")) or (r.get("error") or {}).get("code") == "TOPIC_EXISTS"

    async def operator(self) -> None:
        """Creates the topic and the group's setting, then changes lease_ms every LEASE_CHANGE_EVERY_S."""
        rng = random.Random(f"{self.sim.seed}:leases:operator")
        setup = [{"type": "CreateTopic", "topic": TOPIC, "queues": QUEUES},
                 {"type": "SetGroupConfig", "group": GROUP,
                  "config": {"mode": "exclusive", "lease_ms": LEASES_MS[0], "heartbeat_interval_ms": HEARTBEAT_MS}}]
        n = 0
        for cmd in setup:
            while not self.stopping:
                n += 1
                if await self._propose(cmd, f"lease-op-{n}"):
                    break
                await asyncio.sleep(SETUP_RETRY_S)
        self.configured = True
        turn = 0
        while not self.stopping:
            await asyncio.sleep(rng.uniform(*LEASE_CHANGE_EVERY_S))
            turn += 1
            n += 1
            await self._propose({"type": "SetGroupConfig", "group": GROUP,
                                 "config": {"lease_ms": LEASES_MS[turn % len(LEASES_MS)]}}, f"lease-op-{n}")

    async def _leave(self, name: str, node: Any, holding: list[list[int]]) -> None:
        """``LeaveGroup``, as a member's leave proposes it (meta/api/groups.py): its queues are given back at once, so
        the op names them as released (leases_never_overlap)."""
        loop = self.sim.loop
        op = Op(name, "leave", {"node": node.name, "released": holding,
                                "sent_wall_ms": self._wall_ms()}, loop.time())
        self.ops.append(op)
        try:
            r = await node.raft.propose({"type": "LeaveGroup", "group": GROUP, "member": name}, None, "sim",
                                        timeout_s=HEARTBEAT_TIMEOUT_S)
            op.outcome = OK if r.get("ok") else UNKNOWN
        except ApiError:
            op.outcome = UNKNOWN
        op.complete = loop.time()
        self.sim.trace("op", name, "leave", op.outcome.encode())

    async def member(self, name: str) -> None:
        loop = self.sim.loop
        rng = random.Random(f"{self.sim.seed}:leases:{name}")
        if name == MEMBERS[-1]:
            await asyncio.sleep(rng.uniform(*LATE_JOIN_S))
        revoking: list[dict[str, Any]] = []
        held: list[list[int]] = []   # [queue, token] the last answer gave it
        gives_back: dict[tuple[int, int], bool] = {}   # (queue, token) revoked -> whether this member gives it back
        while not self.stopping:
            await asyncio.sleep(HEARTBEAT_MS / 1000)
            node = self._leader()
            if not self.configured or node is None or self._is_silent(name) or node.groups is None:
                continue
            for x in revoking:
                if (x["queue"], x["token"]) not in gives_back:
                    gives_back[(x["queue"], x["token"])] = rng.random() < RELEASE_P
            released = [x for x in revoking if gives_back[(x["queue"], x["token"])]]
            if held and rng.random() < LEAVE_P:
                await self._leave(name, node, held + [[x["queue"], x["token"]] for x in revoking])
                held, revoking = [], []
                continue
            op = Op(name, "heartbeat", {"node": node.name, "released": [[x["queue"], x["token"]] for x in released],
                                        "sent_wall_ms": self._wall_ms()}, loop.time())
            self.ops.append(op)
            incarnation = node.incarnation
            try:
                a = await asyncio.wait_for(node.groups.heartbeat(GROUP, name, [TOPIC], "exclusive", released),
                                           HEARTBEAT_TIMEOUT_S)
            except (ApiError, asyncio.TimeoutError):
                op.outcome = UNKNOWN
            else:
                if node.incarnation != incarnation or not node.up:
                    op.outcome = UNKNOWN   # answered by a node that crashed meanwhile: its member never heard it
                else:
                    op.outcome = OK
                    op.output = {"answered_wall_ms": self._wall_ms(),
                                 "assignments": [[x["queue"], x["token"], x["lease_expires_ms"]]
                                                 for x in a["assignments"] if x["topic"] == TOPIC]}
                    revoking = [x for x in a["revoking"] if x["topic"] == TOPIC]
                    held = [[q, t] for q, t, _ in op.output["assignments"]]
            op.complete = loop.time()
            self.sim.trace("op", name, "heartbeat", f"{op.outcome}:{op.output}".encode())
