"""Brokers in the simulator (the brokers workload): real broker nodes on the virtual net, and the chaos runner's
workloads, read-back and checks over them.

Each broker is broker/api/app.py's app around ``BrokerNode(config, driven=True)`` (no thread of its own: its
storage work runs inline, group commit and offset syncs as loop callbacks), listening on the virtual net
(ops/sim/vnet.py) and talking to the meta nodes' real API there: it registers, heartbeats, watches its routes. Its
files are real, in a temporary directory of the schedule. Every task a broker starts runs under its host
(vnet.HOST), so its connections leave from it. Each draws its sync scope from the seed: "file" (an fsync per
append, the per-queue path) or "filesystem" (group commit's syncfs), so that both write paths run.

The clients are ops/chaos/workloads.py's, unchanged, through an Env on the virtual net; at the end the chaos
runner's read-back gives every queue's messages and ops/chaos/checker.py judges the history with them.

The chaos runner's three data topics (each with three copies or one, drawn from the seed: COPIES), their senders,
the exclusive group's consumers, the pop group's poppers and its remapper (queues moved between the brokers, often
straight back, with bursts of sends). Broker faults (BROKER_KINDS in faults.py): a kill -9, a power loss that cuts
each file back to what the broker's own sync calls made durable (its ledger: runtime/power_loss.py), or a partition
from meta and the other brokers (its clients still reach it) longer than its session, so that meta fails its heads
over to a copy. A crashed incarnation runs nothing more: every callback in its context (vnet.LIFE) is skipped. Not
yet: wipes of brokers.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import os
import random
import shutil
import tempfile
from types import SimpleNamespace
from typing import Any

import aiohttp

from broker.api.app import make_app
from broker.config import BrokerConfig
from ops.chaos import checker, operators, workloads
from ops.chaos import runner as chaos_runner
from ops.chaos.history import Recorder
from runtime import power_loss
from runtime.credentials import token_hash
from runtime.serve import app_runner, set_up
from wire.caller import request_once
from wire.errors import StatorError

from . import vnet
from .node import OFFSET_BUDGET, TOKENS

BROKERS = ("r1", "r2", "r3")
BROKER_PORT = 9001
# The chaos runner's data topics (their batch sizes are workloads.SEND_BATCH's), each with a sender: the log, the
# exclusive group's (two consumers with leases and fencing tokens, their committed offsets) and the pop group's
# (two poppers, some acks late past the invisible time).
TOPICS = chaos_runner.DATA_TOPICS
QUEUES = workloads.QUEUES
CONSUMERS = 2
# Each data topic draws its copies from the seed: as the chaos runner makes it (three, two in sync: its heads fail
# over to a copy when a broker is lost or cut off), or one (a broker's power loss alone can lose what it
# acknowledged unsynced, and only a remap moves the queue's state between brokers).
COPIES = ((workloads.DATA_REPLICAS, workloads.DATA_MIN_INSYNC), (1, 1))
SYNC_SCOPES = ("file", "filesystem")
CLUSTER = "sim-brokers"          # the topic is scoped to these brokers: the remapper's are names only
SETUP_RETRY_S = 0.5
SETUP_S = 30.0                   # virtual seconds for the brokers to register and the topic to be created
READ_BACK_S = 300.0                # virtual: the drain alone may take DRAIN_DEADLINE_S


def broker_token(name: str) -> str:
    return f"stator-sim-broker-{name}"


def broker_tokens() -> dict[str, str]:
    """What meta and every broker know of the brokers' tokens (their hashes)."""
    return {b: token_hash(broker_token(b)) for b in BROKERS}


