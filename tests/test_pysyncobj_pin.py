"""What meta/raft/pysyncobj_shim.py relies on in pysyncobj's code: these fail the day pysyncobj changes it.

The shim swaps in Stator's journal through the module-level ``createJournal`` that ``SyncObj.__init__`` calls,
applies entries through its replacement of the private ``__doApplyCommand``, and appends through the protected
``_applyCommand``. The version pin (``require_version``) stops a node on any other release; these checks say what
to review when the pin moves. And the log itself holds no pickle: an entry is the type byte and an envelope's JSON.
"""

from __future__ import annotations

import inspect
import json
import pathlib
import re

import pysyncobj.syncobj as syncobj_mod
from pysyncobj import SyncObj

from meta.raft import pysyncobj_shim as shim
from meta.raft.membership import MEMBERSHIP_COMMAND
from meta.raft.journal import read_journal
from tests.support.raft_nodes import all_applied, leader_of, start_nodes

REPO = pathlib.Path(__file__).resolve().parent.parent
PRIVATE = "_SyncObj" + "__"   # spelled in two pieces: only the shim may name pysyncobj's private attributes
# 24 once the journal and transport were Stator's (25 before); membership changes (meta/raft/roles.py, shim.set_members)
# need four more: pysyncobj's voters, read-only nodes, connected nodes and last response times; pre-votes
# (meta/raft/prevote.py) two: whether the leader asked for this campaign (a transfer), and the leader known, cleared
# when a newer term is heard; answering the proposals in flight when the leader changes (shim.answer_in_flight) one:
# the callbacks waiting for their commit; the tick on the event loop (meta/raft/loop_ticker.py) one: the module-level
# ``createPoller``, swapped like ``createJournal``; a follower's proposals sent at once and a mark's entries applied in
# its tick (MetaSyncObj._send_at_once, _apply_marked) two: the forwarded commands waiting for the leader's answer,
# and the apply pass pysyncobj runs only at a tick's start; its compaction check, run every few milliseconds instead
# of at every tick (shim.CompactionChecks, meta/raft/housekeeping.py: ~2% of a lone writer's writes a second), one;
# the only voter's commit on its own sync (LocalCommit.commit_alone, shim.commit_as_only_voter) one: the commit index,
# which pysyncobj moves only at a tick's start (a tick asked for instead cost one node at 64 writers 15-20% of its
# writes a second, and a lone writer 15%).
# A new one needs a reason as good.
PRIVATE_NAMES_MAX = 36


def test_sync_obj_creates_its_journal_and_poller_through_the_module_level_names_the_shim_swaps():
    assert callable(getattr(syncobj_mod, "createJournal", None))
    assert callable(getattr(syncobj_mod, "createPoller", None))
    source = inspect.getsource(SyncObj.__init__)
    assert "self.__raftLog = createJournal(self.__conf.journalFile)" in source
    # meta/raft/loop_ticker.py: the event loop watches what this poller does, and each tick ends in its poll
    assert "self._poller = createPoller(self.__conf.pollerType)" in source
    assert "self._poller.poll(timeToWait)" in inspect.getsource(SyncObj._onTick)


def test_the_compaction_check_the_shim_throttles_is_called_by_each_tick_and_nowhere_else():
    """shim.CompactionChecks replaces the private method each tick ends with; were it called elsewhere (or not from
    the tick), the throttle would hold back something else, or nothing."""
    name = PRIVATE + "tryLogCompaction"
    assert callable(getattr(SyncObj, name, None))
    assert "self.__tryLogCompaction()" in inspect.getsource(SyncObj._onTick)
    assert inspect.getsource(syncobj_mod).count("self.__tryLogCompaction()") == 1


def test_learners_get_appends_and_only_voters_count_as_shim_set_members_relies_on():
    """Read-only nodes (our learners) are sent the log; the commit, the step-down and elections count voters only;
    acknowledgements go through the private method ``shim.Acknowledgements`` replaces."""
    sending = inspect.getsource(getattr(SyncObj, PRIVATE + "sendAppendEntries"))
    assert "for node in self.__otherNodes | self.__readonlyNodes:" in sending
    ticking = inspect.getsource(SyncObj._onTick)
    assert ticking.count("for node in self.__otherNodes:") == 3 and "__readonlyNodes" not in ticking
    assert "self.__sendNextNodeIdx(node, nextNodeIdx=nextNodeIdx, success=True)" in inspect.getsource(
        getattr(SyncObj, PRIVATE + "onMessageReceived"))
    assert list(inspect.signature(getattr(SyncObj, PRIVATE + "sendNextNodeIdx")).parameters) == [
        "self", "node", "reset", "nextNodeIdx", "success"]


