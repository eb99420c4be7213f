"""The chaos runner's history checks (ops/chaos/checker.py) on small hand-made histories: each check passes a
history that keeps its property and fails one that breaks it, so none of them can pass whatever happens.
Also the nemesis schedule (the same seed gives the same faults) and the sizes workload's command sizes."""

from __future__ import annotations

import json
import math
import os

import pytest

from ops.chaos import bodies, checker, nemesis, topology, workloads
from ops.chaos.history import FAIL, OK, UNKNOWN, Op
from ops.chaos.runner import _broker_faults, fence_windows, segment_chains, segment_epochs
from wire.errors import StatorError


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
def send(tag, queue, offsets, sizes=None, outcome=OK, topic="t"):
    sizes = sizes if sizes is not None else [0] * len(offsets)
    return op("s", "send", 0, 1, outcome, {"queue": queue, "offsets": offsets}, topic=topic, queue=queue, tag=tag,
              sizes=sizes)


def fp(tag, size=0):
    return bodies.fingerprint(bodies.body(tag, size))


def test_lost_or_changed_acknowledged_message_is_a_violation():
    big = 3 * 1024 * 1024
    h = [send("x", 0, [0, 1], [0, big]), send("y", 0, [2], [3]), send("z", 1, [0], outcome=UNKNOWN)]
    final = {("t", 0): {0: fp("x.0"), 1: fp("x.1", big), 2: fp("y.0", 3)}}
    assert checker.no_lost_sends(h, final) == []
    assert len(checker.no_lost_sends(h, {("t", 0): {0: fp("x.0"), 2: fp("y.0", 3)}})) == 1
    # a big body with one byte changed is caught by its fingerprint
    changed = bodies.body("x.1", big)
    changed = changed[:-1] + ("a" if changed[-1] != "a" else "b")
    assert len(checker.no_lost_sends(h, {("t", 0): {**final[("t", 0)], 1: bodies.fingerprint(changed)}})) == 1
    assert "holds 'other'" in checker.no_lost_sends(h, {("t", 0): {**final[("t", 0)], 2: "other"}})[0]["message"]
    # an answer with fewer offsets than messages sent
    assert "answered with 1 offsets" in checker.no_lost_sends([send("w", 0, [0], [0, 0])], final)[0]["message"]


def test_bodies_span_one_byte_to_megabytes_and_are_a_function_of_tag_and_size():
    import random
    rng = random.Random(1)
    sizes = [s for _ in range(400) for s in bodies.sizes(rng, 50)]
    assert min(s for s in sizes if s) == 1 and max(sizes) > 1024 * 1024 and sizes.count(0) > len(sizes) // 2
    assert all(len(bodies.body("send-a-1.0", n)) == n for n in (1, 5, 11, 12, 4000))
    assert bodies.body("t", 0) == "t" and bodies.body("tag-1.2", 100) == bodies.body("tag-1.2", 100)
    assert bodies.tag_of(fp("send-a-1.0", 5000)) == "send-a-1.0" and bodies.tag_of(fp("send-a-1.0", 3)) is None


def test_gaps_and_duplicates_in_a_queue_are_violations():
    one = {("t", 0): [(0, None)], ("t", 1): [(0, None)]}
    good = {("t", 0): {0: fp("a-1.0"), 1: fp("a-1.1", 300), 2: fp("a-1.2", 2)}, ("t", 1): {}}
    assert checker.queues_contiguous(good, one, 100) == ([], {"segments_read": 2, "budget_jumps": 0,
                                                              "resent_to_a_new_queue": 0})
    gap = {("t", 0): {0: fp("a-1.0"), 2: fp("a-1.2", 2)}}
    assert "first missing: 1" in checker.queues_contiguous(gap, one, 100)[0][0]["message"]
    late_start = {("t", 0): {1: fp("a-1.0")}}
    assert len(checker.queues_contiguous(late_start, one, 100)[0]) == 1
    twice = {("t", 0): {0: fp("a-1.0")}, ("t", 1): {0: fp("a-1.0")}}
    assert "stored twice" in checker.queues_contiguous(twice, one, 100)[0][0]["message"]
    # a retrying producer's batch resent to its key's new queue: counted; twice in one queue: still a violation
    assert checker.queues_contiguous(twice, one, 100, retrying=("a-",)) == (
        [], {"segments_read": 2, "budget_jumps": 0, "resent_to_a_new_queue": 1})
    same_queue = {("t", 0): {0: fp("a-1.0"), 1: fp("a-1.0")}}
    assert "stored twice" in checker.queues_contiguous(same_queue, one, 100, retrying=("a-",))[0][0]["message"]
    # short untagged bodies may repeat
    assert checker.queues_contiguous({("t", 0): {0: fp("a-1.0", 1), 1: fp("a-1.0", 1)}}, one, 100)[0] == []
    # a seal at the budget's end: a jump between segments, allowed up to one budget
    chain = {("t", 0): [(0, 50), (50, None)]}
    jumped = {("t", 0): {0: fp("a-1.0"), 1: fp("a-1.1"), 50: fp("a-1.2")}}
    assert checker.queues_contiguous(jumped, chain, 100) == ([], {"segments_read": 2, "budget_jumps": 1,
                                                                  "resent_to_a_new_queue": 0})
    assert "more than one offset budget" in checker.queues_contiguous(jumped, chain, 40)[0][0]["message"]
    # the next segment must start at its own start, not anywhere after it
    assert len(checker.queues_contiguous({("t", 0): {0: fp("a-1.0"), 51: fp("a-1.2")}}, chain, 100)[0]) == 1
    # an offset outside every segment
    assert "lie in no segment" in checker.queues_contiguous(good, {("t", 0): [(1, None)]}, 100)[0][-1]["message"]

def test_segment_chains_refuse_a_queue_whose_new_head_has_no_logic_start_yet():
    """A remap begun just before the read-back: its new head's logic start is null until the seal is in the log.
    The chains refuse it as not settled (the read-back retries), rather than the checker crashing on the null."""
    def topic(second_start):
        segs = [{"logic_start": 0, "logic_end": 7}, {"logic_start": second_start, "logic_end": None}]
        return {"topic": "t", "logic_queues": [{"queue": 0, "segments": segs[:1]}, {"queue": 1, "segments": segs}]}
    assert segment_chains(topic(7)) == {("t", 0): [(0, 7)], ("t", 1): [(0, 7), (7, None)]}
    with pytest.raises(StatorError) as e:
        segment_chains(topic(None))
    assert e.value.code == "NOT_SETTLED" and e.value.status == 503 and "queue 1" in e.value.message


