"""Membership changes through the log, one at a time (meta/raft/roles.py, issue 24), on real processes.

- A host is replaced under a running writer: a node on a new address is added as a learner, catches up, is
  promoted, and the old one, which leads, is removed (it hands its leadership over first); then the cluster grows to
  five voters and shrinks back to three. No acknowledged write is lost and the writer is never stopped for long.
- An add of a node that never comes up leaves the majority alone and can be undone; bad changes are refused by name.
- A member removed while it was down learns it when it comes back (the leader sends it the log until it holds its
  removal).
- A second change while one is in flight is refused with 409 (the followers are stopped so that the first change
  cannot commit).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from client import AdminClient
from meta.raft import roles as raft_roles
from ops import devcluster
from tests.support import cluster as cluster_mod
from tests.support.meta_http import (NET_ERRORS, BrokerSim, call_any, cluster_status, name_of, node_urls, ok,
                                     wait_until)

pytestmark = pytest.mark.slow

CATCH_UP_S = 60.0        # a new node starts, installs the leader's snapshot and is promoted (loaded 2-core machine)
WRITE_GAP_MAX_S = 15.0   # generous: one election and a forwarded retry; the figure is printed
WRITE_PAUSE_S = 0.02
CHANGE_IN_PROGRESS_S = 30.0   # a membership change asked again while the one before it commits


class Writer:
    """Topic config writes through every live node in turn; every acknowledged one is remembered."""

    def __init__(self, c, topic: str):
        self.c = c
        self.topic = topic
        self.urls = list(c.meta_urls)
        self.acked: dict[int, str] = {}           # version -> the value written
        self.refused: list[tuple[int, object]] = []
        self.gaps: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        await self._task

    async def _run(self) -> None:
        last_ok = time.monotonic()
        i = 0
        while not self._stop.is_set():
            i += 1
            url = self.urls[i % len(self.urls)]
            try:
                s, b, _ = await self.c.call("PUT", f"{url}/v1/topics/{self.topic}/config", json={"n": str(i)},
                                            timeout_s=10.0)
            except NET_ERRORS as e:
                s, b = 0, repr(e)
            if s == 200:
                self.acked[b["version"]] = str(i)
                now = time.monotonic()
                self.gaps.append(now - last_ok)
                last_ok = now
            else:
                self.refused.append((s, b))
            await asyncio.sleep(WRITE_PAUSE_S)


async def _change(c, method: str, path: str, body=None, expect=(200,)) -> dict:
    """One membership change that must succeed. Asked again while the one before it is not committed yet (409
    MEMBERSHIP_CHANGE_IN_PROGRESS, "retry once it is"), as an operator would: a cluster just started may still be
    committing its bootstrap membership (seen in a full suite run), and the previous change's answer may come from
    a node that applied it before the leader's commit index moved on."""
    deadline = time.monotonic() + CHANGE_IN_PROGRESS_S
    while True:
        s, b, _ = await call_any(c, method, f"/v1/cluster/members{path}", json=body)
        if s == 409 and b["error"]["code"] == "MEMBERSHIP_CHANGE_IN_PROGRESS" and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            continue
        assert s in expect, f"{method} /v1/cluster/members{path} {body!r}: expected {expect}, got {s} {b!r}"
        return b


async def _add_and_promote(c, name: str) -> None:
    base = devcluster.free_base_port()
    await _change(c, "POST", "", {"node": name, "raft": f"127.0.0.1:{base + 1}", "url": f"http://127.0.0.1:{base}"},
                  expect=(201,))
    member = await asyncio.to_thread(devcluster.add_meta, c.dir, name, base, base + 1)
    c.reload()
    # The new node knows every meta node started before it, a node added since the start (which may lead by now)
    # included: a connection from a node its config does not name is refused, and it would never get the log.
    with open(member["config"]) as f:
        named = {m["node"] for m in json.load(f)["members"]}
    assert named == {m["node"] for m in c.info["meta"]}, (named, c.info["meta"])

    async def promoted():
        # through any node that answers: the first one may be a member this test removed and killed
        for url in c.meta_urls:
            try:
                s, b, _ = await c.call("POST", f"{url}/v1/cluster/members/{name}/promote", timeout_s=30.0)
            except NET_ERRORS:
                continue
            code = b.get("error", {}).get("code")
            if code == "NOT_A_MEMBER":
                continue
            if code in ("NOT_CAUGHT_UP", "MEMBERSHIP_CHANGE_IN_PROGRESS") or s == 503:
                return None
            assert s == 200, (s, b)
            return b
        return None
    await wait_until(promoted, CATCH_UP_S, f"{name} promoted", interval_s=0.5)


