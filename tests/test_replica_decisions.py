"""Replica sets in the log (DESIGN.md invariant 12), decided by the state machine alone: placement, the topic's
settings, who is in sync, and the failover a fence decides. tests/test_state_machine_stateful.py holds them against
a model over random command sequences; these name the cases."""

from __future__ import annotations

from tests.support.state_machine_builders import Log, disk_id


def cluster(*names: str, zones: dict[str, str] | None = None) -> Log:
    log = Log()
    for n in names:
        log.register(n, zone=(zones or {}).get(n))
    return log


def opened_cause(log: Log, after: int) -> str:
    """The cause of every segment opened since version ``after``, when they all name the same one."""
    [cause] = {e["data"]["cause"] for e in log.events(after) if e["type"] == "SegmentOpened"}
    return cause


def restart(log: Log, broker: str) -> None:
    """``broker`` registers again on the disk it had (``log.register`` names its own disk unless told another)."""
    log.register(broker)


def test_a_new_topic_has_three_copies_where_three_brokers_exist_and_one_where_one_does():
    log = cluster("a", "b", "c")
    assert log.create("t", 3)["replicas"] == 3
    for q in range(3):
        head = log.head("t", q)
        assert head["replicas"][0] == head["broker"] and sorted(head["replicas"]) == ["a", "b", "c"]
        assert head["in_sync"] == head["replicas"]
    assert log.topic("t")["min_insync"] == 2
    one = cluster("a")
    assert (one.create("t", 2)["replicas"], one.topic("t")["min_insync"]) == (1, 1)


def test_copies_spread_over_zones_first():
    log = cluster("a", "b", "c", "d", zones={"a": "z1", "b": "z1", "c": "z2", "d": "z2"})
    log.create("t", 4, replicas=2)
    zone = {"a": "z1", "b": "z1", "c": "z2", "d": "z2"}
    for q in range(4):
        leader, follower = log.head("t", q)["replicas"]
        assert zone[leader] != zone[follower], (q, leader, follower)


def test_settings_out_of_range_are_refused_and_change_nothing():
    log = cluster("a", "b")
    v = log.version
    log.reject({"type": "CreateTopic", "topic": "t", "queues": 1, "replicas": 3}, "NOT_ENOUGH_BROKERS")
    log.reject({"type": "CreateTopic", "topic": "t", "queues": 1, "replicas": 2, "min_insync": 3}, "INVALID_ARGUMENT")
    log.reject({"type": "CreateTopic", "topic": "t", "queues": 1, "replicas": 6}, "INVALID_ARGUMENT")
    log.reject({"type": "CreateTopic", "topic": "t", "queues": 1, "replicas": 1, "min_insync": 2}, "INVALID_ARGUMENT")
    assert log.version == v and "t" not in log.sm.image.topics


def test_a_fenced_leader_s_head_moves_to_the_first_in_sync_replica_at_the_exact_next_offset():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a", "b", "c"])
    head = log.head("t", 0)
    leader, first, second = head["replicas"]
    log.fence(leader)
    old, new = log.segs("t", 0)
    assert old["state"] == "sealing" and old["sealer"] == first
    assert (new["gen"], new["broker"], new["logic_start"]) == (1, first, None)
    assert new["replicas"] == [first, second, leader] and new["in_sync"] == [first, second]   # the lost one last
    # the old leader cannot report its end (it may have records no follower has: never acknowledged)
    log.reject(log.seal_cmd("t", 0, 0, 7, broker=leader), "SEGMENT_NOT_FOUND")
    log.seal("t", 0, 0, 5)   # the elected replica's copy ends at 5: every acknowledged record is in it
    old, new = log.segs("t", 0)
    assert (old["state"], old["logic_end"], new["logic_start"]) == ("sealed", 5, 5)


