"""A meta leader cut off from its majority stops acting as leader within its fallback timeout (pysyncobj: 30 s).

Real three-node cluster: both followers are frozen with SIGSTOP (the leader's links stay up, nothing answers it).
The old leader must report another role within 5 x raft_tuning.leader_fallback_timeout_s (0.5 s, at most the
election timeout), and from then on refuse what only a leader may do: writes, linearizable reads and group
heartbeats (which a leader answers from its own image, with no log round trip) get 503, none is acknowledged.
ops/bench/step_down.py measures the same over several trials.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from meta import config as meta_config
from meta.raft.node import RaftTuning
from tests.support import cluster as cluster_mod
from tests.support.meta_http import NET_ERRORS, call_any, node_urls, ok
from tests.support.config_files import meta_raw

FALLBACK_S = RaftTuning().leader_fallback_timeout_s
STEP_DOWN_BOUND_S = 5 * FALLBACK_S      # generous for a loaded 2-core machine; pysyncobj's default is 30 s
REFUSALS = {"NO_LEADER", "NOT_LEADER"}
TOPIC = "cut"
GROUP = "cut-group"


def test_the_fallback_timeout_may_not_exceed_the_election_timeout():
    tuning = meta_config.parse(meta_raw()).raft_tuning
    assert tuning.leader_fallback_timeout_s <= tuning.election_timeout_max_s
    with pytest.raises(meta_config.ConfigError, match="leader_fallback_timeout_s must not exceed election_timeout"):
        meta_config.parse(meta_raw(raft_tuning={"leader_fallback_timeout_s": 30.0}))
    assert meta_config.parse(meta_raw(raft_tuning={"leader_fallback_timeout_s": 0.3})) \
        .raft_tuning.leader_fallback_timeout_s == 0.3


def _code(body) -> str | None:
    return body.get("error", {}).get("code") if isinstance(body, dict) else None


async def test_a_cut_off_leader_steps_down_and_refuses_writes_reads_and_heartbeats(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0) as c:
        await ok(c, "PUT", "/v1/brokers/b1", role="broker", json={"address": "http://127.0.0.1:1"})
        await ok(c, "POST", "/v1/topics", json={"topic": TOPIC, "queues": 1, "brokers": ["b1"]}, expect=(201,))
        leader, lurl, followers = await node_urls(c)
        beat = {"member": "m", "topics": [TOPIC], "mode": "exclusive"}
        await ok(c, "POST", f"/v1/groups/{GROUP}/heartbeat", role="client", json=beat, url=lurl)   # the join
        answered: list[float] = []   # send times of heartbeats the old leader answered 200
        stop = asyncio.Event()

        async def heartbeats() -> None:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    s, b, _ = await c.call("POST", f"{lurl}/v1/groups/{GROUP}/heartbeat", "client", json=beat,
                                           timeout_s=15.0)
                except NET_ERRORS:
                    s, b = None, None
                if s == 200:
                    answered.append(sent)
                else:
                    assert s == 503 and _code(b) in REFUSALS, (s, b)
                await asyncio.sleep(0.01)

        hb = asyncio.create_task(heartbeats())
        await asyncio.sleep(0.3)
        assert answered, "the leader answered no heartbeat before the cut"
        pids = [c.pid(next(m["node"] for m in c.info["meta"] if m["url"] == u)) for u in followers]
        t_cut = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            # A write sent before the leader knows it is cut off: appended, never committed, never acknowledged.
            early_write = asyncio.create_task(c.call("PUT", f"{lurl}/v1/topics/{TOPIC}/config", json={"k": "early"},
                                                     timeout_s=15.0))
            role = "leader"
            while role == "leader":
                s, b, _ = await c.call("GET", f"{lurl}/v1/cluster", "client", timeout_s=2.0)
                assert s == 200, (s, b)
                role, t_seen = b["role"], time.monotonic()
                assert t_seen - t_cut < 2 * STEP_DOWN_BOUND_S, \
                    f"{leader} still leads {t_seen - t_cut:.2f} s after the cut"
                await asyncio.sleep(0.01)
            step_down_s = t_seen - t_cut
            assert b["leader"] is None, b
            # What only a leader may do is refused from now on (the forwarder waits for a leader, then 503).
            write, read, heartbeat = await asyncio.gather(
                c.call("PUT", f"{lurl}/v1/topics/{TOPIC}/config", json={"k": "late"}, timeout_s=15.0),
                c.call("GET", f"{lurl}/v1/topics/{TOPIC}?consistency=linearizable&wait=1", "client", timeout_s=15.0),
                c.call("POST", f"{lurl}/v1/groups/{GROUP}/heartbeat", "client", json=beat, timeout_s=15.0))
            stop.set()
            await hb                  # raises what the heartbeat loop saw wrong
            s, b, _ = await early_write
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        last_answered_s = max(answered) - t_cut
        print(f"\n[step down] {leader} stepped down {step_down_s:.3f} s after the cut (fallback {FALLBACK_S} s); "
              f"last heartbeat answered was sent {last_answered_s:.3f} s after the cut; role then {role!r}")
        assert step_down_s < STEP_DOWN_BOUND_S, step_down_s
        assert last_answered_s < step_down_s, (last_answered_s, step_down_s)
        assert s == 503 and _code(b) in REFUSALS | {"UNKNOWN_OUTCOME", "LEADER_CHANGED"}, ("early write", s, b)
        print(f"  early write: {s} {_code(b)}; late write {write[0]} {_code(write[1])}; linearizable read "
              f"{read[0]} {_code(read[1])}; heartbeat {heartbeat[0]} {_code(heartbeat[1])}")
        for what, (s, b, _) in (("write", write), ("heartbeat", heartbeat)):
            assert s == 503 and _code(b) in REFUSALS, (what, s, b)
        # The read's barrier waits in pysyncobj's queue for a leader (commandsWaitLeader) until the read's wait ends.
        assert read[0] == 503 and _code(read[1]) == "NO_LEADER", read
        # Healed: the cluster takes writes again.
        s, b, _ = await call_any(c, "PUT", f"/v1/topics/{TOPIC}/config", json={"k": "healed"})
        assert s == 200, (s, b)
