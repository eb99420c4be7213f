"""Consumer groups in the pure state machine: assignment, fencing tokens, revocation, expiry, settings (issue 7).

DESIGN.md invariant 6 (a grant's token is larger than every earlier grant) and KIP-848's rule (a queue moves to a new
owner only once its old owner released it or its lease ended) are checked here on every step of random histories.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from meta import groups as group_rules
from meta.image import group_key
from meta.state_machine import StateMachine
from tests.support.state_machine_builders import Log, events_after
from tests.support.group_checks import check_group_invariants


def setup(queues: int = 8, topic: str = "t") -> Log:
    log = Log()
    log.ok({"type": "RegisterBroker", "broker": "b1", "address": "http://127.0.0.1:1"})
    log.ok({"type": "CreateTopic", "topic": topic, "queues": queues})
    return log


def join(log: Log, member: str, topics=("t",), group: str = "g", mode: str = "exclusive") -> dict[str, Any]:
    return log.ok({"type": "JoinGroup", "group": group, "member": member, "topics": list(topics), "mode": mode})


def locks(log: Log, group: str = "g", topic: str = "t") -> dict[int, dict[str, Any]]:
    g = log.sm.image.groups.get(group)
    return {int(q): lk for q, lk in g["locks"].get(topic, {}).items()} if g else {}


def owners(log: Log, **kw: Any) -> dict[int, str]:
    return {q: lk["member"] for q, lk in locks(log, **kw).items()}


def test_members_split_the_queues_disjointly_balanced_and_covering():
    log = setup(queues=8)
    join(log, "a")
    assert set(owners(log).values()) == {"a"} and len(owners(log)) == 8
    join(log, "b")
    # b gets nothing yet: half of a's queues are being revoked, and a still owns them (KIP-848).
    assert set(owners(log).values()) == {"a"}
    revoking = sorted(q for q, lk in locks(log).items() if lk["target"] == "b")
    assert len(revoking) == 4
    for q in revoking:
        assert not group_rules.owned(locks(log)[q])
    check_group_invariants(log.sm.image)


def test_a_revoked_queue_moves_only_after_release_with_a_larger_token():
    log = setup(queues=4)
    join(log, "a")
    join(log, "b")
    before = locks(log)
    top = log.sm.image.data["lock_token"]
    revoked = [{"topic": "t", "queue": q, "token": lk["token"]} for q, lk in before.items() if lk["target"] == "b"]
    # A release naming a token that is no longer current changes nothing.
    stale = [{**revoked[0], "token": revoked[0]["token"] + 100}]
    assert log.ok({"type": "ReleaseLocks", "group": "g", "member": "a", "locks": stale})["released"] == 0
    assert log.ok({"type": "ReleaseLocks", "group": "g", "member": "a", "locks": revoked})["released"] == 2
    after = locks(log)
    assert sorted(q for q, lk in after.items() if lk["member"] == "b") == sorted(r["queue"] for r in revoked)
    for r in revoked:
        assert after[r["queue"]]["token"] > top
    assert all(group_rules.owned(lk) for lk in after.values())
    check_group_invariants(log.sm.image)


def test_leave_releases_at_once_and_regrants():
    log = setup(queues=4)
    join(log, "a")
    join(log, "b")
    log.ok({"type": "ReleaseLocks", "group": "g", "member": "a",
            "locks": [{"topic": "t", "queue": q, "token": lk["token"]} for q, lk in locks(log).items()
                      if lk["target"] == "b"]})
    v = log.version
    log.ok({"type": "LeaveGroup", "group": "g", "member": "b"})
    assert set(owners(log).values()) == {"a"} and len(owners(log)) == 4
    types = [e["type"] for e in events_after(log.sm, v)]
    assert types.count("LockReleased") == 2 and types.count("LockGranted") == 2 and "GroupMemberLeft" in types
    # Leaving twice, or a member that never joined, is a no-op.
    assert log.ok({"type": "LeaveGroup", "group": "g", "member": "b"})["removed"] == []
    out = log.send({"type": "LeaveGroup", "group": "nope", "member": "b"})
    assert out["error"]["code"] == "GROUP_NOT_FOUND"


def test_expiry_of_members_and_of_revoked_locks():
    log = setup(queues=2)
    join(log, "a")
    join(log, "b")
    lk = next(lk for lk in locks(log).values() if lk["target"] == "b")
    q = next(q for q, v in locks(log).items() if v is lk)
    # An owned (not revoked) lock does not expire by ExpireLocks: its owner's lease ends with its membership.
    owned_q = next(x for x, v in locks(log).items() if group_rules.owned(v))
    assert log.ok({"type": "ExpireLocks", "group": "g", "locks": [
        {"topic": "t", "queue": owned_q, "token": locks(log)[owned_q]["token"]}]})["released"] == 0
    log.ok({"type": "ExpireLocks", "group": "g", "locks": [{"topic": "t", "queue": q, "token": lk["token"]}]})
    assert owners(log)[q] == "b" and locks(log)[q]["token"] > lk["token"]
    log.ok({"type": "ExpireMembers", "group": "g", "members": ["a", "ghost"]})
    assert owners(log) == {0: "b", 1: "b"}
    assert "a" not in log.sm.image.groups["g"]["members"]
    check_group_invariants(log.sm.image)


def test_topic_growth_creation_and_deletion_reach_the_locks():
    log = setup(queues=2)
    join(log, "a", topics=("t", "later"))
    assert "later" not in log.sm.image.groups["g"]["locks"]
    log.ok({"type": "CreateTopic", "topic": "later", "queues": 3})
    assert owners(log, topic="later") == {0: "a", 1: "a", 2: "a"}
    log.ok({"type": "GrowTopic", "topic": "t", "queues": 4})
    assert owners(log) == {q: "a" for q in range(4)}
    log.ok({"type": "DeleteTopic", "topic": "later"})
    assert "later" not in log.sm.image.groups["g"]["locks"]
    check_group_invariants(log.sm.image)


def test_lock_events_change_the_group_not_the_route():
    log = setup(queues=2)
    topic_version = log.sm.image.topics["t"]["version"]
    join(log, "a")
    assert log.sm.image.topics["t"]["version"] == topic_version
    assert log.changed == {group_key("g")}
    assert log.sm.image.groups["g"]["version"] == log.version


def test_mode_settings_and_bad_input_are_rejections():
    log = setup()
    join(log, "a")
    out = log.send({"type": "JoinGroup", "group": "g", "member": "s", "topics": ["t"], "mode": "shared"})
    assert out["error"]["code"] == "GROUP_MODE_MISMATCH"
    assert log.send({"type": "SetGroupConfig", "group": "g", "config": {"mode": "shared"}})["error"]["code"] == \
        "GROUP_MODE_MISMATCH"
    for bad in ({"lease_ms": 10}, {"lease_ms": "2000"}, {"nope": 1}, {"heartbeat_interval_ms": 9000},
                {"retry_topic": "a b"}, {}):
        before = json.loads(log.sm.image.canonical_bytes())["groups"]
        out = log.send({"type": "SetGroupConfig", "group": "g", "config": bad})
        assert out["error"]["status"] == 400, bad
        assert json.loads(log.sm.image.canonical_bytes())["groups"] == before
    cfg = log.ok({"type": "SetGroupConfig", "group": "g", "config": {"lease_ms": 2000, "heartbeat_interval_ms": 500}})
    assert cfg["config"]["lease_ms"] == 2000 and cfg["config"]["retry_topic"] == "g-retry"
    back = log.ok({"type": "SetGroupConfig", "group": "g", "config": {"lease_ms": None, "heartbeat_interval_ms": None}})
    assert back["config"]["lease_ms"] == group_rules.CONFIG_DEFAULTS["lease_ms"]
    for bad in ({"member": "a", "topics": [], "mode": "exclusive"}, {"member": "a b", "topics": ["t"], "mode": "x"},
                {"member": "a", "topics": ["t", "t"], "mode": "exclusive"}):
        assert log.send({"type": "JoinGroup", "group": "g", **bad})["error"]["status"] == 400


def test_random_histories_keep_tokens_growing_and_never_move_an_unreleased_queue():
    rng = random.Random(7)
    for _ in range(20):
        log = setup(queues=rng.randint(1, 9))
        members = [f"m{i}" for i in range(5)]
        for _step in range(40):
            before = {q: dict(lk) for q, lk in locks(log).items()}
            top = log.sm.image.data["lock_token"]
            op = rng.choice(["join", "join", "leave", "release", "expire", "expire_locks", "grow"])
            m = rng.choice(members)
            g = log.sm.image.groups.get("g")
            if op == "join":
                join(log, m)
            elif op == "leave" and g:
                log.ok({"type": "LeaveGroup", "group": "g", "member": m})
            elif op == "expire" and g:
                log.ok({"type": "ExpireMembers", "group": "g", "members": [m]})
            elif op in ("release", "expire_locks") and g:
                mine = [{"topic": "t", "queue": q, "token": lk["token"]} for q, lk in before.items()
                        if not group_rules.owned(lk) and (op == "expire_locks" or lk["member"] == m)]
                if op == "release":
                    log.ok({"type": "ReleaseLocks", "group": "g", "member": m, "locks": mine})
                else:
                    log.ok({"type": "ExpireLocks", "group": "g", "locks": mine})
            elif op == "grow":
                n = log.sm.image.topics["t"]["queues"]
                if n < 12:  # a split queue still sealing from an earlier growth refuses (nobody seals here)
                    out = log.send({"type": "GrowTopic", "topic": "t", "queues": n + 1})
                    assert out["ok"] or out["error"]["code"] == "SEALING", out
            after = locks(log)
            g = log.sm.image.groups.get("g")
            members_now = set(g["members"]) if g else set()
            for q, lk in after.items():
                old = before.get(q)
                if old is None or old["token"] != lk["token"]:
                    assert lk["token"] > top, "a grant's token is larger than every earlier one"
                if old is not None and old["token"] != lk["token"]:
                    # KIP-848: the old owner gave it up in this very command (release, or its revocation's lease
                    # ended), or left the group (leave, or its own lease ended)
                    assert old["member"] not in members_now or (
                        not group_rules.owned(old) and op in ("release", "expire_locks")), (op, old, lk)
            check_group_invariants(log.sm.image)
            g = log.sm.image.groups.get("g")
            if g and g["members"] and not log.sm.image.data["revoking"].get("g"):
                n = log.sm.image.topics["t"]["queues"]
                counts = Counter(lk["member"] for lk in after.values())
                assert len(after) == n, "with nothing being revoked every queue has an owner"
                assert max(counts.values()) - min(counts.get(x, 0) for x in g["members"]) <= 1, "balanced"
        # determinism: the same log on a fresh replica gives the same bytes
        replica = StateMachine()
        for env in log.envelopes:
            replica.apply(env)
        assert replica.image.canonical_bytes() == log.sm.image.canonical_bytes()


@pytest.mark.parametrize("queues,members", [(7, 3), (4096, 1000), (3, 8)])
def test_assign_is_balanced_and_sticky(queues, members):
    names = [f"m{i:04d}" for i in range(members)]
    load: dict[str, int] = {}
    first = group_rules.assign(queues, names, {}, load)
    counts = Counter(first.values())
    assert sorted(first) == list(range(queues))
    assert max(counts.values()) - min(counts.get(n, 0) for n in names) <= 1
    # one more member: only queues that must move for balance move
    second = group_rules.assign(queues, names + ["new"], first, {})
    moved = sum(first[q] != second[q] for q in range(queues))
    assert moved <= -(-queues // (members + 1))


def test_group_settings_merge_over_the_stored_ones_and_an_unchanged_setting_writes_nothing():
    log = setup(queues=2)
    v = log.version
    r = log.ok({"type": "SetGroupConfig", "group": "h", "config": {"mode": "shared", "lease_ms": 6000},
                "expected_version": 0})   # a group that does not exist yet is at version 0
    assert r == {"group": "h", "version": v + 1, "config": {
        "lease_ms": 6000, "heartbeat_interval_ms": 3000, "max_attempts": 16, "retry_topic": "h-retry",
        "mode": "shared"}}
    assert [(e["type"], e["data"]) for e in log.events(v)] == [("GroupConfigChanged", {
        "group": "h", "config": {"lease_ms": 6000, "mode": "shared"}, "changed": ["lease_ms", "mode"]})]
    h = log.sm.image.groups["h"]
    assert (h["mode"], h["config"], h["members"], h["locks"]) == (
        "shared", {"lease_ms": 6000, "mode": "shared"}, {}, {})

    v = log.version
    same = log.ok({"type": "SetGroupConfig", "group": "h", "config": {"lease_ms": 6000}, "expected_version": v})
    assert log.version == v and same == {**r, "version": v}, "the same setting again: no event, the same answer"
    out = log.send({"type": "SetGroupConfig", "group": "h", "config": {"lease_ms": 7000}, "expected_version": 0})
    assert out["error"]["code"] == "VERSION_MISMATCH" and out["error"]["details"] == {
        "current_version": v, "expected_version": 0}

    # a heartbeat of exactly half the lease is allowed; the merge keeps the mode and the lease set before
    r = log.ok({"type": "SetGroupConfig", "group": "h", "config": {"heartbeat_interval_ms": 3000}})
    assert log.sm.image.groups["h"]["config"] == {"heartbeat_interval_ms": 3000, "lease_ms": 6000, "mode": "shared"}
    out = log.send({"type": "SetGroupConfig", "group": "h", "config": {"heartbeat_interval_ms": 3001}})
    assert out["error"]["details"] == {"lease_ms": 6000, "heartbeat_interval_ms": 3001}
    log.ok({"type": "SetGroupConfig", "group": "h", "config": {"lease_ms": None, "heartbeat_interval_ms": None}})
    assert log.sm.image.groups["h"]["config"] == {"mode": "shared"}, "None drops a setting back to its default"

    join(log, "a")   # g: exclusive, by its member
    out = log.send({"type": "SetGroupConfig", "group": "g", "config": {"mode": "shared"}})
    assert out["error"]["details"] == {"group": "g", "mode": "shared"}
    log.ok({"type": "LeaveGroup", "group": "g", "member": "a"})
    r = log.ok({"type": "SetGroupConfig", "group": "g", "config": {"mode": "shared"}})
    assert r["config"]["mode"] == "shared" == log.sm.image.groups["g"]["mode"], "a group without members may switch"


def test_the_group_and_member_limits_refuse_the_one_past_them(monkeypatch):
    from meta import limits
    monkeypatch.setattr(limits, "GROUPS_MAX", 2)
    monkeypatch.setattr(limits, "MEMBERS_PER_GROUP_MAX", 2)
    monkeypatch.setattr(limits, "MEMBERS_MAX", 3)
    log = setup(queues=2)
    join(log, "a", group="g1")
    log.ok({"type": "SetGroupConfig", "group": "g2", "config": {"lease_ms": 20000}})
    for cmd in ({"type": "JoinGroup", "group": "g3", "member": "a", "topics": ["t"], "mode": "exclusive"},
                {"type": "SetGroupConfig", "group": "g3", "config": {"lease_ms": 20000}}):
        out = log.send(cmd)["error"]
        assert (out["status"], out["code"], out["message"]) == (409, "TOO_MANY_GROUPS", "at most 2 groups"), cmd
    log.ok({"type": "SetGroupConfig", "group": "g2", "config": {"lease_ms": 30000}})   # a group that exists may change
    join(log, "b", group="g1")
    out = log.send({"type": "JoinGroup", "group": "g1", "member": "c", "topics": ["t"], "mode": "exclusive"})["error"]
    assert (out["status"], out["code"], out["message"]) == (409, "TOO_MANY_MEMBERS", "a group has at most 2 members")
    join(log, "a", topics=("t",), group="g1")   # the same member again: no new member
    join(log, "c", group="g2")
    out = log.send({"type": "JoinGroup", "group": "g2", "member": "d", "topics": ["t"], "mode": "exclusive"})["error"]
    assert (out["status"], out["code"], out["message"]) == (409, "TOO_MANY_MEMBERS", "at most 3 members in all groups")
    out = log.send({"type": "JoinGroup", "group": "nope", "member": "d", "topics": ["t"], "mode": "shared"})["error"]
    assert out["code"] == "TOO_MANY_GROUPS"
    out = log.send({"type": "LeaveGroup", "group": "nope", "member": "d"})["error"]
    assert (out["status"], out["code"], out["message"], out["details"]) == (
        404, "GROUP_NOT_FOUND", "group 'nope' does not exist", {"group": "nope"})


def test_members_leaving_expiring_and_releasing_and_a_topic_deleted_log_their_reasons():
    def since(v: int) -> list:
        return [(e["type"], e["data"]) for e in log.events(v)]

    log = setup(queues=2)
    join(log, "a")
    join(log, "b")
    assert owners(log) == {0: "a", 1: "a"} and locks(log)[1]["target"] == "b"
    v = log.version
    assert log.ok({"type": "LeaveGroup", "group": "g", "member": "zz"}) == {"group": "g", "removed": [], "version": v}
    assert log.ok({"type": "ExpireMembers", "group": "g", "members": ["b"]}) == {
        "group": "g", "removed": ["b"], "version": v + 2}
    assert since(v) == [("GroupMemberLeft", {"group": "g", "member": "b", "reason": "lease_expired"}),
                        ("LockTargetChanged", {"group": "g", "topic": "t", "queue": 1, "member": "a", "target": "a",
                                               "token": 2})]
    v = log.version
    r = log.ok({"type": "ReleaseLocks", "group": "g", "member": "a", "locks": [{"topic": "t", "queue": 0, "token": 1}]})
    assert r == {"group": "g", "released": 1, "version": v + 2}
    assert since(v) == [
        ("LockReleased", {"group": "g", "topic": "t", "queue": 0, "member": "a", "token": 1, "reason": "released"}),
        ("LockGranted", {"group": "g", "topic": "t", "queue": 0, "member": "a", "token": 3})]
    v = log.version
    r = log.ok({"type": "ReleaseLocks", "group": "g", "member": "a", "locks": [{"topic": "t", "queue": 0, "token": 1}]})
    assert (r, since(v)) == ({"group": "g", "released": 0, "version": v}, []), "a stale token releases nothing"
    join(log, "c", topics=("t",), group="h")
    v = log.version
    assert log.ok({"type": "DeleteTopic", "topic": "t"}) == {"topic": "t", "version": v + 5}
    assert since(v) == [("TopicDeleted", {"topic": "t"})] + [
        ("LockReleased", {"group": g, "topic": "t", "queue": q, "member": m, "token": tok, "reason": "topic_deleted"})
        for g, q, m, tok in (("g", 0, "a", 3), ("g", 1, "a", 2), ("h", 0, "c", 4), ("h", 1, "c", 5))]
    v = log.version
    assert log.ok({"type": "LeaveGroup", "group": "g", "member": "a"}) == {
        "group": "g", "removed": ["a"], "version": v + 1}
    assert since(v) == [("GroupMemberLeft", {"group": "g", "member": "a", "reason": "left"})]


def test_a_join_checks_the_group_s_version_and_says_whether_it_joined():
    log = setup(queues=1)
    out = log.send({"type": "JoinGroup", "group": "g", "member": "m", "topics": ["t"], "mode": "shared",
                    "expected_version": 1})["error"]
    assert (out["code"], out["details"]) == ("VERSION_MISMATCH", {"current_version": 0, "expected_version": 1})
    r = log.ok({"type": "JoinGroup", "group": "g", "member": "m", "topics": ["t"], "mode": "shared",
                "expected_version": 0})
    assert (r["group"], r["joined"]) == ("g", True)
    version = log.sm.image.groups["g"]["version"]
    r = log.ok({"type": "JoinGroup", "group": "g", "member": "m", "topics": ["t"], "mode": "shared",
                "expected_version": version})
    assert (r["group"], r["joined"]) == ("g", False)
    out = log.send({"type": "JoinGroup", "group": "g", "member": "n", "topics": ["t"], "mode": "exclusive"})["error"]
    assert (out["code"], out["message"], out["details"]) == (
        "GROUP_MODE_MISMATCH", "group 'g' is shared; member asked for exclusive", {"group": "g", "mode": "shared"})


def test_a_setting_of_a_group_whose_mode_came_from_its_members_keeps_the_mode_and_the_locks():
    log = setup(queues=2)
    join(log, "a")
    held = locks(log)
    v = log.version
    r = log.ok({"type": "SetGroupConfig", "group": "g", "config": {"lease_ms": 20000}})
    assert r["config"]["mode"] == "exclusive" and r["config"]["lease_ms"] == 20000
    assert [e["type"] for e in log.events(v)] == ["GroupConfigChanged"] and locks(log) == held
    assert log.sm.image.groups["g"]["mode"] == "exclusive"
