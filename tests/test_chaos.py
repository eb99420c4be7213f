"""A CI-sized chaos run (issue 10, issue 20): `stator chaos run` as a real process, starting a real proxied cluster
(3 meta nodes, 3 brokers), injecting every fault kind from a fixed seed, then checking the recorded history.
The seed's 40 s hold every fault kind: two ``install`` faults (one ending in a kill -9 of the follower), a ``wipe``
of a meta node's disk, a ``replace`` of a meta node through membership changes, six ``power`` losses (three of a
broker, two of a meta node, one of the whole machine: each member loses what it had not synced) and a ``leader_cut``
(the leader cut from its peers while clients keep writing to it). The workloads remap queues back and forth, grow
every data topic twice, change the exclusive group's lease, send batches with bodies up to 3 MiB into segments
small enough to roll, and write meta commands from tiny to the largest the API allows. The long runs (600 s) and
the runner against planted bugs (tests/test_chaos_mutants.py) are the commands in docs/operations.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ops.chaos import runner

SEED = 884
DURATION_S = 40
# The kinds this seed's schedule was chosen with (every kind there was then). The default --faults also has the
# broker faults now (nemesis.BROKER_KINDS), which would draw another schedule from the seed, and no seed's 40 s holds
# every one of the kinds below as well as them. A run of the broker kinds alone is the mutants' control at their
# seed (tests/test_chaos_mutants.py); it is not in the suite while consumer state on a failed-over head fails it
# (issue 37).
FAULTS = ("kill", "pause", "restart", "partition", "install", "wipe", "replace", "power", "leader_cut")
RUN_TIMEOUT_S = 240     # setup ~5 s + 40 s of faults + heal, read-back and pop drain: ~75 s on a loaded machine
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _chaos_run(work, seed: int, duration_s: float, faults: tuple[str, ...]) -> dict:
    """One `stator chaos run` as a process; its summary, checked to have found nothing."""
    try:
        proc = subprocess.run([sys.executable, "-m", "ops.cli", "chaos", "run", "--seed", str(seed), "--duration",
                               str(duration_s), "--faults", ",".join(faults), "--json", "--work-dir", str(work)],
                              cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    finally:
        runner.stop_cluster(str(work))   # a runner killed by the timeout leaves its members running
    assert proc.stderr.splitlines()[0] == f"seed: {seed}", proc.stderr
    assert proc.stdout.strip(), f"no summary (exit {proc.returncode}); the runner's stderr ends: {proc.stderr[-4000:]}"
    summary = json.loads(proc.stdout)
    assert summary["violations"] == [], json.dumps(summary["violations"], indent=1)[:4000]
    assert summary["nemesis_errors"] == []
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary["seed"] == seed
    # every process started was stopped
    cluster = json.loads((work / "cluster.json").read_text())
    for m in cluster["meta"] + cluster["brokers"]:
        assert not _alive(m["pid"]), m
    return summary


@pytest.mark.long(seconds=60)   # its module alone, measured on 2 cores (tests/conftest.py)
def test_chaos_run_fixed_seed_finds_no_violation(tmp_path):
    work = tmp_path / "chaos"
    summary = _chaos_run(work, SEED, DURATION_S, FAULTS)
    # the faults happened: several, of more than one kind
    assert summary["faults_injected"] >= 8
    assert len(summary["fault_kinds_injected"]) >= 3, summary["fault_kinds_injected"]
    # a meta node lost its whole disk and came back empty, and one was replaced through membership changes
    # (meta/raft/roles.py): nothing acknowledged was lost, and every node votes again at the end (voters_agree)
    assert summary["fault_kinds_injected"].get("wipe", 0) >= 1, summary["fault_kinds_injected"]
    assert summary["fault_kinds_injected"].get("replace", 0) >= 1, summary["fault_kinds_injected"]
    # a power loss of members one at a time and of the whole machine, and a leader cut off from its peers
    assert summary["fault_kinds_injected"].get("leader_cut", 0) >= 1, summary["fault_kinds_injected"]
    power = summary["power_losses"]
    assert power["faults"] >= 3 and power["whole_machine"] >= 1, power
    # aimed at unsynced writes (nemesis._aim), the power faults took something: bytes the members had written and
    # not synced, which start-up repaired (a run of such faults at random moments lost nothing)
    assert power["aimed"] >= 1 and power["bytes_lost"] > 0, power
    # every workload got operations through and the checks had material to check
    ops = summary["operations"]
    for kind in ("cas", "read", "read_mv", "send", "ksend", "commit", "oread", "pop", "ack", "put", "sread", "remap",
                 "grow", "lease", "heartbeat"):
        assert ops.get(f"{kind}:ok", 0) > 0, (kind, ops)
    # the operator's changes went through while the clients ran: remaps back and forth, both growths
    assert summary["operator_changes"]["remap"] >= 3 and summary["operator_changes"]["grow"] == 6, summary
    # nine queues at the start, six grown, and a segment more for every remap (a fenced broker's seals add more)
    assert summary["checks"]["segments_read"] >= 15 + summary["operator_changes"]["remap"], summary["checks"]
    # keyed batches were checked in order, some across a growth that moved their key; leases changed hands, some
    # given back by a member the group took them from (ops/chaos/workloads.py: at once, before the meta faults that
    # hold a lease's expiry back; with none given back, a run under load once counted no handover at all)
    assert summary["checks"]["key_pairs"] > 0 and summary["checks"]["lease_handovers"] > 0, summary["checks"]
    assert summary["checks"]["lease_handovers_released"] > 0, summary["checks"]
    print("keys and leases checked:", {k: summary["checks"][k] for k in ("key_pairs", "key_pairs_moved",
                                                                          "lease_handovers",
                                                                          "lease_handovers_released")})
    histories = summary["checks"]["histories"]
    assert len({(h["events"], h["sha256"]) for h in histories.values()}) == 1 and len(histories) == 3, histories
    # the fencing was exercised: a member gone silent committed with its old token and was refused (STALE_TOKEN)
    assert ops.get("commit:fail", 0) > 0, ops
    assert summary["operations_checked"] >= 300
    assert summary["checks"]["register_ops"] > 20 and not summary["checks"]["inconclusive"]
    assert summary["checks"]["messages_read_back"] >= ops["send:ok"]
    _assert_sizes_and_installs(summary, json.loads((work / "history.json").read_text())["faults"])


def _assert_sizes_and_installs(summary: dict, faults: list[dict]) -> None:
    checks = summary["checks"]
    # every size class got writes acknowledged and through the log, the big ones near the API's largest command, and
    # several 64 KiB multiples
    assert set(checks["sized_acked_by_class"]) == {"tiny", "mid", "big"}, checks["sized_acked_by_class"]
    assert checks["sized_largest_logged_bytes"] > 800_000 and len(checks["sized_64k_multiples_logged"]) >= 5, checks
    assert checks["sized_reads"] >= 9   # the final linearizable read of each sized topic through each node, at least
    assert checks["post_run_write_s"] is not None
    assert len({(r["version"], r["sha256"]) for r in checks["replicas"].values()}) == 1, checks["replicas"]
    # the install faults happened, and a follower they cut installed a leader's snapshot after its heal
    isolated = {f["isolated"] for f in faults if f["kind"] == "install"}
    assert len(isolated) >= 1 and summary["fault_kinds_injected"]["install"] >= 2, faults
    assert any(summary["snapshots"][n]["installed"] >= 1 for n in isolated), (isolated, summary["snapshots"])
    assert summary["install_faults_followed_by_install"]["followed"] >= 1, (summary, faults)
    # every node compacted (wrote a snapshot of its own) more than once
    assert all(n["written"] >= 2 for n in summary["snapshots"].values()), summary["snapshots"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True
