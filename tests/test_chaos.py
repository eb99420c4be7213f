"""A CI-sized chaos run (issue 10): `stator chaos run` as a real process, starting a real proxied cluster (3 meta
nodes, 3 brokers), injecting every fault kind from a fixed seed, then checking the recorded history.
The long run (300 s, 100+ faults) is the command in docs/operations.md; this one keeps the suite's budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SEED = 11
DURATION_S = 30
RUN_TIMEOUT_S = 240     # setup ~5 s + 30 s of faults + heal, read-back and pop drain: far less on an idle machine
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_chaos_run_fixed_seed_finds_no_violation(tmp_path):
    work = tmp_path / "chaos"
    proc = subprocess.run([sys.executable, "-m", "ops.cli", "chaos", "run", "--seed", str(SEED), "--duration",
                           str(DURATION_S), "--json", "--work-dir", str(work)],
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.stderr.splitlines()[0] == f"seed: {SEED}", proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["violations"] == [], json.dumps(summary["violations"], indent=1)[:4000]
    assert summary["nemesis_errors"] == []
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary["seed"] == SEED
    # the faults happened: several, of more than one kind
    assert summary["faults_injected"] >= 8
    assert len(summary["fault_kinds_injected"]) >= 3, summary["fault_kinds_injected"]
    # every workload got operations through and the checks had material to check
    ops = summary["operations"]
    for kind in ("cas", "read", "read_mv", "send", "commit", "pop", "ack"):
        assert ops.get(f"{kind}:ok", 0) > 0, (kind, ops)
    # the fencing was exercised: a member gone silent committed with its old token and was refused (STALE_TOKEN)
    assert ops.get("commit:fail", 0) > 0, ops
    assert summary["operations_checked"] >= 300
    assert summary["checks"]["register_ops"] > 20 and not summary["checks"]["inconclusive"]
    assert summary["checks"]["messages_read_back"] >= ops["send:ok"]
    # every process started was stopped
    cluster = json.loads((work / "cluster.json").read_text())
    for m in cluster["meta"] + cluster["brokers"]:
        assert not _alive(m["pid"]), m


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
