"""The deployment examples (ops/deploy/) hold together, read by the real config parsers: the compose file starts three
meta nodes and three brokers from one image, and every node's config agrees with the others' and with where compose
or systemd puts it. No Docker daemon: the compose file is parsed, not run."""

from __future__ import annotations

import configparser
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from urllib.parse import urlsplit

import tomllib

import yaml

from broker import config as broker_config
from ops import devcluster
from runtime.credentials import token_hash
from meta import config as meta_config
from runtime.config_file import split_host_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "ops", "deploy")
IMAGE_INSTALL_S = 300      # pip installs the image's file set (no dependencies: this checkout's are used)
IMAGE_NODE_UP_S = 120      # a meta node and a broker from it, ready


def installed_copy(tmp_path) -> str:
    """ops/deploy as an operator installs it: the secrets files mode 600 (git keeps no such mode, and a node
    refuses a secrets file others may read)."""
    copy = shutil.copytree(DEPLOY, os.path.join(tmp_path, "deploy"))
    secrets = glob.glob(os.path.join(copy, "**", "*-secrets.toml"), recursive=True)
    assert len(secrets) == 1 + 3 + 3 * 2   # compose's meta one and one per broker, and two on each host
    for path in secrets:
        os.chmod(path, 0o600)
    return copy


def _packages() -> list[str]:
    """The top-level packages pyproject.toml installs."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({name.rstrip("*").split(".")[0] for name in include})


def _copies(dockerfile: str) -> list[tuple[str, str]]:
    """The image's COPY lines as (source in the build context, destination): one source each here."""
    with open(dockerfile) as f:
        lines = [line.split() for line in f if line.startswith("COPY ")]
    return [(src, dest) for _, *sources, dest in lines for src in sources]


def _check_cluster(metas: dict[str, meta_config.MetaConfig], brokers: dict[str, broker_config.BrokerConfig],
                   host_of: dict[str, str]) -> None:
    """Three meta nodes that name the same members, secret, tokens and broker token hashes; three brokers that know
    every meta node, each with a token of its own that the meta nodes and the other brokers know by its hash, and
    advertise the host they run on; every address on the host its node runs on."""
    assert sorted(metas) == ["m1", "m2", "m3"] and sorted(brokers) == ["b1", "b2", "b3"]
    first = metas["m1"]
    for node, c in metas.items():
        assert (c.members, c.secret, c.tokens, c.broker_tokens) == \
            (first.members, first.secret, first.tokens, first.broker_tokens), node
        me = next(m for m in c.members if m.node == node)
        assert urlsplit(me.url).hostname == split_host_port(me.raft)[0] == host_of[node]
        assert urlsplit(me.url).port == c.http_port and c.http_host == "0.0.0.0"
        assert os.path.isabs(c.data_dir)
    for name, b in brokers.items():
        assert list(b.meta_urls) == [m.url for m in first.members], name
        assert (token_hash(b.token), b.client_token) == (first.broker_tokens[name], first.tokens.client), name
        assert b.broker_tokens == first.broker_tokens, name
        assert b.http_host == "0.0.0.0" and b.advertise is not None
        assert urlsplit(b.url).hostname == host_of[name] and urlsplit(b.url).port == b.http_port


def test_compose_starts_three_meta_nodes_and_three_brokers_from_one_image(tmp_path):
    deploy = installed_copy(tmp_path)
    with open(os.path.join(deploy, "compose.yaml")) as f:
        compose = yaml.safe_load(f)
    services = compose["services"]
    assert sorted(services) == ["b1", "b2", "b3", "m1", "m2", "m3"]
    assert {s["image"] for s in services.values()} == {"stator:0.1.0"}
    build = services["m1"]["build"]
    dockerfile = os.path.normpath(os.path.join(DEPLOY, build["context"], build["dockerfile"]))
    assert dockerfile == os.path.join(DEPLOY, "Dockerfile")
    assert set(_packages()) <= {src for src, _ in _copies(dockerfile)}   # every package pyproject.toml installs
    metas, brokers = {}, {}
    for name, s in services.items():
        role, serve, flag, path = s["command"]
        assert (serve, flag) == ("serve", "--config") and role == ("meta" if name.startswith("m") else "broker")
        mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in s["volumes"] if v.endswith(":ro"))
        inside = {inside: os.path.join(deploy, outside) for outside, inside in mounts.items()}
        local = inside[path]
        # The secrets file the config names is mounted beside it, where the node looks for it.
        with open(local, "rb") as f:
            named = tomllib.load(f)["secrets_file"]
        mounted = inside[os.path.dirname(path) + "/" + named]
        assert os.path.samefile(mounted, os.path.join(os.path.dirname(local), named)), (name, named)
        parsed = (meta_config if role == "meta" else broker_config).load(local)
        (metas if role == "meta" else brokers)[name] = parsed
        assert any(v.endswith(":/var/lib/stator") for v in s["volumes"]), name   # data outlives the container
    assert {n: getattr(c, "node", None) or c.broker for n, c in {**metas, **brokers}.items()} == \
        {n: n for n in services}
    _check_cluster(metas, brokers, {n: n for n in services})
    for name in ("b1", "b2", "b3"):
        assert set(services[name]["depends_on"]) == {"m1", "m2", "m3"}


