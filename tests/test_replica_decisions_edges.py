"""Replica decisions at their edges (meta/deciders/replicas.py), on the real state machine in process: the exact
events and answers of a failover, a leader back on a new disk, an operator's election (clean, unclean, several
queues at once, no live copy), where a new gen's copies go (a remap's targets first, never a draining broker, the
topic's count exactly), which sealed copies a broker holds, and the refusals' codes, statuses and details. Written
for mutmut's survivors; tests/test_replica_decisions.py names the common cases."""

from __future__ import annotations

from typing import Any

from tests.support.state_machine_builders import Log, disk_id


def cluster(*names: str, clusters: dict[str, str] | None = None) -> Log:
    log = Log()
    for n in names:
        log.register(n, cluster=(clusters or {}).get(n))
    return log


def events_since(log: Log, v: int) -> list[tuple[str, dict[str, Any]]]:
    return [(e["type"], e["data"]) for e in log.events(v)]


def lagging(log: Log, topic: str, queue: int, leader: str = "a") -> None:
    """The leader says its followers lag: only it is left in sync."""
    log.ok({"type": "AlterInSync", "broker": leader, "epoch": log.epoch(leader), "changes": [
        {"topic": topic, "queue": queue, "gen": log.head(topic, queue)["gen"], "in_sync": [leader],
         "epochs": log.epochs([leader])}]})


def alter(log: Log, in_sync: list[str], epochs: dict[str, int] | None = None, leader: str = "a") -> dict[str, Any]:
    return log.ok({"type": "AlterInSync", "broker": leader, "epoch": log.epoch(leader), "changes": [
        {"topic": "t", "queue": 0, "gen": log.head("t", 0)["gen"], "in_sync": in_sync,
         "epochs": log.epochs(in_sync) if epochs is None else epochs}]})["results"][0]


def sealed_counts(log: Log, *brokers: str) -> dict[str, int]:
    """How many sealed segments each broker holds a copy of, as a (not draining) drain step reports it."""
    return {b: log.ok({"type": "DrainStep", "broker": b, "queues_max": 10})["sealed_remaining"] for b in brokers}


# -- a failover and a leader back on a new disk: their events, whole ---------------------------------------------
def test_a_fenced_leader_s_failover_opens_the_next_gen_with_cause_failover():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    inc = log.topic("t")["incarnation"]
    v = log.version
    log.fence("a")
    opened = [d for kind, d in events_since(log, v) if kind == "SegmentOpened"]
    assert opened == [{"topic": "t", "queue": 0, "gen": 1, "broker": "b", "from_broker": "a",
                       "physical_queue": f"t.q0.g1.i{inc}", "physical_start": 0, "budget_end": log.budget,
                       "replicas": ["b", "c", "a"], "in_sync": ["b", "c"], "cause": "failover"}]


def test_a_lone_leader_back_on_a_new_disk_seals_at_its_budget_and_reopens_under_its_own_name():
    log = cluster("a", "b")
    log.create("t", 1, brokers=["a"], replicas=1)
    inc = log.topic("t")["incarnation"]
    v = log.version
    log.register("a", disk=disk_id(1))
    assert [e for e in events_since(log, v) if e[0].startswith("Segment") or e[0] == "LogicStartDecided"] == [
        ("SegmentSealed", {"topic": "t", "queue": 0, "gen": 0, "broker": "a", "physical_end": log.budget,
                           "logic_end": log.budget, "by": "disk_lost"}),
        ("SegmentOpened", {"topic": "t", "queue": 0, "gen": 1, "broker": "a", "from_broker": "a",
                           "physical_queue": f"t.q0.g1.i{inc}", "physical_start": 0, "budget_end": log.budget,
                           "replicas": ["a"], "in_sync": ["a"], "cause": "disk_lost"}),
        ("LogicStartDecided", {"topic": "t", "queue": 0, "gen": 1, "logic_start": log.budget})]
    assert log.head("t", 0)["physical_queue"] == f"t.q0.g1.i{inc}"


