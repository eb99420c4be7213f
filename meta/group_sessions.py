"""Group members' leases as the leader sees them: in memory, never in the log (like broker sessions).

Why heartbeats stay out of the log: 10,000 members heartbeating every 3 s are 3,300 renewals a second, more than the
log commits (about 1,300 writes/s here), and a renewal changes no decision. What does change a decision enters the
log: a member joining or changing its topics, leaving, releasing a revoked queue, and the expiry of a lease, which
the leader proposes (DESIGN.md invariant 2: apply reads no clock). KRaft logs broker fencing the same way, not beats.

Lease safety ("a member loses its queues when its lease ends, never before"):
- the client counts its lease from the moment it SENT a heartbeat; the leader from when it received it, later;
- a member the leader decided to expire is held out of heartbeats until that expiry has applied, so no answer can
  renew a lease the log is about to end;
- a revoked queue's lease runs from when the leader first saw it revoked, after the last answer that listed it;
- a lease lasts what the answer that granted it said: an admin who shortens ``lease_ms`` shortens the leases of the
  answers after, never one already promised (the leader keeps, per member, when the longest lease any answer
  promised it ends: a member is silent only past that and past its group's ``lease_ms``; a revoked queue is
  released only once the longest lease promised to its holder has ended. Kept as the last answer's lease_ms, an
  answer after a shortening hid the longer one before it, which still ran: the chaos runner saw a revoked queue
  given to another 1.1-1.2 s before its holder's lease ended);
- a new leader starts every lease afresh, and answers heartbeats only after a read index of its own term was served,
  so every expiry an older leader committed is in its image first; it counts each member as promised at least the
  longest lease an older leader's answer may still carry after a shortening of ``lease_ms`` (the image keeps it:
  groups.lease_still_promised_ms).
A deposed leader that does not know it yet can still answer heartbeats from its stale image, until it steps down
(raft_tuning.leader_fallback_timeout_s, 0.5 s by default, at most the election timeout; ops/bench/step_down.py measures
it): a lease it renews can end up to about that much later, by the member's clock, than the new leader counts it.
Clients keep a safety margin of at least a second for this. Whatever the clocks do, the brokers' token check is what
keeps a member with a lost lease from acting (invariant 6).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from wire.errors import rejection
from wire.waits import wait_set

from . import groups, limits
from .broker_sessions import answer
from .image import Image
from .log import Log
from .periodic import run_every
from .reads import ReadFacade

log = structlog.get_logger("meta.groups")
LEASE_CHECK_INTERVAL_S = 0.25
EXPIRY_WAIT_S = 5.0          # how long a heartbeat waits for its member's pending expiry to apply
READ_INDEX_WAIT_S = 5.0
APPLY_WAIT_S = 5.0           # how long a heartbeat waits for the leader to apply what it knows committed

Key = tuple[str, str]          # (group, member)
LockKey = tuple[str, str, int, int]  # (group, topic, queue, token)


class GroupSessions:
    def __init__(self, reads: ReadFacade, log: Log):
        self.reads = reads
        self.log = log
        self._seen: dict[Key, float] = {}          # monotonic s of the last heartbeat received
        self._seen_wall: dict[Key, int] = {}       # wall ms of it, for display
        # monotonic s at which the longest lease any answer promised the member ends: an answer after an operator
        # shortened lease_ms promises less than the one before it, which still runs
        self._promised_until: dict[Key, float] = {}
        # monotonic s at which a revoked lock is released: its lease (lease_ms) from when the leader first saw it
        # revoked, and not before the longest lease an answer promised its holder then has ended (no answer after
        # lists it as owned)
        self._release_at: dict[LockKey, float] = {}
        self._expiring: dict[Key, asyncio.Event] = {}
        self._led_term: int | None = None
        self._ready_term: int | None = None
        self._answers: dict[str, tuple[int, dict[str, dict[str, list[dict[str, Any]]]], dict[str, Any]]] = {}

    # -- heartbeats (leader only) ----------------------------------------------------------------------------
    async def heartbeat(self, group: str, member: str, topics: list[str], mode: str,
                        released: list[dict[str, Any]]) -> dict[str, Any]:
        await self._ready()
        await self.applied()
        key = (group, member)
        pending = self._expiring.get(key)
        if pending is not None:
            if not await wait_set(pending, EXPIRY_WAIT_S):
                raise rejection(503, "NO_LEADER", "the member's expiry is still being decided; retry")
        # Renew before anything is awaited below: the expiry loop must never see this member as silent now. A
        # heartbeat the log refuses renews nothing (the old times come back; meanwhile expiry could only be later).
        before = self._seen.get(key), self._seen_wall.get(key)
        self._seen[key] = time.monotonic()
        self._seen_wall[key] = wall_ms = int(time.time() * 1000)
        try:
            await self._decide(group, member, topics, mode, released)
        except BaseException:
            if before[0] is None:
                self.forget(group, member)
            else:
                self._seen[key], self._seen_wall[key] = before
            raise
        version, mine, config = self._assignments(group, member)
        until = self._seen[key] + config["lease_ms"] / 1000
        self._promised_until[key] = max(self._promised_until.get(key, 0.0), until)
        lease_end = wall_ms + config["lease_ms"]
        return {"assignments": [{**a, "lease_expires_ms": lease_end} for a in mine["owned"]],
                "revoking": mine["revoking"],
                "heartbeat_interval_ms": config["heartbeat_interval_ms"], "lease_ms": config["lease_ms"],
                "config": config, "version": version}

    async def applied(self) -> None:
        """Leader: once its image holds what it knows committed. A write a follower answered may not be in the
        leader's image yet (its apply thread can lag the commit): a leave there must show in the next heartbeat's
        answer to any member, and in a describe. 503 OVERLOADED when the apply thread does not catch up in time,
        NO_LEADER when this node stopped leading meanwhile."""
        if not await self.log.applied_commit(APPLY_WAIT_S):
            if not self.log.is_leader():   # cut off: what it waited for (meta/raft/local_commit.py) may never commit
                raise rejection(503, "NO_LEADER", "this node stopped leading while it caught up with its log; retry")
            raise rejection(503, "OVERLOADED", "the leader has not applied its committed log in time; retry")

    async def _decide(self, group: str, member: str, topics: list[str], mode: str,
                      released: list[dict[str, Any]]) -> None:
        """What of a heartbeat enters the log: a join or a change of topics, and releases."""
        g = self.reads.image.groups.get(group)   # one dict lookup: a stale answer only costs a redundant JoinGroup
        m = g["members"].get(member) if g is not None else None
        if m is None or m["topics"] != topics or m["mode"] != mode:
            answer(await self.log.propose({"type": "JoinGroup", "group": group, "member": member, "topics": topics,
                                           "mode": mode}, None, f"client:{member}"))
        if released:
            answer(await self.log.propose({"type": "ReleaseLocks", "group": group, "member": member,
                                           "locks": released}, None, f"client:{member}"))

    def _assignments(self, group: str, member: str) -> tuple[int, dict[str, list[dict[str, Any]]], dict[str, Any]]:
        """The member's owned and revoking queues, from a per-group-version cache (bounded by GROUPS_MAX): a heartbeat
        must not scan the lock table."""
        def look(image: Image):
            g = image.groups.get(group)
            if g is None:  # only after a leave raced this heartbeat
                return image.version, {}, groups.effective_config(group, None)
            cached = self._answers.get(group)
            if cached is None or cached[0] != g["version"]:
                cached = (g["version"], groups.assignments_by_member(g), groups.effective_config(group, g))
                self._answers[group] = cached
            return image.version, cached[1], cached[2]
        version, by_member, config = self.reads.read(look)
        return version, by_member.get(member, {"owned": [], "revoking": []}), config

    def forget(self, group: str, member: str) -> None:
        """The member left: its lease no longer runs."""
        self._seen.pop((group, member), None)
        self._seen_wall.pop((group, member), None)
        self._promised_until.pop((group, member), None)

    def lease_expires_ms(self, group: str, member: str, lease_ms: int) -> int | None:
        wall = self._seen_wall.get((group, member))
        return wall + lease_ms if wall is not None and self.log.is_leader() else None

    async def _ready(self) -> None:
        """A new leader serves heartbeats once a read index of its own term was served (see the module's docstring:
        it needs an entry of this term committed and applied, meta/raft/read_index.py), and
        once its leases started afresh: the expiry loop may not have run in this term yet, and a reset after a
        heartbeat's answer would move the lease end that answer showed."""
        term = self.log.term()
        if self._ready_term != term:
            await self.reads.linearizable(READ_INDEX_WAIT_S)   # 503 NO_LEADER when no leader confirms it in time
            self._begin_term(term, time.monotonic())
            self._ready_term = term

    def _begin_term(self, term: int, now: float) -> bool:
        """Start every lease afresh once per term led, whichever of the expiry loop and a heartbeat comes first."""
        if self._led_term == term:
            return False
        self._reset(now)
        self._led_term = term
        return True

    # -- expiry (leader only) ----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Propose the expiry of silent members and of revoked queues whose lease ended. A task: cancelled on stop."""
        await run_every(LEASE_CHECK_INTERVAL_S, self._check, "group_lease_check_failed")

    async def _check(self) -> None:
        if not self.log.is_leader():
            self._led_term = None
            return
        now = time.monotonic()
        if self._begin_term(self.log.term(), now):
            return
        members, locks = self.reads.read(lambda im: self._due(im, now))
        for group, names in sorted(members.items()):
            await self._expire_members(group, names)
        for group, refs in sorted(locks.items()):
            for i in range(0, len(refs), limits.EXPIRIES_PER_COMMAND_MAX):
                chunk = refs[i:i + limits.EXPIRIES_PER_COMMAND_MAX]
                log.info("group_revocations_expired", group=group, locks=len(chunk))
                await self.log.propose({"type": "ExpireLocks", "group": group, "locks": chunk}, None, "system")

    def _reset(self, now: float) -> None:
        """A new leader cannot know when the old one last heard each member: every lease starts afresh. Nor what
        its answers promised: a member is counted as promised the longest lease an answer given before its group's
        lease_ms was last shortened may still carry (it used to be forgotten, and a queue moved seconds before the
        lease its holder was promised ended)."""
        wall_ms = int(time.time() * 1000)

        def members(image: Image):
            # At least the lease_ms of now, as promised: counted as silence only against the setting, a member
            # whose last answer (from the old leader) carried it was expired as soon as an operator shortened
            # lease_ms after this reset, seconds before that answer's lease ended (the simulator, 2026-12-01)
            return [((g, m), max(groups.lease_still_promised_ms(v, wall_ms),
                                 groups.effective_config(g, v)["lease_ms"]))
                    for g, v in image.groups.items() for m in v["members"]]
        found = self.reads.read(members)
        self._seen = {k: now for k, _ in found}
        self._seen_wall = {k: wall_ms for k in self._seen}   # the lease ends shown are this leader's
        self._promised_until = {k: now + promised / 1000 for k, promised in found}
        self._release_at = {}
        self._answers = {}

    def _due(self, image: Image, now: float) -> tuple[dict[str, list[str]], dict[str, list[dict[str, Any]]]]:
        """Members silent for their group's lease, and revoked locks whose lease ended. Under the image lock."""
        members: dict[str, list[str]] = {}
        lease_s_of: dict[str, float] = {}
        for key in list(self._seen):
            group, member = key
            g = image.groups.get(group)
            lease_s = lease_s_of.get(group)
            if lease_s is None:
                lease_s = lease_s_of[group] = groups.effective_config(group, g)["lease_ms"] / 1000
            if now <= max(self._seen[key] + lease_s, self._promised_until.get(key, 0.0)):
                continue
            if g is not None and member in g["members"]:
                members.setdefault(group, []).append(member)
            else:  # left, or expired already (a member whose join is still in flight is never this old)
                self.forget(group, member)
        wall_ms = int(time.time() * 1000)
        for group, g in image.groups.items():   # members joined through an older leader's log and never heard here
            for member in g["members"]:
                if (group, member) not in self._seen:
                    self._seen[(group, member)] = now
                    self._seen_wall[(group, member)] = wall_ms
                    # promised like the members of a reset: the older leader may have answered it
                    lease_s = groups.effective_config(group, g)["lease_ms"] / 1000
                    self._promised_until[(group, member)] = max(self._promised_until.get((group, member), 0.0),
                                                                now + lease_s)
        locks: dict[str, list[dict[str, Any]]] = {}
        current: set[LockKey] = set()
        for group in image.data["revoking"]:
            g = image.groups[group]
            lease_s = groups.effective_config(group, g)["lease_ms"] / 1000
            for topic, qs in g["locks"].items():
                for q, lk in qs.items():
                    if groups.owned(lk):
                        continue
                    key = (group, topic, int(q), lk["token"])
                    current.add(key)
                    release = self._release_at.get(key)
                    if release is None:   # first seen revoked: no answer from now on lists it as owned
                        holder = self._promised_until.get((group, lk["member"]), 0.0)
                        release = self._release_at[key] = max(now + lease_s, holder)
                    if now > release:
                        locks.setdefault(group, []).append({"topic": topic, "queue": int(q), "token": lk["token"]})
        self._release_at = {k: v for k, v in self._release_at.items() if k in current}
        return members, locks

    async def _expire_members(self, group: str, names: list[str]) -> None:
        for i in range(0, len(names), limits.EXPIRIES_PER_COMMAND_MAX):
            chunk = sorted(names[i:i + limits.EXPIRIES_PER_COMMAND_MAX])
            done = asyncio.Event()
            for m in chunk:
                self._expiring[(group, m)] = done
                self.forget(group, m)
            log.warning("group_members_expired", group=group, members=chunk[:20], count=len(chunk))
            try:
                await self.log.propose({"type": "ExpireMembers", "group": group, "members": chunk}, None, "system")
            finally:
                for m in chunk:
                    self._expiring.pop((group, m), None)
                done.set()