def test_three_host_configs_and_systemd_units_agree(tmp_path):
    deploy = installed_copy(tmp_path)
    metas, brokers, host_of = {}, {}, {}
    for i in (1, 2, 3):
        host = os.path.join(deploy, "hosts", f"host{i}")
        m = meta_config.load(os.path.join(host, "meta.toml"))
        b = broker_config.load(os.path.join(host, "broker.toml"))
        metas[m.node], brokers[b.broker] = m, b
        host_of[m.node] = host_of[b.broker] = f"host{i}.example.com"
    _check_cluster(metas, brokers, host_of)
    for role in ("meta", "broker"):
        unit = configparser.ConfigParser(interpolation=None, strict=True)
        unit.read(os.path.join(DEPLOY, "systemd", f"stator-{role}.service"))
        assert unit["Service"]["ExecStart"].split() == ["/opt/stator/bin/stator", role, "serve", "--config",
                                                        f"/etc/stator/{role}.toml"]
        data_dirs = {c.data_dir for c in (metas if role == "meta" else brokers).values()}
        assert all(d.startswith(unit["Service"]["ReadWritePaths"] + "/") for d in data_dirs), data_dirs
        assert unit["Service"]["KillSignal"] == "SIGTERM" and unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_images_own_file_set_installs_and_starts_a_meta_node_and_a_broker(tmp_path):
    """What the Dockerfile copies, installed as its pip install does (build requirements from the registry), runs the
    image's entry point (``stator``) with nothing of this checkout on the path: a module or file the image leaves out
    fails here (``wire`` and ``runtime``, and the console's static files, once did). No Docker daemon: the
    dependencies are this checkout's, on the path as plain directories, so the editable install of the checkout (a
    .pth file) is not read."""
    src, site = os.path.join(tmp_path, "src"), os.path.join(tmp_path, "site")
    for path, dest in _copies(os.path.join(DEPLOY, "Dockerfile")):
        assert dest.startswith("/src"), dest
        inside = os.path.join(src, os.path.relpath(dest, "/src"))
        if os.path.isdir(os.path.join(ROOT, path)):
            shutil.copytree(os.path.join(ROOT, path), inside,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            os.makedirs(inside, exist_ok=True)
            shutil.copy(os.path.join(ROOT, path), inside)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, src],
                         capture_output=True, text=True, cwd=tmp_path, timeout=IMAGE_INSTALL_S)
    assert pip.returncode == 0, pip.stderr[-3000:]
    python = getattr(sys, "_base_executable", sys.executable)   # not the venv's: its site-packages hold the checkout
    deps = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, deps])}
    stator = [python, os.path.join(site, "bin", "stator")]
    where = subprocess.run([*stator, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert where.returncode == 0, where.stderr
    probe = subprocess.run([python, "-c", "import ops, wire, runtime; print(ops.__file__, wire.__file__, "
                            "runtime.__file__)"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert probe.returncode == 0 and all(p.startswith(site) for p in probe.stdout.split()), probe
    cluster = os.path.join(tmp_path, "cluster")
    try:
        up = subprocess.run([*stator, "dev", "up", "--dir", cluster, "--meta", "1", "--brokers", "1", "--base-port",
                             str(devcluster.free_base_port())], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=IMAGE_NODE_UP_S)
        assert up.returncode == 0, up.stderr[-2000:]
        members = devcluster.load(cluster)
        assert [m["node"] for m in members["meta"]] == ["m1"] and [b["broker"] for b in members["brokers"]] == ["b1"]
    finally:
        if os.path.exists(os.path.join(cluster, "cluster.json")):
            devcluster.down(cluster)