class SimBroker:
    def __init__(self, sim: Any, name: str, index: int, root: str):
        self.sim, self.name = sim, name
        self.host = f"10.78.0.{index + 1}"
        self.data_dir = os.path.join(root, name)
        self.sync_scope = random.Random(f"{sim.seed}:broker:{name}").choice(SYNC_SCOPES)
        self.rng = random.Random(f"{sim.seed}:broker-faults:{name}")
        self.runner: Any = None
        self.life: vnet.Life | None = None
        self.up = False
        self.crashes = 0
        self.bytes_lost = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{BROKER_PORT}"

    def config(self) -> BrokerConfig:
        return BrokerConfig(broker=self.name, data_dir=self.data_dir, http_host=self.host, http_port=BROKER_PORT,
                            meta_urls=tuple(n.url for n in self.sim.nodes.values()), token=broker_token(self.name),
                            client_token=TOKENS.client, admin_token=TOKENS.admin, sync_scope=self.sync_scope,
                            cluster=CLUSTER,
                            broker_tokens={b: h for b, h in broker_tokens().items() if b != self.name})

    def start(self) -> asyncio.Task:
        """Started as its own host and incarnation: every task and callback it makes inherits vnet.HOST and
        vnet.LIFE. Its syncs feed a power-loss ledger of its own (runtime/power_loss.py)."""
        power_loss.enable(self.data_dir)
        self.life = vnet.Life()
        self.up = True
        context = contextvars.copy_context()
        context.run(vnet.HOST.set, self.host)
        context.run(vnet.LIFE.set, self.life)
        return self.sim.loop.create_task(self._serve(), context=context)

    def crash(self, power: bool) -> None:
        """kill -9 (``power``: then a power loss): nothing of this incarnation runs again, its port and connections
        go at once; a power loss cuts its files back to what its syncs made durable, tearing the lost tails."""
        if not self.up:
            return
        assert self.life is not None
        self.life.alive = False
        self.up = False
        self.crashes += 1
        power_loss.disable(self.data_dir)   # what its dead code might still sync counts for nothing
        self.sim.vnet.unlisten(self.host, BROKER_PORT)
        self.sim.vnet.reset(self.host)
        self.runner = None                   # never cleaned up: a crash closes nothing
        if power:
            self.bytes_lost += power_loss.lose_unsynced(self.data_dir, self.rng, tear=True).bytes_lost

    async def _serve(self) -> None:
        runner = app_runner(make_app(self.config(), driven=True))
        await set_up(runner)
        await vnet.VirtualSite(runner, self.sim.vnet, self.host, BROKER_PORT).start()
        self.runner = runner

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        power_loss.disable(self.data_dir)


