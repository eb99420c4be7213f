"""meta/raft/roles.py's decisions at their edges, without a running raft (0.25 s for all; mutmut's harness of the
module with tests/test_raft_operator_changes.py and the simulator, which reach every line but seldom an edge):

- the leader's: when a voter counts as live for the quorum check of an operator's change (to the clock's last
  digit, on a clock the test holds or moves), what each refusal says, when a learner counts as caught up, the bound
  on waiting requests, which removed members still get the log;
- a change of role, through ``RecordingShim``: the few pysyncobj calls ``Roles`` makes, answered from fields and
  recorded (the vote a promoted node keeps, the learner's hold, the restart grace, the leader that steps down, a
  first start's voter that keeps voting on its disk);
- messages: keepalives taken only whole, a learner dropping vote requests, its progress acknowledgement, the
  keepalive intervals.
tests/test_raft_operator_changes.py drives the same on three real nodes; this is what pins the bounds.
"""

from __future__ import annotations

import concurrent.futures
import types

import pytest
import structlog
from pysyncobj import FAIL_REASON
from pysyncobj.node import TCPNode

from meta.raft import membership
from meta.raft import pysyncobj_shim as real_shim
from meta.raft import roles as raft_roles
from meta.raft.entry import encode_stamp
from wire.errors import ApiError

NOW = 1_000.0
DISKS = {n: f"{i:032x}" for i, n in enumerate(("a", "b", "c", "d", "e"), start=1)}


@pytest.fixture
def clock(monkeypatch):
    """The module's clock (``time.monotonic``): at NOW until the test moves it."""
    now = types.SimpleNamespace(s=NOW)
    monkeypatch.setattr(raft_roles, "time", types.SimpleNamespace(monotonic=lambda: now.s))
    return now


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


def test_a_voter_heard_exactly_live_within_ago_counts_as_live_and_one_heard_before_does_not(clock):
    roles = leader_roles()
    members = [voter(n) for n in ("a", "b", "c")]
    roles._heard["b"] = (DISKS["b"], NOW - raft_roles.LIVE_WITHIN_S)
    assert refusal(roles, members, "x") is None   # a and b live of three
    roles._heard["b"] = (DISKS["b"], NOW - raft_roles.LIVE_WITHIN_S - 0.001)
    assert refusal(roles, members, "x")[:2] == (409, "WOULD_LOSE_QUORUM")
    roles._heard["b"] = (DISKS["c"], NOW)   # heard, but from another disk than the log names
    assert refusal(roles, members, "x")[:2] == (409, "WOULD_LOSE_QUORUM")


def test_the_refusal_names_every_voter_not_heard_and_the_learner_being_promoted_counts_as_live(clock):
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


def test_a_leader_of_less_than_live_within_says_it_has_not_heard_yet_and_one_of_exactly_that_refuses(clock):
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
def test_a_log_is_empty_only_with_no_membership_and_nothing_past_the_first_no_op(raft, membership_entry, last_index,
                                                                                   empty):
    trail, shim, roles = raft
    if membership_entry:
        trail.set_base(1, (voter("a"),))
    shim.last_index = last_index
    assert roles.log_is_empty() is empty


class FoundingJournal:
    """What Roles reads of the journal (meta/raft/journal.py StatorJournal): the membership trail, and the mark of a
    voter at the cluster's first start, counted."""

    def __init__(self, trail: membership.MembershipTrail):
        self.membership = trail
        self.founding_voter = False
        self.marks = 0

    def mark_founding_voter(self) -> None:
        self.founding_voter = True
        self.marks += 1


