"""TLS on every HTTP listener and in the client: a meta node and a broker serving HTTPS with a CA that makes them
require client certificates. A client without the CA (or without a certificate the CA signed) is refused; one with
them works, for meta's API, the broker's, and the watch stream; the broker itself reaches meta over TLS. Trust apart
from client authentication: with ``client_auth = false`` the CA only verifies the servers called, and clients need
no certificate. ``metrics_listen`` serves the scrape and health paths, and only them, without client certificates."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time

import aiohttp
import pytest
from click.testing import CliRunner

from client import AdminClient, Producer, PullConsumer, RouteSubscription, Unavailable
from wire.tls import TlsFiles, client_context, client_session
from runtime.credentials import token_hash
from ops import devcluster
from ops.cli import main
from tests.support import tls_certs
from tests.support.meta_http import wait_until
from tests.support.tls_cluster import META_TOKENS, TOKENS, running_pair, start_process, stop_processes, wait_ready
from tests.support.tls_cluster import tls_cluster  # noqa: F401  (the fixture: one meta node and one broker, mutual TLS)


async def _refused(url: str, ctx: ssl.SSLContext | bool) -> str:
    """The failure of a plain GET with ``ctx``; the test fails if the server answers."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)) as e:
            async with s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                await r.read()
    return repr(e.value)