def test_a_fenced_follower_leaves_the_in_sync_set_and_nothing_else_changes():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    follower = log.head("t", 0)["replicas"][2]
    log.fence(follower)
    [head] = log.segs("t", 0)
    assert head["state"] == "active" and follower not in head["in_sync"] and follower in head["replicas"]


def test_a_broker_back_on_a_new_disk_counts_as_lost_and_what_it_sealed_alone_ends_at_its_budget():
    log = cluster("a", "b")
    log.create("t", 1, brokers=["a"], replicas=2)
    log.register("a", disk=disk_id(9))   # a new disk
    old, new = log.segs("t", 0)
    assert old["sealer"] == "b" and new["broker"] == "b" and new["in_sync"] == ["b"]
    log.create("u", 1, brokers=["a"], replicas=1)
    log.remap("u", ["b"])
    log.register("a", disk=disk_id(10))
    old, new = log.segs("u", 0)
    assert (old["state"], old["sealed_by"], old["physical_end"]) == ("sealed", "disk_lost", old["budget_end"]), \
        "its copy is empty: the end it would report would number new records with acknowledged offsets"
    assert new["logic_start"] == old["logic_end"]


def test_a_broker_back_on_its_disk_keeps_its_copies_and_still_reports_its_own_seals():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["b"], replicas=3)
    log.create("u", 1, brokers=["a"], replicas=1)
    log.remap("u", ["b"])
    before = log.segs("t", 0)
    restart(log, "a")
    assert log.segs("t", 0) == before, "a follower back on its disk stays in sync: nothing to decide"
    old, _ = log.segs("u", 0)
    assert old["state"] == "sealing" and old["sealer"] == "a", "its copy is whole: it reports its end"


def test_a_leader_back_on_its_disk_leads_on_while_a_new_disk_elsewhere_moves_nothing_to_it():
    """Found by the chaos runner (seed 21): meta, back after 8 s, took b3's registration (a power loss, its disk
    kept) as a lost disk and elected b2 for b3's heads, in sync and active in the image, but back on a wiped disk
    a moment later: b2 sealed the old gen at its empty copy's end, and acknowledged records were gone."""
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["c"], replicas=3)
    v = log.version
    restart(log, "c")
    old, new = log.segs("t", 0)
    assert (old["state"], old["sealer"], sorted(old["in_sync"])) == ("sealing", "c", ["a", "b", "c"])
    assert (new["broker"], opened_cause(log, v), sorted(new["in_sync"])) == ("c", "restart", ["a", "b", "c"])
    log.register("b", disk=disk_id(7))   # b was wiped: it leaves both in-sync sets, and seals nothing
    old, new = log.segs("t", 0)
    assert "b" not in old["in_sync"] and "b" not in new["in_sync"] and old["sealer"] == "c"
    log.seal("t", 0, 0, 6, broker="c")
    assert log.head("t", 0)["logic_start"] == 6


