"""The web console in a real browser: Debian's Chromium driven by Playwright, against a real cluster.

Each page is opened, what it shows is checked against the API answer it renders, and a screenshot of it is saved
under the test's tmp dir. A remap made through the API appears on an open timeline without a reload; a remap made
through the console's form is in the API afterwards and converges on the open page; a killed meta node and a killed
broker show as down on an open page within 5 s. Tokens stay out of URLs, cookies readable by scripts and logs.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path

import pytest
from playwright.async_api import async_playwright, expect

from client.slots import queue_for_key
from tests.support import cluster as cluster_mod
from wire.times import iso
from tests.support.tls_cluster import TOKENS, tls_cluster  # noqa: F401  (test_tls's mutual-TLS cluster, as a fixture here)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Chromium on a machine with a closed network: no background calls home, no sandbox (the tests run as root).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
UI_TIMEOUT_MS = 20_000     # a page or a live change on a loaded 2-core machine
# expect()'s assertions wait by their own default (5 s), not the page's: a config form's redirect, rendered with every
# broker's rates, took longer in a full suite run. They get the same bound as the page's actions.
expect.set_options(timeout=UI_TIMEOUT_MS)
DOWN_SHOWN_MS = 5_000      # issue 35: a stopped member shows as down this soon on an open page (pages poll each 1 s)
TOPIC = "orders"
QUEUES = 4


@pytest.fixture
async def console(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 3) as c:
        status, body, _ = await c.call("POST", c.meta_urls[0] + "/v1/topics",
                                       json={"topic": TOPIC, "queues": QUEUES, "brokers": ["b1"]})
        assert status == 201, body
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield c, browser
            finally:
                await browser.close()


async def _login(browser, c, role: str, node_url: str):
    ctx = await browser.new_context(viewport={"width": 1200, "height": 800})
    page = await ctx.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    await page.goto(node_url + "/console/topics")
    assert "/console/login" in page.url, "a page without a session must ask for a login"
    await page.fill("input[name=token]", c.token(role))
    await page.click("button[type=submit]")
    await page.wait_for_url(node_url + "/console/topics")
    return ctx, page


# What a person must not read on a page (issue 35): Python's reprs and epoch milliseconds. Raw event JSON (in <code>)
# and the footer naming the API calls are shown on purpose.
UNREADABLE = re.compile(r"\b(None|True|False)\b|\['|\{'|\b1[6-9]\d{11}\b")


async def _readable(page) -> None:
    text = await page.evaluate("""() => {
        const walk = document.createTreeWalker(document.getElementById('content'), NodeFilter.SHOW_TEXT);
        const parts = [];
        for (let n = walk.nextNode(); n; n = walk.nextNode()) {
            if (!n.parentElement.closest('code, footer')) parts.push(n.nodeValue);
        }
        return parts.join(' '); }""")
    found = sorted({m.group(0) for m in UNREADABLE.finditer(text)})
    assert not found, f"{page.url} shows {found}: {text[:600]}"


async def _shot(page, tmp_path: Path, name: str) -> None:
    await _readable(page)
    path = tmp_path / "screenshots" / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5_000, f"{name}: an empty screenshot"


async def test_every_page_shows_what_the_api_answers(console, tmp_path):
    c, browser = console
    url = c.meta_urls[1]    # any node serves the console: a follower or the leader
    ctx, page = await _login(browser, c, "client", url)
    assert c.token("client") not in page.url
    assert await page.evaluate("document.cookie") == "", "the session cookie must be HttpOnly"

    _, cluster, _ = await c.call("GET", url + "/v1/cluster")
    await page.goto(url + "/console")
    await expect(page.locator("#leader")).to_have_text(cluster["leader"])
    await expect(page.locator("#members tbody tr")).to_have_count(3)
    for m in cluster["members"]:
        await expect(page.locator(f'#members tr[data-node="{m["node"]}"] td.role-leader, '
                                  f'#members tr[data-node="{m["node"]}"] td.role-follower')).to_have_count(1)
    await _shot(page, tmp_path, "cluster")

    _, brokers, _ = await c.call("GET", url + "/v1/brokers")
    await page.goto(url + "/console/brokers")
    for b in brokers["brokers"]:
        held = QUEUES if b["broker"] == "b1" else 0
        await expect(page.locator(f'#brokers tr[data-broker="{b["broker"]}"] td.held')).to_have_text(str(held))
    await _shot(page, tmp_path, "brokers")

    _, topic, _ = await c.call("GET", url + f"/v1/topics/{TOPIC}")
    await page.goto(url + "/console/topics")
    await expect(page.locator(f'#topics tr[data-topic="{TOPIC}"]')).to_have_count(1)
    await page.click(f'#topics tr[data-topic="{TOPIC}"] a >> nth=0')
    await expect(page.locator("#queues tbody tr")).to_have_count(len(topic["logic_queues"]))
    await expect(page.locator("#version")).to_have_text(str(topic["version"]))
    assert await page.locator("form#remap").count() == 0, "the client token sees no remap form"
    await _shot(page, tmp_path, "topic")

    await page.goto(url + f"/console/topics/{TOPIC}/timeline")
    await expect(page.locator("svg#timeline rect.segment")).to_have_count(QUEUES)
    await expect(page.locator("svg#timeline text.tick-label")).to_have_count(5)   # more than the axis's two ends
    await _shot(page, tmp_path, "timeline")

    await page.goto(url + f"/console/history?topic={TOPIC}")
    _, hist, _ = await c.call("GET", url + f"/v1/history?topic={TOPIC}&after=0&limit=100")
    await expect(page.locator("#history tbody tr[data-version]")).to_have_count(len(hist["events"]))
    await _shot(page, tmp_path, "history")

    # a pull group: it only commits offsets on the broker, and meta knows it from there
    status, body, _ = await c.call("PUT", c.url("b1") + f"/v1/offsets/pullers/{TOPIC}/0", "client",
                                   json={"offset": 0})
    assert status == 200, body
    await page.goto(url + "/console/groups")
    await expect(page.locator("h1")).to_have_text("Consumer groups")
    await expect(page.locator('#groups tr[data-group="pullers"]')).to_have_count(1)
    await expect(page.locator('#groups tr[data-group="pullers"] td.lag')).to_have_text("0")
    status, body, _ = await c.call("POST", c.url("b1") + f"/v1/messages/{TOPIC}/0", "client",
                                   json={"messages": [{"body": "a"}, {"body": "b"}, {"body": "c"}]})
    assert status == 200, body
    await page.goto(url + "/console/groups")
    await expect(page.locator('#groups tr[data-group="pullers"] td.lag')).to_have_text("3")
    await _shot(page, tmp_path, "groups")
    # its page shows what the API says of it: known from the brokers, and its committed offset
    _, pullers, _ = await c.call("GET", url + "/v1/groups/pullers", "client")
    assert pullers["source"] == "brokers" and pullers["offsets"][0]["committed_offset"] == 0, pullers
    await page.goto(url + "/console/groups/pullers")
    await expect(page.locator("#source")).to_contain_text("Known from the brokers only")
    await expect(page.locator(f'#offsets tr[data-topic="{TOPIC}"][data-queue="0"] td.committed')).to_have_text("0")
    await _shot(page, tmp_path, "group-pull")

    # a group with a live member and owned queues: its members, leases and settings read as words and dates
    status, joined, _ = await c.call("POST", url + "/v1/groups/workers/heartbeat", "client",
                                     json={"member": "w1", "topics": [TOPIC], "mode": "exclusive"})
    assert status == 200 and joined["assignments"], joined
    await page.goto(url + "/console/groups/workers")
    await expect(page.locator('#members tr[data-member="w1"]')).to_contain_text(TOPIC)
    await expect(page.locator("#assignments tbody tr")).to_have_count(len(joined["assignments"]))
    await _shot(page, tmp_path, "group-exclusive")
    await page.goto(url + "/console/groups/workers/pop")
    await _shot(page, tmp_path, "group-pop")
    await page.goto(url + "/console/groups")
    await expect(page.locator('#groups tr[data-group="workers"]')).to_contain_text("exclusive")
    await _readable(page)

    # ?format=json answers the API's own bodies
    answer = await page.evaluate("fetch('/console/topics/%s?format=json').then(r => r.json())" % TOPIC)
    assert answer["api"][f"GET /v1/topics/{TOPIC}"] == topic

    # Queues whose head is on a fenced broker take no writes: the page says so, as the route does, though their
    # segments are still "active". A topic of one copy on b1; b1 killed, then reported down by b2: meta finds nothing
    # listening there and fences it, and the queues have no other copy to fail over to.
    status, body, _ = await c.call("POST", c.meta_urls[0] + "/v1/topics",
                                   json={"topic": "solo", "queues": 2, "brokers": ["b1"], "replicas": 1})
    assert status == 201, body
    await page.goto(url + f"/console/topics/solo?min_version={body['version']}")
    await expect(page.locator("#queues td.writable")).to_have_text(["yes"] * 2)
    _, listed, _ = await c.call("GET", url + "/v1/brokers", "client")
    epoch = next(b["epoch"] for b in listed["brokers"] if b["broker"] == "b2")
    c.kill9("b1")
    status, down, _ = await c.call("POST", f"{url}/v1/brokers/b2/peer-down", "broker",
                                   json={"epoch": epoch, "peer": "b1"})
    assert status == 200 and down["state"] == "fenced", (status, down)
    deadline = asyncio.get_running_loop().time() + UI_TIMEOUT_MS / 1000
    while any(q["writable"] for q in (await c.call("GET", url + "/v1/routes/solo", "client"))[1]["queues"]):
        assert asyncio.get_running_loop().time() < deadline, "the node serving the console never applied the fence"
        await asyncio.sleep(0.1)
    await page.goto(url + "/console/topics/solo")
    await expect(page.locator("#queues td.writable")).to_have_text(["no"] * 2)
    await expect(page.locator("#queues span.seg.state-active")).to_have_count(2)
    await _shot(page, tmp_path, "topic-fenced-head")
    await ctx.close()


async def test_a_remap_appears_on_an_open_timeline_without_a_reload(console, tmp_path):
    c, browser = console
    url = c.meta_urls[2]
    ctx, page = await _login(browser, c, "admin", url)
    await page.goto(url + f"/console/topics/{TOPIC}/timeline")
    await expect(page.locator("svg#timeline rect.segment")).to_have_count(QUEUES)
    await expect(page.locator("svg#timeline text.tick-label")).to_have_count(5)   # more than the axis's two ends
    await page.evaluate("window.stillTheSamePage = true")
    status, moved, _ = await c.call("POST", c.meta_urls[0] + f"/v1/topics/{TOPIC}/remap",
                                    json={"brokers": ["b2"], "queues": [0, 1]})
    assert status == 200, moved
    # each moved queue gains a segment on b2, and the old ones get their sealing mark
    await expect(page.locator('svg#timeline rect.segment[data-broker="b2"]')).to_have_count(2)
    await expect(page.locator("svg#timeline line.sealing")).to_have_count(2)
    assert await page.evaluate("window.stillTheSamePage === true"), "the page was reloaded"
    assert int(await page.evaluate("document.body.dataset.refreshed")) >= 1
    await _shot(page, tmp_path, "timeline-after-remap")

    # a refused form stays on its page and says why there (it answered a bare 400 page before): no broker chosen,
    # then a queue list that is not one
    await page.goto(url + f"/console/topics/{TOPIC}")
    await page.click("form#remap button[type=submit]")
    await expect(page.locator("form#remap .form-error")).to_contain_text("INVALID_ARGUMENT: choose at least one broker")
    assert page.url.startswith(url + f"/console/topics/{TOPIC}?"), page.url
    await page.check('form#remap input[value="b2"]')
    await page.fill('form#remap input[name="queues"]', "0 x")
    await page.click("form#remap button[type=submit]")
    await expect(page.locator("form#remap .form-error")).to_contain_text("is not a list of queue numbers")
    await expect(page.locator("#queues tbody tr")).to_have_count(QUEUES)
    _, unmoved, _ = await c.call("GET", url + f"/v1/topics/{TOPIC}")
    assert [q["segments"][-1]["broker"] for q in unmoved["logic_queues"]][2:] == ["b1", "b1"]

    # the console's own remap form: queue 3 to b3, then the API has it
    await page.goto(url + f"/console/topics/{TOPIC}")
    await page.check('form#remap input[value="b3"]')
    await page.fill('form#remap input[name="queues"]', "3")
    await page.click("form#remap button[type=submit]")
    await expect(page.locator(".flash")).to_contain_text("q3 b1→b3")
    await page.evaluate("window.stillTheSamePage = true")
    # The page converges to what the API says once the old segment is sealed, without a reload (it stayed at
    # "sealing", its version behind the API's, when the seal landed before its event stream opened)
    deadline = asyncio.get_running_loop().time() + UI_TIMEOUT_MS / 1000
    while True:
        _, topic, _ = await c.call("GET", url + f"/v1/topics/{TOPIC}")
        segments = topic["logic_queues"][3]["segments"]
        if segments[-2]["state"] == "sealed":
            break
        assert asyncio.get_running_loop().time() < deadline, f"queue 3's old segment never sealed: {segments}"
        await asyncio.sleep(0.1)
    assert segments[-1]["broker"] == "b3"
    await expect(page.locator("#version")).to_have_text(str(topic["version"]))
    await expect(page.locator('#queues tr[data-queue="3"] td.head')).to_have_text("b3")
    await expect(page.locator('#queues tr[data-queue="3"] span.seg.state-sealed')).to_have_count(1)
    await expect(page.locator('#queues tr[data-queue="3"] span.seg.state-sealing')).to_have_count(0)
    assert await page.evaluate("window.stillTheSamePage === true"), "the page was reloaded"
    await ctx.close()


async def test_a_stopped_meta_node_and_a_stopped_broker_show_as_down_on_an_open_page(console, tmp_path):
    # Neither changes the log at once (a broker is fenced only when its session lapses): the cluster and brokers
    # pages refetch themselves every POLL_MS, and each asks the member itself whether it answers.
    c, browser = console
    url = c.meta_urls[0]
    ctx, page = await _login(browser, c, "client", url)
    await page.goto(url + "/console")
    await expect(page.locator('#members tr[data-node="m3"] td.ok')).to_have_text("ready")
    await page.evaluate("window.stillTheSamePage = true")
    c.kill9("m3")
    await expect(page.locator('#members tr[data-node="m3"] td.health')).to_have_text("down", timeout=DOWN_SHOWN_MS)
    await expect(page.locator('#members tr[data-node="m3"] td.bad').first).to_have_text(
        "unreachable (connection refused)")
    await expect(page.locator('#members tr[data-node="m1"] td.health')).to_have_text("ready")
    await _shot(page, tmp_path, "cluster-member-down")

    await page.goto(url + "/console/brokers")
    await expect(page.locator('#brokers tr[data-broker="b3"] td.health')).to_have_text("up")
    await page.evaluate("window.stillTheSamePage = true")
    c.kill9("b3")
    await expect(page.locator('#brokers tr[data-broker="b3"] td.health')).to_have_text("down (connection refused)",
                                                                                     timeout=DOWN_SHOWN_MS)
    await expect(page.locator('#brokers tr[data-broker="b1"] td.health')).to_have_text("up")
    assert await page.evaluate("window.stillTheSamePage === true"), "the page was reloaded"
    await _shot(page, tmp_path, "brokers-broker-down")
    await ctx.close()


async def test_a_message_is_found_by_key_by_offset_and_by_time_and_a_test_message_is_sent(console, tmp_path):
    """Issue 35's Messages: a queue browsed from an offset, a key's messages found, the first message at or after a
    time, a test message sent from the form (admin) and found again; a pop group's dead letters on their page."""
    c, browser = console
    url = c.meta_urls[2]
    _, route, _ = await c.call("GET", url + f"/v1/routes/{TOPIC}", "client")
    key_queue = queue_for_key(route, "order-7")
    b1 = c.url("b1")
    for i in range(30):   # one at a time: each is stored in its own moment, in order
        key = "order-7" if i % 7 == 3 else f"other-{i}"
        status, body, _ = await c.call("POST", f"{b1}/v1/messages/{TOPIC}/{key_queue}", "client",
                                       json={"messages": [{"body": f"message {i}", "key": key}]},
                                       headers={"X-Route-Version": str(route["version"])})
        assert status == 200 and body["offsets"] == [i], body
    _, stored, _ = await c.call("GET", f"{b1}/v1/messages/{TOPIC}/{key_queue}?offset=0&max=100", "client")
    stored = stored["messages"]
    ctx, page = await _login(browser, c, "admin", url)
    messages = url + f"/console/topics/{TOPIC}/messages"

    await page.goto(url + f"/console/topics/{TOPIC}")
    # the last hour's rates, summed over the brokers: the 30 sends, and the 30 served to the read above
    await expect(page.locator("#rate-stored")).to_have_attribute("data-total", "30")
    await expect(page.locator("#rate-served")).to_have_attribute("data-total", "30")
    await expect(page.locator("#rate-stored svg.spark polyline")).to_have_count(1)
    row = page.locator(f'#queues tr[data-queue="{key_queue}"]')
    await expect(row.locator("td.min")).to_have_text("0")
    await expect(row.locator("td.max")).to_have_text("30")
    await expect(row.locator("td.count")).to_have_text("30")
    await page.click(f'#queues tr[data-queue="{key_queue}"] td.count a')
    await expect(page.locator("#bounds")).to_contain_text("offsets 0 to 29")
    await expect(page.locator("#messages tbody tr[data-offset]")).to_have_count(20)   # the newest 20
    await expect(page.locator("#messages tbody tr[data-offset] >> nth=-1")).to_have_attribute("data-offset", "29")

    await page.fill("#find input[name=key]", "order-7")
    await page.click("#find button[type=submit]")
    keyed = [m["offset"] for m in stored if m["key"] == "order-7"]
    await expect(page.locator("#messages tbody tr[data-offset]")).to_have_count(len(keyed))
    assert [int(o) for o in await page.locator("#messages tbody tr[data-offset]").evaluate_all(
        "rows => rows.map(r => r.dataset.offset)")] == keyed
    await expect(page.locator("#messages td.key")).to_have_text(["order-7"] * len(keyed))
    await expect(page.locator("#search")).to_contain_text("to the end of the queue")
    await _shot(page, tmp_path, "messages-by-key")

    await page.goto(messages + f"?queue={key_queue}&offset=12&max=3")
    await expect(page.locator("#messages tbody tr[data-offset]")).to_have_count(3)
    await expect(page.locator("#messages td.body pre")).to_have_text([m["body"] for m in stored[12:15]])
    await page.click("#older")
    await expect(page.locator("#messages tbody tr[data-offset] >> nth=0")).to_have_attribute("data-offset", "9")
    await _shot(page, tmp_path, "messages-by-offset")

    first_at = next(m for m in stored if m["ts"] >= stored[17]["ts"])
    await page.goto(messages + f"?queue={key_queue}&max=2&since={iso(stored[17]['ts'] * 1000)}")
    await expect(page.locator("#messages tbody tr[data-offset] >> nth=0")).to_have_attribute(
        "data-offset", str(first_at["offset"]))

    await page.fill("#send input[name=key]", "order-7")
    await page.fill("#send textarea[name=body]", "sent from the console")
    await page.click("#send button[type=submit]")
    await expect(page.locator(".flash")).to_have_text(f"sent to queue {key_queue} at offset 30")
    await expect(page.locator("#messages tbody tr[data-offset='30'] td.body pre")).to_have_text("sent from the console")
    _, again, _ = await c.call("GET", f"{b1}/v1/messages/{TOPIC}/{key_queue}?offset=30&max=1", "client")
    assert [(m["body"], m["key"]) for m in again["messages"]] == [("sent from the console", "order-7")]
    # a refusal stays on the page, on its form (a queue out of range the browser itself refuses to submit)
    await page.fill("#send textarea[name=body]", "x" * (64 * 1024 + 1))
    await page.click("#send button[type=submit]")
    await expect(page.locator("#send .form-error")).to_contain_text("a test message of at most 65536 bytes")

    # a pop group that gave up on a message: its dead letter, linked to the message it came from
    status, body, _ = await c.call("PUT", url + "/v1/groups/mailer/config", json={"max_attempts": 1})
    assert status == 200, body
    await asyncio.sleep(0.5)   # the broker hears of the group's config from meta's watch stream
    status, popped, _ = await c.call("POST", f"{b1}/v1/pop/{TOPIC}", "client",
                                     json={"group": "mailer", "queue": key_queue, "max": 1, "invisible_ms": 1000})
    assert status == 200 and len(popped["messages"]) == 1, popped
    deadline = asyncio.get_running_loop().time() + UI_TIMEOUT_MS / 1000
    while not (await c.call("GET", f"{b1}/v1/dlq/mailer?offset=0&max=1", "client"))[1]["messages"]:
        assert asyncio.get_running_loop().time() < deadline, "the unacked pop never reached the dead-letter queue"
        await c.call("POST", f"{b1}/v1/pop/{TOPIC}", "client",
                     json={"group": "mailer", "queue": key_queue, "max": 1, "wait_ms": 500})
    await page.goto(url + "/console/groups/mailer/pop")
    await page.click("a:text('dead-letter queue') >> nth=0")
    await expect(page.locator("#dead-letters td.body pre")).to_have_text([stored[0]["body"]])
    await _shot(page, tmp_path, "dead-letters")
    # the pop group is listed (known to meta by its settings), and its page says where it pops, as the API does
    await page.goto(url + "/console/groups")
    await expect(page.locator('#groups tr[data-group="mailer"]')).to_have_count(1)
    await page.click('#groups tr[data-group="mailer"] a >> nth=0')
    _, mailer, _ = await c.call("GET", url + "/v1/groups/mailer", "client")
    at = next(p for p in mailer["pop"] if p["queue"] == key_queue)
    await expect(page.locator(f'#pop-positions tr[data-topic="{TOPIC}"][data-queue="{key_queue}"] td.pop-offset')
                 ).to_have_text(str(at["pop_offset"]))
    await ctx.close()


