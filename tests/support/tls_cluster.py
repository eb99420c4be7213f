"""One meta node and one broker behind mutual TLS, as real processes (certificates from tests/support/tls_certs.py), and
the tokens they take.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time

import aiohttp
import pytest

from wire.tls import TlsFiles, client_context
from runtime.credentials import token_hash
from ops import devcluster
from tests.support import tls_certs


TOKENS = {"admin": "a" * 24, "broker": "b" * 24, "client": "c" * 24}   # "broker": b1's own
META_TOKENS = {"admin": TOKENS["admin"], "client": TOKENS["client"]}   # meta knows b1's by its hash only
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def start_process(directory: str, name: str, role: str, cfg: dict) -> subprocess.Popen:
    os.makedirs(os.path.join(directory, name), exist_ok=True)
    path = os.path.join(directory, name, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    log = open(os.path.join(directory, f"{name}.log"), "wb")
    try:
        return subprocess.Popen([sys.executable, "-m", "ops.cli", role, "serve", "--config", path],
                                stdout=log, stderr=subprocess.STDOUT, cwd=os.path.join(directory, name))
    finally:
        log.close()


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every process, then wait for each (kill -9 past STOP_TIMEOUT_S)."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def wait_ready(url: str, ctx: ssl.SSLContext, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        while True:
            assert proc.poll() is None, f"{url} exited with {proc.returncode}"
            try:
                async with s.get(url + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass
            assert time.monotonic() < deadline, f"{url} not ready"
            await asyncio.sleep(0.2)


@pytest.fixture
async def tls_cluster(tmp_path):
    certs = tls_certs.make(str(tmp_path))
    base = devcluster.free_base_port()
    meta_url, broker_url = f"https://127.0.0.1:{base}", f"https://127.0.0.1:{base + 50}"
    tls = {"cert": certs.node.cert, "key": certs.node.key, "ca": certs.ca}
    # The scrape listeners: meta's in the API's scheme (server-only TLS), the broker's plain HTTP by choice.
    metrics = {"meta": f"127.0.0.1:{base + 2}", "broker": f"http://127.0.0.1:{base + 51}"}
    async with running_pair(tmp_path, base, tls, metrics, client_context(
            TlsFiles(certs.client.cert, certs.client.key, certs.ca))):
        yield certs, meta_url, broker_url


@contextlib.asynccontextmanager
async def running_pair(tmp_path, base: int, tls: dict, metrics: dict[str, str], ctx: ssl.SSLContext):
    """m1 on base (raft base + 1) and b1 on base + 50, both with ``tls``, ready (b1 registered with m1)."""
    meta_url, broker_url = f"https://127.0.0.1:{base}", f"https://127.0.0.1:{base + 50}"
    procs = [start_process(str(tmp_path), "m1", "meta", {
        "node": "m1", "data_dir": "data", "http": f"127.0.0.1:{base}", "secret": "s" * 24,
        "tokens": META_TOKENS,
        "broker_tokens": {"b1": token_hash(TOKENS["broker"])},   # b1's own token, by its hash
        "members": [{"node": "m1", "raft": f"127.0.0.1:{base + 1}", "url": meta_url}], "tls": tls,
        **({"metrics_listen": metrics["meta"]} if "meta" in metrics else {})})]
    try:
        await wait_ready(meta_url, ctx, procs[0])
        procs.append(start_process(str(tmp_path), "b1", "broker", {
            "broker": "b1", "data_dir": "data", "http": f"127.0.0.1:{base + 50}", "meta": [meta_url],
            "tokens": {"broker": TOKENS["broker"], "client": TOKENS["client"]}, "tls": tls,
            **({"metrics_listen": metrics["broker"]} if "broker" in metrics else {})}))
        await wait_ready(broker_url, ctx, procs[1])   # ready: registered with meta, over TLS
        yield
    finally:
        stop_processes(procs)
