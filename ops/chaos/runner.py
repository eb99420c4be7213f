"""`stator chaos run`: start the proxied cluster, run the workloads while the nemesis works, heal, read everything
back, check the history, print the summary. Everything started is stopped at the end, on Ctrl-C or an exception too.

After the heal, besides reading every topic back: a small write must commit within POST_RUN_WRITE_S (a command of
an unlucky size once stopped every later write), and the three meta replicas must hold the same image bytes at the
same version. Snapshot installs and compactions are counted from the meta nodes' logs (``raft_snapshot_installed``,
``raft_snapshot_written``): no metric reports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from client.admin import AdminClient, new_idempotency_key
from wire.errors import StatorError
from wire.caller import new_session, request_once
from meta import limits
from ops import devcluster

from . import bodies, checker, nemesis, operators, topology, workloads
from .history import Recorder
from .workloads import CAS_KEY, CAS_TOPIC, EX_GROUP, EX_TOPIC, LOG_TOPIC, POP_GROUP, POP_TOPIC, SIZE_TOPICS, Env

T = TypeVar("T")

READY_TIMEOUT_S = 90.0          # the cluster's start, and its recovery after the last heal
STOP_GRACE_S = 15.0             # workloads finish their request in flight (each bounded by its own timeout)
FINAL_DEADLINE_S = 60.0         # the read-back of one topic, retrying while routes settle after the heal
DRAIN_DEADLINE_S = 90.0         # the pop drain; quiet for DRAIN_QUIET_S means drained
DRAIN_QUIET_S = workloads.POP_INVISIBLE_MS / 1000 * 2
RETRY_PAUSE_S = 0.5
SETUP_DEADLINE_S = 60.0
WORKLOADS = {"cas": 2, "send": 2, "ksend": 2, "exclusive": 2, "pop": 3, "sizes": 1}
# A write's answer comes within the meta service's own deadline (its forwarding and proposal retries end there), plus
# reading and parsing a body of up to ~0.9 MB on a loaded machine; a paused node's stop is not counted against it.
ANSWER_BUDGET_S = limits.PROPOSE_TIMEOUT_S + 3.0
POST_RUN_WRITE_S = 10.0         # the small write after the heal (a healthy cluster takes milliseconds)
REPLICAS_DEADLINE_S = 60.0      # until the three images are compared at one version
DIGEST_WAIT_S = 5.0
SNAPSHOT_EVENTS = {"raft_snapshot_installed": "installed", "raft_snapshot_written": "written"}
DATA_TOPICS = (LOG_TOPIC, EX_TOPIC, POP_TOPIC)
KEYED_PROCESS = "ksend-"   # the keyed producers' names: their library retries (checker.queues_contiguous)
INSTALL_AFTER_HEAL_S = 30.0     # an install fault's follower installing a snapshot this soon after it counts for it


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
        stop_cluster(t.dir)
    summary.update(seed=seed, duration_s=duration_s, faults=list(kinds), dir=dir_,
                   wall_s=round(time.monotonic() - started, 1))
    found = summary["violations"] or summary["nemesis_errors"]
    if not found and not keep:
        shutil.rmtree(dir_, ignore_errors=True)
        summary["dir"] = None
    else:   # beside history.json: the violations' evidence, for a run whose caller kept only the directory
        with open(os.path.join(dir_, "summary.json"), "w") as f:
            json.dump(summary, f)
    return summary


def stop_cluster(dir_: str) -> None:
    """Stop every member of the chaos cluster in ``dir_``, paused ones included. Also for a caller whose runner
    process was killed (a test's timeout): its members outlive it otherwise."""
    with contextlib.suppress(FileNotFoundError):
        cluster = devcluster.load(dir_)
        for m in cluster["meta"] + cluster["brokers"]:   # a paused process would not see SIGTERM
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(m["pid"], signal.SIGCONT)
        devcluster.down(dir_)


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
            env = Env(session, meta_urls, tokens, rec, seed, direct=t.direct_urls())
            initial = await _setup(env)
            return await _exercise(t, env, faults, duration_s, initial, say)
    finally:
        for link in t.links.values():
            await link.stop()


async def _setup(env: Env) -> str:
    async with AdminClient(env.meta_urls, env.admin_token, session=env.session,
                           deadline_s=SETUP_DEADLINE_S) as admin:
        await admin.create_topic(CAS_TOPIC, workloads.QUEUES)
        for topic in DATA_TOPICS:
            # the copies named explicitly (the client's create_topic names none): a data topic with fewer copies
            # than three would not be what the broker faults are about
            body = {"topic": topic, "queues": workloads.QUEUES, "replicas": workloads.DATA_REPLICAS,
                    "min_insync": workloads.DATA_MIN_INSYNC}
            await admin.meta.call("POST", "/v1/topics", json=body, headers={"Idempotency-Key": new_idempotency_key()})
            route = await _retrying(f"the route of {topic}", lambda: env.route(topic, fresh=True), SETUP_DEADLINE_S)
            if (route.get("replicas"), route.get("min_insync")) != (workloads.DATA_REPLICAS, workloads.DATA_MIN_INSYNC):
                raise RunFailed(f"{topic} was created with replicas {route.get('replicas')} and min_insync "
                                f"{route.get('min_insync')}, not {workloads.DATA_REPLICAS} and "
                                f"{workloads.DATA_MIN_INSYNC}")
        for topic in SIZE_TOPICS.values():
            await admin.create_topic(topic, 1)
        await admin.set_config(CAS_TOPIC, {CAS_KEY: "init"})
        await admin.set_group_config(EX_GROUP, {"mode": "exclusive", "lease_ms": workloads.EX_LEASE_MS,
                                                "heartbeat_interval_ms": workloads.EX_HEARTBEAT_MS})
    return "init"


async def _exercise(t: topology.Topology, env: Env, faults: list[nemesis.Fault], duration_s: float, initial: str,
                    say: Callable[[str], None]) -> dict[str, Any]:
    start = env.rec.now()
    nem = nemesis.Nemesis(t, faults, lambda: env.rec.now() - start)
    turns = workloads.SilenceTurns(env.rec.now())
    tasks = [asyncio.create_task(workloads.cas(env, f"cas-{i}")) for i in range(WORKLOADS["cas"])]
    tasks += [asyncio.create_task(workloads.send(env, f"send-{topic}-{i}", topic))
              for topic in DATA_TOPICS for i in range(WORKLOADS["send"])]
    tasks += [asyncio.create_task(workloads.keyed_send(env, f"{KEYED_PROCESS}{i}", LOG_TOPIC))
              for i in range(WORKLOADS["ksend"])]
    tasks += [asyncio.create_task(workloads.exclusive(env, f"ex-{i}", turns)) for i in range(WORKLOADS["exclusive"])]
    tasks += [asyncio.create_task(workloads.popper(env, f"pop-{i}")) for i in range(WORKLOADS["pop"])]
    tasks += [asyncio.create_task(workloads.sizes(env, f"sz-{cls}-{i}", cls))
              for cls in workloads.SIZE_CLASSES for i in range(WORKLOADS["sizes"])]
    tasks += [asyncio.create_task(operators.remapper(env, "remapper", t.broker_names)),
              asyncio.create_task(operators.grower(env, "grower", duration_s)),
              asyncio.create_task(operators.lease_changer(env, "leases"))]
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
    return await _verdict(t, env, nem, initial, start)


async def _verdict(t: topology.Topology, env: Env, nem: nemesis.Nemesis, initial: str, start: float
                   ) -> dict[str, Any]:
    """After the last heal: wait for the cluster, read everything back, check the history; the summary."""
    violations = await _recovered(t)
    post_run_write_s = await _post_run_write(env)
    if post_run_write_s is None:
        violations.append(checker.violation("post_run_write", f"a small write did not commit within "
                                            f"{POST_RUN_WRITE_S:g} s of the healed cluster being ready: writes stall",
                                            attempts=[o.to_json() for o in env.rec.ops if o.process == "probe"]))
    ops = env.rec.ops
    try:
        back = await _read_back(env, t)
    except RunFailed as e:
        # A healed cluster that cannot serve what it holds is a finding, not a broken run (a planted bug that lets
        # a stale meta node lead left a queue with no writable head): the checks that need no read-back still run
        violations.append(checker.violation("recovery", f"the healed cluster could not be read back: {e}"))
        found, stats = _history_checks(ops, initial, _paused(nem.applied, t, start))
        violations += found
        back = ReadBack()
    else:
        found, stats = _checks(ops, initial, back, _paused(nem.applied, t, start), env.rec.wall_ms)
        violations += found + checker.replicas_agree(back.digests) + checker.voters_agree(back.voters)
        violations += checker.histories_agree(back.histories)
    final, digests, histories = back.final, back.digests, back.histories
    with open(os.path.join(t.dir, "history.json"), "w") as f:
        json.dump({"faults": nem.applied, "ops": [o.to_json() for o in ops]}, f)
    outcomes = Counter((o.kind, o.outcome) for o in ops)
    snapshots, installs = _snapshot_events(t)
    return {"faults_injected": len(nem.applied), "operations_checked": checker.count_checked(ops),
            "operations": {f"{k}:{o}": n for (k, o), n in sorted(outcomes.items())},
            "checks": {**stats, "messages_read_back": sum(len(v) for v in final.values()),
                       "post_run_write_s": post_run_write_s,
                       "replicas": {n: {k: d.get(k) for k in ("version", "sha256", "bytes", "error")}
                                    for n, d in digests.items()},
                       "histories": histories},
            "violations": violations, "nemesis_errors": nem.errors,
            "fault_kinds_injected": dict(Counter(f["kind"] for f in nem.applied)),
            "operator_changes": {k: outcomes.get((k, "ok"), 0) for k in ("remap", "grow", "lease")},
            "snapshot_installs_seen": sum(n["installed"] for n in snapshots.values()),
            "install_faults_followed_by_install": _installs_after_faults(nem.applied, installs),
            "power_losses": _power_losses(nem.applied),
            "broker_faults": _broker_faults(nem.applied, ops, start),
            "snapshots": snapshots}


async def _recovered(t: topology.Topology) -> list[dict[str, Any]]:
    try:
        await asyncio.wait_for(asyncio.to_thread(devcluster.wait_ready, _member_urls(t), READY_TIMEOUT_S),
                               READY_TIMEOUT_S + 10)
    except (TimeoutError, asyncio.TimeoutError) as e:
        return [checker.violation("recovery", f"the cluster did not recover after every heal: {e}")]
    return []


@dataclass
class ReadBack:
    """What the healed cluster holds, read after the last heal."""
    final: dict[tuple[str, int], dict[int, str | None]] = field(default_factory=dict)   # offset -> fingerprint
    segments: dict[tuple[str, int], list[tuple[int, int | None]]] = field(default_factory=dict)
    epochs: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    barriers: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)
    dead: set[tuple[str, int, int]] = field(default_factory=set)
    digests: dict[str, dict[str, Any]] = field(default_factory=dict)
    histories: dict[str, dict[str, Any]] = field(default_factory=dict)
    voters: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: list[dict[str, Any]] = field(default_factory=list)   # the brokers' session events, in log order