class RecordingShim:
    """The few calls decide() makes into pysyncobj (meta/raft/pysyncobj_shim.py), answered from fields and recorded:
    what a change of role does to raft is what these tests read."""

    def __init__(self, trail: membership.MembershipTrail, so):
        self.so = so
        self.journal = FoundingJournal(trail)
        self.leading = False
        self.leader_id: str | None = None
        self.vote: str | None = None
        self.matches: dict[str, int] = {}
        self.last_index = 1
        self.calls: list[tuple] = []

    def _asked(self, so) -> None:
        assert so is self.so, f"asked about {so!r}, not this node's SyncObj"

    def journal_of(self, so):
        self._asked(so)
        return self.journal

    def is_leader(self, so):
        self._asked(so)
        return self.leading

    def leader(self, so):
        self._asked(so)
        return types.SimpleNamespace(id=self.leader_id) if self.leader_id else None

    def voted_for(self, so):
        self._asked(so)
        return self.vote

    def match_indexes(self, so):
        self._asked(so)
        return dict(self.matches)

    def current_log_index(self, so):
        self._asked(so)
        return self.last_index

    def __getattr__(self, name):   # set_voted_for, step_down, restart_election_timer, postpone_election, set_members
        if not callable(getattr(real_shim, name, None)):   # the real shim's names only: a fake that drifts fails
            raise AttributeError(f"meta/raft/pysyncobj_shim.py has no {name}")
        return lambda so, *args: self.calls.append((name, *args) if so is self.so else (name, "another", so, *args))


def test_the_recording_shim_answers_only_for_functions_the_real_shim_has():
    answered = [n for n in vars(RecordingShim) if not n.startswith("_")]
    assert answered and all(callable(getattr(real_shim, n, None)) for n in answered), answered
    with pytest.raises(AttributeError):
        RecordingShim(membership.MembershipTrail(), None).no_such_call


def learner(name: str) -> membership.Member:
    return membership.Member(raft=f"127.0.0.1:{ord(name)}", name=name, disk=DISKS[name], url=None, voter=False)


@pytest.fixture
def raft(monkeypatch):
    trail = membership.MembershipTrail()
    so = types.SimpleNamespace(raftCommitIndex=100, raftCurrentTerm=1, otherNodes=())
    shim = RecordingShim(trail, so)
    monkeypatch.setattr(raft_roles, "shim", shim)
    roles = raft_roles.Roles(so, "a", {}, {}, DISKS["a"])
    return trail, shim, roles


def changes(shim: RecordingShim) -> list[tuple]:
    """The calls that change raft's state, not the members it sends to (set_members) nor the learner's hold."""
    return [c for c in shim.calls if c[0] not in ("set_members", "postpone_election")]


def test_a_node_promoted_to_voter_keeps_the_vote_its_term_s_leader_may_have_won_with(raft):
    trail, shim, roles = raft
    shim.leader_id, shim.vote = "b-id", None
    trail.set_base(5, (voter("a"), voter("b")))
    with structlog.testing.capture_logs() as logs:
        roles.decide()
        roles.decide()   # no change of role: nothing more
    assert roles.voter is True and changes(shim) == [("set_voted_for", "b-id")]
    # raft's view is set once per membership, not at every tick (it drops and dials links)
    assert [c for c in shim.calls if c[0] == "set_members"] == [("set_members", {TCPNode(voter("b").raft)}, set())]
    assert [(e["event"], e["role"], e["membership_index"]) for e in logs] == [("raft_membership_role", "voter", 5)]


def test_a_node_that_starts_a_voter_keeps_its_restart_grace(raft):
    trail, shim, roles = raft
    trail.set_base(5, (voter("a"), voter("b")))
    roles.decide()   # no leader known yet: its election timer is the one node.py postponed at start
    assert changes(shim) == []


def test_a_voter_that_voted_in_this_term_keeps_its_vote_and_one_without_a_leader_keeps_its_own(raft):
    trail, shim, roles = raft
    shim.leader_id, shim.vote = "b-id", "c-id"
    trail.set_base(5, (voter("a"), voter("b")))
    roles.decide()
    assert changes(shim) == []
    trail.set_base(6, (learner("a"), voter("b")))
    roles.decide()
    shim.leader_id, shim.vote, shim.calls = None, None, []
    trail.set_base(7, (voter("a"), voter("b")))
    roles.decide()
    # no leader to keep a vote for; the learner's hold is replaced by a voter's election timeout
    assert changes(shim) == [("restart_election_timer",)]


