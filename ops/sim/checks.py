"""The end-of-schedule checks. Each returns violations as ops/chaos/checker.py does ({"check", "message",
"evidence"}); the online ones (state-machine safety, one leader per term) are recorded by the Sim as they happen.
"""

from __future__ import annotations

import threading
from typing import Any

from meta import invariants
from meta.backup import image_digest
from meta.raft.entry import decode_entry
from ops.chaos.checker import cas_register, leases_never_overlap, monotonic_versions, violation
from ops.chaos.history import OK

from .workload import INITIAL

EVIDENCE_MAX = 5


def rids_of(payload: bytes | None) -> list[str]:
    if not payload:
        return []
    try:
        return [e.get("rid") for e in decode_entry(payload) if isinstance(e, dict) and e.get("rid")]
    except Exception:   # noqa: BLE001 - a membership entry or a no-op
        return []


def acknowledged_writes_kept(sim: Any) -> list[dict[str, Any]]:
    """Every cas answered ok is in the final log of every live node that applied as far as the furthest one (its
    request id in an applied entry; a node behind is a liveness finding of ``converged``, not a loss)."""
    out = []
    acked = [o for o in sim.workload.ops if o.kind == "cas" and o.outcome == OK]
    furthest = max((n.applied_index for n in sim.nodes.values() if n.up), default=0)
    for node in sim.nodes.values():
        if not node.up or node.applied_index < furthest:
            continue
        present = {rid for _, payload in node.applies for rid in rids_of(payload)}
        missing = [o.input["rid"] for o in acked if o.input["rid"] not in present]
        if missing:
            out.append(violation("acknowledged_writes_kept", f"{len(missing)} acknowledged writes are not in "
                                 f"{node.name}'s final log", node=node.name, missing=missing[:EVIDENCE_MAX]))
    return out


def replicas_agree(sim: Any) -> list[dict[str, Any]]:
    by_index: dict[int, dict[str, str]] = {}
    for node in sim.nodes.values():
        if node.up and node.so is not None:
            by_index.setdefault(node.applied_index, {})[node.name] = image_digest(node.so.image_data)
    out = []
    for index, digests in by_index.items():
        if len(set(digests.values())) > 1:
            out.append(violation("replicas_agree", f"replicas applied through {index} hold different images",
                                 index=index, digests=digests))
    return out


def image_invariants(sim: Any) -> list[dict[str, Any]]:
    """Every live node's final image keeps the state machine's structural rules (meta/invariants.py): the chains of
    the remapper's topic above all, whose logic offsets must go on exactly where each sealed segment ended."""
    out = []
    for node in sim.nodes.values():
        if node.up and node.so is not None:
            found = invariants.problems(node.so.current_image())
            if found:
                out.append(violation("image_invariants", f"{node.name}'s final image breaks {len(found)} rules",
                                     node=node.name, problems=found[:EVIDENCE_MAX]))
    return out


def journal_counters(sim: Any) -> list[dict[str, Any]]:
    out = []
    for node in sim.nodes.values():
        stats = list(node.journal_stats) + ([node.so.journal_stats()] if node.so is not None else [])
        acks = sum(s["acks_unsynced"] for s in stats)
        commits = sum(s["commits_unsynced"] for s in stats)
        marks = sum(s["marks_unsynced"] for s in stats)
        if acks or commits or marks:
            out.append(violation("journal_counters", f"{node.name}: {acks} acknowledgements, {commits} commits and "
                                 f"{marks} leader's marks covered entries no sync had covered", node=node.name))
    return out


def converged(sim: Any) -> list[dict[str, Any]]:
    """Liveness, not safety: after the heal and the quiet time every node is up and applied the same index, and
    every node votes under the disk it runs on, as the membership each one holds says (a node back on a wiped disk
    rejoined as a learner and was promoted again: meta/raft/roles.py)."""
    indexes = {n.name: (n.applied_index if n.up else None) for n in sim.nodes.values()}
    if None in indexes.values() or len(set(indexes.values())) > 1:
        return [violation("converged", "the healed cluster did not converge", applied=indexes)]
    statuses = {n.name: n.so.membership_status() for n in sim.nodes.values()}
    wanted = sorted((name, s["disk"], True) for name, s in statuses.items())
    for name, s in statuses.items():
        held = sorted((m["name"], m["disk"], m["voter"]) for m in s["members"])
        if not s["voter"] or held != wanted:
            return [violation("members_restored", f"{name} does not hold every node as a voter on its disk",
                              node=name, voter=s["voter"], members=held, disks=wanted)]
    return []


def final(sim: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(safety violations, liveness findings, stats)."""
    ops = sim.workload.ops
    cas, stats = cas_register(ops, INITIAL)
    leases, lease_stats = leases_never_overlap(ops)
    stats.update(lease_stats)
    safety = (cas + leases + monotonic_versions(ops) + acknowledged_writes_kept(sim) + replicas_agree(sim)
              + image_invariants(sim) + journal_counters(sim))
    if threading.active_count() != sim.threads_at_start:
        safety.append(violation("threads", f"{threading.active_count()} threads at the end, "
                                f"{sim.threads_at_start} at the start"))
    return safety, converged(sim), stats