# -- one leader per epoch ------------------------------------------------------------------------------------------
def lsend(tag, queue, offsets, broker, epoch, outcome=OK, t0=0, t1=1):
    """An acknowledged send as the send workload records it: the broker it went to and its route's leader epoch."""
    return op("s", "send", t0, t1, outcome, {"queue": queue, "offsets": offsets} if outcome == OK else {},
              topic="t", queue=queue, tag=tag, sizes=[0] * len(offsets), broker=broker, leader_epoch=epoch)


def chain(*segments):
    """(gen, broker, logic_start, logic_end) each, the last one the head (logic_end None)."""
    return [{"gen": g, "broker": b, "logic_start": lo, "logic_end": hi, "sealer": None} for g, b, lo, hi in segments]


# queue 0: b1 led gen 1 (0-4), failed over to b2 in gen 2 (5-9), remapped back to b1 in gen 3 (10-); queue 1: b3
EPOCHS = {("t", 0): chain((1, "b1", 0, 5), (2, "b2", 5, 10), (3, "b1", 10, None)), ("t", 1): chain((1, "b3", 0, None))}


def test_one_leader_per_epoch_holds_when_each_epoch_s_sends_were_acknowledged_by_its_leader():
    h = [lsend("a", 0, [0, 1, 2], "b1", 1), lsend("b", 0, [3, 4], "b1", 1),
         lsend("c", 0, [5, 6], "b2", 2), lsend("d", 0, [7, 8, 9], "b2", 2),
         # b1 leads again (gen 3): a sender whose cached route still said gen 1 at b1 is answered in gen 3
         lsend("e", 0, [10], "b1", 3), lsend("f", 0, [11], "b1", 1),
         lsend("g", 1, [0, 1], "b3", 1),
         # not acknowledged: whatever broker it went to, it says nothing
         lsend("h", 0, [], "b3", 2, outcome=UNKNOWN), lsend("i", 0, [], "b1", 2, outcome=FAIL),
         # a send recorded before sends named their broker is not counted
         send("j", 0, [12])]
    violations, stats = checker.one_leader_per_epoch(h, EPOCHS)
    assert violations == []
    assert stats == {"epoch_sends_checked": 7, "epoch_sends_unplaced": 0, "epochs_acked": 4, "epochs_of_route_acked": 4}


def test_two_brokers_acknowledging_in_one_epoch_is_a_violation():
    # b1, cut off from meta and its followers, went on acknowledging sends routed with gen 1 after the log failed
    # its head over to b2: its offsets 5-6 are gen 2's, which b2 acknowledged too
    h = [lsend("a", 0, [0, 1, 2, 3, 4], "b1", 1), lsend("stale", 0, [5, 6], "b1", 1),
         lsend("c", 0, [5, 6, 7], "b2", 2)]
    violations, _ = checker.one_leader_per_epoch(h, EPOCHS)
    assert [v["check"] for v in violations] == ["one_leader_per_epoch"]
    assert "leader epoch 2, which the log gives to b2" in violations[0]["message"]
    assert "b1, b2" in violations[0]["message"]
    assert [o["input"]["tag"] for o in violations[0]["evidence"]["sends"]["b1"]] == ["stale"]
    # alone in an epoch the log gives another broker is two leaders too
    violations, _ = checker.one_leader_per_epoch([lsend("stale", 0, [5], "b1", 1)], EPOCHS)
    assert len(violations) == 1 and violations[0]["evidence"]["segment"]["broker"] == "b2"
    # meta's routes naming two leaders for one epoch: both answered sends routed with gen 2
    h = [lsend("c", 0, [5], "b2", 2), lsend("d", 0, [6], "b3", 2, t0=2, t1=3)]
    violations, _ = checker.one_leader_per_epoch(h, EPOCHS)
    messages = sorted(v["message"] for v in violations)
    assert len(violations) == 2 and any("routes named two leaders" in m for m in messages)


def test_a_send_outside_every_segment_is_left_to_the_other_checks():
    violations, stats = checker.one_leader_per_epoch([lsend("a", 1, [1], "b3", 1), lsend("b", 2, [0], "b3", 1)],
                                                     {("t", 1): chain((1, "b3", 3, None))})
    assert violations == [] and stats["epoch_sends_unplaced"] == 2


def test_segment_epochs_name_each_segment_s_gen_leader_and_budget_end():
    segs = [{"gen": 1, "broker": "b1", "logic_start": 0, "logic_end": 7, "sealer": "b2", "state": "sealed",
             "physical_start": 0, "budget_end": 100},
            {"gen": 2, "broker": "b2", "logic_start": 7, "logic_end": None, "sealer": None, "state": "active",
             "physical_start": 0, "budget_end": 50}]
    topic = {"topic": "t", "logic_queues": [{"queue": 0, "segments": segs}]}
    keys = ("gen", "broker", "logic_start", "logic_end", "sealer")
    assert segment_epochs(topic) == {("t", 0): [{**{k: segs[0][k] for k in keys}, "budget_logic_end": 100},
                                                {**{k: segs[1][k] for k in keys}, "budget_logic_end": 57}]}
    segs[1]["logic_start"] = None
    with pytest.raises(StatorError):
        segment_epochs(topic)


def test_a_segment_sealed_at_a_copy_s_end_but_read_back_short_is_a_violation():
    """Only a seal at the budget's end may leave offsets unused: every other seal is at the end of a copy (its
    leader's, or the elected replica's after a failover), so a segment read back short of it lost what it held (a
    broker that led it came back on a new disk and served it from its empty copy)."""
    chain = {("t", 0): [(0, 3), (3, None)]}
    held = {("t", 0): {0: fp("a-1.0"), 1: fp("a-1.1"), 2: fp("a-1.2"), 3: fp("a-1.3")}}
    exact = {("t", 0): [{"budget_logic_end": 1000}, {"budget_logic_end": 1003}]}
    assert checker.queues_contiguous(held, chain, 10_000, exact) == ([], {"segments_read": 2, "budget_jumps": 0,
                                                                          "resent_to_a_new_queue": 0})
    short = {("t", 0): {3: fp("a-1.3")}}
    violations, stats = checker.queues_contiguous(short, chain, 10_000, exact)
    assert len(violations) == 1 and "sealed at 3, the end of a copy" in violations[0]["message"]
    assert stats["budget_jumps"] == 0
    # without the epochs (or when the seal is at the budget's end) a jump up to one budget is allowed as before
    assert checker.queues_contiguous(short, chain, 10_000)[0] == []
    at_budget = {("t", 0): [{"budget_logic_end": 3}, {"budget_logic_end": 1003}]}
    assert checker.queues_contiguous(short, chain, 10_000, at_budget) == ([], {"segments_read": 2, "budget_jumps": 1,
                                                                              "resent_to_a_new_queue": 0})


