"""Upkeep that only watches the clock runs every few milliseconds, not at every tick (meta/raft/housekeeping.py):
pysyncobj's compaction check (shim.CompactionChecks) and the transport's dials and expiries."""

from __future__ import annotations

from meta.raft import pysyncobj_shim as shim
from meta.raft.housekeeping import HOUSEKEEPING_S, Housekeeping
from tests.support.raft_nodes import all_applied, leader_of, start_nodes

SECRET = "housekeeping-test-secret"
PROPOSALS = 40
WAIT_S = 20.0


def test_upkeep_is_due_at_the_first_ask_then_once_a_period_has_passed_since_it_last_ran():
    h = Housekeeping(period_s=0.005)
    assert h.due(100.0)
    assert not h.due(100.0) and not h.due(100.004)
    assert h.due(100.005)                 # a whole period after the last run
    assert not h.due(100.009)
    assert h.due(100.5)                   # a long gap: due at once, and the next period counts from here
    assert not h.due(100.504) and h.due(100.505)
    assert (h.ran, h.skipped) == (4, 4)
    assert Housekeeping().period_s == HOUSEKEEPING_S


async def test_ticks_of_a_write_burst_skip_the_clock_only_upkeep_and_still_run_it(tmp_path):
    nodes = start_nodes(tmp_path, SECRET)
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        for i in range(PROPOSALS):
            assert (await raft.propose({"type": "Barrier"}, f"rid-{i}", "system", timeout_s=WAIT_S))["ok"]
        await all_applied(nodes, leader, WAIT_S)
        for n in nodes:
            checks, upkeep = n.compaction_checks, shim.transport(n).housekeeping
            # Each write ticks a node two or three times within a millisecond or two (ticks that handled a message
            # are followed by another at once): most of them find the upkeep not due.
            assert checks.ran >= 1 and checks.skipped > 0, (checks.ran, checks.skipped)
            assert upkeep.ran >= 1 and upkeep.skipped > 0, (upkeep.ran, upkeep.skipped)
    finally:
        for n in nodes:
            n.stop()