# -- an operator's election --------------------------------------------------------------------------------------
def test_an_election_of_several_queues_moves_every_one_whose_leader_was_fenced_before_its_start():
    log = cluster("a", "b", "c")
    log.create("t", 2, brokers=["a"], replicas=3)
    log.remap("t", ["b"])   # both queues to b; gen 0 on a is sealing
    log.fence("b")          # b's heads have no start yet: nothing moves by itself
    log.seal("t", 0, 0, 5)
    log.seal("t", 1, 0, 6)
    v = log.version
    r = log.ok({"type": "ElectLeaders", "topic": "t"})
    assert r["topic"] == "t"
    assert [q["outcome"] for q in r["queues"]] == ["elected", "elected"]
    opened = [(d["queue"], d["gen"], d["cause"]) for kind, d in events_since(log, v) if kind == "SegmentOpened"]
    assert opened == [(0, 2, "failover"), (1, 2, "failover")]
    assert [log.head("t", q)["gen"] for q in range(2)] == [2, 2]


def test_an_unclean_election_of_several_queues_moves_each_to_its_first_live_copy_with_cause_unclean():
    log = cluster("a", "b", "c")
    log.create("t", 2, brokers=["a"], replicas=3)
    assert log.head("t", 0)["replicas"] == ["a", "b", "c"]
    inc = log.topic("t")["incarnation"]
    for q in range(2):
        lagging(log, "t", q)
    log.fence("b")   # the first copy is down: the next live one is elected
    log.fence("a")
    log.budget = 444
    v = log.version
    r = log.ok({"type": "ElectLeaders", "topic": "t", "unclean": True})
    assert r["topic"] == "t"
    assert r["queues"] == [
        {"queue": q, "leader": "a", "gen": 0, "outcome": "elected_unclean", "to": "c", "new_gen": 1,
         "may_lose": "what a acknowledged in gen 0 past the end of c's copy, which was not in sync"}
        for q in range(2)]
    opened = [d for kind, d in events_since(log, v) if kind == "SegmentOpened"]
    assert opened == [{"topic": "t", "queue": q, "gen": 1, "broker": "c", "from_broker": "a",
                       "physical_queue": f"t.q{q}.g1.i{inc}", "physical_start": 0, "budget_end": 444,
                       "replicas": ["c", "b", "a"], "in_sync": ["c"], "cause": "unclean"} for q in range(2)]
    assert [log.head("t", q)["broker"] for q in range(2)] == ["c", "c"]


def test_an_unclean_election_with_no_live_copy_says_so_and_changes_nothing():
    log = cluster("a", "b")
    log.create("t", 1, brokers=["a"], replicas=2)
    lagging(log, "t", 0)
    log.fence("b")
    log.fence("a")
    v = log.version
    r = log.ok({"type": "ElectLeaders", "topic": "t", "unclean": True})
    assert (r["topic"], r["queues"]) == ("t", [{"queue": 0, "leader": "a", "gen": 0, "outcome": "no_live_copy"}])
    assert events_since(log, v) == [] and len(log.segs("t", 0)) == 1


def test_an_election_for_a_queue_past_the_last_names_it_in_the_refusal():
    log = cluster("a")
    log.create("t", 2, brokers=["a"], replicas=1)
    err = log.reject({"type": "ElectLeaders", "topic": "t", "queues": [0, 5]}, "INVALID_ARGUMENT")
    assert (err["message"], err["details"]) == ("queue 5 does not exist; the topic has 2 queues", {"queue": 5})


# -- where a new gen's copies go -----------------------------------------------------------------------------------
def test_a_remap_takes_copies_from_its_targets_first_and_exactly_the_topic_s_count():
    log = cluster("a", "b", "c", "d")
    log.create("t", 2, brokers=["a"], replicas=3)
    moved = log.remap("t", ["b", "d"])["moved"]
    leaders = {m["queue"]: m["to"] for m in moved}
    assert sorted(leaders.values()) == ["b", "d"]
    for q, leader in leaders.items():
        other = "d" if leader == "b" else "b"
        replicas = log.head("t", q)["replicas"]
        # the other target first (before c, which follows b in name order), then one more: three copies, no more
        assert replicas[:2] == [leader, other] and len(replicas) == 3, (q, replicas)