async def test_topics_are_created_grown_configured_and_deleted_from_the_console(console, tmp_path):
    """Issue 35: the admin's topic forms, each checked against the API; a refusal stays on its form."""
    c, browser = console
    url = c.meta_urls[1]
    ctx, page = await _login(browser, c, "admin", url)
    await page.goto(url + "/console/topics")
    await page.fill("#create input[name=topic]", "invoices")
    await page.fill("#create input[name=queues]", "2")
    await page.fill("#create input[name=replicas]", "2")
    await page.fill("#create input[name=scope]", "DefaultCluster")   # the brokers here name no cluster
    await page.check("#create input[name=brokers][value=b2]")
    await page.click("#create button[type=submit]")
    await expect(page.locator(".flash")).to_contain_text("created at v")
    await expect(page.locator("#scope")).to_have_text("DefaultCluster")
    _, made, _ = await c.call("GET", url + "/v1/topics/invoices", "client")
    assert made["queues"] == 2 and made["replicas"] == 2 and made["scope"] == ["DefaultCluster"], made
    assert {q["segments"][-1]["broker"] for q in made["logic_queues"]} == {"b2"}

    await page.goto(url + "/console/topics")   # the same name again: refused, on the create form
    await page.fill("#create input[name=topic]", "invoices")
    await page.fill("#create input[name=queues]", "1")
    await page.click("#create button[type=submit]")
    await expect(page.locator("#create .form-error")).to_contain_text("TOPIC_EXISTS")

    await page.goto(url + "/console/topics/invoices")
    await page.fill("#grow input[name=queues]", "3")
    await page.click("#grow button[type=submit]")
    await expect(page.locator(".flash")).to_contain_text("grown to 3 queues")
    await expect(page.locator("#queues tbody tr")).to_have_count(3)
    # What someone typed survives a live refresh, focused or not: a change the log applies while the text sits in
    # the form (out of focus here) leaves it in place (it once came under the click and the form went out empty)
    await page.fill("#config-form textarea[name=set]", "retention=7d\nowner=billing")
    await page.locator("h1").click()
    drawn = await page.evaluate("document.body.dataset.refreshed || '0'")
    status, _, _ = await c.call("PUT", url + "/v1/groups/console-typing/config", json={"max_attempts": 3})
    assert status == 200
    await page.wait_for_timeout(1500)   # the change event and the fetch it starts: milliseconds here
    assert await page.evaluate("document.body.dataset.refreshed || '0'") == drawn, "the page was not drawn again"
    await expect(page.locator("#config-form textarea[name=set]")).to_have_value("retention=7d\nowner=billing")
    await page.click("#config-form button[type=submit]")
    await expect(page.locator(".flash")).to_contain_text("config saved")
    await page.fill("#config-form input[name=unset]", "owner")
    await page.click("#config-form button[type=submit]")
    await expect(page.locator("#config")).to_contain_text("retention")
    _, configured, _ = await c.call("GET", url + "/v1/topics/invoices", "client")
    assert configured["queues"] == 3 and configured["config"] == {"retention": "7d"}, configured
    await page.fill("#config-form textarea[name=set]", "no equals sign")
    await page.click("#config-form button[type=submit]")
    await expect(page.locator("#config-form .form-error")).to_contain_text("is not key=value")
    await _shot(page, tmp_path, "topic-forms")

    await page.fill("#delete input[name=confirm]", "invoice")   # not its name: nothing is deleted
    await page.click("#delete button[type=submit]")
    await expect(page.locator("#delete .form-error")).to_contain_text("type the topic's name")
    assert (await c.call("GET", url + "/v1/topics/invoices", "client"))[0] == 200
    await page.fill("#delete input[name=confirm]", "invoices")
    await page.click("#delete button[type=submit]")
    await expect(page.locator(".flash")).to_contain_text("invoices deleted")
    await expect(page.locator('#topics tr[data-topic="invoices"]')).to_have_count(0)
    assert (await c.call("GET", url + "/v1/topics/invoices", "client"))[0] == 404
    await ctx.close()