def test_the_in_sync_set_changes_only_as_the_head_s_leader_asks_in_its_epoch():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    head = log.head("t", 0)

    def alter(gen: int, in_sync: list[str], broker: str = "a") -> dict:
        return log.ok({"type": "AlterInSync", "broker": broker, "epoch": log.epoch(broker), "changes": [
            {"topic": "t", "queue": 0, "gen": gen, "in_sync": in_sync, "epochs": log.epochs(in_sync)}]})["results"][0]

    assert alter(0, ["a", head["replicas"][1]]) == {"ok": True, "in_sync": ["a", head["replicas"][1]]}
    assert log.head("t", 0)["in_sync"] == ["a", head["replicas"][1]]
    assert alter(0, ["a", "zz"])["ok"] is False   # not a replica: refused, nothing changed
    assert alter(0, [head["replicas"][1], "a"], broker=head["replicas"][1])["code"] == "SEGMENT_NOT_FOUND"
    log.fence(head["replicas"][2])
    assert alter(0, head["replicas"])["code"] == "BROKER_NOT_ACTIVE"
    # A follower that registered again (a new disk) after the leader last heard from it is not added back, nor one
    # the leader names no epoch of (KIP-903)
    third = head["replicas"][2]
    seen = log.epoch(third)
    log.register(third, disk=disk_id(3))
    stale = log.ok({"type": "AlterInSync", "broker": "a", "epoch": log.epoch("a"), "changes": [
        {"topic": "t", "queue": 0, "gen": 0, "in_sync": head["replicas"], "epochs": {third: seen}}]})["results"][0]
    assert (stale["ok"], stale["code"]) == (False, "STALE_BROKER_EPOCH"), stale
    unnamed = log.ok({"type": "AlterInSync", "broker": "a", "epoch": log.epoch("a"), "changes": [
        {"topic": "t", "queue": 0, "gen": 0, "in_sync": head["replicas"], "epochs": {}}]})["results"][0]
    assert unnamed["code"] == "STALE_BROKER_EPOCH" and log.head("t", 0)["in_sync"] == ["a", head["replicas"][1]]
    assert alter(0, head["replicas"]) == {"ok": True, "in_sync": head["replicas"]}
    log.remap("t", ["b"])
    assert alter(0, ["a"])["code"] == "STALE_LEADER_EPOCH"


def test_a_route_carries_the_replicas_and_refuses_writes_below_min_insync():
    from meta import views
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3, min_insync=3)
    route = views.route(log.sm.image, log.topic("t"))
    q = route["queues"][0]
    assert q["replicas"] == log.head("t", 0)["replicas"] and q["leader_epoch"] == 0 and q["writable"]
    assert (route["replicas"], route["min_insync"]) == (3, 3) and set(route["addresses"]) == {"a", "b", "c"}
    log.fence(q["replicas"][2])
    assert views.route(log.sm.image, log.topic("t"))["queues"][0]["writable"] is False


def test_an_unclean_election_is_an_operator_s_act_that_names_what_may_be_lost():
    log = cluster("a", "b", "c")
    log.create("t", 2, brokers=["a"], replicas=3)
    copies = log.head("t", 0)["replicas"]
    for q in range(2):   # both followers lag: only the leader is in sync
        log.ok({"type": "AlterInSync", "broker": "a", "epoch": log.epoch("a"), "changes": [
            {"topic": "t", "queue": q, "gen": 0, "in_sync": ["a"], "epochs": log.epochs(["a"])}]})
    log.fence("a")
    assert [len(log.segs("t", q)) for q in range(2)] == [1, 1], "no in-sync copy: nothing moves by itself"
    r = log.ok({"type": "ElectLeaders", "topic": "t", "queues": [0]})
    assert r["queues"] == [{"queue": 0, "leader": "a", "gen": 0, "outcome": "no_in_sync_copy"}]
    r = log.ok({"type": "ElectLeaders", "topic": "t", "queues": [0], "unclean": True})
    [q0] = r["queues"]
    assert (q0["outcome"], q0["to"], q0["new_gen"]) == ("elected_unclean", copies[1], 1) and "a" in q0["may_lose"]
    old, new = log.segs("t", 0)
    assert old["sealer"] == copies[1] and (new["broker"], new["in_sync"]) == (copies[1], [copies[1]])
    assert len(log.segs("t", 1)) == 1, "only the queues named"
    log.reject({"type": "ElectLeaders", "topic": "t", "queues": [5]}, "INVALID_ARGUMENT")
    log.reject({"type": "ElectLeaders", "topic": "t", "unclean": "yes"}, "INVALID_ARGUMENT")
    assert [q["outcome"] for q in log.ok({"type": "ElectLeaders", "topic": "t"})["queues"]] == [
        "leader_active", "no_in_sync_copy"]