def oread(t0, t1, offset, queue=0):
    return op("c", "oread", t0, t1, OK, {"offset": offset}, topic="t", queue=queue)


def ocommit(t0, t1, offset, outcome=OK, queue=0):
    return op("c", "commit", t0, t1 if outcome != UNKNOWN else None, outcome, {"offset": offset}, topic="t",
              queue=queue, token=1, offset=offset)


def test_a_committed_offset_read_never_goes_back_past_an_acknowledged_commit():
    h = [ocommit(0, 1, 5), oread(2, 3, 5), ocommit(4, 5, 9), oread(6, 7, 9), oread(6, 7, 9, queue=1)]
    assert checker.committed_offsets(h) == []
    # the remap-back bug of issue 20: after 9 was acknowledged, a read answers 5
    back = h + [oread(8, 9, 5)]
    v = checker.committed_offsets(back)
    assert len(v) == 1 and "answered 5" in v[0]["message"]
    # concurrent with a later commit, or after one of unknown outcome: either value may be seen
    assert checker.committed_offsets(h + [ocommit(8, 10, 12), oread(8.5, 9, 12), oread(8.5, 9, 9)]) == []
    assert checker.committed_offsets(h + [ocommit(8, None, 3, outcome=UNKNOWN), oread(20, 21, 3)]) == []
    # a refused commit changes nothing
    assert len(checker.committed_offsets(h + [ocommit(8, 8.5, 3, outcome=FAIL), oread(9, 9.5, 3)])) == 1
    # two commits overlapping, acknowledged in either order: either may have taken effect last
    both = h + [ocommit(8, 12.1, 11), ocommit(10, 12.0, 13)]
    assert checker.committed_offsets(both + [oread(13, 14, 13), oread(13, 14, 11)]) == []
    assert len(checker.committed_offsets(both + [oread(13, 14, 9)])) == 1, "9 ended before both began"
    assert len(checker.committed_offsets(both + [ocommit(12.5, 12.6, 15), oread(13, 14, 13)])) == 1, \
        "15 began after both ended"


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
def pop(t, *messages, address="b1"):
    return op("p", "pop", t, t + 0.5, OK, {"messages": [{"queue": q, "offset": o, "handle": h}
                                                        for q, o, h in messages]}, address=address)


def ack(t, *handles, outcome=OK, ok=True, address="b1"):
    return op("p", "ack", t, t + 0.5 if outcome != UNKNOWN else None, outcome,
              {"results": [{"handle": h, "ok": ok} for h in handles]} if outcome == OK else {}, handles=list(handles),
              address=address)


def test_popped_message_neither_acked_nor_redelivered_is_a_violation():
    sends = [send(f"m{o}", 0, [o], topic="tp") for o in range(3)]
    good = sends + [pop(1, (0, 0, "h0"), (0, 1, "h1"), (0, 2, "h2")), ack(2, "h0"), ack(2.1, "h1", outcome=UNKNOWN),
                    pop(5, (0, 2, "h2b")), ack(6, "h2b")]
    violations, stats = checker.pops_acked_or_redelivered(good, set(), "tp")
    assert violations == [] and stats["deliveries"] == 4
    never_back = sends + [pop(1, (0, 0, "h0"), (0, 1, "h1"), (0, 2, "h2")), ack(2, "h0", "h1")]
    violations, _ = checker.pops_acked_or_redelivered(never_back, set(), "tp")
    assert len(violations) == 1 and "tp/0@2" in violations[0]["message"]
    # its evidence is that message's story alone: each delivery, and each ack that named one of its handles
    story = checker.pops_acked_or_redelivered(never_back + [pop(3, (0, 2, "h2b")), ack(3.2, "h2", ok=False)],
                                              set(), "tp")[0][0]["evidence"]
    assert [(d["handle"], d["invoke"]) for d in story["deliveries"]] == [("h2", 1), ("h2b", 3)]
    assert [(a["invoke"], a["handles"]) for a in story["acks"]] == [(3.2, {"h2": False})]
    # an acked message delivered again breaks no promise of this check (acked_pops_stay_acked judges it)
    again = good + [pop(7, (0, 0, "h0c")), ack(8, "h0c")]
    assert checker.pops_acked_or_redelivered(again, set(), "tp") == ([], {"deliveries": 5})
    # the same history is fine when the broker dead-lettered it
    assert checker.pops_acked_or_redelivered(never_back, {("tp", 0, 2)}, "tp")[0] == []
    refused_ack = sends + [pop(1, (0, 0, "h0"), (0, 1, "h1"), (0, 2, "h2")), ack(2, "h0", "h1"),
                           ack(2.2, "h2", ok=False)]
    assert len(checker.pops_acked_or_redelivered(refused_ack, set(), "tp")[0]) == 1


def test_a_message_delivered_again_after_an_ack_answered_ok_is_a_violation():
    first, acked = pop(1, (0, 4, "h4")), ack(2, "h4")        # the ack completes at 2.5
    bad = checker.acked_pops_stay_acked([first, acked, pop(3, (0, 4, "h4b"), address="b2")])
    assert [v["check"] for v in bad] == ["acked_pops_stay_acked"] and "0@4" in bad[0]["message"]
    # a pop under way while the ack was may have found it due first; an ack refused or of unknown outcome
    # promised nothing
    assert checker.acked_pops_stay_acked([first, acked, pop(2.2, (0, 4, "h4b"))]) == []
    assert checker.acked_pops_stay_acked([first, ack(2, "h4", ok=False), pop(3, (0, 4, "h4b"))]) == []
    assert checker.acked_pops_stay_acked([first, ack(2, "h4", outcome=UNKNOWN), pop(3, (0, 4, "h4b"))]) == []
    # a late ack of the first handle, answered after the message came again and was acked: judged from its own end
    again, late = pop(4, (0, 4, "h4b")), ack(6, "h4")
    assert checker.acked_pops_stay_acked([first, again, ack(4.6, "h4b"), late]) == []
    assert len(checker.acked_pops_stay_acked([first, again, ack(4.6, "h4b"), late, pop(7, (0, 4, "h4c"))])) == 1


