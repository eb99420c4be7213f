"""The chaos runner's history checks (ops/chaos/checker.py) on small hand-made histories: each check passes a
history that keeps its property and fails one that breaks it, so none of them can pass whatever happens.
Also the nemesis schedule: the same seed gives the same faults."""

from __future__ import annotations

import math

from ops.chaos import checker, nemesis
from ops.chaos.history import FAIL, OK, UNKNOWN, Op


def op(process, kind, invoke, complete, outcome=OK, output=None, **input) -> Op:
    return Op(process, kind, input, invoke, math.inf if complete is None else complete, outcome, output or {})


def cas(p, t0, t1, frm, to, outcome=OK):
    return op(p, "cas", t0, t1 if outcome != UNKNOWN else None, outcome, {"version": 0}, **{"from": frm, "to": to})


def read(p, t0, t1, value):
    return op(p, "read", t0, t1, OK, {"value": value})


# -- the register --------------------------------------------------------------------------------------------------
def test_register_sequential_history_is_linearizable():
    h = [read("a", 0, 1, "init"), cas("a", 2, 3, "init", "a1"), read("b", 4, 5, "a1"), cas("b", 6, 7, "a1", "b1")]
    violations, stats = checker.cas_register(h, "init")
    assert violations == [] and stats["register_ops"] == 4 and not stats["inconclusive"]


def test_register_concurrent_ops_may_take_either_order():
    # the read overlaps the write: it may see the old or the new value
    h = [cas("a", 0, 10, "init", "a1"), read("b", 1, 2, "init"), read("c", 3, 4, "a1")]
    assert checker.cas_register(h, "init")[0] == []


def test_register_stale_read_after_completed_write_is_a_violation():
    h = [cas("a", 0, 1, "init", "a1"), read("b", 2, 3, "init")]
    violations, _ = checker.cas_register(h, "init")
    assert [v["check"] for v in violations] == ["cas_register"]


def test_register_two_successful_cas_from_the_same_value_is_a_violation():
    # both clients read init and both compare-and-sets succeeded: a lost update
    h = [cas("a", 0, 1, "init", "a1"), cas("b", 2, 3, "init", "b1")]
    assert len(checker.cas_register(h, "init")[0]) == 1


def test_register_unknown_write_that_was_observed_took_effect():
    h = [cas("a", 0, None, "init", "a1", UNKNOWN), read("b", 5, 6, "a1")]
    assert checker.cas_register(h, "init")[0] == []


def test_register_unknown_write_cannot_take_effect_before_its_invocation():
    h = [read("b", 0, 1, "a1"), cas("a", 2, None, "init", "a1", UNKNOWN)]
    assert len(checker.cas_register(h, "init")[0]) == 1


def test_register_failed_write_that_was_observed_is_a_violation():
    h = [cas("a", 0, 1, "init", "a1", FAIL), read("b", 2, 3, "a1")]
    assert len(checker.cas_register(h, "init")[0]) == 1


# -- versions a client sees ----------------------------------------------------------------------------------------
def test_versions_going_back_for_one_client_is_a_violation():
    ok = [op("a", "read", 0, 1, output={"version": 5}), op("a", "read", 2, 3, output={"version": 5}),
          op("b", "read", 2.5, 3, output={"version": 3}), op("a", "cas", 4, 5, output={"version": 9})]
    assert checker.monotonic_versions(ok) == []
    bad = ok + [op("a", "read_mv", 6, 7, output={"version": 7})]
    violations = checker.monotonic_versions(bad)
    assert len(violations) == 1 and "version 7 after 9" in violations[0]["message"]


# -- acknowledged sends --------------------------------------------------------------------------------------------
def send(body, queue, offset, outcome=OK):
    return op("s", "send", 0, 1, outcome, {"queue": queue, "offset": offset}, topic="t", queue=queue, body=body)


def test_lost_or_changed_acknowledged_message_is_a_violation():
    h = [send("x", 0, 0), send("y", 0, 1), send("z", 1, 0, UNKNOWN)]
    assert checker.no_lost_sends(h, {("t", 0): {0: "x", 1: "y"}}) == []
    assert len(checker.no_lost_sends(h, {("t", 0): {0: "x"}})) == 1
    assert "holds 'other'" in checker.no_lost_sends(h, {("t", 0): {0: "x", 1: "other"}})[0]["message"]


# -- exclusive commits ---------------------------------------------------------------------------------------------
def commit(p, t0, t1, token, queue=0, outcome=OK):
    return op(p, "commit", t0, t1, outcome, {"offset": 1}, topic="t", queue=queue, token=token)