async def test_sessions_roles_and_forms_are_checked(console):
    c, browser = console
    url = c.meta_urls[0]
    status, _, _ = await c.call("GET", url + "/console?format=json", role="")
    assert status == 401
    status, _, _ = await c.call("GET", url + "/console/events", role="")
    assert status == 401
    ctx, page = await _login(browser, c, "client", url)
    # a client session may not remap, even by posting the form by hand with a valid CSRF token
    await page.goto(url + f"/console/topics/{TOPIC}")
    status = await page.evaluate("""async () => {
        const csrf = document.querySelector('input[name=csrf]').value;
        const r = await fetch('/console/topics/%s/remap', {method: 'POST',
            body: new URLSearchParams({csrf, brokers: 'b2'})});
        return r.status; }""" % TOPIC)
    assert status == 403
    await ctx.close()
    ctx, page = await _login(browser, c, "admin", url)
    # an admin form without the session's CSRF token is refused, and nothing moves
    status = await page.evaluate("""async () => (await fetch('/console/topics/%s/remap', {method: 'POST',
        body: new URLSearchParams({csrf: 'forged', brokers: 'b2'})})).status""" % TOPIC)
    assert status == 403
    # a bad queue list, with the session's CSRF token: 400 in the API's shape
    await page.goto(url + f"/console/topics/{TOPIC}")
    answer = await page.evaluate("""async () => {
        const csrf = document.querySelector('input[name=csrf]').value;
        const r = await fetch('/console/topics/%s/remap', {method: 'POST',
            body: new URLSearchParams({csrf, brokers: 'b2', queues: '0 x'})});
        return [r.status, await r.json()]; }""" % TOPIC)
    assert answer[0] == 400 and answer[1]["error"]["code"] == "INVALID_ARGUMENT", answer
    # a group setting that is no whole number: the same
    answer = await page.evaluate("""async () => {
        const csrf = document.querySelector('input[name=csrf]').value;
        const r = await fetch('/console/groups/g1/config', {method: 'POST',
            body: new URLSearchParams({csrf, max_attempts: 'three'})});
        return [r.status, await r.json()]; }""")
    assert answer[0] == 400 and "max_attempts: 'three' is not a whole number" in answer[1]["error"]["message"], answer
    _, topic, _ = await c.call("GET", url + f"/v1/topics/{TOPIC}")
    assert all(q["segments"][-1]["broker"] == "b1" for q in topic["logic_queues"])
    # a wrong token gets the login form again, with a 401
    bad = await browser.new_page()
    await bad.goto(url + "/console/login")
    await bad.fill("input[name=token]", "not-a-token")
    response_status = []
    bad.on("response", lambda r: response_status.append(r.status) if r.url.endswith("/console/login") else None)
    await bad.click("button[type=submit]")
    await expect(bad.locator("p.error")).to_be_visible()
    assert 401 in response_status
    await ctx.close()
    # no token in any log of the cluster
    for name in os.listdir(os.path.join(c.dir, "logs")):
        text = Path(c.dir, "logs", name).read_text(errors="replace")
        assert c.token("admin") not in text and c.token("client") not in text, name


