"""PreVote and leader stickiness (Raft thesis 9.6): a node that cannot reach a majority never raises the term of
those that can.

pysyncobj campaigns as soon as a follower's election timeout passes and it is connected to any peer: it raises its
own term and asks for votes, and whoever hears the higher term adopts it, the leader stepping down. A node cut off
from both peers for 10 s campaigned the moment its first link came back, before the leader's next heartbeat reached
it: the healthy leader stepped down and the cluster went from term 1 to 3 for nothing (issue 38 reports a node whose
peers refused it reaching term 364 in a minute).

So, before a campaign, the node asks its voters whether they *would* vote for it at its term + 1 (``pre_vote``),
and nobody's term changes, its own included. A voter grants it only when the candidate's log is at least as up to
date as its own and it is not *in lease*: it leads, or it heard its leader within the minimum election timeout.
(A leader's lease is pysyncobj's check quorum: a leader that no majority answered for ``leaderFallbackTimeout``
steps down.) Only with a majority of grants, itself included, does the node let pysyncobj campaign. A real
``request_vote`` is refused the same way by a node in lease, unless it comes from a leadership transfer (the leader
asked for it, ``timeout_now``: the campaign's requests carry ``force``), as etcd's ``campaignTransfer``. And a
node that hears appends from a leader of an older term answers with its term (``term_notice``), as Raft answers any
stale message, so that the old leader steps down (etcd answers such appends the same way); a pre-vote's answer
names the answering node's term, and a candidate behind it takes that term (etcd's pre-candidate does the same).

Everything here runs on the tick (the tick, the messages it reads, the transport's sends), as pysyncobj does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import pysyncobj_shim as shim

PRE_VOTE = "pre_vote"
PRE_VOTE_ANSWER = "pre_vote_answer"
REQUEST_VOTE = "request_vote"
TERM_NOTICE = "term_notice"   # Raft's answer to a message of an older term: the newer term


@dataclass
class PreVoteCounts:
    """Since start, for the metrics: rounds this node asked for and won, grants and refusals it answered, and real
    vote requests it refused because it was in lease."""
    rounds: int = 0
    won: int = 0
    granted: int = 0
    refused: int = 0
    votes_refused_in_lease: int = 0
    terms_adopted: int = 0    # a newer term heard in a term notice (this node led, or thought a leader alive)


def _is_index(value: Any) -> bool:
    return type(value) is int and value >= 0


class PreVote:
    def __init__(self, so: Any, self_address: str, voter: Any):
        """``so``: the MetaSyncObj; ``voter()``: whether the membership counts this node as a voter (a learner
        neither grants nor asks)."""
        self.so = so
        self._me = self_address
        self._voter = voter
        self._round: int | None = None        # the term the pre-vote under way asks for
        self._granted: set[str] = set()       # who granted it (this node first)
        self._won: int | None = None          # the term a won pre-vote lets pysyncobj campaign for
        self._forced: int | None = None       # the term of a campaign a leadership transfer started
        self._leader_heard = float("-inf")    # pysyncobj's clock, when an append from a current leader last came
        self.counts = PreVoteCounts()

    # -- the candidate's side ----------------------------------------------------------------------------------
    def tick(self) -> None:
        """Before pysyncobj's tick: when its election timeout has passed, run a pre-vote instead of the campaign
        pysyncobj would start, unless a pre-vote for that campaign was just won or the leader asked for it."""
        so = self.so
        if self._forced is not None:   # the transfer's campaign went out in the last tick: sends go as they are
            self._forced = None
            shim.transport(so).set_outgoing(None)
        if not shim.election_due(so):
            return
        term = so.raftCurrentTerm
        if shim.transfer_in_progress(so):
            # pysyncobj campaigns in this tick: its vote requests say the leader asked. The transport rewrites
            # messages only for this tick, so no other send pays for it.
            self._forced = term + 1
            shim.transport(so).set_outgoing(self.outgoing)
            return
        if self._won == term + 1:
            self._won = None          # pysyncobj campaigns in this tick
            return
        self._won = None
        self.counts.rounds += 1
        shim.restart_election_timer(so)   # no campaign now; the next round, if this one fails, after a timeout
        self._round, self._granted = term + 1, {self._me}
        index, last_term = shim.last_log(so)
        for node in shim.voters(so):
            shim.send_message(so, node, {"type": PRE_VOTE, "term": term + 1, "last_log_index": index,
                                         "last_log_term": last_term})
        self._count()

    def _count(self) -> None:
        so = self.so
        if self._round != so.raftCurrentTerm + 1:
            return   # the term moved on meanwhile: the round is stale
        if len(self._granted) > (len(shim.voters(so)) + 1) / 2:
            self.counts.won += 1
            self._won, self._round = self._round, None
            shim.start_election_now(so)

    def outgoing(self, message: Any) -> Any:
        """Each message the transport sends in the tick of a transfer's campaign: its vote requests carry ``force``."""
        if (self._forced is not None and isinstance(message, dict) and message.get("type") == REQUEST_VOTE
                and message.get("term") == self._forced):
            return {**message, "force": True}
        return message

    # -- every node's side -------------------------------------------------------------------------------------
    def admit(self, node: Any, message: Any) -> bool:
        """Each incoming message, before pysyncobj: False for those it must not see (pre-votes, and vote requests
        refused in lease)."""
        if not isinstance(message, dict):
            return True
        kind = message.get("type")
        if kind == shim.APPEND:
            term = message.get("term")
            if type(term) is int and term >= self.so.raftCurrentTerm:
                self._leader_heard = shim.clock()
                self._round = self._won = None   # a leader is heard: no campaign from a round before it
            elif type(term) is int:
                # A leader of an older term (pysyncobj drops its appends unanswered): tell it this term, so that
                # it steps down. Without it, a node whose won pre-vote ended in a lost campaign stayed a term
                # ahead of a leader whose followers, in lease, refused its vote requests: cut off for good.
                shim.send_message(self.so, node, {"type": TERM_NOTICE, "term": self.so.raftCurrentTerm})
            return True
        if kind == TERM_NOTICE:
            if type(message.get("term")) is int and message["term"] > self.so.raftCurrentTerm:
                self.counts.terms_adopted += 1
                shim.adopt_term(self.so, message["term"])
            return False
        if kind == PRE_VOTE:
            self._answer(node, message)
            return False
        if kind == PRE_VOTE_ANSWER:
            current = message.get("current")
            if type(current) is int and current > self.so.raftCurrentTerm:
                # Refused by a node of a newer term: take that term (Raft's rule for any message of a newer term), so
                # that the next round asks for one past it. Without it, a node with the longest log but an older
                # term asked forever for a term its peers had already passed, and they, with shorter logs, could
                # not win either: no leader ever again (the simulator, seed 1980 with --l2).
                self.counts.terms_adopted += 1
                shim.adopt_term(self.so, current)
            elif (message.get("granted") is True and message.get("term") == self._round
                    and node in shim.voters(self.so)):
                self._granted.add(node.address)
                self._count()
            return False
        if kind == REQUEST_VOTE and message.get("force") is not True and self._in_lease():
            self.counts.votes_refused_in_lease += 1
            return False
        return True

    def _answer(self, node: Any, message: dict[str, Any]) -> None:
        term, index, last_term = message.get("term"), message.get("last_log_index"), message.get("last_log_term")
        if not (_is_index(term) and _is_index(index) and _is_index(last_term)):
            return   # not a pre-vote any node of this version sends
        so = self.so
        my_index, my_term = shim.last_log(so)
        up_to_date = last_term > my_term or (last_term == my_term and index >= my_index)
        grant = self._voter() and term > so.raftCurrentTerm and up_to_date and not self._in_lease()
        if grant:
            self.counts.granted += 1
        else:
            self.counts.refused += 1
        shim.send_message(so, node, {"type": PRE_VOTE_ANSWER, "term": term, "granted": grant,
                                     "current": so.raftCurrentTerm})

    def _in_lease(self) -> bool:
        so = self.so
        if shim.is_leader(so):
            return True
        return (shim.leader(so) is not None
                and shim.clock() - self._leader_heard < shim.election_timeout_min_s(so))
