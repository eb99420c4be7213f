"""`stator chaos run`: start the proxied cluster, run the workloads while the nemesis works, heal, read everything
back, check the history, print the summary. Everything started is stopped at the end, on Ctrl-C or an exception too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from client.admin import AdminClient
from client.errors import StatorError
from client.http import new_session, request_once
from ops import devcluster

from . import checker, nemesis, topology, workloads
from .history import Recorder
from .workloads import CAS_KEY, CAS_TOPIC, EX_GROUP, EX_TOPIC, LOG_TOPIC, POP_GROUP, POP_TOPIC, Env

T = TypeVar("T")

READY_TIMEOUT_S = 90.0          # the cluster's start, and its recovery after the last heal
STOP_GRACE_S = 15.0             # workloads finish their request in flight (each bounded by its own timeout)
FINAL_DEADLINE_S = 60.0         # the read-back of one topic, retrying while routes settle after the heal
DRAIN_DEADLINE_S = 90.0         # the pop drain; quiet for DRAIN_QUIET_S means drained
DRAIN_QUIET_S = workloads.POP_INVISIBLE_MS / 1000 * 2
RETRY_PAUSE_S = 0.5
SETUP_DEADLINE_S = 60.0
WORKLOADS = {"cas": 2, "send": 1, "exclusive": 2, "pop": 2}


class RunFailed(RuntimeError):
    """The runner could not do its work (a member did not start, a read-back never succeeded): no verdict."""


def run(seed: int, duration_s: float, kinds: tuple[str, ...], dir_: str | None = None,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run once; return the summary (``violations`` empty when every check held). The cluster's directory is kept
    when something was found, acked pops delivered again included (its logs and history.json, with the faults and
    their times, are the evidence), or when ``dir_`` was given."""
    keep = dir_ is not None
    dir_ = os.path.abspath(dir_ or tempfile.mkdtemp(prefix=f"stator-chaos-{seed}-"))
    started = time.monotonic()
    t = topology.plan(dir_, topology.free_span())
    faults = nemesis.schedule(seed, duration_s, kinds, (t.meta_names, t.broker_names))
    say(f"chaos: {len(faults)} faults scheduled over {duration_s:g} s ({','.join(kinds)}), cluster in {dir_}")
    try:
        summary = asyncio.run(_session(t, seed, duration_s, faults, say))
    finally:
        _stop_everything(t)
    summary.update(seed=seed, duration_s=duration_s, faults=list(kinds), dir=dir_,
                   wall_s=round(time.monotonic() - started, 1))
    found = summary["violations"] or summary["nemesis_errors"] or summary["checks"].get("redelivered_after_ack")
    if not found and not keep:
        shutil.rmtree(dir_, ignore_errors=True)
        summary["dir"] = None
    return summary


def _stop_everything(t: topology.Topology) -> None:
    with contextlib.suppress(FileNotFoundError):
        cluster = devcluster.load(t.dir)
        for m in cluster["meta"] + cluster["brokers"]:   # a paused process would not see SIGTERM
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(m["pid"], signal.SIGCONT)
        devcluster.down(t.dir)


async def _session(t: topology.Topology, seed: int, duration_s: float, faults: list[nemesis.Fault],
                   say: Callable[[str], None]) -> dict[str, Any]:
    for link in t.links.values():
        await link.start()
    try:
        await asyncio.wait_for(asyncio.to_thread(devcluster.restart_all, t.dir, READY_TIMEOUT_S),
                               READY_TIMEOUT_S * 2)
        cluster = devcluster.load(t.dir)
        tokens = {r: cluster[f"{r}_token"] for r in ("admin", "client")}
        meta_urls = [m["url"] for m in cluster["meta"]]
        rec = Recorder()
        async with new_session() as session:
            env = Env(session, meta_urls, tokens, rec, seed)
            initial = await _setup(env)
            return await _exercise(t, env, faults, duration_s, initial, say)
    finally:
        for link in t.links.values():
            await link.stop()


async def _setup(env: Env) -> str:
    async with AdminClient(env.meta_urls, env.admin_token, session=env.session,
                           deadline_s=SETUP_DEADLINE_S) as admin:
        for topic in (CAS_TOPIC, LOG_TOPIC, EX_TOPIC, POP_TOPIC):
            await admin.create_topic(topic, workloads.QUEUES)
        await admin.set_config(CAS_TOPIC, {CAS_KEY: "init"})
        await admin.set_group_config(EX_GROUP, {"mode": "exclusive", "lease_ms": workloads.EX_LEASE_MS,
                                                "heartbeat_interval_ms": workloads.EX_HEARTBEAT_MS})
    return "init"


