"""How long a queue refuses writes during a graceful remap (seal-then-switch), and that offsets stay continuous.

    python -m ops.bench.remap_pause [--rounds 20]

Starts 3 meta nodes and 2 brokers; one producer sends small batches to queue 0 as fast as it can, following the route
(long poll) and re-resolving on NOT_LEADER / SEALING; the queue is remapped back and forth. The pause of a round is the
longest gap between consecutive acknowledged sends from the remap request until the next remap (normal gaps are
about a millisecond, so the longest one is the refusal window: old broker sealing -> seal report -> new start decided ->
route pushed -> producer resolves the new broker). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

import aiohttp

from ops import devcluster
from ops.bench.common import free_base_port


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="stator-bench-") as tmp:
        cluster = devcluster.up(os.path.join(tmp, "c"), 3, 2, free_base_port())
        try:
            meta = cluster["meta"][0]["url"]
            admin = {"Authorization": f"Bearer {cluster['admin_token']}"}
            client = {"Authorization": f"Bearer {cluster['client_token']}"}
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{meta}/v1/topics", json={"topic": "pause", "queues": 1, "brokers": ["b1"]},
                                  headers=admin) as r:
                    assert r.status == 201, await r.text()
                state = {"addr": None, "stop": False}
                acks: list[tuple[float, list[int]]] = []
                errors: dict[str, int] = {}

                async def resolve():
                    while True:
                        async with s.get(f"{meta}/v1/routes/pause", headers=client) as r:
                            q = (await r.json())["queues"][0]
                        if q["writable"]:
                            state["addr"] = q["address"]
                            return
                        await asyncio.sleep(0.002)

                async def producer():
                    await resolve()
                    payload = {"messages": [{"body": "p"}] * 10}
                    while not state["stop"]:
                        async with s.post(f"{state['addr']}/v1/messages/pause/0", json=payload, headers=client) as r:
                            body = await r.json()
                        if r.status == 200:
                            acks.append((time.monotonic(), body["offsets"]))
                        else:
                            code = body["error"]["code"]
                            errors[code] = errors.get(code, 0) + 1
                            await resolve()

                task = asyncio.create_task(producer())
                await asyncio.sleep(1.0)
                pauses, marks = [], []
                for i in range(args.rounds):
                    target = "b2" if i % 2 == 0 else "b1"
                    t = time.monotonic()
                    async with s.post(f"{meta}/v1/topics/pause/remap", json={"brokers": [target]}, headers=admin) as r:
                        assert r.status == 200, await r.text()
                    marks.append(t)
                    await asyncio.sleep(args.interval)
                state["stop"] = True
                await task
            times = [a for a, _ in acks]
            for i, t in enumerate(marks):
                # The longest gap between consecutive acknowledged sends from the remap until the next one.
                stop = marks[i + 1] if i + 1 < len(marks) else float("inf")
                window = [a for a in times if t <= a < stop]
                before = [a for a in times if a < t]
                if before:
                    window.insert(0, before[-1])
                if len(window) >= 2:
                    pauses.append(max(b - a for a, b in zip(window, window[1:])) * 1000)
            offsets = [o for _, offs in acks for o in offs]
            continuous = offsets == list(range(len(offsets)))
            pauses.sort()
            pick = lambda p: round(pauses[min(len(pauses) - 1, int(p * len(pauses)))], 1) if pauses else None  # noqa
            return {"benchmark": "remap_pause", "rounds": args.rounds, "pause_ms": {
                        "p50": pick(0.5), "p99": pick(0.99), "max": round(pauses[-1], 1) if pauses else None},
                    "acknowledged_messages": len(offsets), "offsets_continuous": continuous,
                    "refusals": errors, "loadavg": open("/proc/loadavg").read().split()[:3]}
        finally:
            devcluster.down(os.path.join(tmp, "c"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between remaps")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