def test_a_copy_lost_while_its_segment_is_sealing_is_never_elected_to_seal_it():
    """Found by the chaos runner's broker_wipe: a broker back on a new disk stayed in the in-sync set of a segment
    being sealed, and a later loss elected it: its empty copy's end became the segment's end."""
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    log.remap("t", ["b"])   # gen 0 on a is sealing; a seals it
    log.register(log.segs("t", 0)[0]["replicas"][1], disk=disk_id(4))   # a copy of it is back on a new disk
    lost = log.segs("t", 0)[0]["replicas"][1]
    assert lost not in log.segs("t", 0)[0]["in_sync"]
    log.fence("a")
    sealing = log.segs("t", 0)[0]
    assert sealing["sealer"] not in ("a", lost), sealing


def test_a_remap_a_growth_and_a_failover_keep_the_topic_s_count_of_copies_while_a_broker_is_fenced():
    """Found by the chaos runner's broker_wipe (seed 7): a remap while one of three brokers was fenced gave the new
    segment two copies for its whole life; two disks lost one after the other then lost what it held, while the
    third broker was back and could have held it. The fenced broker is named a copy, out of the in-sync set."""
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    log.fence("c")
    log.remap("t", ["b"])
    new = log.head("t", 0)
    assert (new["broker"], sorted(new["replicas"]), new["in_sync"]) == ("b", ["a", "b", "c"], ["b", "a"])
    log.seal_all_sealing()
    log.grow("t", 2)
    grown = log.head("t", 1)
    assert sorted(grown["replicas"]) == ["a", "b", "c"] and "c" not in grown["in_sync"], grown
    assert len(grown["in_sync"]) == 2


def test_a_leader_registered_again_with_no_copy_in_sync_leads_on_in_a_new_gen():
    """A leader streams what it writes before its sync (broker/replication/source.py): back from a crash it may have
    lost records its followers hold. It must not write new records at those offsets in the same gen: it seals the
    old gen at its own copy's end and leads the next. A single copy has no follower to differ from: it carries on."""
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    log.ok({"type": "AlterInSync", "broker": "a", "epoch": log.epoch("a"), "changes": [
        {"topic": "t", "queue": 0, "gen": 0, "in_sync": ["a"], "epochs": log.epochs(["a"])}]})   # both followers lag
    replicas = log.head("t", 0)["replicas"]
    restart(log, "a")
    old, new = log.segs("t", 0)
    assert (old["state"], old["sealer"]) == ("sealing", "a")
    assert (new["gen"], new["broker"], new["replicas"]) == (1, "a", replicas)
    # The new gen is empty, so b and c hold all of its records, but not the queue's consumer state, which a copy
    # gets from its leader as it joins: they join through the leader (AlterInSync), not by being live
    assert new["in_sync"] == ["a"], new
    log.seal("t", 0, 0, 7)
    assert log.head("t", 0)["logic_start"] == 7
    log.create("one", 1, brokers=["a"], replicas=1)
    restart(log, "a")
    assert len(log.segs("one", 0)) == 1 and log.head("one", 0)["state"] == "active"


def test_a_leader_back_on_a_new_disk_with_no_copy_in_sync_leads_on_past_its_budget():
    """Its copy is empty: leading on from its end (as one back on its disk does) would give new records the offsets
    of acknowledged ones. Its budget's end is a safe end; what it alone held is lost (a single copy, or every
    follower lagging), and the route says so: sealed by disk_lost."""
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    log.ok({"type": "AlterInSync", "broker": "a", "epoch": log.epoch("a"), "changes": [
        {"topic": "t", "queue": 0, "gen": 0, "in_sync": ["a"], "epochs": log.epochs(["a"])}]})
    log.create("one", 1, brokers=["a"], replicas=1)
    v = log.version
    log.register("a", disk=disk_id(9))
    for topic in ("t", "one"):
        old, new = log.segs(topic, 0)
        assert (old["state"], old["sealed_by"], old["physical_end"]) == ("sealed", "disk_lost", old["budget_end"])
        assert (new["broker"], new["logic_start"]) == ("a", old["logic_end"]), new
    assert opened_cause(log, v) == "disk_lost"
    assert log.segs("t", 0)[1]["in_sync"] == ["a"], "b and c lagged: they join through the leader"