def test_commit_with_an_older_token_after_a_newer_one_is_a_violation():
    ok = [commit("a", 0, 1, 5), commit("b", 2, 3, 7), commit("a", 4, 5, 5, outcome=FAIL), commit("c", 4, 5, 3, 1)]
    assert checker.exclusive_commits(ok) == []
    # overlapping in time: either order is possible, no violation
    assert checker.exclusive_commits([commit("b", 0, 3, 7), commit("a", 1, 2, 5)]) == []
    violations = checker.exclusive_commits(ok + [commit("a", 6, 7, 5)])
    assert len(violations) == 1 and violations[0]["evidence"]["newer_owner"]["input"]["token"] == 7


# -- pops ----------------------------------------------------------------------------------------------------------
def pop(t, *messages):
    return op("p", "pop", t, t + 0.5, OK, {"messages": [{"queue": q, "offset": o, "handle": h}
                                                        for q, o, h in messages]})


def ack(t, *handles, outcome=OK, ok=True):
    return op("p", "ack", t, t + 0.5 if outcome != UNKNOWN else None, outcome,
              {"results": [{"handle": h, "ok": ok} for h in handles]} if outcome == OK else {}, handles=list(handles))


def test_popped_message_neither_acked_nor_redelivered_is_a_violation():
    sends = [op("s", "send", 0, 0.1, OK, {"queue": 0, "offset": o}, topic="tp", queue=0, body=f"m{o}")
             for o in range(3)]
    good = sends + [pop(1, (0, 0, "h0"), (0, 1, "h1"), (0, 2, "h2")), ack(2, "h0"), ack(2.1, "h1", outcome=UNKNOWN),
                    pop(5, (0, 2, "h2b")), ack(6, "h2b")]
    violations, stats = checker.pops_acked_or_redelivered(good, set(), "tp")
    assert violations == [] and stats["deliveries"] == 4
    never_back = sends + [pop(1, (0, 0, "h0"), (0, 1, "h1"), (0, 2, "h2")), ack(2, "h0", "h1")]
    violations, _ = checker.pops_acked_or_redelivered(never_back, set(), "tp")
    assert len(violations) == 1 and "tp/0@2" in violations[0]["message"]
    # an acked message delivered again breaks no promise of this check, but is counted
    again = good + [pop(7, (0, 0, "h0c")), ack(8, "h0c")]
    violations, stats = checker.pops_acked_or_redelivered(again, set(), "tp")
    assert violations == [] and stats["redelivered_after_ack"] == 1
    # after an ack of unknown outcome (h1 above) a redelivery is expected, not counted
    maybe = good + [pop(7, (0, 1, "h1c")), ack(8, "h1c")]
    assert checker.pops_acked_or_redelivered(maybe, set(), "tp") == ([], {**stats, "redelivered_after_ack": 0,
                                                                           "redelivered_after_ack_examples": [],
                                                                           "deliveries": 5})
    # the same history is fine when the broker dead-lettered it
    assert checker.pops_acked_or_redelivered(never_back, {("tp", 0, 2)}, "tp")[0] == []
    refused_ack = sends + [pop(1, (0, 0, "h0"), (0, 1, "h1"), (0, 2, "h2")), ack(2, "h0", "h1"),
                           ack(2.2, "h2", ok=False)]
    assert len(checker.pops_acked_or_redelivered(refused_ack, set(), "tp")[0]) == 1


def test_acknowledged_send_to_the_pop_topic_never_popped_is_a_violation():
    sends = [op("s", "send", 0, 0.1, OK, {"queue": 0, "offset": o}, topic="tp", queue=0, body=f"m{o}")
             for o in range(2)]
    violations, _ = checker.pops_acked_or_redelivered(sends + [pop(1, (0, 0, "h0")), ack(2, "h0")], set(), "tp")
    assert len(violations) == 1 and "never popped" in violations[0]["message"]


# -- the nemesis's schedule ----------------------------------------------------------------------------------------
def test_schedule_is_a_function_of_seed_duration_and_kinds():
    names = (["m1", "m2", "m3"], ["b1", "b2", "b3"])
    a = nemesis.schedule(42, 300, nemesis.KINDS, names)
    assert a == nemesis.schedule(42, 300, nemesis.KINDS, names)
    assert a != nemesis.schedule(43, 300, nemesis.KINDS, names)
    assert len(a) >= 100 and {f.kind for f in a} == set(nemesis.KINDS)
    assert all(f.at_s + f.hold_s <= 300 for f in a)
    assert all(b.at_s >= a_.at_s + a_.hold_s for a_, b in zip(a, a[1:]))   # one fault at a time
    only = nemesis.schedule(42, 60, ("pause",), names)
    assert only and {f.kind for f in only} == {"pause"}
