"""The leader's decisions in meta/raft/roles.py that need no running raft, at their edges: when a voter counts as
live for the quorum check of an operator's change, what the refusal names, when a learner counts as caught up, and
where a member's URL comes from. The clock is the module's own (``time.monotonic``), held still here so that an
edge is exactly on its bound; the raft object is the few fields these decisions read.
tests/test_raft_operator_changes.py drives the same on three real nodes; this is what pins the bounds.
"""

from __future__ import annotations

import types

import pytest

from meta.raft import membership
from meta.raft import roles as raft_roles
from meta.raft.journal import StatorJournal
from wire.errors import ApiError

NOW = 1_000.0
DISKS = {n: f"{i:032x}" for i, n in enumerate(("a", "b", "c", "d", "e"), start=1)}


@pytest.fixture
def still_clock(monkeypatch):
    monkeypatch.setattr(raft_roles, "time", types.SimpleNamespace(monotonic=lambda: NOW))


def voter(name: str) -> membership.Member:
    return membership.Member(raft=f"127.0.0.1:{ord(name)}", name=name, disk=DISKS[name], url=None, voter=True)


def leader_roles(commit_index: int = 0) -> raft_roles.Roles:
    """The Roles of node "a", leading since long ago."""
    so = types.SimpleNamespace(raftCommitIndex=commit_index)
    roles = raft_roles.Roles(so, "a", {}, {}, DISKS["a"])
    roles._leading = (1, NOW - 10 * raft_roles.LIVE_WITHIN_S)
    return roles


def refusal(roles: raft_roles.Roles, changed, name: str) -> tuple[int, str, str, dict] | None:
    try:
        roles._refuse_quorum_loss(tuple(changed), name)
    except ApiError as e:
        return e.status, e.code, e.message, e.details
    return None


def test_a_voter_heard_exactly_live_within_ago_counts_as_live_and_one_heard_before_does_not(still_clock):
    roles = leader_roles()
    members = [voter(n) for n in ("a", "b", "c")]
    roles._heard["b"] = (DISKS["b"], NOW - raft_roles.LIVE_WITHIN_S)
    assert refusal(roles, members, "x") is None   # a and b live of three
    roles._heard["b"] = (DISKS["b"], NOW - raft_roles.LIVE_WITHIN_S - 0.001)
    assert refusal(roles, members, "x")[:2] == (409, "WOULD_LOSE_QUORUM")
    roles._heard["b"] = (DISKS["c"], NOW)   # heard, but from another disk than the log names
    assert refusal(roles, members, "x")[:2] == (409, "WOULD_LOSE_QUORUM")


def test_the_refusal_names_every_voter_not_heard_and_the_learner_being_promoted_counts_as_live(still_clock):
    roles = leader_roles()
    # a (the leader) and d (the learner promoted) live, b and c silent: 2 of 4, no majority
    members = [voter(n) for n in ("a", "b", "c", "d")]
    assert refusal(roles, members, "d") == (
        409, "WOULD_LOSE_QUORUM", "after this change 4 voters would need 3, and b, c did not answer from the disk "
        "the log names: bring them back (or remove them) first", {"node": "d", "not_live": ["b", "c"]})
    # a and the promoted c of three: a majority, though c was never heard (it just reported its progress)
    assert refusal(roles, [voter(n) for n in ("a", "b", "c")], "c") is None
    # the leader itself is live only on the disk the log names for it
    roles.disk = DISKS["e"]
    assert refusal(roles, [voter(n) for n in ("a", "b", "c")], "c") == (
        409, "WOULD_LOSE_QUORUM", "after this change 3 voters would need 2, and a, b did not answer from the disk "
        "the log names: bring them back (or remove them) first", {"node": "c", "not_live": ["a", "b"]})


def test_a_leader_of_less_than_live_within_says_it_has_not_heard_yet_and_one_of_exactly_that_refuses(still_clock):
    roles = leader_roles()
    members = [voter(n) for n in ("a", "b", "c", "d")]
    roles._leading = (1, NOW - raft_roles.LIVE_WITHIN_S + 0.5)
    assert refusal(roles, members, "x") == (
        503, "LEADER_CHANGED", f"this node leads for {raft_roles.LIVE_WITHIN_S - 0.5:.1f} s only and has not heard "
        "from b, c, d yet; retry shortly", {"node": "x", "not_live": ["b", "c", "d"]})
    roles._leading = (1, NOW - raft_roles.LIVE_WITHIN_S)
    assert refusal(roles, members, "x")[:2] == (409, "WOULD_LOSE_QUORUM")
    roles._leading = None   # not leading (never asked so: the leader's tick sets it first), refused all the same
    assert refusal(roles, members, "x")[:2] == (409, "WOULD_LOSE_QUORUM")


def test_a_learner_exactly_the_lag_bound_behind_is_caught_up_and_one_more_is_not():
    roles = leader_roles(commit_index=5_000)
    bound = 5_000 - raft_roles.PROMOTION_LAG_ENTRIES_MAX
    assert roles._caught_up((DISKS["d"], bound)) is True
    assert roles._caught_up((DISKS["d"], bound - 1)) is False