def test_a_copy_back_on_a_new_disk_is_not_in_sync_in_the_gen_its_leader_opens_at_a_restart():
    """Found by the chaos runner (seed 13): b, wiped, registered again (out of every in-sync set); c, the leader,
    restarted on its disk and led on in a new gen whose in-sync set named every live copy, b among them. c was then
    fenced, the failover elected b, and b, holding none of the pop group's state, started the group over from
    offset 0 (94 acknowledged pops delivered again). The new gen names only the old one's in-sync copies."""
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["c"], replicas=3)
    log.register("b", disk=disk_id(3))   # wiped: out of the head's in-sync set
    assert "b" not in log.head("t", 0)["in_sync"]
    restart(log, "c")
    head = log.head("t", 0)
    assert (head["broker"], head["gen"], head["in_sync"]) == ("c", 1, ["c", "a"]), head
    log.seal("t", 0, 0, 7)
    log.fence("c")
    head = log.head("t", 0)
    assert (head["broker"], head["gen"]) == ("a", 2), "the copy that holds the state is elected, not b"


def test_a_leader_lost_leaves_the_in_sync_set_of_the_segment_it_led_so_a_second_loss_never_elects_it():
    """Found by the chaos runner's broker_wipe (seed 9): the leader registered again (maybe on an empty disk) and an
    in-sync copy was elected to seal its head; that copy was lost in turn before it sealed, and the next election
    picked the old leader, still named in sync: its empty copy's end became the segment's end."""
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    log.register("a", disk=disk_id(5))   # back on a new disk
    old, new = log.segs("t", 0)
    assert "a" not in old["in_sync"] and old["sealer"] == new["broker"] != "a", old
    log.register(old["sealer"], disk=disk_id(6))   # the elected copy is lost before it reports its end
    old = log.segs("t", 0)[0]
    assert old["sealer"] not in ("a", new["broker"]), old


def test_a_queue_split_in_place_on_a_fenced_leader_keeps_its_leader_first_in_sync():
    """Found by the stateful model: a growth splits a queue in place, on its leader even while fenced; the new gen's
    in-sync set left the leader out (only active brokers), an in-sync set no leader heads."""
    log = cluster("a")
    log.create("t", 1, brokers=["a"], replicas=1)
    log.fence("a")
    log.register("b")
    log.grow("t", 2)
    head = log.segs("t", 0)[-1]
    assert (head["broker"], head["in_sync"]) == ("a", ["a"]), head


def test_an_election_moves_a_head_whose_start_was_undecided_when_its_leader_was_fenced():
    """b is fenced while its head waits for the seal of the gen before it: nothing moves by itself (the head has no
    start yet), and an election says so. Once a reports that seal, the operator's election seals b's gen at an
    in-sync copy's end and opens the next gen there, exactly as a failover does: these are the events."""
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    incarnation = log.topic("t")["incarnation"]
    log.remap("t", ["b"])
    log.fence("b")
    r = log.ok({"type": "ElectLeaders", "topic": "t"})
    assert r["queues"] == [{"queue": 0, "leader": "b", "gen": 1, "outcome": "sealing"}]
    log.seal("t", 0, 0, 5)
    log.reject({"type": "ElectLeaders", "topic": "t", "queues": [1]}, "INVALID_ARGUMENT")   # one past the last
    v = log.version
    r = log.ok({"type": "ElectLeaders", "topic": "t", "queues": [0]})
    assert r["queues"] == [{"queue": 0, "leader": "b", "gen": 1, "outcome": "elected", "to": "c", "new_gen": 2}]
    assert [(e["type"], e["data"]) for e in log.events(v)] == [
        ("InSyncChanged", {"topic": "t", "queue": 0, "gen": 1, "in_sync": ["c", "a"], "reason": "fenced"}),
        ("SegmentSealing", {"topic": "t", "queue": 0, "gen": 1, "broker": "c"}),
        ("SegmentOpened", {"topic": "t", "queue": 0, "gen": 2, "broker": "c", "from_broker": "b",
                           "physical_queue": f"t.q0.g2.i{incarnation}", "physical_start": 0,
                           "budget_end": log.budget, "replicas": ["c", "a", "b"], "in_sync": ["c", "a"],
                           "cause": "failover"})]
    log.seal("t", 0, 1, 9, broker="c")
    assert log.head("t", 0)["logic_start"] == 5 + 9, "the next gen starts where c's copy of gen 1 ended"


