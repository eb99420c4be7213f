"""What an operator does while the clients run, as workloads of their own, each recorded in the history:

- ``remapper``: moves one queue of a data topic to another broker every REMAP_PACE_S, back and forth among the
  brokers (often straight back to the broker it left: REMAP_BACK_SHARE), while sends, exclusive commits and pops go
  on (each remap seals the queue's head and opens a segment on the target: offsets must stay contiguous, commits
  must follow the queue, pops must leave no gap). A remap of the log topic meets REMAP_BURST_SENDERS senders sending to its queue back to back, so the seal finds sends in flight.
- ``grower``: grows every data topic by one queue at GROW_AT of the run (a static topic only grows; the exclusive
  group gets barriers, meta/chains.py).
- ``lease_changer``: sets the exclusive group's lease to the other end of LEASES_MS every LEASE_PACE_S while members hold
  queues: a member keeps the lease it was promised until an answer carries the new one.

Single attempts, as the clients' workloads: a refusal (a broker fenced, another remap of the queue in flight) is
recorded and the next round tries again; the lease changer, whose rounds are few, tries the same change again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from wire.errors import StatorError
from wire.caller import request_once

from .workloads import (ERROR_PAUSE_S, EX_GROUP, EX_HEARTBEAT_MS, EX_LEASE_MAX_MS, EX_TOPIC, LOG_TOPIC, POP_TOPIC,
                        REQUEST_TIMEOUT_S, Env, send_once)

DATA_TOPICS = (LOG_TOPIC, EX_TOPIC, POP_TOPIC)
REMAP_PACE_S = (1.5, 4.0)
# Remaps that move the last queue moved back to the broker it left (an operator undoing a move): its old head holds
# the queue's state as of when it left, older than the newer head's (committed offsets, pop state), and must not
# read it as current. A random pick of queue and broker came back to a broker seldom in a short run.
REMAP_BACK_SHARE = 0.5
REMAP_BURST_SENDERS = 4         # remaps of the log topic meet this many senders sending to the queue back to back ...
REMAP_BURST_AFTER_S = 1.0       # ... until this long after the remap was answered (the old head's seal follows it)
BURST_ERROR_PAUSE_S = 0.05      # a burst sender refused (the queue is moving): the route is read again after this
GROW_AT = (0.3, 0.6)            # fractions of the run's duration
# Every one longer than two heartbeats (EX_HEARTBEAT_MS). The changer goes from one end to the other, so every other
# change shortens the lease by more than checker.LEASE_MARGIN_MS: a member promised the longer lease keeps it
# (checker.leases_never_overlap), which a random pick of three values tested only now and then.
LEASES_MS = (2000, 4000)
LEASE_PACE_S = (6.0, 12.0)
WRITE_TIMEOUT_S = REQUEST_TIMEOUT_S
assert min(LEASES_MS) > 2 * EX_HEARTBEAT_MS and max(LEASES_MS) <= EX_LEASE_MAX_MS


async def remapper(env: Env, process: str, brokers: list[str]) -> None:
    moved: tuple[str, int, str] | None = None   # the last queue moved: (topic, queue, the broker it left)
    while not env.stop.is_set():
        await env.pause(env.rng.uniform(*REMAP_PACE_S))
        if env.stop.is_set():
            return
        back = moved is not None and env.rng.random() < REMAP_BACK_SHARE
        topic = moved[0] if back and moved is not None else env.rng.choice(DATA_TOPICS)
        try:
            route = await env.route(topic, fresh=True)
            queues = [q for q in route.get("queues", []) if q.get("broker")]
            if back and moved is not None:
                queues = [q for q in queues if q["queue"] == moved[1] and q["broker"] != moved[2]]
            if not queues:
                continue
            q = env.rng.choice(queues)
            if back and moved is not None:
                target = moved[2]
            else:
                target = env.rng.choice([b for b in brokers if b != q["broker"]])
            remapped = asyncio.Event()
            bursts = [asyncio.create_task(_burst(env, topic, q["queue"], f"burst-{i}", remapped))
                      for i in range(REMAP_BURST_SENDERS if topic == LOG_TOPIC else 0)]
            try:
                async with env.rec.op(process, "remap", topic=topic, queue=q["queue"], src=q["broker"],
                                      to=target) as op:
                    a = await request_once(env.session, "POST", f"{env.meta()}/v1/topics/{topic}/remap",
                                           token=env.admin_token, json={"brokers": [target], "queues": [q["queue"]]},
                                           timeout_s=WRITE_TIMEOUT_S)
                    op.output = {"version": a.body["version"], "moved": a.body["moved"]}
                env.forget_route(topic)
                moved = (topic, q["queue"], q["broker"])
            finally:
                remapped.set()
                await asyncio.gather(*bursts)
        except StatorError:
            await env.pause(ERROR_PAUSE_S)


async def _burst(env: Env, topic: str, queue: int, process: str, remapped: asyncio.Event) -> None:
    """Batches back to back to the queue being remapped, until REMAP_BURST_AFTER_S after the remap's answer: sends
    still being synced when the old head's seal reads its end (two a second per queue seldom met one)."""
    await asyncio.sleep(env.rng.uniform(0.0, 0.05))
    until: float | None = None
    n = 0
    while not env.stop.is_set():
        if remapped.is_set():
            until = until if until is not None else env.rec.now() + REMAP_BURST_AFTER_S
            if env.rec.now() >= until:
                return
        n += 1
        try:
            if not await send_once(env, process, topic, queue, f"{process}-{env.rec.now():.3f}-{n}"):
                await env.pause(BURST_ERROR_PAUSE_S)
        except StatorError:
            env.forget_route(topic)
            await env.pause(BURST_ERROR_PAUSE_S)


