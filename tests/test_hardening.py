"""Limits that protect a node from its clients, on real processes: each refusal is a clear API.md error and shows in
the service's refusals metric (stator_<service>_http_refusals_total{code}).

- open HTTP connections (runtime/connection_limit.py): past ``http_connections_max`` a new connection's requests
  are 503 TOO_MANY_CONNECTIONS and the connection is closed; the connections already open keep being served, and once
  some close new ones are served again;
- request bodies (meta 1 MiB, broker 32 MiB): 413 TOO_LARGE;
- a send's batch (broker, MESSAGES_PER_SEND_MAX): 400 INVALID_ARGUMENT naming the bound.

And the raft port: nothing a peer cannot authenticate with the cluster secret reaches pysyncobj's pickle.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import zlib

import pytest

from broker.writes import MESSAGES_PER_SEND_MAX
from meta.limits import REQUEST_BODY_BYTES_MAX as META_BODY_BYTES_MAX
from tests.support import cluster as cluster_mod

BROKER_CONNECTIONS_MAX = 3
META_CONNECTIONS_MAX = 12       # the broker keeps a few connections to meta of its own
TIMEOUT_S = 15
RAFT_READ_S = 1.0              # how long a probe of the raft port reads its answers before hanging up


@pytest.fixture
async def limited_cluster(tmp_path):
    async with cluster_mod.running(str(tmp_path), 1, 1, meta={"http_connections_max": META_CONNECTIONS_MAX},
                                   broker={"http_connections_max": BROKER_CONNECTIONS_MAX}) as c:
        yield c


def connect(url: str) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT_S)
    conn.connect()
    return conn


def get(conn: http.client.HTTPConnection, path: str) -> tuple[int, dict, bytes]:
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, dict(r.getheaders()), r.read()


def refusals(c, url: str, code: str) -> float:
    conn = connect(url)
    try:
        status, _, body = get(conn, "/metrics")
    finally:
        conn.close()
    assert status == 200, body
    found = re.search(rf'^stator_\w+_http_refusals_total{{code="{code}"}} (\S+)$', body.decode(), re.M)
    return float(found.group(1)) if found else 0.0


def raw_until_closed(url: str) -> bytes:
    """Everything the server sends on a new connection after one request, up to the server closing it (a server that
    keeps it open fails the read with a timeout)."""
    u = urllib.parse.urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def assert_connection_limit(url: str, limit: int) -> None:
    """Connections opened one by one, each asked /healthz: once ``limit`` are open, the next is refused and closed;
    the earlier ones are still served; after they close, a new one is served."""
    conns = []
    try:
        for _ in range(limit + 1):
            conn = connect(url)
            conns.append(conn)
            status, headers, body = get(conn, "/healthz")
            if status != 200:
                break
        else:
            raise AssertionError(f"{limit + 1} connections open and every one served")
        assert status == 503 and json.loads(body)["error"]["code"] == "TOO_MANY_CONNECTIONS", (status, body)
        assert json.loads(body)["error"]["details"] == {"limit": limit}
        assert headers.get("Connection", "").lower() == "close", headers
        assert conns[0].sock is None or get(conns[0], "/healthz")[0] == 200, "an earlier connection lost its service"
        assert raw_until_closed(url).startswith(b"HTTP/1.1 503"), "a further connection was not refused"
    finally:
        for conn in conns:
            conn.close()
    conn = connect(url)
    try:
        assert get(conn, "/healthz")[0] == 200, "no connection served once the others closed"
    finally:
        conn.close()


@pytest.mark.slow
async def test_connections_past_the_limit_are_refused_and_counted(limited_cluster):
    c = limited_cluster
    for url, limit in ((c.broker_urls[0], BROKER_CONNECTIONS_MAX), (c.meta_urls[0], META_CONNECTIONS_MAX)):
        before = refusals(c, url, "TOO_MANY_CONNECTIONS")
        assert_connection_limit(url, limit)
        # The two refused above; on meta the broker's own connections may add refusals of their own meanwhile.
        assert refusals(c, url, "TOO_MANY_CONNECTIONS") >= before + 2, url


@pytest.mark.slow
async def test_oversized_bodies_and_batches_are_refused_and_counted(limited_cluster):
    c = limited_cluster
    m, b = c.meta_urls[0], c.broker_urls[0]
    before = refusals(c, m, "TOO_LARGE")
    s, body, _ = await c.call("POST", f"{m}/v1/topics", data=b"{" + b" " * META_BODY_BYTES_MAX + b"}",
                              headers={"Content-Type": "application/json"})
    assert (s, body["error"]["code"]) == (413, "TOO_LARGE"), body
    assert refusals(c, m, "TOO_LARGE") == before + 1
    s, body, _ = await c.call("POST", f"{m}/v1/topics", json={"topic": "hard", "queues": 1})
    assert s == 201, body
    before = refusals(c, b, "INVALID_ARGUMENT")
    s, body, _ = await c.call("POST", f"{b}/v1/messages/hard/0", role="client",
                              json={"messages": [{"body": ""}] * (MESSAGES_PER_SEND_MAX + 1)})
    assert s == 400 and body["error"]["code"] == "INVALID_ARGUMENT" and str(MESSAGES_PER_SEND_MAX) in \
        body["error"]["message"], body
    assert refusals(c, b, "INVALID_ARGUMENT") == before + 1


class _Marker:
    """Unpickling this creates a directory: whether a node unpickled bytes shows on disk."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _raft_frame(payload: bytes) -> bytes:
    # pysyncobj's TCP framing (tcp_connection.py): a native int length, then the (encrypted) zlib'd pickle.
    return struct.pack("i", len(payload)) + payload