async def test_clients_need_the_ca_and_a_certificate_it_signed(tls_cluster, tmp_path):
    certs, meta_url, broker_url = tls_cluster
    good = TlsFiles(certs.client.cert, certs.client.key, certs.ca)
    no_ca = client_context(TlsFiles(certs.client.cert, certs.client.key, None))   # system CAs only
    no_cert = client_context(TlsFiles(None, None, certs.ca))
    rogue = client_context(TlsFiles(certs.rogue.cert, certs.rogue.key, certs.ca))
    for url in (meta_url + "/healthz", broker_url + "/healthz",
                meta_url + "/v1/watch?topics=x&after=0"):
        assert "certificate verify failed" in await _refused(url, no_ca), url
        await _refused(url, no_cert)   # the server wants a certificate: the handshake or the first read fails
        await _refused(url, rogue)
        await _refused(url.replace("https://", "http://"), False)   # plain HTTP on a TLS port gets no answer
    async with AdminClient(meta_url, TOKENS["admin"], ssl_context=no_ca, attempts_max=1) as admin:
        with pytest.raises(Unavailable) as refused:
            await admin.cluster()
        assert "client certificate" not in str(refused.value)   # the server's certificate is what failed here
    async with AdminClient(meta_url, TOKENS["admin"], ssl_context=no_cert, attempts_max=1) as admin:
        with pytest.raises(Unavailable) as refused:
            await admin.cluster()
        assert "requires client certificates" in str(refused.value), refused.value

    ctx = client_context(good)
    async with AdminClient(meta_url, TOKENS["admin"], ssl_context=ctx) as admin:
        assert (await admin.cluster())["members"][0]["url"] == meta_url
        assert [(b["broker"], b["address"], b["state"]) for b in await admin.brokers()] == [
            ("b1", broker_url, "active")]
        created = await admin.create_topic("secure", queues=1)
        # The watch stream over TLS: the route, then its next version after a growth.
        async with RouteSubscription(meta_url, TOKENS["client"], ["secure"], ssl_context=ctx) as routes:
            first = await routes.get("secure", min_version=created["version"])
            assert first["queues"][0]["address"] == broker_url
            grown = await admin.grow_topic("secure", 2)
            seen = await routes.wait_for("secure", lambda r: r["version"] >= grown["version"], 30.0)
            assert len(seen["queues"]) == 2 and routes.connected_url == meta_url
    async with client_session(good) as session:
        async with Producer(meta_url, TOKENS["client"], "secure", session=session) as producer:
            sent = await producer.send("over TLS")
        async with PullConsumer(meta_url, TOKENS["client"], "secure", "g", session=session) as consumer:
            got = []
            for _ in range(20):
                got += await consumer.poll(timeout_s=0.5)
                if got:
                    break
    assert [(m.queue, m.offset, m.text) for m in got] == [(sent.queue, sent.offsets[0], "over TLS")]

    # The CLI: --cacert/--cert/--key, and a clear one-line error without them. (It runs its own event loop: in a
    # thread, beside this test's.)
    def cli(*extra: str):
        return CliRunner().invoke(main, ["cluster", "members", "--endpoints", meta_url, "--token", TOKENS["admin"],
                                         "-w", "json", *extra], env={"STATOR_TOKEN": None, "STATOR_ENDPOINTS": None})
    ok = await asyncio.to_thread(cli, "--cacert", certs.ca, "--cert", certs.client.cert, "--key", certs.client.key)
    assert ok.exit_code == 0 and json.loads(ok.stdout)["members"][0]["url"] == meta_url
    # Without --cert/--key the server only closes the connection; the CLI finds out why and says so.
    bad = await asyncio.to_thread(cli, "--cacert", certs.ca)
    assert bad.exit_code == 1 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith(f"error: UNAUTHENTICATED: {meta_url} requires a client certificate"), bad.stderr
    assert "--cert and --key" in bad.stderr
    # A certificate another CA signed: said in the CLI's words, not the library's (no Python function named)
    rogue = await asyncio.to_thread(cli, "--cacert", certs.ca, "--cert", certs.rogue.cert, "--key", certs.rogue.key)
    assert rogue.exit_code == 1 and rogue.stderr.count("\n") == 1, rogue.stderr
    assert rogue.stderr.startswith("error: UNAVAILABLE: ") and "ssl_context" not in rogue.stderr, rogue.stderr
    assert rogue.stderr.endswith(f"(the server may not accept the client certificate {certs.rogue.cert}: is it "
                                 "signed by a CA the server trusts, and --key its key?)\n"), rogue.stderr
    # Plain http:// to the TLS port: the server only closes the connection; the CLI finds out it speaks TLS
    plain = await asyncio.to_thread(lambda: CliRunner().invoke(main, [
        "cluster", "members", "--endpoints", meta_url.replace("https://", "http://"), "--token", TOKENS["admin"]],
        env={"STATOR_TOKEN": None, "STATOR_ENDPOINTS": None}))
    assert plain.exit_code == 1 and plain.stderr == (
        f"error: UNAVAILABLE: {meta_url.replace('https://', 'http://')} speaks TLS: give its https:// URL (and "
        "--cacert, the CA that signed its certificate)\n"), plain.stderr
    # A server that is down is still just unavailable: no certificate is blamed for it.
    down = await asyncio.to_thread(lambda: CliRunner().invoke(main, [
        "cluster", "members", "--endpoints", f"https://127.0.0.1:{devcluster.free_base_port()}",
        "--token", TOKENS["admin"], "--cacert", certs.ca], env={"STATOR_TOKEN": None, "STATOR_ENDPOINTS": None}))
    assert down.exit_code == 1 and down.stderr.startswith("error: UNAVAILABLE: "), down.stderr
    missing = await asyncio.to_thread(cli, "--cacert", "/nonexistent/ca.pem")
    assert missing.exit_code == 1 and missing.stderr.startswith("error: INVALID_ARGUMENT: TLS CA /nonexistent/ca.pem")
    # The export (and so lineage) under mutual TLS: the same three options
    exported = await asyncio.to_thread(lambda: CliRunner().invoke(main, [
        "export", "--endpoints", meta_url, "--token", TOKENS["client"], "--out", str(tmp_path / "export"),
        "-w", "json",
        "--cacert", certs.ca, "--cert", certs.client.cert, "--key", certs.client.key],
        env={"STATOR_TOKEN": None, "STATOR_ENDPOINTS": None}))
    assert exported.exit_code == 0, exported.stderr
    said = json.loads(exported.stdout)
    assert said["events"] > 0 and said["files"] >= 1, exported.stdout
    # and each queue's end from its broker, over mutual TLS too (lineage locates only what was written)
    assert said["queue_ends"] >= 1 and said["queues_unobserved"] == 0, exported.stdout


