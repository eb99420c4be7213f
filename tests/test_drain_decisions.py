"""The decisions of a drain at their edges (issue 37 item 2), on the in-process state machine: what DrainBroker
refuses and answers, which head a DrainStep moves where and which it leaves for a later step, how the sealed
segments a drained broker holds get a copy elsewhere, and what SealedCopiesHeld answers for each copy a broker
reports. Results and events are compared whole: their keys and words are what brokers and the CLI read."""

from __future__ import annotations

from meta import allocation
from tests.support.decision_checks import brokers, emitted
from tests.support.state_machine_builders import Log


def step(log: Log, broker: str, n: int = 100) -> dict:
    return log.ok({"type": "DrainStep", "broker": broker, "queues_max": n})


def drain(log: Log, broker: str, **kw) -> dict:
    return log.ok({"type": "DrainBroker", "broker": broker, "draining": True, **kw})


def held(log: Log, broker: str, *copies: tuple) -> dict:
    return log.ok({"type": "SealedCopiesHeld", "broker": broker, "epoch": log.epoch(broker),
                   "copies": [{"topic": t, "queue": q, "gen": g, "end": e} for t, q, g, e in copies]})


def pq(log: Log, topic: str, queue: int, gen: int) -> str:
    return allocation.physical_queue_name(topic, log.topic(topic)["incarnation"], queue, gen)


# -- DrainBroker ----------------------------------------------------------------------------------------------------
def test_a_drain_is_refused_when_the_topic_s_scope_keeps_too_few_brokers_without_it():
    log = brokers("a", "b", "c", a="east", b="east", c="west")
    log.create("t", 1, replicas=2, scope=["east"], brokers=["a"])
    err = log.reject({"type": "DrainBroker", "broker": "a", "draining": True})
    assert err == {"status": 409, "code": "NOT_ENOUGH_BROKERS",
                   "message": "'t' keeps 2 copies of each queue; without 'a' its scope has 1 brokers to place them on",
                   "details": {"topic": "t", "replicas": 2, "brokers": 1}}


def test_a_drain_answers_the_broker_its_state_its_target_and_what_it_still_holds_and_a_stop_forgets_the_target():
    log = brokers("a", "b", "c")
    log.create("t", 1, replicas=2, brokers=["a"])
    since = log.version
    assert drain(log, "a", to=["c"]) == {"broker": "a", "draining": True, "to": ["c"], "remaining": 1,
                                          "version": since + 1}
    assert emitted(log, since) == [{"type": "BrokerDrainChanged", "broker": "a", "draining": True, "to": ["c"]}]
    since = log.version
    stopped = log.ok({"type": "DrainBroker", "broker": "a", "draining": False, "to": ["c"]})
    assert stopped == {"broker": "a", "draining": False, "to": None, "remaining": 1, "version": since + 1}
    assert emitted(log, since) == [{"type": "BrokerDrainChanged", "broker": "a", "draining": False, "to": None}]
    assert log.sm.image.brokers["a"]["drain_to"] is None


# -- DrainStep: heads -----------------------------------------------------------------------------------------------
def test_a_step_of_a_broker_not_draining_answers_what_it_holds_and_moves_nothing():
    log = brokers("a", "b")
    log.create("t", 2, replicas=1, brokers=["a"])
    log.remap("t", ["b"], queues=[0])
    log.seal("t", 0, 0, 7)
    v = log.version
    assert step(log, "a") == {"broker": "a", "moved": [], "copying": [], "remaining": 1, "sealed_remaining": 1,
                              "version": v}


def test_a_step_moves_a_head_the_drained_broker_leads_to_its_replacement_with_a_whole_new_gen():
    log = brokers("a", "b", "c")
    log.create("t", 1, replicas=2, brokers=["a"])
    assert log.head("t", 0)["replicas"] == ["a", "b"]
    drain(log, "a", to=["c"])
    since = log.version
    assert step(log, "a") == {"broker": "a", "moved": [{"topic": "t", "queue": 0, "from": "a", "to": "c", "gen": 1}],
                              "copying": [], "remaining": 0, "sealed_remaining": 0, "version": since + 2}
    assert emitted(log, since) == [
        {"type": "SegmentSealing", "topic": "t", "queue": 0, "gen": 0, "broker": "a"},
        {"type": "SegmentOpened", "topic": "t", "queue": 0, "gen": 1, "broker": "c", "from_broker": "a",
         "physical_queue": pq(log, "t", 0, 1), "physical_start": 0, "budget_end": 1000, "replicas": ["c", "b"],
         "in_sync": ["c", "b"], "cause": "drain"}]


