"""The README's demo: a local cluster, then create, produce, remap, consume, the mapping history, and lineage on Spark.

Talks plain HTTP (urllib) so that every step shows the API as a user of any language would call it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request

from ops import devcluster


def call(method: str, url: str, token: str, body=None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return json.loads(e.read() or b"null")


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def wait_writable(meta: str, token: str, topic: str, min_version: int, timeout_s: float = 30.0) -> dict:
    """The topic's route once every queue is writable. Read after ``meta`` has applied ``min_version`` (the write's
    own version): the write may have gone through another node, and a node that has not applied it yet answers
    with the route before it, or 404 for a topic just created."""
    deadline = time.monotonic() + timeout_s
    while True:
        route = call("GET", f"{meta}/v1/routes/{topic}?min_version={min_version}", token)
        ready = "queues" in route and all(q["writable"] for q in route["queues"])
        if ready or time.monotonic() > deadline:
            if "queues" not in route:
                raise SystemExit(f"no route of {topic} from {meta} after {timeout_s} s: {route}")
            return route
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="demo-cluster")
    ap.add_argument("--base-port", type=int, default=7100)
    args = ap.parse_args()

    step(f"starting 3 meta nodes and 3 brokers in {os.path.abspath(args.dir)}")
    cluster = devcluster.up(args.dir, 3, 3, args.base_port)
    meta = [m["url"] for m in cluster["meta"]]
    admin, client = cluster["admin_token"], cluster["client_token"]
    print(json.dumps(call("GET", f"{meta[1]}/v1/cluster", admin), indent=1))
    print(json.dumps(call("GET", f"{meta[0]}/v1/brokers", admin)))

    topic = f"orders-{int(time.time())}"
    step(f"create static topic {topic} with 6 logic queues (on a follower: it forwards to the leader)")
    created = call("POST", f"{meta[2]}/v1/topics", admin, {"topic": topic, "queues": 6})
    print(created)
    route = wait_writable(meta[0], client, topic, created["version"])
    for q in route["queues"]:
        print(f"  queue {q['queue']} -> {q['broker']} ({q['physical_queue']})")

    step("produce 5 messages to each queue")
    for q in route["queues"]:
        msgs = [{"body": f"q{q['queue']}-m{i}", "key": f"k{i}"} for i in range(5)]
        r = call("POST", f"{q['address']}/v1/messages/{topic}/{q['queue']}", client, {"messages": msgs})
        print(f"  queue {q['queue']}: offsets {r.get('offsets', r)}")

    step("remap every queue onto broker b3 (seal-then-switch)")
    remapped = call("POST", f"{meta[0]}/v1/topics/{topic}/remap", admin, {"brokers": ["b3"]})
    print(remapped)
    route = wait_writable(meta[1], client, topic, remapped["version"])
    for q in route["queues"]:
        chain = " -> ".join(f"{s['broker']}[{s['logic_start']},{s['logic_end']})" for s in q["segments"])
        print(f"  queue {q['queue']}: {chain}")

    step("produce 2 more to each queue: logic offsets continue where the old segment ended")
    for q in route["queues"]:
        r = call("POST", f"{q['address']}/v1/messages/{topic}/{q['queue']}", client,
                 {"messages": [{"body": f"q{q['queue']}-after-remap-{i}"} for i in range(2)]})
        print(f"  queue {q['queue']}: offsets {r.get('offsets', r)}")

    step("consume every queue from its newest broker (older segments are read through it)")
    for q in route["queues"]:
        got = call("GET", f"{q['address']}/v1/messages/{topic}/{q['queue']}?offset=0&max=100", client)
        bodies = [m["body"] for m in got["messages"]]
        print(f"  queue {q['queue']}: {len(bodies)} messages, offsets "
              f"{[m['offset'] for m in got['messages']]}, next_offset {got['next_offset']}")
        call("PUT", f"{q['address']}/v1/offsets/demo-group/{topic}/{q['queue']}", client,
             {"offset": got["next_offset"]})

    step("the Python client: keyed sends keep each key on one queue and in order, through another remap")
    from client.sync import SyncAdminClient, SyncProducer, SyncPullConsumer
    from client import KeySelector
    with SyncProducer(meta, client, topic, selector=KeySelector()) as producer, \
            SyncAdminClient(meta, admin) as admin_client:
        placed: dict[str, set[int]] = {}
        for i in range(30):
            if i == 15:
                admin_client.remap(topic, ["b1", "b2"])
            key = f"customer-{i % 3}"
            r = producer.send(f"{key} order {i}", key=key)
            placed.setdefault(key, set()).add(r.queue)
        for key, queues in sorted(placed.items()):
            print(f"  {key} -> queue {sorted(queues)}")
    with SyncPullConsumer(meta, client, topic, "demo-client") as consumer:
        got = []
        for _ in range(20):
            got += consumer.poll(timeout_s=0.5)
            if len(got) >= 6 * 7 + 30:
                break
        consumer.commit_positions()
        print(f"  group demo-client read {len(got)} messages across every segment and committed its positions")
        if got:   # the client pulls binary batches by default; a body is bytes, .text its UTF-8 reading
            print(f"  a message's body is bytes: {got[-1].body!r}; its text: {got[-1].text!r}")

    step("mapping history of the topic (the replicated event log)")
    hist = call("GET", f"{meta[2]}/v1/history?topic={topic}&limit=1000", client)
    for e in hist["events"]:
        d = e["data"]
        extra = {k: d[k] for k in ("queue", "gen", "broker", "from_broker", "logic_start", "logic_end") if k in d}
        print(f"  v{e['version']} {e['type']} {extra}")
    lineage(meta, client, topic, os.path.join(args.dir, "export"))
    print(f"\nThe cluster keeps running: .venv/bin/stator dev down --dir {args.dir}")


def lineage(meta: list[str], token: str, topic: str, out: str) -> None:
    """Export the history to Parquet, then ask Spark where offsets lived and how the topic moved (`stator lineage`)."""
    from meta.export.exporter import run as export
    from ops.lineage import session
    from ops.lineage.run import Request, run_on

    step(f"export the history to Parquet under {out} (incremental: a re-run adds only what is new)")
    result = export(meta, token, out)
    print(f"  versions {result.exported_after + 1}..{result.last_version}: {result.events} events, "
          f"{result.files} files")
    step("lineage on Spark (local[2]): every remap of the topic, and where queue 0's offsets 0 and 5 lived")
    spark = session.build(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    try:
        for m in run_on(spark, Request("moves", out, args={"topic": topic}))["moves"]:
            print(f"  v{m['version']} {m['ts']} queue {m['queue']}: {m['from']} -> {m['to']} (gen {m['gen']})")
        for offset in (0, 5):
            at = run_on(spark, Request("locate", out, args={"topic": topic, "queue": 0, "offset": offset}))
            print(f"  offset {offset} of queue 0: {at['broker']} {at['physical_queue']} at physical offset "
                  f"{at['physical_offset']} (gen {at['gen']}, written {at['from']} .. {at['to'] or 'now'})")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