def test_a_member_s_url_comes_from_the_config_then_from_the_membership_and_is_none_before_any():
    roles = raft_roles.Roles(None, "a", {"127.0.0.1:1": "a", "127.0.0.1:2": "b"}, {"b": "http://b.config"},
                             DISKS["a"])
    assert roles.url_of("127.0.0.1:2") == "http://b.config"
    assert roles.url_of("127.0.0.1:9") is None   # no membership yet: nobody to ask
    c = membership.Member(raft="127.0.0.1:9", name="c", disk=None, url="http://c.log", voter=False)
    roles.current = (3, (c,))
    assert roles.url_of("127.0.0.1:9") == "http://c.log"
    assert roles.url_of("127.0.0.1:8") is None


def test_requests_beyond_the_bound_are_refused_at_once_and_the_ones_within_wait_for_the_tick():
    woken = []
    roles = raft_roles.Roles(types.SimpleNamespace(wake=lambda: woken.append(1)), "a", {}, {}, DISKS["a"])
    waiting = [roles.request("add", f"n{i}", f"127.0.0.1:{i + 1}", None) for i in range(raft_roles.REQUESTS_MAX)]
    assert not any(f.done() for f in waiting) and len(woken) == raft_roles.REQUESTS_MAX
    over = roles.request("add", "late", "127.0.0.1:99", None)
    e = over.exception(timeout=0)
    assert (e.status, e.code, e.message) == (
        409, "MEMBERSHIP_CHANGE_IN_PROGRESS", f"{raft_roles.REQUESTS_MAX} membership changes are already waiting")
    assert len(woken) == raft_roles.REQUESTS_MAX   # a refused one wakes nobody


def test_a_learner_that_lags_is_not_promoted_and_the_refusal_says_where_it_stands():
    roles = leader_roles(commit_index=5_000)
    d = membership.Member(raft="127.0.0.1:100", name="d", disk=None, url=None, voter=False)
    members = (voter("a"), voter("b"), voter("c"), d)
    promote = raft_roles._Request("promote", "d", None, None, None)
    roles._learners["d"] = (DISKS["d"], 5_000 - raft_roles.PROMOTION_LAG_ENTRIES_MAX - 1)
    with pytest.raises(ApiError) as e:
        roles._operator_change(promote, members)
    assert (e.value.status, e.value.code, e.value.details) == (409, "NOT_CAUGHT_UP", {
        "node": "d", "holds": 5_000 - raft_roles.PROMOTION_LAG_ENTRIES_MAX - 1, "commit_index": 5_000})
    del roles._learners["d"]   # never heard
    with pytest.raises(ApiError) as e:
        roles._operator_change(promote, members)
    assert e.value.details == {"node": "d", "holds": None, "commit_index": 5_000}


def test_a_learner_promoted_counts_as_live_though_never_heard_by_keepalive():
    # b is silent; a (the leader) and c, the learner being promoted, which reported its progress: two of three
    roles = leader_roles(commit_index=100)
    c = membership.Member(raft="127.0.0.1:99", name="c", disk=None, url=None, voter=False)
    roles._learners["c"] = (DISKS["c"], 100)
    changed = roles._operator_change(raft_roles._Request("promote", "c", None, None, None), (voter("a"), voter("b"), c))
    assert membership.by_name(changed, "c") == membership.Member(raft="127.0.0.1:99", name="c", disk=DISKS["c"],
                                                                 url=None, voter=True)


def test_a_member_is_reached_at_the_address_its_config_names_then_at_the_one_the_log_records():
    roles = raft_roles.Roles(None, "a", {"10.0.0.2:7001": "b"}, {}, DISKS["a"])
    assert roles.address_of(voter("b")) == "10.0.0.2:7001"   # a proxy, NAT: the config's, not the log's
    assert roles.address_of(voter("c")) == voter("c").raft
    assert roles.name_of("10.0.0.2:7001") == "b"
    assert roles.name_of(voter("c").raft) == voter("c").raft   # nobody knows it: named by its address
    roles.current = (3, (voter("c"),))
    assert roles.name_of(voter("c").raft) == "c"


@pytest.mark.parametrize("membership_entry, last_index, empty", [
    (False, 1, True),    # pysyncobj's first no-op only: a directory that never took part in a cluster
    (False, 0, True),
    (False, 2, False),   # an entry past it: it took part in a bootstrap whose membership it has not seen yet
    (True, 1, False),    # a snapshot's membership (the base), installed with nothing after it
])
def test_a_log_is_empty_only_with_no_membership_and_nothing_past_the_first_no_op(membership_entry, last_index,
                                                                                   empty):
    trail = membership.MembershipTrail()
    if membership_entry:
        trail.set_base(1, (voter("a"),))
    journal = StatorJournal.__new__(StatorJournal)   # only its trail is read
    journal.membership = trail
    so = types.SimpleNamespace(_SyncObj__raftLog=journal, _SyncObj__getCurrentLogIndex=lambda: last_index)
    assert raft_roles.Roles(so, "a", {}, {}, DISKS["a"]).log_is_empty() is empty