def test_a_learner_holds_its_elections_at_every_tick_and_a_new_voter_campaigns_on_a_voter_s_timeout(raft):
    trail, shim, roles = raft
    trail.set_base(5, (learner("a"), voter("b")))
    roles.decide()
    roles.decide()
    assert roles.voter is False   # as it started: no change of role to log
    assert shim.calls.count(("postpone_election", raft_roles.LEARNER_ELECTION_HOLD_S)) == 2
    trail.set_base(6, (voter("a"), voter("b")))
    shim.calls = []
    roles.decide()
    assert changes(shim) == [("restart_election_timer",)]
    # a voter demoted again and promoted again, under a leader this time: its hold is not the timer's business
    trail.set_base(7, (learner("a"), voter("b")))
    roles.decide()
    shim.leader_id, shim.vote, shim.calls = "b-id", "b-id", []
    trail.set_base(8, (voter("a"), voter("b")))
    roles.decide()
    assert changes(shim) == []


def test_a_first_start_voter_stays_one_on_its_disk_once_a_peer_has_a_log_and_a_new_disk_does_not(raft):
    # The simulator's seed 282 --l2 (no fault): the first leader won a term its peers had already left, appended,
    # and never reached them; they heard it was no longer fresh and became learners, and no leader could ever be
    # elected again. A disk that counted itself a voter at the first start keeps counting (journal.founding_voter).
    trail, shim, roles = raft
    b, c = TCPNode(voter("b").raft), TCPNode(voter("c").raft)
    roles.so.otherNodes = (b, c)
    roles._peers = {b.address: (DISKS["b"], True)}
    roles.decide()
    assert roles.voter is False and shim.journal.marks == 0   # c not heard yet
    roles._peers[c.address] = (DISKS["c"], True)
    roles.decide()
    assert roles.voter is True and shim.journal.marks == 1   # every peer heard, every one fresh: a first start
    roles._peers[b.address] = (DISKS["b"], False)
    roles.decide()
    assert roles.voter is True and shim.journal.marks == 1   # marked once, and still a voter
    restarted = raft_roles.Roles(roles.so, "a", {}, {}, DISKS["a"])
    restarted._peers = dict(roles._peers)
    restarted.decide()
    assert restarted.voter is True and shim.journal.marks == 1   # the same disk after a restart
    shim.journal = FoundingJournal(trail)   # a new disk (wiped): it waits for a leader to promote it
    wiped = raft_roles.Roles(roles.so, "a", {}, {}, DISKS["e"])
    wiped._peers = dict(roles._peers)
    wiped.decide()
    assert wiped.voter is False and shim.journal.marks == 0


def test_a_leader_whose_disk_the_log_no_longer_names_as_a_voter_steps_down(raft):
    trail, shim, roles = raft
    trail.set_base(5, (voter("a"), voter("b"), voter("c")))
    shim.leading, shim.leader_id, shim.vote = True, "a-id", "a-id"
    roles.decide()
    assert changes(shim) == []   # a leader that is a voter stays
    replaced = membership.Member(raft=voter("a").raft, name="a", disk=DISKS["e"], url=None, voter=True)
    trail.set_base(6, (replaced, voter("b"), voter("c")))   # its name votes on another disk: not this one
    with structlog.testing.capture_logs() as logs:
        roles.decide()
    assert roles.voter is False and changes(shim) == [("step_down",)]
    assert [(e["event"], e["role"], e["disk"], e["membership_index"]) for e in logs] == [
        ("raft_membership_role", "learner", DISKS["a"], 6)]
    shim.leading, shim.calls = False, []
    trail.set_base(7, (voter("a"), voter("b"), voter("c")))
    roles.decide()
    trail.set_base(8, (learner("a"), voter("b"), voter("c")))
    roles.decide()
    assert ("step_down",) not in shim.calls   # a follower that becomes a learner has nothing to step down from


def membership_entry(members) -> bytes:
    return bytes([membership.MEMBERSHIP_COMMAND]) + membership.payload(members, "remove", encode_stamp({"ts": 1}))


