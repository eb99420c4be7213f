"""The workload of a schedule: compare-and-set on one topic's config, linearizable reads by read index, and remaps.

Setup (retried until it takes, bounded by SETUP_S): three brokers and the topic CAS_TOPIC. Then CLIENTS processes,
each one operation at a time on a node it draws: "read" waits for that node's read index (meta/raft/read_index.py,
what ``consistency=linearizable`` waits for) and then reads the node's image (the config value and the topic's
version); "cas" writes a new unique value with
``expected_version`` the version its last read saw. Outcomes as ops/chaos/history.py: ok, fail (a refusal, or a
proposal the log says was certainly not applied), unknown (a timeout, a change of leader, a node that crashed).
A client also reads with ``min_version`` the highest version it saw, as a client of ``GET /v1/topics/{topic}``
does on any node (meta/reads.py), which must never answer an older one. One more process, the remapper, moves a
queue of CHAIN_TOPIC to another broker and then, as the old broker would (no broker runs here), reports the
segment left behind sealed at an end it draws: the chains of segments that meta/invariants.py holds every node's
final image to (ops/sim/checks.py).
"""

from __future__ import annotations

import asyncio
import collections
import random
from typing import Any

import aiohttp

from meta import chains
from ops.chaos.history import FAIL, OK, UNKNOWN, Op
from wire.caller import request_once
from wire.errors import ApiError, StatorError

from .node import TOKENS

CAS_TOPIC = "sim-cas"
CHAIN_TOPIC = "sim-chain"
CHAIN_QUEUES = 2
BROKERS = ("b1", "b2", "b3")
REMAP_THINK_MAX_S = 0.3
SEAL_RECORDS_MAX = 50       # a sealed segment ends this many offsets past its start at most
CAS_KEY = "v"
INITIAL = ""
CLIENTS = 3
OP_TIMEOUT_S = 2.0
THINK_MAX_S = 0.05
READ_MV_P = 0.2             # of a client's operations: a read with min_version (on any node, maybe one behind)
SETUP_S = 30.0
SETUP_RETRY_S = 0.2
CERTAINLY_NOT_APPLIED = {"NO_LEADER", "OVERLOADED"}
SETUP_COMMANDS = [
    *({"type": "RegisterBroker", "broker": b, "address": f"http://10.77.1.{i + 1}:9001"}
      for i, b in enumerate(BROKERS)),
    {"type": "CreateTopic", "topic": CAS_TOPIC, "queues": 1},
]


