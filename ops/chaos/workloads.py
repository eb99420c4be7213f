"""The client workloads, each a loop of single-attempt HTTP calls recorded in the history (history.Recorder).

Single attempts on purpose: the client library's retry loops would hide what happened to each request, and the
checks need every request's own outcome. Each loop runs until ``stop`` is set; every request has a timeout.
- ``cas``: linearizable read of topic CAS_TOPIC, then a compare-and-set of its config key with ``expected_version``;
  every few rounds a read from any node with ``min_version`` (the versions a client sees must never go back).
- ``ksend``: keyed batches through the client library's Producer, which routes each key by the slot table and
  follows the topic's growth (the one workload that retries: the library's own loop is what it is about).
- ``send``: a batch per request to a random queue of a topic, at the broker its route names (on the broker's own
  port, around its front proxy: topology.py), recorded with that broker and the route's leader epoch.
- ``exclusive``: a member of an exclusive group: heartbeats to meta for its queues and tokens, pulls with the token,
  commits with the token. It keeps using a token until a heartbeat answer takes the queue away, even through a
  partition from meta or a silence of its own (SilenceTurns): the broker's fencing, not the client's caution, must
  keep two owners from committing. A queue an answer revokes it gives back in its next heartbeat (``released``).
- ``pop``: pops from the brokers holding the topic's heads, acks most messages at once and some past their
  invisible time (when another popper may hold them under a newer handle), leaves some unacked to come back.
- ``sizes``: meta commands of every size class, tiny to the largest the API takes, as topic config writes, each
  class on a topic of its own; a linearizable read after every refusal or doubt (see the section below).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from typing import Any

import aiohttp

from client.producer import Producer
from wire.errors import StatorError
from wire.caller import request_once
from meta import limits

from . import bodies
from .history import UNKNOWN, Recorder, outcome_of

CAS_TOPIC, LOG_TOPIC, EX_TOPIC, POP_TOPIC = "chaos-cas", "chaos-log", "chaos-ex", "chaos-pop"
CAS_KEY = "v"
EX_GROUP, POP_GROUP = "chaos-ex", "chaos-pop"
QUEUES = 3
# The data topics' copies, asked for explicitly (the cluster's default is the same with three brokers): every head on
# all three brokers, a send acknowledged once two at least hold it (the nemesis's broker faults are about them).
DATA_REPLICAS, DATA_MIN_INSYNC = 3, 2
REQUEST_TIMEOUT_S = 6.0      # above meta's proposal wait, so a slow commit is an answer rather than unknown
PACE_S = 0.05                # between two requests of one loop: enough load, without starving the cluster's CPU
ERROR_PAUSE_S = 0.3          # after a failed request: the route or the leader is moving
ROUTE_REFRESH_S = 2.0
READ_MV_EVERY = 3
POP_INVISIBLE_MS = 2000
POP_WAIT_MS = 300
POP_MAX = 8
UNACKED_SHARE = 0.15         # pops deliberately left unacked (a consumer that crashed): they must come back
# Pops acked late, past their invisible time (a consumer slower than it promised): by then another popper may hold
# the message under a newer handle, and the late ack must change nothing (checker.stale_pop_acks)
LATE_ACK_SHARE = 0.1
LATE_ACK_AFTER_S = (POP_INVISIBLE_MS / 1000 + 0.2, POP_INVISIBLE_MS / 1000 + 2.5)
LATE_ACKS_MAX = 200          # handles one popper holds for later; past this it acks on time
POP_ONE_QUEUE_SHARE = 0.5    # pops naming one queue rather than the whole topic
EX_LEASE_MS = 3000
EX_HEARTBEAT_MS = 500
# A member goes silent (no heartbeats) for longer than its lease now and then, yet keeps pulling and committing with
# the tokens it holds, like a client in a long GC pause: meta gives its queues to the other member, and the broker
# must refuse the silent one's commits (409 STALE_TOKEN). Only a member holding queues goes silent (a silence of
# one holding nothing shows nothing), one at a time (SilenceTurns), so that a live member takes the queues over.
# A silence lasts until a commit of the silent member is refused STALE_TOKEN (what it is there to show), and at most
# EX_SILENT_MAX_S, well past the longest lease the operator may set (EX_LEASE_MAX_MS, which operators.LEASES_MS keeps
# to). A silence of a fixed 10 s (that lease plus 6 s) often showed no refusal in the CI run's 40 s: the meta faults
# of that seed held the expiry back (a leader cut, an install, a wipe and a replace within 20 s; each new leader
# starts every lease afresh), and the broker answered LOCKS_CATCHING_UP or NOT_ENOUGH_REPLICAS meanwhile; once,
# neither of the run's two silences met a refusal (stop 53). Every run longer than EX_FIRST_SILENCE_S +
# EX_SILENT_MAX_S has one silence that met it or ran its longest.
EX_LEASE_MAX_MS = 4000
EX_SILENT_MAX_S = 60.0
EX_SILENT_GAP_S = 2.0        # between one silence and the next
EX_FIRST_SILENCE_S = 6.0
PULL_MAX = 50
# Messages per send request, per topic: the log topic takes the 10-100; the pop and exclusive topics fewer,
# so that their consumers (a few messages per pop, a pull and commit per round) keep up and the final drain ends.
SEND_BATCH = {LOG_TOPIC: (10, 100), EX_TOPIC: (1, 20), POP_TOPIC: (1, 8)}
SEND_PACE_S = 0.2
SEND_TIMEOUT_S = 15.0        # a batch with a body of a few MiB, fsynced, on a loaded machine


class Env:
    """What every workload shares: the session, tokens, meta URLs, the recorder, the stop flag and routes."""

    def __init__(self, session: aiohttp.ClientSession, meta_urls: list[str], tokens: dict[str, str],
                 recorder: Recorder, seed: int, direct: dict[str, str] | None = None):
        self.session = session
        # a broker's advertise URL -> its own port's (topology.Topology.direct_urls): where the senders send
        self.direct = {k.rstrip("/"): v.rstrip("/") for k, v in (direct or {}).items()}
        self.meta_urls = meta_urls
        self.client_token = tokens["client"]
        self.admin_token = tokens["admin"]
        self.rec = recorder
        self.stop = asyncio.Event()
        self.rng = random.Random(seed)
        self._routes: dict[str, tuple[float, dict[str, Any]]] = {}
        self.size_turn = self.rng.randrange(SIZE_MULTIPLES[1] - SIZE_MULTIPLES[0] + 1)   # the next 64 KiB multiple

    def meta(self) -> str:
        return self.rng.choice(self.meta_urls)

    async def route(self, topic: str, fresh: bool = False) -> dict[str, Any]:
        cached = self._routes.get(topic)
        if cached and not fresh and self.rec.now() - cached[0] < ROUTE_REFRESH_S:
            return cached[1]
        answer = await request_once(self.session, "GET", f"{self.meta()}/v1/routes/{topic}", token=self.client_token,
                                    timeout_s=REQUEST_TIMEOUT_S)
        self._routes[topic] = (self.rec.now(), answer.body)
        return answer.body

    def forget_route(self, topic: str) -> None:
        """After a failed request the route may have moved: the next request asks meta again."""
        self._routes.pop(topic, None)

    async def pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass


def queue_address(route: dict[str, Any], queue: int) -> str | None:
    for q in route.get("queues", []):
        if q["queue"] == queue and q.get("address"):
            return q["address"].rstrip("/")
    return None


async def cas(env: Env, process: str) -> None:
    n = 0
    seen = 0
    while not env.stop.is_set():
        n += 1
        try:
            if n % READ_MV_EVERY == 0:
                async with env.rec.op(process, "read_mv", min_version=seen) as op:
                    a = await request_once(env.session, "GET", f"{env.meta()}/v1/topics/{CAS_TOPIC}",
                                           token=env.client_token, params={"min_version": seen},
                                           timeout_s=REQUEST_TIMEOUT_S)
                    op.output = {"value": a.body["config"].get(CAS_KEY), "version": a.body["version"]}
                seen = max(seen, op.output["version"])
            async with env.rec.op(process, "read") as op:
                a = await request_once(env.session, "GET", f"{env.meta()}/v1/topics/{CAS_TOPIC}",
                                       token=env.client_token, params={"consistency": "linearizable"},
                                       timeout_s=REQUEST_TIMEOUT_S)
                op.output = {"value": a.body["config"].get(CAS_KEY), "version": a.body["version"]}
            seen = max(seen, op.output["version"])
            value, version = op.output["value"], op.output["version"]
            new = f"{process}-{n}"
            async with env.rec.op(process, "cas", **{"from": value, "to": new, "expected_version": version}) as op:
                a = await request_once(env.session, "PUT", f"{env.meta()}/v1/topics/{CAS_TOPIC}/config",
                                       token=env.admin_token, json={CAS_KEY: new},
                                       params={"expected_version": version}, timeout_s=REQUEST_TIMEOUT_S)
                op.output = {"version": a.body["version"]}
            seen = max(seen, op.output["version"])
            await env.pause(PACE_S)
        except StatorError:
            await env.pause(ERROR_PAUSE_S)


def queue_leader(route: dict[str, Any], queue: int) -> tuple[str | None, int | None]:
    """(the broker the route names as the queue's leader, the route's leader epoch of the queue)."""
    for q in route.get("queues", []):
        if q["queue"] == queue:
            return q.get("broker"), q.get("leader_epoch", q.get("gen"))
    return None, None


# -- keyed sends through the client library -----------------------------------------------------------------------
KEYS = tuple(f"k{i}" for i in range(12))
KEYED_BATCH = (1, 5)
KEYED_ATTEMPTS = 3           # the library's retries (a resend is stored once: its idempotent producer)
KEYED_DEADLINE_S = 20.0


async def keyed_send(env: Env, process: str, topic: str) -> None:
    """Batches of one key each, sent by the client library's Producer: it picks the queue from the key through the
    route's slot table, and follows the topic's growth as a real producer does (checker.keys_in_order). Recorded as
    ``ksend``: input key, tag and sizes; output queue, offsets and broker. The library retries within
    KEYED_ATTEMPTS; a failure is recorded with what it raised."""
    n = 0
    async with Producer(env.meta_urls, env.client_token, topic, session=env.session, route_mode="long_poll",
                        attempts_max=KEYED_ATTEMPTS, deadline_s=KEYED_DEADLINE_S,
                        send_timeout_s=SEND_TIMEOUT_S) as producer:
        while not env.stop.is_set():
            n += 1
            key = env.rng.choice(KEYS)
            tag = f"{process}-{n}"
            sizes = bodies.sizes(env.rng, env.rng.randint(*KEYED_BATCH))
            try:
                async with env.rec.op(process, "ksend", topic=topic, key=key, tag=tag, sizes=sizes) as op:
                    r = await producer.send_batch([{"body": bodies.body(f"{tag}.{i}", size), "key": key}
                                                   for i, size in enumerate(sizes)])
                    op.output = {"queue": r.queue, "offsets": r.offsets, "broker": r.broker}
                await env.pause(SEND_PACE_S)
            except StatorError:
                await env.pause(ERROR_PAUSE_S)


async def send(env: Env, process: str, topic: str) -> None:
    """Batches of SEND_BATCH[topic] messages to a random queue of the topic (as many queues as its route has: the
    topic grows during the run), one ``send_once`` each, SEND_PACE_S apart."""
    n = 0
    while not env.stop.is_set():
        n += 1
        try:
            route = await env.route(topic)
            if await send_once(env, process, topic, env.rng.randrange(max(1, len(route.get("queues", [])))),
                               f"{process}-{n}"):
                await env.pause(SEND_PACE_S)
            else:
                await env.pause(ERROR_PAUSE_S)
        except StatorError:
            env.forget_route(topic)
            await env.pause(ERROR_PAUSE_S)


async def send_once(env: Env, process: str, topic: str, queue: int, tag: str) -> bool:
    """One batch of SEND_BATCH[topic] messages to ``queue``, bodies of every size (bodies.py), at the broker its
    route names; False when the route names none. The history keeps the batch's tag and sizes, the broker it was
    sent to (the only one that can answer at that address: a broker that does not lead the queue refuses, 409
    NOT_LEADER) and the leader epoch of the route it was sent with (the answer names no epoch):
    checker.one_leader_per_epoch reads them. StatorError when refused or unanswered."""
    route = await env.route(topic)
    address = queue_address(route, queue)
    if address is None:
        return False
    broker, epoch = queue_leader(route, queue)
    sizes = bodies.sizes(env.rng, env.rng.randint(*SEND_BATCH[topic]))
    messages = [{"body": bodies.body(f"{tag}.{i}", size)} for i, size in enumerate(sizes)]
    async with env.rec.op(process, "send", topic=topic, queue=queue, tag=tag, sizes=sizes,
                          address=address, broker=broker, leader_epoch=epoch) as op:
        url = env.direct.get(address, address)
        a = await request_once(env.session, "POST", f"{url}/v1/messages/{topic}/{queue}",
                               token=env.client_token, json={"messages": messages},
                               timeout_s=SEND_TIMEOUT_S)
        op.output = {"queue": a.body["queue"], "offsets": a.body["offsets"]}
    return True


class SilenceTurns:
    """Whose turn it is to go silent: one member at a time, the first EX_FIRST_SILENCE_S after the start, the next
    EX_SILENT_GAP_S after the last one ended; a silence ends at its member's first commit refused STALE_TOKEN
    (``fenced``), or EX_SILENT_MAX_S after it began."""

    def __init__(self, now: float):
        self.next_at = now + EX_FIRST_SILENCE_S
        self.silent: str | None = None
        self.until = 0.0

    def is_silent(self, process: str, now: float, holding: bool) -> bool:
        if self.silent == process and now >= self.until:
            self._end(now)
        if self.silent is None and holding and now >= self.next_at:
            self.silent, self.until = process, now + EX_SILENT_MAX_S
        return self.silent == process

    def fenced(self, process: str, now: float) -> None:
        """The broker refused a commit of ``process`` with a token meta took away: a silence of it has shown what
        it was for."""
        if self.silent == process:
            self._end(now)

    def _end(self, now: float) -> None:
        self.silent, self.next_at = None, now + EX_SILENT_GAP_S


async def exclusive(env: Env, process: str, turns: SilenceTurns) -> None:
    held: dict[int, int] = {}          # queue -> token
    positions: dict[int, int] = {}     # queue -> next offset to read
    releasing: list[list[int]] = []    # [queue, token] revoked here: given back with every heartbeat until one is ok
    next_heartbeat = 0.0
    while not env.stop.is_set():
        now = env.rec.now()
        silent = turns.is_silent(process, now, bool(held))
        if not silent and now >= next_heartbeat:
            next_heartbeat = env.rec.now() + EX_HEARTBEAT_MS / 1000
            body: dict[str, Any] = {"member": process, "topics": [EX_TOPIC], "mode": "exclusive"}
            sent = list(releasing)
            if sent:
                body["released"] = [{"topic": EX_TOPIC, "queue": q, "token": t} for q, t in sent]
            try:
                # the release may take effect from when it is sent (checker.leases_never_overlap), whatever the answer
                async with env.rec.op(process, "heartbeat", released=sent,
                                      sent_wall_ms=int(time.time() * 1000)) as op:
                    a = await request_once(env.session, "POST", f"{env.meta()}/v1/groups/{EX_GROUP}/heartbeat",
                                           token=env.client_token, timeout_s=REQUEST_TIMEOUT_S, json=body)
                    # when the grant reached the member, by the wall clock meta stamps lease ends with (one machine)
                    op.output = {"answered_wall_ms": int(time.time() * 1000),
                                 "assignments": [[x["queue"], x["token"], x["lease_expires_ms"]]
                                                 for x in a.body["assignments"]]}
                releasing = []   # every one was in this heartbeat's release
                now_held = {q: t for q, t, _ in op.output["assignments"]}
                for q in list(held):
                    if q not in now_held or now_held[q] != held[q]:
                        positions.pop(q, None)
                held = now_held
                # Give a revoked queue back at once, as the client library does (KIP-848): its new owner gets it on
                # its next heartbeat rather than a lease later. Leases then change hands in the run's first second,
                # before any meta fault, where a handover by expiry alone could wait out every new leader's lease.
                for r in a.body.get("revoking", []):
                    ref = [int(r["queue"]), int(r["token"])]
                    if r["topic"] == EX_TOPIC and ref not in releasing:
                        releasing.append(ref)
                        next_heartbeat = 0.0
            except StatorError:
                pass    # keep the tokens: see the module doc
        for queue, token in list(held.items()):
            if env.stop.is_set():
                break
            try:
                await _consume_once(env, process, queue, token, positions, silent)
            except StatorError as e:
                positions.pop(queue, None)
                if e.code == "STALE_TOKEN":
                    held.pop(queue, None)
                    turns.fenced(process, env.rec.now())
                await env.pause(ERROR_PAUSE_S / len(held or [1]))
        await env.pause(PACE_S if held else EX_HEARTBEAT_MS / 1000)


async def _consume_once(env: Env, process: str, queue: int, token: int, positions: dict[int, int],
                        silent: bool) -> None:
    """Pull a batch with the token and commit past it; a silent member only commits the position it has again
    (a pull with a stale token is refused too, and the commit is what the check is about)."""
    address = queue_address(await env.route(EX_TOPIC), queue)
    if address is None:
        return
    base = f"{address}/v1/offsets/{EX_GROUP}/{EX_TOPIC}/{queue}"
    if queue not in positions:
        positions[queue] = max(0, await read_committed(env, process, queue, address))
    if silent:
        nxt = positions[queue]
    else:
        a = await request_once(env.session, "GET", f"{address}/v1/messages/{EX_TOPIC}/{queue}",
                               token=env.client_token, timeout_s=REQUEST_TIMEOUT_S,
                               params={"offset": positions[queue], "max": PULL_MAX, "group": EX_GROUP, "token": token})
        nxt = a.body["next_offset"]
    async with env.rec.op(process, "commit", topic=EX_TOPIC, queue=queue, token=token, offset=nxt,
                          address=address) as op:
        c = await request_once(env.session, "PUT", base, token=env.client_token,
                               json={"offset": nxt, "token": token}, timeout_s=REQUEST_TIMEOUT_S)
        op.output = {"offset": c.body["offset"]}
    positions[queue] = nxt


async def read_committed(env: Env, process: str, queue: int, address: str) -> int:
    """The group's committed offset of an EX_TOPIC queue, recorded (checker.committed_offsets: never older than a
    commit acknowledged before the read began, whatever broker holds the queue by then)."""
    async with env.rec.op(process, "oread", topic=EX_TOPIC, queue=queue, address=address) as op:
        a = await request_once(env.session, "GET", f"{address}/v1/offsets/{EX_GROUP}/{EX_TOPIC}/{queue}",
                               token=env.client_token, timeout_s=REQUEST_TIMEOUT_S)
        op.output = {"offset": a.body["offset"]}
    return op.output["offset"]


LateAcks = list[tuple[float, str, list[str]]]   # (when, address, handles): acks a popper owes


async def pop(env: Env, process: str, *, drain: bool = False, late: LateAcks | None = None) -> int:
    """One pop round against one head broker (every head when draining); returns how many messages came. ``late``:
    where to put handles to ack later, (when, address, handles). Draining, a head that refused raises its refusal
    once the round is done (the others' messages acked)."""
    got = 0
    route = await env.route(POP_TOPIC, fresh=drain)
    heads = sorted({q["address"].rstrip("/") for q in route["queues"] if q.get("address")})
    ask: dict[str, Any] = {"group": POP_GROUP, "max": POP_MAX, "invisible_ms": POP_INVISIBLE_MS, "wait_ms": POP_WAIT_MS}
    if drain:
        targets = heads
    elif heads and env.rng.random() < POP_ONE_QUEUE_SHARE:
        # one queue by name: the poppers meet on it (a pop that finds it busy waits for it, broker/pop/service.py)
        q = env.rng.choice([q for q in route["queues"] if q.get("address")])
        targets, ask["queue"] = [q["address"].rstrip("/")], q["queue"]
    else:
        targets = [env.rng.choice(heads)] if heads else []
    refused: StatorError | None = None
    for address in targets:
        try:
            async with env.rec.op(process, "pop", address=address, queue=ask.get("queue")) as op:
                a = await request_once(env.session, "POST", f"{address}/v1/pop/{POP_TOPIC}", token=env.client_token,
                                       json=ask, timeout_s=REQUEST_TIMEOUT_S)
                op.output = {"messages": [{"queue": m["queue"], "offset": m["offset"], "handle": m["handle"],
                                           "attempt": m.get("attempt")} for m in a.body["messages"]]}
        except StatorError as e:
            refused = e
            continue
        messages = op.output["messages"]
        got += len(messages)
        handles, later = [], []
        for m in messages:
            draw = env.rng.random()
            if drain or draw >= UNACKED_SHARE + LATE_ACK_SHARE:
                handles.append(m["handle"])
            elif draw >= UNACKED_SHARE:
                later.append(m["handle"])
        if later and late is not None and len(late) < LATE_ACKS_MAX:
            late.append((env.rec.now() + env.rng.uniform(*LATE_ACK_AFTER_S), address, later))
        else:
            handles += later
        await ack(env, process, address, handles)
    if drain and refused is not None:
        raise refused   # the drain is over only once every head answers with nothing (runner._drain_pops)
    return got


async def ack(env: Env, process: str, address: str, handles: list[str]) -> None:
    """One ack of ``handles`` at ``address``, recorded; a failure is recorded too and otherwise let go."""
    if not handles:
        return
    try:
        async with env.rec.op(process, "ack", address=address, handles=handles) as op:
            a = await request_once(env.session, "POST", f"{address}/v1/ack", token=env.client_token,
                                   json={"group": POP_GROUP, "handles": handles}, timeout_s=REQUEST_TIMEOUT_S)
            op.output = {"results": [{"handle": r["handle"], "ok": r["ok"]} for r in a.body["results"]]}
    except StatorError:
        pass


async def popper(env: Env, process: str) -> None:
    late: LateAcks = []
    while not env.stop.is_set():
        try:
            due = [x for x in late if x[0] <= env.rec.now()]
            for x in due:
                late.remove(x)
                await ack(env, process, x[1], x[2])
            await pop(env, process, late=late)
            await env.pause(PACE_S)
        except StatorError:
            env.forget_route(POP_TOPIC)
            await env.pause(ERROR_PAUSE_S)


# -- sizes: meta commands of every size class --------------------------------------------------------------------
# Each class writes its own topic's config from one process, one write at a time, each with ``expected_version``: an
# in-doubt write can then never take effect after a later acknowledged one (its version no longer matches), so a read
# must name the last acknowledged write or an in-doubt one invoked after it (checker.sized_registers).
# The carrier is PUT /v1/topics/{topic}/config. A config value is at most CONFIG_VALUE_CHARS_MAX characters and a
# topic at most CONFIG_KEYS_MAX keys, so a single value cannot reach 64 KiB, let alone 1 MiB: a write names all 64
# keys, with values (and keys) of astral characters, which the log's envelope (ASCII JSON) stores as two \uXXXX
# escapes, 12 bytes each. That is the largest command the HTTP API lets a client make, ~0.84 MiB (64 x (128 + 1024)
# characters): the "~1 MiB" class is that maximum, and the 64 KiB multiples stop at 13 (14..16 x 64 KiB are out of
# reach of every command the API takes; tests/test_raft_entry_sizes.py sweeps them below the API).
SIZE_CLASSES = ("tiny", "mid", "big")
SIZE_TOPICS = {c: f"chaos-sz-{c}" for c in SIZE_CLASSES}
SIZE_PACE_S = {"tiny": 0.25, "mid": 2.0, "big": 2.0}
# Of the mid and big writes, one every SIZE_APPLY_EVERY_S is meant to take effect (the next one again after a write
# that was not acknowledged); the others carry a stale expected_version on purpose: they travel the whole way (HTTP,
# forwarding, the log, every journal) at full size, are refused in apply, where the version is checked, and must
# never be seen. Why not all: an acknowledged config write keeps its
# result, the topic's whole config, in the image's idempotency table for an hour (meta/state_machine.py _remember),
# so each adds ~0.3 MB to every later snapshot (~90 ms of a writer's CPU per MB, every few seconds on every node):
# one a second would need more than two cores within minutes.
SIZE_APPLY_EVERY_S = {"tiny": 0.0, "mid": 30.0, "big": 30.0}
SIZE_STEP_BYTES = 64 * 1024
SIZE_WINDOW_BYTES = 64                  # the envelope lands this close to a multiple of SIZE_STEP_BYTES
SIZE_MULTIPLES = (2, 13)
SIZED_KEYS = limits.CONFIG_KEYS_MAX
ASTRAL_ESCAPED_BYTES = 12               # one astral character in the envelope: a \uXXXX surrogate pair
FILL_CHAR, PAD_CHAR = "\U0001F4E6", "."
SIZED_KEY_NAMES = tuple(f"k{i:02d}" + "\U0001F511" * (limits.CONFIG_KEY_CHARS_MAX - 3) for i in range(SIZED_KEYS))
VALUE_CHARS_MAX = limits.CONFIG_VALUE_CHARS_MAX
SIZED_TIMEOUT_S = 20.0                  # well past the answer budget, so that a late answer is seen, not cut off
OFFSET_BUDGET = limits.OFFSET_BUDGET_DEFAULT   # the chaos cluster's meta nodes keep the default
_envelope_json = json.JSONEncoder(separators=(",", ":")).encode   # the log's encoding (meta/raft/node.py)


def envelope_bytes(topic: str, config: dict[str, str | None], key: str, expected_version: int | None) -> int:
    """The bytes of the command's envelope as the node proposes it (meta/raft/node.py RaftNode.propose): what
    COMMAND_BYTES_MAX bounds and what the log carries, after the leader's stamp line."""
    cmd: dict[str, Any] = {"type": "SetTopicConfig", "topic": topic, "config": config}
    if expected_version is not None:
        cmd["expected_version"] = expected_version
    return len(_envelope_json({"rid": f"admin:key:{key}", "ts": 0, "budget": OFFSET_BUDGET, "actor": "admin",
                               "cmd": cmd}))


def sized_config(topic: str, tag: str, key: str, version: int | None, target: int | None) -> dict[str, str | None]:
    """A config of SIZED_KEYS keys whose envelope is exactly ``target`` bytes (None: as big as the API allows).
    Every value starts with ``tag``: a read names the write it saw, and a torn one shows two tags. Keys a smaller
    write does not need are removed (None), so after any write the config is exactly that write's values."""
    head = tag + ":"
    room = VALUE_CHARS_MAX - len(head)
    used = SIZED_KEYS
    if target is not None:
        for used in range(1, SIZED_KEYS + 1):
            base = envelope_bytes(topic, _values(head, used, 0, 0, room), key, version)
            # room for the pad (fewer than 12 characters) left in the last value
            if base + ASTRAL_ESCAPED_BYTES * (used * room - ASTRAL_ESCAPED_BYTES) >= target:
                break
        astral, pad = divmod(target - base, ASTRAL_ESCAPED_BYTES)
    else:
        astral, pad = used * room, 0
    config = _values(head, used, astral, pad, room)
    if target is not None and envelope_bytes(topic, config, key, version) != target:
        raise AssertionError(f"sized_config missed its target {target}")   # a bug here, not in the system
    return config


def _values(head: str, used: int, astral: int, pad: int, room: int) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, name in enumerate(SIZED_KEY_NAMES):
        if i >= used:
            out[name] = None
            continue
        n = min(room, astral)
        astral -= n
        out[name] = head + FILL_CHAR * n + (PAD_CHAR * pad if i == used - 1 else "")
    return out


def config_digest(config: dict[str, Any]) -> str:
    """Of the config a write leaves (its non-null values): a read's config must hash the same."""
    kept = {k: v for k, v in config.items() if v is not None}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def config_tag(config: dict[str, Any]) -> str | None:
    """The write a read config comes from: the tag every value starts with (None: empty; ``torn:...``: several)."""
    tags = sorted({v.split(":", 1)[0] for v in config.values() if isinstance(v, str)})
    if not tags:
        return None
    return tags[0] if len(tags) == 1 else "torn:" + ",".join(tags)


def _size_target(env: Env, cls: str) -> int | None:
    if cls != "mid":
        return None
    # In turn, not at random: a run that gets few mid-sized writes through (faults that hold the log) still lands
    # them on as many different multiples as it has writes.
    lo, hi = SIZE_MULTIPLES
    multiple = lo + env.size_turn % (hi - lo + 1)
    env.size_turn += 1
    return multiple * SIZE_STEP_BYTES + env.rng.randint(-SIZE_WINDOW_BYTES, SIZE_WINDOW_BYTES)


def _size_payload(env: Env, cls: str, topic: str, tag: str, key: str, version: int | None
                  ) -> tuple[dict[str, str | None], int]:
    if cls == "tiny":
        config: dict[str, str | None] = {"v": tag}
    else:
        config = sized_config(topic, tag, key, version, _size_target(env, cls))
    return config, envelope_bytes(topic, config, key, version)


async def sized_read(env: Env, process: str, topic: str, url: str | None = None) -> int:
    """A linearizable read of a sized topic, recorded; returns the topic's version."""
    url = url or env.meta()
    async with env.rec.op(process, "sread", topic=topic, node=url) as op:
        a = await request_once(env.session, "GET", f"{url}/v1/topics/{topic}", token=env.client_token,
                               params={"consistency": "linearizable"}, timeout_s=REQUEST_TIMEOUT_S)
        config = a.body["config"]
        op.output = {"value": config_tag(config), "digest": config_digest(config), "version": a.body["version"]}
    return op.output["version"]


async def sized_put(env: Env, process: str, topic: str, config: dict[str, str | None], *, tag: str, key: str,
                    nbytes: int, version: int | None, stale: bool = False, retry_of: str | None = None,
                    timeout_s: float = SIZED_TIMEOUT_S) -> int:
    """One PUT of a sized config, recorded with the time its answer took (``answered_s``, also for an error answer),
    or ``unanswered_s`` when none came before the timeout (not for a reset connection: its node died); the budget
    check reads both. Returns the new version."""
    url = env.meta()
    async with env.rec.op(process, "put", topic=topic, value=tag, digest=config_digest(config), bytes=nbytes,
                          expected_version=version, stale=stale, key=key, node=url, retry_of=retry_of) as op:
        started = env.rec.now()
        try:
            a = await request_once(env.session, "PUT", f"{url}/v1/topics/{topic}/config", token=env.admin_token,
                                   json=config, params={"expected_version": version},
                                   headers={"Idempotency-Key": key}, timeout_s=timeout_s)
        except StatorError as e:
            took = round(env.rec.now() - started, 4)
            if e.status:
                op.output = {"answered_s": took, "status": e.status, "code": e.code}
            elif isinstance(getattr(e, "cause", None), TimeoutError):
                op.output = {"unanswered_s": took}
            raise
        op.output = {"version": a.body["version"], "answered_s": round(env.rec.now() - started, 4)}
    return op.output["version"]


async def sizes(env: Env, process: str, cls: str) -> None:
    topic = SIZE_TOPICS[cls]
    version: int | None = None
    applied_at = -SIZE_APPLY_EVERY_S[cls]
    n = 0
    while not env.stop.is_set():
        try:
            if version is None:
                version = await sized_read(env, process, topic)
            n += 1
            tag, key = f"{process}-{n}", f"chaos-{process}-{n}"
            stale = env.rec.now() - applied_at < SIZE_APPLY_EVERY_S[cls]
            expected = version - 1 if stale else version   # versions only grow: version - 1 is gone for good
            config, nbytes = _size_payload(env, cls, topic, tag, key, expected)
            version = await _put_or_learn(env, process, topic, config, tag, key, nbytes, expected, stale)
            if version is not None and not stale:
                applied_at = env.rec.now()
        except StatorError:
            version = None
            await env.pause(ERROR_PAUSE_S)
        await env.pause(SIZE_PACE_S[cls])


async def _put_or_learn(env: Env, process: str, topic: str, config: dict[str, str | None], tag: str, key: str,
                        nbytes: int, version: int | None, stale: bool) -> int | None:
    """The write; after an unknown outcome, once more with the same Idempotency-Key (its own recorded attempt):
    the key's first outcome answers it, so fewer writes stay in doubt and idempotency is exercised at every size.
    Returns the new version, or None when the next write must read it first (after any refusal: a read then checks
    that the refused write left nothing behind)."""
    try:
        return await sized_put(env, process, topic, config, tag=tag, key=key, nbytes=nbytes, version=version,
                               stale=stale)
    except StatorError as e:
        if outcome_of(e) != UNKNOWN:
            return None
    await env.pause(ERROR_PAUSE_S)
    try:
        return await sized_put(env, process, topic, config, tag=tag, key=key, nbytes=nbytes, version=version,
                               stale=stale, retry_of=key)
    except StatorError:
        return None