def test_an_ack_through_a_handle_the_broker_superseded_answered_ok_is_a_violation():
    first, again = pop(1, (0, 4, "h4")), pop(4, (0, 4, "h4b"))      # h4 past its invisible time, delivered again
    # the late ack refused, or made before the message came again, or through the newer handle: fine
    assert checker.stale_pop_acks([first, again, ack(6, "h4", ok=False), ack(7, "h4b")]) == []
    assert checker.stale_pop_acks([first, ack(3, "h4"), again]) == []
    # answered ok by the broker that had delivered it again: the newer delivery's consumer loses it
    bad = checker.stale_pop_acks([first, again, ack(6, "h4"), ack(7, "h4b", ok=False)])
    assert [v["check"] for v in bad] == ["stale_pop_acks"] and "0@4" in bad[0]["message"]
    # ... and so is one answered while the newer delivery's own ack was still under way
    late = checker.stale_pop_acks([first, again, ack(6, "h4"), ack(5.8, "h4b")])
    assert [v["check"] for v in late] == ["stale_pop_acks"]
    # once the newer delivery was acked, the message is done: the old handle's ok changes nothing
    assert checker.stale_pop_acks([first, again, ack(5, "h4b"), ack(6, "h4")]) == []
    # ... and once any delivery of it was: a restart lost h4b's delivery (first deliveries are written lazily), the
    # message came a third time and that one was acked (the simulator, seed 8 of 40 s with broker faults)
    third = pop(4.7, (0, 4, "h4e"))
    assert checker.stale_pop_acks([first, again, third, ack(5, "h4e"), ack(6, "h4"), ack(7, "h4b")]) == []
    assert len(checker.stale_pop_acks([first, again, third, ack(6.2, "h4e"), ack(6, "h4"), ack(7, "h4b")])) == 1
    # ... but another broker (a head failed over) never saw the newer delivery: not judged
    moved = pop(4, (0, 4, "h4c"), address="b2")
    assert checker.stale_pop_acks([first, moved, ack(6, "h4")]) == []
    # a newer pop still under way when the ack was sent had not superseded anything yet
    assert checker.stale_pop_acks([first, pop(5.8, (0, 4, "h4d")), ack(6, "h4")]) == []


def session_event(kind, broker, ts):
    return {"type": kind, "ts": ts, "data": {"broker": broker, "epoch": 1}}


def test_a_send_a_fenced_broker_acknowledged_is_a_violation():
    windows = fence_windows([session_event("BrokerRegistered", "b1", 100), session_event("BrokerFenced", "b1", 5_000),
                             session_event("BrokerUnfenced", "b1", 9_000), session_event("BrokerFenced", "b2", 7_000),
                             session_event("BrokerRegistered", "b3", 100)])
    assert windows == {"b1": [(5_000, 9_000)], "b2": [(7_000, math.inf)], "b3": []}

    def sent(broker, invoke_s, complete_s, outcome=OK):
        return op("s", "send", invoke_s, complete_s, outcome, {"queue": 0, "offsets": [1]}, topic="t", queue=0,
                  tag="x", sizes=[0], broker=broker)

    wall_ms = lambda t: t * 1000   # noqa: E731 -- the recorder's clock, here already meta's
    fine = [sent("b1", 4.0, 5.5), sent("b1", 8.0, 9.5), sent("b1", 9.2, 9.3), sent("b2", 6.0, 6.9),
            sent("b1", 6.0, 6.5, outcome=FAIL), sent("b3", 6.0, 6.5)]
    assert checker.fenced_brokers_refuse(fine, windows, wall_ms) == []
    bad = checker.fenced_brokers_refuse([sent("b1", 6.0, 6.5), sent("b2", 8.0, 8.1)], windows, wall_ms)
    assert [v["check"] for v in bad] == ["fenced_brokers_refuse"] * 2 and "1000 ms after" in bad[0]["message"]


def key_violations(ops, barriers):
    return checker.keys_in_order(ops, barriers)[0]


def lease_violations(ops):
    return checker.leases_never_overlap(ops)[0]


def ksend(process, key, t, queue, offsets, topic="t"):
    return op(process, "ksend", t, t + 0.2, OK, {"queue": queue, "offsets": list(offsets), "broker": "b1"},
              topic=topic, key=key, tag=f"{process}-{t}", sizes=[0] * len(offsets))


def test_a_key_s_later_batch_readable_before_its_earlier_one_is_a_violation():
    same = [ksend("p", "k", 1, 0, [10, 11]), ksend("p", "k", 2, 0, [12])]
    assert key_violations(same, {}) == []
    back = key_violations([ksend("p", "k", 1, 0, [10, 11]), ksend("p", "k", 2, 0, [5])], {})
    assert [v["check"] for v in back] == ["keys_in_order"] and "0@5" in back[0]["message"]
    # moved by a growth: behind a barrier on the old queue past the earlier batch, directly or through another
    moved = [ksend("p", "k", 1, 0, [10, 11]), ksend("p", "k", 2, 3, [0])]
    assert checker.keys_in_order(moved, {("t", 3): [(0, 12)]}) == ([], {"key_pairs": 1, "key_pairs_moved": 1})
    assert key_violations(moved, {("t", 3): [(1, 40)], ("t", 1): [(0, 12)]}) == []
    assert len(key_violations(moved, {("t", 3): [(0, 11)]})) == 1, "the barrier lets 11 be read after"
    assert len(key_violations(moved, {})) == 1, "no barrier at all"
    # batches that overlapped in time, other keys, other processes: no order promised between them
    assert key_violations([ksend("p", "k", 1, 0, [10]), ksend("p", "k", 1.1, 0, [3])], {}) == []
    assert key_violations([ksend("p", "k", 1, 0, [10]), ksend("p", "j", 2, 0, [3]),
                                  ksend("q", "k", 3, 0, [4])], {}) == []


def beat(member, at_ms, *assignments):
    return op(member, "heartbeat", at_ms / 1000, at_ms / 1000 + 0.01, OK,
              {"answered_wall_ms": at_ms, "assignments": [list(a) for a in assignments]})