def fence_windows(sessions: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per broker, from its session events in log order: (fenced at, back at) in meta's ms, back at math.inf when
    the run ended with it fenced."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in sessions:
        windows = out.setdefault(e["data"]["broker"], [])
        if e["type"] == "BrokerFenced":
            windows.append((e["ts"], math.inf))
        elif windows and windows[-1][1] == math.inf:
            windows[-1] = (windows[-1][0], e["ts"])
    return out


async def _read_back(env: Env, t: topology.Topology) -> ReadBack:
    """Every message, segment chain and barrier of the data topics, the pops left (drained), the committed offsets,
    the dead letters, the replicas' digests and histories and the voters. RunFailed when a part does not answer."""
    back = ReadBack()
    await _read_sized(env)
    for topic in DATA_TOPICS:
        back.final.update(await _read_topic(env, topic))
        chains, leaders = await _retrying(f"the segments of {topic}", lambda: _segments(env, topic),
                                          FINAL_DEADLINE_S)
        back.segments.update(chains)
        back.epochs.update(leaders)
        route = await _retrying(f"the route of {topic}", lambda: env.route(topic, fresh=True), FINAL_DEADLINE_S)
        for b in route.get("barriers", []):
            back.barriers.setdefault((topic, b["queue"]), []).append((b["after_queue"], b["after_offset"]))
    await _drain_pops(env)
    await _read_committed(env)
    back.dead = await _dead_lettered(env, t)
    back.digests = await _image_digests(env, t)
    back.histories = await _history_digests(env, t, _agreed_version(back.digests), back.sessions)
    back.voters = await _voters(env, t)
    return back


def _history_checks(ops: list[Any], initial: str, paused: dict[str, list[tuple[float, float]]]
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The checks that read the recorded history alone: they run even when the healed cluster cannot be read back."""
    register, register_stats = checker.cas_register(ops, initial)
    sized, sized_stats = checker.sized_registers(ops)
    leases, lease_stats = checker.leases_never_overlap(ops)
    violations = register + checker.monotonic_versions(ops) + checker.committed_offsets(ops)
    violations += checker.exclusive_commits(ops) + leases + checker.stale_pop_acks(ops) + sized
    violations += checker.acked_pops_stay_acked(ops)
    violations += checker.answered_in_budget(ops, ANSWER_BUDGET_S, paused)
    return violations, {**register_stats, **sized_stats, **lease_stats, **_sized_classes(ops)}


def _checks(ops: list[Any], initial: str, back: ReadBack, paused: dict[str, list[tuple[float, float]]],
            wall_ms: Callable[[float], float]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every check: the history's own, and those that hold it against what the healed cluster holds (``back``)."""
    violations, stats = _history_checks(ops, initial, paused)
    pops, pop_stats = checker.pops_acked_or_redelivered(ops, back.dead, POP_TOPIC)
    contiguous, contiguous_stats = checker.queues_contiguous(back.final, back.segments, workloads.OFFSET_BUDGET,
                                                             back.epochs, retrying=(KEYED_PROCESS,))
    leaders, leader_stats = checker.one_leader_per_epoch(ops, back.epochs)
    keys, key_stats = checker.keys_in_order(ops, back.barriers)
    violations += checker.no_lost_sends(ops, back.final) + contiguous + leaders + keys + pops
    violations += checker.fenced_brokers_refuse(ops, fence_windows(back.sessions), wall_ms)
    return violations, {**stats, **pop_stats, **contiguous_stats, **leader_stats, **key_stats}


async def _post_run_write(env: Env) -> float | None:
    """Seconds a small write took to commit after the heal (attempts recorded), or None past POST_RUN_WRITE_S."""
    topic = SIZE_TOPICS["tiny"]
    started = time.monotonic()
    n = 0
    while (left := POST_RUN_WRITE_S - (time.monotonic() - started)) > 0:
        n += 1
        tag = key = f"probe-{n}"
        try:
            version = await workloads.sized_read(env, "probe", topic)
            config = {"v": tag}
            await workloads.sized_put(env, "probe", topic, config, tag=tag, key=key, version=version,
                                      nbytes=workloads.envelope_bytes(topic, config, key, version),
                                      timeout_s=max(0.1, POST_RUN_WRITE_S - (time.monotonic() - started)))
            return round(time.monotonic() - started, 3)
        except StatorError:
            await asyncio.sleep(min(RETRY_PAUSE_S, max(0.0, left)))
    return None


async def _read_sized(env: Env) -> None:
    """The last linearizable read of every sized topic through every node (recorded: checker.sized_registers checks
    them with the rest). One reader per topic: a reader's versions are one topic's, which only grow."""
    for url in env.meta_urls:
        for topic in SIZE_TOPICS.values():
            await _retrying(f"reading {topic} back from {url}",
                            lambda: workloads.sized_read(env, f"final-{topic}", topic, url), FINAL_DEADLINE_S)


async def _image_digests(env: Env, t: topology.Topology) -> dict[str, dict[str, Any]]:
    """Every meta node's image digest at one version: asked again with the highest version seen until all answer
    the same one (the expiries of the stopped workloads' group members may still move it for a moment)."""
    names = dict(zip(env.meta_urls, t.meta_names))
    deadline = time.monotonic() + REPLICAS_DEADLINE_S
    version = 0
    while True:
        answers = await asyncio.gather(*(_digest(env, url, version) for url in env.meta_urls))
        digests = {names[url]: a for url, a in zip(env.meta_urls, answers)}
        versions = {d.get("version") for d in digests.values()}
        if len(versions) == 1 and None not in versions or time.monotonic() > deadline:
            return digests
        version = max(v for v in versions if v is not None) if versions - {None} else version
        await asyncio.sleep(RETRY_PAUSE_S)


def _agreed_version(digests: dict[str, dict[str, Any]]) -> int | None:
    versions = {d.get("version") for d in digests.values()}
    return versions.pop() if len(versions) == 1 else None


BROKER_SESSION_EVENTS = ("BrokerFenced", "BrokerRegistered", "BrokerUnfenced")


async def _history_digests(env: Env, t: topology.Topology, version: int | None, sessions: list[dict[str, Any]]
                           ) -> dict[str, dict[str, Any]]:
    """Every meta node's whole history through ``version`` (the one their images agree at), paged from each node
    itself and hashed: the replicas must tell one story, not only end in one state. ``sessions`` gets the brokers'
    session events (BROKER_SESSION_EVENTS) of the first history read whole."""
    if version is None:
        return {}
    names = dict(zip(env.meta_urls, t.meta_names))
    out = {}
    for url in env.meta_urls:
        async def read_all() -> dict[str, Any]:
            digest, after, events, seen = hashlib.sha256(), 0, 0, []
            while after < version:
                a = await request_once(env.session, "GET", f"{url}/v1/history", token=env.client_token,
                                       params={"after": after, "limit": limits.HISTORY_PAGE_MAX},
                                       timeout_s=workloads.REQUEST_TIMEOUT_S * 2)
                for e in a.body["events"]:
                    if e["version"] <= version:
                        digest.update(json.dumps(e, sort_keys=True).encode())
                        events += 1
                        if e["type"] in BROKER_SESSION_EVENTS:
                            seen.append(e)
                if a.body["next_after"] <= after:
                    raise StatorError(503, "HISTORY_SHORT", f"{url} serves history only through {after}")
                after = a.body["next_after"]
            if not sessions:
                sessions.extend(seen)
            return {"version": version, "events": events, "sha256": digest.hexdigest()}
        try:
            out[names[url]] = await _retrying(f"the history of {url}", read_all, FINAL_DEADLINE_S)
        except RunFailed as e:
            out[names[url]] = {"error": str(e)[:300]}
    return out


async def _voters(env: Env, t: topology.Topology) -> dict[str, dict[str, Any]]:
    """Every meta node's /v1/cluster, asked again until all agree on the voters (a wiped node is promoted once it
    caught up) or REPLICAS_DEADLINE_S passed."""
    names = dict(zip(env.meta_urls, t.meta_names))
    deadline = time.monotonic() + REPLICAS_DEADLINE_S
    while True:
        answers = await asyncio.gather(*(_cluster_status(env, url) for url in env.meta_urls))
        statuses = {names[url]: a for url, a in zip(env.meta_urls, answers)}
        if not checker.voters_agree(statuses) or time.monotonic() > deadline:
            return statuses
        await asyncio.sleep(RETRY_PAUSE_S)


async def _cluster_status(env: Env, url: str) -> dict[str, Any]:
    try:
        a = await request_once(env.session, "GET", f"{url}/v1/cluster", token=env.admin_token,
                               timeout_s=workloads.REQUEST_TIMEOUT_S)
    except StatorError as e:
        return {"error": str(e)[:300]}
    return a.body


async def _digest(env: Env, url: str, version: int) -> dict[str, Any]:
    try:
        a = await request_once(env.session, "GET", f"{url}/v1/admin/image-digest", token=env.admin_token,
                               params={"min_version": version, "wait": DIGEST_WAIT_S},
                               timeout_s=DIGEST_WAIT_S + workloads.REQUEST_TIMEOUT_S)
    except StatorError as e:
        return {"error": str(e)[:300]}
    return a.body


def _paused(applied: list[dict[str, Any]], t: topology.Topology, start: float) -> dict[str, list[tuple[float, float]]]:
    """Each meta node's pauses on the history's clock (the nemesis counts from the workloads' start)."""
    out: dict[str, list[tuple[float, float]]] = {}
    urls = dict(zip(t.meta_names, (t.meta_url(i) for i in range(topology.METAS))))
    for f in applied:
        if f["kind"] == "pause" and f["target"] in urls:
            out.setdefault(urls[f["target"]], []).append((f["started_s"] + start, f["healed_s"] + start))
    return out


def _sized_classes(ops: list[Any]) -> dict[str, Any]:
    """What the sizes workload got through: writes acknowledged per class, and the sizes that went through the log
    (acknowledged, or refused in apply for their expected version): which 64 KiB multiples, the largest."""
    puts = [o for o in ops if o.kind == "put"]
    acked = [o for o in puts if o.outcome == "ok"]
    logged = acked + [o for o in puts if o.output.get("code") == "VERSION_MISMATCH"]
    step = workloads.SIZE_STEP_BYTES
    near = [o.input["bytes"] for o in logged
            if abs(o.input["bytes"] - round(o.input["bytes"] / step) * step) <= workloads.SIZE_WINDOW_BYTES]
    multiples = sorted({round(n / step) for n in near})
    return {"sized_acked_by_class": dict(Counter(o.input["topic"].removeprefix("chaos-sz-") for o in acked)),
            "sized_logged_by_class": dict(Counter(o.input["topic"].removeprefix("chaos-sz-") for o in logged)),
            "sized_bytes_logged": sum(o.input["bytes"] for o in logged),
            "sized_64k_multiples_logged": multiples,
            "sized_largest_logged_bytes": max((o.input["bytes"] for o in logged), default=0)}


def _snapshot_events(t: topology.Topology) -> tuple[dict[str, dict[str, int]], dict[str, list[float]]]:
    """Per meta node, from its log: how many snapshots it installed from a leader and wrote by its own compaction,
    and when (wall clock) it installed each."""
    counts, installs = {}, {}
    for name in t.meta_names:
        counts[name] = dict.fromkeys(SNAPSHOT_EVENTS.values(), 0)
        installs[name] = []
        for event, at in _log_events(os.path.join(t.dir, "logs", f"{name}.log"), "raft_snapshot_"):
            if event in SNAPSHOT_EVENTS:
                counts[name][SNAPSHOT_EVENTS[event]] += 1
            if event == "raft_snapshot_installed" and at is not None:
                installs[name].append(at)
    return counts, installs


def _log_events(path: str, prefix: str) -> list[tuple[str, float | None]]:
    """(event, wall time) of the JSON lines of a member's log whose event starts with ``prefix``."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        with open(path, errors="replace") as f:
            for line in f:
                if prefix not in line:
                    continue
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    d = json.loads(line)
                    if str(d.get("event", "")).startswith(prefix):
                        at = d.get("timestamp")
                        out.append((d["event"], datetime.fromisoformat(at).timestamp() if at else None))
    return out


def _installs_after_faults(applied: list[dict[str, Any]], installs: dict[str, list[float]]) -> dict[str, int]:
    """Install faults whose follower installed a snapshot between its cut and INSTALL_AFTER_HEAL_S after the heal."""
    faults = [f for f in applied if f["kind"] == "install" and f.get("isolated")]
    followed = sum(1 for f in faults
                   if any(f["started_wall"] <= at <= f["healed_wall"] + INSTALL_AFTER_HEAL_S
                          for at in installs.get(f["isolated"], [])))
    return {"install_faults": len(faults), "followed": followed}


# The nemesis's power faults (nemesis.py ``power``): what the members lost, summed over the run.
def _power_losses(applied: list[dict[str, Any]]) -> dict[str, int]:
    faults = [f for f in applied if f["kind"] == "power" and "power_loss" in f]
    lost = [m for f in faults for m in f["power_loss"].values()]
    return {"faults": len(faults), "whole_machine": sum(1 for f in faults if f["target"] == nemesis.POWER_ALL),
            "aimed": sum(1 for f in faults if f.get("aim", {}).get("found")),
            "members_cut": sum(1 for m in lost if m["files_cut"] or m["files_removed"]),
            "files_cut": sum(m["files_cut"] for m in lost), "files_removed": sum(m["files_removed"] for m in lost),
            "bytes_lost": sum(m["bytes_lost"] for m in lost), "torn": sum(m["torn"] for m in lost)}


def _broker_faults(applied: list[dict[str, Any]], ops: list[Any], start: float) -> dict[str, Any]:
    """What the broker faults (nemesis.BROKER_KINDS) reached: how many, how many hit a broker leading heads of the
    data topics (and how many heads), and the sends acknowledged while one was on (between its strike and its
    heal), by any broker and by the one hit: no_lost_sends and one_leader_per_epoch read those with the rest."""
    faults = [f for f in applied if f["kind"] in nemesis.BROKER_KINDS and f.get("applied_s") is not None]
    led = [sum(len((f.get("led") or {}).get(topic, [])) for topic in DATA_TOPICS) for f in faults]
    during = by_target = 0
    for o in ops:
        if o.kind != "send" or o.outcome != "ok":
            continue
        hit = [f for f in faults if o.invoke < f["healed_s"] + start and o.complete > f["applied_s"] + start]
        during += bool(hit)
        by_target += any(o.input.get("broker") == f["target"].split("|")[0] for f in hit)
    return {"faults": len(faults), "hit_a_leader": sum(1 for n in led if n), "heads_led_when_hit": sum(led),
            "sends_acked_during": during, "sends_acked_by_the_broker_hit": by_target}


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
    route = await _retrying(f"the route of {topic}", lambda: env.route(topic, fresh=True), FINAL_DEADLINE_S)
    for queue in range(len(route["queues"])):
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
                    got[m["offset"]] = bodies.fingerprint(m.get("body"))
                if a.body["next_offset"] >= a.body["max_offset"] or a.body["next_offset"] <= offset:
                    return got
                offset = a.body["next_offset"]
        out[(topic, queue)] = await _retrying(f"reading back {topic}/{queue}", read_queue, FINAL_DEADLINE_S)
    return out


async def _segments(env: Env, topic: str) -> tuple[dict[tuple[str, int], list[tuple[int, int | None]]],
                                                   dict[tuple[str, int], list[dict[str, Any]]]]:
    """Each queue's chain of segments, (logic_start, logic_end or None for the head), and its segments' leader
    epochs (``segment_epochs``), from one linearizable read."""
    a = await request_once(env.session, "GET", f"{env.meta()}/v1/topics/{topic}", token=env.client_token,
                           params={"consistency": "linearizable"}, timeout_s=workloads.REQUEST_TIMEOUT_S)
    return segment_chains(a.body), segment_epochs(a.body)


def segment_chains(topic: dict[str, Any]) -> dict[tuple[str, int], list[tuple[int, int | None]]]:
    """``segments``'s chains from a topic's description. A remap begun just before the end may not have decided its
    new head's logic start yet (``null`` until the seal of the old head is in the log): refused as not settled,
    so the read-back's retry loop asks again (a run once crashed in the checker on that ``null``)."""
    chains = {(topic["topic"], q["queue"]): [(s["logic_start"], s["logic_end"]) for s in q["segments"]]
              for q in topic["logic_queues"]}
    unsettled = sorted(key for key, chain in chains.items() if any(start is None for start, _ in chain))
    if unsettled:
        raise StatorError(503, "NOT_SETTLED", f"{len(unsettled)} queue(s) of {topic['topic']} have a segment whose "
                          f"logic start is not decided yet, e.g. queue {unsettled[0][1]}")
    return chains


def segment_epochs(topic: dict[str, Any]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Each queue's segments as checker.one_leader_per_epoch and queues_contiguous read them: gen (the leader epoch),
    the broker that led it, its logic range, its sealer, and the logic offset its offset budget ends at
    (``budget_logic_end``: where a seal that could not learn its copy's end puts it). Refused as not settled as
    ``segment_chains`` is."""
    segment_chains(topic)
    keys = ("gen", "broker", "logic_start", "logic_end", "sealer")
    return {(topic["topic"], q["queue"]): [{**{k: s.get(k) for k in keys}, "budget_logic_end": _budget_end(s)}
                                           for s in q["segments"]]
            for q in topic["logic_queues"]}


def _budget_end(s: dict[str, Any]) -> int | None:
    if s.get("budget_end") is None or s.get("physical_start") is None or s.get("logic_start") is None:
        return None
    return s["logic_start"] + s["budget_end"] - s["physical_start"]


async def _read_committed(env: Env) -> None:
    """The exclusive group's committed offset of every queue, read once more after the heal (recorded: the
    committed_offsets check reads them with the rest)."""
    route = await _retrying(f"the route of {EX_TOPIC}", lambda: env.route(EX_TOPIC, fresh=True), FINAL_DEADLINE_S)
    for queue in range(len(route["queues"])):
        async def read() -> int:
            address = workloads.queue_address(await env.route(EX_TOPIC, fresh=True), queue)
            if address is None:
                raise StatorError(503, "NO_ROUTE", f"{EX_TOPIC}/{queue} has no address yet")
            return await workloads.read_committed(env, "final-offsets", queue, address)
        await _retrying(f"reading the committed offset of {EX_TOPIC}/{queue}", read, FINAL_DEADLINE_S)


async def _drain_pops(env: Env) -> None:
    """Pop (and ack) until pops have answered nothing for DRAIN_QUIET_S: every message left unacked is back by then.
    A refused pop is not quiet (a broker still catching up after the heal answers 503 CATCHING_UP: counted as quiet,
    the drain ended before the messages it holds came back; found by the simulator's brokers)."""
    deadline = time.monotonic() + DRAIN_DEADLINE_S
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < DRAIN_QUIET_S:
        if time.monotonic() > deadline:
            raise RunFailed(f"the pop drain still got messages (or refusals) after {DRAIN_DEADLINE_S:g} s")
        try:
            if await workloads.pop(env, "drain", drain=True):
                quiet_since = time.monotonic()
        except StatorError:
            quiet_since = time.monotonic()
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
