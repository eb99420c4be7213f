"""Metric names and labels an operator can build on (issue 21, item 5), scraped from real processes: a count since
start is a counter (TYPE counter, named _total), and no series is labelled by a physical queue, whose name changes
at every remap: a queue's series keep their labels (topic, logic queue) when it moves to another broker."""

from __future__ import annotations

import re

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.support.meta_http import wait_until
from tests.support.broker_http import admin, all_writable, send, wait_route
from tests.support.metrics import scrape

# The shape of allocation.physical_queue_name: "<topic>.q<queue>.g<gen>.i<incarnation>".
PHYSICAL_QUEUE_NAME = re.compile(r"\.q\d+\.g\d+\.i\d+$")


async def families(session: aiohttp.ClientSession, url: str) -> tuple[dict, str]:
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=15)) as r:
        assert r.status == 200
        text = await r.text()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


async def test_counts_since_start_are_counters(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "counted", "queues": 1, "brokers": ["b1"]})
    assert s == 201, b
    await wait_route(c, "counted", all_writable)
    await send(c, "counted", 0, ["a", "b", "c"])
    b1 = c.url("b1")
    # A pop and its ack are journal lines: the count is above 0 once the journal's round has written them.
    s, popped, _ = await c.call("POST", f"{b1}/v1/pop/counted", "client", json={"group": "g", "max": 3})
    assert s == 200 and len(popped["messages"]) == 3, popped
    s, acked, _ = await c.call("POST", f"{b1}/v1/ack", "client",
                               json={"group": "g", "handles": [m["handle"] for m in popped["messages"]]})
    assert s == 200, acked

    async def journal_lines():
        fams, text = await families(c.session, b1)
        fam = fams.get("stator_pop_journal_lines_written")
        assert fam is not None, "stator_pop_journal_lines_written is not exported"
        assert fam.type == "counter", fam.type
        assert "# TYPE stator_pop_journal_lines_written_total counter" in text
        (sample,) = [x for x in fam.samples if x.name == "stator_pop_journal_lines_written_total"]
        return sample.value if sample.value > 0 else None

    assert await wait_until(journal_lines, 10, "journal lines counted") >= 1

    # Nothing else counts since start under a gauge: Prometheus' rate() and increase() would read a restart as a
    # drop instead of a reset.
    for url in c.meta_urls + c.broker_urls:
        fams, _ = await families(c.session, url)
        for name, fam in fams.items():
            if not name.startswith("stator_") or fam.type != "gauge":
                continue
            assert "since start" not in fam.documentation, (url, name, fam.documentation)
            assert not name.endswith("_total"), (url, name)


def queue_series(scrapes: dict[str, dict[str, list]], topic: str) -> dict[tuple[str, str], tuple[str, float]]:
    """{(topic, queue): (broker, end offset)} of ``stator_broker_queue_max_offset``, every broker's scrape together;
    a queue reported twice fails."""
    out: dict[tuple[str, str], tuple[str, float]] = {}
    for broker, samples in scrapes.items():
        for labels, v in samples.get("stator_broker_queue_max_offset", []):
            assert set(labels) == {"topic", "queue"}, labels
            if labels["topic"] != topic:
                continue
            key = (labels["topic"], labels["queue"])
            assert key not in out, f"{key} reported by {out[key][0]} and {broker}"
            out[key] = (broker, v)
    return out


def assert_no_physical_queue_label(scrapes: dict[str, dict[str, list]]) -> None:
    for node, samples in scrapes.items():
        for name, series in samples.items():
            for labels, _ in series:
                for k, v in labels.items():
                    assert "physical" not in k and not PHYSICAL_QUEUE_NAME.search(v), (node, name, labels)


async def test_queue_series_are_labelled_by_logic_queue_and_keep_their_labels_across_a_remap(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "moving", "queues": 2, "brokers": ["b1"]})
    assert s == 201, b
    await wait_route(c, "moving", all_writable)
    await send(c, "moving", 0, ["a", "b", "c"])
    await send(c, "moving", 1, ["d", "e"])
    b1 = c.url("b1")
    s, popped, _ = await c.call("POST", f"{b1}/v1/pop/moving", "client", json={"group": "g", "max": 1})
    assert s == 200 and popped["messages"], popped

    async def scrape_all() -> dict[str, dict[str, list]]:
        return {m["node"]: await scrape(c.session, m["url"]) for m in c.info["meta"]} | \
            {b["broker"]: await scrape(c.session, b["url"]) for b in c.info["brokers"]}

    before = await scrape_all()
    assert queue_series(before, "moving") == {("moving", "0"): ("b1", 3), ("moving", "1"): ("b1", 2)}
    assert_no_physical_queue_label(before)

    s, b = await admin(c, "POST", 1, "/v1/topics/moving/remap", json={"brokers": ["b2"], "queues": [0]})
    assert s == 200 and b["moved"] == [{"queue": 0, "from": "b1", "to": "b2", "gen": 1}], b
    await wait_route(c, "moving", lambda r: r["queues"][0]["writable"] and r["queues"][0]["broker"] == "b2")
    assert await send(c, "moving", 0, ["f", "g"]) == [3, 4]

    # The same series, now from the broker holding the head, counting on from where the queue was.
    want = {("moving", "0"): ("b2", 5), ("moving", "1"): ("b1", 2)}

    async def moved():
        after = await scrape_all()
        return after if queue_series(after, "moving") == want else None

    after = await wait_until(moved, 15, f"the queue's series to be {want}")
    assert_no_physical_queue_label(after)