def test_a_lease_granted_before_the_one_promised_to_the_previous_holder_ended_is_a_violation():
    # a held queue 0 with token 1 until 13_000 (renewed twice); b gets token 2 once that lease ended
    a = [beat("a", 1_000, (0, 1, 5_000), (1, 1, 5_000)), beat("a", 9_000, (0, 1, 13_000))]
    assert checker.leases_never_overlap(a + [beat("b", 13_200, (0, 2, 17_000))]) == (
        [], {"lease_handovers": 1, "lease_handovers_released": 0})
    # within the margin a deposed leader's late renewal may cause: not judged
    assert lease_violations(a + [beat("b", 12_100, (0, 2, 16_000))]) == []
    early = lease_violations(a + [beat("b", 11_000, (0, 2, 15_000))])
    assert [v["check"] for v in early] == ["leases_never_overlap"] and "2000 ms" in early[0]["message"], early
    # a promise made for the old token after the new one was granted counts too, whatever order the ops come in
    renewed_late = [beat("b", 13_200, (0, 2, 17_000)), *a, beat("a", 13_100, (0, 1, 17_100))]
    assert len(lease_violations(renewed_late)) == 1
    # the longest promise of every lower token counts, not only the previous one's
    three = a + [beat("b", 13_200, (0, 2, 13_500)), beat("c", 13_600, (0, 3, 17_000))]
    assert lease_violations(three) == []
    assert len(lease_violations(a + [beat("b", 13_200, (0, 2, 13_500)), beat("c", 11_500, (0, 3, 1))])) == 1


def test_acknowledged_send_to_the_pop_topic_never_popped_is_a_violation():
    sends = [send(f"m{o}", 0, [o], topic="tp") for o in range(2)]
    violations, _ = checker.pops_acked_or_redelivered(sends + [pop(1, (0, 0, "h0")), ack(2, "h0")], set(), "tp")
    assert len(violations) == 1 and "never popped" in violations[0]["message"]


# -- the nemesis's schedule ----------------------------------------------------------------------------------------
def test_schedule_is_a_function_of_seed_duration_and_kinds():
    names = (["m1", "m2", "m3"], ["b1", "b2", "b3"])
    a = nemesis.schedule(42, 300, nemesis.KINDS, names)
    assert a == nemesis.schedule(42, 300, nemesis.KINDS, names)
    assert a != nemesis.schedule(43, 300, nemesis.KINDS, names)
    # an install holds two compaction periods and more, so 300 s hold fewer faults than the short kinds alone
    assert len(a) >= 60 and {f.kind for f in a} == set(nemesis.KINDS)
    assert all(f.at_s + f.hold_s <= 300 for f in a)
    assert all(b.at_s >= a_.at_s + a_.hold_s for a_, b in zip(a, a[1:]))   # one fault at a time
    only = nemesis.schedule(42, 60, ("pause",), names)
    assert only and {f.kind for f in only} == {"pause"}


def test_broker_faults_are_drawn_from_the_seed_and_cut_what_they_say(tmp_path):
    names = (["m1", "m2", "m3"], ["b1", "b2", "b3"])
    a = nemesis.schedule(9, 300, nemesis.BROKER_KINDS, names)
    assert a == nemesis.schedule(9, 300, nemesis.BROKER_KINDS, names)
    assert {f.kind for f in a} == set(nemesis.BROKER_KINDS)
    for f in a:
        lo, hi = nemesis.HOLD_S[f.kind]
        assert lo <= f.hold_s <= hi
        if f.kind == "broker_wipe":
            assert f.target in names[1]
        else:
            broker, side = f.target.split("|")
            assert broker in names[1] and side in nemesis.BROKER_PARTITION_SIDES
    assert {f.target.split("|")[1] for f in a if f.kind == "broker_partition"} == set(nemesis.BROKER_PARTITION_SIDES)
    # some wipes outlast the session timeout (fenced while away), some do not (failed over by the new registration)
    session_s = topology.META_EXTRA["session_timeout_ms"] / 1000
    holds = [f.hold_s for f in a if f.kind == "broker_wipe"]
    assert min(holds) < session_s < max(holds)
    t = topology.plan(str(tmp_path), topology.free_span())
    nem = nemesis.Nemesis(t, [], lambda: 0.0)
    front = t.broker_front_links["b2"]
    assert nem._links("b2|meta") == t.broker_meta_links["b2"] and front not in nem._links("b2|meta")
    assert nem._links("b2|peers") == [front] == ["front:b2"]
    assert nem._links("b2|all") == [*t.broker_meta_links["b2"], front]
    # a broker's followers fetch at its advertise address, the front: the senders go around it, to its port
    with open(os.path.join(str(tmp_path), "b2", "config.json")) as f:
        assert json.load(f)["advertise"] == t.links[front].url
    assert t.direct_urls()[t.links[front].url] == t.broker_url(1)