async def _voters(c, url: str) -> dict[str, bool]:
    # Reads answer from the node's applied state (API.md): a follower may not have applied a change the leader has
    # just acknowledged, so the members are read through a barrier, as `etcdctl member list` reads them.
    members = await ok(c, "GET", "/v1/cluster/members?consistency=linearizable", url=url)
    return {m["node"]: m["voter"] for m in members["members"]}


async def _same_image(c, urls: list[str]) -> None:
    async def same():
        digests = [await ok(c, "GET", "/v1/admin/image-digest", url=u) for u in urls]
        return digests if len({(d["version"], d["sha256"]) for d in digests}) == 1 else None
    await wait_until(same, CATCH_UP_S, f"the same image on {urls}")


async def test_replace_the_leader_grow_to_five_and_shrink_back_under_writes(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 120_000}) as c:
        sim = BrokerSim(c)
        try:
            await sim.register("b1", heartbeat=False)
            await ok(c, "POST", "/v1/topics", json={"topic": "w", "queues": 1, "brokers": ["b1"]}, expect=(201,))
            writer = Writer(c, "w")
            writer.start()

            # Replace the leader's host: the new node first, then the old one out (the leader hands over first).
            old, old_url, _ = await node_urls(c)
            await _add_and_promote(c, "m4")
            answer = await _change(c, "DELETE", f"/{old}")
            assert old not in {m["node"] for m in answer["members"]}, answer
            new_leader = await wait_until(lambda: _leader_other_than(c, old), CATCH_UP_S, "a new leader")
            # The removed node says why, once it has applied its removal: the answer to the DELETE can come before
            # that on a loaded machine (the new leader commits it; the old one applies it a moment later).
            async def says_not_a_member():
                s, b, _ = await c.call("GET", f"{old_url}/v1/topics", "client")
                return s == 503 and b["error"]["code"] == "NOT_A_MEMBER"
            await wait_until(says_not_a_member, CATCH_UP_S, f"{old} to answer NOT_A_MEMBER")
            writer.urls = [u for u in c.meta_urls if u != old_url]
            await asyncio.to_thread(c.kill9, old)
            live = [u for u in c.meta_urls if u != old_url]
            assert await _voters(c, live[0]) == {n: True for n in ("m1", "m2", "m3", "m4") if n != old}

            # Grow to five voters, then shrink back to three, all the while writing.
            await _add_and_promote(c, "m5")
            await _add_and_promote(c, "m6")
            live = [u for u in c.meta_urls if u != old_url]
            assert len(await _voters(c, live[0])) == 5 and all((await _voters(c, live[0])).values())
            await _same_image(c, live)
            for name in ("m6", "m5"):
                await _change(c, "DELETE", f"/{name}")
                await asyncio.to_thread(c.kill9, name)
                writer.urls = [u for u in writer.urls if u != c.url(name)]
            live = writer.urls
            assert set(await _voters(c, live[0])) == {n for n in ("m1", "m2", "m3", "m4") if n != old}
            await asyncio.sleep(1.0)   # a few writes on the shrunk cluster
            await writer.stop()

            # Every acknowledged write is in the log, as written.
            async with AdminClient(live, c.token("admin")) as admin:
                events = [e async for e in admin.iter_history(topic="w")]
            written = {e["version"]: e["data"]["config"].get("n") for e in events
                       if e["type"] == "TopicConfigChanged"}
            lost = {v: n for v, n in writer.acked.items() if written.get(v) != n}
            assert not lost, f"acknowledged writes missing from the log: {list(lost.items())[:5]}"
            assert len(writer.acked) > 50, len(writer.acked)
            longest = max(writer.gaps)
            print(f"\n[members] {len(writer.acked)} writes acknowledged, {len(writer.refused)} refused; longest "
                  f"gap between acknowledgements {longest:.2f} s; new leader {new_leader}")
            assert longest < WRITE_GAP_MAX_S, longest
            await _same_image(c, live)
        finally:
            await sim.close()


