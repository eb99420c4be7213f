"""This node's place in the membership (meta/raft/membership.py): voter or learner, and, on the leader, the changes.

Everything here runs on the tick, except ``request`` (an operator's change, from the event loop) and
``status`` (any thread), which only hand over or read whole values.

- **Role**, decided at the start of every tick from the newest membership in the log: a voter is named there as a
  voter with this node's own disk id. A learner drops vote requests, never campaigns, and acknowledges appends with
  ``learner_progress`` messages, which move the leader's next index for it but never count toward a commit.
- **Raft's view of the members** follows the same membership: its voters are pysyncobj's voters (the majority is
  counted over them), its learners get the leader's appends without being counted (pysyncobj's read-only nodes).
  A member this node's config names is reached at the config's address for that name (nodes may reach one another
  at different addresses: a proxy, NAT); another at the address the membership records.
- **Bootstrap**: before the first membership entry, a node whose log is empty votes only when every peer in its
  config says in its keepalives that its log is empty too; a node with entries took part in the bootstrap and votes.
  The first leader appends the membership with every voter's disk.
- **The leader's changes**, one at a time (Raft's single-server changes; a change waits until the last one is
  committed): the promotion of a learner whose disk replaced a voter's (automatic, once it is close to the commit
  index), and an operator's ``add`` (a learner), ``promote`` (a learner that caught up, with the disk it runs on)
  and ``remove``. Promoting a learner that lags is safe at any lag: it becomes a voter only once it appended the
  promotion entry, so it holds every entry before it; the lag bound is for liveness. A leader asked to remove itself
  first hands its leadership to a caught-up voter (Raft's TimeoutNow) and the request is retried on the new leader.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import structlog
from pysyncobj import FAIL_REASON
from pysyncobj.node import TCPNode

from wire import disk_identity
from . import pysyncobj_shim as shim
from . import membership
from wire.errors import ApiError, rejection

log = structlog.get_logger("meta.raft.roles")
# Harmless mutants: the words and fields of the log calls but raft_membership_removed's, raft_membership_role's and
# raft_membership_proposed's (tests pin those three: an operator acts on them).

KEEPALIVE_INTERVAL_S = 0.5
# Before the first membership entry a node hears every peer's keepalive before it may vote: sent each tick then, a
# first start of a cluster waits one tick for it, not half a second.
BOOTSTRAP_KEEPALIVE_INTERVAL_S = 0.05
PROPOSAL_TIMEOUT_S = 5.0              # a membership entry neither committed nor failed by then is proposed again
LEARNER_ELECTION_HOLD_S = 1.0         # a learner pushes its election deadline this far ahead at every tick
PROMOTION_LAG_ENTRIES_MAX = 1000      # a learner this close to the commit index is promoted (see the module text)
REQUESTS_MAX = 16                     # operators' changes waiting for the tick; more are refused
# A voter the leader heard a keepalive from this recently, from the disk the membership names, counts as live for
# the quorum check of an operator's change (etcd's strict reconfiguration check): several keepalive periods, so that
# a loaded machine's late keepalive does not refuse a change that is safe.
LIVE_WITHIN_S = 10 * KEEPALIVE_INTERVAL_S
OPERATIONS = ("add", "promote", "remove")


class HandingOver(ApiError):
    """The leader was asked to remove itself: it hands its leadership over first; retry on the next leader."""
    status = 503
    code = "LEADER_CHANGED"


@dataclass
class _Request:
    op: str
    name: str
    raft: str | None
    url: str | None
    answer: concurrent.futures.Future


class Roles:
    def __init__(self, so: Any, name: str, names: dict[str, str], urls: dict[str, str], disk: str):
        """``names``: raft address -> node name and ``urls``: node name -> HTTP URL, for the members this node's config
        lists (itself included); ``disk``: this node's disk id."""
        self.so = so
        self.name = name
        self.disk = disk
        self._names = dict(names)
        self._addresses = {n: a for a, n in names.items()}
        self._urls = dict(urls)
        # Harmless mutants of these defaults, each the same value or overwritten before any use: voter, _held and
        # _removed None (falsy as False; _removed True only skips the log line of a node that was never a member),
        # and "" or (1, ...) for _learners_since, _proposed_at, _leading, _applied, current and _departed
        # (decide() sets current and _applied at the first tick, leader_tick() _proposed_at and _leading while not
        # leading, and no membership entry is at index 1).
        self.voter = False
        self._held = False     # held its elections as a learner since it last changed role
        self._peers: dict[str, tuple[str, bool]] = {}         # raft address -> (disk, log empty), from keepalives
        self._heard: dict[str, tuple[str, float]] = {}        # name -> (disk, monotonic time of its last keepalive)
        self._learners: dict[str, tuple[str, int]] = {}       # leader: name -> (disk, last index it holds)
        self._learners_since: int | None = None               # the membership index _learners was heard under
        self._proposed_at: float | None = None                # monotonic: a membership entry of ours in flight
        self._leading: tuple[int, float] | None = None        # (term, monotonic time) this node started leading
        # the membership raft's view was set from, and the members it removes that still get the log
        self._applied: tuple[tuple[int, membership.Members], tuple[membership.Member, ...]] | None = None
        self._departed: tuple[int, set[str]] = (0, set())   # leader: the removed members known to hold their removal
        self._last_keepalive = 0.0
        self._requests: collections.deque[_Request] = collections.deque()
        self.current: tuple[int, membership.Members] | None = None   # as of this tick, for other threads
        self._removed = False   # current does not name this node
        # What decide() reads off the trail's membership, kept until the trail changes (MembershipTrail.changes):
        # whether it leaves this node out, whether it names this node a voter, and the members it removes. Scanned
        # at every tick, these were ~5% of a leader's CPU at one writer.
        self._read_off: tuple[int, bool, bool, tuple[membership.Member, ...]] = (-1, False, False, ())

    # -- the log's membership ------------------------------------------------------------------------------------
    def _trail(self) -> membership.MembershipTrail:
        return shim.journal_of(self.so).membership

    def heard_from(self, name: str) -> bool:
        """Whether a keepalive of the member ``name`` reached this node since it started."""
        return name in self._heard

    def log_is_empty(self) -> bool:
        """No membership and no entry past pysyncobj's first no-op: a directory that never took part in a cluster."""
        return self._trail().current() is None and shim.current_log_index(self.so) <= 1

    def address_of(self, member: membership.Member) -> str:
        return self._addresses.get(member.name, member.raft)

    def name_of(self, address: str) -> str:
        return self._names.get(address) or next(
            (m.name for m in (self.current[1] if self.current else ()) if m.raft == address), address)

    def url_of(self, address: str) -> str | None:
        """The HTTP URL of the member at raft ``address`` (the leader's, to forward to)."""
        name = self.name_of(address)
        if name in self._urls:
            return self._urls[name]
        member = membership.by_name(self.current[1], name) if self.current else None
        return member.url if member else None

    @property
    def removed(self) -> bool:
        """The membership in this node's log does not name it (any thread): it was removed, and gets no more.
        Decided once per tick with ``current``: every request asks, and a scan of the members each time showed."""
        return self._removed

    # -- role, at the start of each tick ---------------------------------------------------------------------------
    def decide(self) -> None:
        was_removed = self._removed
        trail = self._trail()
        current = self.current = trail.current()
        if trail.changes != self._read_off[0]:
            self._read_off = (trail.changes, *self._read(current))
        _, self._removed, voter_here, gone = self._read_off
        if self._removed and not was_removed:
            log.warning("raft_membership_removed", membership_index=current[0],
                        members=[m.name for m in current[1]], hint="the node no longer gets the log and refuses "
                        "requests (NOT_A_MEMBER): stop it, or add it again")
        if current is not None:
            voter = voter_here
            departing = self._departing(current, gone)
            if (current, departing) != self._applied:
                self._set_raft_members(current, departing)
        elif not self.log_is_empty():
            voter = True    # took part in a bootstrap whose membership entry is not in this log yet
        else:
            journal = shim.journal_of(self.so)
            heard = [self._peers.get(node.address) for node in self.so.otherNodes]
            voter = journal.founding_voter or all(p is not None and p[1] for p in heard)   # a first start
            if voter and not journal.founding_voter:
                # Kept on its disk: a peer stops being fresh once it appends, perhaps as a leader its peers have
                # already left for a later term, and then never reaches them; had they become learners for that,
                # no leader could ever be elected again (found by the simulator: seed 282 --l2, no fault).
                journal.mark_founding_voter()
        if not voter:
            shim.postpone_election(self.so, LEARNER_ELECTION_HOLD_S)
            self._held = True
        if voter == self.voter:
            return
        self.voter = voter
        leader = shim.leader(self.so)
        if voter and leader is not None and shim.voted_for(self.so) is None:
            # This term's leader may have won with the vote this node's old disk gave; a vote for another
            # candidate in the same term could elect a second leader.
            shim.set_voted_for(self.so, leader.id)
        if not voter and shim.is_leader(self.so):
            shim.step_down(self.so)
        if voter and self._held and leader is None:
            # The learner's hold (LEARNER_ELECTION_HOLD_S, pushed ahead at every tick) is not a voter's timeout:
            # left in place, it delayed every first election of a new cluster by a second. (A node that restarts a
            # voter never held, and keeps its restart grace: node.RESTART_ELECTION_GRACE_S.)
            shim.restart_election_timer(self.so)
        if voter:
            # Harmless mutants: None or True here (a voter becomes a learner, which sets _held, before it can become
            # a voter again: the value set here is never read).
            self._held = False
        log.info("raft_membership_role", role="voter" if voter else "learner", disk=self.disk,
                 membership_index=current[0] if current else None)

    def _read(self, current: tuple[int, membership.Members] | None) -> tuple[bool, bool, tuple[membership.Member, ...]]:
        """Whether ``current`` leaves this node out, whether it names it a voter, and the members it removes."""
        if current is None:
            return False, False, ()
        index, members = current
        before = self._trail().before(index) or ()
        gone = tuple(m for m in before if m.name != self.name and membership.by_name(members, m.name) is None)
        return membership.by_name(members, self.name) is None, membership.is_voter(members, self.name, self.disk), gone

    def _departing(self, current: tuple[int, membership.Members],
                   gone: tuple[membership.Member, ...]) -> tuple[membership.Member, ...]:
        """The members the newest membership removes that may not hold it yet: every node sends them the log (never
        counting them) until the entry commits, and the leader after that, until each one holds it (its match
        index, or its learner progress, reaches the entry), so that they know they were removed (NOT_A_MEMBER).
        Dropped at the commit, a removed node whose link was down then (a leader handing over; a node down when
        it was removed, started again) never got the entry, and its peers refused it as unknown: it served on as
        a member of a cluster that no longer sent it anything (tests/test_meta_members.py). One the leader never
        reaches is sent to until the next membership (etcd: a removed member learns from its peers)."""
        index = current[0]
        committed = index <= self.so.raftCommitIndex
        if committed and not shim.is_leader(self.so):
            return ()   # a follower's every tick once the change is done
        if not gone or not committed:
            return gone
        if self._departed[0] != index:
            self._departed = (index, set())
        matches = shim.match_indexes(self.so)
        for m in gone:
            progress = self._learners.get(m.name)
            # Harmless mutants: 1 for either 0 (a membership entry is never at index 1, pysyncobj's first no-op)
            if max(matches.get(self.address_of(m), 0), progress[1] if progress else 0) >= index:
                # remembered: once raft's view drops it, its match index goes with it
                self._departed[1].add(m.name)
        return tuple(m for m in gone if m.name not in self._departed[1])

    def _set_raft_members(self, current: tuple[int, membership.Members],
                          departing: tuple[membership.Member, ...]) -> None:
        self._applied = (current, departing)
        others = [m for m in current[1] if m.name != self.name]
        learners = [*(m for m in others if not m.voter), *departing]
        shim.set_members(self.so, {TCPNode(self.address_of(m)) for m in others if m.voter},
                         {TCPNode(self.address_of(m)) for m in learners})

    # -- messages ------------------------------------------------------------------------------------------------
    def admit(self, node: Any, message: Any) -> bool:
        """False for the messages pysyncobj must not see."""
        if not isinstance(message, dict):
            return True
        kind = message.get("type")
        if kind == "keepalive":
            disk, fresh = message.get("disk"), message.get("fresh")
            if disk_identity.is_disk_id(disk) and isinstance(fresh, bool):
                self._peers[node.address] = (disk, fresh)
                self._heard[self.name_of(node.address)] = (disk, time.monotonic())
            return False
        if kind == "learner_progress":
            self._learner_progress(node, message)
            return False
        if kind in ("request_vote", "timeout_now") and not self.voter:
            return False   # a learner never votes, nor stands for election on a leader's word
        return True

    def acknowledge(self, node: Any, next_index: int, reset: bool, success: bool) -> bool:
        """A learner's acknowledgement tells the leader where to send from, never what counts toward a commit."""
        if self.voter:
            return False
        shim.send_message(self.so, node, {"type": "learner_progress", "next": next_index, "reset": reset,
                                          "success": success, "disk": self.disk})
        return True

    def _learner_progress(self, node: Any, message: dict[str, Any]) -> None:
        if not shim.is_leader(self.so):
            return
        nxt, disk = message.get("next"), message.get("disk")
        if not (isinstance(nxt, int) and nxt >= 1 and disk_identity.is_disk_id(disk)):
            return
        if message.get("reset") is True:
            shim.set_next_index(self.so, node, nxt)
        name = self.name_of(node.address)
        held = self._learners.get(name)
        match = nxt - 1 if message.get("success") is True else (held[1] if held and held[0] == disk else 0)
        self._learners[name] = (disk, match)

    def keepalive(self) -> dict[str, Any] | None:
        """The keepalive to send every peer now, or None: it also says which disk this node runs on and whether
        its log is empty (a bootstrap needs every peer's)."""
        now = time.monotonic()
        interval = BOOTSTRAP_KEEPALIVE_INTERVAL_S if self.current is None else KEEPALIVE_INTERVAL_S   # this tick's
        if now - self._last_keepalive < interval:
            return None
        self._last_keepalive = now
        return {"type": "keepalive", "disk": self.disk, "fresh": self.log_is_empty()}

    # -- the leader's changes --------------------------------------------------------------------------------------
    def request(self, op: str, name: str, raft: str | None = None, url: str | None = None
                ) -> concurrent.futures.Future:
        """Event loop: an operator's change, decided on the tick; the future's result is the membership
        once the entry is committed, or an ApiError."""
        answer: concurrent.futures.Future = concurrent.futures.Future()
        if len(self._requests) >= REQUESTS_MAX:
            answer.set_exception(rejection(409, "MEMBERSHIP_CHANGE_IN_PROGRESS",
                                           f"{REQUESTS_MAX} membership changes are already waiting"))
        else:
            self._requests.append(_Request(op, name, raft, url, answer))
            self.so.wake()
        return answer

    def leader_tick(self) -> None:
        if not shim.is_leader(self.so):
            self._proposed_at = None
            self._leading = None
            self._learners.clear()
            self._refuse_requests(_leader_changed)
            return
        if self._leading is None or self._leading[0] != self.so.raftCurrentTerm:
            self._leading = (self.so.raftCurrentTerm, time.monotonic())
        if self._proposed_at is not None:
            if time.monotonic() - self._proposed_at < PROPOSAL_TIMEOUT_S:
                self._refuse_requests(_in_progress)
                return
            self._proposed_at = None
        current = self._trail().current()
        if current is None:
            self._refuse_requests(_bootstrapping)
            members = self._bootstrap_members()
            if members is not None:
                self._propose(members, "bootstrap", None)
            return
        index, members = current
        if index != self._learners_since:
            # Progress heard under an older membership may be another process's: a member removed and added again
            # under its name was promoted at once, with the disk and progress of the instance before it (found by
            # the chaos runner's replace fault). Learners report with every append answer: they are heard again.
            self._learners.clear()
            self._learners_since = index
        if index > self.so.raftCommitIndex:
            self._refuse_requests(_in_progress)
            return   # the last change is not committed yet: Raft's single-server changes go one at a time
        if self._requests:
            request = self._requests.popleft()
            try:
                change = self._operator_change(request, members)
            except ApiError as e:
                request.answer.set_exception(e)
                return
            self._propose(change, request.op, request.answer)
            return
        for m in members:
            held = self._learners.get(m.name)
            if m.voter and held is not None and held[0] != m.disk and self._caught_up(held):
                promoted = membership.Member(raft=m.raft, name=m.name, disk=held[0], url=m.url, voter=True)
                self._propose(membership.replaced(members, promoted), "rejoin", None)
                return

    def _caught_up(self, held: tuple[str, int]) -> bool:
        return held[1] >= self.so.raftCommitIndex - PROMOTION_LAG_ENTRIES_MAX

    def _operator_change(self, request: _Request, members: membership.Members) -> membership.Members:
        """The membership after ``request``, or the ApiError that refuses it."""
        existing = membership.by_name(members, request.name)
        if request.op == "add":
            if existing is not None:
                raise rejection(409, "MEMBER_EXISTS", f"{request.name!r} is already a member", node=request.name)
            if any(m.raft == request.raft for m in members):
                raise rejection(409, "MEMBER_EXISTS", f"another member has raft address {request.raft}",
                                raft=request.raft)
            if len(members) >= membership.MEMBERS_MAX:
                raise rejection(409, "TOO_MANY_MEMBERS", f"a cluster has at most {membership.MEMBERS_MAX} members")
            # Harmless mutant: "XXXX" for "" (an add without a raft address: the API refuses it before it gets here)
            added = membership.Member(raft=request.raft or "", name=request.name, disk=None, url=request.url,
                                      voter=False)
            return membership.replaced(members, added)
        if existing is None:
            raise rejection(404, "MEMBER_NOT_FOUND", f"{request.name!r} is not a member", node=request.name)
        if request.op == "promote":
            if existing.voter:
                raise rejection(409, "ALREADY_VOTER", f"{request.name!r} is a voter already", node=request.name)
            held = self._learners.get(request.name)
            if held is None or not self._caught_up(held):
                raise rejection(409, "NOT_CAUGHT_UP", f"{request.name!r} has not caught up with the log yet "
                                "(is it running?); retry once it has", node=request.name,
                                holds=held[1] if held else None, commit_index=self.so.raftCommitIndex)
            promoted = membership.Member(raft=existing.raft, name=existing.name, disk=held[0], url=existing.url,
                                         voter=True)
            changed = membership.replaced(members, promoted)
            self._refuse_quorum_loss(changed, request.name)
            return changed
        # remove
        if existing.voter and sum(m.voter for m in members) == 1:
            raise rejection(409, "LAST_VOTER", f"{request.name!r} is the last voter", node=request.name)
        self._refuse_quorum_loss(tuple(m for m in members if m.name != request.name), request.name)
        if request.name == self.name:
            # Raft lets a leader outside the new configuration lead until it commits it; pysyncobj always counts
            # the leader toward a majority, so the leader hands over first and the new one removes this node.
            self.so.transferLeadership()
            raise HandingOver("the leader hands its leadership over before it is removed; retry",
                              {"node": request.name})
        return tuple(m for m in members if m.name != request.name)

    def _refuse_quorum_loss(self, changed: membership.Members, name: str) -> None:
        """Refuse a change after which the voters this leader knows to be live are no majority (etcd's
        --strict-reconfig-check): removing a healthy voter while another's disk is gone would leave a configuration
        whose majority needs the lost disk, and no leader could ever be elected again (the chaos runner's replace
        fault just after a wipe did exactly that). The learner being promoted is live: it just reported."""
        voters = [m for m in changed if m.voter]
        now = time.monotonic()

        def live(m: membership.Member) -> bool:
            if m.name == self.name:
                return m.disk == self.disk
            if m.name == name:
                return True
            heard = self._heard.get(m.name)
            return heard is not None and heard[0] == m.disk and now - heard[1] <= LIVE_WITHIN_S
        down = [m.name for m in voters if not live(m)]
        if len(voters) - len(down) < len(voters) // 2 + 1:
            led_s = now - self._leading[1] if self._leading is not None else LIVE_WITHIN_S
            if led_s < LIVE_WITHIN_S:
                # Leading for less than that, it may not have heard every voter's keepalive yet (a leader handing
                # over to a learner it just promoted: the new one heard nothing from the others, and refused the old
                # leader's removal WOULD_LOSE_QUORUM naming two live voters)
                raise rejection(503, "LEADER_CHANGED", f"this node leads for {led_s:.1f} s only and has not heard "
                                f"from {', '.join(down)} yet; retry shortly", node=name, not_live=down)
            raise rejection(409, "WOULD_LOSE_QUORUM", f"after this change {len(voters)} voters would need "
                            f"{len(voters) // 2 + 1}, and {', '.join(down)} did not answer from the disk the log "
                            "names: bring them back (or remove them) first", node=name, not_live=down)

    def _refuse_requests(self, error: Callable[[], ApiError]) -> None:
        """Answer every waiting request with ``error()``, built only when one waits: this runs at every tick of
        every node (an ApiError built and dropped per tick was ~0.6% of a follower's CPU at one writer)."""
        if not self._requests:
            return
        refusal = error()
        while self._requests:
            self._requests.popleft().answer.set_exception(refusal)

    def _bootstrap_members(self) -> membership.Members | None:
        members = [membership.Member(raft=self.so.selfNode.address, name=self.name, disk=self.disk,
                                     url=self._urls.get(self.name), voter=True)]
        for node in self.so.otherNodes:
            heard = self._peers.get(node.address)
            if heard is None:
                return None   # every voter's disk goes into the first membership
            name = self.name_of(node.address)
            members.append(membership.Member(raft=node.address, name=name, disk=heard[0], url=self._urls.get(name),
                                             voter=True))
        return tuple(sorted(members))

    def _propose(self, members: membership.Members, reason: str,
                 answer: concurrent.futures.Future | None) -> None:
        self._proposed_at = time.monotonic()

        def done(_result: Any, err: int) -> None:   # the tick (on the loop, or its watchdog thread): committed, or failed
            self._proposed_at = None
            if answer is None or answer.done():
                return
            if err == FAIL_REASON.SUCCESS:
                answer.set_result([m.to_json() for m in members])
            else:
                answer.set_exception(rejection(503, "LEADER_CHANGED", "leadership changed while the membership "
                                               "change was in flight; read the members and retry if it is not there"))

        shim.propose_membership(self.so, membership.payload(members, reason, self.so.stamp_bytes()), done)
        log.info("raft_membership_proposed", reason=reason, members=[m.to_json() for m in members])

    # -- status ----------------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """This node's disk, whether it votes, and the members of the newest membership in its log (any thread)."""
        current = self.current
        return {"disk": self.disk, "voter": self.voter,
                "membership_index": current[0] if current else None,
                "members": [m.to_json() for m in current[1]] if current else []}


def _leader_changed() -> ApiError:
    return rejection(503, "LEADER_CHANGED", "this node no longer leads; retry")


def _bootstrapping() -> ApiError:
    return rejection(503, "NO_LEADER", "the cluster is still bootstrapping")


def _in_progress() -> ApiError:
    return rejection(409, "MEMBERSHIP_CHANGE_IN_PROGRESS", "another membership change is not committed yet; "
                     "Raft changes the members one at a time: retry once it is")