def test_a_head_the_drained_broker_only_copies_keeps_its_leader_and_gets_the_replacement_as_copy():
    log = brokers("a", "b", "c", "d")
    log.create("t", 1, replicas=2, brokers=["d"])
    assert log.head("t", 0)["replicas"] == ["d", "a"]
    drain(log, "a", to=["c"])
    r = step(log, "a")
    assert r["moved"] == [{"topic": "t", "queue": 0, "from": "d", "to": "d", "gen": 1}], r
    assert log.head("t", 0)["replicas"] == ["d", "c"]


def test_a_step_leads_and_copies_within_the_topic_s_scope_whatever_the_replacement_named():
    log = brokers("a", "b", "x", "c", a="east", b="east", x="east", c="west")
    log.create("t", 1, replicas=2, scope=["east"], brokers=["a"])
    assert log.head("t", 0)["replicas"] == ["a", "b"]
    drain(log, "a", to=["c"])
    r = step(log, "a")
    assert r["moved"] == [{"topic": "t", "queue": 0, "from": "a", "to": "b", "gen": 1}], r
    assert log.head("t", 0)["replicas"] == ["b", "x"]


def test_a_head_still_waiting_for_its_logic_start_waits_and_the_next_head_moves():
    log = brokers("a", "b", "c", "d")
    log.create("t", 2, replicas=2, brokers=["d"])
    assert [log.head("t", q)["replicas"] for q in (0, 1)] == [["d", "a"], ["d", "a"]]
    log.remap("t", ["a"], queues=[0])   # queue 0's gen 1, led by a, waits for d's seal of gen 0
    assert log.head("t", 0)["broker"] == "a" and log.head("t", 0)["logic_start"] is None
    drain(log, "a")
    r = step(log, "a")
    assert r["moved"] == [{"topic": "t", "queue": 1, "from": "d", "to": "d", "gen": 1}] and r["remaining"] == 1, r
    assert log.head("t", 0)["gen"] == 1


def test_a_head_whose_leader_is_fenced_with_no_copy_in_sync_waits_for_it():
    log = brokers("a", "c", "d")
    log.create("t", 1, replicas=2, brokers=["d"])
    assert log.head("t", 0)["replicas"] == ["d", "a"]
    log.ok({"type": "AlterInSync", "broker": "d", "epoch": log.epoch("d"), "changes": [
        {"topic": "t", "queue": 0, "gen": 0, "in_sync": ["d"], "epochs": log.epochs(["d"])}]})
    drain(log, "a")
    log.fence("d")   # no live copy in sync: the head stays with d
    assert log.head("t", 0)["broker"] == "d" and log.head("t", 0)["state"] == "active"
    r = step(log, "a")
    assert (r["moved"], r["remaining"]) == ([], 1), r
    assert log.head("t", 0)["gen"] == 0


def test_a_head_with_nowhere_to_go_in_its_scope_waits_and_the_other_topics_heads_move():
    log = brokers("a", "b", "c", a="east", b="east", c="west")
    log.create("p", 1, replicas=1, scope=["east"], brokers=["a"])
    log.create("q", 1, replicas=1, brokers=["a"])
    drain(log, "a")
    log.fence("b")   # p's scope has no broker left to lead it
    r = step(log, "a")
    assert r["moved"] == [{"topic": "q", "queue": 0, "from": "a", "to": "c", "gen": 1}] and r["remaining"] == 1, r


# -- DrainStep: sealed segments ---------------------------------------------------------------------------------
def two_sealed_on_a() -> Log:
    """Queues 0 and 1 of t moved from a to b, their gen 0 sealed on a alone; a draining."""
    log = brokers("a", "b")
    log.create("t", 2, replicas=1, brokers=["a"])
    log.remap("t", ["b"])
    log.seal("t", 0, 0, 40)
    log.seal("t", 1, 0, 30)
    drain(log, "a")
    return log


def test_a_step_places_at_most_its_count_of_copies_and_a_copy_being_caught_up_is_passed_over():
    log = two_sealed_on_a()
    since = log.version
    assert step(log, "a", 1) == {"broker": "a", "moved": [], "copying": [{"topic": "t", "queue": 0, "gen": 0,
                                                                          "to": "b"}],
                                 "remaining": 0, "sealed_remaining": 2, "version": since + 1}
    assert emitted(log, since) == [{"type": "SegmentCopiesChanged", "topic": "t", "queue": 0, "gen": 0,
                                    "replicas": ["a", "b"], "in_sync": ["a"], "reason": "moving"}]
    r = step(log, "a", 5)
    assert r["copying"] == [{"topic": "t", "queue": 1, "gen": 0, "to": "b"}], r


