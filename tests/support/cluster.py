"""A real local cluster for integration tests: processes started by `ops.devcluster` on loopback, plus small HTTP helpers.

Each test cluster gets its own directory and a free port range, so tests never collide with one another or with a
developer's `stator dev up`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ops import devcluster

free_base_port = devcluster.free_base_port
_BROKER_PATH = re.compile(r"/v1/brokers/([^/?]+)")


@dataclass
class Cluster:
    dir: str
    info: dict[str, Any]
    session: aiohttp.ClientSession | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def reload(self) -> None:
        self.info = devcluster.load(self.dir)

    @property
    def meta_urls(self) -> list[str]:
        return [m["url"] for m in self.info["meta"]]

    @property
    def broker_urls(self) -> list[str]:
        return [b["url"] for b in self.info["brokers"]]

    def token(self, role: str) -> str:
        """A role's token; "broker" is the first broker's own (each broker has its own: broker_token(name))."""
        if role == "broker":
            return next(iter(self.info["broker_tokens"].values()))
        return self.info[f"{role}_token"]

    def broker_token(self, name: str) -> str:
        return self.info["broker_tokens"][name]

    def headers(self, role: str = "admin", **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(role)}", **extra}

    def headers_for(self, role: str, url: str) -> dict[str, str]:
        """A call as role "broker" on /v1/brokers/{name}[/...] acts as that broker: with its own token, or, for a
        simulated broker the cluster issued none to, with the admin's (operators act for any broker)."""
        if role == "broker":
            m = _BROKER_PATH.search(url)
            if m is not None:
                token = self.info["broker_tokens"].get(m.group(1))
                return {"Authorization": f"Bearer {token or self.token('admin')}"}
        return self.headers(role)

    def pid(self, name: str) -> int:
        self.reload()
        for m in self.info["meta"] + self.info["brokers"]:
            if m.get("node", m.get("broker")) == name:
                return m["pid"]
        raise KeyError(name)

    def url(self, name: str) -> str:
        for m in self.info["meta"] + self.info["brokers"]:
            if m.get("node", m.get("broker")) == name:
                return m["url"]
        raise KeyError(name)

    def kill9(self, name: str) -> None:
        devcluster.stop_member(self.dir, name, signal.SIGKILL)

    def start(self, name: str) -> None:
        devcluster.start(self.dir, name)
        self.reload()

    async def call(self, method: str, url: str, role: str = "admin", json: Any = None, data: bytes | None = None,
                   headers: dict[str, str] | None = None, timeout_s: float = 15.0) -> tuple[int, Any, dict]:
        h = self.headers_for(role, url) if role else {}
        h.update(headers or {})
        async with self.session.request(method, url, json=json, data=data, headers=h,
                                        timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            text = await r.text()
            try:
                import json as _json
                body = _json.loads(text) if text else None
            except ValueError:
                body = text
            return r.status, body, dict(r.headers)

    async def leader(self, timeout_s: float = 10.0) -> str:
        """Name of the node every live node agrees leads."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = set()
            for u in self.meta_urls:
                try:
                    s, b, _ = await self.call("GET", u + "/v1/cluster", timeout_s=1.0)
                    if s == 200 and b["leader"]:
                        seen.add(b["leader"])
                except (aiohttp.ClientError, OSError, TimeoutError):
                    continue
            if len(seen) == 1:
                return seen.pop()
            await _sleep(0.05)
        raise TimeoutError("no agreed leader")


async def _sleep(s: float) -> None:
    import asyncio
    await asyncio.sleep(s)


@contextlib.asynccontextmanager
async def running(tmp_dir: str, metas: int = 3, brokers: int = 0, **extra):
    """A cluster with an open HTTP session for the test, stopped (every process) however the test ends."""
    c = up(tmp_dir, metas, brokers, **extra)
    c.session = aiohttp.ClientSession()
    try:
        yield c
    finally:
        await c.session.close()
        devcluster.down(c.dir)


@contextlib.asynccontextmanager
async def one_meta_node(tmp_dir: str):
    """One meta node with a broker b1 registered (at an address nothing serves) and sessions that do not lapse:
    (cluster, its URL, the client's Authorization header)."""
    async with running(tmp_dir, 1, 0, meta={"session_timeout_ms": 600_000}) as c:
        m = c.meta_urls[0]
        s, b, _ = await c.call("PUT", m + "/v1/brokers/b1", "broker", json={"address": "http://127.0.0.1:1"})
        assert s == 200, b
        yield c, m, c.headers("client")["Authorization"]


def up(tmp_dir: str, metas: int = 3, brokers: int = 0, **extra) -> Cluster:
    base = free_base_port()
    info = devcluster.up(os.path.join(tmp_dir, "cluster"), metas, brokers, base,
                         extra_meta=extra.get("meta"), extra_broker=extra.get("broker"),
                         serve_flags=extra.get("serve_flags"), per_broker=extra.get("per_broker"))
    return Cluster(os.path.join(tmp_dir, "cluster"), info)