def _send_raft(raft: str, frame: bytes) -> None:
    host, port = raft.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(frame)
        sock.settimeout(RAFT_READ_S)
        try:
            while sock.recv(65536):     # the node hangs up on what it cannot authenticate; a peer's stays open
                pass
        except (ConnectionResetError, socket.timeout):
            pass


@pytest.mark.slow
async def test_the_raft_port_unpickles_nothing_even_under_the_cluster_secret(limited_cluster, tmp_path):
    """pysyncobj's own transport unpickled every raft message once its Fernet token checked out. Stator's transport
    (meta/raft/transport.py) never unpickles: a pickle in pysyncobj's framing, in the clear, under another key or
    under the cluster's own Fernet key, is refused as not a Stator HELLO, logged, and the node keeps serving."""
    from cryptography.fernet import Fernet
    from pysyncobj.encryptor import getEncryptor

    c = limited_cluster
    with open(c.info["meta"][0]["config"]) as f:
        cfg = json.load(f)
    raft = next(m["raft"] for m in cfg["members"] if m["node"] == cfg["node"])
    probes = {}
    for name in ("clear", "wrong-key", "cluster-key"):
        probes[name] = zlib.compress(pickle.dumps(_Marker(str(tmp_path / name))))
    _send_raft(raft, _raft_frame(probes["clear"]))
    _send_raft(raft, _raft_frame(Fernet(Fernet.generate_key()).encrypt(probes["wrong-key"])))
    _send_raft(raft, _raft_frame(getEncryptor(cfg["secret"]).encrypt(probes["cluster-key"])))
    log_path = os.path.join(c.dir, "logs", f"{cfg['node']}.log")
    deadline = time.monotonic() + TIMEOUT_S
    while "raft_peer_refused" not in open(log_path, errors="replace").read():
        assert time.monotonic() < deadline, "the node never said it refused the probes"
        await asyncio.sleep(0.05)
    for name in probes:
        assert not (tmp_path / name).exists(), f"a raft message ({name}) was unpickled"
    s, body, _ = await c.call("GET", c.meta_urls[0] + "/v1/cluster")
    assert s == 200 and body["leader"], body


def test_a_waiter_past_its_bound_is_refused_and_counted():
    """The meta node's bound on each kind of waiter (long polls, watch streams, min_version reads): 20,000 each, too
    many for a test to hold open, so its one implementation is checked directly."""
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from wire.errors import ApiError
    from meta.admission import Admission

    r = CollectorRegistry()
    gauge, rejections = Gauge("w", "w", registry=r), Counter("rej", "rej", ["limit"], registry=r)
    a = Admission("long_poll_waiters", 2, gauge, rejections, "too many")
    a.enter()
    a.enter()
    with pytest.raises(ApiError) as refused:
        a.enter()
    assert (refused.value.status, refused.value.code, refused.value.details) == (503, "TOO_MANY_WAITERS", {"limit": 2})
    assert r.get_sample_value("rej_total", {"limit": "long_poll_waiters"}) == 1 and r.get_sample_value("w") == 2
    a.leave()
    a.enter()
    assert r.get_sample_value("w") == 2 and r.get_sample_value("rej_total", {"limit": "long_poll_waiters"}) == 1


def test_the_open_file_limit_is_raised_to_fit_the_connection_bound():
    """Below the bound, accept() would fail with EMFILE first and clients would wait unanswered: a child process
    (its limits are its own) starts from a low soft limit and gets it raised up to the hard one."""
    code = ("import resource\n"
            "from runtime.serve import open_files_for, OPEN_FILES_RESERVE\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
            "want = min(hard, 2_000 + OPEN_FILES_RESERVE) if hard != resource.RLIM_INFINITY "
            "else 2_000 + OPEN_FILES_RESERVE\n"
            "assert open_files_for(2_000) == want == resource.getrlimit(resource.RLIMIT_NOFILE)[0], "
            "resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