async def test_three_meta_nodes_link_over_mutual_tls_and_commit_through_a_follower(tmp_path):
    # With a CA in `tls`, the raft port speaks mutual TLS too (meta/service.py raft_link): the nodes must elect,
    # replicate and forward a follower's write over it.
    certs = tls_certs.make(str(tmp_path))
    base = devcluster.free_base_port()
    tls = {"cert": certs.node.cert, "key": certs.node.key, "ca": certs.ca}
    members = [{"node": f"m{i + 1}", "raft": f"127.0.0.1:{base + 2 * i + 1}",
                "url": f"https://127.0.0.1:{base + 2 * i}"} for i in range(3)]
    procs = [start_process(str(tmp_path), m["node"], "meta", {
        "node": m["node"], "data_dir": "data", "http": m["url"].removeprefix("https://"), "secret": "s" * 24,
        "tokens": META_TOKENS, "broker_tokens": {"b0": token_hash(TOKENS["broker"])}, "members": members,
        "tls": tls}) for m in members]
    try:
        ctx = client_context(TlsFiles(certs.client.cert, certs.client.key, certs.ca))
        for m, p in zip(members, procs):
            await wait_ready(m["url"], ctx, p)   # ready: a leader known and caught up, so the raft links are up
        async with AdminClient([m["url"] for m in members], TOKENS["admin"], ssl_context=ctx) as admin:
            leader = (await admin.cluster())["leader"]
        follower = next(m for m in members if m["node"] != leader)
        # A write through a follower travels to the leader over the raft link (a broker's registration: no broker
        # needs to run).
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async with s.put(f"{follower['url']}/v1/brokers/b0", json={"address": "https://127.0.0.1:1"},
                             headers={"Authorization": f"Bearer {TOKENS['broker']}"},
                             timeout=aiohttp.ClientTimeout(total=30)) as r:
                assert r.status == 200, await r.text()
                version = (await r.json())["version"]
        async with AdminClient([m["url"] for m in members], TOKENS["admin"], ssl_context=ctx) as admin:
            assert any(b["broker"] == "b0" for b in await admin.brokers()), version
    finally:
        stop_processes(procs)
    for m in members:
        with open(os.path.join(tmp_path, f"{m['node']}.log")) as f:
            lines = [json.loads(line) for line in f if line.startswith("{")]
        assert any(x["event"] == "raft_tls" and x.get("mode") == "mutual" for x in lines), m["node"]
        assert any(x["event"] == "raft_peer_connected" for x in lines), f"{m['node']} never linked over TLS"
        assert not any(x["event"] == "raft_peer_refused" for x in lines), m["node"]


HEARTBEAT_SEEN_TIMEOUT_S = 15.0   # the broker heartbeats every 2 s (meta/limits.py)


async def test_server_only_tls_with_a_private_ca_needs_no_client_certificate(tmp_path):
    # `ca` is trust, `client_auth = false` asks no client for a certificate: the broker verifies meta against the CA,
    # registers and heartbeats; clients and the CLI come with the CA alone.
    certs = tls_certs.make(str(tmp_path))
    base = devcluster.free_base_port()
    meta_url, broker_url = f"https://127.0.0.1:{base}", f"https://127.0.0.1:{base + 50}"
    tls = {"cert": certs.node.cert, "key": certs.node.key, "ca": certs.ca, "client_auth": False}
    ca_only = client_context(TlsFiles(None, None, certs.ca))
    async with running_pair(tmp_path, base, tls, {}, ca_only):
        async with AdminClient(meta_url, TOKENS["admin"], ssl_context=ca_only) as admin:
            first = next(b for b in await admin.brokers() if b["broker"] == "b1")
            assert (first["address"], first["state"]) == (broker_url, "active")
            deadline = time.monotonic() + HEARTBEAT_SEEN_TIMEOUT_S
            while (now := next(b for b in await admin.brokers() if b["broker"] == "b1"))["last_heartbeat_ms"] == \
                    first["last_heartbeat_ms"]:
                assert time.monotonic() < deadline, "no heartbeat from b1 over server-only TLS"
                await asyncio.sleep(0.3)
            assert now["state"] == "active"
            await admin.create_topic("open", queues=1)
        async with Producer(meta_url, TOKENS["client"], "open", ssl_context=ca_only) as producer:
            sent = await producer.send("no client certificate")
        async with PullConsumer(meta_url, TOKENS["client"], "open", "g", ssl_context=ca_only) as consumer:
            got = []
            for _ in range(20):
                got += await consumer.poll(timeout_s=0.5)
                if got:
                    break
        assert [(m.offset, m.text) for m in got] == [(sent.offsets[0], "no client certificate")]
        # Trust still holds: without the CA, the servers' certificates do not verify.
        no_ca = client_context(TlsFiles(None, None, None))
        for url in (meta_url + "/healthz", broker_url + "/healthz"):
            assert "certificate verify failed" in await _refused(url, no_ca), url

        def cli(*args: str):
            return CliRunner().invoke(main, [*args, "--endpoints", meta_url, "--token", TOKENS["admin"], "-w", "json",
                                             "--cacert", certs.ca],
                                      env={"STATOR_TOKEN": None, "STATOR_ENDPOINTS": None})
        listed = await asyncio.to_thread(cli, "broker", "list")
        assert listed.exit_code == 0, listed.stderr
        assert [(b["broker"], b["state"]) for b in json.loads(listed.stdout)["brokers"]] == [("b1", "active")]
        status = await asyncio.to_thread(cli, "cluster", "status")
        assert status.exit_code == 0, status.stderr
        assert [n["health"] for n in json.loads(status.stdout)["nodes"]] == ["ready"]