def test_what_decide_reads_off_the_membership_follows_every_change_of_the_trail(raft):
    # decide() reads the members a membership removes off the trail once, not at every tick: a change of the trail
    # that leaves the newest membership the same object (the snapshot's base) must still be read again.
    trail, shim, roles = raft
    trail.appended(3, membership_entry((voter("a"), voter("b"), voter("c"))))
    trail.set_base(9, (voter("a"), voter("b")))   # a snapshot's membership, which removed c; entry 3 still held
    base = trail.current()
    roles.so.raftCommitIndex = 9
    shim.leading = True
    roles.decide()
    assert shim.calls[-1] == ("set_members", {TCPNode(voter("b").raft)}, {TCPNode(voter("c").raft)})
    roles.decide()
    assert [c for c in shim.calls if c[0] == "set_members"] == [shim.calls[-1]]   # nothing read again, nothing set
    trail.cleared()   # the journal's entries gone, the base kept
    assert trail.current() is base
    roles.decide()
    assert shim.calls[-1] == ("set_members", {TCPNode(voter("b").raft)}, set()), "c read off a trail that changed"


def departing(roles, current):
    """What ``decide`` sends the log to besides the members, for ``current`` (it reads the removed ones off once)."""
    return roles._departing(current, roles._read(current)[2])


def test_a_removed_member_gets_the_log_until_the_removal_commits_and_from_the_leader_until_it_holds_it(raft):
    trail, shim, roles = raft
    trail.appended(3, membership_entry((voter("a"), voter("b"), voter("c"), voter("d"))))
    trail.appended(9, membership_entry((voter("a"), voter("b"))))   # c and d removed
    current = trail.current()
    roles.so.raftCommitIndex = 8
    assert set(departing(roles, current)) == {voter("c"), voter("d")}   # not committed: every node sends it them
    shim.matches = {voter("c").raft: 9}   # c holds the removal, which may yet be cut: it still gets the log
    assert set(departing(roles, current)) == {voter("c"), voter("d")}
    shim.matches = {}
    roles.so.raftCommitIndex = 9
    assert departing(roles, current) == ()   # committed: a follower forgets them
    shim.leading = True
    assert set(departing(roles, current)) == {voter("c"), voter("d")}   # the leader does not, until they hold it
    shim.matches = {voter("c").raft: 8, voter("d").raft: 9}
    assert departing(roles, current) == (voter("c"),)
    roles._learners["c"] = (DISKS["c"], 9)   # progress reported as a learner counts the same
    assert departing(roles, current) == ()
    shim.matches, roles._learners = {}, {}   # raft's view dropped them, and their match indexes with them
    assert departing(roles, current) == ()
    # the next removal starts over
    trail.appended(12, membership_entry((voter("a"),)))
    roles.so.raftCommitIndex = 12
    assert departing(roles, trail.current()) == (voter("b"),)
    roles.decide()   # and raft's view sends to it as a learner
    assert shim.calls[-1] == ("set_members", set(), {TCPNode(voter("b").raft)})
    # c, added again and removed again, must hear of that removal too: what it held of the first proves nothing
    trail.appended(13, membership_entry((voter("a"), voter("c"))))
    trail.appended(15, membership_entry((voter("a"),)))
    roles.so.raftCommitIndex = 15
    assert departing(roles, trail.current()) == (voter("c"),)


def test_keepalives_are_taken_only_whole_and_never_reach_pysyncobj(raft, clock):
    _, _, roles = raft
    peer = types.SimpleNamespace(address=voter("b").raft)
    assert roles.admit(peer, ["not", "a", "dict"]) is True   # pysyncobj's own messages pass
    assert roles.admit(peer, {"type": "append_entries"}) is True
    for bad in ({"disk": "not-a-disk-id", "fresh": True}, {"disk": DISKS["b"], "fresh": "yes"}, {"disk": DISKS["b"]}):
        assert roles.admit(peer, {"type": "keepalive", **bad}) is False
    assert roles._peers == {} and not roles.heard_from(voter("b").raft)
    assert roles.admit(peer, {"type": "keepalive", "disk": DISKS["b"], "fresh": False}) is False
    assert roles._peers == {voter("b").raft: (DISKS["b"], False)}
    assert roles._heard == {voter("b").raft: (DISKS["b"], NOW)}   # named by its address: no config names it here