class Workload:
    def __init__(self, sim: Any):
        self.sim = sim
        self.ops: list[Op] = []
        self.ready = False
        self.stopping = False
        self.chain_ops: collections.Counter[str] = collections.Counter()   # "remap:ok", "seal:unknown", ...
        self._session: aiohttp.ClientSession | None = None   # the http workload's client

    def _up_nodes(self) -> list[Any]:
        return [n for n in self.sim.nodes.values() if n.up and n.raft is not None]

    async def _propose(self, node: Any, cmd: dict[str, Any], rid: str | None) -> tuple[str, dict[str, Any]]:
        """(outcome, answer) of one proposal through ``node``; the answer is the state machine's outcome."""
        incarnation = node.incarnation
        try:
            r = await node.raft.propose(cmd, rid, "sim", timeout_s=OP_TIMEOUT_S)
        except ApiError as e:
            return (FAIL if e.code in CERTAINLY_NOT_APPLIED else UNKNOWN), {"code": e.code}
        if node.incarnation != incarnation or not node.up:
            return UNKNOWN, {"code": "NODE_RESTARTED"}
        if r.get("ok"):
            return OK, r
        status = (r.get("error") or {}).get("status", 500)
        return (FAIL if 400 <= status < 500 else UNKNOWN), r

    async def _read_index(self, node: Any) -> str:
        """OK once ``node``'s image holds every write acknowledged before the call (the read index, as a
        linearizable read over HTTP waits: meta/raft/read_index.py), else UNKNOWN (a read changes nothing)."""
        incarnation = node.incarnation
        try:
            await node.raft.read_index(OP_TIMEOUT_S)
        except ApiError:
            return UNKNOWN
        return OK if node.incarnation == incarnation and node.up else UNKNOWN

    async def _read_min_version(self, process: str, node: Any, seen: int) -> Op:
        """A read as ``GET /v1/topics/{topic}?min_version=`` serves it (meta/reads.py ``before_read``, then the
        node's image; with the http workload, that request itself): the topic's version must be at least ``seen``
        (ops/chaos/checker.py monotonic_versions)."""
        loop = self.sim.loop
        op = Op(process, "read_mv", {"node": node.name, "min_version": seen}, loop.time())
        self.ops.append(op)
        if self.sim.http:
            await self._read_min_version_over_http(op, node, seen)
            return op
        incarnation, reads = node.incarnation, node.reads
        try:
            await reads.before_read({"min_version": str(seen), "wait": str(OP_TIMEOUT_S)})
        except ApiError:
            op.outcome = UNKNOWN
        else:
            t = reads.image.topic(CAS_TOPIC) if node.incarnation == incarnation and node.up else None
            op.outcome = OK if t is not None else UNKNOWN
            if t is not None:
                op.output = {"value": t["config"].get(CAS_KEY, INITIAL), "version": t["version"]}
        op.complete = loop.time()
        self.sim.trace("op", op.process, op.kind, f"{op.outcome}:{op.output}".encode())
        return op

    async def _read_min_version_over_http(self, op: Op, node: Any, seen: int) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            answer = await request_once(self._session, "GET", f"{node.url}/v1/topics/{CAS_TOPIC}",
                                        token=TOKENS.client, timeout_s=OP_TIMEOUT_S,
                                        params={"min_version": str(seen), "wait": str(OP_TIMEOUT_S)})
        except StatorError:   # refused, or no answer (Unavailable): a read changes nothing either way
            op.outcome = UNKNOWN
        else:
            t = answer.body
            op.outcome = OK
            op.output = {"value": t["config"].get(CAS_KEY, INITIAL), "version": t["version"]}
        op.complete = self.sim.loop.time()
        self.sim.trace("op", op.process, op.kind, f"{op.outcome}:{op.output}".encode())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def setup(self) -> None:
        loop = self.sim.loop
        deadline = loop.time() + SETUP_S
        for i, cmd in enumerate(SETUP_COMMANDS):
            while True:
                nodes = self._up_nodes()
                if nodes:
                    outcome, r = await self._propose(self.sim.rng.choice(nodes), cmd, f"setup-{i}")
                    if outcome == OK or (r.get("error") or {}).get("code") in ("ALREADY_EXISTS", "TOPIC_EXISTS"):
                        break
                if loop.time() > deadline:
                    raise RuntimeError(f"setup did not finish in {SETUP_S} s of virtual time")
                await asyncio.sleep(SETUP_RETRY_S)
        self.ready = True

    async def client(self, process: str) -> None:
        rng = random.Random(f"{self.sim.seed}:client:{process}")
        loop = self.sim.loop
        value, version, n = INITIAL, None, 0
        seen = 0   # the highest topic version this client saw answered
        while not self.stopping:
            await asyncio.sleep(rng.uniform(0, THINK_MAX_S))
            nodes = self._up_nodes()
            if not nodes:
                await asyncio.sleep(SETUP_RETRY_S)
                continue
            node = rng.choice(nodes)
            if seen and "min_version" in self.sim.workloads and rng.random() < READ_MV_P:
                op = await self._read_min_version(process, node, seen)
                if op.outcome == OK:
                    seen = max(seen, op.output["version"])
            elif version is None or rng.random() < 0.5:
                op = Op(process, "read", {"node": node.name}, loop.time())
                self.ops.append(op)
                outcome = await self._read_index(node)
                if outcome == OK:
                    t = node.so.current_image().topic(CAS_TOPIC) if node.so is not None else None
                    if t is None:
                        outcome = UNKNOWN
                    else:
                        value, version = t["config"].get(CAS_KEY, INITIAL), t["version"]
                        op.output = {"value": value, "version": version}
                        seen = max(seen, version)
                op.outcome = outcome if outcome == OK else UNKNOWN
                op.complete = loop.time()
            else:
                n += 1
                new = f"{process}.{n}"
                rid = f"{process}-{n}"
                op = Op(process, "cas", {"from": value, "to": new, "expected_version": version, "rid": rid,
                                         "node": node.name}, loop.time())
                self.ops.append(op)
                cmd = {"type": "SetTopicConfig", "topic": CAS_TOPIC, "config": {CAS_KEY: new},
                       "expected_version": version}
                outcome, r = await self._propose(node, cmd, rid)
                op.outcome = outcome
                op.error = (r.get("error") or {}).get("code") or r.get("code")
                if outcome != UNKNOWN:
                    op.complete = loop.time()
                version = None     # read again before the next write
            self.sim.trace("op", op.process, op.kind, f"{op.outcome}:{op.output}".encode())

    async def remapper(self) -> None:
        """Remaps and seals on CHAIN_TOPIC until the workload stops: a queue whose previous segment is being sealed
        gets its seal report (from the broker meta names as its sealer, under that broker's epoch), any other is
        moved to a broker other than its leader. What each answered goes to ``chain_ops``; the chains are judged
        on the final images."""
        rng = random.Random(f"{self.sim.seed}:remapper")
        n = 0
        while not self.stopping:
            await asyncio.sleep(rng.uniform(0, REMAP_THINK_MAX_S))
            nodes = self._up_nodes()
            if not nodes:
                continue
            node = rng.choice(nodes)
            if await self._read_index(node) != OK or node.so is None:
                continue
            image = node.so.current_image()
            if CHAIN_TOPIC not in image.topics:
                # Created here, not in the setup: a setup one step longer did not finish in some fault storms, and
                # those schedules lost their register workload too
                n += 1
                outcome, _answer = await self._propose(node, {"type": "CreateTopic", "topic": CHAIN_TOPIC,
                                                              "queues": CHAIN_QUEUES}, f"remapper-{n}")
                self.chain_ops[f"create:{outcome}"] += 1
                continue
            q = rng.randrange(CHAIN_QUEUES)
            segs = chains.chain(image.topics[CHAIN_TOPIC], q)
            if len(segs) >= 2 and segs[-2]["state"] == "sealing":
                seg, kind = segs[-2], "seal"
                end = min(seg["budget_end"], seg["physical_start"] + rng.randrange(SEAL_RECORDS_MAX + 1))
                cmd = {"type": "SealSegment", "broker": seg["sealer"], "epoch": image.brokers[seg["sealer"]]["epoch"],
                       "topic": CHAIN_TOPIC, "queue": q, "gen": seg["gen"], "end_offset": end,
                       "physical_queue": seg["physical_queue"]}
            else:
                kind = "remap"
                to = rng.choice([b for b in BROKERS if b != segs[-1]["broker"]])
                cmd = {"type": "RemapTopic", "topic": CHAIN_TOPIC, "brokers": [to], "queues": [q]}
            n += 1
            outcome, _answer = await self._propose(node, cmd, f"remapper-{n}")
            self.chain_ops[f"{kind}:{outcome}"] += 1
            self.sim.trace("op", "remapper", kind, outcome.encode())
