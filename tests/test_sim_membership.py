"""In the deterministic simulator (ops/sim), nodes back on wiped disks rejoin as learners and are promoted again,
and the schedules that wipe them find nothing: the harness of meta/raft/roles.py for mutation testing
(ops/mutation.sh), which runs only in-process tests. Its planted check lives in tests/test_sim.py.

Measured on 2 cores (2026-12-01): 0.2-0.45 s per schedule of 6 virtual s.
"""

from __future__ import annotations

import pytest

from ops.sim.run import run_schedule

SEEDS = (1, 2, 3, 4)
DURATION_S = 6.0   # virtual: faults for 6 s, then the heal, the calm and the convergence (ops/sim/run.py)


@pytest.mark.parametrize("kind", ["wipe", "rejoin_leader_loss"])
def test_wiped_nodes_rejoin_as_voters_and_nothing_is_lost(kind):
    wiped = 0
    for seed in SEEDS:
        result = run_schedule(seed, duration_s=DURATION_S, kinds=(kind,))
        assert result["ok"], (seed, result["violations"])
        # converged: every node applied the same index and votes on the disk it runs on (members_restored)
        assert result["liveness"] == [], (seed, result["liveness"])
        wiped += result["counts"]["wiped"]
    assert wiped >= len(SEEDS), f"only {wiped} wipes in {len(SEEDS)} schedules: the test reaches no rejoin"
