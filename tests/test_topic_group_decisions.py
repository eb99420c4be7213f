"""Topic and group decisions at their edges, on the in-process state machine: the whole refusals of a create, a
growth, a remap and a group's settings (their words and details are what an operator reads); where a growth places
its new queues when the topic's own brokers cannot take them; and what a topic's creation or deletion does to the
locks of the groups naming it (tokens in order across groups, revoked locks released, shared groups left alone)."""

from __future__ import annotations

from meta import limits
from tests.support.decision_checks import brokers, emitted
from tests.support.state_machine_builders import Log


def join(log: Log, member: str, topics: list[str], group: str = "g", mode: str = "exclusive") -> dict:
    return log.ok({"type": "JoinGroup", "group": group, "member": member, "topics": topics, "mode": mode})


def group_config(log: Log, config: dict, group: str = "g") -> dict:
    return log.ok({"type": "SetGroupConfig", "group": group, "config": config})


# -- topics ---------------------------------------------------------------------------------------------------------
def test_creating_a_topic_again_is_refused_with_its_current_version():
    log = brokers("a")
    log.create("t", 1)
    version = log.topic("t")["version"]
    err = log.reject({"type": "CreateTopic", "topic": "t", "queues": 1})
    assert err == {"status": 409, "code": "TOPIC_EXISTS", "message": "topic 't' already exists",
                   "details": {"topic": "t", "current_version": version}}


def test_a_topic_with_no_broker_to_go_to_is_refused_naming_its_scope():
    log = Log()
    err = log.reject({"type": "CreateTopic", "topic": "t", "queues": 1})
    assert err == {"status": 409, "code": "NO_BROKERS", "message": "no active broker to place the topic on",
                   "details": {"scope": "global"}}
    log.register("a", cluster="east")
    err = log.reject({"type": "CreateTopic", "topic": "t", "queues": 1, "scope": ["west"]})
    assert err == {"status": 409, "code": "NO_BROKERS",
                   "message": "no active broker to place the topic on in its scope ['west']",
                   "details": {"scope": ["west"]}}


def test_a_growth_is_refused_below_the_queues_or_above_the_slots_and_the_same_count_changes_nothing():
    log = brokers("a")
    log.create("t", 2, slots=4)
    assert log.reject({"type": "GrowTopic", "topic": "t", "queues": 1}) == {
        "status": 400, "code": "INVALID_ARGUMENT", "message": "a static topic only grows: it has 2 queues",
        "details": {"queues": 2}}
    assert log.reject({"type": "GrowTopic", "topic": "t", "queues": 5}) == {
        "status": 400, "code": "INVALID_ARGUMENT", "message": "queues cannot exceed slots (4)", "details": {"slots": 4}}
    version = log.version
    assert log.grow("t", 2) == {"topic": "t", "queues": 2, "version": version}
    assert log.version == version


def test_a_growth_splits_each_queue_in_place_in_a_new_gen_of_cause_grow():
    log = brokers("a")
    log.create("t", 1, slots=4)
    since = log.version
    log.grow("t", 2)
    opened = emitted(log, since, "SegmentOpened")
    assert [(e["queue"], e["gen"], e["broker"], e["cause"]) for e in opened] == [(0, 1, "a", "grow")], opened


def test_a_growth_whose_topic_s_brokers_are_all_draining_places_the_new_queues_in_its_scope():
    log = brokers("a", "c", "x", a="east", c="east", x="west")
    log.create("t", 1, replicas=1, scope=["east"], brokers=["a"], slots=8)
    log.ok({"type": "DrainBroker", "broker": "a", "draining": True})
    log.grow("t", 5)
    assert {log.segs("t", q)[0]["broker"] for q in range(1, 5)} == {"c"}


def test_a_growth_with_no_broker_left_in_its_scope_is_refused_naming_the_scope():
    log = brokers("a", "x", a="east", x="west")
    log.create("t", 1, replicas=1, scope=["east"], slots=4)
    log.fence("a")
    err = log.reject({"type": "GrowTopic", "topic": "t", "queues": 2})
    assert err == {"status": 409, "code": "NO_BROKERS", "message": "no active broker to place the new queues on",
                   "details": {"scope": ["east"]}}


def test_a_remap_of_a_queue_the_topic_does_not_have_is_refused_naming_it():
    log = brokers("a", "b")
    log.create("t", 2)
    err = log.reject({"type": "RemapTopic", "topic": "t", "brokers": ["b"], "queues": [5]})
    assert err == {"status": 400, "code": "INVALID_ARGUMENT",
                   "message": "queue 5 does not exist; the topic has 2 queues", "details": {"queue": 5}}


# -- what a topic change does to groups --------------------------------------------------------------------------
def test_a_new_topic_s_queues_go_to_the_member_least_loaded_by_the_group_s_other_topics():
    log = brokers("a")
    log.create("early", 1)
    join(log, "m1", ["early", "late"])
    join(log, "m2", ["early", "late"])
    assert log.sm.image.groups["g"]["locks"]["early"]["0"]["member"] == "m1"
    log.create("late", 1)
    assert log.sm.image.groups["g"]["locks"]["late"]["0"]["member"] == "m2"