# -- behind TLS ---------------------------------------------------------------------------------------------------


async def test_the_console_works_behind_mutual_tls(tls_cluster, tmp_path):
    # The browser shows a client certificate the cluster's CA signed; the console calls its own node's API over
    # TLS with the node's own client settings; the session cookie is Secure.
    certs, meta_url, _ = tls_cluster
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx = await browser.new_context(
                ignore_https_errors=True,   # the cluster's private CA is not the browser's
                client_certificates=[{"origin": meta_url, "certPath": certs.client.cert,
                                      "keyPath": certs.client.key}])
            page = await ctx.new_page()
            page.set_default_timeout(UI_TIMEOUT_MS)
            await page.goto(meta_url + "/console")
            await page.fill("input[name=token]", TOKENS["client"])
            await page.click("button[type=submit]")
            await page.wait_for_url(meta_url + "/console")
            await expect(page.locator("#leader")).to_have_text("m1")
            await expect(page.locator('#members tr[data-node="m1"] td.ok')).to_have_text("ready")
            cookies = await ctx.cookies(meta_url + "/console")   # the cookie is scoped to /console
            assert [(k["name"], k["secure"], k["httpOnly"]) for k in cookies] == [("stator_console", True, True)]
            await page.goto(meta_url + "/console/brokers")
            await expect(page.locator('#brokers tr[data-broker="b1"] td.state')).to_have_text("active")
            await _shot(page, tmp_path, "cluster-tls")
        finally:
            await browser.close()