async def grower(env: Env, process: str, duration_s: float) -> None:
    for at in GROW_AT:
        await env.pause(max(0.0, at * duration_s - env.rec.now()))
        for topic in DATA_TOPICS:
            while not env.stop.is_set():
                if await _grow_once(env, process, topic):
                    break
                await env.pause(ERROR_PAUSE_S)


async def _grow_once(env: Env, process: str, topic: str) -> bool:
    """One more queue than the topic has now (read first: an earlier attempt of unknown outcome may have grown it)."""
    try:
        a = await request_once(env.session, "GET", f"{env.meta()}/v1/topics/{topic}", token=env.client_token,
                               params={"consistency": "linearizable"}, timeout_s=REQUEST_TIMEOUT_S)
        queues = a.body["queues"]
        async with env.rec.op(process, "grow", topic=topic, queues=queues + 1) as op:
            g = await request_once(env.session, "PATCH", f"{env.meta()}/v1/topics/{topic}", token=env.admin_token,
                                   json={"queues": queues + 1}, timeout_s=WRITE_TIMEOUT_S)
            op.output = {"version": g.body["version"], "queues": g.body["queues"]}
        env.forget_route(topic)
        return True
    except StatorError:
        return False


async def lease_changer(env: Env, process: str) -> None:
    turn = len(LEASES_MS) - 1   # the first change lengthens the group's lease (workloads.EX_LEASE_MS)
    while not env.stop.is_set():
        await env.pause(env.rng.uniform(*LEASE_PACE_S))
        if env.stop.is_set():
            return
        lease = LEASES_MS[turn % len(LEASES_MS)]
        turn += 1
        config: dict[str, Any] = {"lease_ms": lease}
        # The same change again after ERROR_PAUSE_S until one goes through: only a few rounds fit in a run, and a
        # run whose faults refused every one (tests/test_chaos.py, seed 884, once in the suite) changed no lease at all
        while not env.stop.is_set():
            try:
                async with env.rec.op(process, "lease", group=EX_GROUP, lease_ms=lease) as op:
                    a = await request_once(env.session, "PUT", f"{env.meta()}/v1/groups/{EX_GROUP}/config",
                                           token=env.admin_token, json=config, timeout_s=WRITE_TIMEOUT_S)
                    op.output = {"version": a.body["version"]}
                break
            except StatorError:
                await env.pause(ERROR_PAUSE_S)
