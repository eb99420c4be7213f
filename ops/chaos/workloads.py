"""The client workloads, each a loop of single-attempt HTTP calls recorded in the history (history.Recorder).

Single attempts on purpose: the client library's retry loops would hide what happened to each request, and the
checks need every request's own outcome. Each loop runs until ``stop`` is set; every request has a timeout.
- ``cas``: linearizable read of topic CAS_TOPIC, then a compare-and-set of its config key with ``expected_version``;
  every few rounds a read from any node with ``min_version`` (the versions a client sees must never go back).
- ``send``: one message per request to a random queue of a topic, at the address its route names.
- ``exclusive``: a member of an exclusive group: heartbeats to meta for its queues and tokens, pulls with the token,
  commits with the token. It keeps using a token until a heartbeat answer takes the queue away, even through a
  partition from meta or a silence of its own (EX_SILENT_S): the broker's fencing, not the client's caution, must
  keep two owners from committing.
- ``pop``: pops from the brokers holding the topic's heads, acks most messages, leaves some unacked to come back.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp

from client.errors import StatorError
from client.http import request_once

from .history import Recorder

CAS_TOPIC, LOG_TOPIC, EX_TOPIC, POP_TOPIC = "chaos-cas", "chaos-log", "chaos-ex", "chaos-pop"
CAS_KEY = "v"
EX_GROUP, POP_GROUP = "chaos-ex", "chaos-pop"
QUEUES = 3
REQUEST_TIMEOUT_S = 6.0      # above meta's proposal wait, so a slow commit is an answer rather than unknown
PACE_S = 0.05                # between two requests of one loop: enough load, without starving the cluster's CPU
ERROR_PAUSE_S = 0.3          # after a failed request: the route or the leader is moving
ROUTE_REFRESH_S = 2.0
READ_MV_EVERY = 3
POP_INVISIBLE_MS = 2000
POP_WAIT_MS = 300
POP_MAX = 8
UNACKED_SHARE = 0.15         # pops deliberately left unacked: they must come back
EX_LEASE_MS = 3000
EX_HEARTBEAT_MS = 500
# A member goes silent (no heartbeats) for longer than its lease now and then, yet keeps pulling and committing with
# the tokens it holds, like a client in a long GC pause: meta gives its queues to the other member, and the broker
# must refuse the silent one's commits (409 STALE_TOKEN).
EX_SILENT_S = EX_LEASE_MS / 1000 + 3.0
EX_SILENT_EVERY_S = (10.0, 25.0)
EX_FIRST_SILENCE_S = (5.0, 10.0)
PULL_MAX = 50


class Env:
    """What every workload shares: the session, tokens, meta URLs, the recorder, the stop flag and routes."""

    def __init__(self, session: aiohttp.ClientSession, meta_urls: list[str], tokens: dict[str, str],
                 recorder: Recorder, seed: int):
        self.session = session
        self.meta_urls = meta_urls
        self.client_token = tokens["client"]
        self.admin_token = tokens["admin"]
        self.rec = recorder
        self.stop = asyncio.Event()
        self.rng = random.Random(seed)
        self._routes: dict[str, tuple[float, dict[str, Any]]] = {}

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


async def send(env: Env, process: str, topic: str) -> None:
    n = 0
    while not env.stop.is_set():
        n += 1
        queue = env.rng.randrange(QUEUES)
        body = f"{process}-{n}"
        try:
            address = queue_address(await env.route(topic), queue)
            if address is None:
                await env.pause(ERROR_PAUSE_S)
                continue
            async with env.rec.op(process, "send", topic=topic, queue=queue, body=body, address=address) as op:
                a = await request_once(env.session, "POST", f"{address}/v1/messages/{topic}/{queue}",
                                       token=env.client_token, json={"messages": [{"body": body}]},
                                       timeout_s=REQUEST_TIMEOUT_S)
                op.output = {"queue": a.body["queue"], "offset": a.body["offsets"][0]}
            await env.pause(PACE_S)
        except StatorError:
            env.forget_route(topic)
            await env.pause(ERROR_PAUSE_S)


async def exclusive(env: Env, process: str) -> None:
    held: dict[int, int] = {}          # queue -> token
    positions: dict[int, int] = {}     # queue -> next offset to read
    next_heartbeat = 0.0
    started = env.rec.now()
    silent_from = started + env.rng.uniform(*EX_FIRST_SILENCE_S)
    while not env.stop.is_set():
        now = env.rec.now()
        if now >= silent_from + EX_SILENT_S:
            silent_from = now + env.rng.uniform(*EX_SILENT_EVERY_S)
        silent = silent_from <= now
        if not silent and now >= next_heartbeat:
            next_heartbeat = env.rec.now() + EX_HEARTBEAT_MS / 1000
            try:
                async with env.rec.op(process, "heartbeat") as op:
                    a = await request_once(env.session, "POST", f"{env.meta()}/v1/groups/{EX_GROUP}/heartbeat",
                                           token=env.client_token, timeout_s=REQUEST_TIMEOUT_S,
                                           json={"member": process, "topics": [EX_TOPIC], "mode": "exclusive"})
                    op.output = {"assignments": [[x["queue"], x["token"]] for x in a.body["assignments"]]}
                now_held = {q: t for q, t in op.output["assignments"]}
                for q in list(held):
                    if q not in now_held or now_held[q] != held[q]:
                        positions.pop(q, None)
                held = now_held
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
        a = await request_once(env.session, "GET", base, token=env.client_token, timeout_s=REQUEST_TIMEOUT_S)
        positions[queue] = max(0, a.body["offset"])
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


async def pop(env: Env, process: str, *, drain: bool = False) -> int:
    """One pop round against one head broker (every head when draining); returns how many messages came."""
    got = 0
    route = await env.route(POP_TOPIC, fresh=drain)
    heads = sorted({q["address"].rstrip("/") for q in route["queues"] if q.get("address")})
    for address in (heads if drain else [env.rng.choice(heads)] if heads else []):
        try:
            async with env.rec.op(process, "pop", address=address) as op:
                a = await request_once(env.session, "POST", f"{address}/v1/pop/{POP_TOPIC}", token=env.client_token,
                                       json={"group": POP_GROUP, "max": POP_MAX, "invisible_ms": POP_INVISIBLE_MS,
                                             "wait_ms": POP_WAIT_MS},
                                       timeout_s=REQUEST_TIMEOUT_S)
                op.output = {"messages": [{"queue": m["queue"], "offset": m["offset"], "handle": m["handle"],
                                           "attempt": m.get("attempt")} for m in a.body["messages"]]}
        except StatorError:
            continue
        messages = op.output["messages"]
        got += len(messages)
        handles = [m["handle"] for m in messages if drain or env.rng.random() >= UNACKED_SHARE]
        if not handles:
            continue
        try:
            async with env.rec.op(process, "ack", address=address, handles=handles) as op:
                a = await request_once(env.session, "POST", f"{address}/v1/ack", token=env.client_token,
                                       json={"group": POP_GROUP, "handles": handles}, timeout_s=REQUEST_TIMEOUT_S)
                op.output = {"results": [{"handle": r["handle"], "ok": r["ok"]} for r in a.body["results"]]}
        except StatorError:
            pass
    return got


async def popper(env: Env, process: str) -> None:
    while not env.stop.is_set():
        try:
            await pop(env, process)
            await env.pause(PACE_S)
        except StatorError:
            env.forget_route(POP_TOPIC)
            await env.pause(ERROR_PAUSE_S)