async def _leader_other_than(c, old: str) -> str | None:
    for url in c.meta_urls:
        try:
            s = await cluster_status(c, url)
        except (AssertionError, *NET_ERRORS):
            continue
        if s["role"] == "leader" and s["node"] != old:
            return s["node"]
    return None


async def test_an_add_that_never_comes_up_is_undone_and_bad_changes_are_refused(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0) as c:
        nowhere = {"node": "m9", "raft": "127.0.0.1:1", "url": "http://127.0.0.1:1"}
        added = await _change(c, "POST", "", nowhere, expect=(201,))
        assert {"node": "m9", "voter": False, "disk": None} == {k: m[k] for m in added["members"]
                                                                if m["node"] == "m9" for k in ("node", "voter", "disk")}
        # The majority is the three voters still: writes go on.
        await ok(c, "PUT", "/v1/brokers/bx", role="broker", json={"address": "http://127.0.0.1:1"})
        refusals = [
            ("POST", "/m9/promote", None, 409, "NOT_CAUGHT_UP"),
            ("POST", "", nowhere, 409, "MEMBER_EXISTS"),
            ("POST", "", {**nowhere, "node": "m8"}, 409, "MEMBER_EXISTS"),   # m9's raft address
            ("POST", "/m1/promote", None, 409, "ALREADY_VOTER"),
            ("DELETE", "/nope", None, 404, "MEMBER_NOT_FOUND"),
            ("POST", "/nope/promote", None, 404, "MEMBER_NOT_FOUND"),
            ("POST", "", {"node": "m7", "raft": "127.0.0.1:1"}, 400, "INVALID_ARGUMENT"),
            ("POST", "", {**nowhere, "node": "m7", "url": "ftp://x"}, 400, "INVALID_ARGUMENT"),
            ("POST", "", {**nowhere, "node": "m7", "raft": "no-port"}, 400, "INVALID_ARGUMENT"),
            ("POST", "", {**nowhere, "node": "m 7"}, 400, "INVALID_ARGUMENT"),
            ("POST", "", {**nowhere, "node": "m" * 65}, 400, "INVALID_ARGUMENT"),   # no config could name it
            ("DELETE", "/" + "m" * 65, None, 400, "INVALID_ARGUMENT"),
            ("POST", "", {**nowhere, "node": "m7", "zone": "a"}, 400, "INVALID_ARGUMENT"),
            ("DELETE", "/m%207", None, 400, "INVALID_ARGUMENT"),
        ]
        for method, path, body, status, code in refusals:
            s, b, _ = await c.call(method, f"{c.meta_urls[1]}/v1/cluster/members{path}", json=body)
            assert (s, b["error"]["code"]) == (status, code), (method, path, body, s, b)
        s, b, _ = await c.call("POST", f"{c.meta_urls[0]}/v1/cluster/members", "client", json=nowhere)
        assert s == 403, (s, b)
        removed = await _change(c, "DELETE", "/m9")
        assert sorted(m["node"] for m in removed["members"]) == ["m1", "m2", "m3"]
        for url in c.meta_urls:
            assert await _voters(c, url) == {"m1": True, "m2": True, "m3": True}


async def test_a_member_added_again_is_promoted_only_on_what_its_new_instance_reports(tmp_path):
    # The leader heard m4's first instance catch up; m4 is removed, its process killed and its disk gone, then added
    # again under its name. Its new instance has reported nothing (it is not even started): a promotion now would
    # name the old disk as a voter that nobody runs, one voter short of what the operator believes.
    async with cluster_mod.running(str(tmp_path), 3, 0) as c:
        await _add_and_promote(c, "m4")
        await _change(c, "DELETE", "/m4")
        await asyncio.to_thread(c.kill9, "m4")
        base = devcluster.free_base_port()
        await _change(c, "POST", "", {"node": "m4", "raft": f"127.0.0.1:{base + 1}",
                                      "url": f"http://127.0.0.1:{base}"}, expect=(201,))
        s, b, _ = await c.call("POST", f"{c.meta_urls[0]}/v1/cluster/members/m4/promote", timeout_s=30.0)
        assert (s, b.get("error", {}).get("code")) == (409, "NOT_CAUGHT_UP"), (s, b)
        assert (await _voters(c, c.meta_urls[0]))["m4"] is False