async def _get(url: str, ctx: ssl.SSLContext | None, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx if ctx is not None else False)) as s:
        async with s.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
            return r.status, await r.text()


async def test_metrics_listen_serves_the_scrape_and_health_paths_only_and_asks_no_certificate(tls_cluster):
    certs, meta_url, broker_url = tls_cluster
    base = int(meta_url.rsplit(":", 1)[1])
    meta_scrape, broker_scrape = f"https://127.0.0.1:{base + 2}", f"http://127.0.0.1:{base + 51}"
    ca_only = client_context(TlsFiles(None, None, certs.ca))   # what a Prometheus server without a certificate has
    for scrape, ctx in ((meta_scrape, ca_only), (broker_scrape, None)):
        status, text = await _get(scrape + "/metrics", ctx)
        assert status == 200 and "# TYPE stator_" in text, (scrape, status, text[:200])
        for path in ("/healthz", "/readyz"):
            assert (await _get(scrape + path, ctx))[0] == 200, (scrape, path)
        # Nothing else, whatever the token: the API stays behind the client certificate.
        for path in ("/v1/cluster", "/v1/brokers", "/v1/topics", "/v1/openapi.json"):
            status, text = await _get(scrape + path, ctx, TOKENS["admin"])
            assert status == 404 and json.loads(text)["error"]["code"] == "NOT_FOUND", (scrape, path, text)
    # The metrics listener of meta is TLS with the node's certificate, verified against the CA.
    assert "certificate verify failed" in await _refused(meta_scrape + "/metrics",
                                                         client_context(TlsFiles(None, None, None)))
    # The API's own port still demands a certificate, for /metrics too.
    await _refused(meta_url + "/metrics", ca_only)
    await _refused(broker_url + "/metrics", ca_only)


async def _client_with_topic(certs, meta_url: str, topic: str):
    """A client's TLS context, a new topic of one queue (as the admin made it) and the client's auth header."""
    ctx = client_context(TlsFiles(certs.client.cert, certs.client.key, certs.ca))
    async with AdminClient(meta_url, TOKENS["admin"], ssl_context=ctx) as admin:
        created = await admin.create_topic(topic, queues=1)
    return ctx, created, {"Authorization": f"Bearer {TOKENS['client']}"}


def _metrics_of(meta_url: str, certs):
    """A reader of one value of the node's metrics listener (its HTTP port + 2, TLS with a CA only)."""
    base = int(meta_url.rsplit(":", 1)[1])
    ca_only = client_context(TlsFiles(None, None, certs.ca))

    async def scraped(name: str) -> float:
        status, text = await _get(f"https://127.0.0.1:{base + 2}/metrics", ca_only)
        assert status == 200
        return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))
    return scraped


async def test_a_parked_long_poll_is_answered_whole_over_tls_and_its_connection_serves_the_next_request(tls_cluster):
    """meta/api/parked_polls.py writes the answer to the TLS transport itself, beside aiohttp's writer."""
    certs, meta_url, _ = tls_cluster
    scraped = _metrics_of(meta_url, certs)
    ctx, created, auth = await _client_with_topic(certs, meta_url, "parked")
    timeout = aiohttp.ClientTimeout(total=60)
    # The connections the session opens are counted: the second request must be answered on the first's.
    opened = []
    trace = aiohttp.TraceConfig()

    async def on_create(session, context, params) -> None:
        opened.append(params)
    trace.on_connection_create_end.append(on_create)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1), timeout=timeout,
                                     trace_configs=[trace]) as s:
        async def poll(after: int, wait: int) -> tuple[int, bytes]:
            async with s.get(f"{meta_url}/v1/routes/parked", headers=auth,
                             params={"after": str(after), "wait": str(wait)}) as r:
                return r.status, await r.read()

        parked = asyncio.create_task(poll(created["version"], 30))

        async def waiting() -> bool:
            assert not parked.done(), "the long poll was answered before it parked"
            return await scraped("stator_meta_long_poll_waiters") == 1
        await wait_until(waiting, 30, "the long poll parked")
        async with AdminClient(meta_url, TOKENS["admin"], ssl_context=ctx) as admin:
            changed = await admin.set_config("parked", {"k": "v"})
        status, body = await asyncio.wait_for(parked, 30)
        assert status == 200 and json.loads(body)["version"] == changed["version"]
        assert await scraped("stator_meta_long_polls_answered_parked_total") == 1
        assert await poll(changed["version"], 0) == (304, b"")
        assert len(opened) == 1


