"""The nemesis: a fault schedule drawn from a seeded ``random.Random`` (the same seed, duration and kinds give the
same schedule), and the executor that applies each fault and heals it after its hold time.

Faults come one after another (a gap, a fault held for a bounded time, its heal), so the cluster always gets back
to whole between two faults; what a fault does to the cluster's parts is as real as it gets on one machine: kill -9
and restart of the process, SIGSTOP/SIGCONT of its process group, SIGTERM and restart, and cut proxies (topology.py).

``wipe`` kills a meta node with kill -9, removes its whole data directory (journal, snapshot, disk identity,
projection) and starts it again empty, as an operator who replaced a failed disk would: it must rejoin as a learner,
catch up from the leader and be promoted (meta/raft/membership.py) without the cluster losing an acknowledged write.

``replace`` takes a meta node out of the members through the log (``DELETE /v1/cluster/members/X``: when it leads,
it hands its leadership over first), kills it and wipes its disk, then adds it back as a new member on the same
addresses (the proxies stay the node's), starts it empty and promotes it once it caught up, as an operator who
replaces a host would, one membership change at a time.

``install`` makes the leader send a follower its snapshot: the follower is cut from both peers for longer than the
leader takes to compact its log (topology.COMPACTION_MIN_TIME_S: every node compacts every few seconds under the
workloads), so once healed it is behind the leader's first entry and only a snapshot brings it back; some installs
end in a kill -9 of the follower a moment after the heal, while the snapshot is on its way or being installed.

``power`` is a power loss: kill -9 of a member, then runtime/power_loss.lose_unsynced on its data directory (every
member runs with the power-loss ledger in chaos runs, topology.py), so it loses every write it had not synced, and
half of the time a piece of the lost tail stays behind as a torn write; then it starts again. One power fault in
POWER_ALL_SHARE is the whole machine's: every member at once. The kill is aimed: the members are frozen and their
ledgers read until one holds a write it has not synced yet (``_aim``), since the members sync within milliseconds of
each write and a kill at an arbitrary moment almost always finds nothing to lose. What each lost, and the freezes
the aim took (``aim``), are in the fault's record.

``rejoin_leader_loss`` is faults in combination, which a schedule of one fault at a time meets only by luck: a meta
follower is cut off until it is stale, the other follower's disk is wiped and it starts empty (a learner again),
and right after, the leader is killed and the stale one healed; the two are left without the leader for the hold.
A wiped node that voted would make the stale one a leader missing acknowledged writes.

``leader_cut`` cuts the meta leader of the moment from both peers, for longer than the others take to elect a new
one, then heals. The runner's clients keep talking to every meta node directly, so they keep sending writes to the
cut-off leader: none of them may be acknowledged unless the new majority has it.

The broker faults reach the queues' replication (broker/replication, meta/deciders/replicas.py): every head has
copies on the three brokers, a send is acknowledged once every in-sync copy holds it, and a lost leader's heads fail
over to an in-sync copy that reports its own end as the seal.
``broker_wipe`` is ``wipe`` for a broker: kill -9, its whole data directory removed, down for the hold, then started
again on the empty disk. It registers again (meta fails over each head it led, unless its session lapsed first: the
hold runs past the session timeout now and then), catches up as a follower and is added back to the in-sync sets by
the leaders. Before a disk is taken, every head must have a copy in sync besides the broker's (bounded, as ``wipe``
waits for every meta node to vote): the wipe never takes the last copy of an acknowledged record.
``broker_partition`` cuts one broker off: ``bN|meta`` from every meta node (its session lapses, meta fences it and
fails its heads over), ``bN|peers`` from the other brokers (its front proxy: no follower can fetch from it, so the
sends it leads cannot be acknowledged), ``bN|all`` both. The runner's senders reach brokers on their own ports
around the front proxy (topology.py), so a leader cut off from everyone keeps being sent to: none of what it takes
may be acknowledged unless its copies hold it, whatever the log decides meanwhile. Its own fetches as a follower go
through the other brokers' fronts and stay up: a partition is of its inbound peer links and its meta links.
Each broker fault's record names the heads the broker led when it was hit (``led``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from ops import devcluster
from runtime import power_loss

from .topology import COMPACTION_MIN_TIME_S, Topology


KINDS = ("kill", "pause", "restart", "partition", "install", "wipe", "replace", "power", "leader_cut", "broker_wipe",
         "broker_partition", "rejoin_leader_loss")
BROKER_KINDS = ("broker_wipe", "broker_partition")
# A power loss is drawn twice as often as each other kind: it is the fault that reaches the unsynced writes of
# every store at once, and issue 20 asks a 600 s run for twenty of them.
KIND_WEIGHTS = {"power": 2}
GAP_S = (0.2, 1.0)                  # between a heal and the next fault
# An install's cut lasts two compaction periods and more: the leader compacts once per period in a slot of its own
# (pysyncobj's logCompactionSplit), and its snapshot must be written and its log cut past the follower's last entry.
HOLD_S = {"kill": (0.5, 3.0), "pause": (0.5, 4.0), "restart": (0.2, 1.5), "partition": (1.0, 5.0), "wipe": (0.5, 3.0),
          "replace": (0.5, 2.0), "power": (0.2, 2.0),
          # longer than an election (meta's election timeout is at most 0.5 s, then a vote round)
          "leader_cut": (2.0, 5.0),
          # rejoin_leader_loss: how long the stale node and the rejoining one are left without the leader
          "rejoin_leader_loss": (1.0, 4.0),
          "install": (2 * COMPACTION_MIN_TIME_S + 1.5, 2 * COMPACTION_MIN_TIME_S + 4.5),
          # across the chaos meta's session timeout (topology.META_EXTRA, 4 s): a broker back before it lapses is
          # failed over by its new registration, one away for longer by its fence, and the leader it was cut from
          # keeps being sent to for seconds before it notices
          "broker_wipe": (0.5, 6.0), "broker_partition": (2.0, 8.0)}
BROKER_PARTITION_SIDES = {"all": 2, "meta": 1, "peers": 1}   # weights of what a broker_partition cuts
INSTALL_KILL_SHARE = 0.5            # installs that end in a kill -9 of the follower ...
INSTALL_KILL_AFTER_S = (0.0, 1.5)   # ... this long after the heal: the snapshot is sent or installed by then
POWER_ALL_SHARE = 0.25              # power faults that take every member down at once
POWER_TEAR_SHARE = 0.5              # power faults that leave a piece of each lost tail behind
STATUS_TIMEOUT_S = 1.0
LEADER_WAIT_S = 15.0                # leader_cut: an election after the previous fault (a whole-machine power loss
                                    # restarts every meta node: each takes seconds to start) must end by then
LEADER_POLL_S = 0.2                 # asking a node who leads
# A power loss is aimed at unsynced writes: its targets are frozen (SIGSTOP) and their ledgers read; with nothing
# unsynced they run on for a moment and are frozen again, at most POWER_AIM_TRIES times. A loss at an arbitrary
# instant almost never meets a write between its write() and its sync (a run of 34 power faults lost 0 bytes).
# A lone member syncs within milliseconds of each write: 60 freezes found nothing to lose in 2 of 3 single-member
# power faults of a 120 s run at seed 7, hence more.
POWER_AIM_TRIES = 150
POWER_AIM_GAP_S = (0.001, 0.03)     # between two freezes
FROZEN_WAIT_S = 1.0                 # until every thread of a frozen member has stopped
STALE_FOR_S = 1.5                   # rejoin_leader_loss: the stale node is cut off this long before the wipe ...
LEADER_LOST_AFTER_S = (0.0, 1.0)    # ... and the leader is killed this long after the wiped node was started
FIRST_FAULT_S = 1.0                 # let the workloads start first
STOP_WAIT_S = 15.0                  # a stop or start of one member (devcluster waits up to 10 s + 5 s for a kill)
MEMBERSHIP_DEADLINE_S = 60.0        # a membership change that keeps being refused (another in flight, no leader)
MEMBERSHIP_RETRY_S = 0.25
VOTERS_DEADLINE_S = 60.0            # wipe and replace: until every meta node votes again (a wiped one caught up)
IN_SYNC_DEADLINE_S = 30.0           # broker_wipe: until every head has a copy in sync besides the broker's
# (method, on the collection): the refusal that means an earlier attempt did it
POWER_ALL = "all"                   # a power fault's target: every member
LEADER = "leader"                   # a leader_cut's target: the meta leader when the fault is applied
DONE_ALREADY = {("DELETE", False): "MEMBER_NOT_FOUND", ("POST", True): "MEMBER_EXISTS",
                ("POST", False): "ALREADY_VOTER"}


@dataclass(frozen=True)
class Fault:
    at_s: float        # after the start of the run
    kind: str
    target: str        # "m2", "b1", or for a partition "m2|rest" (a meta node from the others) / "b1|meta"; for a
                       # broker_partition also "b1|peers" (from the other brokers) and "b1|all" (both)
    hold_s: float
    # install only: kill -9 the follower this long after the heal (None: let the install finish)
    kill_after_s: float | None = None
    tear: bool | None = None   # power only: whether the lost tails are torn

    def describe(self) -> str:
        kill = f", kill -9 {self.kill_after_s:.2f}s after" if self.kill_after_s is not None else ""
        tear = ", torn" if self.tear else ""
        return f"{self.at_s:7.2f}s {self.kind:<16} {self.target:<8} for {self.hold_s:.2f}s{kill}{tear}"


def schedule(seed: int, duration_s: float, kinds: tuple[str, ...], topology_names: tuple[list[str], list[str]]
             ) -> list[Fault]:
    """Every fault, healed before ``duration_s`` ends. Pure: only the arguments decide it."""
    rng = random.Random(seed)
    metas, brokers = topology_names
    faults: list[Fault] = []
    t = FIRST_FAULT_S
    while True:
        kind = rng.choices(kinds, weights=[KIND_WEIGHTS.get(k, 1) for k in kinds])[0]
        hold = round(rng.uniform(*HOLD_S[kind]), 3)
        kill_after = tear = None
        if kind == "partition":
            if rng.random() < 0.5:
                target = f"{rng.choice(metas)}|rest"
            else:
                target = f"{rng.choice(brokers)}|meta"
        elif kind == "install":
            # the follower to cut; should it lead when its turn comes, the next meta node is cut instead
            target = f"{rng.choice(metas)}|rest"
            if rng.random() < INSTALL_KILL_SHARE:
                kill_after = round(rng.uniform(*INSTALL_KILL_AFTER_S), 3)
        elif kind in ("wipe", "replace"):
            target = rng.choice(metas)   # a broker's disk is its messages: not what this fault is about
        elif kind == "power":
            target = POWER_ALL if rng.random() < POWER_ALL_SHARE else rng.choice(metas + brokers)
            tear = rng.random() < POWER_TEAR_SHARE
        elif kind == "rejoin_leader_loss":
            target = rng.choice(metas)   # the node to wipe; should it lead when its turn comes, another is wiped
        elif kind == "leader_cut":
            target = f"{LEADER}|rest"    # who leads is known only when the fault comes
        elif kind == "broker_wipe":
            target = rng.choice(brokers)
        elif kind == "broker_partition":
            sides = list(BROKER_PARTITION_SIDES)
            side = rng.choices(sides, weights=[BROKER_PARTITION_SIDES[x] for x in sides])[0]
            target = f"{rng.choice(brokers)}|{side}"
        else:
            target = rng.choice(metas + brokers)
        if t + hold + (kill_after or 0.0) > duration_s:
            return faults
        faults.append(Fault(round(t, 3), kind, target, hold, kill_after, tear))
        t += hold + (kill_after or 0.0) + rng.uniform(*GAP_S)


class Nemesis:
    """Applies a schedule to a running chaos cluster; ``heal_all`` puts everything back whatever happened."""

    def __init__(self, topology: Topology, faults: list[Fault], clock):
        self.t = topology
        self.faults = faults
        self.clock = clock                 # seconds since the run started (history.Recorder.now)
        self.applied: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._paused: set[str] = set()
        self._down: set[str] = set()
        self._cut: dict[Fault, str] = {}   # install: the follower actually cut; leader_cut: the leader
        self._roles: dict[Fault, dict[str, str]] = {}   # rejoin_leader_loss: the leader, the wiped and the stale
        self._lost: dict[Fault, dict[str, dict[str, int]]] = {}   # power: what each member lost
        self._aimed: dict[Fault, dict[str, Any]] = {}             # power: what its aim took and found
        self._led: dict[Fault, dict[str, list[int]] | None] = {}   # broker faults: the heads the broker led
        self._whole: set[tuple[str, str]] = set()   # (physical queue, broker): a sealed copy seen whole there
        self._wiped_epoch: dict[str, int] = {}      # broker -> its session epoch when its disk was last taken away

    async def run(self) -> None:
        for f in self.faults:
            await asyncio.sleep(max(0.0, f.at_s - self.clock()))
            started, started_wall = self.clock(), time.time()
            applied = None
            try:
                await self._apply(f)
                applied = self.clock()   # after the waits before a fault (a wipe's): when it struck
                await asyncio.sleep(f.hold_s)
            except (OSError, RuntimeError, KeyError, asyncio.TimeoutError) as e:
                # a fault that could not be applied is reported (the run then gives no verdict), not fatal
                self.errors.append(f"applying {f.describe()}: {type(e).__name__}: {e}")
            finally:
                await self._heal(f)
            # wall times too: the members' logs are stamped with them
            record = {**asdict(f), "started_s": round(started, 3), "healed_s": round(self.clock(), 3),
                      "applied_s": None if applied is None else round(applied, 3),
                      "started_wall": round(started_wall, 3), "healed_wall": round(time.time(), 3)}
            if f in self._cut:
                record["isolated"] = self._cut.pop(f)
            if f in self._lost:
                record["power_loss"] = self._lost.pop(f)
            if f in self._aimed:
                record["aim"] = self._aimed.pop(f)
            if f in self._led:
                record["led"] = self._led.pop(f)
            if f in self._roles:
                record["roles"] = self._roles.pop(f)
            self.applied.append(record)

    async def _apply(self, f: Fault) -> None:
        name = f.target.split("|")[0]
        if f.kind == "install":
            self._cut[f] = await asyncio.to_thread(self._follower, name)
            self._set_cut(f"{self._cut[f]}|rest", True)
        elif f.kind == "leader_cut":
            self._cut[f] = await asyncio.to_thread(self._leader)
            self._set_cut(f"{self._cut[f]}|rest", True)
        elif f.kind == "power":
            await self._power_loss(f)
        elif f.kind == "rejoin_leader_loss":
            await self._rejoin_leader_loss(f, name)
        elif f.kind == "kill":
            await self._stop(name, signal.SIGKILL)
        elif f.kind == "wipe":
            await asyncio.to_thread(self._every_meta_node_votes)
            await self._stop(name, signal.SIGKILL)
            await asyncio.to_thread(_wipe, os.path.join(self.t.dir, name, "data"))
        elif f.kind == "broker_wipe":
            await asyncio.to_thread(self._another_copy_in_sync, name)
            self._led[f] = await asyncio.to_thread(self._heads_led, name)
            await self._stop(name, signal.SIGKILL)
            await asyncio.to_thread(_wipe, os.path.join(self.t.dir, name, "data"))
        elif f.kind == "replace":
            await asyncio.to_thread(self._every_meta_node_votes)
            await asyncio.to_thread(self._membership, "DELETE", f"/{name}", None, name)
            await self._stop(name, signal.SIGKILL)
            await asyncio.to_thread(_wipe, os.path.join(self.t.dir, name, "data"))
        elif f.kind == "restart":
            await self._stop(name, signal.SIGTERM)
        elif f.kind == "pause":
            self._signal(name, signal.SIGSTOP)
            self._paused.add(name)
        elif f.kind in ("partition", "broker_partition"):
            if f.kind == "broker_partition":
                self._led[f] = await asyncio.to_thread(self._heads_led, name)
            self._set_cut(f.target, True)

    async def _heal(self, f: Fault) -> None:
        name = f.target.split("|")[0]
        try:
            if f.kind in ("kill", "restart", "wipe", "broker_wipe"):
                if name in self._down:   # not when the fault was never applied (a wipe that waited in vain)
                    await self._start(name)
            elif f.kind == "replace":
                await self._rejoin(name)
            elif f.kind == "pause":
                self._signal(name, signal.SIGCONT)
                self._paused.discard(name)
            elif f.kind in ("partition", "broker_partition"):
                self._set_cut(f.target, False)
            elif f.kind == "install" and f in self._cut:
                await self._end_install(f, self._cut[f])
            elif f.kind == "leader_cut" and f in self._cut:
                self._set_cut(f"{self._cut[f]}|rest", False)
            elif f.kind == "power":
                for member in self._power_targets(f):   # meta nodes first: brokers register with them
                    await self._start(member)
            elif f.kind == "rejoin_leader_loss" and f in self._roles:
                roles = self._roles[f]
                self._set_cut(f"{roles['stale']}|rest", False)
                for member in (roles["leader"], roles["wiped"]):
                    if member in self._down:
                        await self._start(member)
        except Exception as e:   # noqa: BLE001 -- reported in the summary; heal_all tries again at the end
            self.errors.append(f"healing {f.describe()}: {type(e).__name__}: {e}")

    async def _end_install(self, f: Fault, name: str) -> None:
        self._set_cut(f"{name}|rest", False)
        if f.kill_after_s is None:
            return
        await asyncio.sleep(f.kill_after_s)
        await self._stop(name, signal.SIGKILL)
        await self._start(name)

    async def _rejoin(self, name: str) -> None:
        i = self.t.meta_names.index(name)
        member = {"node": name, "raft": f"127.0.0.1:{self.t.raft_port(i)}", "url": self.t.meta_url(i)}
        await asyncio.to_thread(self._membership, "POST", "", member, name)
        await self._start(name)
        await asyncio.to_thread(self._membership, "POST", f"/{name}/promote", None, name)

    def _membership(self, method: str, path: str, body: dict[str, Any] | None, name: str) -> None:
        """One membership change, through any other meta node (forwarded to the leader), retried while it is
        refused for now (another change in flight, a learner not caught up yet, no leader) until the deadline."""
        cluster = self.t.cluster()
        others = [self.t.meta_url(i) for i, n in enumerate(self.t.meta_names) if n != name]
        deadline = time.monotonic() + MEMBERSHIP_DEADLINE_S
        k, last = 0, ""
        while time.monotonic() < deadline:
            url = others[k % len(others)]
            k += 1
            req = urllib.request.Request(f"{url}/v1/cluster/members{path}", method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"Bearer {cluster['admin_token']}",
                                                  "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=MEMBERSHIP_DEADLINE_S / 4) as r:
                    r.read()
                    return
            except urllib.error.HTTPError as e:
                answer = e.read(4096).decode("utf-8", "replace")
                # Done already by an earlier attempt whose answer was lost (a leader change in between).
                if _error_code(answer) == DONE_ALREADY[(method, path == "")]:
                    return
                last = f"{e.code} {answer[:300]}"
                if e.code not in (409, 503):
                    break
            except (urllib.error.URLError, OSError) as e:
                last = repr(e)
            time.sleep(MEMBERSHIP_RETRY_S)
        raise RuntimeError(f"{method} /v1/cluster/members{path} for {name}: not done in time; last answer {last}")

    def _power_targets(self, f: Fault) -> list[str]:
        return self.t.meta_names + self.t.broker_names if f.target == POWER_ALL else [f.target]

    async def _power_loss(self, f: Fault) -> None:
        """kill -9 of every target at once, aimed at a moment when one of them has written what it has not synced,
        then each loses what it had not synced (the aim and the tear's length drawn from a generator seeded by the
        fault, so a run's losses are as repeatable as the kernel lets them be)."""
        names = self._power_targets(f)
        rng = random.Random(f"{f.at_s}/{f.target}")
        self._aimed[f] = await asyncio.to_thread(self._aim, names, rng)
        await asyncio.gather(*(self._stop(n, signal.SIGKILL) for n in names))
        lost = {}
        for n in names:
            loss = await asyncio.to_thread(power_loss.lose_unsynced, self._data_dir(n), rng, bool(f.tear))
            lost[n] = loss.as_dict()
        self._lost[f] = lost

    def _aim(self, names: list[str], rng: random.Random) -> dict[str, Any]:
        """Freeze ``names`` until one of them holds unsynced writes (or POWER_AIM_TRIES freezes found none); they
        are left frozen, for the kill. Returns the freezes it took and whether it found unsynced writes."""
        for attempt in range(1, POWER_AIM_TRIES + 1):
            try:
                for n in names:
                    self._signal(n, signal.SIGSTOP)
                for n in names:
                    devcluster.wait_frozen(_pid(self.t, n), FROZEN_WAIT_S)
                found = any(power_loss.unsynced_bytes(self._data_dir(n)) for n in names)
                if found or attempt == POWER_AIM_TRIES:
                    return {"tries": attempt, "found": found}
            except BaseException:
                for n in names:   # never left frozen: no heal would continue them
                    self._signal(n, signal.SIGCONT)
                raise
            for n in names:
                self._signal(n, signal.SIGCONT)
            time.sleep(rng.uniform(*POWER_AIM_GAP_S))
        return {"tries": POWER_AIM_TRIES, "found": False}

    def _data_dir(self, name: str) -> str:
        return os.path.join(self.t.dir, name, "data")

    async def _rejoin_leader_loss(self, f: Fault, preferred: str) -> None:
        """A follower cut off until it is stale, another follower's disk wiped and started empty (rejoining as a
        learner), then, a moment later, the leader killed and the stale one healed: the stale node and the empty one
        are left together without the leader for the hold. The empty node must not help the stale one to a majority
        (it has no log to vote with until it is promoted again), or the stale leader they elect would take back
        acknowledged writes; the healed cluster must lose nothing."""
        await asyncio.to_thread(self._every_meta_node_votes)
        leader = await asyncio.to_thread(self._leader)
        wiped = preferred if preferred != leader else next(n for n in self.t.meta_names if n != leader)
        stale = next(n for n in self.t.meta_names if n not in (leader, wiped))
        self._roles[f] = {"leader": leader, "wiped": wiped, "stale": stale}
        rng = random.Random(f"{f.at_s}/{f.target}")
        self._set_cut(f"{stale}|rest", True)
        await asyncio.sleep(STALE_FOR_S)            # the writes go on without it
        await self._stop(wiped, signal.SIGKILL)
        await asyncio.to_thread(_wipe, self._data_dir(wiped))
        await self._start(wiped)
        await asyncio.sleep(rng.uniform(*LEADER_LOST_AFTER_S))
        await self._stop(leader, signal.SIGKILL)
        self._set_cut(f"{stale}|rest", False)

    def _leader(self) -> str:
        """The meta node that says it leads, asked again while an election is under way (the previous fault's heal
        may have just started one); RuntimeError when none does by LEADER_WAIT_S: the fault is then reported as not
        applied rather than cutting a follower and calling it the leader."""
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            for name in self.t.meta_names:
                if self._role(name) == "leader":
                    return name
            if time.monotonic() > deadline:
                raise RuntimeError(f"no meta node said it leads within {LEADER_WAIT_S:g} s")
            time.sleep(LEADER_POLL_S)

    def _follower(self, preferred: str) -> str:
        """``preferred`` unless it says it leads; then the next meta node (which, with one leader, follows)."""
        if self._role(preferred) != "leader":
            return preferred
        names = self.t.meta_names
        return names[(names.index(preferred) + 1) % len(names)]

    def _role(self, name: str) -> str | None:
        """The node's own view of its role (None when it does not answer in time)."""
        return (self._status(name) or {}).get("role")

    def _status(self, name: str) -> dict[str, Any] | None:
        """The node's /v1/cluster answer (None when it does not answer in time)."""
        return self._get(name, "/v1/cluster")

    def _get(self, name: str, path: str) -> Any:
        """A meta node's JSON answer to a GET (None when it does not answer in time, or refuses)."""
        cluster = self.t.cluster()
        url = self.t.meta_url(self.t.meta_names.index(name))
        req = urllib.request.Request(f"{url}{path}",
                                     headers={"Authorization": f"Bearer {cluster['client_token']}"})
        try:
            with urllib.request.urlopen(req, timeout=STATUS_TIMEOUT_S) as r:
                return json.load(r)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _heads(self) -> list[dict[str, Any]] | None:
        """The head segment of every queue of every topic (None when no meta node answers)."""
        chains = self._chains()
        return None if chains is None else [c[-1] for c in chains]

    def _chains(self) -> list[list[dict[str, Any]]] | None:
        """Every segment of every queue of every topic, oldest first, each with its topic and queue, from one
        linearizable read of each topic through the first meta node that answers every read (None when none
        does)."""
        linear = "?consistency=linearizable"
        for name in self.t.meta_names:
            listed = self._get(name, f"/v1/topics{linear}")
            if not listed:
                continue
            chains = []
            for summary in listed["topics"]:
                topic = self._get(name, f"/v1/topics/{urllib.parse.quote(summary['topic'], safe='')}{linear}")
                if topic is None:
                    break
                chains += [[{"topic": topic["topic"], "queue": q["queue"], **s} for s in q["segments"]]
                           for q in topic["logic_queues"] if q["segments"]]
            else:
                return chains
        return None

    def _epochs(self) -> dict[str, int]:
        """Each broker's session epoch as meta has it (empty when no meta node answers)."""
        for name in self.t.meta_names:
            listed = self._get(name, "/v1/brokers?consistency=linearizable")
            if listed:
                return {b["broker"]: b["epoch"] for b in listed["brokers"]}
        return {}

    def _not_back(self) -> set[str] | None:
        """Brokers that hold no copy meta may still count: down, or wiped and not registered again since."""
        if not self._wiped_epoch:
            return set(self._down)
        epochs = self._epochs()
        if not epochs:
            return None
        return set(self._down) | {b for b, e in self._wiped_epoch.items() if epochs.get(b, 0) <= e}

    def _whole_elsewhere(self, seg: dict[str, Any], broker: str, token: str) -> bool:
        """Whether a broker other than ``broker``, up, holds the sealed segment ``seg`` whole (asked directly, not
        through the proxies; a broker once seen whole stays so until its own disk is taken away)."""
        end = seg["physical_start"] + seg["logic_end"] - seg["logic_start"]
        if end <= seg["physical_start"]:
            return True   # sealed empty: every copy holds all of it, made or not
        if seg.get("sealed_by") in ("session_expired", "disk_lost"):   # sealed at a budget: its copies end short
            return self._longest_elsewhere(seg, broker, token)
        for b in seg["replicas"]:
            if b == broker or b in self._down:
                continue
            if (seg["physical_queue"], b) in self._whole:
                return True
            held = self._held(seg, b, token)
            if held is not None and held >= end:
                self._whole.add((seg["physical_queue"], b))
                return True
        return False

    def _longest_elsewhere(self, seg: dict[str, Any], broker: str, token: str) -> bool:
        """A segment sealed at its budget (no copy in sync was left to report its end: DESIGN.md invariant 5's
        bounded jump): no copy ever holds up to that end, so "whole" would never be met and every later wipe was
        refused (seed 9: 13 of 14). Another broker up must hold at least what ``broker``'s copy holds."""
        held = {b: self._held(seg, b, token) for b in seg["replicas"] if b not in self._down}
        mine = held.get(broker) or 0
        return any(h is not None and h >= mine for b, h in held.items() if b != broker)

    def _held(self, seg: dict[str, Any], broker: str, token: str) -> int | None:
        """The end of ``broker``'s copy of ``seg`` (None: it did not answer)."""
        url = self.t.broker_url(self.t.broker_names.index(broker))
        req = urllib.request.Request(f"{url}/v1/physical/{seg['physical_queue']}?offset=0&max=0"
                                     f"&start={seg['physical_start']}", headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=STATUS_TIMEOUT_S) as r:
                return json.load(r)["max_offset"]
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return None

    def _heads_led(self, broker: str) -> dict[str, list[int]] | None:
        """The queues whose head ``broker`` leads, by topic, as the log has it now (None: meta did not answer)."""
        heads = self._heads()
        if heads is None:
            return None
        led: dict[str, list[int]] = {}
        for h in heads:
            if h["broker"] == broker:
                led.setdefault(h["topic"], []).append(h["queue"])
        return led

    def _another_copy_in_sync(self, broker: str) -> None:
        """Before ``broker``'s disk is taken away: wait (bounded) until every segment keeps a copy without it. An open
        or sealing segment needs another copy in sync: every acknowledged record is on each, so one survives the wipe
        and meta fails over to it. A broker down, or wiped and not registered again yet, is still named in sync until
        meta hears of it, and holds nothing (seed 9: b3's disk went while b2's, gone a moment before, was still
        named). A sealed segment needs another broker holding it whole: one back on a new disk copies it again, and
        until then ``broker``'s may be the last (seed 9: three disks within seconds). Taking the last copy is two or
        three disks lost for that segment, which three copies do not promise to survive (as _every_meta_node_votes,
        for meta's disks)."""
        deadline = time.monotonic() + IN_SYNC_DEADLINE_S
        alone: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            # Who is back first, then the chains: a broker wiped that registers again in between is then either
            # still counted gone, or already out of every in-sync set the chains show (the registration's own
            # log entry removes it). The other order once counted a wiped broker as a holder of the commits it had
            # lost, and the next wipe took the last copy of them (seed 9: committed offsets read back as -1).
            gone = self._not_back()
            chains = self._chains()
            if chains is not None and gone is not None:
                token = self.t.cluster()["admin_token"]
                alone = [s for c in chains for s in c
                         if (not set(s["in_sync"]) - {broker} - gone if s["state"] != "sealed" else
                             broker in s["replicas"] and s["logic_start"] is not None
                             and not self._whole_elsewhere(s, broker, token))]
                if not alone:
                    self._whole = {(pq, b) for pq, b in self._whole if b != broker}   # its disk goes now
                    self._wiped_epoch[broker] = self._epochs().get(broker, 0)
                    return
            time.sleep(MEMBERSHIP_RETRY_S)
        shown = [{k: h[k] for k in ("topic", "queue", "gen", "replicas", "in_sync")} for h in alone[:3]]
        raise RuntimeError(f"{broker} is still the only copy in sync of {len(alone)} segment(s) after "
                           f"{IN_SYNC_DEADLINE_S:g} s (e.g. {shown}): its disk is not taken away now")

    def _every_meta_node_votes(self) -> None:
        """Before a disk is taken away: wait (bounded) until every meta node votes with its own disk again. A second
        disk lost while the last wiped node is still a learner leaves two of three voters' disks gone, a cluster that
        by design never elects a leader again (docs/operations.md, "Two of three disks lost"): no verdict, nothing
        learned. Independent disks do fail that way; the fault stays within what the cluster promises to survive."""
        deadline = time.monotonic() + VOTERS_DEADLINE_S
        while time.monotonic() < deadline:
            if all((self._status(n) or {}).get("voter") is True for n in self.t.meta_names):
                return
            time.sleep(MEMBERSHIP_RETRY_S)
        raise RuntimeError(f"not every meta node votes after {VOTERS_DEADLINE_S:g} s: no disk taken away now")

    def _set_cut(self, target: str, cut: bool) -> None:
        """Cut (or reconnect) every link of ``target`` ("NAME|rest", or for a broker "NAME|meta", "NAME|peers",
        "NAME|all")."""
        for link in self._links(target):
            self.t.links[link].set_cut(cut)

    def _links(self, target: str) -> list[str]:
        name, side = target.split("|")
        if side == "meta":
            return list(self.t.broker_meta_links[name])
        if side == "peers":   # every other broker's fetches come in through it (and clients that use it)
            return [self.t.broker_front_links[name]]
        if side == "all":
            return [*self.t.broker_meta_links[name], self.t.broker_front_links[name]]
        return [link for pair, links in self.t.meta_pair_links.items() if name in pair for link in links]

    async def _stop(self, name: str, sig: int) -> None:
        self._down.add(name)
        await asyncio.wait_for(asyncio.to_thread(devcluster.stop_member, self.t.dir, name, sig), STOP_WAIT_S)

    async def _start(self, name: str) -> None:
        # Not waiting for readiness: a lone meta node is ready only with a majority; the final heal waits for all.
        await asyncio.wait_for(asyncio.to_thread(devcluster.start, self.t.dir, name, False), STOP_WAIT_S)
        self._down.discard(name)

    def _signal(self, name: str, sig: int) -> None:
        pid = _pid(self.t, name)
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass

    async def heal_all(self) -> None:
        """Continue every paused member, reconnect every link, start every member left down."""
        for name in list(self._paused):
            self._signal(name, signal.SIGCONT)
        self._paused.clear()
        for link in self.t.links.values():
            if link.cut:
                link.set_cut(False)
        for name in list(self._down):
            try:
                await self._start(name)
            except RuntimeError:   # already running: a heal got there first
                self._down.discard(name)
            except Exception as e:  # noqa: BLE001 -- reported; the readiness wait names the member
                self.errors.append(f"final heal of {name}: {type(e).__name__}: {e}")

    def resume_all_now(self) -> None:
        """For the emergency path (Ctrl-C): a stopped process would not see SIGTERM until continued."""
        for name in list(self._paused):
            self._signal(name, signal.SIGCONT)
        self._paused.clear()


def _wipe(data_dir: str) -> None:
    """Remove a member's data directory; one that is not there yet (a member started a moment ago, still importing
    when it was stopped again) is as wiped as it gets."""
    try:
        shutil.rmtree(data_dir)
    except FileNotFoundError:
        pass


def _error_code(text: str) -> str | None:
    try:
        return json.loads(text)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _pid(t: Topology, name: str) -> int:
    for m in t.cluster()["meta"] + t.cluster()["brokers"]:
        if m.get("node", m.get("broker")) == name:
            return m["pid"]
    raise KeyError(name)
