"""What an operator does while the clients run, as workloads of their own, each recorded in the history:

- ``remapper``: moves one queue of a data topic to another broker every REMAP_PACE_S, back and forth among the
  brokers, while sends, exclusive commits and pops go on (each remap seals the queue's head and opens a segment on
  the target: offsets must stay contiguous, commits must follow the queue, pops must leave no gap).
- ``grower``: grows every data topic by one queue at GROW_AT of the run (a static topic only grows; the exclusive
  group gets barriers, meta/chains.py).
- ``lease_changer``: sets the exclusive group's lease to another of LEASES_MS every LEASE_PACE_S while members hold
  queues: a member keeps the lease it was promised until an answer carries the new one.

Single attempts, as the clients' workloads: a refusal (a broker fenced, another remap of the queue in flight) is
recorded and the next round tries again; the lease changer, whose rounds are few, tries the same change again.
"""

from __future__ import annotations

from typing import Any

from wire.errors import StatorError
from wire.caller import request_once

from .workloads import (ERROR_PAUSE_S, EX_GROUP, EX_HEARTBEAT_MS, EX_LEASE_MAX_MS, EX_TOPIC, LOG_TOPIC, POP_TOPIC,
                        REQUEST_TIMEOUT_S, Env)

DATA_TOPICS = (LOG_TOPIC, EX_TOPIC, POP_TOPIC)
REMAP_PACE_S = (1.5, 4.0)
GROW_AT = (0.3, 0.6)            # fractions of the run's duration
LEASES_MS = (2000, 3000, 4000)  # every one longer than two heartbeats (EX_HEARTBEAT_MS)
LEASE_PACE_S = (6.0, 12.0)
WRITE_TIMEOUT_S = REQUEST_TIMEOUT_S
assert min(LEASES_MS) > 2 * EX_HEARTBEAT_MS and max(LEASES_MS) <= EX_LEASE_MAX_MS


async def remapper(env: Env, process: str, brokers: list[str]) -> None:
    while not env.stop.is_set():
        await env.pause(env.rng.uniform(*REMAP_PACE_S))
        if env.stop.is_set():
            return
        topic = env.rng.choice(DATA_TOPICS)
        try:
            route = await env.route(topic, fresh=True)
            queues = [q for q in route.get("queues", []) if q.get("broker")]
            if not queues:
                continue
            q = env.rng.choice(queues)
            target = env.rng.choice([b for b in brokers if b != q["broker"]])
            async with env.rec.op(process, "remap", topic=topic, queue=q["queue"], src=q["broker"],
                                  to=target) as op:
                a = await request_once(env.session, "POST", f"{env.meta()}/v1/topics/{topic}/remap",
                                       token=env.admin_token, json={"brokers": [target], "queues": [q["queue"]]},
                                       timeout_s=WRITE_TIMEOUT_S)
                op.output = {"version": a.body["version"], "moved": a.body["moved"]}
            env.forget_route(topic)
        except StatorError:
            await env.pause(ERROR_PAUSE_S)


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
    while not env.stop.is_set():
        await env.pause(env.rng.uniform(*LEASE_PACE_S))
        if env.stop.is_set():
            return
        lease = env.rng.choice(LEASES_MS)
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