def test_a_broker_wipe_waits_while_the_broker_is_a_head_s_only_copy_in_sync(tmp_path, monkeypatch):
    t = topology.plan(str(tmp_path), topology.free_span())
    nem = nemesis.Nemesis(t, [], lambda: 0.0)
    heads = [{"topic": "t", "queue": 0, "gen": 3, "broker": "b1", "replicas": ["b1", "b2", "b3"], "in_sync": ["b1"],
              "state": "active"},
             {"topic": "t", "queue": 1, "gen": 0, "broker": "b2", "replicas": ["b2", "b3", "b1"],
              "in_sync": ["b2", "b3"], "state": "active"},
             {"topic": "u", "queue": 0, "gen": 1, "broker": "b1", "replicas": ["b1", "b2", "b3"],
              "in_sync": ["b1", "b3"], "state": "active"}]
    nem._chains = lambda: [[h] for h in heads]
    epochs = {"b1": 1, "b2": 1, "b3": 1}
    nem._epochs = lambda: dict(epochs)
    monkeypatch.setattr(nemesis, "IN_SYNC_DEADLINE_S", 0.2)
    monkeypatch.setattr(nemesis, "MEMBERSHIP_RETRY_S", 0.05)
    assert nem._heads_led("b1") == {"t": [0], "u": [0]} and nem._heads_led("b3") == {}
    # b2 may go: every head keeps a copy in sync without it (a broker wiped earlier and not caught up yet, here b2
    # and b3 of t/0, is in no in-sync set)
    nem._another_copy_in_sync("b2")
    # until b2 registers again, meta still names it in sync of t/1, where it holds nothing: b3 is t/1's last copy
    with pytest.raises(RuntimeError, match="b3 is still the only copy in sync of 1 segment"):
        nem._another_copy_in_sync("b3")
    epochs["b2"] = 2   # b2 registered again (meta counts it in sync again only once it caught up)
    nem._another_copy_in_sync("b3")
    epochs["b3"] = 2
    # b1 is the only copy in sync of t/0: its disk is not taken (bounded), and the fault is reported
    with pytest.raises(RuntimeError, match="b1 is still the only copy in sync of 1 segment"):
        nem._another_copy_in_sync("b1")
    # a broker down still named in sync is no copy: with b3 down, b2 is t/1's only one
    nem._down.add("b3")
    with pytest.raises(RuntimeError, match="b2 is still the only copy in sync of 1 segment"):
        nem._another_copy_in_sync("b2")
    nem._down.clear()
    # a sealed segment no other broker holds whole (none answers here) keeps its last whole copy's disk
    sealed = {"topic": "u", "queue": 0, "gen": 0, "broker": "b3", "replicas": ["b3", "b1", "b2"], "in_sync": ["b3"],
              "state": "sealed", "physical_queue": "u.q0.g0.i1", "physical_start": 0, "logic_start": 0,
              "logic_end": 5}
    nem._chains = lambda: [[h] for h in heads[:2]] + [[sealed, heads[2]]]
    with pytest.raises(RuntimeError, match="b2 is still the only copy in sync of 1 segment"):
        nem._another_copy_in_sync("b2")
    # a segment sealed at its budget: no copy reaches its end; another up copy must hold as much as the one going
    at_budget = {**sealed, "sealed_by": "session_expired", "logic_end": 10**6}
    nem._chains = lambda: [[h] for h in heads[:2]] + [[at_budget, heads[2]]]
    ends = {"b1": 5, "b2": 4, "b3": 3}
    nem._held = lambda seg, b, token: ends[b]
    with pytest.raises(RuntimeError, match="b1 is still the only copy in sync of 2 segment"):
        nem._another_copy_in_sync("b1")   # its copy is the longest (and it leads t/0 alone)
    nem._another_copy_in_sync("b3")   # b1 and b2 hold more (refused for good when "whole" meant its budget's end)
    epochs["b3"] = 3   # b3 registered again after that wipe
    # a segment being sealed needs another copy in sync as a head does
    sealing = {**heads[1], "gen": 0, "state": "sealing", "in_sync": ["b2"]}
    nem._chains = lambda: [[h] for h in heads[:1]] + [[sealing, {**heads[1], "gen": 1}], [heads[2]]]
    with pytest.raises(RuntimeError, match="b2 is still the only copy in sync of 1 segment"):
        nem._another_copy_in_sync("b2")
    nem._chains = lambda: None   # meta does not answer: nothing known, nothing taken
    with pytest.raises(RuntimeError):
        nem._another_copy_in_sync("b3")


def test_broker_fault_stats_count_the_sends_acknowledged_while_one_was_on():
    applied = [{"kind": "broker_wipe", "target": "b1", "applied_s": 10.0, "healed_s": 12.0,
                "led": {workloads.LOG_TOPIC: [0, 2], "chaos-cas": [1]}},
               {"kind": "broker_partition", "target": "b2|all", "applied_s": 20.0, "healed_s": 25.0, "led": {}},
               {"kind": "broker_wipe", "target": "b3", "applied_s": None, "healed_s": 31.0},   # never struck
               {"kind": "kill", "target": "b3", "applied_s": 40.0, "healed_s": 41.0}]
    h = [lsend("a", 0, [0], "b1", 1, t0=100 + 9, t1=100 + 10.5),     # through the wipe's strike
         lsend("b", 0, [1], "b2", 1, t0=100 + 11, t1=100 + 11.5),    # during it, by another broker
         lsend("c", 0, [2], "b2", 1, t0=100 + 24, t1=100 + 26),      # during the partition, by the broker cut
         lsend("d", 0, [3], "b3", 1, t0=100 + 40, t1=100 + 40.5),    # during a kill: not a broker fault
         lsend("e", 0, [], "b2", 1, UNKNOWN, t0=100 + 21, t1=None)]
    assert _broker_faults(applied, h, 100.0) == {"faults": 2, "hit_a_leader": 1, "heads_led_when_hit": 2,
                                                 "sends_acked_during": 3, "sends_acked_by_the_broker_hit": 2}


# -- sized writes (workloads.sizes) --------------------------------------------------------------------------------
def put(t0, t1, value, outcome=OK, digest=None, topic="sz", answered=None, node="n1"):
    output = {"version": 1} if outcome == OK else {}
    if answered is not None:
        output["answered_s"] = answered
    return op("w", "put", t0, t1 if outcome != UNKNOWN else None, outcome, output, topic=topic, value=value,
              digest=digest or f"d-{value}", bytes=100, node=node)


def sread(t0, t1, value, digest=None, topic="sz"):
    return op("r", "sread", t0, t1, OK, {"value": value, "digest": digest or (value and f"d-{value}")}, topic=topic)


def test_sized_reads_see_the_last_acknowledged_write_or_a_later_one_in_doubt():
    h = [sread(0, 1, None), put(2, 3, "a"), sread(4, 5, "a"), put(6, None, "b", UNKNOWN), sread(7, 8, "b"),
         put(9, 10, "c", FAIL), put(11, None, "d", UNKNOWN), sread(12, 13, "b"), sread(14, 15, "d")]
    violations, stats = checker.sized_registers(h)
    assert violations == [] and stats["sized_reads"] == 5 and stats["sized_writes_acked"] == 1
    # a retry with the same key that was answered ok acknowledges the write
    retried = [put(0, None, "a", UNKNOWN), put(1, 2, "a"), sread(3, 4, "a")]
    assert checker.sized_registers(retried)[0] == []


def test_sized_acknowledged_write_missing_at_the_end_is_a_violation():
    h = [put(0, 1, "a"), put(2, 3, "b"), sread(4, 5, "a")]
    violations, _ = checker.sized_registers(h)
    assert [v["check"] for v in violations] == ["sized_registers"]
    assert "'b' was acknowledged" in violations[0]["message"]
    # ... or the empty config after an acknowledged write
    assert len(checker.sized_registers([put(0, 1, "a"), sread(2, 3, None)])[0]) == 1


def test_sized_write_in_doubt_cannot_take_effect_after_a_later_acknowledged_one():
    # expected_version: "a" was invoked before "b", which was acknowledged; "a" can no longer be the value
    h = [put(0, None, "a", UNKNOWN), put(2, 3, "b"), sread(4, 5, "a")]
    assert len(checker.sized_registers(h)[0]) == 1