def test_entries_are_applied_through_the_private_method_the_shim_replaces():
    assert callable(getattr(SyncObj, PRIVATE + "doApplyCommand", None))
    applying = inspect.getsource(getattr(SyncObj, PRIVATE + "applyLogEntries"))
    assert "self.__doApplyCommand(entry[0])" in applying
    assert list(inspect.signature(SyncObj._applyCommand).parameters) == ["self", "command", "callback", "commandType"]
    assert "transportClass" in inspect.signature(SyncObj.__init__).parameters


def test_the_shim_names_fewer_private_names_than_before():
    text = (REPO / "meta" / "raft" / "pysyncobj_shim.py").read_text()
    names = set(re.findall(PRIVATE + r"[A-Za-z]+", text)) | set(re.findall(r"_syncobj_mod\.([A-Za-z]+)", text))
    assert len(names) <= PRIVATE_NAMES_MAX, sorted(names)


async def test_the_log_holds_the_type_byte_and_json_never_a_pickle(tmp_path):
    nodes = start_nodes(tmp_path, "pin-test-secret")
    try:
        leader, raft = await leader_of(nodes, 15.0)
        outcome = await raft.propose({"type": "Barrier"}, "rid-pin", "system")
        assert outcome["ok"], outcome
        await all_applied(nodes, leader, 15.0)
    finally:
        for n in nodes:
            n.stop()
    for i in range(3):
        entries = read_journal(str(tmp_path / f"n{i}")).entries
        kept = [command for command, _index, _term in entries if command != shim.NO_OP_COMMAND]
        regular = [command for command in kept if command[:1] == bytes([shim.REGULAR_COMMAND])]
        assert regular, f"node {i} holds no envelope"
        # Besides the envelopes, only the bootstrap's membership entry (meta/raft/membership.py), in JSON too.
        others = [command for command in kept if command[:1] != bytes([shim.REGULAR_COMMAND])]
        assert [command[:1] for command in others] == [bytes([MEMBERSHIP_COMMAND])], others
        assert json.loads(others[0][1:].split(b"\n")[1])["cmd"]["reason"] == "bootstrap"
        for command in regular:
            stamp, envelope = (json.loads(line) for line in command[1:].split(b"\n"))   # two lines of JSON
            assert set(stamp) == {"ts", "budget", "history"}
            assert envelope["rid"] == "rid-pin" and envelope["cmd"] == {"type": "Barrier"}


def test_postponing_an_election_never_brings_it_earlier():
    """A learner pushes its election at least 1 s ahead at every tick (meta/raft/roles.py). Once it may vote, the
    election timeout it was configured with must stand: a hold that *set* the deadline left it a second away, and a
    two-node cluster configured for 30 s elections elected a leader within 2 s (tests/test_startup.py's never-ready
    cluster, about half the runs)."""
    from pysyncobj import SyncObjConf
    from pysyncobj.monotonic import monotonic

    from ops import devcluster

    so = SyncObj(f"127.0.0.1:{devcluster.free_base_port()}", [],
                 SyncObjConf(autoTick=False, raftMinTimeout=30.0, raftMaxTimeout=31.0, connectionTimeout=31.0))
    try:
        assert shim.leader_out_of_reach(so) is False   # the deadline is where pysyncobj put it, ~30 s ahead
        shim.postpone_election(so, 1.0)
        assert getattr(so, PRIVATE + "raftElectionDeadline") > monotonic() + 25.0
        shim.postpone_election(so, 60.0)
        assert getattr(so, PRIVATE + "raftElectionDeadline") > monotonic() + 55.0
    finally:
        so.destroy()


def test_restarting_the_election_timer_draws_a_configured_timeout_whatever_hold_was_left():
    """A learner that becomes a voter drops its hold (meta/raft/roles.py): left in place, it delayed every first
    election of a new cluster by a second. The deadline it gets is one of its own configured timeouts, never less."""
    from pysyncobj import SyncObjConf
    from pysyncobj.monotonic import monotonic

    from ops import devcluster

    so = SyncObj(f"127.0.0.1:{devcluster.free_base_port()}", [],
                 SyncObjConf(autoTick=False, raftMinTimeout=30.0, raftMaxTimeout=31.0, connectionTimeout=31.0))
    try:
        shim.postpone_election(so, 60.0)
        before = monotonic()
        shim.restart_election_timer(so)
        deadline = getattr(so, PRIVATE + "raftElectionDeadline")
        assert before + 30.0 <= deadline <= monotonic() + 31.0
    finally:
        so.destroy()
