"""A broker's session and seal decisions at their edges, on the in-process state machine: the events an unfence and
a budget grant emit (whole), the grants a heartbeat's list skips without stopping, and which seal reports are
refused (a segment of another incarnation, a report from an earlier session)."""

from __future__ import annotations

from meta import allocation
from tests.support.decision_checks import brokers, emitted


def test_an_unfence_records_the_session_epoch_that_heartbeats_again():
    log = brokers("a")
    epoch = log.epoch("a")
    log.fence("a")
    since = log.version
    assert log.ok({"type": "UnfenceBroker", "broker": "a", "epoch": epoch}) == {"state": "active",
                                                                                "version": since + 1}
    assert emitted(log, since) == [{"type": "BrokerUnfenced", "broker": "a", "epoch": epoch}]


def test_a_grant_list_skips_segments_it_cannot_grow_and_grants_the_rest():
    log = brokers("a")
    log.create("t", 1, replicas=1)
    since = log.version
    got = log.ok({"type": "GrantOffsetBudget", "broker": "a", "epoch": log.epoch("a"), "grants": [
        {"topic": "t", "queue": 0, "gen": 9, "budget_end": 5000},    # no such segment
        {"topic": "t", "queue": 0, "gen": 0, "budget_end": 500},     # below its budget already
        {"topic": "t", "queue": 0, "gen": 0, "budget_end": 2000}]})
    assert got == {"granted": 1, "version": since + 1}
    assert emitted(log, since) == [{"type": "OffsetBudgetGranted", "topic": "t", "queue": 0, "gen": 0, "broker": "a",
                                    "budget_end": 2000}]


def test_a_seal_report_naming_another_physical_queue_is_refused_and_the_right_one_seals():
    log = brokers("a", "b")
    log.create("t", 1, replicas=1, brokers=["a"])
    log.remap("t", ["b"])
    own = allocation.physical_queue_name("t", log.topic("t")["incarnation"], 0, 0)
    other = allocation.physical_queue_name("t", log.topic("t")["incarnation"] - 1, 0, 0)
    err = log.reject({**log.seal_cmd("t", 0, 0, 12), "physical_queue": other})
    assert err == {"status": 404, "code": "SEGMENT_NOT_FOUND", "message": "no such segment on this broker",
                   "details": {"topic": "t", "queue": 0, "gen": 0}}
    since = log.version
    assert log.ok({**log.seal_cmd("t", 0, 0, 12), "physical_queue": own}) == {"logic_end": 12, "version": since + 2}
    assert emitted(log, since) == [
        {"type": "SegmentSealed", "topic": "t", "queue": 0, "gen": 0, "broker": "a", "physical_end": 12,
         "logic_end": 12, "by": "broker"},
        {"type": "LogicStartDecided", "topic": "t", "queue": 0, "gen": 1, "logic_start": 12}]


def test_seal_reports_of_an_earlier_session_are_refused_whole():
    log = brokers("a", "b")
    log.create("t", 1, replicas=1, brokers=["a"])
    log.remap("t", ["b"])
    err = log.reject({"type": "SealSegments", "broker": "a", "epoch": log.epoch("a") + 1,
                        "seals": [{"topic": "t", "queue": 0, "gen": 0, "end_offset": 3}]})
    assert (err["code"], err["status"], err["details"]) == ("STALE_EPOCH", 409, {"broker": "a", "epoch": 1})
    ok = log.ok({"type": "SealSegments", "broker": "a", "epoch": log.epoch("a"),
                 "seals": [{"topic": "t", "queue": 0, "gen": 0, "end_offset": 3}]})
    assert ok["results"] == [{"ok": True, "logic_end": 3}]