class BrokerWorkload:
    """The brokers, the senders, the read-back and the message checks of one schedule."""

    def __init__(self, sim: Any):
        self.sim = sim
        self.root = tempfile.mkdtemp(prefix="stator-sim-brokers-")
        self.brokers = [SimBroker(sim, b, i, self.root) for i, b in enumerate(BROKERS)]
        self.rec = Recorder()
        self.env: workloads.Env | None = None
        self.session: aiohttp.ClientSession | None = None
        self.ready = False
        self.final: dict[tuple[str, int], dict[int, str]] | None = None
        self.dead: set[tuple[str, int, int]] = set()
        self.segments: dict[tuple[str, int], list[tuple[int, int | None]]] = {}
        self.epochs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.turns: workloads.SilenceTurns | None = None
        self._attempts = 0
        self._starts: list[asyncio.Task] = []
        self._lives: list[vnet.Life] = []   # each start's incarnation: a crashed one's start never finishes
        self._cuts: collections.Counter[tuple[str, str]] = collections.Counter()   # links broker_partition holds cut
        self.copies = {t: random.Random(f"{sim.seed}:copies:{t}").choice(COPIES) for t in TOPICS}

    def start(self) -> None:
        for b in self.brokers:
            self._start(b)

    def _start(self, broker: SimBroker) -> None:
        self._starts.append(broker.start())
        assert broker.life is not None
        self._lives.append(broker.life)

    def fault(self, name: str, power: bool, down_s: float) -> bool:
        """The broker ``name`` crashes now (a power loss with ``power``) and starts again ``down_s`` later; False if
        it is down already."""
        broker = next(b for b in self.brokers if b.name == name)
        if not broker.up:
            return False
        broker.crash(power)
        self.sim.trace("broker_crash", name, "power" if power else "process", b"")

        def restart() -> None:
            if not broker.up:
                self._start(broker)

        self.sim.loop.call_at(self.sim.loop.time() + down_s, restart)
        return True

    def partition(self, name: str, cut_s: float) -> bool:
        """The broker ``name`` is cut off from every meta node and every other broker, both ways, for ``cut_s``;
        its clients still reach it (they dial from the simulator's own host). False if it is down."""
        broker = next(b for b in self.brokers if b.name == name)
        if not broker.up:
            return False
        others = [n.host for n in self.sim.nodes.values()]
        others += [b.host for b in self.brokers if b is not broker]
        links = collections.Counter(link for o in others for link in ((broker.host, o), (o, broker.host)))
        self._cuts.update(links)
        self.sim.vnet.cut |= set(links)
        self.sim.trace("broker_partition", name, f"{cut_s:.3f}", b"")

        def mend() -> None:
            self._cuts.subtract(links)
            self.sim.vnet.mend({link for link in links if self._cuts[link] <= 0})

        self.sim.loop.call_at(self.sim.loop.time() + cut_s, mend)
        return True

    def heal(self) -> None:
        """Every broker cut off is back, every broker down starts again."""
        self._cuts.clear()
        self.sim.vnet.heal()
        for b in self.brokers:
            if not b.up:
                self._start(b)

    async def setup(self) -> None:
        """The topic, once the brokers have registered (its queues are placed over active brokers)."""
        self.session = aiohttp.ClientSession()
        meta_urls = [n.url for n in self.sim.nodes.values()]
        self.env = workloads.Env(self.session, meta_urls, {"client": TOKENS.client, "admin": TOKENS.admin},
                                 self.rec, self.sim.seed)
        deadline = self.sim.loop.time() + SETUP_S
        group = {"mode": "exclusive", "lease_ms": workloads.EX_LEASE_MS,
                 "heartbeat_interval_ms": workloads.EX_HEARTBEAT_MS}

        async def create(kind: str, name: str) -> None:
            while not await self._create(kind, name, group):
                if self.sim.loop.time() > deadline:
                    raise RuntimeError(f"{kind} {name} was not ready within {SETUP_S} s of virtual time")
                await asyncio.sleep(SETUP_RETRY_S)

        await asyncio.gather(*(create("topic", t) for t in TOPICS), create("group", workloads.EX_GROUP))
        self.turns = workloads.SilenceTurns(self.rec.now())
        self.ready = True

    async def _create(self, kind: str, what: str, group: dict[str, Any]) -> bool:
        """A topic (True once its every queue has an address) or the exclusive group's settings."""
        assert self.env is not None and self.session is not None
        try:
            if kind == "group":
                await request_once(self.session, "PUT", f"{self.env.meta()}/v1/groups/{what}/config",
                                   token=TOKENS.admin, json=group, timeout_s=5.0,
                                   headers={"Idempotency-Key": f"sim-{what}"})
                return True
            replicas, min_insync = self.copies[what]
            body = {"topic": what, "queues": QUEUES, "replicas": replicas, "min_insync": min_insync,
                    "scope": [CLUSTER]}
            self._attempts += 1   # a new key each time: a key replays its first answer (NO_BROKERS before they join)
            try:
                await request_once(self.session, "POST", f"{self.env.meta()}/v1/topics", token=TOKENS.admin,
                                   json=body, headers={"Idempotency-Key": f"sim-{what}-{self._attempts}"},
                                   timeout_s=5.0, ok=(200, 201))
            except StatorError as e:
                if e.code != "TOPIC_EXISTS":   # an earlier attempt's, whose answer was lost
                    raise
            route = await self.env.route(what, fresh=True)
            return all(workloads.queue_address(route, q) for q in range(QUEUES))
        except StatorError:
            return False

    def tasks(self) -> list[asyncio.Task]:
        env, loop = self.env, self.sim.loop
        assert env is not None and self.turns is not None
        out = [loop.create_task(workloads.send(env, f"send-{topic}", topic)) for topic in TOPICS]
        out += [loop.create_task(workloads.exclusive(env, f"ex-{i}", self.turns)) for i in range(CONSUMERS)]
        out += [loop.create_task(workloads.popper(env, f"pop-{i}")) for i in range(CONSUMERS)]
        out.append(loop.create_task(operators.remapper(env, "remapper", [b.name for b in self.brokers])))
        return out

    def stop_clients(self) -> None:
        if self.env is not None:
            self.env.stop.set()

    async def read_back(self) -> None:
        """As the chaos runner reads back (ops/chaos/runner.py): every queue's messages, the pops left (drained),
        the exclusive group's committed offsets (recorded), the dead letters."""
        if not self.ready or self.env is None:
            return
        try:
            self.final = await asyncio.wait_for(self._read_back(self.env), READ_BACK_S)
        except (StatorError, chaos_runner.RunFailed, asyncio.TimeoutError):
            self.final = None

    async def _read_back(self, env: workloads.Env) -> dict[tuple[str, int], dict[int, str]]:
        final: dict[tuple[str, int], dict[int, str]] = {}
        for topic in TOPICS:
            final.update(await chaos_runner._read_topic(env, topic))
            chains, epochs = await chaos_runner._retrying(f"the segments of {topic}",
                                                          lambda: chaos_runner._segments(env, topic),
                                                          chaos_runner.FINAL_DEADLINE_S)
            self.segments.update(chains)
            self.epochs.update(epochs)
        await chaos_runner._drain_pops(env)
        await chaos_runner._read_committed(env)
        self.dead = await chaos_runner._dead_lettered(env, SimpleNamespace(broker_url=lambda b: self.brokers[b].url))
        return final

    def violations(self) -> list[dict[str, Any]]:
        """The chaos runner's checks of messages and consumers (ops/chaos/checker.py) over this history."""
        if not self.ready:
            return []
        ops = self.rec.ops
        out = checker.committed_offsets(ops) + checker.exclusive_commits(ops) + checker.stale_pop_acks(ops)
        out += checker.acked_pops_stay_acked(ops)
        if self.final is None:
            return out + [checker.violation("read_back", f"the data topics could not be read back within "
                                                         f"{READ_BACK_S} s")]
        pops, _stats = checker.pops_acked_or_redelivered(ops, self.dead, workloads.POP_TOPIC)
        contiguous, _stats = checker.queues_contiguous(self.final, self.segments, OFFSET_BUDGET, self.epochs)
        return out + checker.no_lost_sends(ops, self.final) + pops + contiguous

    def history(self) -> bytes:
        """The clients' history and the read-back, for the schedule's trace hash (a replay must give the same)."""
        ops = [(o.process, o.kind, o.outcome, o.error, o.output) for o in self.rec.ops]
        final = sorted((k, sorted(v.items())) for k, v in (self.final or {}).items())
        return repr((ops, final)).encode()

    def counts(self) -> dict[str, Any]:
        sends = [o for o in self.rec.ops if o.kind in checker.SEND_KINDS]
        kinds = collections.Counter(f"{o.kind}:{o.outcome}" for o in self.rec.ops if o.kind not in checker.SEND_KINDS)
        return {"sends": len(sends), "sends_ok": sum(o.outcome == "ok" for o in sends), "ops": dict(sorted(kinds.items())),
                "crashes": sum(b.crashes for b in self.brokers), "bytes_lost": sum(b.bytes_lost for b in self.brokers),
                "messages_read_back": sum(len(v) for v in (self.final or {}).values()),
                "sync_scopes": {b.name: b.sync_scope for b in self.brokers},
                "copies": {t: c[0] for t, c in self.copies.items()}}

    async def close(self) -> None:
        live = [t for life, t in zip(self._lives, self._starts) if life.alive]
        for t in live:   # a crashed incarnation's start never finishes: nothing of it runs any more
            t.cancel()
        await asyncio.gather(*live, return_exceptions=True)
        for b in self.brokers:
            if b.up:
                await b.stop()
            power_loss.disable(b.data_dir)
        if self.session is not None:
            await self.session.close()
        _close_descriptors_under(self.root)   # what crashed incarnations left open: nothing of theirs runs again
        shutil.rmtree(self.root, ignore_errors=True)


def _close_descriptors_under(root: str) -> None:
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(root + os.sep):
                os.close(int(name))
        except OSError:
            continue