async def test_a_parked_watch_stream_is_written_over_tls(tls_cluster):
    """meta/api/parked_watches.py writes a one-topic stream's events to the TLS transport itself, chunked as
    aiohttp chunks the stream."""
    certs, meta_url, _ = tls_cluster
    scraped = _metrics_of(meta_url, certs)
    ctx, created, auth = await _client_with_topic(certs, meta_url, "watched")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx),
                                     timeout=aiohttp.ClientTimeout(total=60)) as s:
        async with s.get(f"{meta_url}/v1/watch", headers=auth,
                         params={"topics": "watched", "after": str(created["version"])}) as r:
            assert r.status == 200 and r.headers["Transfer-Encoding"] == "chunked"
            async def parked() -> bool:
                return await scraped("stator_meta_watch_streams_parked") == 1
            await wait_until(parked, 30, "the stream parked")
            async with AdminClient(meta_url, TOKENS["admin"], ssl_context=ctx) as admin:
                changed = await admin.set_config("watched", {"k": "v"})
            lines = [await asyncio.wait_for(r.content.readline(), 30) for _ in range(4)]
            assert lines[:2] == [b"event: route\n", b"id: %d\n" % changed["version"]] and lines[3] == b"\n"
            assert json.loads(lines[2][len(b"data: "):])["config"] == {"k": "v"}
    assert await scraped("stator_meta_watch_events_written_parked_total") == 1


def test_tls_config_keys_are_checked_by_name(tmp_path):
    from broker import config as broker_config
    from meta import config as meta_config
    from runtime.config_file import ConfigError
    meta = {"node": "m1", "data_dir": "data", "http": "127.0.0.1:7100", "secret": "s" * 24, "tokens": META_TOKENS,
            "members": [{"node": "m1", "raft": "127.0.0.1:7101", "url": "https://127.0.0.1:7100"}]}
    files = {"cert": "n.pem", "key": "n.key"}
    # Today's configs keep their meaning: a ca demands client certificates, none asks for nothing.
    assert meta_config.parse({**meta, "tls": {**files, "ca": "ca.pem"}}).tls.requires_client_cert
    assert not meta_config.parse({**meta, "tls": files}).tls.requires_client_cert
    trust_only = meta_config.parse({**meta, "tls": {**files, "ca": "ca.pem", "client_auth": False}}, "/etc/x").tls
    assert (trust_only.ca, trust_only.requires_client_cert) == ("/etc/x/ca.pem", False)
    with pytest.raises(ConfigError, match="tls: client_auth = true needs ca"):
        meta_config.parse({**meta, "tls": {**files, "client_auth": True}})
    with pytest.raises(ConfigError, match="tls.client_auth: Input should be a valid boolean"):
        meta_config.parse({**meta, "tls": {**files, "ca": "ca.pem", "client_auth": "yes"}})
    with pytest.raises(ConfigError, match="unknown key 'tls.client_cert'"):
        meta_config.parse({**meta, "tls": {**files, "client_cert": True}})

    listen = lambda value, **kw: meta_config.parse({**meta, **kw, "metrics_listen": value}).metrics_listen  # noqa
    assert listen("0.0.0.0:9100", tls=files) == listen("https://0.0.0.0:9100", tls=files)
    assert (listen("0.0.0.0:9100", tls=files).tls, listen("0.0.0.0:9100").tls) == (True, False)
    assert not listen("http://0.0.0.0:9100", tls=files).tls
    with pytest.raises(ConfigError, match="metrics_listen 'https://0.0.0.0:9100': https needs the node's tls"):
        listen("https://0.0.0.0:9100")
    with pytest.raises(ConfigError, match="needs a port of its own, not the API's 7100"):
        listen("127.0.0.2:7100")
    with pytest.raises(ConfigError, match="metrics_listen: must be host:port"):
        listen("ftp://0.0.0.0:9100")
    broker = {"broker": "b1", "data_dir": "data", "http": "127.0.0.1:7200", "meta": ["https://127.0.0.1:7100"],
              "tokens": {"broker": TOKENS["broker"], "client": TOKENS["client"]}, "tls": files}
    assert broker_config.parse({**broker, "metrics_listen": "127.0.0.1:9200"}).metrics_listen.port == 9200
