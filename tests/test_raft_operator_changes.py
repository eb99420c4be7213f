"""An operator's membership changes (meta/raft/roles.py ``Roles.request``: add, promote, remove), decided on the
leader's tick, on three real MetaSyncObj nodes in this process (tests/support/raft_nodes.py: real pysyncobj, real TCP
on loopback). tests/test_meta_members.py drives the same over HTTP on real processes; these run in the test's
process, where a mutant of roles.py (bash ops/mutation.sh meta/raft/roles.py) is what runs.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import structlog
from pysyncobj.node import TCPNode

from meta.raft import membership
from meta.raft import roles as raft_roles
from meta.raft.node import LoopBridge, MetaSyncObj, RaftTuning
from ops import devcluster
from tests.support.raft_nodes import leader_of, start_nodes
from wire.errors import ApiError

SECRET = "operator-changes-test-secret"
WAIT_S = 20.0
CHANGE_S = 10.0   # one change: the leader's next tick proposes it, a majority commits it


async def change(leader: MetaSyncObj, op: str, name: str, raft: str | None = None,
                 url: str | None = None) -> list[dict]:
    return await asyncio.wait_for(asyncio.wrap_future(leader.roles.request(op, name, raft, url)), CHANGE_S)


async def refused(leader: MetaSyncObj, op: str, name: str, raft: str | None = None) -> ApiError:
    with pytest.raises(ApiError) as e:
        await change(leader, op, name, raft)
    return e.value


def members_of(node: MetaSyncObj) -> dict[str, tuple[str | None, bool]]:
    return {m["name"]: (m["disk"], m["voter"]) for m in node.membership_status()["members"]}


async def until(what, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "not within the wait"
        await asyncio.sleep(0.05)


def unused_raft_addresses(n: int) -> list[str]:
    """``n`` distinct raft addresses where nothing listens (n <= 14: a base port's free span)."""
    base = devcluster.free_base_port()
    return [f"127.0.0.1:{base + i}" for i in range(n)]


def unused_raft_address() -> str:
    return unused_raft_addresses(1)[0]


@pytest.fixture
async def nodes(tmp_path):
    started = start_nodes(tmp_path, SECRET)   # ticking on the test's loop
    yield started
    for n in started:
        n.stop()


def whole(e: ApiError) -> tuple[int, str, str, dict]:
    """What an operator sees of a refusal (API.md's error body and its HTTP status)."""
    return e.status, e.code, e.message, e.details


async def test_refusals_name_what_is_wrong_and_change_nothing(nodes):
    leader, _ = await leader_of(nodes, WAIT_S)
    voter = next(n for n in nodes if n is not leader).roles.name
    before = members_of(leader)
    assert whole(await refused(leader, "add", voter, unused_raft_address())) == (
        409, "MEMBER_EXISTS", f"{voter!r} is already a member", {"node": voter})
    # the names are the raft addresses here
    assert whole(await refused(leader, "add", "another-name", voter)) == (
        409, "MEMBER_EXISTS", f"another member has raft address {voter}", {"raft": voter})
    for op in ("promote", "remove"):
        assert whole(await refused(leader, op, "nobody")) == (
            404, "MEMBER_NOT_FOUND", "'nobody' is not a member", {"node": "nobody"})
    assert whole(await refused(leader, "promote", voter)) == (
        409, "ALREADY_VOTER", f"{voter!r} is a voter already", {"node": voter})
    assert members_of(leader) == before
    assert leader.roles.heard_from(voter) and not leader.roles.heard_from("nobody")


async def test_learners_are_added_and_removed_up_to_the_members_bound(nodes):
    leader, _ = await leader_of(nodes, WAIT_S)
    *learners, one_more = unused_raft_addresses(membership.MEMBERS_MAX - len(nodes) + 1)
    for name in learners:
        after = await change(leader, "add", name, name, url=f"http://{name}")
        added = next(m for m in after if m["name"] == name)
        assert added == {"raft": name, "name": name, "disk": None, "url": f"http://{name}", "voter": False}
    assert len(members_of(leader)) == membership.MEMBERS_MAX
    # where the leader forwards to a member: the URL the membership records (the config names none here)
    assert leader.roles.url_of(learners[1]) == f"http://{learners[1]}" and leader.roles.url_of(one_more) is None
    assert whole(await refused(leader, "add", "one-more", one_more)) == (
        409, "TOO_MANY_MEMBERS", f"a cluster has at most {membership.MEMBERS_MAX} members", {})
    # Nothing runs at a learner's address: it never reported, so it cannot be promoted
    status, code, message, details = whole(await refused(leader, "promote", learners[0]))
    assert (status, code, details) == (409, "NOT_CAUGHT_UP", {"node": learners[0], "holds": None,
                                                               "commit_index": leader.raftCommitIndex})
    assert message == f"{learners[0]!r} has not caught up with the log yet (is it running?); retry once it has"
    after = await change(leader, "remove", learners[0])
    assert learners[0] not in {m["name"] for m in after} and len(after) == membership.MEMBERS_MAX - 1
    # Every node holds the same membership once it applied the change
    await until(lambda: all(members_of(n) == members_of(leader) for n in nodes))
    voters = {n.roles.name for n in nodes}
    assert {name for name, (_disk, voter) in members_of(leader).items() if voter} == voters


async def test_a_learner_that_caught_up_is_promoted_with_the_disk_it_runs_on(nodes, tmp_path):
    leader, raft = await leader_of(nodes, WAIT_S)
    for i in range(20):
        assert (await raft.propose({"type": "Barrier"}, f"rid-{i}", "system"))["ok"]
    address = unused_raft_address()
    await change(leader, "add", address, address)
    learner = MetaSyncObj(address, [n.roles.name for n in nodes], str(tmp_path / "learner"), SECRET, RaftTuning(),
                          lambda version, changed: None, LoopBridge())
    learner.start()
    try:
        # It gets the log as a learner: it never votes, and the leader does not count it
        await until(lambda: learner.applied_index >= leader.applied_index)
        assert learner.membership_status()["voter"] is False
        assert members_of(leader)[address] == (None, False)
        # Promoted only once the leader heard it hold the log: a change that arrives early is refused, and retried
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                after = await change(leader, "promote", address)
                break
            except ApiError as e:
                assert e.code == "NOT_CAUGHT_UP" and time.monotonic() < deadline, e
                await asyncio.sleep(0.2)
        promoted = next(m for m in after if m["name"] == address)
        assert promoted["voter"] and promoted["disk"] == learner.membership_status()["disk"]
        await until(lambda: learner.membership_status()["voter"] is True)
        # Four voters: a write commits with three, so one stopped follower does not stop the log
        assert (await raft.propose({"type": "Barrier"}, "rid-after", "system"))["ok"]
    finally:
        learner.stop()


async def test_a_learner_is_promoted_on_the_progress_it_reported_and_with_the_disk_it_named(nodes):
    """The leader keeps, per learner, the disk it runs on and the last index it holds, from its learner_progress
    messages (what Roles.acknowledge sends instead of pysyncobj's acknowledgement); reported here by hand for a
    learner at an address where nothing runs."""
    leader, _ = await leader_of(nodes, WAIT_S)
    address = unused_raft_address()
    after = await change(leader, "add", address, address, url="http://learner")
    index = leader.membership_status()["membership_index"]
    await until(lambda: leader.roles._learners_since == index)   # the leader's tick forgot older progress
    disk, other_disk = "d" * 32, "e" * 32

    def report(message: dict, to: MetaSyncObj = leader) -> tuple[str, int] | None:
        assert to.roles.admit(TCPNode(address), {"type": "learner_progress", **message}) is False
        return to.roles._learners.get(address)

    assert report({"next": 0, "success": True, "disk": disk}) is None        # no index below 1
    assert report({"next": "7", "success": True, "disk": disk}) is None      # not a number
    assert report({"next": 7, "success": True, "disk": "not-a-disk"}) is None
    assert report({"next": 7, "success": True, "disk": disk}, to=next(n for n in nodes if n is not leader)) is None
    assert report({"next": 1, "success": True, "disk": disk}) == (disk, 0)
    assert report({"next": 12, "success": True, "disk": disk}) == (disk, 11)
    assert report({"next": 5, "success": False, "disk": disk}) == (disk, 11)   # a refused append: it holds as before
    assert report({"next": 5, "disk": disk}) == (disk, 11)
    assert report({"next": 5, "success": False, "disk": other_disk}) == (other_disk, 0)   # another disk: nothing
    assert report({"next": leader.raftCommitIndex + 1, "success": True, "disk": disk}) == (
        disk, leader.raftCommitIndex)
    after = await change(leader, "promote", address)
    assert next(m for m in after if m["name"] == address) == {"raft": address, "name": address, "disk": disk,
                                                              "url": "http://learner", "voter": True}


async def test_a_removal_that_would_leave_no_live_majority_is_refused(nodes):
    leader, _ = await leader_of(nodes, WAIT_S)
    stopped, live = [n for n in nodes if n is not leader]
    learner = unused_raft_address()
    await change(leader, "add", learner, learner)
    stopped.stop()
    nodes.remove(stopped)   # the fixture stops the rest
    # Once the leader has not heard the stopped voter for LIVE_WITHIN_S, removing the live one would leave the leader
    # and a dead voter: no majority could ever be elected again
    await asyncio.sleep(raft_roles.LIVE_WITHIN_S + 1.0)
    assert whole(await refused(leader, "remove", live.roles.name)) == (
        409, "WOULD_LOSE_QUORUM", f"after this change 2 voters would need 2, and {stopped.roles.name} did not "
        "answer from the disk the log names: bring them back (or remove them) first",
        {"node": live.roles.name, "not_live": [stopped.roles.name]})
    # A learner's removal leaves the three voters, two of them live: a majority
    after = await change(leader, "remove", learner)
    assert learner not in {m["name"] for m in after}
    # A leader that has led for less than LIVE_WITHIN_S may not have heard every live voter yet: it answers that,
    # not WOULD_LOSE_QUORUM (here the live one leads now, and the stopped voter is indeed down)
    leader.transferLeadership()
    new_leader, _ = await leader_of([live], WAIT_S)
    status, code, message, details = whole(await refused(new_leader, "remove", leader.roles.name))
    assert (status, code, details) == (503, "LEADER_CHANGED", {"node": leader.roles.name,
                                                                "not_live": [stopped.roles.name]})
    assert message.startswith("this node leads for ") and message.endswith(
        f" s only and has not heard from {stopped.roles.name} yet; retry shortly")
    # Removing the dead one leaves two live voters of two: allowed
    after = await change(new_leader, "remove", stopped.roles.name)
    assert {m["name"] for m in after} == {leader.roles.name, live.roles.name}
    # Down to one voter, which cannot be removed
    after = await change(new_leader, "remove", leader.roles.name)
    assert [m["name"] for m in after] == [live.roles.name]
    assert whole(await refused(new_leader, "remove", live.roles.name)) == (
        409, "LAST_VOTER", f"{live.roles.name!r} is the last voter", {"node": live.roles.name})


async def test_a_leader_asked_to_remove_itself_hands_over_first(nodes):
    leader, _ = await leader_of(nodes, WAIT_S)
    handing = await refused(leader, "remove", leader.roles.name)
    assert isinstance(handing, raft_roles.HandingOver) and whole(handing) == (
        503, "LEADER_CHANGED", "the leader hands its leadership over before it is removed; retry",
        {"node": leader.roles.name})
    new_leader, _ = await leader_of([n for n in nodes if n is not leader], WAIT_S)
    after = await change(new_leader, "remove", leader.roles.name)
    assert leader.roles.name not in {m["name"] for m in after}
    await until(lambda: leader.roles.removed)


async def test_a_voter_removed_while_stopped_learns_it_when_it_starts_again(nodes, tmp_path):
    # The removal commits on the two others while the removed node is down: it never got the entry. The leader goes
    # on sending it the log until it holds that entry (the peers refuse it as unknown), and it knows it was removed.
    leader, _ = await leader_of(nodes, WAIT_S)
    gone = next(n for n in nodes if n is not leader)
    i = nodes.index(gone)
    address, partners = gone.selfNode.address, [n.address for n in gone.otherNodes]
    gone.stop()
    after = await change(leader, "remove", gone.roles.name)
    assert gone.roles.name not in {m["name"] for m in after}
    removal_index = leader.roles.current[0]
    with structlog.testing.capture_logs() as logs:
        again = MetaSyncObj(address, partners, str(tmp_path / f"n{i}"), SECRET, RaftTuning(),
                            lambda version, changed: None, LoopBridge())
        again.start()
        nodes[i] = again   # the fixture stops it
        await until(lambda: again.roles.removed)
        # and once it holds its removal, the leader stops sending to it
        await until(lambda: address not in {n.address for n in leader.readonlyNodes})
        await asyncio.sleep(0.5)   # many ticks: the warning is said once, when the node learns it
    assert not any(n.roles.removed for n in nodes if n is not again)
    removed = [e for e in logs if e["event"] == "raft_membership_removed"]
    assert [{k: e.get(k) for k in ("log_level", "membership_index", "members", "hint")} for e in removed] == [{
        "log_level": "warning", "membership_index": removal_index, "members": [m["name"] for m in after],
        "hint": "the node no longer gets the log and refuses requests (NOT_A_MEMBER): stop it, or add it again"}]
