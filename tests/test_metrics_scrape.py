"""What an operator alerts on, scraped from real processes' /metrics and read with prometheus-client's own parser:
meta (commit index, follower lag, role changes, proposal failures, apply latency, brokers by state, session expiries,
seals and remaps in flight, build info), broker (traffic per topic, append and fsync latency, disk free, session
state, per-queue max offset, consumer lag per group and queue), process_* on both; long polls and SSE streams stay out of the latency histogram."""

from __future__ import annotations

import asyncio
import time


from client import AdminClient, Producer, PullConsumer, RouteSubscription
from meta.gc_tuning import GC_THRESHOLDS
from tests.support import cluster as cluster_mod
from tests.support.metrics import scrape, value

EXPIRY_WAIT_S = 30.0


async def test_meta_and_broker_metrics_from_real_processes(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 1, meta={"session_timeout_ms": 3000,
                                                              "heartbeat_interval_ms": 500}) as c:
        async with AdminClient(c.meta_urls, c.token("admin")) as admin:
            await admin.create_topic("m", queues=2)
            async with c.session.get(f"{c.meta_urls[0]}/v1/topics/m", headers=c.headers("admin")) as r:
                assert r.status == 200
            async with c.session.get(f"{c.meta_urls[0]}/v1/topics/absent", headers=c.headers("admin")) as r:
                assert r.status == 404
            async with Producer(c.meta_urls, c.token("client"), "m") as producer:
                for i in range(10):
                    await producer.send(f"message {i}")
            async with PullConsumer(c.meta_urls, c.token("client"), "m", "readers") as consumer:
                got = []
                for _ in range(20):
                    got += await consumer.poll(timeout_s=0.5)
                    if len(got) >= 10:
                        break
                assert len(got) == 10
                assert sum((await consumer.commit_positions()).values()) == 10
            # Three more that the group has not read: its lag, by the broker holding the queues' heads.
            async with Producer(c.meta_urls, c.token("client"), "m") as producer:
                for i in range(3):
                    await producer.send(f"unread {i}")
            # A long poll and an SSE stream, ended before the scrape: counted as requests, not timed.
            async with RouteSubscription(c.meta_urls, c.token("client"), ["m"]) as routes:
                await routes.get("m")
                await asyncio.sleep(0.3)
            v = (await admin.route("m"))["version"]
            status, _, _ = await c.call("GET", c.meta_urls[0] + f"/v1/routes/m?after={v}&wait=0.2", "client")
            assert status == 304

        leader = await c.leader()
        _, view, _ = await c.call("GET", c.meta_urls[0] + "/v1/cluster")
        members = view["members"]
        metas = {m["node"]: await scrape(c.session, m["url"]) for m in c.info["meta"]}
        for node, s in metas.items():
            (labels, one), = s["stator_build_info"]
            assert one == 1 and labels["role"] == "meta" and labels["version"]
            assert value(s, "process_cpu_seconds_total") > 0 and value(s, "process_resident_memory_bytes") > 0
            # the collector's thresholds and work by generation (a full one holds the node: meta/serve.py)
            assert [value(s, "stator_meta_gc_threshold", generation=g) for g in "012"] == list(GC_THRESHOLDS)
            assert value(s, "python_gc_collections_total", generation="0") > 0
            assert all(value(s, "python_gc_collections_total", generation=g) >= 0 for g in "12")
            assert value(s, "stator_meta_raft_commit_index") >= value(s, "stator_meta_applied_version") > 0
            assert value(s, "stator_meta_apply_seconds_count") > 0
            assert value(s, "stator_meta_brokers", state="active") == 1
            assert value(s, "stator_meta_brokers", state="fenced") == 0
            assert value(s, "stator_meta_seals_in_flight") == 0 and value(s, "stator_meta_remaps_in_flight") == 0
            for reason in ("NO_LEADER", "LEADER_CHANGED", "OVERLOADED", "UNKNOWN_OUTCOME"):
                assert value(s, "stator_meta_proposal_failures_total", reason=reason) >= 0
            # Dev clusters run the production default, fsync before acknowledging: nothing ever got ahead of the disk.
            assert value(s, "stator_meta_journal_fsync_enabled") == 1 and value(s, "stator_meta_journal_syncs_total") > 0
            assert value(s, "stator_meta_journal_acks_unsynced_total") == 0
            assert value(s, "stator_meta_journal_commits_unsynced_total") == 0
            assert value(s, "stator_meta_journal_marks_unsynced_total") == 0
            assert value(s, "stator_meta_raft_local_commits_total") >= 0
            # The raft thread's health: counted on every node (tests/test_raft_entry_sizes.py reads them under load).
            assert value(s, "stator_meta_raft_ticks_slow_total") >= 0
            for kind in ("written", "installed", "superseded"):
                assert value(s, "stator_meta_raft_snapshots_total", kind=kind) >= 0
            assert value(s, "stator_meta_journal_syncs_slow_total") >= 0
            for kind in ("trimmed", "repeat"):   # exported on every node (counted in tests/test_raft_repeated_appends)
                assert value(s, "stator_meta_raft_held_entries_appends_total", kind=kind) >= 0
            # A first election of a healthy cluster: pre-votes asked (a round won at least by the leader), none refused
            # in lease, no newer term heard
            for kind in ("rounds", "granted", "refused"):
                assert value(s, "stator_meta_raft_pre_votes_total", kind=kind) >= 0
            assert value(s, "stator_meta_raft_pre_votes_total", kind="won") >= (1 if node == leader else 0)
            assert value(s, "stator_meta_raft_pre_votes_total", kind="terms_adopted") == 0
            lags = s.get("stator_meta_follower_lag_entries", [])
            if node == leader:
                assert value(s, "stator_meta_raft_role_changes_total", role="leader") == 1
                assert sorted(ls["follower"] for ls, _ in lags) == sorted(
                    m["raft"] for m in members if m["node"] != leader)
                assert all(lag >= 0 for _, lag in lags)
            else:
                assert lags == [] and value(s, "stator_meta_raft_role_changes_total", role="leader") == 0
        requests = sum(v for s in metas.values() for ls, v in s["stator_meta_http_requests_total"]
                       if ls["route"] == "/v1/watch")
        assert requests >= 1
        timed = {ls["route"] for s in metas.values() for ls, _ in s["stator_meta_http_request_seconds_count"]}
        assert "/v1/watch" not in timed and "/v1/topics" in timed
        long_polled = metas["m1"]["stator_meta_http_request_seconds_count"]
        routes_timed = sum(v for ls, v in long_polled if ls["route"] == "/v1/routes/{topic}")
        routes_seen = sum(v for ls, v in metas["m1"]["stator_meta_http_requests_total"]
                          if ls["route"] == "/v1/routes/{topic}")
        assert routes_seen >= routes_timed + 1   # the long poll with wait= is counted, not timed
        # Each status of a route is a series of its own (the children are cached by route and status)
        statuses = {ls["status"] for s in metas.values() for ls, v in s["stator_meta_http_requests_total"]
                    if ls["route"] == "/v1/topics/{topic}" and v > 0}
        assert {"200", "404"} <= statuses, statuses

        b = await scrape(c.session, c.broker_urls[0])
        (labels, one), = b["stator_build_info"]
        assert one == 1 and labels["role"] == "broker"
        assert value(b, "process_cpu_seconds_total") > 0
        assert value(b, "stator_broker_messages_in_total", topic="m") == 13
        assert value(b, "stator_broker_bytes_in_total", topic="m") > 13 * len("message 0")
        # Every message read was served at least once (a consumer may read a batch again, each serving counts).
        served = value(b, "stator_broker_messages_out_total", topic="m")
        assert served >= 10
        assert value(b, "stator_broker_bytes_out_total", topic="m") >= 10 * len("message 0")
        assert value(b, "stator_broker_append_seconds_count") == 13
        assert value(b, "stator_broker_fsync_seconds_count") >= 13   # one send after another: each waits for a sync
        assert value(b, "stator_broker_disk_free_bytes") > 0
        assert value(b, "stator_broker_session_state", state="active") == 1
        assert value(b, "stator_broker_session_state", state="fenced") == 0
        assert value(b, "stator_broker_queues") == 2
        assert sum(v for _, v in b["stator_broker_queue_max_offset"]) == 13
        assert sorted(ls["queue"] for ls, _ in b["stator_broker_consumer_lag_messages"]) == ["0", "1"]
        assert sum(v for _, v in b["stator_broker_consumer_committed_offset"]) == 10
        assert sum(v for ls, v in b["stator_broker_consumer_lag_messages"] if ls["group"] == "readers") == 3

        # A broker that stops heartbeating: the leader fences it and counts the expiry.
        c.kill9("b1")
        deadline = time.monotonic() + EXPIRY_WAIT_S
        while True:
            s = await scrape(c.session, c.url(leader))
            if value(s, "stator_meta_brokers", state="fenced") == 1:
                break
            assert time.monotonic() < deadline, "the dead broker was never fenced"
            await asyncio.sleep(0.2)
        assert value(s, "stator_meta_broker_session_expiries_total") == 1
        assert value(s, "stator_meta_brokers", state="active") == 0