def test_a_draining_broker_gets_no_copy_of_a_new_gen_fenced_or_not_while_a_fenced_one_keeps_its_place():
    log = cluster("a", "b", "c", "d")
    log.create("t", 1, brokers=["a"], replicas=3)
    assert log.head("t", 0)["replicas"] == ["a", "b", "c"]
    log.ok({"type": "DrainBroker", "broker": "c", "draining": True})
    log.fence("d")   # too few brokers to place on: d, fenced, is held a place; c, being drained, is not
    log.remap("t", ["b"])
    assert log.head("t", 0)["replicas"] == ["b", "a", "d"]
    log.seal_all_sealing()
    log.fence("c")   # fenced and being drained: still no place
    log.remap("t", ["a"])
    assert log.head("t", 0)["replicas"] == ["a", "b", "d"]


def test_a_remap_of_a_scoped_topic_holds_a_place_for_its_fenced_broker_and_none_for_one_outside_its_scope():
    log = cluster("a", "b", "c", "d", clusters={"a": "x", "b": "x", "c": "x", "d": "y"})
    log.create("t", 1, brokers=["a"], replicas=3, scope=["x"])
    log.fence("c")
    log.fence("d")
    log.remap("t", ["b"])
    head = log.head("t", 0)
    assert (head["replicas"], head["in_sync"]) == (["b", "a", "c"], ["b", "a"])


def test_a_broker_outside_a_topic_s_scope_is_refused_with_its_cluster_and_the_scope():
    log = cluster("a", "b", clusters={"a": "x", "b": "y"})
    err = log.reject({"type": "CreateTopic", "topic": "t", "queues": 1, "brokers": ["b"], "scope": ["x"]},
                     "OUT_OF_SCOPE")
    assert (err["message"], err["details"]) == (
        "broker 'b' is in cluster 'y', outside the topic's scope ['x']",
        {"broker": "b", "cluster": "y", "scope": ["x"]})


# -- which sealed copies a broker holds ---------------------------------------------------------------------------
def test_a_broker_holds_the_sealed_segments_it_has_a_copy_of_anywhere_in_the_chain_and_no_others():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=1)
    log.remap("t", ["b"])
    log.seal_all_sealing()
    log.remap("t", ["a"])
    log.seal_all_sealing()   # gen 0 on a and gen 1 on b sealed; gen 2, the head, on a
    assert [(s["gen"], s["state"], s["replicas"]) for s in log.segs("t", 0)] == [
        (0, "sealed", ["a"]), (1, "sealed", ["b"]), (2, "active", ["a"])]
    assert sealed_counts(log, "a", "b", "c") == {"a": 1, "b": 1, "c": 0}


# -- a leader's in-sync changes: what a refused item and an event say ---------------------------------------------
def test_a_follower_registered_again_since_the_leader_heard_from_it_is_refused_409_item_by_item():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    seen = log.epoch("c")
    alter(log, ["a", "b"])
    log.register("c", disk=disk_id(2))
    assert alter(log, ["a", "b", "c"], epochs={"a": log.epoch("a"), "b": log.epoch("b"), "c": seen}) == {
        "ok": False, "code": "STALE_BROKER_EPOCH", "status": 409}
    assert log.head("t", 0)["in_sync"] == ["a", "b"]


def test_an_in_sync_set_that_swaps_one_copy_for_another_of_the_same_size_is_logged_as_lagging():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    alter(log, ["a", "b"])
    v = log.version
    assert alter(log, ["a", "c"]) == {"ok": True, "in_sync": ["a", "c"]}
    assert events_since(log, v) == [("InSyncChanged", {"topic": "t", "queue": 0, "gen": 0, "in_sync": ["a", "c"],
                                                       "reason": "lagging"})]