def test_a_sealed_segment_with_no_broker_left_in_its_scope_waits_and_the_next_one_is_copied():
    log = brokers("a", "b", "c", a="east", b="east", c="west")
    log.create("p", 1, replicas=1, scope=["east"], brokers=["a"])
    log.create("q", 1, replicas=1, brokers=["a"])
    log.remap("p", ["b"])
    log.remap("q", ["c"])
    log.seal("p", 0, 0, 5)
    log.seal("q", 0, 0, 6)
    drain(log, "a")
    log.fence("b")
    r = step(log, "a")
    assert r["copying"] == [{"topic": "q", "queue": 0, "gen": 0, "to": "c"}] and r["sealed_remaining"] == 2, r


# -- SealedCopiesHeld ------------------------------------------------------------------------------------------
def gen_1_sealed_on_b() -> Log:
    """t's queue 0: gen 0 sealed on a (logic 0..40), gen 1 sealed on b (logic 40..70, physical 0..30), gen 2 led by
    c; b draining onto c, and c copying gen 1."""
    log = brokers("a", "b", "c")
    log.create("t", 1, replicas=1, brokers=["a"])
    log.remap("t", ["b"])
    log.seal("t", 0, 0, 40)
    log.remap("t", ["c"])
    log.seal("t", 0, 1, 30)
    drain(log, "b", to=["c"])
    assert step(log, "b")["copying"] == [{"topic": "t", "queue": 0, "gen": 1, "to": "c"}]
    return log


def test_each_copy_reported_gets_its_own_outcome_and_a_whole_one_replaces_the_drained_copy():
    log = gen_1_sealed_on_b()
    since = log.version
    got = held(log, "c", ("zz", 0, 0, 5), ("t", 1, 0, 5), ("t", 0, 9, 5), ("t", 0, 2, 5), ("t", 0, 0, 99),
               ("t", 0, 1, 29), ("t", 0, 1, 30))
    outcomes = ["not_named"] * 5 + ["short", "held"]
    assert got == {"broker": "c", "copies": [
        {"topic": t, "queue": q, "gen": g, "end": e, "outcome": o}
        for (t, q, g, e), o in zip([("zz", 0, 0, 5), ("t", 1, 0, 5), ("t", 0, 9, 5), ("t", 0, 2, 5), ("t", 0, 0, 99),
                                    ("t", 0, 1, 29), ("t", 0, 1, 30)], outcomes)], "version": since + 1}
    assert emitted(log, since) == [{"type": "SegmentCopiesChanged", "topic": "t", "queue": 0, "gen": 1,
                                    "replicas": ["c"], "in_sync": ["c"], "reason": "moved"}]
    since = log.version
    again = held(log, "c", ("t", 0, 1, 30))
    assert again["copies"] == [{"topic": "t", "queue": 0, "gen": 1, "end": 30, "outcome": "held"}]
    assert log.version == since, "a copy already in sync changes nothing"


def test_a_whole_copy_drops_only_the_draining_broker_s_copy():
    log = brokers("a", "b", "c", "d")
    log.create("t", 1, replicas=2, brokers=["a"])
    assert log.head("t", 0)["replicas"] == ["a", "b"]
    log.remap("t", ["b"])
    log.seal("t", 0, 0, 10)
    drain(log, "a")
    r = step(log, "a")
    assert r["copying"] == [{"topic": "t", "queue": 0, "gen": 0, "to": "c"}], r
    held(log, "c", ("t", 0, 0, 10))
    assert (log.segs("t", 0)[0]["replicas"], log.segs("t", 0)[0]["in_sync"]) == (["b", "c"], ["b", "c"])


def test_a_report_of_copies_held_in_an_earlier_session_is_refused():
    log = gen_1_sealed_on_b()
    err = log.reject({"type": "SealedCopiesHeld", "broker": "c", "epoch": log.epoch("c") + 1,
                        "copies": [{"topic": "t", "queue": 0, "gen": 1, "end": 30}]})
    assert (err["code"], err["status"], err["details"]) == ("STALE_EPOCH", 409, {"broker": "c", "epoch": 1})