async def _exercise(t: topology.Topology, env: Env, faults: list[nemesis.Fault], duration_s: float, initial: str,
                    say: Callable[[str], None]) -> dict[str, Any]:
    start = env.rec.now()
    nem = nemesis.Nemesis(t, faults, lambda: env.rec.now() - start)
    tasks = [asyncio.create_task(workloads.cas(env, f"cas-{i}")) for i in range(WORKLOADS["cas"])]
    tasks += [asyncio.create_task(workloads.send(env, f"send-{topic}", topic))
              for topic in (LOG_TOPIC, EX_TOPIC, POP_TOPIC) for _ in range(WORKLOADS["send"])]
    tasks += [asyncio.create_task(workloads.exclusive(env, f"ex-{i}")) for i in range(WORKLOADS["exclusive"])]
    tasks += [asyncio.create_task(workloads.popper(env, f"pop-{i}")) for i in range(WORKLOADS["pop"])]
    try:
        await asyncio.wait_for(nem.run(), duration_s + nemesis.STOP_WAIT_S * 2 * max(1, len(faults)))
        await asyncio.sleep(max(0.0, duration_s - (env.rec.now() - start)))
    finally:
        env.stop.set()
        _, pending = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await nem.heal_all()
    for task in tasks:   # a workload that died of anything but an API error is a bug in the runner: no verdict
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    say(f"chaos: {len(nem.applied)} faults injected; healing and reading everything back")
    violations: list[dict[str, Any]] = []
    try:
        await asyncio.wait_for(asyncio.to_thread(devcluster.wait_ready, _member_urls(t), READY_TIMEOUT_S),
                               READY_TIMEOUT_S + 10)
    except (TimeoutError, asyncio.TimeoutError) as e:
        violations.append(checker.violation("recovery", f"the cluster did not recover after every heal: {e}"))
    final = {}
    for topic in (LOG_TOPIC, EX_TOPIC, POP_TOPIC):
        final.update(await _read_topic(env, topic))
    await _drain_pops(env)
    dead = await _dead_lettered(env, t)
    ops = env.rec.ops
    register, register_stats = checker.cas_register(ops, initial)
    pops, pop_stats = checker.pops_acked_or_redelivered(ops, dead, POP_TOPIC)
    violations += register + checker.monotonic_versions(ops) + checker.no_lost_sends(ops, final)
    violations += checker.exclusive_commits(ops) + pops
    with open(os.path.join(t.dir, "history.json"), "w") as f:
        json.dump({"faults": nem.applied, "ops": [o.to_json() for o in ops]}, f)
    outcomes = Counter((o.kind, o.outcome) for o in ops)
    return {"faults_injected": len(nem.applied), "operations_checked": checker.count_checked(ops),
            "operations": {f"{k}:{o}": n for (k, o), n in sorted(outcomes.items())},
            "checks": {**register_stats, **pop_stats, "messages_read_back": sum(len(v) for v in final.values())},
            "violations": violations, "nemesis_errors": nem.errors,
            "fault_kinds_injected": dict(Counter(f["kind"] for f in nem.applied))}


def _member_urls(t: topology.Topology) -> list[str]:
    cluster = devcluster.load(t.dir)
    return [m["url"] for m in cluster["meta"] + cluster["brokers"]]


async def _retrying(what: str, fn: Callable[[], Awaitable[T]], deadline_s: float) -> T:
    """The read-back's one retry loop: right after the heal, routes and leaders may still be moving."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await fn()
        except StatorError as e:
            if time.monotonic() + RETRY_PAUSE_S > deadline:
                raise RunFailed(f"{what}: no success within {deadline_s:g} s, last: {e}") from e
            await asyncio.sleep(RETRY_PAUSE_S)


async def _read_topic(env: Env, topic: str) -> dict[tuple[str, int], dict[int, str]]:
    """Every message of every queue, from the broker holding each queue's head (it serves the whole history)."""
    out: dict[tuple[str, int], dict[int, str]] = {}
    for queue in range(workloads.QUEUES):
        async def read_queue() -> dict[int, str]:
            route = await env.route(topic, fresh=True)
            address = workloads.queue_address(route, queue)
            if address is None:
                raise StatorError(503, "NO_ROUTE", f"{topic}/{queue} has no address yet")
            got: dict[int, str] = {}
            offset = 0
            while True:
                a = await request_once(env.session, "GET", f"{address}/v1/messages/{topic}/{queue}",
                                       token=env.client_token, params={"offset": offset, "max": 1000},
                                       timeout_s=workloads.REQUEST_TIMEOUT_S)
                for m in a.body["messages"]:
                    got[m["offset"]] = m.get("body")
                if a.body["next_offset"] >= a.body["max_offset"] or a.body["next_offset"] <= offset:
                    return got
                offset = a.body["next_offset"]
        out[(topic, queue)] = await _retrying(f"reading back {topic}/{queue}", read_queue, FINAL_DEADLINE_S)
    return out


async def _drain_pops(env: Env) -> None:
    """Pop (and ack) until nothing has come for DRAIN_QUIET_S: every message left unacked is back by then."""
    deadline = time.monotonic() + DRAIN_DEADLINE_S
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < DRAIN_QUIET_S:
        if time.monotonic() > deadline:
            raise RunFailed(f"the pop drain still got messages after {DRAIN_DEADLINE_S:g} s")
        try:
            if await workloads.pop(env, "drain", drain=True):
                quiet_since = time.monotonic()
        except StatorError:
            env.forget_route(POP_TOPIC)
            await asyncio.sleep(RETRY_PAUSE_S)


async def _dead_lettered(env: Env, t: topology.Topology) -> set[tuple[str, int, int]]:
    out: set[tuple[str, int, int]] = set()
    for b in range(topology.BROKERS):
        async def read_dlq() -> set[tuple[str, int, int]]:
            found: set[tuple[str, int, int]] = set()
            offset = 0
            while True:
                a = await request_once(env.session, "GET", f"{t.broker_url(b)}/v1/dlq/{POP_GROUP}",
                                       token=env.client_token, params={"offset": offset, "max": 1000},
                                       timeout_s=workloads.REQUEST_TIMEOUT_S)
                found |= {(m["topic"], m["queue"], m["origin_offset"]) for m in a.body["messages"]}
                if not a.body["messages"] or a.body["next_offset"] <= offset:
                    return found
                offset = a.body["next_offset"]
        out |= await _retrying(f"reading the dead-letter queue of b{b + 1}", read_dlq, FINAL_DEADLINE_S)
    return out