async def test_a_removal_that_would_leave_no_live_majority_is_refused(tmp_path):
    # One voter is down; removing a healthy one would leave two voters whose majority needs the dead one: no leader
    # could ever be elected again. The leader refuses it (etcd's strict reconfiguration check); removing the dead
    # one is what keeps the cluster whole.
    async with cluster_mod.running(str(tmp_path), 3, 0) as c:
        leader, lurl, followers = await node_urls(c)
        dead, healthy = name_of(c, followers[0]), name_of(c, followers[1])
        await asyncio.to_thread(c.kill9, dead)
        # A voter counts as down once the leader has not heard its keepalive for LIVE_WITHIN_S.
        await asyncio.sleep(raft_roles.LIVE_WITHIN_S + 1.0)
        s, b, _ = await c.call("DELETE", f"{lurl}/v1/cluster/members/{healthy}", timeout_s=30.0)
        assert (s, b.get("error", {}).get("code")) == (409, "WOULD_LOSE_QUORUM"), (s, b)
        assert b["error"]["details"]["not_live"] == [dead], b
        assert await _voters(c, lurl) == {"m1": True, "m2": True, "m3": True}
        answer = await _change(c, "DELETE", f"/{dead}")
        assert sorted(m["node"] for m in answer["members"]) == sorted([leader, healthy])


async def test_a_member_removed_while_down_learns_it_when_it_comes_back(tmp_path):
    # The removal commits on the two others while the removed node is down, so it never got the entry that removes
    # it; its peers refuse it as an unknown node. The leader goes on sending it the log until it holds that entry,
    # and it says so (NOT_A_MEMBER) instead of serving on as a member of a cluster that sends it nothing.
    async with cluster_mod.running(str(tmp_path), 3, 0) as c:
        leader, lurl, followers = await node_urls(c)
        gone, gone_url = name_of(c, followers[0]), followers[0]
        await asyncio.to_thread(c.kill9, gone)
        answer = await _change(c, "DELETE", f"/{gone}")
        assert gone not in {m["node"] for m in answer["members"]}, answer
        await ok(c, "PUT", "/v1/brokers/bx", role="broker", json={"address": "http://127.0.0.1:1"})   # past it
        await asyncio.to_thread(devcluster.start, c.dir, gone, False)   # never ready: it is no member
        c.reload()

        async def says_not_a_member():
            try:
                s, b, _ = await c.call("GET", f"{gone_url}/v1/topics", "client")
            except NET_ERRORS:
                return False
            return s == 503 and b["error"]["code"] == "NOT_A_MEMBER"
        await wait_until(says_not_a_member, CATCH_UP_S, f"{gone} to answer NOT_A_MEMBER")
        live = [u for u in c.meta_urls if u != gone_url]
        assert set(await _voters(c, live[0])) == {name_of(c, u) for u in live}


async def test_a_second_change_while_one_is_in_flight_is_refused_with_409(tmp_path):
    # Both followers stopped (SIGSTOP): no change can commit while the leader keeps leading, which the slow fallback
    # makes it do for 2 s. Two adds at once: the one proposed first blocks the other, whichever it is.
    tuning = {"election_timeout_min_s": 1.0, "election_timeout_max_s": 2.0, "leader_fallback_timeout_s": 2.0}
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"raft_tuning": tuning}) as c:
        leader, lurl, followers = await node_urls(c)
        stopped = [c.pid(name_of(c, u)) for u in followers]
        for pid in stopped:
            os.killpg(pid, signal.SIGSTOP)
        try:
            adds = [asyncio.create_task(c.call("POST", f"{lurl}/v1/cluster/members", json={
                "node": f"x{i}", "raft": f"127.0.0.1:{i + 1}", "url": f"http://127.0.0.1:{i + 1}"}, timeout_s=30.0))
                for i in range(2)]
            done, pending = await asyncio.wait(adds, timeout=1.5, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1 and len(pending) == 1, "one change must wait for its commit, one be refused"
            s, b, _ = done.pop().result()
            assert (s, b["error"]["code"]) == (409, "MEMBERSHIP_CHANGE_IN_PROGRESS"), (s, b)
        finally:
            for pid in stopped:
                os.killpg(pid, signal.SIGCONT)
        s, b, _ = await pending.pop()
        assert s in (201, 503), (s, b)   # committed once the followers are back, or the leader stepped down first