def test_sized_refused_torn_or_changed_write_is_a_violation():
    refused = [put(0, 1, "a", FAIL), sread(2, 3, "a")]
    assert len(checker.sized_registers(refused)[0]) == 1
    torn = [put(0, None, "a", UNKNOWN), put(1, None, "b", UNKNOWN), sread(2, 3, "torn:a,b")]
    assert "several writes" in checker.sized_registers(torn)[0][0]["message"]
    changed = [put(0, 1, "a", digest="sent"), sread(2, 3, "a", digest="other")]
    assert "other bytes" in checker.sized_registers(changed)[0][0]["message"]
    # topics are checked apart
    two = [put(0, 1, "a", topic="x"), put(0, 1, "b", topic="y"), sread(2, 3, "a", topic="x"),
           sread(2, 3, "a", topic="y")]
    assert len(checker.sized_registers(two)[0]) == 1


def test_sized_write_answered_past_its_budget_is_a_violation_unless_its_node_was_paused():
    late = put(10, 19, "a", answered=9.0)
    violations = checker.answered_in_budget([put(0, 1, "x", answered=1.0), late], 8.0, {})
    assert len(violations) == 1 and "answered after 9.0 s" in violations[0]["message"]
    # paused for 3 s of it: 6 s of its own
    assert checker.answered_in_budget([late], 8.0, {"n1": [(12.0, 15.0)]}) == []
    # another node's pause excuses nothing
    assert len(checker.answered_in_budget([late], 8.0, {"n2": [(12.0, 15.0)]})) == 1
    # no answer at all within the client's timeout is the same failure
    silent = op("w", "put", 0, None, UNKNOWN, {"unanswered_s": 20.0}, topic="sz", value="s", digest="d", bytes=1,
                node="n1")
    assert "still unanswered" in checker.answered_in_budget([silent], 8.0, {})[0]["message"]


def test_replicas_must_hold_the_same_image_at_the_same_version():
    same = {n: {"version": 7, "commands": 9, "sha256": "x"} for n in ("m1", "m2", "m3")}
    assert checker.replicas_agree(same) == []
    differ = {**same, "m2": {"version": 7, "commands": 9, "sha256": "y"}}
    assert "different images" in checker.replicas_agree(differ)[0]["message"]
    behind = {**same, "m3": {"error": "VERSION_NOT_REACHED"}}
    assert "one version" in checker.replicas_agree(behind)[0]["message"]


def test_install_faults_are_drawn_from_the_seed():
    names = (["m1", "m2", "m3"], ["b1", "b2", "b3"])
    a = nemesis.schedule(11, 300, ("install", "pause"), names)
    assert a == nemesis.schedule(11, 300, ("install", "pause"), names)
    installs = [f for f in a if f.kind == "install"]
    assert installs and all(f.target.endswith("|rest") and f.target.split("|")[0] in names[0] for f in installs)
    # some end in a kill -9 a moment after the heal, some do not; no other kind ever does
    assert {f.kill_after_s is None for f in installs} == {True, False}
    assert all(f.kill_after_s is None for f in a if f.kind != "install")
    lo, hi = nemesis.HOLD_S["install"]
    assert all(lo <= f.hold_s <= hi for f in installs)
    assert all(b.at_s >= x.at_s + x.hold_s + (x.kill_after_s or 0) for x, b in zip(a, a[1:]))


def test_install_cuts_a_follower_not_the_leader(tmp_path):
    t = topology.plan(str(tmp_path), topology.free_span())
    nem = nemesis.Nemesis(t, [], lambda: 0.0)
    nem._role = lambda name: "leader" if name == "m2" else "follower"
    assert nem._follower("m1") == "m1" and nem._follower("m2") == "m3"
    nem._role = lambda name: None   # nobody answers: the drawn node is cut, whatever it is
    assert nem._follower("m3") == "m3"


# -- the sizes workload's commands -----------------------------------------------------------------------------------
def test_sized_commands_land_on_their_target_size_as_the_node_encodes_them():
    """The envelope the workload sizes is the one the node proposes (meta/raft/node.py), and every size class passes
    the API's own validation: the check of 'a multiple of 64 KiB +- 64 bytes' is about the bytes the log gets."""
    import types

    from wire.shapes import validate
    from meta import commands, limits
    from meta.api import models
    from meta.raft.entry import encode_envelope
    from meta.raft.node import RaftNode

    budget = types.SimpleNamespace(offset_budget=limits.OFFSET_BUDGET_DEFAULT)
    step = workloads.SIZE_STEP_BYTES
    targets = [2 * step - 64, 2 * step + 64, 7 * step, workloads.SIZE_MULTIPLES[1] * step + 64]
    for target in targets + [None]:
        key, version = "chaos-sz-mid-0-12", 4321
        config = workloads.sized_config("chaos-sz-mid", "sz-mid-0-12", key, version, target)
        body = validate(models.TopicConfig, config)
        cmd = commands.validate({"type": "SetTopicConfig", "topic": "chaos-sz-mid", "config": body,
                                 "expected_version": version})
        size = len(encode_envelope(RaftNode.envelope(budget, cmd, f"admin:key:{key}", "admin")))
        assert size == workloads.envelope_bytes("chaos-sz-mid", config, key, version)
        if target is not None:
            assert size == target
        else:   # the largest: every key and value at the API's bounds
            assert 0.8 * 2**20 < size <= limits.COMMAND_BYTES_MAX
            assert len(json.dumps(config).encode()) <= limits.REQUEST_BODY_BYTES_MAX
        assert workloads.config_tag(config) == "sz-mid-0-12"
    assert workloads.config_tag({"a": "w-1:xx", "b": "w-2:yy"}) == "torn:w-1,w-2"
    assert workloads.config_tag({}) is None


def test_sized_write_with_a_stale_expected_version_never_takes_effect():
    def stale(t0, t1, value, outcome):
        o = put(t0, t1, value, outcome)
        o.input["stale"] = True
        return o
    refused = [put(0, 1, "a"), stale(2, 3, "b", FAIL), sread(4, 5, "a"), stale(6, None, "c", UNKNOWN), sread(7, 8, "a")]
    assert checker.sized_registers(refused)[0] == []
    # seen, even though its outcome was unknown
    assert len(checker.sized_registers(refused + [sread(9, 10, "c")])[0]) == 1
    # acknowledged
    violations, _ = checker.sized_registers([put(0, 1, "a"), stale(2, 3, "b", OK)])
    assert len(violations) == 1 and "already gone" in violations[0]["message"]


