"""The faults of one schedule, drawn up front from its seed: a JSON-serialisable list, replayed as it is, and
shrunk by dropping faults (ops/sim/run.py shrink).

Windows follow each other from FAULTS_START_S to the end of the run; each draws 1-3 faults (so faults combine by
construction), each lasting 0.2-3 s. A fault is undone at its end (a crashed node restarts, a cut heals); after the
last window everything is healed and the cluster gets QUIET_S of calm before the checks.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

# power_quorum: every follower of the leader of the moment loses power at once (mid-step, with the fault's
# mid_step) while that leader is isolated from them until POWER_QUORUM_ISOLATION_EXTRA_S after they are back: the
# followers must elect from what they synced, which must hold every committed entry.
# wipe: a node's disk is replaced (kill, an empty disk with a new identity, restarted after the fault's duration);
# only while every node is up and votes (a wiped node that has not caught up yet is a learner), as the chaos
# runner's nemesis waits, so that no wipe takes the last copy of an acknowledged entry.
# rejoin_leader_loss (ops/chaos/nemesis.py's): a follower is cut off until stale (STALE_FOR_S), the other follower's
# disk is wiped and it starts empty, then the leader is cut off from both for the fault's duration as the stale
# follower comes back (back before, it would catch up from the leader at once, stale no more): the wiped node
# must not vote the stale one into a leadership that misses acknowledged writes.
# corrupt: one bit flipped in the next bytes from one node to another (the link's AEAD refuses the frame; the
# transport closes the connection and dials again).
# rewind: the leader of the moment is cut off for the fault's duration (what its clients propose meanwhile is an
# uncommitted tail of its term); once it is back, for REWIND_AFTER_S, every leader sends each node from an earlier
# index than pysyncobj would (at most REWIND_BACK_MAX entries below its commit index) in batches of
# REWIND_BATCH_BYTES, as etcd's leader probes from a reject's hint, which may land below where a follower's log
# leaves the leader's: Raft's safety may not depend on the next index. A follower then meets repeats of entries it
# holds, cut short before its tail of an older term, under a commit index past them (the cap of
# pysyncobj_shim._append_as_raft). pysyncobj's own next index never goes below that point: no other fault gets there.
KINDS = ("isolate", "cut_link", "one_way", "crash_process", "crash_power", "pause", "slow", "reset", "power_quorum",
         "wipe", "rejoin_leader_loss", "corrupt", "rewind")
# The brokers' (with the brokers workload, ops/sim/brokers.py): a broker killed, or losing power, for the duration;
# or cut off from the meta nodes and the other brokers (both ways) while its clients still reach it, for
# BROKER_PARTITION_S: longer than its session (node.py SESSION_TIMEOUT_MS), so meta fences it and fails its heads
# over to a copy, while it may still take sends it leads: none may be acknowledged unless a copy holds it.
BROKER_KINDS = ("broker_kill", "broker_power", "broker_partition")
BROKER_PARTITION_S = (2.0, 6.0)
POWER_QUORUM_ISOLATION_EXTRA_S = 3.0   # > RESTART_ELECTION_GRACE_S + the longest election timeout
STALE_FOR_S = 1.5
LEADER_LOST_AFTER_MAX_S = 1.0   # > RESTART_ELECTION_GRACE_S + the longest election timeout
AIMED_LEADER_LOSS_P = 0.75     # rejoin_leader_loss: how often the leader goes at the wiped node's riskiest moment
AIM_POLL_S = 0.005              # how often an aimed loss looks at the wiped node
REWIND_AFTER_S = 1.0
REWIND_BACK_MAX = 30
REWIND_BATCH_BYTES = 1024       # > the simulator's largest entry (< 512 bytes measured): never sent in pieces
FAULTS_START_S = 1.5
WINDOW_GAP_MIN_S = 0.3
WINDOW_GAP_MAX_S = 2.0
FAULTS_PER_WINDOW_MAX = 3
FAULT_MIN_S = 0.2
FAULT_MAX_S = 3.0
SLOW_EXTRA_MAX_S = 0.2
MID_STEP_P = 0.5


@dataclass(frozen=True)
class Fault:
    at: float                  # virtual seconds from the start of the run
    kind: str
    target: list[str]          # node names: one, or a (source, destination) pair for links
    duration: float
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Fault:
        return Fault(float(d["at"]), str(d["kind"]), list(d["target"]), float(d["duration"]), dict(d.get("params", {})))


def plan(seed: int, duration_s: float, nodes: list[str], kinds: tuple[str, ...] = KINDS,
         brokers: tuple[str, ...] = ()) -> list[Fault]:
    rng = random.Random(f"{seed}:faults")
    out: list[Fault] = []
    t = FAULTS_START_S
    while t < duration_s:
        for _ in range(rng.randint(1, FAULTS_PER_WINDOW_MAX)):
            kind = rng.choice(kinds)
            shortest, longest = BROKER_PARTITION_S if kind == "broker_partition" else (FAULT_MIN_S, FAULT_MAX_S)
            duration = round(min(rng.uniform(shortest, longest), duration_s - t), 4)
            a, b = rng.sample(nodes, 2)
            target = [a, b] if kind in ("cut_link", "one_way", "reset", "corrupt") else [a]
            if kind in BROKER_KINDS:
                target = [rng.choice(brokers)]
            params: dict[str, Any] = {}
            if kind == "slow":
                params["extra_s"] = round(rng.uniform(0.01, SLOW_EXTRA_MAX_S), 4)
            elif kind.startswith("crash_") or kind == "power_quorum":
                params["mid_step"] = rng.random() < MID_STEP_P   # inside its next step: before its syncs completed
            out.append(Fault(round(t, 4), kind, target, max(duration, 0.0), params))
        t += rng.uniform(WINDOW_GAP_MIN_S, WINDOW_GAP_MAX_S)
    return out