def test_a_learner_drops_vote_requests_and_leadership_transfers_and_a_voter_takes_them(raft):
    _, _, roles = raft
    peer = types.SimpleNamespace(address=voter("b").raft)
    for kind in ("request_vote", "timeout_now"):
        assert roles.admit(peer, {"type": kind}) is False   # a learner (as Roles starts)
    roles.voter = True
    for kind in ("request_vote", "timeout_now"):
        assert roles.admit(peer, {"type": kind}) is True


def test_a_learner_acknowledges_with_its_progress_and_a_voter_as_pysyncobj_does(raft):
    _, shim, roles = raft
    leader = types.SimpleNamespace(address=voter("b").raft)
    assert roles.acknowledge(leader, 42, True, False) is True
    assert shim.calls == [("send_message", leader, {"type": "learner_progress", "next": 42, "reset": True,
                                                    "success": False, "disk": DISKS["a"]})]
    roles.voter, shim.calls = True, []
    assert roles.acknowledge(leader, 43, False, True) is False and shim.calls == []


def test_keepalives_go_every_bootstrap_interval_before_a_membership_and_every_keepalive_interval_after(raft, clock):
    trail, _, roles = raft
    clock.s = 0.05   # times that are exact in binary: 0.1 - 0.05 is 0.05 to the last digit
    assert roles.keepalive() == {"type": "keepalive", "disk": DISKS["a"], "fresh": True}
    assert roles.keepalive() is None
    clock.s = 0.1
    assert roles.keepalive() is not None   # exactly one bootstrap interval later
    trail.set_base(5, (voter("a"),))
    roles.current = trail.current()   # as decide() sets it
    clock.s = 0.1 + 0.25
    assert roles.keepalive() is None   # a member's interval is the longer one
    clock.s = 0.1 + 0.6
    assert roles.keepalive() == {"type": "keepalive", "disk": DISKS["a"], "fresh": False}


def answers(futures) -> list[tuple]:
    return [(e.status, e.code, e.message) for e in (f.exception(timeout=0) for f in futures)]


def test_requests_a_node_cannot_decide_are_refused_by_name_at_its_next_tick(raft, clock):
    trail, shim, roles = raft
    roles.so.wake = lambda: None
    waiting = [roles.request("remove", "b")]
    roles.leader_tick()   # not leading: whatever waited is refused, and its leadership's state forgotten
    assert answers(waiting) == [(503, "LEADER_CHANGED", "this node no longer leads; retry")]
    shim.leading = True
    roles._proposed_at = clock.s
    waiting = [roles.request("remove", "b")]
    clock.s += raft_roles.PROPOSAL_TIMEOUT_S - 0.5
    roles.leader_tick()   # its own membership entry in flight
    assert answers(waiting)[0][:2] == (409, "MEMBERSHIP_CHANGE_IN_PROGRESS")
    clock.s += 0.5   # exactly PROPOSAL_TIMEOUT_S: proposed again if still wanted, and nothing refused for it
    roles._proposed_at, roles.so.selfNode = clock.s - raft_roles.PROPOSAL_TIMEOUT_S, types.SimpleNamespace(
        address=voter("a").raft)
    roles.so.stamp_bytes = lambda: encode_stamp({"ts": 1})
    waiting = [roles.request("remove", "b")]
    roles.leader_tick()   # no membership yet: the bootstrap is proposed (alone: no peers), requests refused
    assert answers(waiting) == [(503, "NO_LEADER", "the cluster is still bootstrapping")]
    assert [c[0] for c in shim.calls] == ["propose_membership"] and roles._proposed_at == clock.s
    # a committed membership and nothing to change: a proposal given up on is forgotten
    trail.set_base(5, (voter("a"),))
    clock.s += raft_roles.PROPOSAL_TIMEOUT_S
    roles.leader_tick()
    assert roles._proposed_at is None and [c[0] for c in shim.calls] == ["propose_membership"]


def test_requests_wait_while_the_last_membership_is_not_committed_and_are_refused_word_for_word(raft, clock):
    trail, shim, roles = raft
    roles.so.wake = lambda: None
    shim.leading = True
    trail.set_base(5, (voter("a"), voter("b")))
    roles.so.raftCommitIndex = 4
    waiting = [roles.request("remove", "b")]
    roles.leader_tick()
    assert answers(waiting) == [(409, "MEMBERSHIP_CHANGE_IN_PROGRESS", "another membership change is not committed "
                                 "yet; Raft changes the members one at a time: retry once it is")]
    assert [c for c in shim.calls if c[0] == "propose_membership"] == []