def test_a_new_topic_grants_each_group_naming_it_its_own_tokens_in_order():
    log = brokers("a")
    join(log, "m", ["t"], group="g1")
    join(log, "m", ["t"], group="g2")
    top = log.sm.image.data["lock_token"]
    since = log.version
    log.create("t", 1)
    assert emitted(log, since, "LockGranted") == [
        {"type": "LockGranted", "group": "g1", "topic": "t", "queue": 0, "member": "m", "token": top + 1},
        {"type": "LockGranted", "group": "g2", "topic": "t", "queue": 0, "member": "m", "token": top + 2}]


def test_a_deleted_topic_releases_the_locks_a_member_still_holds_after_it_stopped_naming_it():
    log = brokers("a")
    log.create("t", 1)
    join(log, "m", ["t"])
    token = log.sm.image.groups["g"]["locks"]["t"]["0"]["token"]
    join(log, "m", ["u"])   # t's lock is revoked, not released: m still holds it
    assert log.sm.image.groups["g"]["locks"]["t"]["0"]["target"] is None
    since = log.version
    log.ok({"type": "DeleteTopic", "topic": "t"})
    assert emitted(log, since, "LockReleased") == [
        {"type": "LockReleased", "group": "g", "topic": "t", "queue": 0, "member": "m", "token": token,
         "reason": "topic_deleted"}]
    assert log.sm.image.groups["g"]["locks"] == {}


def test_a_deleted_topic_that_a_shared_group_names_changes_none_of_its_locks():
    log = brokers("a")
    log.create("t", 2)
    join(log, "m", ["t"], mode="shared")
    since = log.version
    assert log.ok({"type": "DeleteTopic", "topic": "t"}) == {"topic": "t", "version": since + 1}
    assert emitted(log, since) == [{"type": "TopicDeleted", "topic": "t"}]


# -- group commands -------------------------------------------------------------------------------------------------
def test_a_member_leaves_at_the_group_s_current_version():
    log = brokers("a")
    join(log, "m", ["t"])
    version = log.sm.image.groups["g"]["version"]
    out = log.ok({"type": "LeaveGroup", "group": "g", "member": "m", "expected_version": version})
    assert out["removed"] == ["m"]


def test_a_release_naming_a_topic_the_group_holds_nothing_of_releases_nothing():
    log = brokers("a")
    log.create("t", 1)
    join(log, "m", ["t"])
    out = log.ok({"type": "ReleaseLocks", "group": "g", "member": "m",
                  "locks": [{"topic": "zz", "queue": 0, "token": 1}]})
    assert out["released"] == 0


def test_an_expired_revoked_lock_is_released_as_lease_expired_and_granted_to_its_target():
    log = brokers("a")
    log.create("t", 2)
    join(log, "a", ["t"])
    join(log, "b", ["t"])
    revoked = [(int(q), lk["token"]) for q, lk in log.sm.image.groups["g"]["locks"]["t"].items()
               if lk["target"] == "b"]
    assert len(revoked) == 1
    (q, token), = revoked
    since = log.version
    log.ok({"type": "ExpireLocks", "group": "g", "locks": [{"topic": "t", "queue": q, "token": token}]})
    assert emitted(log, since) == [
        {"type": "LockReleased", "group": "g", "topic": "t", "queue": q, "member": "a", "token": token,
         "reason": "lease_expired"},
        {"type": "LockGranted", "group": "g", "topic": "t", "queue": q, "member": "b", "token": token + 1}]


def test_removing_a_setting_the_group_never_had_is_a_change_of_nothing_but_the_keys_named():
    log = Log()
    since = log.version
    out = group_config(log, {"lease_ms": None})
    assert emitted(log, since) == [{"type": "GroupConfigChanged", "group": "g", "config": {}, "changed": ["lease_ms"]}]
    assert out["config"] == {"lease_ms": limits.LEASE_MS_DEFAULT, "heartbeat_interval_ms":
                             limits.GROUP_HEARTBEAT_INTERVAL_MS_DEFAULT, "max_attempts": limits.MAX_ATTEMPTS_DEFAULT,
                             "retry_topic": "g-retry", "mode": None}


def test_a_heartbeat_interval_over_half_the_lease_is_refused_in_words():
    log = Log()
    err = log.reject({"type": "SetGroupConfig", "group": "g",
                        "config": {"lease_ms": 10_000, "heartbeat_interval_ms": 6_000}})
    assert err == {"status": 400, "code": "INVALID_ARGUMENT",
                   "message": "heartbeat_interval_ms must be at most half of lease_ms, so a lease outlives a lost "
                              "heartbeat", "details": {"lease_ms": 10_000, "heartbeat_interval_ms": 6_000}}


def test_a_mode_change_is_refused_while_members_of_the_other_mode_are_in_and_names_the_first_five():
    log = Log()
    for i in range(6):
        join(log, f"m{i}", ["t"])
    err = log.reject({"type": "SetGroupConfig", "group": "g", "config": {"mode": "shared"}})
    assert err == {"status": 409, "code": "GROUP_MODE_MISMATCH",
                   "message": "members of another mode are in the group: ['m0', 'm1', 'm2', 'm3', 'm4']",
                   "details": {"group": "g", "mode": "shared"}}


def test_the_mode_of_a_group_without_members_changes():
    log = Log()
    group_config(log, {"mode": "shared"})
    since = log.version
    out = group_config(log, {"mode": "exclusive"})
    assert out["config"]["mode"] == "exclusive" and log.sm.image.groups["g"]["mode"] == "exclusive"
    assert emitted(log, since) == [{"type": "GroupConfigChanged", "group": "g", "config": {"mode": "exclusive"},
                                    "changed": ["mode"]}]
