"""The three-host example of ops/deploy/hosts, run as written on three "hosts": one network namespace each, with an
address of its own on a bridge (``ip netns`` + veth + bridge, made and removed here; root and Debian's iproute2
needed). TLS is on as the example's commented lines say (certificates for the hosts' addresses, made by
tests/support/tls_certs.py), so meta nodes link raft over mutual TLS, brokers register over HTTPS with their
certificates, and the operator in the root namespace needs one too: `stator cluster status` shows three ready
nodes, a message sent through the client comes back to a consumer, and a real Prometheus server (in host1's
namespace), configured with the scrape example of docs/operations.md, scrapes all six nodes through metrics_listen
without a client certificate."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import random
import re
import shutil
import ssl
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp

from client import AdminClient, Producer, PullConsumer
from tests.support import tls_certs
from tests.support.tls_cluster import stop_processes
from wire.tls import TlsFiles, client_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY_HOSTS = os.path.join(ROOT, "ops", "deploy", "hosts")
OPERATIONS_MD = os.path.join(ROOT, "docs", "operations.md")
HOSTS = 3
IP_TIMEOUT_S = 10.0          # one `ip` command
READY_TIMEOUT_S = 90.0       # six processes starting at once on a loaded machine
CLI_TIMEOUT_S = 30.0
POLL_S = 0.3
META_PORT, BROKER_PORT = 7100, 7200             # the example's ports, each in its own namespace
PROMETHEUS_PORT = 9090                           # in host1's namespace
PROMETHEUS_UP_TIMEOUT_S = 30.0


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check)


def _free_subnet() -> str:
    """A 10.x.y.0/24 that no interface or route of the root namespace uses (another test may hold one too)."""
    used = ip("-4", "-o", "addr").stdout + ip("-4", "route").stdout
    taken = [ipaddress.ip_network(m, strict=False) for m in re.findall(r"\b\d+\.\d+\.\d+\.\d+/\d+\b", used)]
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return str(net)
    raise RuntimeError("no free 10.x.y.0/24")


@dataclass(frozen=True)
class Hosts:
    namespaces: list[str]
    addresses: list[str]     # host i+1's address, in namespace i


@contextmanager
def three_hosts():
    """Namespaces host1..3 on one bridge, each with its address; the root namespace on the bridge too (.254), where
    the operator stands. Everything made is removed, however the block ends."""
    assert shutil.which("ip"), "the `ip` command (Debian's iproute2) is needed"
    assert os.geteuid() == 0, "network namespaces need root"
    tag = f"{os.getpid() % 10_000:04d}{random.randrange(100):02d}"   # names unique to this run, within 15 chars
    bridge = f"stbr{tag}"
    net = ipaddress.ip_network(_free_subnet())
    hosts = Hosts([f"stator-{tag}-h{i + 1}" for i in range(HOSTS)], [str(net[i + 1]) for i in range(HOSTS)])
    veths = [f"st{tag}h{i + 1}" for i in range(HOSTS)]
    try:
        ip("link", "add", bridge, "type", "bridge")
        ip("addr", "add", f"{net[254]}/{net.prefixlen}", "dev", bridge)
        ip("link", "set", bridge, "up")
        for ns, veth, address in zip(hosts.namespaces, veths, hosts.addresses):
            ip("netns", "add", ns)
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("link", "set", veth, "master", bridge, "up")
            ip("-n", ns, "addr", "add", f"{address}/{net.prefixlen}", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns in hosts.namespaces:
            ip("netns", "del", ns, check=False)   # takes its end of the veth along, and so the other end
        for veth in veths:
            ip("link", "del", veth, check=False)
        ip("link", "del", bridge, check=False)
        left = [ns for ns in hosts.namespaces if ns in ip("netns", "list").stdout]
        left += [d for d in (bridge, *veths) if ip("link", "show", d, check=False).returncode == 0]
        assert not left, f"left behind: {left}"


def make_certs(directory: str, addresses: list[str]) -> None:
    """ca.pem; hostN.pem/.key for each host (its example name and its address); operator.pem/.key for the CLI."""
    os.makedirs(directory)
    ca = tls_certs.issue("stator netns test CA", None)
    tls_certs.write_cert(directory, "ca", ca[0])
    for i, address in enumerate(addresses, 1):
        name = f"host{i}.example.com"
        tls_certs.write_pair(directory, f"host{i}", *tls_certs.issue(name, ca, names=(name,), ips=(address,)))
    tls_certs.write_pair(directory, "operator", *tls_certs.issue("operator", ca))


TLS_LINE = re.compile(r"^# ((?:tls|metrics_listen) = .*)$", re.MULTILINE)


def install(tmp: str, addresses: list[str], certs: str) -> list[str]:
    """ops/deploy/hosts as an operator installs it with TLS on: the commented tls and metrics_listen lines taken in,
    every URL https://, the certificates where the example says (here under ``certs``), the hosts' names their
    addresses, the data under ``tmp``, secrets mode 600. The host directories, host1 first."""
    dirs = []
    for i in range(1, HOSTS + 1):
        host = shutil.copytree(os.path.join(DEPLOY_HOSTS, f"host{i}"), os.path.join(tmp, f"host{i}"))
        for role in ("meta", "broker"):
            path = os.path.join(host, f"{role}.toml")
            with open(path) as f:
                text = f.read()
            text, taken = TLS_LINE.subn(r"\1", text)
            assert taken == 2, f"host{i}/{role}.toml: the example's commented tls and metrics_listen lines"
            text = text.replace("http://", "https://").replace("/etc/stator/tls/", certs + "/")
            text = text.replace("/var/lib/stator/", os.path.join(tmp, "data", f"host{i}") + "/")
            for j, address in enumerate(addresses, 1):
                text = text.replace(f"host{j}.example.com", address)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(os.path.join(host, f"{role}-secrets.toml"), 0o600)
        dirs.append(host)
    return dirs


def start(namespace: str, host_dir: str, role: str) -> subprocess.Popen:
    # `ip netns exec` execs the command in place: the process is the node itself, and signals reach it.
    with open(os.path.join(host_dir, f"{role}.log"), "wb") as log:
        return subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-m", "ops.cli", role, "serve",
                                 "--config", os.path.join(host_dir, f"{role}.toml")],
                                stdout=log, stderr=subprocess.STDOUT, cwd=host_dir)


def _tail(host_dirs: list[str]) -> str:
    out = []
    for d in host_dirs:
        for role in ("meta", "broker"):
            with open(os.path.join(d, f"{role}.log"), errors="replace") as f:
                out.append(f"--- {os.path.basename(d)} {role}: " + "".join(f.readlines()[-5:]))
    return "\n".join(out)


async def wait_ready(urls: list[str], ctx: ssl.SSLContext, procs: list[subprocess.Popen], host_dirs: list[str]):
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = list(urls)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        while pending:
            dead = [p.args for p in procs if p.poll() is not None]
            assert not dead, f"exited: {dead}\n{_tail(host_dirs)}"
            for url in list(pending):
                try:
                    async with s.get(url + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            pending.remove(url)
                except (aiohttp.ClientError, OSError, TimeoutError):
                    pass
            assert time.monotonic() < deadline, f"not ready after {READY_TIMEOUT_S} s: {pending}\n{_tail(host_dirs)}"
            if pending:
                await asyncio.sleep(POLL_S)


def _secret(host_dir: str, name: str, key: str) -> str:
    import tomllib
    with open(os.path.join(host_dir, name), "rb") as f:
        return tomllib.load(f)["tokens"][key]


async def test_the_three_host_example_runs_with_tls_in_network_namespaces(tmp_path):
    tmp = str(tmp_path)
    with three_hosts() as hosts:
        certs = os.path.join(tmp, "tls")
        make_certs(certs, hosts.addresses)
        host_dirs = install(tmp, hosts.addresses, certs)
        procs: list[subprocess.Popen] = []
        try:
            for role in ("meta", "broker"):   # brokers retry until meta answers
                procs += [start(ns, d, role) for ns, d in zip(hosts.namespaces, host_dirs)]
            operator = TlsFiles(os.path.join(certs, "operator.pem"), os.path.join(certs, "operator.key"),
                                os.path.join(certs, "ca.pem"))
            prometheus = start_prometheus(tmp, hosts.namespaces[0], hosts.addresses, operator.ca)
            procs.append(prometheus)
            ctx = client_context(operator)
            metas = [f"https://{a}:{META_PORT}" for a in hosts.addresses]
            brokers = [f"https://{a}:{BROKER_PORT}" for a in hosts.addresses]
            await wait_ready(metas + brokers, ctx, procs, host_dirs)
            await _check_cluster(tmp, host_dirs, hosts, operator, ctx, metas, brokers, prometheus)
        finally:
            stop_processes(procs)
        for d in host_dirs:
            with open(os.path.join(d, "meta.log")) as f:
                lines = [json.loads(line) for line in f if line.startswith("{")]
            assert any(x["event"] == "raft_tls" and x.get("mode") == "mutual" for x in lines), d


async def _check_cluster(tmp: str, host_dirs: list[str], hosts: Hosts, operator: TlsFiles, ctx: ssl.SSLContext,
                         metas: list[str], brokers: list[str], prometheus: subprocess.Popen) -> None:
    admin_token = _secret(host_dirs[0], "meta-secrets.toml", "admin")
    client_token = _secret(host_dirs[0], "meta-secrets.toml", "client")
    token_file = os.path.join(tmp, "admin.token")
    with open(token_file, "w") as f:
        f.write(admin_token)
    os.chmod(token_file, 0o600)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ops.cli", *args, "--endpoints", ",".join(metas),
                               "--token-file", token_file, "--cacert", operator.ca, "--cert", operator.cert,
                               "--key", operator.key, "-w", "json"],
                              capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=tmp)

    status = await asyncio.to_thread(cli, "cluster", "status")
    assert status.returncode == 0, status.stderr
    nodes = json.loads(status.stdout)["nodes"]
    assert sorted(n["url"] for n in nodes) == sorted(metas)
    assert [n["health"] for n in nodes] == ["ready"] * HOSTS, nodes
    assert sorted(n["role"] for n in nodes) == ["follower", "follower", "leader"], nodes
    listed = await asyncio.to_thread(cli, "broker", "list")
    assert listed.returncode == 0, listed.stderr
    assert sorted((b["broker"], b["address"], b["state"]) for b in json.loads(listed.stdout)["brokers"]) == \
        [(f"b{i + 1}", brokers[i], "active") for i in range(HOSTS)]
    created = await asyncio.to_thread(cli, "topic", "create", "orders", "--queues", "3")
    assert created.returncode == 0, created.stderr

    async with Producer(metas, client_token, "orders", ssl_context=ctx) as producer:
        sent = [await producer.send(f"order {i}", key=f"order-{i}") for i in range(6)]
    async with PullConsumer(metas, client_token, "orders", "billing", ssl_context=ctx) as consumer:
        got = []
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while len(got) < len(sent) and time.monotonic() < deadline:
            got += await consumer.poll(timeout_s=0.5)
    assert sorted(m.text for m in got) == [f"order {i}" for i in range(6)]
    assert len({s.queue for s in sent}) > 1   # the keys spread over the queues, and so over the three brokers' hosts
    async with AdminClient(metas, admin_token, ssl_context=ctx) as admin:
        route = await admin.route("orders")
    assert sorted({q["address"] for q in route["queues"]}) == sorted(brokers)
    await prometheus_scrapes_every_node(tmp, prometheus, hosts.addresses[0])


def prometheus_config(addresses: list[str], ca: str) -> str:
    """The scrape example of docs/operations.md (the YAML under "Metrics and health checks without client
    certificates"), pointed at these hosts and this CA, scraping every second."""
    with open(OPERATIONS_MD) as f:
        doc = f.read()
    section = doc[doc.index("Metrics and health checks without client certificates"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)
    assert "scheme: https" in example and not re.search(r"^\s*(cert|key)_file:", example, re.MULTILINE)
    example = example.replace("/etc/prometheus/stator-ca.pem", ca)
    for i, address in enumerate(addresses, 1):
        example = example.replace(f"host{i}.example.com", address)
    return "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n" + example


def start_prometheus(tmp: str, namespace: str, addresses: list[str], ca: str) -> subprocess.Popen:
    """Prometheus in ``namespace``, listening on the first address; started with the nodes, so that its own start
    overlaps theirs."""
    assert shutil.which("prometheus"), "the prometheus server (Debian's prometheus package, as promtool)"
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write(prometheus_config(addresses, ca))
    with open(os.path.join(tmp, "prometheus.log"), "wb") as log:
        return subprocess.Popen(["ip", "netns", "exec", namespace, "prometheus", f"--config.file={config}",
                                 f"--storage.tsdb.path={os.path.join(tmp, 'prometheus-data')}",
                                 f"--web.listen-address={addresses[0]}:{PROMETHEUS_PORT}"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=tmp)


async def prometheus_scrapes_every_node(tmp: str, proc: subprocess.Popen, address: str) -> None:
    url = f"http://{address}:{PROMETHEUS_PORT}"
    deadline = time.monotonic() + PROMETHEUS_UP_TIMEOUT_S
    targets: list = []
    async with aiohttp.ClientSession() as s:
        while True:
            assert proc.poll() is None, f"prometheus exited with {proc.returncode}: see {tmp}/prometheus.log"
            try:
                async with s.get(url + "/api/v1/targets", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    targets = (await r.json())["data"]["activeTargets"] if r.status == 200 else []
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                targets = []
            if len(targets) == 2 * HOSTS and all(t["health"] == "up" for t in targets):
                break
            assert time.monotonic() < deadline, [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
            await asyncio.sleep(POLL_S)
    assert sorted(t["labels"]["job"] for t in targets) == ["stator-broker"] * HOSTS + ["stator-meta"] * HOSTS