def proposed(shim: RecordingShim) -> list[tuple[membership.Members, object]]:
    """The memberships proposed so far, read back from their entries, each with its done callback."""
    return [(membership.parse_entry(bytes([membership.MEMBERSHIP_COMMAND]) + c[1]), c[2]) for c in shim.calls
            if c[0] == "propose_membership"]


def test_an_operator_change_is_answered_with_the_members_once_committed_and_refused_once_it_failed(raft, clock):
    _, shim, roles = raft
    roles.so.stamp_bytes = lambda: encode_stamp({"ts": 1})
    members = (voter("a"), voter("b"))
    committed, failed = concurrent.futures.Future(), concurrent.futures.Future()
    with structlog.testing.capture_logs() as logs:
        roles._propose(members, "add", committed)
    roles._propose(members, "remove", failed)
    assert logs == [{"event": "raft_membership_proposed", "log_level": "info", "reason": "add",
                     "members": [m.to_json() for m in members]}]   # what an operator reads of a change under way
    [(first, done_first), (second, done_second)] = proposed(shim)
    assert first == second == members and roles._proposed_at == NOW
    done_first(None, FAIL_REASON.SUCCESS)
    assert committed.result(timeout=0) == [m.to_json() for m in members] and roles._proposed_at is None
    roles._proposed_at = NOW
    done_second(None, FAIL_REASON.LEADER_CHANGED)
    e = failed.exception(timeout=0)
    assert (e.status, e.code, e.message) == (503, "LEADER_CHANGED", "leadership changed while the membership change "
                                             "was in flight; read the members and retry if it is not there")
    assert roles._proposed_at is None


def test_the_leader_promotes_a_voter_s_new_disk_once_it_caught_up_and_never_the_disk_the_log_names(raft, clock):
    trail, shim, roles = raft
    shim.leading = True
    roles.so.stamp_bytes = lambda: encode_stamp({"ts": 1})
    b = membership.Member(raft=voter("b").raft, name="b", disk=DISKS["b"], url="http://b.log", voter=True)
    trail.set_base(5, (voter("a"), b))
    roles.leader_tick()   # the learners' progress is heard under this membership from now on
    # b on the disk the log names, acknowledging as a learner while its log lags behind its own promotion
    roles._learners["b"] = (DISKS["b"], roles.so.raftCommitIndex)
    roles.leader_tick()
    assert proposed(shim) == []
    roles._learners["b"] = (DISKS["e"], roles.so.raftCommitIndex)   # b wiped, back on a new disk, caught up
    roles.leader_tick()
    [(members, _)] = proposed(shim)
    assert members == (voter("a"), membership.Member(raft=b.raft, name="b", disk=DISKS["e"], url="http://b.log",
                                                     voter=True))


def test_the_bootstrap_membership_names_every_voter_s_disk_and_the_url_the_config_gives_it(raft):
    _, shim, _ = raft
    so = shim.so
    b, c = TCPNode(voter("b").raft), TCPNode(voter("c").raft)
    so.selfNode, so.otherNodes = TCPNode(voter("a").raft), (b, c)
    roles = raft_roles.Roles(so, "a", {b.address: "b", c.address: "c"}, {"a": "http://a.config",
                                                                          "b": "http://b.config"}, DISKS["a"])
    roles._peers = {b.address: (DISKS["b"], True)}
    assert roles._bootstrap_members() is None   # c not heard: its disk is not known yet
    roles._peers[c.address] = (DISKS["c"], True)
    assert roles._bootstrap_members() == (
        membership.Member(raft=voter("a").raft, name="a", disk=DISKS["a"], url="http://a.config", voter=True),
        membership.Member(raft=b.address, name="b", disk=DISKS["b"], url="http://b.config", voter=True),
        membership.Member(raft=c.address, name="c", disk=DISKS["c"], url=None, voter=True))