def test_a_leader_s_in_sync_changes_are_logged_with_their_reason_and_checked_item_by_item():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    a, b, c = log.head("t", 0)["replicas"]

    def alter(in_sync: list[str], gen: int = 0, topic: str = "t") -> tuple[dict, list]:
        v = log.version
        r = log.ok({"type": "AlterInSync", "broker": a, "epoch": log.epoch(a), "changes": [
            {"topic": topic, "queue": 0, "gen": gen, "in_sync": in_sync, "epochs": log.epochs(in_sync)}]})["results"][0]
        return r, [(e["type"], e["data"]) for e in log.events(v)]

    def in_sync_changed(in_sync: list[str], reason: str) -> list:
        return [("InSyncChanged", {"topic": "t", "queue": 0, "gen": 0, "in_sync": in_sync, "reason": reason})]

    assert alter([a]) == ({"ok": True, "in_sync": [a]}, in_sync_changed([a], "lagging"))
    assert alter([a, c]) == ({"ok": True, "in_sync": [a, c]}, in_sync_changed([a, c], "caught_up"))
    assert alter([a, c]) == ({"ok": True, "in_sync": [a, c]}, []), "no change: no event"
    # a refused item is its code and status (decide_each), and changes nothing
    assert alter([b, a]) == ({"ok": False, "code": "INVALID_ARGUMENT", "status": 400}, []), "the leader first"
    assert alter([a, "zz"]) == ({"ok": False, "code": "INVALID_ARGUMENT", "status": 400}, []), "replicas only"
    assert alter([a], topic="nope") == ({"ok": False, "code": "SEGMENT_NOT_FOUND", "status": 404}, [])
    log.fence(b)
    assert alter([a, b, c]) == ({"ok": False, "code": "BROKER_NOT_ACTIVE", "status": 409}, [])
    log.remap("t", [c])
    assert alter([a]) == ({"ok": False, "code": "STALE_LEADER_EPOCH", "status": 409}, [])


def test_a_fenced_broker_changes_no_in_sync_set_and_a_topic_grows_onto_no_fenced_broker():
    log = cluster("a", "b")
    log.create("t", 1, brokers=["a"], replicas=1)
    epoch = log.epoch("a")
    log.fence("a")
    out = log.send({"type": "AlterInSync", "broker": "a", "epoch": epoch, "changes": [
        {"topic": "t", "queue": 0, "gen": 0, "in_sync": ["a"], "epochs": log.epochs(["a"])}]})["error"]
    assert (out["status"], out["code"], out["message"], out["details"]) == (
        409, "BROKER_NOT_ACTIVE", "broker 'a' is fenced", {"broker": "a"})
    log.fence("b")
    v = log.version
    out = log.send({"type": "GrowTopic", "topic": "t", "queues": 2})["error"]
    assert (out["status"], out["code"], out["message"]) == (
        409, "NO_BROKERS", "no active broker to place the new queues on")
    assert log.version == v


