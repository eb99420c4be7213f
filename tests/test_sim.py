"""The deterministic simulator (ops/sim): its stopgaps still fit the code, a seed replays exactly, a short batch of
seeds finds nothing on the tree, and planted bugs of tests/test_chaos_mutants.py are caught in-process.

Measured alone on 2 cores (2026-11-29): ~7 s idle, 15-21 s beside a benchmark; most of it the batch of BATCH_SEEDS
schedules.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import meta.deciders.lookups as lookups
import meta.raft_group_commit as group_commit
from ops.sim import clock
from ops.sim.faults import KINDS, plan
from ops.sim.run import NODES, run_schedule, shrink
from wire.errors import rejection

REPO = Path(__file__).resolve().parent.parent
SHORT_S = 4.0                 # virtual seconds: enough for an election, a setup and a few faults
BATCH_SEEDS = 16              # seeds of the default 10 s schedule, on 2 worker processes
BATCH_TIMEOUT_S = 120
MUTANT_SEEDS_MAX = 4          # a planted bug must be reported within this many seeds
# Modules the simulator runs for real, and the clocks and randomness each may reach only through PATCHES.
SIMULATED = ["meta.raft_node", "meta.raft_transport", "meta.raft_roles", "meta.raft_group_commit",
             "meta.pysyncobj_shim", "meta.raft_applier", "meta.raft_proposals", "meta.raft_entry",
             "meta.raft_membership", "meta.raft_wire", "meta.raft_journal", "meta.state_machine"]
NOT_ON_THE_SIMULATED_PATH = {("meta.raft_journal", "time")}   # OsJournalIO.remove_dead; the simulator's IO has none


def test_every_swapped_name_still_exists():
    for module, attribute, _factory in clock.PATCHES:
        clock.target(module, attribute)


def test_every_clock_and_random_draw_of_the_simulated_modules_is_swapped():
    swapped = {(m, a) for m, a, _f in clock.PATCHES}
    uses = {"time": r"\btime\.(time|monotonic|sleep)\(", "random": r"\brandom\.\w+\(", "os": r"\bos\.urandom\(",
            "secrets": r"\bsecrets\.\w+\("}
    missing = []
    for module in SIMULATED:
        source = (REPO / (module.replace(".", "/") + ".py")).read_text()
        for name, pattern in uses.items():
            if re.search(pattern, source) and (module, name) not in swapped | NOT_ON_THE_SIMULATED_PATH:
                missing.append(f"{module}: {name}")
    assert missing == [], f"a clock or randomness the simulator does not control (ops/sim/clock.py PATCHES): {missing}"


@pytest.mark.parametrize("l2", [False, True])
def test_a_seed_runs_twice_to_the_same_trace_hash(l2):
    duration_s = 10.0 if l2 else SHORT_S   # late vote requests and appends: the setup takes longer
    first, second = run_schedule(7, duration_s=duration_s, l2=l2), run_schedule(7, duration_s=duration_s, l2=l2)
    assert first["ok"], first["violations"]
    assert first["counts"]["ops_ok"] > 0 and first["counts"]["steps"] > 0
    assert (first["counts"]["l2_messages"] > 0) == l2
    assert first["trace_hash"] == second["trace_hash"]


def _stator_sim(*args: str) -> tuple[int, dict]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    p = subprocess.run([sys.executable, "-c", "from ops.cli import main; main(prog_name='stator')", "sim", *args],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
    return p.returncode, json.loads(p.stdout)


def test_a_batch_of_seeds_finds_no_violation_and_replays_across_processes():
    code, summary = _stator_sim("--seeds", str(BATCH_SEEDS), "--workers", "2")
    assert code == 0 and summary["failed"] == [], summary["failed"]
    assert summary["liveness_seeds"] == 0, summary["liveness"]
    assert summary["ops_ok"] > 0 and summary["boots"] > 3 * BATCH_SEEDS   # crashes happened, and restarts
    hashes = {_stator_sim("--seed", "3", "--duration", str(SHORT_S))[1]["trace_hash"] for _ in range(2)}
    assert len(hashes) == 1, hashes


def _caught(checks: set[str] | None = None, kinds: tuple[str, ...] = KINDS) -> tuple[int, list[str]]:
    """The first seed (1..MUTANT_SEEDS_MAX) whose schedule reports a violation (of ``checks``, if given)."""
    for seed in range(1, MUTANT_SEEDS_MAX + 1):
        found = {v["check"] for v in run_schedule(seed, kinds=kinds)["violations"]}
        wanted = found & checks if checks is not None else found - {"journal_counters"}
        if wanted:
            return seed, sorted(found)
    return 0, []


def test_a_cas_that_skips_a_stale_expected_version_is_caught(monkeypatch):
    # tests/test_chaos_mutants.py's cas_skips_expected_version: only a newer expected version is refused
    def skips(cmd, current):
        ev = cmd.get("expected_version")
        if ev is not None and ev > current:
            raise rejection(409, "VERSION_MISMATCH", f"expected version {ev}, current is {current}")

    monkeypatch.setattr(lookups, "expect_version", skips)
    seed, checks = _caught({"cas_register"})
    assert seed, f"cas_skips_expected_version not caught in {MUTANT_SEEDS_MAX} seeds"
    # It needs no fault at all: the shrinker drops every one and the schedule still fails.
    faults = plan(seed, SHORT_S, list(NODES))
    assert faults and not run_schedule(seed, faults, SHORT_S)["ok"]
    smaller, runs = shrink(seed, faults, SHORT_S, runs_max=len(faults))
    assert smaller == [] and runs == len(faults)


def test_a_follower_that_acknowledges_before_its_sync_is_caught(monkeypatch):
    # tests/test_chaos_mutants.py's follower_acks_before_sync: the acknowledgement leaves before the journal sync.
    # The group-commit counter sees it at once; the check that matters is an external one (a power loss then a
    # lost acknowledged write, or replicas that diverge), which must find it too. It takes the leader's followers
    # losing power together while it is cut off (power_quorum): with every fault kind, 2-5 seeds in 20 catch it.
    monkeypatch.setattr(group_commit.GroupCommit, "before_flush", lambda self, messages: None)
    seed, checks = _caught(kinds=("power_quorum",))
    assert seed, f"follower_acks_before_sync not caught by an external check in {MUTANT_SEEDS_MAX} seeds"
