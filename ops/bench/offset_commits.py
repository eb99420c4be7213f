"""What replicated offsets cost (issue 37, broker/replication/offsets.py): consumer offset commits to a queue's head
with replicas 1, 2 and 3, on a local cluster of 3 meta nodes and 3 brokers.

``--committers`` tasks each commit increasing offsets of their own group to one queue for ``--seconds``, one commit at a
time; reported per replica count: commits a second and their latency (p50, p99, max). A commit is answered once the
head's fsync and every in-sync copy's have returned, so replicas 2 and 3 add one round trip to a copy and its fsync.

    python -m ops.bench.offset_commits [--seconds 5] [--committers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

import aiohttp

from ops import devcluster
from ops.bench.common import emit, free_base_port, latency_summary, loadavg, say

SETTLE_S = 30.0


async def _call(s: aiohttp.ClientSession, method: str, url: str, token: str, body: Any = None) -> tuple[int, Any]:
    async with s.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status, await r.json(content_type=None)


async def _head(s: aiohttp.ClientSession, info: dict, topic: str, replicas: int) -> str:
    """The queue's head address once every copy is in sync."""
    meta, client = info["meta"][0]["url"], info["client_token"]
    deadline = time.monotonic() + SETTLE_S
    while True:
        status, r = await _call(s, "GET", f"{meta}/v1/routes/{topic}", client)
        q = r["queues"][0] if status == 200 else None
        if q is not None and q["writable"] and len(q["in_sync"]) == replicas:
            return q["address"]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: its copies were not in sync within {SETTLE_S} s: {r}")
        await asyncio.sleep(0.1)


async def _run(info: dict, seconds: float, committers: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as s:
        for replicas in (1, 2, 3):
            topic = f"commits-r{replicas}"
            status, b = await _call(s, "POST", f"{info['meta'][0]['url']}/v1/topics", info["admin_token"],
                                    {"topic": topic, "queues": 1, "replicas": replicas})
            if status != 201:
                raise RuntimeError(f"create {topic}: {status} {b}")
            head = await _head(s, info, topic, replicas)
            latencies: list[float] = []
            refused: dict[str, int] = {}
            deadline = time.monotonic() + seconds

            async def commit(n: int) -> None:
                offset = 0
                while time.monotonic() < deadline:
                    offset += 1
                    t0 = time.monotonic()
                    status, body = await _call(s, "PUT", f"{head}/v1/offsets/g{n}/{topic}/0", info["client_token"],
                                               {"offset": offset})
                    if status == 200:
                        latencies.append(time.monotonic() - t0)
                    else:
                        code = body.get("error", {}).get("code", str(status))
                        refused[code] = refused.get(code, 0) + 1

            say(f"replicas={replicas}: {committers} committers for {seconds} s")
            await asyncio.gather(*(commit(n) for n in range(committers)))
            out[f"replicas_{replicas}"] = {"commits_per_s": round(len(latencies) / seconds, 1),
                                           "latency_s": latency_summary(latencies), "refused": refused}
    r1, r3 = out["replicas_1"]["commits_per_s"], out["replicas_3"]["commits_per_s"]
    out["r3_over_r1"] = round(r3 / r1, 3) if r1 else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--committers", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        say("starting 3 meta nodes and 3 brokers")
        info = devcluster.up(d, 3, 3, free_base_port())
        try:
            result = asyncio.run(_run(info, args.seconds, args.committers))
        finally:
            devcluster.down(d)
    emit({"bench": "offset_commits", "seconds": args.seconds, "committers": args.committers, **result,
          "loadavg": loadavg()})


if __name__ == "__main__":
    main()