def test_a_topic_takes_the_cluster_defaults_its_command_carries_capped_at_the_brokers_there_are():
    log = cluster("a", "b", "c", "d")
    log.create("t", 1, default_replicas=2, default_min_insync=2)
    assert (log.topic("t")["replicas"], log.topic("t")["min_insync"]) == (2, 1), "min_insync at most replicas - 1"
    log.create("u", 1, default_replicas=4, default_min_insync=3)
    assert (log.topic("u")["replicas"], log.topic("u")["min_insync"]) == (4, 3)
    log.create("v", 1, default_replicas=5)
    assert log.topic("v")["replicas"] == 4
    out = log.send({"type": "CreateTopic", "topic": "w", "queues": 1, "replicas": 5})["error"]
    assert (out["message"], out["details"]) == ("5 replicas need 5 active brokers; 4 are there to place them on",
                                                {"replicas": 5, "brokers": 4})
    out = log.send({"type": "CreateTopic", "topic": "w", "queues": 1, "default_replicas": 2, "min_insync": 3})["error"]
    assert (out["message"], out["details"]) == ("min_insync (3) cannot exceed replicas (2)", {"field": "min_insync"})


def test_a_failover_s_new_gen_is_granted_the_envelope_s_budget_whether_fenced_or_registered_again():
    log = cluster("a", "b", "c")
    log.create("t", 2, brokers=["a", "b"], replicas=2)
    heads = {q: log.head("t", q) for q in range(2)}
    log.budget = 777
    log.fence(heads[0]["broker"])
    assert (log.head("t", 0)["gen"], log.head("t", 0)["budget_end"]) == (1, 777)
    log.budget = 555
    log.register(heads[1]["broker"], disk=disk_id(8))   # a new disk: it counts as lost
    assert (log.head("t", 1)["gen"], log.head("t", 1)["budget_end"]) == (1, 555)
    log.budget = 333
    log.seal_all_sealing()
    restart(log, log.head("t", 1)["broker"])   # its disk kept: it leads on in a new gen
    assert (log.head("t", 1)["gen"], log.head("t", 1)["budget_end"]) == (2, 333)



def test_a_leader_of_an_older_session_changes_no_in_sync_set_and_an_unknown_broker_is_named():
    log = cluster("a", "b", "c")
    log.create("t", 1, brokers=["a"], replicas=3)
    old = log.epoch("a")
    log.register("a")   # a new session
    change = [{"topic": "t", "queue": 0, "gen": 1, "in_sync": ["a"], "epochs": log.epochs(["a"])}]
    out = log.send({"type": "AlterInSync", "broker": "a", "epoch": old, "changes": change})["error"]
    assert (out["status"], out["code"], out["message"], out["details"]) == (
        409, "STALE_EPOCH", f"broker 'a' has epoch {log.epoch('a')}, not {old}; register again",
        {"broker": "a", "epoch": log.epoch("a")})
    out = log.send({"type": "AlterInSync", "broker": "zz", "epoch": 1, "changes": change})["error"]
    assert (out["status"], out["code"], out["message"], out["details"]) == (
        404, "BROKER_NOT_FOUND", "broker 'zz' is not registered", {"broker": "zz"})


def test_a_remap_off_a_fenced_broker_seals_its_head_at_the_budget_in_the_old_broker_s_name():
    log = cluster("a", "b")
    log.create("t", 1, brokers=["a"], replicas=1)
    log.fence("a")
    v = log.version
    log.remap("t", ["b"])
    assert [(e["type"], e["data"]) for e in log.events(v)][0] == ("SegmentSealed", {
        "topic": "t", "queue": 0, "gen": 0, "broker": "a", "physical_end": log.budget, "logic_end": log.budget,
        "by": "session_expired"})
    r = log.ok({"type": "SetTopicConfig", "topic": "t", "config": {"k": "v"}})
    assert (r["topic"], r["config"]) == ("t", {"k": "v"})
    assert log.ok({"type": "SetTopicConfig", "topic": "t", "config": {"k": "v"}}) == r, "unchanged: the same answer"
    out = log.send({"type": "SetTopicConfig", "topic": "nope", "config": {"k": "v"}})["error"]
    assert (out["status"], out["message"], out["details"]) == (404, "topic 'nope' does not exist", {"topic": "nope"})