# -- the runner's count of snapshot installs (from the members' logs) ------------------------------------------------
def test_installs_are_read_from_the_logs_and_matched_to_their_fault(tmp_path):
    from ops.chaos import runner

    t = topology.plan(str(tmp_path), topology.free_span())
    (tmp_path / "logs").mkdir()
    lines = ['{"event": "raft_snapshot_written", "index": 9, "timestamp": "2026-01-01T00:00:05Z"}',
             'not json, "raft_snapshot_installed"',
             '{"event": "raft_snapshot_installed", "index": 12, "timestamp": "2026-01-01T00:00:20Z"}',
             '{"event": "raft_snapshot_installed", "index": 40, "timestamp": "2026-01-01T00:02:00Z"}']
    (tmp_path / "logs" / "m2.log").write_text("\n".join(lines) + "\n")
    counts, installs = runner._snapshot_events(t)
    assert counts == {"m1": {"installed": 0, "written": 0}, "m2": {"installed": 2, "written": 1},
                      "m3": {"installed": 0, "written": 0}}
    base = installs["m2"][0] - 20   # 00:00:00
    fault = {"kind": "install", "isolated": "m2", "started_wall": base + 1, "healed_wall": base + 10}
    assert runner._installs_after_faults([fault], installs) == {"install_faults": 1, "followed": 1}
    # an install long after the heal, or on another node, is not this fault's
    late = {**fault, "started_wall": base + 60, "healed_wall": base + 70}
    elsewhere = {**fault, "isolated": "m3"}
    assert runner._installs_after_faults([late, elsewhere], installs) == {"install_faults": 2, "followed": 0}


# -- the voters after the final heal ------------------------------------------------------------------------------
def _status(disk: str, voter: bool, disks: dict[str, str]) -> dict:
    return {"disk": disk, "voter": voter, "members": [{"node": n, "disk": d} for n, d in disks.items()]}


def test_voters_agree_only_when_every_node_votes_with_its_own_disk_on_record():
    disks = {"m1": "a" * 32, "m2": "b" * 32, "m3": "c" * 32}
    good = {n: _status(d, True, disks) for n, d in disks.items()}
    assert checker.voters_agree(good) == []
    # a wiped node never promoted: still a learner
    learner = {**good, "m2": _status("d" * 32, False, disks)}
    assert [v["check"] for v in checker.voters_agree(learner)] == ["voters_agree"]
    # promoted in one node's view only
    split = {**good, "m1": _status(disks["m1"], True, {**disks, "m2": "d" * 32})}
    assert [v["check"] for v in checker.voters_agree(split)] == ["voters_agree"]
    # a node that does not answer
    assert checker.voters_agree({**good, "m3": {"error": "timeout"}})


def test_replicas_must_serve_the_same_history():
    h = {"version": 9, "events": 9, "sha256": "a"}
    assert checker.histories_agree({"m1": h, "m2": dict(h), "m3": dict(h)}) == []
    assert checker.histories_agree({}) == []
    assert len(checker.histories_agree({"m1": h, "m2": {**h, "sha256": "b"}, "m3": h})) == 1
    assert len(checker.histories_agree({"m1": h, "m2": {**h, "events": 8}, "m3": h})) == 1
    assert len(checker.histories_agree({"m1": h, "m2": {"error": "HISTORY_UNAVAILABLE"}, "m3": h})) == 1



def test_exclusive_members_go_silent_one_at_a_time_and_only_while_holding_queues():
    from ops.chaos import operators, workloads
    turns = workloads.SilenceTurns(0.0)
    first = workloads.EX_FIRST_SILENCE_S
    assert not turns.is_silent("ex-0", first - 0.1, True)                  # not before the first turn
    assert not turns.is_silent("ex-1", first, False)                       # holding nothing: shows nothing
    assert turns.is_silent("ex-0", first, True)
    assert not turns.is_silent("ex-1", first + 1, True)                    # one at a time
    assert turns.is_silent("ex-0", first + 1, False)                       # a silence runs its length
    end = first + workloads.EX_SILENT_MAX_S
    assert turns.is_silent("ex-0", end - 0.1, True)                        # not refused yet: still silent
    assert not turns.is_silent("ex-0", end, True)
    assert not turns.is_silent("ex-1", end + workloads.EX_SILENT_GAP_S - 0.1, True)
    assert turns.is_silent("ex-1", end + workloads.EX_SILENT_GAP_S, True)
    # a refusal of the silent member's commit ends its silence; another's refusal does not
    refused = end + workloads.EX_SILENT_GAP_S + 10.0
    turns.fenced("ex-0", refused)
    assert turns.is_silent("ex-1", refused, True)
    turns.fenced("ex-1", refused)
    assert not turns.is_silent("ex-1", refused, True)
    assert not turns.is_silent("ex-0", refused + workloads.EX_SILENT_GAP_S - 0.1, True)
    assert turns.is_silent("ex-0", refused + workloads.EX_SILENT_GAP_S, True)
    # a silence may outlast the longest lease the operator sets many times over: each new meta leader starts every
    # lease afresh, and the CI run's meta faults come every few seconds for its first 30 s
    assert workloads.EX_SILENT_MAX_S >= 3 * (max(operators.LEASES_MS) / 1000 + 5)


def test_a_queue_its_holder_gave_back_may_be_granted_at_once():
    # ops/sim/leases.py's members give revoked queues back, and leave: their lease ends when they sent it
    a = [beat("a", 1_000, (0, 1, 7_000))]
    b = beat("b", 2_100, (0, 2, 8_100))
    assert len(lease_violations(a + [b])) == 1, "not given back: granted 4.9 s early"
    given = op("a", "heartbeat", 2.0, 2.01, OK, {"answered_wall_ms": 2_000, "assignments": []},
               released=[[0, 1]], sent_wall_ms=2_000)
    assert lease_violations(a + [given, b]) == []
    left = op("a", "leave", 2.0, 2.01, UNKNOWN, {}, released=[[0, 1]], sent_wall_ms=2_000)   # in doubt: it was sent
    assert lease_violations(a + [left, b]) == []
    other = op("a", "leave", 2.0, 2.01, OK, {}, released=[[1, 1]], sent_wall_ms=2_000)      # another queue
    assert len(lease_violations(a + [other, b])) == 1
    # counted apart from handovers at a lease's end: the chaos run must show both kinds (tests/test_chaos.py)
    assert checker.leases_never_overlap(a + [given, b])[1] == {"lease_handovers": 1, "lease_handovers_released": 1}
    assert checker.leases_never_overlap(a + [other, b])[1]["lease_handovers_released"] == 0
